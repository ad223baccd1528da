"""The on-disk cache: per process, per fingerprint, and never fatal."""

from __future__ import annotations

import pytest

from suite import cache


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
