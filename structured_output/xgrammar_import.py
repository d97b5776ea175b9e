"""xgrammar, imported without transformers.

xgrammar imports transformers at module level for its Hugging Face helpers
(``TokenizerInfo.from_huggingface`` checks a tokenizer's class), and transformers, with
huggingface_hub and its HTTP stack, is about half of xgrammar's import: some 1.2 s of
CPU in every process that imports it, the engine's included, which builds its
vocabulary from token bytes and never calls those helpers. So xgrammar is imported
with a stand-in for transformers in ``sys.modules`` (removed again right after) whose
classes are checked against the real ones, imported then, the first time an
``isinstance`` asks: the helpers still work in a process that calls them.

Where transformers is imported already, or xgrammar is, nothing changes. Should
xgrammar's import need more of transformers than names, it is imported again, whole.
The stand-in is in ``sys.modules`` only while xgrammar imports: a thread importing
transformers at that very moment would get it (the engine's other threads do not).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _Deferred(type):
    """A class that xgrammar named from transformers: the real class, found when an
    ``isinstance`` or ``issubclass`` first asks (transformers is imported then)."""

    def _real(cls) -> type:
        transformers = importlib.import_module("transformers")
        return getattr(transformers, cls.__name__)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._real())

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._real())


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Deferred(name, (), {})


def import_xgrammar() -> types.ModuleType:
    """The xgrammar module, imported without transformers if neither is imported yet."""
    if "xgrammar" in sys.modules or "transformers" in sys.modules:
        return importlib.import_module("xgrammar")
    sys.modules["transformers"] = _StandIn("transformers")
    try:
        return importlib.import_module("xgrammar")
    except Exception:  # xgrammar needed more than names: import both for real
        for name in [m for m in sys.modules if m.split(".")[0] in ("xgrammar", "transformers")]:
            del sys.modules[name]
        return importlib.import_module("xgrammar")
    finally:
        if isinstance(sys.modules.get("transformers"), _StandIn):
            del sys.modules["transformers"]
