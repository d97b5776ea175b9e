"""The generic lazy registry that every plugin family uses (reasoning parsers, tool-call
formats, model runners)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from registry import Registry, UnknownNameError, load_plugin


class Base:
    def __init__(self, value: int = 0, *, name: str | None = None) -> None:
        self.value = value
        self.name = name


class Other:
    pass


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_lazy_names_are_imported_on_first_use(tmp_path, monkeypatch) -> None:
    _module(
        tmp_path,
        monkeypatch,
        "reg_lazy_mod",
        """
        from tests.test_registry import Base

        class Lazy(Base):
            pass
        """,
    )
    reg = Registry("widget", Base, {"lazy": "reg_lazy_mod:Lazy"})
    assert reg.names() == ["lazy"] and "lazy" in reg
    assert "reg_lazy_mod" not in sys.modules
    cls = reg.get("lazy")
    assert "reg_lazy_mod" in sys.modules and cls.__name__ == "Lazy"
    assert reg.get("lazy") is cls


def test_one_class_under_two_names_keeps_both() -> None:
    reg: Registry[Base] = Registry("widget", Base)

    @reg.register("b")
    @reg.register("a")
    class Shared(Base):
        pass

    assert reg.names() == ["a", "b"]
    assert reg.get("a") is reg.get("b") is Shared
    assert "name" not in Shared.__dict__  # nothing written onto the class
    a, b = reg.create("a", 3), reg.create("b")
    assert (a.name, a.value, b.name) == ("a", 3, "b")


def test_unknown_name_lists_the_known_ones() -> None:
    reg = Registry("widget", Base, {"zeta": "x:Y", "alpha": "x:Z"})
    with pytest.raises(KeyError) as err:
        reg.get("nope")
    assert isinstance(err.value, UnknownNameError)
    assert str(err.value) == "unknown widget 'nope'; known: alpha, zeta"
    with pytest.raises(UnknownNameError, match="known: none"):
        Registry("widget", Base).get("x")


def test_what_is_not_a_subclass_is_refused(tmp_path, monkeypatch) -> None:
    reg = Registry("widget", Base, {"other": "tests.test_registry:Other"})
    with pytest.raises(TypeError, match="'other'.*not a Base"):
        reg.get("other")
    with pytest.raises(TypeError):
        reg.register("o")(Other)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="module:Class"):
        reg.add_lazy("bad", "no_colon")
    with pytest.raises(ValueError):
        reg.register("")


def test_register_overrides_and_unregister_forgets() -> None:
    reg = Registry("widget", Base, {"w": "tests.test_registry:Base"})

    @reg.register("w")
    class Mine(Base):
        pass

    assert reg.get("w") is Mine
    reg.unregister("w")
    reg.unregister("never")
    assert reg.names() == []


def test_plugin_file_and_module(tmp_path, monkeypatch) -> None:
    reg: Registry[Base] = Registry("widget", Base)
    monkeypatch.setattr(sys.modules[__name__], "PLUGIN_REGISTRY", reg, raising=False)
    body = """
        from tests.test_registry import Base, PLUGIN_REGISTRY

        @PLUGIN_REGISTRY.register("{name}")
        class Plugged(Base):
            pass
        """
    plugin = tmp_path / "widget_plugin.py"
    plugin.write_text(textwrap.dedent(body.format(name="from_file")))
    load_plugin(str(plugin))
    load_plugin(str(plugin))  # a second load is a no-op
    _module(tmp_path, monkeypatch, "widget_plugin_mod", body.format(name="from_module"))
    load_plugin("widget_plugin_mod")
    assert reg.names() == ["from_file", "from_module"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("def broken(:\n", "SyntaxError"),
        ("raise RuntimeError('plugin says no')\n", "plugin says no"),
        ("import no_such_module_anywhere\n", "no_such_module_anywhere"),
    ],
)
def test_a_failing_plugin_is_an_import_error(tmp_path, body: str, words: str) -> None:
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(body)
    with pytest.raises(ImportError, match=words) as err:
        load_plugin(str(plugin))
    assert str(plugin) in str(err.value)
    plugin.write_text("VALUE = 1\n")
    load_plugin(str(plugin))  # fixed: loads now (the failed load left nothing behind)


def test_a_missing_plugin_module(tmp_path) -> None:
    with pytest.raises(ImportError, match="'no_such_plugin_module'"):
        load_plugin("no_such_plugin_module")
    with pytest.raises(ImportError):
        load_plugin(str(tmp_path / "absent.py"))
