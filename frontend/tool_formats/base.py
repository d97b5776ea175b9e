"""What every tool-call format provides: the constraint that forces a call, and the
parser that reads calls back, from one description of the family's syntax.

The two must agree by construction: every output the constraint admits parses to
valid calls, and the stream parse equals the whole parse byte for byte.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from structured_output import GrammarSpec

if TYPE_CHECKING:
    from tokenization import Tokenizer


class ToolFormatError(ValueError):
    """A format cannot serve this tokenizer, or these tools (a marker is missing, ...)."""


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One function tool of a request."""

    name: str
    #: JSON schema of the arguments; None: any JSON object
    parameters: dict[str, Any] | None = None
    description: str | None = None
    #: OpenAI's ``strict``; False leaves the arguments schema-free (still a JSON object)
    strict: bool | None = None

    @property
    def schema(self) -> dict[str, Any]:
        """The schema the arguments are constrained to."""
        if self.parameters is None or self.strict is False:
            return {"type": "object"}
        return self.parameters


@dataclass(slots=True)
class ParsedCall:
    """One call read back from an output (the wire form is `frontend.protocol.ToolCall`)."""

    id: str
    name: str
    #: the arguments as JSON text
    arguments: str


@dataclass(frozen=True, slots=True)
class Markup:
    """The fixed texts of a family's call syntax, read off its description: what a
    model writes around and between the names and arguments of its calls."""

    #: every fixed text: markers, tags, the punctuation of the call syntax
    texts: tuple[str, ...]
    #: what the constraint writes between two calls ("" when nothing, or one call per
    #: output)
    separator: str = ""


@dataclass(slots=True)
class ToolCallDelta:
    """One piece of a streamed call, in the OpenAI stream form: the first piece of a
    call carries ``id`` and ``name``; later pieces only more ``arguments`` text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class StreamDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


@dataclass(slots=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ParsedCall]


def default_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class ToolCallParser(ABC):
    """Reads one output's content text, incrementally. Per-call work is proportional
    to the new text; only what is unresolved is held back (a partial marker, a call
    not yet known to be one).

    ``forced``: the output was written under the format's own constraint, which
    guarantees its calls, so a call may stream as it is written (its first piece once
    its name is known, then its arguments text as it comes). Without it a parser holds
    each call until it resolves (auto mode: it may still turn out not to be a call)."""

    def __init__(
        self,
        fmt: ToolFormat,
        tools: Sequence[FunctionTool],
        *,
        named: str | None = None,
        forced: bool = False,
    ) -> None:
        self.format = fmt
        self.tools = list(tools)
        self.tools_by_name = {t.name: t for t in tools}
        #: the request's named function, if any
        self.named = named
        #: the output was written under this format's constraint (see the class docstring)
        self.forced = forced

    @abstractmethod
    def push(self, text: str) -> StreamDelta:
        """Feed more content text; return what became certain."""

    @abstractmethod
    def finish(self) -> StreamDelta:
        """The output ended: return everything still held back."""

    def new_call_id(self, index: int, name: str) -> str:
        return default_call_id()


class ToolFormat(ABC):
    """One family's tool-call syntax, bound to a tokenizer."""

    #: the name messages give the format: the registry name it was created under
    #: (`create_tool_format` passes it), else this class default, else the class name
    name: str = ""
    #: markers that must each be one special token of the vocabulary
    special_markers: ClassVar[tuple[str, ...]] = ()
    #: the family wraps every answer in its own syntax (Harmony's channels): its parser
    #: must read every answer, calls or not, to take the content out of the framing
    frames_answers: ClassVar[bool] = False

    def __init__(self, tokenizer: Tokenizer, *, name: str | None = None) -> None:
        self.name = name or self.name or type(self).__name__
        self.tokenizer = tokenizer
        missing = [m for m in self.special_markers if m not in tokenizer.special_tokens]
        if missing:
            raise ToolFormatError(
                f"tool-call format {self.name!r} needs {', '.join(map(repr, missing))} as "
                f"special tokens, and the vocabulary {tokenizer.name!r} lacks them"
            )

    @abstractmethod
    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        """The grammar that forces a call: one of ``tools`` at least ("required",
        ``named`` None), or exactly one call of ``named``. ``parallel`` False allows
        exactly one call. The grammar starts at the answer's first token. Tools the
        syntax cannot carry raise `ToolFormatError`."""

    @abstractmethod
    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None, forced: bool = False
    ) -> ToolCallParser:
        """An incremental parser for one output. ``named`` is the request's named
        function, for formats whose output does not carry the name; ``forced``: the
        output was written under this format's `constraint` (`ToolCallParser`)."""

    def parse(
        self,
        text: str,
        tools: Sequence[FunctionTool],
        *,
        named: str | None = None,
        forced: bool = False,
    ) -> ParsedOutput:
        """Whole content text to calls and the remaining content (via the same
        machine as the stream, so the two agree)."""
        parser = self.new_parser(tools, named=named, forced=forced)
        deltas = [parser.push(text), parser.finish()]
        return collect(deltas)

    @property
    def markup(self) -> Markup:
        """The fixed texts of this family's syntax (its special markers, unless the
        family describes more)."""
        return Markup(self.special_markers)

    def response_constraint(self, spec: GrammarSpec) -> GrammarSpec:
        """The grammar for a ``response_format`` answer in this family's syntax: ``spec``
        itself, unless the family wraps its answers (Harmony's final channel)."""
        return spec


def collect(deltas: Sequence[StreamDelta]) -> ParsedOutput:
    """Fold stream deltas into the whole-output form."""
    content: list[str] = []
    calls: dict[int, ParsedCall] = {}
    for d in deltas:
        content.append(d.content)
        for c in d.tool_calls:
            call = calls.get(c.index)
            if call is None:
                call = calls[c.index] = ParsedCall(id=c.id or "", name=c.name or "", arguments="")
            call.arguments += c.arguments
    text = "".join(content)
    return ParsedOutput(content=text or None, tool_calls=[calls[i] for i in sorted(calls)])
