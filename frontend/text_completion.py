"""``POST /v1/completions``: a raw prompt, continued as it is.

No chat template, no reasoning split, no tool calls: the text comes back as the model
wrote it. A ``response_format`` / ``structured_outputs`` constraint still waits for
the thinking to end where the engine has a reasoning parser (the parser reads the
prompt as the chat side does, with no template kwargs). Stop strings, stop tokens and
log-probabilities work as in the chat API (`OutputProcessor` does the same work).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine_core.client import EngineDeadError
from ipc import MAX_TOP_LOGPROBS, EngineCoreRequest, SamplingParams, StructuredOutputSpec

from .logprobs import CompletionLogprobMaker
from .protocol import (
    Completion,
    CompletionChoice,
    CompletionRequest,
    ErrorResponse,
    Usage,
)
from .request_builder import response_spec
from .response import OutputProcessor, engine_dead
from .validation import RequestError, check_output_constraint, check_sampling, decode_body

if TYPE_CHECKING:
    from .serving import ChatFrontend


@dataclass(slots=True)
class PreparedCompletion:
    engine_request: EngineCoreRequest
    stop: list[str]
    stream: bool
    include_usage: bool
    logprobs: int | None

    @property
    def request_id(self) -> str:
        return self.engine_request.request_id


class TextCompletions:
    """The completions API over a `ChatFrontend`'s engine, tokenizer and model name."""

    def __init__(self, chat: ChatFrontend) -> None:
        self.chat = chat
        self.tokenizer = chat.tokenizer

    def prepare(
        self, body: bytes | str | Mapping[str, Any] | CompletionRequest
    ) -> PreparedCompletion:
        """Decode, check and build; `RequestError` for a request the API refuses."""
        req = decode_body(body, CompletionRequest)
        self.chat.check_model(req.model)
        check_sampling(req)
        check_output_constraint(req)
        if req.echo:
            raise RequestError("echo is not supported", "echo")
        if req.suffix:
            raise RequestError("suffix is not supported", "suffix")
        if req.best_of not in (None, 1):
            raise RequestError("only best_of=1 is supported", "best_of")
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(
                f"logprobs must lie in [0, {MAX_TOP_LOGPROBS}], got {req.logprobs}", "logprobs"
            )
        prompt_ids = self._prompt_ids(req.prompt)
        spec = response_spec(req)
        parser = self.chat.builder.reasoning_parser_for({})
        sp = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(req.top_k or 0, 0),
            seed=req.seed,
            max_tokens=req.max_tokens or self.chat.config.default_max_tokens,
            min_tokens=req.min_tokens,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            logprobs=req.logprobs,
        )
        engine_request = EngineCoreRequest(
            request_id=req.request_id or f"cmpl-{uuid.uuid4().hex}",
            prompt_token_ids=prompt_ids,
            sampling_params=sp,
            structured_output=(
                StructuredOutputSpec(spec.kind.value, spec.value) if spec is not None else None
            ),
            reasoning_ended=parser.reasoning_ended(prompt_ids) if parser is not None else None,
            reasoning_parser_kwargs={} if parser is not None else None,
        )
        return PreparedCompletion(
            engine_request=engine_request,
            stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            logprobs=req.logprobs,
        )

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            rows = self.tokenizer.vocab_rows
            bad = [t for t in prompt if not 0 <= t < rows]
            if bad:
                raise RequestError(
                    f"prompt token ids must lie in [0, {rows}); got {bad[0]}", "prompt"
                )
            ids = list(prompt)
        if not ids:
            raise RequestError("the prompt is empty", "prompt")
        return ids

    def _processor(self, p: PreparedCompletion) -> OutputProcessor:
        return OutputProcessor(
            token_bytes=self.tokenizer.token_bytes,
            prompt_tokens=len(p.engine_request.prompt_token_ids),
            tracker=None,
            tool_parser=None,
            stop=p.stop,
            stop_token_ids=p.engine_request.sampling_params.stop_token_ids,
            logprobs=p.logprobs is not None,
        )

    def _logprob_maker(self, p: PreparedCompletion) -> CompletionLogprobMaker | None:
        if p.logprobs is None:
            return None
        return CompletionLogprobMaker(self.tokenizer.token_bytes, p.logprobs)

    async def complete(self, p: PreparedCompletion) -> Completion | ErrorResponse:
        """Run ``p`` and return the whole completion."""
        proc = self._processor(p)
        maker = self._logprob_maker(p)
        created = int(time.time())
        text: list[str] = []
        entries = []
        with self.chat.run("completions", p.request_id, proc) as run:
            if run.refused is not None:
                return run.refused
            try:
                async with aclosing(self.chat.client.generate(p.engine_request)) as outputs:
                    async for out in outputs:
                        d = proc.push(out)
                        text.append(d.content)
                        entries += d.logprobs or []
                        if proc.finished:
                            break
            except EngineDeadError as e:
                run.outcome = "error"
                return engine_dead(e)
            run.outcome = None
        if proc.error is not None:
            return proc.error_response(produced_tokens=proc.completion_tokens > 0)
        choice = CompletionChoice(
            index=0,
            text="".join(text),
            finish_reason=proc.finish_reason,
            logprobs=maker.make(entries) if maker is not None else None,
            stop_reason=proc.stop_reason,
        )
        return Completion(
            id=p.request_id,
            created=created,
            model=self.chat.model_name,
            choices=[choice],
            usage=proc.usage,
        )

    async def stream(self, p: PreparedCompletion) -> AsyncIterator[Completion | ErrorResponse]:
        """Run ``p`` and yield its pieces: one per engine output that adds text, the
        finish reason on the last, then the usage when asked. As with the chat stream,
        a request refused outright yields one `ErrorResponse` and nothing else."""
        proc = self._processor(p)
        maker = self._logprob_maker(p)
        created = int(time.time())
        model = self.chat.model_name

        def piece(choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
            return Completion(
                id=p.request_id, created=created, model=model, choices=choices, usage=usage
            )

        with self.chat.run("completions", p.request_id, proc) as run:
            if run.refused is not None:
                yield run.refused
                return
            try:
                async with aclosing(self.chat.client.generate(p.engine_request)) as outputs:
                    async for out in outputs:
                        d = proc.push(out)
                        if proc.error is not None:
                            run.outcome = None
                            yield proc.error_response(produced_tokens=proc.completion_tokens > 0)
                            return
                        if d.content or proc.finished or d.logprobs:
                            choice = CompletionChoice(
                                index=0,
                                text=d.content,
                                finish_reason=proc.finish_reason,
                                logprobs=maker.make(d.logprobs or []) if maker else None,
                                stop_reason=proc.stop_reason if proc.finished else None,
                            )
                            yield piece([choice])
                        if proc.finished:
                            break
            except EngineDeadError as e:
                run.outcome = "error"
                yield engine_dead(e)
                return
            run.outcome = None
        if p.include_usage:
            yield piece([], proc.usage)
