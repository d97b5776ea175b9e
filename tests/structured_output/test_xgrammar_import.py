"""xgrammar imported without transformers (`structured_output.xgrammar_import`): the
engine's imports and its start-up leave transformers out, and xgrammar's Hugging
Face helpers still work in such a process (their class checks import it then)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
from structured_output.xgrammar_import import import_xgrammar
import_xgrammar()  # as the engine's process does before its core (engine_core.server)
import engine_core.engine, engine_core.server  # all that the engine imports
from engine_core.runners import RunnerOptions, create_runner
from structured_output import GrammarSpec, LocalCompiler
from tokenization import load_tokenizer

tok = load_tokenizer("qwen3")
create_runner("random", tok, RunnerOptions(device="cpu", seed=0, max_num_seqs=4))
local = LocalCompiler(tok)  # what the engine builds: TokenizerInfo, guard, a grammar
local.matcher(local.compile(GrammarSpec.of("json_schema", '{"type": "object"}')))
import xgrammar
assert "transformers" not in sys.modules, "the engine imported transformers"
print("lean")

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

fast = PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "bc": 1, "<unk>": 2}, unk_token="<unk>"))
)
named = xgrammar.tokenizer_info.PreTrainedTokenizerFast
assert isinstance(fast, named) and not isinstance("text", named)
assert issubclass(PreTrainedTokenizerFast, named) and not issubclass(str, named)
info = xgrammar.TokenizerInfo.from_huggingface(fast, vocab_size=3, stop_token_ids=[2])
assert info.vocab_type == xgrammar.VocabType.RAW, info.vocab_type
assert info.decoded_vocab[:2] == [b"a", b"bc"], info.decoded_vocab
print("helpers work")
"""


#: any other process: the project's modules import xgrammar whole, so xgrammar's
#: Hugging Face logits processor is a real transformers logits processor there
PLAIN = r"""
import structured_output.guard, structured_output.compile_service, engine_core.engine
import transformers, xgrammar
assert issubclass(xgrammar.contrib.hf.LogitsProcessor, transformers.LogitsProcessor)
print("whole")
"""


#: the engine's own process (``run_engine(lean_xgrammar=True)``, as ``python -m
#: engine_core`` runs it): nothing heavy before its handshake is out; xgrammar, lean,
#: before the core is built
STARTUP = r"""
import sys
from engine_core import server
from engine_core.config import EngineConfig

HEAVY = ("torch", "xgrammar", "transformers")
listen = server.EngineServer._listen

def listening(self):
    listen(self)
    print("handshake:", *[m for m in HEAVY if m in sys.modules] or ["nothing"])

def core(config, tokenizer):
    print("core:", *[m for m in HEAVY if m in sys.modules])
    raise KeyboardInterrupt  # start-up ends here, as an interrupt while loading

server.EngineServer._listen = listening
server.EngineCore = core
config = EngineConfig(model="random", device="cpu", log_level="WARNING")
assert server.run_engine(config, lean_xgrammar=True) == 2
"""


def _run(script: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_the_engine_imports_no_transformers_and_xgrammars_helpers_still_work():
    assert _run(SCRIPT) == ["lean", "helpers", "work"]


def test_elsewhere_xgrammar_is_imported_whole():
    assert _run(PLAIN) == ["whole"]


def test_the_engine_process_imports_nothing_heavy_before_its_handshake():
    out = " ".join(_run(STARTUP))
    assert out == "handshake: nothing core: torch xgrammar", out
