"""The on-disk cache: per process, per fingerprint, and never fatal."""

from __future__ import annotations

import pytest

from suite.plugins import cache


@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(cache, "_MEMORY", {})
    return tmp_path


def test_memo_computes_once_per_process_and_reads_back_from_disk(cache_dir, monkeypatch):
    calls = []

    def compute():
        calls.append(1)
        return {"dtypes": ("float32",)}

    assert cache.memo("probe", compute) == {"dtypes": ["float32"]}
    assert cache.memo("probe", compute) == {"dtypes": ["float32"]}
    assert len(calls) == 1
    monkeypatch.setattr(cache, "_MEMORY", {})  # a new process: read from disk
    assert cache.memo("probe", compute) == {"dtypes": ["float32"]}
    assert len(calls) == 1


def test_none_is_a_value_not_a_miss(cache_dir, monkeypatch):
    calls = []
    cache.memo("ok", lambda: calls.append(1))  # returns None: "no reason to drop it"
    monkeypatch.setattr(cache, "_MEMORY", {})
    assert cache.memo("ok", lambda: calls.append(1) or "recomputed") is None
    assert len(calls) == 1


def test_another_library_version_is_a_miss(cache_dir, monkeypatch):
    cache.store("probe", "old")
    assert cache.load("probe") == "old"
    other = {**cache.fingerprint(), "torch": "9.9"}
    monkeypatch.setattr(cache, "fingerprint", lambda: other)
    assert cache.load("probe", "missing") == "missing"


def test_corrupt_and_unwritable_caches_are_not_fatal(cache_dir, monkeypatch):
    path = cache_dir / "probes" / "probe.json"
    path.parent.mkdir()
    path.write_text("{truncated")
    assert cache.load("probe", "missing") == "missing"
    blocker = cache_dir / "file"
    blocker.write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(blocker))  # a file where a folder should be
    cache.store("probe", 1)
    assert cache.memo("probe", lambda: 2) == 2


