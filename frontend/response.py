"""From the engine's outputs to an OpenAI message, or to a stream of chunks.

`OutputProcessor` is the one machine both forms use. Per engine output it:

1. strips the final stop token (the one that ended the request) from the text;
2. with stop strings, holds back the tokens that may begin one, and at the first stop
   string cuts the text right before it (inside a token if need be) and ends the
   output (`frontend.stop_strings`: the one owner of stop strings; the caller then
   leaves the engine's stream, which aborts the request there);
3. splits the token ids into reasoning and content with `reasoning.ReasoningStream`
   over the request's tracker (the same machine the engine drives, so both see the
   thinking end at the same token, and both read the family's layout after its end
   marker, such as Qwen3's blank line after ``</think>``, alike: it is in neither
   side), then drops the layout the family's template writes inside the thinking
   markers (`THINKING_LAYOUT`); what the model wrote is kept;
4. reads the content text for tool calls with the format's stream parser;
5. drops calls after the first when ``parallel_tool_calls`` is false (all calls when
   the request reads none: a family that frames its answers, such as Harmony, is
   parsed for its content even then), gives each call an id if its format did not,
   and leaves the reasoning out when ``include_reasoning`` is false, with its tokens'
   log-probabilities.

It returns `OutputDelta` pieces; a whole response is their concatenation
(`CompletionAccumulator`), a stream sends each one as a chunk (`ChunkMaker`), so the two
agree by construction. The work per output is proportional to its new tokens (plus
the longest stop string).

``finish_reason``: "tool_calls" when the message has calls and the engine stopped
normally (a stop token, a stop string, the grammar's end), "length" when max_tokens
cut it (the calls then may be partial: what parsed is still reported), "stop"
otherwise, "abort" for an aborted request; an engine error becomes an error response.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from engine_core.client import RequestOutput
from ipc import ENGINE_FULL, FinishReason
from reasoning import AnswerStart, Phase, ReasoningStream, ReasoningTracker

from .logprobs import AnswerLogprobs, Entry, LogprobQueue, chat_logprobs
from .protocol import (
    ChoiceLogprobs,
    CompletionTokensDetails,
    ErrorInfo,
    ErrorResponse,
    Usage,
)
from .stop_strings import StopStringGate
from .tool_formats import ToolCallDelta, ToolCallParser, default_call_id

#: What a family's chat template writes inside the thinking markers around the
#: thinking itself: a newline after the opening marker and one before the closing one
#: (``<think>\n...\n</think>``, the Qwen3 and DeepSeek-R1 templates). The reasoning
#: returned leaves out one of each where the model wrote them, and keeps everything
#: else it wrote. The one place this rule lives; a family's own rule can replace it.
THINKING_LAYOUT: tuple[str, str] = ("\n", "\n")


@dataclass(slots=True)
class OutputDelta:
    """What one engine output adds to the message."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    #: the log-probabilities of the tokens this delta shows (None: not asked for)
    logprobs: list[Entry] | None = None

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls or self.logprobs)


class ThinkingLayout:
    """Drops `THINKING_LAYOUT` from the thinking text as it streams: the opening
    newline at its start, and the closing one when the thinking ends with its marker
    (a trailing newline is held back until it is known which). Whole and streamed
    agree: what is held is released or dropped the same way whatever the chunking."""

    __slots__ = ("_lead", "_lead_held", "_lead_done", "_trail", "_held")

    def __init__(self, layout: tuple[str, str]) -> None:
        self._lead, self._trail = layout
        self._lead_held = ""
        self._lead_done = not self._lead
        self._held = ""

    def push(self, r: str, *, ended: bool, final: bool) -> str:
        """More thinking text; ``ended``: the thinking closed after it; ``final``: the
        output ends (an unclosed thinking keeps its trailing text)."""
        if not self._lead_done and (r or ended or final):
            lead = self._lead
            n = 0
            while n < len(r) and n < len(lead) and r[n] == lead[n]:
                n += 1
            if n == len(lead):
                r, self._lead_done = r[n:], True
            elif n == len(r) and not (ended or final):
                self._lead_held += r
                self._lead = lead[n:]
                return ""
            else:
                r, self._lead_done = self._lead_held + r, True
            self._lead_held = ""
        r, self._held = self._held + r, ""
        trail = self._trail
        if ended:
            return r[: -len(trail)] if trail and r.endswith(trail) else r
        if final or not trail:
            return r
        for k in range(min(len(trail), len(r)), 0, -1):
            if r.endswith(trail[:k]):
                self._held = r[-k:]
                return r[:-k]
        return r


