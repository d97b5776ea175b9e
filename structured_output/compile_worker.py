"""A grammar-compiling worker process (``python -m structured_output.compile_worker``).

A spec is compiled here first, not in the engine, so that a compile past its time
limit can be stopped (the worker is killed and replaced), a huge grammar cannot
exhaust the engine's memory (the worker's address space is capped), and a crash in
the compiler costs one request, not the engine. What comes back is the proof that the
spec compiles within those bounds, not the grammar: xgrammar's serialized form is
far larger and slower than compiling again (a hermes tag of 100 API-like tools: 2.3 s
to compile, 744 MB of JSON, 70 s to write and read back), and even for the grammars
of typical requests, writing it here and reading it back in the engine costs about
what the engine's second compile does (0.5 to 1.05 times the compile's CPU, over
tool-argument schemas and hermes tags of 1 to 8 tools on the Qwen3 vocabulary), so
the engine compiles a spec that passed here itself. The pipe carries length-prefixed
msgspec frames.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import time
from typing import BinaryIO

import msgspec

_LEN = struct.Struct("<I")


class WorkerInit(msgspec.Struct, array_like=True):
    token_bytes: list[bytes]
    vocab_rows: int
    stop_token_ids: list[int]
    special_tokens: dict[str, int]
    max_whitespace: int | None
    max_spec_bytes: int
    memory_limit_bytes: int = 0
    #: the largest compiled grammar accepted, in bytes of memory (0: any)
    max_compiled_bytes: int = 0


class CompileJob(msgspec.Struct, array_like=True):
    job_id: int
    kind: str
    value: str
    ignore_unsupported: bool = False


class CompileReply(msgspec.Struct, array_like=True):
    job_id: int
    ok: bool
    error: str = ""
    #: the grammar writes JSON text only (`whitespace.json_text`)
    json_text: bool = False


def write_frame(stream: BinaryIO, data: bytes) -> None:
    stream.write(_LEN.pack(len(data)))
    stream.write(data)
    stream.flush()


def read_frame(stream: BinaryIO) -> bytes | None:
    """One frame, or None at end of stream."""
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (size,) = _LEN.unpack(head)
    data = stream.read(size)
    return data if len(data) == size else None


def _exit_with_parent(poll_s: float = 0.5) -> None:
    """End this process once its parent (the engine) is gone. A worker in the middle
    of a long compile reads nothing from its pipe, so it would not notice otherwise,
    and would compile on, orphaned, for as long as the grammar takes."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main() -> int:
    _exit_with_parent()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames may reach the pipe
    enc = msgspec.msgpack.Encoder()
    raw = read_frame(stdin)
    if raw is None:
        return 1
    init = msgspec.msgpack.decode(raw, type=WorkerInit)
    if init.memory_limit_bytes > 0:
        import resource

        limit = init.memory_limit_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    from .xgrammar_import import import_xgrammar

    xgr = import_xgrammar()

    from .specs import CompileOptions, GrammarError, GrammarSpec, compile_bounded
    from .vocab import build_tokenizer_info

    specials = init.special_tokens
    info = build_tokenizer_info(
        init.token_bytes, init.vocab_rows, init.stop_token_ids, set(specials.values())
    )
    del init.token_bytes
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    options = CompileOptions(max_whitespace=init.max_whitespace, max_spec_bytes=init.max_spec_bytes)
    write_frame(stdout, enc.encode(CompileReply(job_id=-1, ok=True)))
    dec = msgspec.msgpack.Decoder(CompileJob)
    while (raw := read_frame(stdin)) is not None:
        job = dec.decode(raw)
        try:
            json_text = compile_bounded(  # the grammar itself is dropped at once
                compiler,
                GrammarSpec.of(job.kind, job.value, job.ignore_unsupported),
                options,
                specials,
                init.max_compiled_bytes,
            ).json_text
            reply = CompileReply(job.job_id, True, json_text=json_text)
        except GrammarError as e:
            reply = CompileReply(job.job_id, False, error=str(e))
        write_frame(stdout, enc.encode(reply))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)  # the engine went away
