"""`Registry`: names to classes, each given as ``"module:Class"`` and imported on first
use, or registered by a decorator; plugins add more from a module or a ``.py`` file.

A name is bound to its class in the registry only: registering never writes onto the
class, so one class may serve under several names. Code that needs the name a thing
was created under passes it to the instance (``create(name, ...)`` does).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A name no entry of the registry has; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Names of one plugin family (``kind``, as messages name it) to subclasses of
    ``base``.

    ``lazy`` maps built-in names to ``"module:Class"``; the module is imported the first
    time the name is looked up. `register` adds or replaces a name (a plugin may
    override a built-in). Lookups of unknown names raise `UnknownNameError`.
    """

    def __init__(self, kind: str, base: type[T], lazy: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self.base = base
        self._lazy: dict[str, str] = {}
        self._loaded: dict[str, type[T]] = {}
        for name, target in (lazy or {}).items():
            self.add_lazy(name, target)

    def add_lazy(self, name: str, target: str) -> None:
        """Make ``name`` stand for ``target`` (``"module:Class"``), imported on first use."""
        module, sep, attr = target.partition(":")
        if not (name and module and sep and attr):
            raise ValueError(
                f"{self.kind} {name!r}: the target must read 'module:Class', not {target!r}"
            )
        self._lazy[name] = target
        self._loaded.pop(name, None)

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: make the class available as ``name``. The class is returned
        unchanged (the name is not written onto it)."""
        if not name:
            raise ValueError(f"a {self.kind} needs a non-empty name")

        def deco(cls: type[T]) -> type[T]:
            self._check(name, cls)
            self._loaded[name] = cls
            self._lazy.pop(name, None)
            return cls

        return deco

    def unregister(self, name: str) -> None:
        """Forget ``name`` (a plugin's, or a built-in); unknown names are ignored."""
        self._loaded.pop(name, None)
        self._lazy.pop(name, None)

    def names(self) -> list[str]:
        """Every registered name, sorted (lazy ones included; nothing is imported)."""
        return sorted(self._lazy.keys() | self._loaded.keys())

    def __contains__(self, name: object) -> bool:
        return name in self._lazy or name in self._loaded

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``, imported if need be."""
        cls = self._loaded.get(name)
        if cls is not None:
            return cls
        target = self._lazy.get(name)
        if target is None:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names()) or 'none'}"
            )
        module_name, _, attr = target.partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
        self._check(name, cls)
        self._loaded[name] = cls
        return cls

    def create(self, name: str, *args: Any, **kwargs: Any) -> T:
        """An instance of the class registered as ``name``, built with ``name=name`` and
        the other arguments given."""
        return self.get(name)(*args, name=name, **kwargs)

    def _check(self, name: str, cls: object) -> None:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{self.kind} {name!r}: {cls!r} is not a {self.base.__name__}")


def load_plugin(path: str) -> None:
    """Import a plugin: a ``.py`` file, or a dotted module name. Its registering
    decorators run on import. Loading the same file or module again does nothing.

    Any failure (not found, a syntax error, an error the plugin raises) is an
    `ImportError` naming the plugin."""
    p = Path(path)
    if p.suffix == ".py" and p.is_file():
        resolved = str(p.resolve())
        digest = hashlib.sha256(resolved.encode()).hexdigest()[:16]
        mod_name = f"_thinkgate_plugin_{digest}"
        if mod_name in sys.modules:
            return
        spec = importlib.util.spec_from_file_location(mod_name, resolved)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import plugin {path!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[mod_name]
            raise ImportError(f"cannot import plugin {path!r}: {type(e).__name__}: {e}") from e
        return
    try:
        importlib.import_module(path)
    except Exception as e:
        raise ImportError(f"cannot import plugin {path!r}: {type(e).__name__}: {e}") from e