def test_compile_caches_go_to_the_cache_dir_unless_the_user_set_them(cache_dir, monkeypatch):
    for var in (*cache.COMPILE_CACHE_ENV, *cache.JAX_CACHE_THRESHOLDS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    monkeypatch.delitem(__import__("sys").modules, "jax", raising=False)
    settings = cache.enable_compile_caches()
    assert settings["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"
    assert settings["JAX_COMPILATION_CACHE_DIR"] == str(cache_dir / "jax")
    assert (cache_dir / "jax").is_dir()
    assert settings["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"


def _records(**changes) -> list:
    """A complete, usable list of built-in records (as the descriptions cache holds)."""
    from suite.plugins import registry

    desc = {"framework": "numpy", "framework_version": "2", "devices": ["cpu"],
            "dtypes": {"cpu": ["float32"]}, "features": [], "deviations": {}}
    out = [{"name": n, "spec": s, "error": None, "description": dict(desc)}
           for n, s in registry.BUILTINS.items()]
    for name, record in changes.items():
        next(r for r in out if r["name"] == name).update(record)
    return out


@pytest.mark.parametrize("cached, usable", [
    (_records(), True),
    ([], False),  # an empty value would make every built-in unknown
    (_records()[1:], False),  # a partial one would hide a built-in
    ("junk", False),
    (_records(**{"torch.sdpa": {"description": None, "error": "torch is not installed (x)"}}),
     False),  # torch is installed here: the run that wrote it had it hidden
    (_records(**{"numpy": {"description": None, "error": "tensorflow is not installed (x)"}}),
     True),  # a library that really is missing is a fact of the installed versions
    (_records(**{"jax.jit": {"description": {**_records()[0]["description"],
                                             "dtypes": {"cpu": []}}}}), False),
    (_records(**{"jax.jit": {"description": None, "error": "RuntimeError: Unable to "
                                                             "initialize backend 'bogus'"}}),
     False),
])
def test_a_cached_description_that_does_not_hold_here_is_recomputed(cached, usable):
    from suite.plugins import registry

    assert registry.cached_records_usable(cached) is usable


def test_a_run_with_a_library_hidden_stores_nothing(cache_dir):
    """One `mha-suite list` with torch hidden must not write 'not installed' into the cache
    (it stayed until the library versions changed)."""
    import os
    import subprocess
    import sys

    # jax hidden too: describing its built-ins is not the point here and cost 28 of the 30 s
    code = ("import sys; sys.modules['torch'] = None; sys.modules['jax'] = None\n"
            "from suite.plugins import registry\n"
            "e = registry.build(entry_points=False).entries['torch.sdpa']\n"
            "print(e.available, e.error)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env={**os.environ, cache.CACHE_ENV: str(cache_dir)})
    assert proc.stdout.startswith("False torch is not installed"), proc.stdout + proc.stderr
    assert not list(cache_dir.rglob("builtins*.json"))


def test_the_platforms_jax_starts_are_part_of_the_key(monkeypatch):
    cache.fingerprint.cache_clear()
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    default = cache.fingerprint()
    cache.fingerprint.cache_clear()
    monkeypatch.setenv("JAX_PLATFORMS", "bogus")
    try:
        assert cache.fingerprint() != default  # a bogus run's probes are not read by others
    finally:
        cache.fingerprint.cache_clear()


def test_a_dependency_installed_later_makes_a_cached_unavailable_answer_stale(
        cache_dir, monkeypatch, tmp_path):
    """#42 item 14: a probe that failed on a library's own missing dependency (optax for
    flax.linen) stayed unavailable after the dependency was installed: the key held the
    framework versions only. Every installed distribution is part of the key now."""
    monkeypatch.setattr(cache, "READ", set())
    cache.fingerprint.cache_clear()
    assert cache.memo("flax probe", lambda: "ModuleNotFoundError: no module optax") \
        == "ModuleNotFoundError: no module optax"
    site = tmp_path / "site"
    (site / "optax-0.2.4.dist-info").mkdir(parents=True)  # pip install optax
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(cache, "_MEMORY", {})  # the next process
    cache.fingerprint.cache_clear()
    try:
        assert cache.memo("flax probe", lambda: None) is None  # probed again: usable
        assert "flax probe" not in cache.READ
    finally:
        cache.fingerprint.cache_clear()


def test_where_a_run_starts_does_not_change_the_key(tmp_path, monkeypatch):
    """The suite's own editable metadata in the working directory (``python -m suite.cli``
    in the clone) keys what the ``mha-suite`` script keys; another distribution there does
    not."""
    before = cache._distributions_digest()
    (tmp_path / "mha_suite.egg-info").mkdir()
    (tmp_path / "mha_suite-0.9.dist-info").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cache._distributions_digest() == before
    (tmp_path / "optax-0.2.4.dist-info").mkdir()
    assert cache._distributions_digest() != before


def test_refresh_computes_again_and_rewrites(cache_dir, monkeypatch):
    monkeypatch.setattr(cache, "READ", set())
    monkeypatch.setattr(cache, "_REFRESH", False)
    cache.memo("probe", lambda: "old")
    monkeypatch.setattr(cache, "_MEMORY", {})
    assert cache.memo("probe", lambda: "new") == "old" and cache.READ == {"probe"}
    cache.refresh()
    assert cache.memo("probe", lambda: "new") == "new" and cache.READ == set()
    monkeypatch.setattr(cache, "_REFRESH", False)
    monkeypatch.setattr(cache, "_MEMORY", {})
    assert cache.memo("probe", lambda: "newer") == "new"  # what the refresh wrote


def test_the_sources_digest_reads_every_wing_and_framework_folder(tmp_path):
    """A change in any module under suite/ or implementations/, at any depth, is a new key
    (the cache's descriptions would otherwise outlive the code that made them)."""
    from suite.plugins.cache import _sources_digest

    wing = tmp_path / "suite" / "spec"
    wing.mkdir(parents=True)
    (tmp_path / "implementations" / "torch").mkdir(parents=True)
    (wing / "problem.py").write_text("A = 1\n")
    (tmp_path / "implementations" / "torch" / "eager.py").write_text("B = 1\n")
    first = _sources_digest(tmp_path)
    (wing / "problem.py").write_text("A = 2\n")
    second = _sources_digest(tmp_path)
    (tmp_path / "implementations" / "torch" / "eager.py").write_text("B = 2\n")
    assert len({first, second, _sources_digest(tmp_path)}) == 3
