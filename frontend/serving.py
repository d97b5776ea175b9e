"""The front-end stub: OpenAI chat requests in, the engine's outputs back as messages
or streams.

`ChatFrontend.create(client, config)` checks the flags against the engine it talks to
(the tokenizer and reasoning parser its handshake names, the tool format's markers)
and stops with `ConfigError` where they cannot work. Then, per request:

- `prepare(body)`: decode, check, render, build the `EngineCoreRequest` (a bad request
  raises `RequestError`, before anything reaches the engine);
- `complete(prepared)`: the whole `ChatCompletion` (or an `ErrorResponse`);
- `stream(prepared)`: `ChatCompletionChunk` objects: the role, then one chunk per
  engine output that adds something, the finish reason on the last one, and a usage
  chunk when ``stream_options.include_usage`` asks for it; an engine error mid-stream
  ends it with an `ErrorResponse`;

both stop reading the engine at a stop string (leaving its stream aborts the request
there), and closing a stream early aborts it too;
- `create_chat_completion(body)`: all of it, in vLLM's shape (an error, a completion,
  or an async iterator of chunks when ``stream`` is true).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from engine_core.client import EngineClient, EngineDeadError, RequestOutput
from reasoning import (
    ReasoningError,
    create_reasoning_parser,
    load_plugin,
    reasoning_parser_names,
)

from .chat_template import ChatTemplate, ChatTemplateError, resolve_chat_template
from .chunks import ChunkMaker, CompletionAccumulator, completion
from .config import ConfigError, FrontendConfig
from .protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ErrorResponse,
    Usage,
)
from .request_builder import PreparedRequest, RequestBuilder
from .response import OutputProcessor, engine_dead
from .tool_formats import (
    JsonSchemaToolFormat,
    ToolCallParser,
    ToolFormat,
    ToolFormatError,
    create_tool_format,
    tool_format_names,
)
from .validation import RequestError, ToolSupport, check_request, decode_request

log = logging.getLogger("thinkgate.frontend")

Body = bytes | str | Mapping[str, Any] | ChatCompletionRequest


class ChatFrontend:
    def __init__(
        self,
        client: EngineClient,
        config: FrontendConfig,
        builder: RequestBuilder,
        tool_format: ToolFormat | None,
        model_name: str,
    ) -> None:
        self.client = client
        self.config = config
        self.builder = builder
        self.tool_format = tool_format
        self.model_name = model_name
        self.tokenizer = builder.tokenizer
        #: ids of the requests running now
        self.active: set[str] = set()
        #: told of every request that ran, as it ends (the HTTP server's metrics)
        self.on_finish: Observer | None = None
        self.support = ToolSupport(
            auto=config.enable_auto_tool_choice and tool_format is not None,
            forced=True,  # the JSON-schema way needs no family format
        )

    @classmethod
    def create(cls, client: EngineClient, config: FrontendConfig) -> ChatFrontend:
        """A front end for the engine behind ``client``; `ConfigError` names what cannot
        work (an unknown parser lists the known ones)."""
        config.check()
        handshake = client.handshake
        assert handshake is not None, "the client has not completed its handshake"
        if config.tool_parser_plugin:
            _load(config.tool_parser_plugin, "--tool-parser-plugin")
        if config.reasoning_parser_plugin:
            _load(config.reasoning_parser_plugin, "--reasoning-parser-plugin")
        tokenizer = client.tokenizer()

        reasoning = config.reasoning_parser or handshake.reasoning_parser
        if reasoning is not None:
            try:
                create_reasoning_parser(reasoning, tokenizer)
            except KeyError:
                raise ConfigError(
                    f"unknown reasoning parser {reasoning!r}; known: "
                    f"{', '.join(reasoning_parser_names())}"
                ) from None
            except ReasoningError as e:
                raise ConfigError(str(e)) from None
        if reasoning != handshake.reasoning_parser:
            raise ConfigError(
                f"the front end's reasoning parser ({reasoning!r}) differs from the engine's "
                f"({handshake.reasoning_parser!r}): both must find the end of thinking alike"
            )

        tool_format = None
        if config.tool_call_parser:
            if not config.enable_auto_tool_choice:
                log.warning(
                    '--tool-call-parser %s without --enable-auto-tool-choice: tool_choice "auto" '
                    "is refused; forced calls use the format",
                    config.tool_call_parser,
                )
            try:
                tool_format = create_tool_format(config.tool_call_parser, tokenizer)
            except KeyError:
                raise ConfigError(
                    f"unknown tool-call parser {config.tool_call_parser!r}; known: "
                    f"{', '.join(tool_format_names())}"
                ) from None
            except ToolFormatError as e:
                raise ConfigError(str(e)) from None

        # vLLM's rule: without a family format, calls are forced as plain JSON
        forced_format: ToolFormat = tool_format or JsonSchemaToolFormat(tokenizer)
        if config.tool_call_constraint == "json_schema":
            forced_format = JsonSchemaToolFormat(tokenizer)

        try:
            source = resolve_chat_template(
                config.chat_template, tokenizer.chat_template, handshake.tokenizer
            )
            template = ChatTemplate(
                source,
                bos_token=_token_text(tokenizer, tokenizer.bos_token_id),
                eos_token=_token_text(tokenizer, tokenizer.eos_token_id),
            )
        except ChatTemplateError as e:
            raise ConfigError(str(e)) from None

        builder = RequestBuilder(
            tokenizer,
            template,
            reasoning_parser=reasoning,
            tool_format=tool_format,
            forced_format=forced_format,
            default_max_tokens=config.default_max_tokens,
        )
        return cls(
            client, config, builder, tool_format, config.served_model_name or handshake.model
        )

    # ----- requests ------------------------------------------------------------------

    def prepare(self, body: Body) -> PreparedRequest:
        """Decode, check and build; `RequestError` for a request the API refuses."""
        req = decode_request(body)
        self.check_model(req.model)
        plan = check_request(req, self.support)
        return self.builder.build(req, plan)

    def check_model(self, model: str | None) -> None:
        """A request may name the served model, or none."""
        if model is not None and model != self.model_name:
            raise RequestError(
                f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                "model",
                status_code=404,
                type="NotFoundError",
            )

    def processor(self, prepared: PreparedRequest) -> OutputProcessor:
        """The output machine of one prepared request."""
        parser = prepared.reasoning_parser
        tracker = (
            parser.tracker(prepared.prompt_token_ids, prepared.engine_request.reasoning_ended)
            if parser is not None
            else None
        )
        return OutputProcessor(
            token_bytes=self.tokenizer.token_bytes,
            prompt_tokens=len(prepared.prompt_token_ids),
            tracker=tracker,
            tool_parser=self._tool_parser(prepared),
            keep_calls=prepared.plan.reads_calls,
            parallel_tool_calls=prepared.plan.parallel,
            include_reasoning=prepared.include_reasoning,
            stop=prepared.stop,
            stop_token_ids=prepared.engine_request.sampling_params.stop_token_ids,
            logprobs=prepared.engine_request.sampling_params.logprobs is not None,
        )

    def _tool_parser(self, prepared: PreparedRequest) -> ToolCallParser | None:
        """The parser of the content: the forcing format's for a forced call (whose
        grammar guarantees the calls, so they stream as written), the family's for
        "auto" (each call held until it resolves); for an answer without calls, the
        family's only where it frames its answers (its calls are then dropped, see
        `processor`)."""
        plan = prepared.plan
        if plan.forced:
            fmt = self.builder.forced_format
            return fmt.new_parser(plan.tools, named=plan.named, forced=True)
        fmt = self.tool_format
        if plan.reads_calls:
            assert fmt is not None  # check_request refuses "auto" otherwise
            return fmt.new_parser(plan.tools)
        if fmt is not None and fmt.frames_answers:
            return fmt.new_parser([])
        return None

    def run(self, endpoint: str, request_id: str, proc: OutputProcessor) -> Run:
        """Book-keeping of one request while it runs (see `Run`)."""
        return Run(self, endpoint, request_id, proc)

    async def complete(self, prepared: PreparedRequest) -> ChatCompletion | ErrorResponse:
        """Run ``prepared`` and return the whole response."""
        proc = self.processor(prepared)
        acc = CompletionAccumulator()
        created = int(time.time())
        with self.run("chat", prepared.request_id, proc) as run:
            if run.refused is not None:
                return run.refused
            try:
                async with aclosing(self._generate(prepared)) as outputs:
                    async for out in outputs:
                        acc.add(proc.push(out))
                        if proc.finished:
                            break
            except EngineDeadError as e:
                run.outcome = "error"
                return engine_dead(e)
            run.outcome = None
        if proc.error is not None:
            return proc.error_response(produced_tokens=proc.completion_tokens > 0)
        return completion(
            prepared.request_id,
            created,
            self.model_name,
            acc.message(),
            proc.finish_reason,
            proc.usage,
            logprobs=proc.chat_logprobs(acc.logprobs),
            stop_reason=proc.stop_reason,
            ignored_keywords=list(prepared.ignored_keywords) or None,
        )

    async def stream(
        self, prepared: PreparedRequest
    ) -> AsyncIterator[ChatCompletionChunk | ErrorResponse]:
        """Run ``prepared`` and yield its chunks (see the module docstring). Closing the
        iterator early aborts the request in the engine.

        The role chunk comes with the engine's first output, so that a request the
        engine refuses outright (full, a bad grammar) or a dead engine yields one
        `ErrorResponse` and nothing else: an HTTP server can still answer it with an
        error status."""
        proc = self.processor(prepared)
        chunks = ChunkMaker(prepared.request_id, int(time.time()), self.model_name)
        every = prepared.continuous_usage
        began = False
        with self.run("chat", prepared.request_id, proc) as run:
            if run.refused is not None:
                yield run.refused
                return
            try:
                async with aclosing(self._generate(prepared)) as outputs:
                    async for out in outputs:
                        role_usage = proc.usage if every and not began else None
                        delta = proc.push(out)
                        if proc.error is not None:
                            run.outcome = None
                            if began and delta:
                                yield chunks.delta(delta)
                            yield proc.error_response(produced_tokens=proc.completion_tokens > 0)
                            return
                        if not began:
                            began = True
                            yield chunks.role(role_usage, list(prepared.ignored_keywords) or None)
                        if delta or proc.finished:
                            yield chunks.delta(
                                delta,
                                proc.finish_reason,
                                proc.usage if every else None,
                                logprobs=proc.chat_logprobs(delta.logprobs)
                                if delta.logprobs
                                else None,
                                stop_reason=proc.stop_reason if proc.finished else None,
                            )
                        if proc.finished:
                            break
            except EngineDeadError as e:
                run.outcome = "error"
                yield engine_dead(e)
                return
            run.outcome = None
        if prepared.include_usage:
            yield chunks.usage(proc.usage)

    def _generate(self, prepared: PreparedRequest) -> AsyncIterator[RequestOutput]:
        return self.client.generate(prepared.engine_request)

    async def create_chat_completion(
        self, body: Body
    ) -> ChatCompletion | ErrorResponse | AsyncIterator[ChatCompletionChunk | ErrorResponse]:
        """vLLM's entry point: an error, a completion, or (``stream: true``) chunks."""
        try:
            prepared = self.prepare(body)
        except RequestError as e:
            return e.to_response()
        if prepared.stream:
            return self.stream(prepared)
        return await self.complete(prepared)


