"""Chat templates: choose one, and render a request's messages and tools with it.

A template comes from, in order: the ``--chat-template`` flag (a file, or the name of a
built-in template), the tokenizer's own (a model directory's ``tokenizer_config.json``
or ``chat_template.jinja``), or the built-in template of a bundled vocabulary
(``qwen3`` -> ``qwen3.jinja``, ``o200k_harmony`` -> ``harmony.jinja``).

Rendering follows Hugging Face's ``apply_chat_template``: a sandboxed Jinja2
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, a ``tojson`` filter that keeps non-ASCII text, and the globals
``raise_exception`` and ``strftime_now``. Messages reach the template as plain dicts in
OpenAI's form, with three changes that templates expect (as vLLM makes them): text
parts are joined into one string, a tool call's ``arguments`` are parsed into an
object when they are valid JSON, and earlier thinking appears as ``reasoning_content``
(also as ``reasoning`` and ``thinking``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .protocol import AssistantMessage, Content, Message, ToolMessage, ToolParam

#: built-in template name -> file in ``frontend/templates``
BUILTIN_TEMPLATES: dict[str, str] = {"qwen3": "qwen3.jinja", "harmony": "harmony.jinja"}
#: bundled vocabulary -> its built-in template
_VOCABULARY_TEMPLATES: dict[str, str] = {"qwen3": "qwen3", "o200k_harmony": "harmony"}


class ChatTemplateError(ValueError):
    """No template, a template that does not compile, or one that fails to render."""


@cache
def builtin_template(name: str) -> str:
    """The source of the built-in template ``name``."""
    file = BUILTIN_TEMPLATES.get(name)
    if file is None:
        known = ", ".join(sorted(BUILTIN_TEMPLATES))
        raise ChatTemplateError(f"unknown built-in chat template {name!r}; built in: {known}")
    return resources.files("frontend.templates").joinpath(file).read_text(encoding="utf-8")


def resolve_chat_template(
    option: str | None, tokenizer_template: str | None, vocabulary: str
) -> str:
    """The template source to use.

    ``option`` is the ``--chat-template`` value (a file path or a built-in name);
    ``tokenizer_template`` the tokenizer's own; ``vocabulary`` the engine's tokenizer
    name (a bundled vocabulary or a model directory)."""
    if option:
        path = Path(option)
        if path.is_file():
            return path.read_text(encoding="utf-8")
        if option in BUILTIN_TEMPLATES:
            return builtin_template(option)
        raise ChatTemplateError(
            f"--chat-template {option!r} is neither a file nor a built-in template "
            f"({', '.join(sorted(BUILTIN_TEMPLATES))})"
        )
    if tokenizer_template:
        return tokenizer_template
    name = _VOCABULARY_TEMPLATES.get(vocabulary)
    if name is None:
        raise ChatTemplateError(
            f"the tokenizer {vocabulary!r} has no chat template and none is built in for it: "
            "pass --chat-template (a file, or one of "
            f"{', '.join(sorted(BUILTIN_TEMPLATES))})"
        )
    return builtin_template(name)


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template."""

    def __init__(
        self, source: str, *, bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the chat template does not compile: {e}") from None
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text. ``kwargs`` (the chat-template kwargs) become template
        variables. Errors of the template (``raise_exception`` included) raise
        `ChatTemplateError`."""
        variables = dict(kwargs or {})
        variables.update(
            messages=list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            return self._template.render(variables)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(
                f"the chat template cannot render these messages: {e}"
            ) from None


def _text(content: Content | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def role_of(message: Message) -> str:
    """A message's ``role`` (the tag msgspec tells the message types apart by)."""
    return message.__struct_config__.tag  # type: ignore[return-value]


def template_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as the template sees them (see the module docstring). A tool message
    gets the ``name`` of the call it answers when the request does not give one."""
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for m in messages:
        d: dict[str, Any] = {"role": role_of(m), "content": _text(m.content)}
        if m.name is not None:
            d["name"] = m.name
        if isinstance(m, AssistantMessage):
            thought = m.reasoning if m.reasoning is not None else m.reasoning_content
            if thought is not None:
                d["reasoning_content"] = d["reasoning"] = d["thinking"] = thought
            if m.tool_calls:
                d["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.function.name,
                            "arguments": _arguments(c.function.arguments),
                        },
                    }
                    for c in m.tool_calls
                ]
                call_names.update((c.id, c.function.name) for c in m.tool_calls)
        elif isinstance(m, ToolMessage):
            d["tool_call_id"] = m.tool_call_id
            if m.name is None and m.tool_call_id in call_names:
                d["name"] = call_names[m.tool_call_id]
        out.append(d)
    return out


def template_tools(tools: Sequence[ToolParam] | None) -> list[dict[str, Any]] | None:
    """Tools in OpenAI's form (``{"type": "function", "function": {...}}``), with unset
    fields left out."""
    if not tools:
        return None
    out = []
    for t in tools:
        fn: dict[str, Any] = {"name": t.function.name}
        if t.function.description is not None:
            fn["description"] = t.function.description
        if t.function.parameters is not None:
            fn["parameters"] = t.function.parameters
        if t.function.strict is not None:
            fn["strict"] = t.function.strict
        out.append({"type": "function", "function": fn})
    return out
