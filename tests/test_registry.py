"""The registry: built-ins, ad hoc plugins, entry points, selection, failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from suite.plugins import cache, registry
from suite.plugins.interface import Implementation
from tests.conftest import PLUGINS, ROOT


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
    ("implementations.numpy.mha:Missing", "has no attribute 'Missing'"),
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


def test_a_compiled_variant_that_fails_its_probe_is_listed_with_the_reason(monkeypatch, tmp_path):
    tc = pytest.importorskip("implementations.torch.compiled")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))  # nothing described yet: load them
    monkeypatch.setitem(cache._MEMORY, tc.PROBE_PREFIX + "torch.flex",
                        "InductorError: CppCompileError (planted)")
    monkeypatch.setattr(tc, "DROPPED", {})
    monkeypatch.setattr(registry, "_FAMILIES", {})
    entries = registry.build(entry_points=False).entries
    assert not entries["torch.flex"].available
    assert entries["torch.flex"].error == "InductorError: CppCompileError (planted)"
    assert entries["torch.compile"].available


def _no_builtins_loaded_list(env) -> str:
    """What `mha-suite list` prints, run in a fresh process that then reports which
    framework modules it imported."""
    code = ("import sys; from suite import cli; cli.main(['list']); "
            "print('IMPORTED', sorted(m for m in ('torch', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def described(tmp_path_factory):
    """A cache directory that `mha-suite list` filled from empty, and what that first list
    and a second one printed: describing every built-in from empty costs about 20 s, so the
    tests of this module that need a filled cache share this one (each copies it)."""
    path = tmp_path_factory.mktemp("described") / "cache"
    env = {**os.environ, cache.CACHE_ENV: str(path)}
    env.pop(registry.PLUGINS_ENV, None)
    first = _no_builtins_loaded_list(env)  # loads every built-in and writes the cache
    second = _no_builtins_loaded_list(env)
    return path, first, second


def test_list_describes_builtins_from_the_cache_without_importing_frameworks(described):
    path, first, second = described
    assert (path / "probes" / "builtins.json").is_file()
    *listing, note, imported = second.splitlines()
    assert listing == first.splitlines()[:-1]  # the first probed: nothing read back
    assert note.startswith(f"(read from the cache in {path}") and imported == "IMPORTED []"


def test_a_described_builtin_loads_on_first_use(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    registry.build(entry_points=False, env={})  # writes the descriptions
    entry = registry.build(entry_points=False, env={}).entries["numpy.flash"]
    assert "not loaded" in repr(entry)
    assert entry.description.framework == "numpy"
    assert "not loaded" in repr(entry)  # a description does not load it
    assert entry.available and entry.impl.name == "numpy.flash"
    assert entry.description == registry.Description.of(entry.impl)


@pytest.mark.parametrize("content", ["{not json", '{"key": {"numpy": "0.0"}, "value": []}',
                                     '["a list"]', '{"key": null}'])
def test_a_corrupt_or_stale_descriptions_cache_is_ignored(monkeypatch, tmp_path, content):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    path = tmp_path / "probes" / "builtins.json"
    path.parent.mkdir()
    path.write_text(content)
    reg = registry.build(entry_points=False, env={})
    assert reg.entries["numpy"].available
    assert cache.load(registry.descriptions_cache_name()) is not None  # rewritten, fresh


def test_one_registry_per_command(monkeypatch):
    monkeypatch.delenv(registry.PLUGINS_ENV, raising=False)
    monkeypatch.setattr(registry, "_SHARED", {})
    assert registry.shared([]) is registry.shared(())
    assert registry.shared([str(PLUGINS / "broken.py")]) is not registry.shared([])


PROBED_PLUGIN = '''
from pathlib import Path

from implementations.numpy.mha import NumpyMHA

LOG = Path(__file__).with_suffix(".log")
with LOG.open("a") as f:
    f.write("import\\n")


class Probed(NumpyMHA):
    name = "mine.probed"

    def dtypes(self, device):
        with LOG.open("a") as f:  # a slow probe would run here
            f.write("probe\\n")
        return ("float32",)
'''


def test_a_plugin_files_probes_are_cached_until_the_file_changes(monkeypatch, tmp_path):
    """A plugin file is described from the cache like a built-in: not imported, not probed,
    until first used; an edit to the file probes it again."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(registry, "_PLUGIN_CLASSES", {})
    plugin = tmp_path / "probed.py"
    plugin.write_text(PROBED_PLUGIN)
    log = tmp_path / "probed.log"

    def build():
        return registry.build(plugins=[str(plugin)], builtins=False, entry_points=False,
                              env={}).entries["mine.probed"]

    first = build()
    ran = log.read_text().split()
    assert ran[0] == "import" and "probe" in ran
    second = build()
    assert log.read_text().split() == ran  # described: nothing imported, nothing probed
    assert "not loaded" in repr(second)
    assert second.description == first.description
    assert second.description.dtypes == {"cpu": ["float32"]}
    assert second.source == first.source
    assert second.impl.name == "mine.probed"  # first use: imported and constructed
    assert log.read_text().split()[len(ran)] == "import"
    plugin.write_text(PROBED_PLUGIN.replace('("float32",)', '("float32", "float64")'))
    edited = build()
    assert "not loaded" not in repr(edited)
    assert edited.description.dtypes == {"cpu": ["float32", "float64"]}


def test_a_check_of_one_name_describes_the_others_without_importing_them(tmp_path, described):
    """The results file lists every implementation; one the run did not run is described
    from the cache (a numpy check imported torch, Keras and compiled every torch.compile
    name to write that list: 6 of its 8 s), and a merge keeps a run's fuller entry."""
    import shutil

    shutil.copytree(described[0], tmp_path / "cache")  # the cache, as after any first command
    env = {**os.environ, cache.CACHE_ENV: str(tmp_path / "cache")}
    env.pop(registry.PLUGINS_ENV, None)
    out = tmp_path / "c.json"
    code = ("import sys; from suite import cli; cli.main(['check', '--impl', 'numpy', '-k', "
            f"'masking/none', '--dtype', 'float32', '--workers', '0', '--json', {str(out)!r}]); "
            "print('IMPORTED', sorted(m for m in ('torch', 'jax', 'keras') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.stdout.splitlines()[-1] == "IMPORTED []", done.stdout[-2000:] + done.stderr
    impls = {i["name"]: i for i in json.loads(out.read_text())["implementations"]}
    assert impls["numpy"].get("checked") is not False and impls["numpy"]["deviations"][
        "nan_padding"]["reason"].startswith("a NaN or inf value")
    sdpa = impls["torch.sdpa"]
    assert sdpa["checked"] is False and sdpa["available"] and "cpu" in sdpa["devices"]
    assert sdpa["deviations"]["nan_padding"]["policy"] == "confined"
    from suite.results.records import merge_conformance

    full = dict(sdpa, checked=True, deviations={"nan_padding": {"policy": "confined",
                                                                "reason": "measured"}})
    merged = tmp_path / "m.json"
    run = {"machine_info": {}, "commit_info": {}}
    merge_conformance(str(merged), run, [full], [])
    merge_conformance(str(merged), run, [sdpa], [])
    (kept,) = json.loads(merged.read_text())["implementations"]
    assert kept["deviations"]["nan_padding"]["reason"] == "measured"
