"""The OpenAI-compatible HTTP API over a `ChatFrontend`, as a Starlette application.

Routes:

- ``POST /v1/chat/completions``: a chat completion, whole (JSON) or streamed
  (server-sent events, ``data: [DONE]`` last);
- ``POST /v1/completions``: a raw prompt continued (`frontend.text_completion`);
- ``GET /v1/models``: the one served model;
- ``GET /health``: 200 while the engine answers a health round trip, 503 after;
- ``GET /metrics``: Prometheus text (`frontend.metrics`).

Errors are OpenAI error bodies (``{"error": {"message", "type", "param", "code"}}``)
with the status in ``code``: 400 for a request the API refuses (bad JSON, a field of
the wrong type, an unknown tool, a schema the grammar compiler refuses), 401 without
the API key, 404 for another model's name, 413 for a body over `MAX_BODY_BYTES`, 503
with ``Retry-After`` when the engine is full, 503 when the engine is gone. A stream
that fails after it began sends one ``data: {"error": ...}`` event, then
``data: [DONE]``. A client that leaves (a stream closed, or a connection dropped
while a whole response is computed) aborts its request in the engine.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from engine_core.client import EngineDeadError

from .metrics import CONTENT_TYPE, Metrics
from .protocol import ErrorInfo, ErrorResponse, ModelCard, ModelList, to_sse
from .response import RETRY_AFTER_S
from .serving import ChatFrontend
from .text_completion import TextCompletions
from .validation import RequestError

log = logging.getLogger("thinkgate.http")

#: the largest request body read (a request encodes to at most a few times its body,
#: far below the engine's frame limit)
MAX_BODY_BYTES = 8 << 20
#: how long ``/health`` waits for the engine's answer
HEALTH_TIMEOUT_S = 5.0

T = TypeVar("T")


def error_response(err: ErrorResponse) -> Response:
    """An OpenAI error body with its status (and ``Retry-After`` when the engine was
    full)."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if err.error.code in (429, 503) else None
    return Response(
        msgspec.json.encode(err),
        status_code=err.error.code,
        media_type="application/json",
        headers=headers,
    )


def _error(status: int, message: str, type: str, param: str | None = None) -> Response:
    return error_response(
        ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=status))
    )


class ApiKeyMiddleware:
    """Refuses every ``/v1/`` request without ``Authorization: Bearer <key>`` (401,
    OpenAI's error body); ``/health`` and ``/metrics`` stay open."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = b""
            for k, v in scope["headers"]:
                if k == b"authorization":
                    given = v
                    break
            if not hmac.compare_digest(given, self._expected):
                resp = _error(
                    401,
                    "a valid API key is required: send the header 'Authorization: Bearer KEY'",
                    "AuthenticationError",
                )
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _body(request: Request) -> bytes:
    """The body, at most `MAX_BODY_BYTES` (`RequestError` with status 413 past it)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise _too_large()
    chunks: list[bytes] = []
    n = 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large() -> RequestError:
    return RequestError(
        f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB",
        status_code=413,
        type="RequestTooLargeError",
    )


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Run ``work``; cancel it (its request is then aborted in the engine) and return
    None if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return None
    return task.result()


async def _events(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """Server-sent events of a stream's items, then ``data: [DONE]``. The stream is
    closed however this ends (a client that leaves cancels it here), which aborts its
    request in the engine."""
    try:
        yield to_sse(first)
        async for item in rest:
            yield to_sse(item)
        yield to_sse(None)
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


def build_app(
    chat: ChatFrontend, *, api_key: str | None = None, metrics: Metrics | None = None
) -> ASGIApp:
    """The API over ``chat`` (its engine client, tokenizer and model name)."""
    metrics = metrics or Metrics()
    chat.on_finish = metrics.finished
    text = TextCompletions(chat)

    async def run(
        request: Request,
        endpoint: str,
        prepare: Callable[[bytes], Any],
        whole: Callable[[Any], Awaitable[Any]],
        stream: Callable[[Any], AsyncIterator[Any]],
    ) -> Response:
        try:
            prepared = prepare(await _body(request))
        except RequestError as e:
            metrics.refuse(endpoint, e.status_code)
            return error_response(e.to_response())
        except ClientDisconnect:
            return Response(status_code=499)
        if chat.client.is_dead:
            metrics.refuse(endpoint, 503)
            return error_response(_dead(chat))
        if prepared.stream:
            items = stream(prepared)
            first = await _until_disconnect(request, anext(items, None))
            if first is None:  # the client left before the first output
                await items.aclose()  # type: ignore[attr-defined]
                return Response(status_code=499)
            if isinstance(first, ErrorResponse):
                await items.aclose()  # type: ignore[attr-defined]
                metrics.refuse(endpoint, first.error.code)
                return error_response(first)
            return StreamingResponse(
                _events(first, items),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        result = await _until_disconnect(request, whole(prepared))
        if result is None:
            return Response(status_code=499)
        if isinstance(result, ErrorResponse):
            metrics.refuse(endpoint, result.error.code)
            return error_response(result)
        return Response(msgspec.json.encode(result), media_type="application/json")

    async def chat_completions(request: Request) -> Response:
        return await run(request, "chat", chat.prepare, chat.complete, chat.stream)

    async def completions(request: Request) -> Response:
        return await run(request, "completions", text.prepare, text.complete, text.stream)

    created = int(time.time())

    async def models(request: Request) -> Response:
        card = ModelCard(id=chat.model_name, created=created)
        return Response(msgspec.json.encode(ModelList(data=[card])), media_type="application/json")

    async def health(request: Request) -> Response:
        try:
            await chat.client.health(HEALTH_TIMEOUT_S)
        except (EngineDeadError, TimeoutError):
            return error_response(_dead(chat))
        return Response(status_code=200)

    async def metrics_text(request: Request) -> Response:
        try:
            reply = await chat.client.health(HEALTH_TIMEOUT_S)
        except (EngineDeadError, TimeoutError):
            reply = None
        return Response(metrics.render(reply), media_type=CONTENT_TYPE)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_text, methods=["GET"]),
    ]
    app: ASGIApp = Starlette(routes=routes, exception_handlers={Exception: _internal_error})
    if api_key:
        app = ApiKeyMiddleware(app, api_key)
    return app


def _dead(chat: ChatFrontend) -> ErrorResponse:
    why = chat.client.dead_reason or "it does not answer"
    return ErrorResponse(
        error=ErrorInfo(
            message=f"the engine is gone: {why}", type="ServiceUnavailableError", code=503
        )
    )


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A fault of the server's own (never of a request's making): logged with its
    traceback, answered in OpenAI's shape."""
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error(500, f"internal server error: {type(exc).__name__}", "InternalServerError")
