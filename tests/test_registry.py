"""The registry: built-ins, ad hoc plugins, entry points, selection, failures."""

from __future__ import annotations

import pytest

from suite import registry
from suite.plugin import Implementation
from tests.conftest import PLUGINS


def test_builtin_numpy_is_available():
    reg = registry.build(entry_points=False, env={})
    assert reg.entries["numpy"].available
    assert reg.entries["numpy"].impl.framework == "numpy"


def test_unknown_name_lists_known_ones():
    reg = registry.build(entry_points=False, env={})
    with pytest.raises(registry.UnknownImplementation, match="unknown implementation 'nope'; known: .*numpy"):
        reg.select(["nope"])


def test_glob_selection():
    reg = registry.build(plugins=[str(PLUGINS / "broken.py")], entry_points=False, env={})
    names = {e.name for e in reg.select(["broken.*"], available_only=False)}
    assert names == {"broken.construct", "broken.run", "broken.neighbour_works"}
    assert {e.name for e in reg.select(["broken.*"])} == {"broken.run", "broken.neighbour_works"}


def test_failing_constructor_is_listed_with_reason():
    reg = registry.build(plugins=[str(PLUGINS / "broken.py")], entry_points=False, env={})
    entry = reg.entries["broken.construct"]
    assert not entry.available
    assert entry.error == "needs a device this machine lacks"


@pytest.mark.parametrize("spec,needle", [
    ("tests/plugins/nope.py", "file tests/plugins/nope.py does not exist"),
    ("no_such_module:Cls", "module no_such_module not found"),
    ("tests/plugins/import_error.py", "importing tests/plugins/import_error.py failed"),
    ("implementations.numpy_mha:Missing", "has no attribute 'Missing'"),
])
def test_bad_plugin_specs(spec, needle):
    with pytest.raises(registry.PluginError, match=needle):
        registry.build(plugins=[spec], builtins=False, entry_points=False, env={})


def test_module_class_spec_and_env_variable(monkeypatch):
    reg = registry.build(builtins=False, entry_points=False,
                         env={registry.PLUGINS_ENV: "tests.plugins.wrong_scale:ForgetsScale"})
    assert list(reg.entries) == ["bug.no_scale"]


def test_second_registration_is_refused_without_clobber():
    reg = registry.Registry()

    class A(Implementation):
        name = "dup"

        def prepare(self, *a, **k): ...
        def run(self, s): ...
        def fetch(self, s, h): ...

    reg.register(A)
    with pytest.raises(ValueError, match="already registered"):
        reg.register(A)
    reg.register(A, clobber=True)


def test_interface_is_checked_at_load():
    class NoRun(Implementation):
        name = "norun"

        def prepare(self, *a, **k): ...
        def fetch(self, s, h): ...

    class BadFeature(NoRun):
        name = "badfeature"
        features = frozenset({"telepathy"})

        def run(self, s): ...

    reg = registry.Registry()
    assert "does not implement run" in reg.register(NoRun).error
    assert "unknown features ['telepathy']" in reg.register(BadFeature).error


def test_entry_point_group(monkeypatch):
    from importlib import metadata

    class EP:
        name, value, group = "mine", "tests.plugins.wrong_scale:ForgetsScale", registry.ENTRY_POINT_GROUP

        def load(self):
            from tests.plugins.wrong_scale import ForgetsScale
            return ForgetsScale

    def fake_entry_points(group=None):
        return [EP()] if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(metadata, "entry_points", fake_entry_points)
    reg = registry.build(builtins=False, env={})
    assert reg.entries["bug.no_scale"].source.startswith("entry point")


def test_a_compiled_variant_that_fails_its_probe_is_listed_with_the_reason(monkeypatch):
    tc = pytest.importorskip("implementations.torch_compiled")
    monkeypatch.setitem(tc._PROBED, "torch.flex", "InductorError: CppCompileError (planted)")
    monkeypatch.setattr(tc, "DROPPED", {})
    entries = registry.build(entry_points=False).entries
    assert not entries["torch.flex"].available
    assert entries["torch.flex"].error == "InductorError: CppCompileError (planted)"
    assert entries["torch.compile"].available