def _load(plugin: str, flag: str) -> None:
    try:
        load_plugin(plugin)
    except ImportError as e:
        raise ConfigError(f"{flag} {plugin!r}: {e}") from None


def _token_text(tokenizer, token_id: int | None) -> str | None:
    return tokenizer.decode([token_id]) if token_id is not None else None


#: what a request's end is counted as: `Run.outcome`, else its finish reason
Observer = Callable[[str, str, Usage, float], None]


class Run:
    """One request while it runs: its id is reserved (a second request with the same
    id in flight is refused: `refused` holds the answer), and when it ends the
    front end's ``on_finish`` observer hears the endpoint, how it ended ("error" for
    an engine error, "disconnected" when the caller left before the end, else the
    finish reason), its usage and its seconds. The caller sets ``outcome`` to None
    once the output is complete, or to a word of its own."""

    def __init__(
        self, frontend: ChatFrontend, endpoint: str, request_id: str, proc: OutputProcessor
    ) -> None:
        self.frontend = frontend
        self.endpoint = endpoint
        self.request_id = request_id
        self.proc = proc
        self.outcome: str | None = "disconnected"
        self.refused: ErrorResponse | None = None
        self._started = time.monotonic()

    def __enter__(self) -> Run:
        active = self.frontend.active
        if self.request_id in active:
            self.refused = RequestError(
                f"a request with the id {self.request_id!r} is already running", "request_id"
            ).to_response()
        else:
            active.add(self.request_id)
        return self

    def __exit__(self, *exc) -> None:
        if self.refused is not None:
            return
        self.frontend.active.discard(self.request_id)
        observer = self.frontend.on_finish
        if observer is None:
            return
        proc = self.proc
        how = self.outcome or proc.finish_reason or ("error" if proc.error else "stop")
        observer(self.endpoint, how, proc.usage, time.monotonic() - self._started)
