"""The conformance cases catch deliberately wrong implementations.

Each planted bug is registered through --plugin, as a user's plugin would be. That the
built-ins pass every case they support is asserted by the `mha-suite check` step of
`nox -s tests` (README's test command), on every built-in and dtype; this module no longer
repeats it for five of them.

The planted bugs share conformance runs: every process lists every built-in in its results
file (seconds of imports each), so the bugs that must fail run in one process, each on its own
cases (its ``-k`` qualified by its name, the selection a run of its own would make), and the
bugs the older families miss run in another (which must exit 0).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import PLUGINS, ROOT, conformance_plugins

BUGS = {  # file -> (implementation, the family that must catch it, its -k, or None: all cases)
    # The family that must catch it, not every case: the assertions read that family's
    # failures, and the whole catalogue took 7 of a bug's 9 CPU-s (four bugs: ~25 s).
    "wrong_scale.py": ("bug.no_scale", "numerics", "numerics"),
    "ignores_mask.py": ("bug.ignores_mask", "masking", "masking"),
    "inverted_bool.py": ("bug.inverted_bool", "masking", "masking"),
    "head_order.py": ("bug.head_order", "shapes", "shapes"),
    # The forward is right, so only the gradient cases can catch it.
    "detached_value.py": ("bug.detached_value", "gradients", "gradient"),
    # Tile and special-value bugs the short masked cases miss (test_old_families_miss_them).
    "empty_first_block.py": ("bug.empty_first_block", "tiles", "tiles"),
    "tile_tail.py": ("bug.tile_tail", "tiles", "tiles"),
    "zeroes_nan_rows.py": ("bug.zeroes_nan_rows", "special_values", "special_values"),
}
NEW_FAMILY_BUGS = ("empty_first_block.py", "tile_tail.py", "zeroes_nan_rows.py")
# broken.py: one that raises, one that cannot be constructed, and a neighbour that works.
BROKEN = ("broken.py", "broken.*", "masking/none")


def conformance(tmp_path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance.tests", "-q",
         *conformance_plugins(), "--conformance-json", str(out), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())


def _own_cases(name: str, keyword) -> str:
    """A -k clause selecting, of ``name``'s cases, those ``-k keyword`` selects (all: None)."""
    return f"({name}{'' if keyword is None else f' and ({keyword})'})"


def _torch() -> bool:
    return importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """One run of every planted bug that must fail, and of broken.py's plugins, float32."""
    files = [f for f in sorted(BUGS) if f != "detached_value.py" or _torch()]
    plugins = [*files, BROKEN[0]]
    impls = [BUGS[f][0] for f in files] + [BROKEN[1]]
    keyword = " or ".join([_own_cases(BUGS[f][0], BUGS[f][2]) for f in files]
                          + [_own_cases(BROKEN[1].rstrip("*"), BROKEN[2])])
    args = [a for f in plugins for a in ("--plugin", str(PLUGINS / f))]
    args += [a for i in impls for a in ("--impl", i)]
    code, doc = conformance(tmp_path_factory.mktemp("failing"), *args, "--dtype", "float32",
                            "-k", keyword)
    return code, doc, {BUGS[f][0] for f in files}


def test_the_shared_run_fails_and_holds_only_the_selected_implementations(failing):
    code, doc, names = failing
    assert code == 1
    assert {r["impl"] for r in doc["results"]} == names | {"broken.run", "broken.neighbour_works"}


@pytest.mark.parametrize("file", sorted(BUGS))
def test_planted_bug_fails_a_case(failing, file):
    name, family, keyword = BUGS[file]
    if file == "detached_value.py":
        pytest.importorskip("torch")
    code, doc, _ = failing
    assert code == 1
    mine = [r for r in doc["results"] if r["impl"] == name]
    assert mine, f"no record of {name}"
    fails = [r for r in mine if r["outcome"] == "fail"]
    assert any(r["family"] == family for r in fails), {r["case"] for r in fails}
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


@pytest.fixture(scope="module")
def old_families(tmp_path_factory):
    """The new-family bugs on the masking, shapes and numerics cases: one run, which passes."""
    args = [a for f in NEW_FAMILY_BUGS for a in ("--plugin", str(PLUGINS / f),
                                                "--impl", BUGS[f][0])]
    return conformance(tmp_path_factory.mktemp("old"), *args, "--dtype", "float32",
                       "-k", "masking or shapes or numerics")


@pytest.mark.parametrize("file", NEW_FAMILY_BUGS)
def test_old_families_miss_them(old_families, file):
    """What the tiles and special_values families add: these bugs pass every masking, shapes
    and numerics case (a kernel with a tile bug, or one that zeroes NaN rows)."""
    code, doc = old_families
    mine = [r for r in doc["results"] if r["impl"] == BUGS[file][0]]
    assert {r["family"] for r in mine} >= {"masking", "shapes", "numerics"}
    assert [r["case"] for r in mine if r["outcome"] != "pass"] == []
    assert code == 0


def test_plugin_that_raises_is_an_error_and_neighbours_still_run(failing):
    code, doc, _ = failing
    by_impl = {r["impl"]: r for r in doc["results"] if r["impl"].startswith("broken.")}
    assert set(by_impl) == {"broken.run", "broken.neighbour_works"}  # masking/none, once each
    assert sum(r["impl"].startswith("broken.") for r in doc["results"]) == 2
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
