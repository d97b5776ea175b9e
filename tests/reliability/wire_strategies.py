"""Hypothesis strategies of frames for the wire fuzz (test_wire_fuzz.py): well-typed
requests with adversarial values, requests a front end could send, mangled encodings,
random bytes, and every other message type."""

from __future__ import annotations

import msgspec
from hypothesis import strategies as st

from ipc import (
    PROTOCOL_VERSION,
    AbortRequests,
    EngineCoreRequest,
    Goodbye,
    HealthRequest,
    Heartbeat,
    Hello,
    MsgType,
    SamplingParams,
    Shutdown,
    StructuredOutputSpec,
)

from .support import PROMPT

VOCAB = 151_936


EDGE_INTS = [
    0,
    1,
    -1,
    2,
    VOCAB - 1,
    VOCAB,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    -(2**31),
    -(2**63),
]
INT = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from(EDGE_INTS))
SCALAR = st.one_of(
    st.none(), st.booleans(), INT, st.floats(), st.text(max_size=12), st.binary(max_size=12)
)
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), INT), inner, max_size=4),
    ),
    max_leaves=12,
)
SPECS = [
    ("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}'),
    ("json_schema", '{"type": "string", "pattern": "^[a-z]+$"}'),
    ("json_schema", "[1, 2]"),
    ("json_schema", "not json"),
    ("json_object", ""),
    ("regex", "[0-9]{2,4}"),
    ("regex", "(unclosed"),
    ("choice", '["yes", "no"]'),
    ("choice", "[]"),
    ("grammar", 'root ::= "a" root | "b"'),
    ("grammar", "root ::= missing"),
    (
        "structural_tag",
        '{"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}',
    ),
    ("structural_tag", '{"type": "nonsense"}'),
    ("yaml", "a: 1"),
    ("", ""),
]


@st.composite
def requests(draw) -> EngineCoreRequest:
    """Well-typed requests with adversarial values."""
    kind, value = draw(
        st.one_of(
            st.sampled_from(SPECS),
            st.tuples(
                st.sampled_from(
                    ["json_schema", "regex", "grammar", "choice", "structural_tag", "x"]
                ),
                st.text(max_size=24),
            ),
        )
    )
    sp = SamplingParams(
        temperature=draw(st.one_of(st.floats(), st.sampled_from([0.0, 1.0]))),
        top_p=draw(st.one_of(st.floats(), st.just(1.0))),
        top_k=draw(st.one_of(INT, st.just(0))),
        seed=draw(st.one_of(st.none(), INT)),
        max_tokens=draw(st.one_of(st.integers(-2, 48), INT)),
        min_tokens=draw(st.one_of(st.integers(-2, 8), INT)),
        stop_token_ids=draw(st.lists(st.one_of(INT, st.integers(0, VOCAB - 1)), max_size=3)),
        ignore_eos=draw(st.booleans()),
    )
    kwargs = draw(
        st.one_of(
            st.none(),
            st.dictionaries(
                st.one_of(st.text(max_size=16), st.just("enable_thinking")), VALUE, max_size=3
            ),
        )
    )
    return EngineCoreRequest(
        request_id=draw(st.text(max_size=10)),
        prompt_token_ids=draw(
            st.one_of(
                st.just(PROMPT), st.lists(st.one_of(st.integers(0, VOCAB - 1), INT), max_size=8)
            )
        ),
        sampling_params=sp,
        structured_output=draw(st.one_of(st.none(), st.just(StructuredOutputSpec(kind, value)))),
        reasoning_ended=draw(st.one_of(st.none(), st.booleans())),
        reasoning_parser_kwargs=kwargs,
        reasoning_budget=draw(st.one_of(st.none(), INT, st.integers(0, 8))),
        arrival_time=draw(st.floats()),
    )


@st.composite
def plausible_requests(draw) -> EngineCoreRequest:
    """Requests a front end could send, one odd value at most: most of these run."""
    kind, value = draw(st.sampled_from(SPECS))
    sp = SamplingParams(
        temperature=draw(st.sampled_from([0.0, 0.7, 1.0, 2.0, 1e9])),
        top_p=draw(st.sampled_from([1.0, 0.9, 1e-9])),
        top_k=draw(st.sampled_from([0, 1, 50, VOCAB, 2**63 - 1])),
        seed=draw(st.one_of(st.none(), st.integers(0, 2**64 - 1))),
        max_tokens=draw(st.integers(1, 32)),
        min_tokens=draw(st.integers(0, 2)),
        stop_token_ids=draw(st.lists(st.integers(0, VOCAB - 1), max_size=2)),
        ignore_eos=draw(st.booleans()),
    )
    return EngineCoreRequest(
        request_id=draw(st.sampled_from(["a", "b", "c", ""])),
        prompt_token_ids=draw(st.sampled_from([PROMPT, [0], [VOCAB - 1] * 3])),
        sampling_params=sp,
        structured_output=draw(st.one_of(st.none(), st.just(StructuredOutputSpec(kind, value)))),
        reasoning_ended=draw(st.one_of(st.none(), st.booleans())),
        reasoning_parser_kwargs=draw(
            st.sampled_from(
                [None, {}, {"enable_thinking": False}, {"enable_thinking": [1]}, {"x": {2: 3}}]
            )
        ),
        reasoning_budget=draw(st.sampled_from([None, 0, 4])),
    )


def encode_frames(msg) -> list[bytes]:
    from ipc.messages import TYPE_OF

    return [bytes([TYPE_OF[type(msg)]]), msgspec.msgpack.encode(msg)]


@st.composite
def mangled(draw) -> list[bytes]:
    """A request or another message whose encoding is then broken: a field replaced
    by a value of any type, unknown fields appended, fields cut off, bytes cut off,
    or sent under another message type."""
    msg = draw(
        st.one_of(
            requests(),
            st.builds(AbortRequests, st.lists(st.text(max_size=6))),
            st.builds(HealthRequest, INT),
            st.builds(Hello, INT, st.text(max_size=8)),
        )
    )
    head, payload = encode_frames(msg)
    fields = msgspec.msgpack.decode(payload)
    op = draw(st.sampled_from(["replace", "append", "cut_fields", "cut_bytes", "retype", "map"]))
    if op == "replace" and fields:
        i = draw(st.integers(0, len(fields) - 1))
        fields[i] = draw(VALUE)
        payload = msgspec.msgpack.encode(fields)
    elif op == "append":
        payload = msgspec.msgpack.encode(fields + draw(st.lists(VALUE, min_size=1, max_size=3)))
    elif op == "cut_fields":
        payload = msgspec.msgpack.encode(fields[: draw(st.integers(0, len(fields)))])
    elif op == "cut_bytes":
        payload = payload[: draw(st.integers(0, max(0, len(payload) - 1)))]
    elif op == "retype":
        head = bytes([draw(st.sampled_from(list(MsgType)))])
    else:
        payload = msgspec.msgpack.encode({str(i): f for i, f in enumerate(fields)})
    return [head, payload]


FRAMES = st.one_of(
    st.lists(st.binary(max_size=40), min_size=1, max_size=4),  # random bytes, any frame count
    st.tuples(st.integers(0, 255), VALUE).map(  # any type byte, any msgpack value
        lambda t: [bytes([t[0]]), msgspec.msgpack.encode(t[1])]
    ),
    mangled(),
    requests().map(encode_frames),
    plausible_requests().map(encode_frames),
    st.builds(Hello, st.one_of(INT, st.just(PROTOCOL_VERSION)), st.text(max_size=8)).map(
        encode_frames
    ),
    st.one_of(
        st.builds(HealthRequest, INT),
        st.builds(Heartbeat, st.floats()),
        st.builds(AbortRequests, st.lists(st.text(max_size=4), max_size=3)),
        st.builds(Goodbye, st.text(max_size=8)),
        st.builds(Shutdown, st.text(max_size=8), st.text(max_size=12)),
    ).map(encode_frames),
)
