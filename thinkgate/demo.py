"""thinkgate demo: several chat requests through the front end and a spawned engine.

Nothing is downloaded. The engine runs the SCRIPTED model on the bundled Qwen3
vocabulary: a script (embedded below, or ``--script FILE``) says what the model wants
to write for each prompt, and the engine's grammar decides what it may write. The
front end uses the ``qwen3`` reasoning parser and the ``hermes`` tool-call format.
For each request the demo prints the request in one line, then the reasoning, the
content, the tool calls, the finish reason and the usage of the response.

With ``--model DIR`` the same requests go to a local model directory (one that
``thinkgate make-model`` writes, say) with its own tokenizer and chat template, each
answer capped at ``--max-tokens``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_core.client import EngineClient, EngineStartError
from engine_core.config import EngineConfig
from frontend.chunks import fold_chunks
from frontend.config import ConfigError, FrontendConfig
from frontend.protocol import ChatCompletion, ChatMessage, ErrorResponse, Usage
from frontend.serving import ChatFrontend
from structured_output.config import StructuredOutputConfig


def _think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


#: what the scripted model wants to write, by a phrase of the prompt
SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "match": "weather in Paris",
            "output": _think("The user wants the current weather in Paris. get_weather does that.")
            + _call("get_weather", {"city": "Paris", "unit": "celsius"}),
        },
        {
            "match": "weather in Rome",
            "output": _call("get_weather", {"city": "Rome"}),
        },
        {
            "match": "time is it in Tokyo",
            "output": _think("Tokyo is in the Asia/Tokyo zone.")
            + _call("get_time", {"timezone": "Asia/Tokyo"}),
        },
        {
            "match": "weather in Berlin",
            # a malformed call: an extra key, a unit the schema does not allow, and the
            # closing "}" of the call missing
            "output": _think("Berlin, in kelvin I guess.")
            + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin", '
            '"unit": "kelvin", "days": 3}\n</tool_call>',
        },
        {
            "match": "Oslo and Lima",
            "output": _think("Two cities: two calls.")
            + _call("get_weather", {"city": "Oslo"})
            + "\n"
            + _call("get_weather", {"city": "Lima"}),
        },
        {
            "match": "forecast as JSON",
            "output": _think("A small forecast object.")
            + '{"city": "Paris", "high_c": 24, "low_c": 15, "summary": "sunny"}',
        },
        {
            "match": "umbrella in London",
            "output": _think("Rain is likely in London; check first.")
            + "Let me check the forecast.\n"
            + _call("get_weather", {"city": "London"}),
        },
    ],
    "default": "I have nothing scripted for that.",
}

_UNITS = {"type": "string", "enum": ["celsius", "fahrenheit"]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 40}, "unit": _UNITS},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in an IANA time zone",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string", "maxLength": 40}},
                "required": ["timezone"],
                "additionalProperties": False,
            },
        },
    },
]
FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "high_c": {"type": "integer"},
        "low_c": {"type": "integer"},
        "summary": {"type": "string", "maxLength": 40},
    },
    "required": ["city", "high_c", "low_c", "summary"],
    "additionalProperties": False,
}


def _user(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "seed": 1, **extra}


CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "a forced call after thinking",
        _user("What's the weather in Paris?", tools=TOOLS, tool_choice="required"),
    ),
    (
        "the same with thinking off",
        _user(
            "And the weather in Rome?",
            tools=TOOLS,
            tool_choice="required",
            chat_template_kwargs={"enable_thinking": False},
        ),
    ),
    (
        "a named call",
        _user(
            "What time is it in Tokyo?",
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        ),
    ),
    (
        "a malformed scripted call, repaired by the mask",
        _user("How is the weather in Berlin?", tools=TOOLS, tool_choice="required"),
    ),
    (
        "parallel_tool_calls false: the script tries two calls",
        _user(
            "Weather in Oslo and Lima?",
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
        ),
    ),
    (
        "a JSON-schema response_format after thinking",
        _user(
            "Tomorrow's forecast as JSON, please.",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "forecast", "schema": FORECAST},
            },
        ),
    ),
    (
        'streamed, tool_choice "auto"',
        _user(
            "Do I need an umbrella in London?",
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        ),
    ),
]


def _request_line(body: dict[str, Any]) -> str:
    shown = dict(body)
    if "tools" in shown:
        shown["tools"] = [t["function"]["name"] for t in shown["tools"]]
    rf = shown.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        shown["response_format"] = {"type": "json_schema", "name": rf["json_schema"]["name"]}
    return json.dumps(shown, ensure_ascii=False)


def _arguments(text: str) -> str:
    """A call's arguments as a client reads them: parsed, shown compact. Where the mask
    repaired a call, the model may have written whitespace between JSON tokens (the
    grammar allows a bounded run); that is layout, not arguments. Text that does not
    parse (a call cut by max_tokens) is shown as it is."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return json.dumps(text, ensure_ascii=False)


