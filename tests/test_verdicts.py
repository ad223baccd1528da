"""Verdicts that mean what they say: checked deviation policies, stale declarations,
refusals, flaky cases, replay lines, reproducers, and verdicts that do not change with
the number of BLAS / framework threads (a different summation order)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from suite.conformance import judge
from suite.conformance.cases import get
from tests.conftest import PLUGINS, ROOT, conformance_plugins
from tests.test_planted_bugs import conformance

POLICIES = str(PLUGINS / "policies.py")


def _by_case(doc, impl):
    return {(r["family"], r["case"]): r for r in doc["results"] if r["impl"] == impl}


def _run(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """A conformance run of the policies plugin: the process and its results file."""
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance.tests", "-q",
         *conformance_plugins(), "--plugin", POLICIES, "--dtype", "float32",
         "--conformance-json", str(out), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def _shared(tmp_path, selections: dict) -> tuple[subprocess.CompletedProcess, dict]:
    """One run of several policy plugins, each on the cases its own ``-k`` selects (its -k
    qualified by its name): every run lists every built-in in its results file, seconds of
    imports each, so the plugins whose runs would end alike share one."""
    impls = [a for name in selections for a in ("--impl", name)]
    keyword = " or ".join(f"({name.rstrip('*')} and ({k}))" for name, k in selections.items())
    return _run(tmp_path, *impls, "-k", keyword)


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """policy.garbage_through on the padding cases, policy.claims_* on the fully masked ones:
    both fail some, so the run exits 1."""
    return _shared(tmp_path_factory.mktemp("failing"), {
        "policy.garbage_through": "padding", "policy.claims_*": "fully_masked"})


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    """policy.stale on the fully masked cases, policy.refuses_one_head on ``one_head or
    batch_1`` (all of its cases: its name holds one_head): neither fails, the run exits 0."""
    return _shared(tmp_path_factory.mktemp("passing"), {
        "policy.stale": "fully_masked", "policy.refuses_one_head": "one_head or batch_1"})


def test_nan_padding_declaration_does_not_excuse_garbage(failing):
    proc, doc = failing
    cases = _by_case(doc, "policy.garbage_through")
    assert cases[("masking", "garbage_padding")]["outcome"] == "fail"
    assert proc.returncode == 1


def test_a_policy_that_is_not_followed_fails_and_one_that_is_passes_as_deviation(failing):
    proc, doc = failing
    claims_nan = _by_case(doc, "policy.claims_nan")
    claims_unmasked = _by_case(doc, "policy.claims_unmasked")
    for case in ("fully_masked_valid_lens", "fully_masked_bool_row"):
        assert claims_nan[("masking", case)]["outcome"] == "fail"
        assert "declared policy" in claims_nan[("masking", case)]["reason"]
        assert claims_unmasked[("masking", case)]["outcome"] == "deviation"
    assert proc.returncode == 1


def test_a_declaration_no_case_needs_is_reported_stale(passing):
    proc, doc = passing
    assert "stale declaration: policy.stale declares fully_masked_rows" in proc.stdout
    assert proc.returncode == 0
    listed = {i["name"]: i for i in doc["implementations"]}
    assert listed["policy.stale"]["stale_deviations"] == ["fully_masked_rows"]


def test_a_plugin_can_refuse_a_problem_as_unsupported(passing):
    proc, doc = passing
    cases = _by_case(doc, "policy.refuses_one_head")
    assert cases[("shapes", "one_head")]["outcome"] == "unsupported"
    assert "at least two heads" in cases[("shapes", "one_head")]["reason"]
    assert cases[("shapes", "batch_1")]["outcome"] == "pass"
    assert proc.returncode == 0


def test_repeat_reports_a_changing_outcome_as_flaky(tmp_path):
    code, doc = conformance(tmp_path, "--plugin", POLICIES, "--impl", "policy.flaky",
                            "--dtype", "float32", "-k", "masking/none", "--repeat", "2")
    (r,) = doc["results"]
    assert r["outcome"] == "flaky"
    assert "run 1: pass" in r["reason"] and "run 2: fail" in r["reason"]
    assert code == 1


def test_replay_line_names_the_plugin_and_a_real_path(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "suite.cli", "check", "--plugin", POLICIES, "--impl",
         "policy.claims_nan", "--dtype", "float32", "-k", "fully_masked_valid_lens",
         "--no-progress"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 1
    replay = next(line for line in proc.stdout.splitlines() if "replay:" in line)
    assert f"--plugin '{POLICIES}'" in replay
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED ")]
    assert failed
    path = failed[0].split()[1].split("::")[0]
    assert path.startswith("suite/conformance/") and (ROOT / path).is_file(), failed[0]
    # The replay command itself reproduces the failure.
    cmd = replay.split("replay: ", 1)[1]
    again = subprocess.run(["bash", "-c", cmd.replace("pytest ", f"{sys.executable} -m pytest ",
                                                      1)],
                           capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 1 and "1 failed" in again.stdout, again.stdout[-2000:]


def test_judge_uses_the_problem_not_a_case_tag():
    """garbage padding exhibits no declarable behaviour; NaN padding and empty rows do."""
    assert judge.behaviours(get("masking", "garbage_padding").problem()) == []
    assert judge.behaviours(get("masking", "nan_padding").problem()) == ["nan_padding"]
    assert judge.behaviours(get("masking", "fully_masked_valid_lens").problem()) == \
        ["fully_masked_rows"]
    assert judge.behaviours(get("masking", "causal").problem()) == []


def test_repro_writes_a_standalone_script_that_measures_the_library(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "repro"
    made = subprocess.run([sys.executable, "-m", "suite.cli", "repro",
                           "torch.sdpa-cpu-float32-masking/valid_lens", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert made.returncode == 0, made.stderr
    script = (out / "repro.py").read_text()
    assert "suite" not in script.replace("mha-suite", "")  # NumPy and the library only
    ran = subprocess.run([sys.executable, str(out / "repro.py")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    errors = [float(line.split("oracle ")[1].split(",")[0]) for line in ran.stdout.splitlines()]
    naive = float(ran.stdout.split("float32: ")[1].split(")")[0])
    assert len(errors) == 2 and max(errors) <= 4 * naive + 1e-6, ran.stdout


def test_repro_refuses_an_unknown_case_in_one_line(cli):
    proc = cli("repro", "torch.sdpa-cpu-float32-masking/nope")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "masking/nope" in proc.stderr


def test_repro_replays_any_plugin_file_on_the_saved_problem(cli, tmp_path):
    """A user plugin file without repro_code: replay.py loads it and the saved problem, and
    its verdict is the case's (the planted bug fails, the built-in it breaks passes)."""
    bug = str(PLUGINS / "wrong_scale.py")
    for impl, plugin, verdict, code in (("bug.no_scale", ["--plugin", bug], "fail", 1),
                                        ("numpy", [], "pass", 0)):
        out = tmp_path / impl
        made = cli("repro", f"{impl}-cpu-float32-numerics/explicit_scale", *plugin,
                   "--out", str(out))
        assert made.returncode == 0, made.stderr
        assert sorted(p.name for p in out.iterdir()) == ["problem.npz", "replay.py"]
        ran = subprocess.run([sys.executable, str(out / "replay.py")], capture_output=True,
                             text=True, cwd=tmp_path, timeout=600)
        assert ran.returncode == code, ran.stdout + ran.stderr[-2000:]
        first = ran.stdout.splitlines()[0]
        assert first.startswith(f"{impl} on cpu/float32, case numerics/explicit_scale: {verdict}")
        err = float(ran.stdout.split("saved float64 oracle: max abs error ")[1].split(",")[0])
        assert (err > 0.1) == (verdict == "fail"), ran.stdout