class OutputProcessor:
    """One request's outputs, in order, to `OutputDelta` pieces (see the module
    docstring). Read `finished`, `finish_reason`, `error` and `usage` after each
    output: once `finished`, the caller stops reading the engine (a stop string ends
    the output before the engine knows)."""

    def __init__(
        self,
        *,
        token_bytes: Callable[[int], bytes],
        prompt_tokens: int,
        tracker: ReasoningTracker | None,
        tool_parser: ToolCallParser | None,
        keep_calls: bool = True,
        parallel_tool_calls: bool = True,
        include_reasoning: bool = True,
        stop: Sequence[str] = (),
        stop_token_ids: Collection[int] = (),
        logprobs: bool = False,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.include_reasoning = include_reasoning
        self.keep_calls = keep_calls
        self.parallel_tool_calls = parallel_tool_calls
        self._tb = token_bytes
        self._split = ReasoningStream(tracker, token_bytes=token_bytes)
        self._layout = ThinkingLayout(THINKING_LAYOUT) if tracker is not None else None
        self._tools = tool_parser
        self._gate = StopStringGate(stop, token_bytes) if stop else None
        self._stop_ids = frozenset(stop_token_ids)
        self._lp = LogprobQueue() if logprobs else None
        self._answer_lp = (
            AnswerLogprobs() if logprobs and not include_reasoning and tracker else None
        )
        self._call_ids: dict[int, str] = {}
        self.engine_finish: FinishReason | None = None
        #: the stop string, or the request's own stop token, that ended the output
        self.stop_reason: str | int | None = None
        self.error: str | None = None

    @property
    def finished(self) -> bool:
        return self.engine_finish is not None

    @property
    def has_calls(self) -> bool:
        return bool(self._call_ids)

    def push(self, out: RequestOutput) -> OutputDelta:
        if self.finished:  # a stop string ended the output; the engine sent more
            return OutputDelta()
        ids = list(out.new_token_ids)
        self.completion_tokens += len(ids)
        lpq = self._lp
        if lpq is not None and ids:
            lpq.push(ids, out.logprobs)
        if out.finished:
            self.engine_finish = out.finish_reason
            if out.finish_reason == FinishReason.ERROR:
                self.error = out.error or "the engine failed the request"
            if (
                out.finish_reason == FinishReason.STOP
                and out.stop_reason is not None
                and ids
                and ids[-1] == out.stop_reason
            ):
                ids.pop()
                if lpq is not None:
                    lpq.drop_last()
                if out.stop_reason in self._stop_ids:
                    self.stop_reason = out.stop_reason
        partial = b""
        if self._gate is None:
            released = ids
        else:
            released, partial = self._gate.push(ids)
            if self._gate.hit is not None:
                self.engine_finish, self.stop_reason, self.error = (
                    FinishReason.STOP,
                    self._gate.hit,
                    None,
                )
            elif out.finished:
                released += self._gate.flush()
        done = self.finished
        delta = OutputDelta(logprobs=[] if lpq is not None else None)
        before = self._phase
        r, c = self._split.push(released) if released else ("", "")
        r = self._trim(r, final=False)
        if lpq is not None:
            self._place_logprobs(delta, lpq.take(len(released)), before, self._split.answer_start)
        if done:
            if partial and lpq is not None:  # the token the stop string begins inside
                self._place_logprobs(delta, lpq.take(1), self._phase, None)
            r2, c2 = self._split.finish(partial)
            r, c = r + self._trim(r2, final=True), c + c2
            if self._answer_lp is not None:
                assert delta.logprobs is not None
                delta.logprobs += self._answer_lp.finish(self._phase)
            if lpq is not None:
                lpq.clear()
        delta.reasoning = r if self.include_reasoning else ""
        if self._tools is None:
            delta.content = c
            return delta
        parsed = [self._tools.push(c)] if c else []
        if done:
            parsed.append(self._tools.finish())
        for d in parsed:
            delta.content += d.content
            for call in d.tool_calls:
                if not self.keep_calls or (call.index > 0 and not self.parallel_tool_calls):
                    continue
                if call.index not in self._call_ids:
                    self._call_ids[call.index] = call.id = call.id or default_call_id()
                delta.tool_calls.append(call)
        return delta

    @property
    def _phase(self) -> Phase:
        t = self._split.tracker
        return t.phase if t is not None else Phase.ANSWER

    def _trim(self, r: str, *, final: bool) -> str:
        """The thinking text without the template's layout (`THINKING_LAYOUT`)."""
        if self._layout is None:
            return r
        return self._layout.push(r, ended=self._phase == Phase.ANSWER, final=final)

    def _place_logprobs(
        self, delta: OutputDelta, entries: list[Entry], before: Phase, start: AnswerStart | None
    ) -> None:
        """Add the entries of tokens just split to ``delta``: all of them, or with the
        thinking left out, those of the answer only (``before``: the tracker's phase
        before them; ``start``: where the answer began among them, if it did)."""
        assert delta.logprobs is not None
        if self._answer_lp is None:
            delta.logprobs += entries
        else:
            delta.logprobs += self._answer_lp.push(entries, before, start, self._phase)

    def chat_logprobs(self, entries: list[Entry] | None) -> ChoiceLogprobs | None:
        """The chat API's ``logprobs`` of a delta's entries (None: not asked for)."""
        if entries is None:
            return None
        return ChoiceLogprobs(content=chat_logprobs(entries, self._tb))

    @property
    def finish_reason(self) -> str | None:
        """The API's finish reason (None before the end, or for an engine error)."""
        reason = self.engine_finish
        if reason == FinishReason.STOP:
            return "tool_calls" if self.has_calls else "stop"
        if reason == FinishReason.LENGTH:
            return "length"
        if reason == FinishReason.ABORT:
            return "abort"
        return None

    @property
    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
            completion_tokens_details=CompletionTokensDetails(
                reasoning_tokens=self._split.num_reasoning_tokens
            ),
        )

    def error_response(self, *, produced_tokens: bool) -> ErrorResponse:
        """The engine's error as an API error (see `engine_error`)."""
        return engine_error(self.error or "the engine failed the request", produced_tokens)


def engine_dead(e: Exception) -> ErrorResponse:
    """The API's answer while the engine is gone (503)."""
    return ErrorResponse(
        error=ErrorInfo(
            message=f"the engine is gone: {e}", type="ServiceUnavailableError", code=503
        )
    )


#: seconds a client is asked to wait before sending a request the engine was too full for
RETRY_AFTER_S = 1


def engine_error(message: str, produced_tokens: bool) -> ErrorResponse:
    """An engine's error as an API error: 503 (retry later) when the engine was full,
    400 when it refused the request before any token (a bad grammar, a prompt too
    long), 500 when the request failed midway."""
    if message.startswith(ENGINE_FULL):
        return ErrorResponse(
            error=ErrorInfo(message=message, type="ServiceUnavailableError", code=503)
        )
    code = 500 if produced_tokens else 400
    return ErrorResponse(
        error=ErrorInfo(
            message=message,
            type="InternalServerError" if produced_tokens else "BadRequestError",
            code=code,
        )
    )
