"""The plugin contract: declared hooks, one key/value source, --plugin and built-in names,
--known-failures as a check option."""

from __future__ import annotations

import json

import numpy as np
import pytest

from implementations.numpy.mha import NumpyMHA
from suite.plugins import registry
from suite.plugins.interface import (
    Implementation,
    Unsupported,
    array_library,
    check_interface,
    expressible,
)
from suite.spec.problem import make_problem
from tests.conftest import PLUGINS


def _one_line_error(proc, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(err.splitlines()) == 1, err
    assert needle in err


def test_every_hook_the_harness_reads_is_declared_with_a_default():
    for hook, default in (("array_library", ""), ("kv_source", "separate"),
                          ("memory_model", "quadratic"), ("repeat_kv", True),
                          ("replaces_builtin", False), ("repro_code", None),
                          ("projection_bias", True)):
        assert getattr(Implementation, hook) == default, hook
    assert callable(Implementation.after_prepare)


def test_array_library_defaults_to_the_framework():
    class OnTorch(NumpyMHA):
        framework, array_library = "keras", "torch"

    assert array_library(NumpyMHA()) == "numpy"
    assert array_library(OnTorch()) == "torch"
    # mha-suite list says both, and a shared key/value source.
    assert registry.Description.of(OnTorch()).array_library == "torch"
    assert registry.Description.of(NumpyMHA()).array_library == ""
    shared = type("Shared", (NumpyMHA,), {"name": "s", "kv_source": "shared"})()
    assert registry.Description.of(shared).kv_source == "shared"


@pytest.mark.parametrize("attr,value", [("kv_source", "both"), ("memory_model", "cubic")])
def test_bad_hook_values_are_refused_at_load(attr, value):
    cls = type("Bad", (NumpyMHA,), {"name": "bad", attr: value})
    with pytest.raises(TypeError, match=f"Bad.{attr}: expected one of"):
        check_interface(cls)


def test_expressible_gives_a_shared_kv_plugin_value_is_key():
    p = make_problem(0, 2, 3, 5)
    shared = type("Shared", (NumpyMHA,), {"name": "s", "kv_source": "shared"})()
    assert expressible(NumpyMHA(), p) is p
    q = expressible(shared, p)
    assert q.value is q.key is p.key and q.query is p.query
    with pytest.raises(Unsupported, match="key != value"):
        expressible(shared, p, distinct_kv=True)
    self_attn = make_problem(0, 2, 4, self_attention=True)
    assert expressible(shared, self_attn, distinct_kv=True) is self_attn


def test_expressible_gives_a_self_plugin_one_input():
    p = make_problem(0, 2, 5, 5)
    one = type("One", (NumpyMHA,), {"name": "o", "kv_source": "self"})()
    q = expressible(one, p)
    assert q.query is q.key is q.value is p.query
    with pytest.raises(Unsupported, match="key != value"):
        expressible(one, p, distinct_kv=True)
    with pytest.raises(Unsupported, match="Lq != Lk"):
        expressible(one, make_problem(0, 2, 3, 5))
    assert expressible(one, q) is q


@pytest.fixture(scope="module")
def kv_check(tmp_path_factory):
    """One ``mha-suite check`` of the key/value plugins, for two tests: kv_source.py's on
    every float32 case, kv_grouping.py's interleaved and undeclared libraries on the float64
    Hypothesis family (each selection qualified by the names it is for). Every check lists
    every built-in in its results file, seconds of imports: one process, not two."""
    from tests.conftest import run_cli

    tmp = tmp_path_factory.mktemp("kv")
    seen, out = tmp / "seen.txt", tmp / "c.json"
    own = ("((kv. or bug.ignores_value) and cpu-float32) or "
           "(grouping. and cpu-float64 and hypothesis)")
    proc = run_cli("check", "--plugin", str(PLUGINS / "kv_source.py"), "--impl", "kv.*",
                   "--impl", "bug.ignores_value", "--plugin", str(PLUGINS / "kv_grouping.py"),
                   "--impl", "grouping.interleaved", "--impl", "grouping.undeclared",
                   "--dtype", "float32", "--dtype", "float64", "--workers", "0", "-k", own,
                   "--json", str(out), "--no-progress",
                   env={"MHA_SUITE_TEST_KV_SEEN": str(seen)})
    records = json.loads(out.read_text())["results"] if out.exists() else []
    return proc, records, seen


def test_shared_kv_plugins_get_problems_they_can_express(kv_check):
    """kv.shared reads only ``key``: given value = key everywhere it passes, and the case
    about key != value is unsupported for it. bug.ignores_value does the same without
    declaring it: the suite must still give it key != value, so it fails."""
    proc, records, seen = kv_check
    records = [r for r in records if r["impl"].startswith(("kv.", "bug.ignores_value"))]
    assert records and {r["dtype"] for r in records} == {"float32"}, proc.stdout[-3000:]
    by = {(r["impl"], r["family"], r["case"]): r for r in records}
    for impl in ("kv.shared", "kv.shared_grad"):
        mine = {k: r for k, r in by.items() if k[0] == impl}
        assert mine[(impl, "shapes", "cross_key_ne_value")]["outcome"] == "unsupported"
        assert "key != value" in mine[(impl, "shapes", "cross_key_ne_value")]["reason"]
        # numpy's and torch.eager's own declared 0 * NaN (special_values) is inherited.
        bad = {k[1:]: (r["outcome"], r["reason"]) for k, r in mine.items()
               if r["outcome"] not in ("pass", "unsupported") and not (
                   r["outcome"] == "deviation" and r["policies_used"] == ["nan_padding"])}
        assert not bad, bad
        assert sum(r["outcome"] == "pass" for r in mine.values()) > 30
    grads = [r for k, r in by.items() if k[0] == "kv.shared_grad" and k[1] == "gradients"]
    assert grads and all(r["outcome"] == "pass" for r in grads), grads
    assert set(seen.read_text().split()) == {"shared"}
    ignores = [r for k, r in by.items() if k[0] == "bug.ignores_value"]
    assert any(r["outcome"] == "fail" for r in ignores)
    assert proc.returncode == 1  # bug.ignores_value fails


def test_sweeps_give_a_shared_kv_plugin_value_is_key(cli, tmp_path):
    """A sweep point is a problem too: a plugin with one key/value source is timed on
    value = key (the same array), as its conformance cases are, and its points count."""
    seen, out = tmp_path / "seen.txt", tmp_path / "sweep"
    proc = cli("sweep", "--plugin", str(PLUGINS / "kv_source.py"), "--impl", "kv.shared",
               "--preset", "ci", "--lengths", "32,64", "--heads", "2", "--out", str(out),
               env={"MHA_SUITE_TEST_KV_SEEN": str(seen)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    points = [b for f in out.glob("sweep-*.json")
              for b in json.loads(f.read_text())["benchmarks"]]
    assert len(points) == 4 and all(b["extra_info"]["status"] == "ok" for b in points), points
    assert seen.read_text().split() and set(seen.read_text().split()) == {"shared"}


def test_plugin_named_like_a_builtin_is_refused_unless_asked(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from implementations.numpy.mha import NumpyMHA\n\n\n"
                    "class Mine(NumpyMHA):\n    name = 'numpy'\n")
    with pytest.raises(registry.PluginError, match="'numpy' is a built-in's name.*"
                                                   "--replace-builtin numpy"):
        registry.build(plugins=[str(path)], entry_points=False, env={})
    reg = registry.build(plugins=[str(path)], entry_points=False, env={}, replace=["numpy"])
    assert reg.entries["numpy"].source.startswith("plugin")
    reg = registry.build(plugins=[str(path)], entry_points=False,
                         env={registry.REPLACE_ENV: "torch.sdpa,numpy"})
    assert reg.entries["numpy"].source.startswith("plugin")
    path.write_text(path.read_text() + "    replaces_builtin = True\n")
    reg = registry.build(plugins=[f"{path}:Mine"], entry_points=False, env={})
    assert reg.entries["numpy"].source.startswith("plugin")


def test_replacing_a_builtin_on_the_command_line(cli, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from implementations.numpy.mha import NumpyMHA\n\n\n"
                    "class Mine(NumpyMHA):\n    name = 'numpy'\n")
    _one_line_error(cli("list", "--plugin", str(path)), "--replace-builtin numpy")
    proc = cli("list", "--plugin", str(path), "--replace-builtin", "numpy", "--impl", "numpy")
    assert proc.returncode == 0, proc.stderr
    assert "(plugin " in proc.stdout


def test_known_failures_is_a_check_option(cli, tmp_path):
    known = tmp_path / "known.txt"
    known.write_text("test_case[[]bug.no_scale-cpu-float32-masking/none[]]  # planted: no scale\n")
    args = ["check", "--plugin", str(PLUGINS / "wrong_scale.py"), "--impl", "bug.no_scale",
            "--dtype", "float32", "-k", "masking/none", "--workers", "0"]
    failing = cli(*args)
    assert failing.returncode == 1, failing.stdout[-2000:]
    listed = cli(*args, "--known-failures", str(known))
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    assert "known failure: planted: no scale" in listed.stdout + listed.stderr or \
        "xfailed" in listed.stdout
    before = cli("check", "--known-failures", str(known), *args[1:])  # before the others
    assert before.returncode == 0, before.stdout[-2000:]


def test_a_known_failure_glob_warns_of_passes_but_not_of_unsupported_cases(cli, tmp_path):
    """An entry covering cases the implementation does not run (unsupported) is not a
    known failure that passed; one covering a passing case is."""
    known = tmp_path / "known.txt"
    known.write_text("*[[]numpy-cpu-float32-masking/none[]]  # listed, but passes\n"
                     "*[[]numpy-cpu-float32-gradients/plain[]]  # listed, unsupported\n")
    proc = cli("check", "--impl", "numpy", "--dtype", "float32", "--workers", "0",
               "--known-failures", str(known), "-k", "masking/none or gradients/plain")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "masking/none] is listed as a known failure but passed" in proc.stdout
    assert "gradients/plain] is listed as a known failure" not in proc.stdout


def test_a_record_naming_no_implementation_warns_and_fails_a_strict_check(cli, tmp_path):
    """A user's record whose implementation is misspelt lists no test: said at the end of a
    run, and under --strict-declarations one line before any case (#52)."""
    known = tmp_path / "mine.toml"
    known.write_text('[[failure]]\nname = "typo"\nimplementation = ["numpy", "nmupy*"]\n'
                     'cases = "masking/none"\nkind = "bug"\nreason = "misspelt"\n')
    args = ["check", "--impl", "numpy", "--dtype", "float32", "--workers", "0",
            "--known-failures", str(known), "-k", "masking/combined"]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    warned = [line for line in proc.stdout.splitlines() if "names no implementation" in line]
    assert warned == [f"warning: known failure record 'typo' ({known}) names no "
                      "implementation here: 'nmupy*'"], proc.stdout[-2000:]
    strict = cli(*args, "--strict-declarations")
    assert strict.returncode == 2 and "passed" not in strict.stdout, strict.stdout[-2000:]
    assert strict.stderr.strip() == ("mha-suite: error: --known-failures: known failure record "
                                     f"'typo' ({known}) names no implementation here: 'nmupy*'")
    known.write_text(known.read_text().replace('"nmupy*"', '"numpy*"'))
    assert "names no implementation" not in cli(*args, "--strict-declarations").stdout


def test_a_record_of_a_library_not_installed_here_is_not_an_unknown_name(cli, tmp_path):
    """A file of records for every framework read where one is installed (the compat
    sessions' known_failures_compat.toml): a record whose library is absent names built-ins
    that are not registered without it, which is not a misspelling; the same record with an
    installed library still is (#52 item 6, #49's compat sessions under --strict-declarations)."""
    known = tmp_path / "all-frameworks.toml"
    record = ('[[failure]]\nname = "elsewhere"\nimplementation = "absent.lib[eager]"\n'
              'cases = "masking/none"\nkind = "bug"\nlibrary = "{}"\nreason = "r"\n')
    args = ["check", "--impl", "numpy", "--dtype", "float32", "--workers", "0",
            "--known-failures", str(known), "-k", "masking/combined", "--strict-declarations"]
    known.write_text(record.format("no-such-distribution"))
    proc = cli(*args)
    assert proc.returncode == 0 and "names no implementation" not in proc.stdout + proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    known.write_text(record.format("numpy"))
    proc = cli(*args)
    assert proc.returncode == 2 and "names no implementation here: 'absent.lib[eager]'" in \
        proc.stderr, proc.stderr[-2000:]


# ------------------------------------------------------------ deviations that depend on dtype

def _fully_masked_outcomes(cls) -> dict:
    from suite.conformance import cases
    from suite.conformance.judge import run_case

    case = next(c for c in cases.CASES if c.name == "fully_masked_valid_lens")
    return {dtype: run_case(cls(), cls.name, "cpu", dtype, case)
            for dtype in ("float64", "float32", "float16")}


def test_a_per_dtype_policy_is_applied_in_its_own_dtype_only():
    """mean of the values in float64/float32, NaN in float16 (a -1e30 fill that overflows):
    declared per dtype, each dtype's rows are checked against that dtype's policy."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dtype_policies", PLUGINS / "dtype_policies.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for cls in (mod.PerDtype, mod.Swapped, mod.OnePolicy):
        check_interface(cls)
    right = _fully_masked_outcomes(mod.PerDtype)
    assert {d: o.outcome for d, o in right.items()} == dict.fromkeys(right, "deviation")
    assert "fully_masked_rows=nan" in right["float16"].reason
    assert "fully_masked_rows=mean_values" in right["float32"].reason
    assert right["float16"].policies_used == ["fully_masked_rows"]
    # Applied to the wrong dtype, every policy fails its rows.
    swapped = _fully_masked_outcomes(mod.Swapped)
    assert {d: o.outcome for d, o in swapped.items()} == dict.fromkeys(swapped, "fail")
    assert "nor does it follow the declared policy (fully_masked_rows=mean_values" in \
        swapped["float16"].reason
    # The single-policy form still holds in every dtype: right in float32, wrong in float16.
    one = _fully_masked_outcomes(mod.OnePolicy)
    assert [one[d].outcome for d in ("float32", "float16")] == ["deviation", "fail"]


def test_a_dtype_the_declaration_does_not_name_gets_the_spec():
    from suite.plugins.declarations import Deviation, deviations_for

    class Half(NumpyMHA):
        name = "dtype_policy.half"
        deviations = {"fully_masked_rows": {"float16": Deviation("nan", "measured")}}

    check_interface(Half)
    assert deviations_for(Half(), "float16")["fully_masked_rows"].policy == "nan"
    assert "fully_masked_rows" not in deviations_for(Half(), "float32")

    class Typo(NumpyMHA):
        name = "dtype_policy.typo"
        deviations = {"fully_masked_rows": {"fp16": Deviation("nan", "measured")}}

    with pytest.raises(TypeError, match=r"deviations\['fully_masked_rows'\]: expected dtypes"):
        check_interface(Typo)

    class BadPolicy(NumpyMHA):
        name = "dtype_policy.bad"
        deviations = {"fully_masked_rows": {"float16": Deviation("zeroes", "measured")}}

    with pytest.raises(TypeError, match=r"\['fully_masked_rows'\]\['float16'\]"):
        check_interface(BadPolicy)


# ------------------------------------------------------------------------- kv head grouping

def _grouping_plugins():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kv_grouping", PLUGINS / "kv_grouping.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case_name", ["gqa", "gqa_groups_of_2", "mqa"])
def test_a_declared_interleaved_grouping_is_handled_by_the_harness(case_name):
    """Query head h reading kv head h % K: declared, the GQA cases pass (weights included);
    undeclared, they fail wherever h // (H/K) and h % K differ (not with one kv head)."""
    from suite.conformance import cases
    from suite.conformance.judge import run_case

    mod = _grouping_plugins()
    case = next(c for c in cases.CASES if c.name == case_name)
    right = run_case(mod.Interleaved(), "grouping.interleaved", "cpu", "float64", case)
    assert right.outcome == "pass", right.reason
    assert [c.what for c in right.comparisons] == ["output", "weights"]
    wrong = run_case(mod.Undeclared(), "grouping.undeclared", "cpu", "float64", case)
    assert wrong.outcome == ("pass" if case_name == "mqa" else "fail"), wrong.reason


def test_interleaved_grouping_gradients_come_back_in_the_canonical_order():
    pytest.importorskip("torch")
    from suite.conformance import cases
    from suite.plugins.interface import call
    from suite.spec.oracle_grad import grads as oracle_grads

    mod = _grouping_plugins()
    # H = 8, K = 2: the reordering is not its own inverse (with H = 4 it would be)
    p = next(c for c in cases.CASES if c.name == "gqa").problem()
    got = call(mod.TorchInterleaved(), p, "cpu", "float64", need_weights=True, grad=True)
    want = oracle_grads(p)
    for name in ("w_q", "b_q", "w_o", "query", "key"):
        np.testing.assert_allclose(got.grads[name], want[name], rtol=1e-9, atol=1e-9,
                                   err_msg=name)
    undeclared = type("Undeclared", (mod.TorchInterleaved,), {"kv_grouping": "grouped"})
    bad = call(undeclared(), p, "cpu", "float64", grad=True)
    assert not np.allclose(bad.grads["w_q"], want["w_q"])


def test_kv_grouping_is_checked_at_load():
    class Typo(NumpyMHA):
        name = "grouping.typo"
        kv_grouping = "modulo"

    with pytest.raises(TypeError, match="kv_grouping: expected one of"):
        check_interface(Typo)


def test_the_hypothesis_family_catches_a_wrong_grouping(kv_check):
    """Its draws alone passed the undeclared interleaved library (25 derandomised examples
    never paired heads differently); its GQA example fails it and passes the declared one."""
    proc, records, _ = kv_check
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    mine = [r for r in records if r["impl"].startswith("grouping.")]
    assert {(r["family"], r["dtype"]) for r in mine} == {("hypothesis", "float64")}, mine
    outcomes = {(r["impl"], r["case"]): r for r in mine}
    assert outcomes["grouping.interleaved", "random_shapes"]["outcome"] == "pass"
    assert outcomes["grouping.undeclared", "random_shapes"]["outcome"] == "fail"
    assert "H=6 H_kv=3" in outcomes["grouping.undeclared", "random_shapes"]["reason"]
    # the inference forms' draws (decode rows with grouped heads) find it too
    assert outcomes["grouping.interleaved", "random_inference"]["outcome"] == "pass"
    assert outcomes["grouping.undeclared", "random_inference"]["outcome"] == "fail"
def test_a_bias_free_plugin_is_given_problems_without_projection_biases():
    from suite.plugins.interface import check_interface, expressible
    from suite.spec.problem import make_problem

    p = make_problem(3, 2, 5, 5, 8, 2)
    assert p.weights.b_q is not None
    biased = NumpyMHA()
    assert expressible(biased, p) is p  # the default keeps the biases
    bias_free = type("NoBias", (NumpyMHA,), {"name": "nb", "projection_bias": False})
    q = expressible(bias_free(), p)
    assert all(getattr(q.weights, b) is None for b in ("b_q", "b_k", "b_v", "b_o"))
    assert q.weights.w_q is p.weights.w_q and q.query is p.query  # nothing else changes
    check_interface(bias_free)
    with pytest.raises(TypeError, match="projection_bias: expected True or False"):
        check_interface(type("Bad", (NumpyMHA,), {"name": "b", "projection_bias": "no"}))
