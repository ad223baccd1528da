"""Bad input is refused with one line naming the argument, exit 2, before anything runs."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from implementations.numpy.mha import NumpyMHA
from suite import cli
from suite.spec.problem import InputError, make_problem
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


BAD_ATTRIBUTES = str(PLUGINS / "bad_attributes.py")


@pytest.mark.parametrize("impl, why", [
    ("NameNotAString", "NameNotAString.name: expected a non-empty string, got 42"),
    ("bad.array_library", "array_library: expected a string, got list"),
    ("bad.devices", "devices() raised RuntimeError: no driver"),
    ("bad.dtypes", "dtypes('cpu'): expected some of float64"),
])
def test_a_plugin_with_unusable_attributes_is_refused_in_one_line(capsys, impl, why):
    err = _refused(capsys, ["check", "--plugin", BAD_ATTRIBUTES, "--impl", impl],
                   f"--plugin {BAD_ATTRIBUTES}: expected an implementation that can run here")
    assert why in err


def test_a_plugin_with_unusable_attributes_is_listed_unavailable(capsys):
    assert cli.main(["list", "--plugin", BAD_ATTRIBUTES, "--impl", "bad.*"]) == 0
    out = capsys.readouterr().out
    assert "bad.devices" in out and "unavailable: TypeError: DevicesRaise.devices() raised" in out
    assert "bad.dtypes" in out and "unavailable: TypeError: NoDtypes.dtypes('cpu')" in out


@pytest.mark.parametrize("argv, needle", [
    (["check", "--impl", "numpy", "--repeat", "0"], "--repeat: expected a positive int, got 0"),
    (["check", "--impl", "numpy", "--repeat", "-2"], "--repeat: expected a positive int, got -2"),
    (["sweep", "--impl", "numpy", "--shard", "2/2"],
     "--shard 2/2: expected a part with work, got none: the selection has 1 unit(s)"),
])
def test_silent_accepts_are_refused(capsys, tmp_path, argv, needle):
    _refused(capsys, [*argv, *(["--out", str(tmp_path)] if argv[0] == "sweep" else [])], needle)
    assert not list(tmp_path.rglob("*.json"))


def test_known_failures_that_cannot_be_read_are_refused(capsys, tmp_path):
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)))
    for path, needle in ((tmp_path / "missing.txt", "which does not exist"),
                         (tmp_path, "got the folder"),
                         (binary, "expected a UTF-8 text file, got binary data")):
        err = _refused(capsys, ["check", "--impl", "numpy", "--known-failures", str(path)],
                       "--known-failures: expected a")
        assert needle in err and str(path) in err


def test_a_report_never_overwrites_a_results_file(capsys, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURES / "vm", results)
    target = sorted(results.rglob("*.json"))[0]
    before = target.read_bytes()
    err = _refused(capsys, ["report", str(results), "--out", str(target)], "--out: expected an "
                   "HTML report path")
    assert "a results file" in err and target.read_bytes() == before
    other = tmp_path / "notes.html"
    other.write_text("<html>my notes</html>")
    _refused(capsys, ["report", str(results), "--out", str(other)], "not an mha-suite report")
    assert other.read_text() == "<html>my notes</html>"


def test_repro_into_a_read_only_folder_is_refused(capsys, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:  # root writes through a mode: the folder is made immutable instead
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]
                                                            ).returncode:
            pytest.skip("root, and chattr +i is not available to make a folder read-only")
    else:
        folder.chmod(0o500)
    try:
        _refused(capsys, ["repro", "numpy-cpu-float32-masking/causal", "--out", str(folder)],
                 "--out: expected a writable folder")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)])


def test_repro_onto_an_existing_file_is_refused(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    _refused(capsys, ["repro", "numpy-cpu-float32-masking/causal", "--out", str(blocker)],
             "--out: expected a folder, got the file")
    assert blocker.read_text() == "mine"
