"""Whole-output reference splits, written independently of `reasoning/`.

Each oracle reads a complete output (token ids) and the phase it starts in, and says
what the split must be: reasoning and content bytes, the absolute index of the
answer's first token (None when the output never decides), the answer bytes carried by
that token's predecessor (`AnswerStart.prefix`), and the number of reasoning tokens.
They work on the whole text with plain searches and regular expressions, not on a
stream, so they share no logic with the parsers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reasoning import Phase
from tokenization import Tokenizer

Wrapper = Callable[[bytes], bytes]


@dataclass(frozen=True)
class Expected:
    reasoning: bytes
    content: bytes
    answer_at: int | None
    prefix: bytes
    num_reasoning_tokens: int


def _same(data: bytes) -> bytes:
    return data


def after_layout(pieces: Sequence[bytes], separator: bytes, wrapper: Wrapper | None) -> bytes:
    """Content after an explicit end marker: leading pieces each a non-empty prefix of
    what is left of ``separator`` are layout, dropped; with a wrapper, a separator
    written whole is handed to it as the answer's opening."""
    k, left = 0, separator
    while k < len(pieces) and left and pieces[k] and left.startswith(pieces[k]):
        left = left[len(pieces[k]) :]
        k += 1
    rest = b"".join(pieces[k:])
    if wrapper is None:
        return rest
    return wrapper(separator + rest) if separator and not left else wrapper(rest)


def wrapper_stripper(open_tag: bytes, close_tag: bytes, strip_leading: bool) -> Wrapper:
    """Content rule of an answer wrapper: leading newlines (optionally), the open tag and
    the newlines after it; the first close tag with the newlines around it."""

    def strip(answer: bytes) -> bytes:
        if strip_leading:
            answer = re.sub(rb"\A\n+", b"", answer)
        m = re.match(re.escape(open_tag) + rb"\n*(.*)\Z", answer, re.S)
        if m is None:
            return answer
        body = m.group(1)
        c = re.search(rb"\n*" + re.escape(close_tag) + rb"\n*", body)
        return body if c is None else body[: c.start()] + body[c.end() :]

    return strip


def think_tags(
    tok: Tokenizer,
    ids: Sequence[int],
    phase: Phase,
    *,
    start: str,
    end: str,
    implicit: Sequence[str] = (),
    lead: bytes = b"",
    wrapper: Wrapper | None = None,
    separator: bytes = b"",
) -> Expected:
    """Single-token markers, read on ids."""
    wrap = wrapper or _same
    tb, sp = tok.token_bytes, tok.special_ids
    s_id, e_id = tok.special_tokens[start], tok.special_tokens[end]
    imp = {tok.special_tokens[m] for m in implicit}
    raw = b"".join(tb(t) for t in ids)
    if phase == Phase.ANSWER:
        return Expected(b"", wrap(raw), None, b"", 0)
    i = 0
    if phase == Phase.UNDECIDED:
        acc = b""
        while lead and i < len(ids) and ids[i] not in sp and lead.startswith(acc + tb(ids[i])):
            acc += tb(ids[i])
            i += 1
        if i == len(ids):
            return Expected(b"", wrap(acc), None, b"", 0)
        if ids[i] != s_id:
            return Expected(b"", wrap(raw), 0, b"", 0)
        i += 1
    body: list[int] = []
    explicit = False
    for k in range(i, len(ids)):
        if ids[k] == e_id:
            answer_at, explicit = k + 1, True
            break
        if ids[k] in imp:
            answer_at = k
            break
        if ids[k] != s_id:
            body.append(ids[k])
    else:
        answer_at = None
    reasoning = b"".join(tb(t) for t in body)
    if answer_at is None:
        return Expected(reasoning, b"", None, b"", len(body))
    pieces = [tb(t) for t in ids[answer_at:]]
    if explicit:
        content = after_layout(pieces, separator, wrapper)
    else:
        content = wrap(b"".join(pieces))
    return Expected(reasoning, content, answer_at, b"", len(body))


def _first_completion(data: bytes, spellings: Sequence[bytes]) -> tuple[int, int] | None:
    """(start, end) of the spelling whose occurrence ends first; the longer on a tie.
    Brute force over end positions."""
    for end in range(1, len(data) + 1):
        done = [s for s in spellings if data[:end].endswith(s)]
        if done:
            longest = max(done, key=len)
            return end - len(longest), end
    return None


