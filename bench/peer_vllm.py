"""vLLM's side of ``thinkgate bench fill --peer-python PATH``.

Runs in the python of a separate venv that holds vLLM (see bench/README.md: never
in the project's environment); it imports nothing of the project's. It builds a real
``vllm.v1.structured_output.StructuredOutputManager`` on the CPU with the xgrammar
backend, one real ``vllm.v1.request.Request`` per row with the row's JSON schema,
advances each along the token ids it is given with ``accept_tokens`` (as vLLM's
scheduler does after sampling), and times ``grammar_bitmask`` over the first B rows.

It reads one JSON command per line on stdin and answers each with one JSON line on
its stdout (vLLM's own output goes to stderr):

- ``{"cmd": "setup", "tokenizer": DIR, "max_num_seqs": N, "schemas": [...],
  "rows": [[schema_index, [token ids]], ...]}``
- ``{"cmd": "time", "batch": B, "steps": S, "start": I}``: S timed calls over rows
  ``I`` (default 0) to ``I + B``, in microseconds
- ``{"cmd": "masks", "batch": B}``: the B rows of the bitmask, int32, base64
- ``{"cmd": "quit"}``
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import warnings


def main() -> int:
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    warnings.filterwarnings("ignore")
    state: dict = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        reply = COMMANDS[cmd["cmd"]](state, cmd)
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


def setup(state: dict, cmd: dict) -> dict:
    import torch
    from vllm.config import (
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        StructuredOutputsConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    tok, n = cmd["tokenizer"], cmd["max_num_seqs"]
    mc = ModelConfig(model=tok, tokenizer=tok, dtype="float32", max_model_len=4096)
    vc = VllmConfig(
        model_config=mc,
        device_config=DeviceConfig(device="cpu"),
        scheduler_config=SchedulerConfig(
            max_num_seqs=n,
            max_num_batched_tokens=8192,
            max_model_len=4096,
            is_encoder_decoder=False,
        ),
        structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"),
    )
    mgr = StructuredOutputManager(vc)
    requests = {}
    for i, (k, _) in enumerate(cmd["rows"]):
        params = StructuredOutputsParams(json=cmd["schemas"][k])
        sp = SamplingParams(max_tokens=1024, structured_outputs=params)
        sp.structured_outputs._backend = "xgrammar"  # set by vLLM's input processor
        r = Request(
            request_id=f"row-{i}",
            prompt_token_ids=[151644, 872, 198],
            sampling_params=sp,
            pooling_params=None,
        )
        mgr.grammar_init(r)
        requests[r.request_id] = r
    for r in requests.values():
        while not r.structured_output_request.is_grammar_ready:
            time.sleep(0.001)
        grammar = r.structured_output_request.grammar
        if isinstance(grammar, Exception):
            raise grammar
    for i, (_, ids) in enumerate(cmd["rows"]):
        if ids and not mgr.accept_tokens(requests[f"row-{i}"], ids):
            raise AssertionError(f"vLLM's grammar rejected the prefix of row {i}")
    state.update(mgr=mgr, requests=requests, ids=list(requests))
    from importlib.metadata import version

    return {
        "vllm": version("vllm"),
        "xgrammar": version("xgrammar"),
        "torch": torch.__version__,
        "vocab_rows": mc.get_vocab_size(),
        "parallel_threshold": mgr.fill_bitmask_parallel_threshold,
        "fill_workers": max(1, min((os.cpu_count() or 2) // 2, 8)),
    }


def time_fill(state: dict, cmd: dict) -> dict:
    start = cmd.get("start", 0)
    mgr, requests = state["mgr"], state["requests"]
    ids = state["ids"][start : start + cmd["batch"]]
    times = []
    for _ in range(cmd["steps"]):
        t0 = time.perf_counter()
        mgr.grammar_bitmask(requests, ids, {})
        times.append((time.perf_counter() - t0) * 1e6)
    return {"times_us": times}


def masks(state: dict, cmd: dict) -> dict:
    mgr, requests, ids = state["mgr"], state["requests"], state["ids"][: cmd["batch"]]
    bm = mgr.grammar_bitmask(requests, ids, {})
    return {"shape": list(bm.shape), "data": base64.b64encode(bm.tobytes()).decode()}


COMMANDS = {"setup": setup, "time": time_fill, "masks": masks}

if __name__ == "__main__":
    sys.exit(main())
