"""Bad input is refused with one line naming the argument, exit 2, before anything runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from implementations.numpy_mha import NumpyMHA
from suite import cli
from suite.problem import InputError, make_problem
from tests.conftest import PLUGINS

FIXTURES = Path(__file__).parent / "fixtures"
UNUSABLE = str(PLUGINS / "unusable.py")


def _refused(capsys, argv, needle: str) -> str:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("mha-suite: error: ") and len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    assert "Traceback" not in out + err
    return err


@pytest.mark.parametrize("argv, needle", [
    (["check", "--dtype", "float8"], "--dtype: expected some of float64"),
    (["check", "--device", "tpu"], "--device: expected a device the selected implementations"),
    (["check", "--impl", "numpy", "--device", "cuda"], "got cuda"),
    (["check", "--impl", "numpy", "--dtype", "bfloat16"], "--dtype: expected a dtype the"),
    (["sweep", "--device", "tpu"], "--device: expected a device"),
    (["sweep", "--impl", "numpy", "--device", "cuda"], "got cuda"),
    (["sweep", "--impl", "numpy", "--preset", "gpu"], "--preset gpu (device)"),
    (["sweep", "--lengths", "0"], "--lengths: expected positive integers, got 0"),
    (["sweep", "--heads", "-2"], "--heads: expected positive integers, got -2"),
    (["sweep", "--heads", "0"], "--heads: expected positive integers, got 0"),
    (["sweep", "--batch", "0"], "--batch: expected positive integers, got 0"),
    (["sweep", "--head-dim", "0"], "--head-dim: expected positive integers"),
    (["sweep", "--dtype", "float8"], "--dtype: expected some of"),
    (["sweep", "--threads", "0"], "--threads: expected a positive int, got 0"),
    (["sweep", "--max-time", "-1"], "--max-time: expected a positive number"),
    (["run", "--impl", "numpy", "--device", "tpu"], "--device"),
    (["run", "--impl", "numpy", "--dtype", "float8"], "--dtype: expected some of"),
])
def test_bad_arguments_are_refused(capsys, tmp_path, argv, needle):
    _refused(capsys, [*argv, *(["--out", str(tmp_path / "o")] if argv[0] != "check" else [])],
             needle)
    assert not list(tmp_path.rglob("*.json"))  # nothing was measured or written


@pytest.mark.parametrize("command", ["check", "sweep", "run"])
@pytest.mark.parametrize("impl, why", [("unusable.constructor", "driver handshake failed"),
                                       ("unusable.interface", "does not implement prepare")])
def test_an_unusable_plugin_is_refused(capsys, tmp_path, command, impl, why):
    out = [] if command == "check" else ["--out", str(tmp_path)]
    err = _refused(capsys, [command, "--plugin", UNUSABLE, "--impl", impl, *out],
                   f"--plugin {UNUSABLE}: expected an implementation that can run here")
    assert impl in err and why in err


def test_an_unavailable_builtin_alone_is_refused(capsys, tmp_path):
    _refused(capsys, ["check", "--plugin", str(PLUGINS / "broken.py"), "--impl",
                      "broken.construct"], "needs a device this machine lacks")


def test_unwritable_outputs_are_refused_before_measuring(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for argv in (["sweep", "--impl", "numpy", "--out", str(blocker / "d")],
                 ["check", "--impl", "numpy", "--json", str(blocker / "c.json")],
                 ["run", "--impl", "numpy", "--out", str(blocker / "d")],
                 ["report", str(FIXTURES / "vm"), "--out", str(blocker / "r.html")]):
        _refused(capsys, argv, "expected a writable directory")


def test_a_sweep_never_overwrites_a_file_that_is_not_a_sweep(capsys, tmp_path):
    (tmp_path / "sweep-ci.json").write_text('{"kind": "mha-suite/conformance", "results": []}')
    _refused(capsys, ["sweep", "--preset", "ci", "--impl", "numpy", "--out", str(tmp_path)],
             "expected a sweep results file, got a conformance file; not overwriting it")


def test_a_failed_rerun_leaves_the_files_points(capsys, tmp_path):
    path = tmp_path / "sweep-ci.json"
    shutil.copy(FIXTURES / "real" / "sweep-a.json", path)
    before = path.read_bytes()
    assert json.loads(before)["benchmarks"]
    _refused(capsys, ["sweep", "--preset", "ci", "--impl", "numpy", "--device", "tpu",
                      "--out", str(tmp_path)], "--device")
    assert path.read_bytes() == before


@pytest.mark.parametrize("text, needle", [
    ('{"benchmarks": "oops"}', "benchmarks: expected a list of points"),
    ("{not json", "is not valid JSON"),
    ('{"benchmarks": [], "machine_info": {}, "datetime": "x"}', "not written by mha-suite"),
])
def test_report_refuses_files_that_are_not_results(capsys, tmp_path, text, needle):
    (tmp_path / "x.json").write_text(text)
    _refused(capsys, ["report", str(tmp_path / "x.json"), "--out", str(tmp_path / "r.html")],
             needle)
    assert not (tmp_path / "r.html").exists()


def test_report_of_an_empty_directory_is_refused(capsys, tmp_path):
    _refused(capsys, ["report", str(tmp_path)], "holds no mha-suite results files")


# --- the Python API ------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, needle", [
    ({"H": 0}, "H: expected a positive int, got 0"),
    ({"H": "2"}, "H: expected a positive int, got '2'"),
    ({"B": 0}, "B: expected a positive int"),
    ({"L": 2.0}, "L: expected a positive int"),
    ({"K": -1}, "K: expected a positive int"),
    ({"scale": "0.5"}, "scale: expected a finite non-zero float, got '0.5'"),
    ({"scale": float("inf")}, "scale: expected a finite"),
])
def test_make_problem_names_the_bad_argument(kwargs, needle):
    with pytest.raises(InputError, match=None) as info:
        make_problem(0, **kwargs)
    assert needle in str(info.value)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_non_finite_weights_are_refused(bad):
    p = make_problem(0)
    w = p.weights.w_k.copy()
    w[0, 0] = bad
    with pytest.raises(InputError, match="weights.w_k: expected finite values"):
        NumpyMHA()(dataclasses.replace(p, weights=dataclasses.replace(p.weights, w_k=w)))


class _Plain(NumpyMHA):
    """A plugin declaring no features, like the README's MyMHA."""

    name = "plain"
    features = frozenset()


@pytest.mark.parametrize("kwargs, feature", [({"scale": 0.5}, "scale"), ({"S": 4}, "cross"),
                                             ({"H": 4, "K": 2}, "gqa")])
def test_call_refuses_a_problem_needing_an_undeclared_feature(kwargs, feature):
    with pytest.raises(InputError, match=f"needs features {feature}, which plain does not"):
        _Plain()(make_problem(0, E=16, **kwargs))
    assert _Plain()(make_problem(0)).output.shape == (2, 8, 16)  # what it declares, it runs