def test_repro_takes_property_and_gradient_test_ids(cli, tmp_path):
    from suite.conformance import repro

    assert repro.parse("test_repeatable[numpy-cpu-float32]")["family"] == "properties"
    assert repro.parse("test_gradient[torch.eager-cpu-float32-plain]")["case"] == "plain"
    assert repro.parse("test_causal_gradients[jax.jit-cpu-float32]")["case"] == "causality"
    assert repro.parse("test_mask_form[torch.nn-cpu-float16-mask_forms/kpm_bool+bool_LS]"
                       )["case"] == "kpm_bool+bool_LS"
    out = tmp_path / "perm"
    made = cli("repro", "numpy-cpu-float32-properties/permutation_equivariance", "--out", str(out))
    assert made.returncode == 0, made.stderr
    ran = subprocess.run([sys.executable, str(out / "replay.py")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600)
    assert ran.returncode == 0 and "properties/permutation_equivariance: pass" in ran.stdout, \
        ran.stdout + ran.stderr[-2000:]


def test_repro_refuses_a_hypothesis_case_in_one_line(cli):
    proc = cli("repro", "test_random_shapes[numpy-cpu-float32]")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "draws its problems" in proc.stderr, proc.stderr


def test_saved_problem_round_trips_with_its_shared_inputs(tmp_path):
    from suite.conformance import repro
    from suite.spec.problem import Mask, make_problem

    p = make_problem(5, 2, 6, 6, 8, 2, 1, self_attention=True, scale=-0.5,
                     mask=Mask(valid_lens=np.array([6, 2]), causal=True,
                               causal_align="bottom_right"))
    repro.save_problem(tmp_path / "p.npz", p, expected=np.ones(3))
    q, extra = repro.load_problem(tmp_path / "p.npz")
    assert q.query is q.key is q.value and np.array_equal(q.query, p.query)
    assert (q.num_heads, q.num_kv_heads, q.scale) == (2, 1, -0.5)
    assert q.mask.causal and q.mask.causal_align == "bottom_right"
    assert np.array_equal(q.mask.valid_lens, p.mask.valid_lens) and q.mask.allowed is None
    for name, w in p.weights.as_dict().items():
        assert np.array_equal(getattr(q.weights, name), w), name
    assert np.array_equal(extra["expected"], np.ones(3))


def test_every_case_is_seeded_from_its_family_and_name():
    """Adding a case changes no other case's arrays: no seed depends on a position."""
    import zlib

    from suite.conformance import catalog

    ids = [f"{c.family}/{c.name}" for c in catalog.ALL]
    assert len(ids) == len(set(ids))
    assert {"properties", "gradients", "mask_forms", "masking"} <= {c.family for c in catalog.ALL}
    for c in catalog.ALL:
        assert c.seed == zlib.crc32(f"{c.family}/{c.name}".encode()), c.name


def _together(commands, timeout: float) -> list:
    """Run (argv, env) commands at once and wait for them all: (returncode, stdout, stderr)
    each. For runs that share no compilation (JAX keys its persistent cache by the XLA flags
    too): side by side, the test lasts as long as the longer run, not their sum, wherever a
    core is free."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT, env=env) for argv, env in commands]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
        return [(p.returncode, *out) for p, out in zip(procs, outs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


SERIAL = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
          "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}


@pytest.mark.slow
def test_verdicts_do_not_change_with_the_thread_count(tmp_path):
    """One BLAS/torch/XLA thread against all cores: other summation orders, same verdicts."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    runs = []
    for i, env in enumerate((SERIAL, {})):
        out = tmp_path / f"c{i}.json"
        full = {k: v for k, v in os.environ.items() if k not in SERIAL} | env
        runs.append((out, (
            [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance.tests", "-q",
             *conformance_plugins(), "--conformance-json", str(out), "-k",
             # the problems large enough for a kernel to split a reduction by thread count
             # (the other shapes cases are at most 12 x 12 per head: one block, any count)
             "shapes/odd_lengths or numerics or masking/combined or gradient",
             # One implementation per kernel family whose summation order follows the thread
             # count: NumPy's BLAS, torch's matmuls, torch's SDPA kernel, XLA's CPU backend
             # (torch.nn's explicit path runs torch.eager's matmuls and softmax).
             *[a for i in ("numpy", "torch.eager", "torch.sdpa", "jax.jit")
               for a in ("--impl", i)]], full)))
    verdicts = []
    for (out, _), (code, stdout, stderr) in zip(runs, _together([r for _, r in runs], 1800)):
        assert out.exists(), stdout[-2000:] + stderr[-2000:]
        doc = json.loads(out.read_text())
        verdicts.append({r["test_id"]: r["outcome"] for r in doc["results"]})
        assert code in (0, 1)
    assert verdicts[0] == verdicts[1]
    assert len(verdicts[0]) > 100
    assert not [t for t, o in verdicts[0].items() if o in ("fail", "error")]


def test_thread_count_changes_no_baseline_in_sequential_order():
    """The sequential baseline is the same under any BLAS thread count (it uses no BLAS)."""
    from threadpoolctl import threadpool_limits

    from suite.spec.oracle import naive

    p = get("numerics", "wide_heads").problem()
    with threadpool_limits(1):
        one = naive(p, "float32", "sequential")[0]
    two = naive(p, "float32", "sequential")[0]
    np.testing.assert_array_equal(one, two)


@pytest.mark.slow
def test_xdist_run_gives_the_serial_verdicts(tmp_path):
    """The same conformance run serially and on two pytest-xdist workers: same records. CI's
    covering selection at the native level (every family of each implementation; the lower
    levels' processes are test_isa's), Hypothesis at its full 25 examples (its draws are
    where serial and xdist runs once differed)."""
    pytest.importorskip("xdist")
    import json

    from tests.conftest import run_cli

    docs = []
    for workers in ("0", "2"):  # in turn: the second run reads the first one's JAX compilations
        out = tmp_path / f"w{workers}.json"
        proc = run_cli("check", "--impl", "numpy", "--impl", "torch.eager", "--impl", "jax.jit",
                       "--plugin", POLICIES, "--impl", "policy.claims_*", "--dtype", "float32",
                       "--isa", "native", "--cover", "--workers", workers, "--json", str(out),
                       "--no-progress", "--", "--hypothesis-examples", "25", timeout=1800)
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # claims_nan
        docs.append({r["test_id"]: (r["outcome"], r["err"], r["err_naive"])
                     for r in json.loads(out.read_text())["results"]})
    assert docs[0] == docs[1]
    assert len(docs[0]) > 200


def test_conformance_on_xdist_gateways_keeps_its_records(tmp_path):
    """Hosts are pytest-xdist gateways (``--tx ssh=host//python=...``; ``popen`` here, the
    same path): the controller, which collects nothing, still writes every record."""
    pytest.importorskip("xdist")
    import json
    import subprocess
    import sys

    out = tmp_path / "tx.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance.tests", *conformance_plugins(),
         "-q", "--tx", f"2*popen//python={sys.executable}", "--dist", "loadgroup", "--impl",
         "numpy", "--dtype", "float32", "-k", "masking", "--conformance-json", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads(out.read_text())["results"]
    assert len(records) >= 18 and {r["impl"] for r in records} == {"numpy"}


def test_collect_only_with_workers_lists_the_cases(tmp_path):
    """``mha-suite check -- --collect-only`` under xdist: xdist stays off and the controller
    collects, so the conformance conftest must not be registered a second time (it was:
    "Plugin already registered under a different name", no case listed, exit 2)."""
    pytest.importorskip("xdist")
    import subprocess
    import sys

    out = tmp_path / "c.json"
    proc = subprocess.run(
        [sys.executable, "-m", "suite.cli", "check", "--impl", "numpy", "--dtype", "float32",
         "--workers", "2", "--json", str(out), "--", "--collect-only", "-k", "masking"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    listed = [line for line in proc.stdout.splitlines() if "numpy-cpu-float32-masking/" in line]
    assert len(listed) >= 10, proc.stdout[-2000:]
    assert "already registered" not in proc.stdout + proc.stderr


def test_repro_saves_the_problem_as_a_bias_free_plugin_runs_it(tmp_path):
    """problem.npz holds what the plugin ran and the oracle judged: no projection biases for
    a plugin without them (a reproducer built from it would add biases the case never had)."""
    from implementations.numpy.mha import NumpyMHA
    from suite.conformance import repro

    class BiasFree(NumpyMHA):
        name, projection_bias = "numpy.bias_free", False

    repro.write(BiasFree(), "numpy.bias_free-cpu-float32-masking/combined", tmp_path)
    problem, saved = repro.load_problem(tmp_path / "problem.npz")
    assert problem.weights.b_q is None and problem.weights.b_o is None
    from suite.spec.oracle import oracle
    assert np.allclose(saved["expected"], oracle(problem)[0])


@pytest.mark.parametrize("declared_pose, calls", [(None, 1), (False, 0), (True, 1)])
def test_repro_calls_a_plugin_to_find_its_posed_problem_only_where_it_may_pose(
        tmp_path, declared_pose, calls):
    """Which problem a reproducer saves depends on whether the plugin poses its own (a module
    as shipped); only a call says so, unless the plugin declares ``poses_problem``: a plugin
    that says False (the toolkit's cores, the built-ins) is not run while the files are
    written, one that does not say is run once."""
    from implementations.numpy.mha import NumpyMHA
    from suite.conformance import repro

    class Counting(NumpyMHA):
        name, poses_problem, runs = "numpy.counting", declared_pose, 0

        def run(self, state):
            type(self).runs += 1
            return super().run(state)

    Counting.__module__ = "my_plugin"  # a plugin, not a built-in
    repro.write(Counting(), "numpy.counting-cpu-float32-masking/combined", tmp_path)
    assert Counting.runs == calls
    assert repro.may_pose(NumpyMHA()) is False  # a built-in that does not say: never
