"""A built-in whose library is installed at a release outside the range mha-suite's extras
declare is unavailable with one line naming both (issue: with transformers 4.24 every hf.*
name was listed available and then errored in the cases, the errors read as the model's)."""

from __future__ import annotations

from importlib import metadata

import pytest

from suite.plugins import registry


@pytest.fixture
def installed(monkeypatch):
    """Pretend ``dist`` is installed at ``version`` (metadata only)."""
    real = metadata.version
    pretend = {}

    def version(name):
        return pretend.get(name) or real(name)

    monkeypatch.setattr(metadata, "version", version)
    registry.outside_declared_range.cache_clear()
    yield pretend
    registry.outside_declared_range.cache_clear()


def _declared(dist: str) -> bool:
    try:
        return any(r.startswith(dist) for r in metadata.requires("mha-suite") or [])
    except metadata.PackageNotFoundError:
        return False


def test_a_release_below_the_range_is_named_with_the_range(installed):
    if not _declared("transformers"):
        pytest.skip("mha-suite's metadata is not installed")
    installed["transformers"] = "4.24.0"
    why = registry.outside_declared_range("hf")
    assert why is not None and "transformers 4.24.0 is installed" in why and ">=5.0" in why
    assert "pip install 'mha-suite[hf]'" in why


def test_a_release_inside_the_range_passes(installed):
    if not _declared("transformers"):
        pytest.skip("mha-suite's metadata is not installed")
    installed["transformers"] = "5.3.0"
    assert registry.outside_declared_range("hf") is None
    assert registry.outside_declared_range("numpy") is None  # no range declared


def test_a_builtin_outside_its_range_is_unavailable_with_that_line(installed):
    if not _declared("transformers"):
        pytest.skip("mha-suite's metadata is not installed")
    pytest.importorskip("transformers")
    installed["transformers"] = "4.24.0"
    with pytest.raises(registry.Unavailable, match=r"hf.gpt2\[eager\]: transformers 4.24.0"):
        registry._load_builtin(registry.BUILTIN_FAMILIES["hf.*"], "hf.gpt2[eager]")