def _print_result(message: ChatMessage, finish: str | None, usage: Usage | None) -> None:
    print(f"  reasoning      {json.dumps(message.reasoning, ensure_ascii=False)}")
    print(f"  content        {json.dumps(message.content, ensure_ascii=False)}")
    if message.tool_calls:
        for i, c in enumerate(message.tool_calls):
            head = "  tool_calls    " if i == 0 else "                "
            print(f"{head} [{i}] {c.function.name} {_arguments(c.function.arguments)}  "
                  f"(id {c.id[:22]}...)")  # fmt: skip
    else:
        print("  tool_calls     []")
    print(f"  finish_reason  {finish}")
    if usage is not None:
        details = usage.completion_tokens_details
        reasoning = details.reasoning_tokens if details is not None else 0
        print(
            f"  usage          prompt {usage.prompt_tokens}, completion "
            f"{usage.completion_tokens} (reasoning {reasoning}), total {usage.total_tokens}"
        )


async def _run_case(frontend: ChatFrontend, title: str, body: dict[str, Any], n: int) -> bool:
    print(f"\n[{n}] {title}")
    print(f"  request        {_request_line(body)}")
    resp = await frontend.create_chat_completion(body)
    if isinstance(resp, ErrorResponse):
        print(f"  error          {resp.error.message}")
        return False
    if isinstance(resp, ChatCompletion):
        choice = resp.choices[0]
        _print_result(choice.message, choice.finish_reason, resp.usage)
        return True
    chunks = [c async for c in resp]
    errors = [c for c in chunks if isinstance(c, ErrorResponse)]
    if errors:
        print(f"  error          {errors[0].error.message}")
        return False
    kinds = {"reasoning": 0, "content": 0, "tool_calls": 0}
    for c in chunks:
        for ch in c.choices:
            for k in kinds:
                kinds[k] += bool(getattr(ch.delta, k))
    print(
        f"  stream         {len(chunks)} chunks: role, {kinds['reasoning']} with reasoning, "
        f"{kinds['content']} with content, {kinds['tool_calls']} with tool_calls, "
        "finish, usage; folded:"
    )
    _print_result(*fold_chunks(chunks))  # type: ignore[arg-type]
    return True


async def _still_starting(since: float) -> None:
    """Say what the engine is doing while it starts (several seconds on a small CPU)."""
    while True:
        await asyncio.sleep(5)
        print(
            f"  ... the engine is still starting ({time.monotonic() - since:.0f} s): it imports "
            "torch and xgrammar and loads the vocabulary",
            flush=True,
        )


async def _demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="thinkgate-demo-") as tmp:
        script = args.script
        if args.model is not None:
            print(
                f"thinkgate demo: spawning the engine with the model in {args.model} (its own "
                "tokenizer and chat template);\nreasoning parser qwen3, tool-call parser "
                f"hermes; at most {args.max_tokens} tokens per answer. What the model writes is "
                "its own;\nthe grammar says what it may."
            )
            config = EngineConfig(
                model=args.model,
                reasoning_parser="qwen3",
                device=args.device,
                structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
                log_level="WARNING",
            )
        else:
            if script is None:
                script = str(Path(tmp) / "script.json")
                Path(script).write_text(json.dumps(SCRIPT), encoding="utf-8")
            print(
                "thinkgate demo: spawning the engine with the SCRIPTED model (no weights, nothing "
                "downloaded) on the bundled Qwen3 vocabulary;\nreasoning parser qwen3, tool-call "
                f"parser hermes; script: {'embedded' if args.script is None else args.script}. The "
                "script says what the model wants to write;\nthe grammar says what it may."
            )
            config = EngineConfig(
                model="scripted",
                tokenizer="qwen3",
                runner_options={"script": script},
                reasoning_parser="qwen3",
                device="cpu",
                structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
                log_level="WARNING",
            )
        ticker = asyncio.ensure_future(_still_starting(started))
        try:
            client = await EngineClient.spawn(config)
        except EngineStartError as e:
            print(f"error: the engine did not start: {e}", file=sys.stderr)
            return 1
        finally:
            ticker.cancel()
        try:
            frontend = ChatFrontend.create(
                client,
                FrontendConfig(
                    tool_call_parser="hermes",
                    enable_auto_tool_choice=True,
                    tool_parser_plugin=args.tool_parser_plugin,
                ),
            )
            print(
                f"engine ready (pid {client.handshake.engine_pid}) in "
                f"{time.monotonic() - started:.1f} s"
            )
            ok = True
            for n, (title, body) in enumerate(CASES, 1):
                if args.model is not None:
                    body = dict(body, max_tokens=args.max_tokens)
                ok = await _run_case(frontend, title, body, n) and ok
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            await client.shutdown()
    print(f"\ndone in {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    """The demo with the flags of ``thinkgate demo`` (``script``, ``model``, ``max_tokens``,
    ``device``, ``tool_parser_plugin``)."""
    return asyncio.run(_demo(args))


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli

    return cli(["demo", *(argv or [])])
