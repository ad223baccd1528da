"""The conformance cases catch deliberately wrong implementations.

Each planted bug is registered through --plugin, as a user's plugin would be. That the
built-ins pass every case they support is asserted by the `mha-suite check` step of
`nox -s tests` (README's test command), on every built-in and dtype; this module no longer
repeats it for five of them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import PLUGINS, ROOT

BUGS = {  # file -> (implementation, the family that must catch it, extra pytest args)
    "wrong_scale.py": ("bug.no_scale", "numerics", ()),
    "ignores_mask.py": ("bug.ignores_mask", "masking", ()),
    "inverted_bool.py": ("bug.inverted_bool", "masking", ()),
    "head_order.py": ("bug.head_order", "shapes", ()),
    # The forward is right, so only the gradient cases can catch it.
    "detached_value.py": ("bug.detached_value", "gradients", ("-k", "gradient")),
    # Tile and special-value bugs the short masked cases miss (test_old_families_miss_them).
    "empty_first_block.py": ("bug.empty_first_block", "tiles", ("-k", "tiles")),
    "tile_tail.py": ("bug.tile_tail", "tiles", ("-k", "tiles")),
    "zeroes_nan_rows.py": ("bug.zeroes_nan_rows", "special_values", ("-k", "special_values")),
}
NEW_FAMILY_BUGS = ("empty_first_block.py", "tile_tail.py", "zeroes_nan_rows.py")


def conformance(tmp_path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance", "-q",
         "-p", "no:cacheprovider", "--conformance-json", str(out), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())


@pytest.mark.parametrize("file", sorted(BUGS))
def test_planted_bug_fails_a_case(tmp_path, file):
    name, family, extra = BUGS[file]
    if file == "detached_value.py":
        pytest.importorskip("torch")
    code, doc = conformance(tmp_path, "--plugin", str(PLUGINS / file), "--impl", name,
                            "--dtype", "float32", *extra)
    assert code == 1
    fails = [r for r in doc["results"] if r["outcome"] == "fail"]
    assert any(r["family"] == family for r in fails), {r["case"] for r in fails}
    assert all(r["impl"] == name for r in doc["results"])
    if file == "detached_value.py":  # no gradient reaches value or w_v: the failure says so
        assert any("value" in r["reason"] and "w_v" in r["reason"] for r in fails), \
            [r["reason"] for r in fails]
        return
    # The failure says how far past the rule it is.
    finite = [r for r in fails if isinstance(r["err"], float)]
    if not finite:  # NaN where the spec has a value, or a value where it has NaN: it says so
        assert all("nan" in r["reason"].lower() for r in fails), [r["reason"] for r in fails]
        return
    worst = max(finite, key=lambda r: r["err"] / r["bound"])
    assert worst["err"] > worst["bound"]


@pytest.mark.parametrize("file", NEW_FAMILY_BUGS)
def test_old_families_miss_them(tmp_path, file):
    """What the tiles and special_values families add: these bugs pass every masking, shapes
    and numerics case (a kernel with a tile bug, or one that zeroes NaN rows)."""
    code, doc = conformance(tmp_path, "--plugin", str(PLUGINS / file), "--impl", BUGS[file][0],
                            "--dtype", "float32", "-k", "masking or shapes or numerics")
    assert {r["family"] for r in doc["results"]} >= {"masking", "shapes", "numerics"}
    assert [r["case"] for r in doc["results"] if r["outcome"] != "pass"] == []
    assert code == 0


def test_plugin_that_raises_is_an_error_and_neighbours_still_run(tmp_path):
    code, doc = conformance(tmp_path, "--plugin", str(PLUGINS / "broken.py"),
                            "--impl", "broken.*", "--dtype", "float32", "-k", "masking/none")
    by_impl = {r["impl"]: r for r in doc["results"]}
    assert by_impl["broken.run"]["outcome"] == "error"
    assert "RuntimeError: kernel launch failed" in by_impl["broken.run"]["reason"]
    assert by_impl["broken.neighbour_works"]["outcome"] == "pass"
    listed = {i["name"]: i for i in doc["implementations"]}
    assert listed["broken.construct"]["available"] is False
    assert code == 1


def test_plugin_that_hangs_times_out_and_neighbours_still_run(tmp_path):
    code, doc = conformance(tmp_path, "--plugin", str(PLUGINS / "hangs.py"), "--impl", "hang.*",
                            "--dtype", "float32", "-k", "masking/none or masking/causal]",
                            "--timeout", "3")
    by_impl: dict = {}
    for r in doc["results"]:
        by_impl.setdefault(r["impl"], []).append(r)
    assert {r["outcome"] for r in by_impl["hang.forever"]} == {"error"}
    assert all("Timeout" in r["reason"] for r in by_impl["hang.forever"])
    assert {r["case"] for r in by_impl["hang.forever"]} == {"none", "causal"}
    assert {r["outcome"] for r in by_impl["hang.neighbour_works"]} == {"pass"}
    assert code == 1
