"""From a checked chat request to the `EngineCoreRequest` the engine runs.

`RequestBuilder.build` does steps 1-3 of DESIGN.md's "One request, end to end":

1. render the messages and tools with the chat template (the request's
   ``chat_template_kwargs`` become template variables; ``reasoning_effort`` joins them,
   and ``"none"`` sets ``enable_thinking: false`` unless the kwargs set it) and encode
   the text, special-token strings becoming their single ids;
2. with the reasoning parser built from those kwargs, decide ``reasoning_ended`` from
   the prompt ids (None when no reasoning parser is configured), and send the kwargs as
   ``reasoning_parser_kwargs`` so that the engine's parser reads the output alike;
3. the constraint: for a forced call ("required" or named) the tool format's
   ``constraint`` (or the JSON-schema way: with ``--tool-call-constraint json_schema``,
   or when no format is configured); for ``response_format`` / ``structured_outputs``
   the matching spec, wrapped by the format's ``response_constraint`` where the family
   wraps its answers (Harmony's final channel); otherwise none.

``include_reasoning: false`` changes nothing here: the model still thinks, and the
engine still switches the grammar on where the thinking ends.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ipc import EngineCoreRequest, SamplingParams, StructuredOutputSpec
from reasoning import ParserCache, ReasoningError, ReasoningParser
from structured_output import GrammarError, GrammarSpec, SpecKind
from structured_output.json_schemas import normalize_spec

from .chat_template import ChatTemplate, ChatTemplateError, template_messages, template_tools
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    ResponseFormatStructuralTag,
    StructuredOutputsParam,
)
from .tool_formats import FunctionTool, ToolFormat, ToolFormatError
from .tool_formats.schemas import normalize_tools
from .validation import RequestError, ToolPlan

if TYPE_CHECKING:
    from tokenization import Tokenizer


@dataclass(slots=True)
class PreparedRequest:
    """Everything the response side needs, besides the engine's outputs."""

    engine_request: EngineCoreRequest
    #: for a forced call, with the normalized tools its constraint was built from
    plan: ToolPlan
    #: the chat-template kwargs (also the engine's reasoning-parser kwargs)
    template_kwargs: dict[str, Any]
    #: the front end's parser, built with ``template_kwargs``; None: none configured
    reasoning_parser: ReasoningParser | None
    stop: list[str]
    include_reasoning: bool
    stream: bool
    #: a usage chunk at the end of the stream
    include_usage: bool
    #: the usage so far on every chunk (``stream_options.continuous_usage_stats``)
    continuous_usage: bool
    prompt_text: str
    #: JSON-schema keywords left out of the constraint (``ignore_unsupported_keywords``),
    #: each as "keyword at 'path' (why)", prefixed by its tool: for the response to state
    ignored_keywords: tuple[str, ...] = ()

    @property
    def request_id(self) -> str:
        return self.engine_request.request_id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.engine_request.prompt_token_ids


