"""A probe that fails keeps the exception it caught: an implementation listed unavailable says
why, not only that its dtype list came back empty."""

from suite.plugins import cache, probes
from tests.conftest import PLUGINS


def test_a_failed_probe_is_kept_with_its_exception_fresh_and_from_the_cache(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(cache, "_MEMORY", {})

    def refuses():
        raise RuntimeError("keras.device('cpu') is not supported")

    with probes.capture() as fresh:
        assert probes.usable("test probe", "keras.device('cpu')", refuses) is False
    monkeypatch.setattr(cache, "_MEMORY", {})  # read back from the disk cache
    with probes.capture() as cached:
        assert probes.usable("test probe", "keras.device('cpu')", lambda: None) is False
    why = "keras.device('cpu') raised RuntimeError: keras.device('cpu') is not supported"
    assert fresh == cached == [why]
    with probes.capture() as none:
        assert probes.usable("another probe", "a call", lambda: None) is True
    assert none == []


def test_an_unavailable_plugin_lists_the_exception_its_dtype_probes_caught(cli):
    proc = cli("list", "--plugin", str(PLUGINS / "probe_fails.py"), "--impl", "probe.fails")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("probe.fails"))
    assert "unavailable:" in line and "got []" in line
    assert ("a float32 probe.fails call on cpu raised RuntimeError: jax.device('cpu') is not "
            "supported by this release") in line