def text_markers(
    tok: Tokenizer,
    ids: Sequence[int],
    phase: Phase,
    *,
    starts: Sequence[str],
    ends: Sequence[str],
    implicit: Sequence[str] = (),
    wrapper: Wrapper | None = None,
    separator: bytes = b"",
) -> Expected:
    """Text markers, read on the decoded bytes; token positions from byte offsets."""
    wrap = wrapper or _same
    chunks = [tok.token_bytes(t) for t in ids]
    assert all(chunks), "the generators emit no empty tokens"
    offs = [0]
    for c in chunks:
        offs.append(offs[-1] + len(c))
    data = b"".join(chunks)
    start_b = [s.encode() for s in starts]
    end_b = [e.encode() for e in ends]
    imp_ids = {tok.special_tokens[m] for m in implicit}
    first_imp = next((k for k, t in enumerate(ids) if t in imp_ids), None)
    limit = offs[first_imp] if first_imp is not None else len(data)

    if phase == Phase.ANSWER:
        return Expected(b"", wrap(data), None, b"", 0)
    opened = [s for s in start_b if data[:limit].startswith(s)]
    pos = len(min(opened, key=len)) if opened else 0
    if phase == Phase.UNDECIDED and not opened:
        undecided = first_imp is None and any(
            s.startswith(data) and len(s) > len(data) for s in start_b
        )
        return Expected(b"", wrap(data), None if undecided else 0, b"", 0)

    found = _first_completion(data[pos:limit], end_b)
    if found is not None:
        r_end, e = pos + found[0], pos + found[1]
        last = next(t for t in range(len(ids)) if offs[t] < e <= offs[t + 1])
        answer_at, prefix = last + 1, data[e : offs[last + 1]]
        pieces = [prefix] if prefix else []
        pieces += chunks[answer_at:]
        content = after_layout(pieces, separator, wrapper)
        if prefix and separator.startswith(prefix):
            prefix = b""  # layout, not the answer's
    elif first_imp is not None:
        r_end, answer_at, prefix, content = limit, first_imp, b"", wrap(data[limit:])
    else:
        r_end, answer_at, prefix, content = len(data), None, b"", b""
    count = sum(1 for t in range(len(ids)) if offs[t] < r_end and offs[t + 1] > pos)
    return Expected(data[pos:r_end], content, answer_at, prefix, count if r_end > pos else 0)


def harmony(tok: Tokenizer, ids: Sequence[int], phase: Phase) -> Expected:
    """Harmony messages, read on a rendering where each special token is a unique
    sentinel (so a name spelled in ordinary tokens never passes for one)."""
    sp = tok.special_ids

    def unit(t: int) -> bytes:
        return b"\x00%d\x00" % t if t in sp else tok.token_bytes(t)

    def s(name: str) -> bytes:
        return unit(tok.special_tokens[name])

    units = [unit(t) for t in ids]
    offs = [0]
    for u in units:
        offs.append(offs[-1] + len(u))
    joined = b"".join(units)
    raw = b"".join(tok.token_bytes(t) for t in ids)
    short = s("<|channel|>") + b"analysis" + s("<|message|>")
    full = s("<|start|>") + b"assistant" + short
    end_id = tok.special_tokens["<|end|>"]

    if phase == Phase.ANSWER:
        return Expected(b"", raw, None, b"", 0)
    bodies: list[bytes] = []
    count = 0
    k = 0
    header: bytes | None = short if phase == Phase.UNDECIDED else None
    while True:
        if header is not None:
            rest = joined[offs[k] :]
            if not rest.startswith(header):
                content = b"".join(tok.token_bytes(t) for t in ids[k:])
                if header.startswith(rest):  # the output ended inside a header
                    return Expected(b"\n".join(bodies), content, None, b"", count)
                return Expected(b"\n".join(bodies), content, k, b"", count)
            k = offs.index(offs[k] + len(header))
        stop = next((j for j in range(k, len(ids)) if ids[j] == end_id), len(ids))
        bodies.append(b"".join(tok.token_bytes(t) for t in ids[k:stop]))
        count += stop - k
        if stop == len(ids):
            return Expected(b"\n".join(bodies), b"", None, b"", count)
        k, header = stop + 1, full