class RequestBuilder:
    """Renders, decides the reasoning state and builds the constraint. Holds no
    per-request state; safe to share."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        *,
        reasoning_parser: str | None,
        tool_format: ToolFormat | None,
        forced_format: ToolFormat,
        default_max_tokens: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.reasoning_parser_name = reasoning_parser
        #: the family's format (``--tool-call-parser``): reads calls, wraps answers
        self.tool_format = tool_format
        #: the format that forces "required" and named calls: the family's, or the
        #: JSON-schema way
        self.forced_format = forced_format
        self.default_max_tokens = default_max_tokens
        self._parsers = (
            ParserCache(reasoning_parser, tokenizer, field="chat_template_kwargs")
            if reasoning_parser is not None
            else None
        )

    # ----- reasoning -------------------------------------------------------------

    def reasoning_parser_for(self, kwargs: Mapping[str, Any]) -> ReasoningParser | None:
        """The front end's reasoning parser for these kwargs, from the same kind of
        cache the engine builds its own from (`reasoning.ParserCache`); kwargs the
        parser refuses are the request's error."""
        if self._parsers is None:
            return None
        try:
            return self._parsers.get(kwargs)
        except ReasoningError as e:
            raise RequestError(str(e), "chat_template_kwargs") from None

    # ----- the whole request ---------------------------------------------------------

    def build(self, req: ChatCompletionRequest, plan: ToolPlan) -> PreparedRequest:
        """The engine request for a checked ``req``; `RequestError` if it cannot be
        rendered or constrained."""
        kwargs = template_kwargs(req)
        try:
            text = self.template.render(
                template_messages(req.messages), template_tools(req.tools), kwargs=kwargs
            )
        except ChatTemplateError as e:
            raise RequestError(str(e), "messages") from None
        prompt_ids = self.tokenizer.encode(text)
        if not prompt_ids:
            raise RequestError("the rendered prompt is empty", "messages")

        parser = self.reasoning_parser_for(kwargs)
        reasoning_ended = parser.reasoning_ended(prompt_ids) if parser is not None else None
        if req.thinking_token_budget is not None and parser is None:
            raise RequestError(
                "thinking_token_budget needs a reasoning parser (--reasoning-parser)",
                "thinking_token_budget",
            )
        if plan.forced:
            spec, ignored, tools = self._forced_call(plan, req.ignore_unsupported_keywords)
            # the forced parser reads the schemas the constraint was built from: the XML
            # formats read a raw value as text or JSON by its schema, and normalizing can
            # change which (an enum left with strings only)
            plan = replace(plan, tools=tools)
        else:
            spec, ignored = self.checked_constraint(req, plan)
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        engine_request = EngineCoreRequest(
            request_id=req.request_id or f"chatcmpl-{uuid.uuid4().hex}",
            prompt_token_ids=prompt_ids,
            sampling_params=self.sampling_params(req),
            structured_output=(
                StructuredOutputSpec(spec.kind.value, spec.value, spec.ignore_unsupported)
                if spec is not None
                else None
            ),
            reasoning_ended=reasoning_ended,
            reasoning_parser_kwargs=kwargs if parser is not None else None,
            reasoning_budget=req.thinking_token_budget,
        )
        return PreparedRequest(
            engine_request=engine_request,
            plan=plan,
            template_kwargs=kwargs,
            reasoning_parser=parser,
            stop=stops,
            include_reasoning=req.include_reasoning,
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            continuous_usage=bool(req.stream_options and req.stream_options.continuous_usage_stats),
            prompt_text=text,
            ignored_keywords=ignored,
        )

    def sampling_params(self, req: ChatCompletionRequest) -> SamplingParams:
        max_tokens = req.max_completion_tokens or req.max_tokens or self.default_max_tokens
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(req.top_k or 0, 0),
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        )

    # ----- constraints -----------------------------------------------------------------

    def constraint(self, req: ChatCompletionRequest, plan: ToolPlan) -> GrammarSpec | None:
        """The grammar the answer must follow, or None."""
        return self.checked_constraint(req, plan)[0]

    def checked_constraint(
        self, req: ChatCompletionRequest, plan: ToolPlan
    ) -> tuple[GrammarSpec | None, tuple[str, ...]]:
        """The grammar the answer must follow (or None), with its JSON schemas checked
        here as the engine checks them, so that a schema it would refuse is refused
        before it is sent; and the keywords left out (``ignore_unsupported_keywords``)."""
        ignore = req.ignore_unsupported_keywords
        if plan.forced:
            spec, ignored, _ = self._forced_call(plan, ignore)
            return spec, ignored
        spec = response_spec(req)
        if spec is None:
            return None, ()
        param = "response_format" if req.response_format is not None else "structured_outputs"
        spec = replace(spec, ignore_unsupported=ignore)
        try:
            report = normalize_spec(spec)
            if self.tool_format is not None:
                spec = replace(
                    self.tool_format.response_constraint(spec), ignore_unsupported=ignore
                )
        except (ToolFormatError, GrammarError) as e:
            raise RequestError(str(e), param) from None
        return spec, report.ignored

    def _forced_call(
        self, plan: ToolPlan, ignore: bool
    ) -> tuple[GrammarSpec, tuple[str, ...], tuple[FunctionTool, ...]]:
        """The family's constraint over the tools' normalized parameter schemas (a
        parameter no value fits is left out if optional, and refused, naming the tool
        and the parameter, if required), the keywords left out, and those tools."""
        try:
            tools = normalize_tools(plan.tools, ignore_unsupported=ignore)
            spec = self.forced_format.constraint(
                tools.tools, named=plan.named, parallel=plan.parallel
            )
        except (ToolFormatError, GrammarError) as e:
            raise RequestError(str(e), "tools") from None
        return replace(spec, ignore_unsupported=ignore), tools.ignored, tools.tools


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """The request's chat-template kwargs, with ``reasoning_effort`` added (``"none"``
    also sets ``enable_thinking: false``, unless the kwargs set it themselves)."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
        if req.reasoning_effort == "none":
            kwargs.setdefault("enable_thinking", False)
    return kwargs


def response_spec(req: ChatCompletionRequest | CompletionRequest) -> GrammarSpec | None:
    """The constraint ``response_format`` or ``structured_outputs`` asks for, or None."""
    rf = req.response_format
    if isinstance(rf, ResponseFormatJsonObject):
        return GrammarSpec(SpecKind.JSON_OBJECT)
    if isinstance(rf, ResponseFormatJsonSchema):
        if rf.json_schema.schema_ is None:
            raise RequestError(
                "response_format json_schema needs a schema", "response_format.json_schema.schema"
            )
        return GrammarSpec(SpecKind.JSON_SCHEMA, json.dumps(rf.json_schema.schema_))
    if isinstance(rf, ResponseFormatStructuralTag):
        return GrammarSpec(SpecKind.STRUCTURAL_TAG, json.dumps(_structural_tag(rf)))
    if req.structured_outputs is not None:
        return _structured_outputs_spec(req.structured_outputs)
    return None


def _structural_tag(rf: ResponseFormatStructuralTag) -> dict[str, Any]:
    """xgrammar's structural tag from the current form (``format``) or vLLM's legacy
    one (``structures`` + ``triggers``: free text in which each trigger opens one of
    the structures)."""
    if rf.format is not None:
        if rf.structures is not None or rf.triggers is not None:
            raise RequestError(
                "structural_tag takes either format, or structures and triggers", "response_format"
            )
        return {"type": "structural_tag", "format": rf.format}
    if not rf.structures or not rf.triggers:
        raise RequestError(
            "structural_tag needs format, or both structures and triggers", "response_format"
        )
    tags = [
        {
            "type": "tag",
            "begin": s.begin,
            "content": {"type": "json_schema", "json_schema": s.schema_ or {"type": "object"}},
            "end": s.end,
        }
        for s in rf.structures
    ]
    fmt = {"type": "triggered_tags", "triggers": list(rf.triggers), "tags": tags}
    return {"type": "structural_tag", "format": fmt}


def _structured_outputs_spec(so: StructuredOutputsParam) -> GrammarSpec:
    if so.json is not None:
        value = so.json if isinstance(so.json, str) else json.dumps(so.json)
        return GrammarSpec(SpecKind.JSON_SCHEMA, value)
    if so.regex is not None:
        return GrammarSpec(SpecKind.REGEX, so.regex)
    if so.choice is not None:
        return GrammarSpec(SpecKind.CHOICE, json.dumps(so.choice))
    if so.grammar is not None:
        return GrammarSpec(SpecKind.GRAMMAR, so.grammar)
    if so.structural_tag is not None:
        tag = so.structural_tag
        return GrammarSpec(
            SpecKind.STRUCTURAL_TAG, tag if isinstance(tag, str) else json.dumps(tag)
        )
    return GrammarSpec(SpecKind.JSON_OBJECT)
