"""Kernels run by their interpreters (device cpu-interpret) are checked, never timed."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from suite.conformance.summary import matrix_lines
from suite.plugins.interface import INTERPRETED_CPU, interpreted
from tests.conftest import ROOT, conformance_plugins

TINY = ["--preset", "ci", "--lengths", "16", "--heads", "1", "--mask", "none", "--head-dim", "8",
        "--max-time", "0.01", "--min-rounds", "2"]


def test_the_interpreted_device_is_named_and_recognised():
    assert interpreted(INTERPRETED_CPU) and not interpreted("cpu") and not interpreted("cuda:0")


def test_the_matrix_marks_interpreted_rows():
    rows = [{"impl": "k", "device": INTERPRETED_CPU, "family": "masking", "outcome": "pass"},
            {"impl": "n", "device": "cpu", "family": "masking", "outcome": "pass"}]
    text = "\n".join(matrix_lines(rows))
    assert "k (interpreted)" in text and "n (interpreted)" not in text


def test_a_sweep_never_times_an_interpreted_kernel(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", "--out", str(tmp_path),
                           *TINY, "--impl", "triton.flash", "--impl", "numpy"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "sweep-ci.json").read_text())
    timed = {b["extra_info"]["impl"] for b in doc["benchmarks"]}
    assert timed == {"numpy"}  # the control is timed; the interpreted kernel is not
    skipped = [x for x in doc["mha_suite_not_measured"] if x["impl"] == "triton.flash"]
    assert skipped and all(x["status"] == "skipped" and "interpreted" in x["reason"]
                           and x["device"] == INTERPRETED_CPU for x in skipped), skipped


PALLAS = ROOT / "implementations" / "kernels" / "pallas.py"
SPLASH_BUGS = {  # name -> (source text, its buggy replacement, the case that must catch it)
    # Bottom-right causal mapped like top left (CausalMask offset 0 for every alignment).
    "bottom_right_offset": ('offset=0 if parts.causal == "top_left" else S - L)', "offset=0)",
                            "causal_bottom_right_short_query"),
    # Key padding dropped from the segment ids: padded keys in the queries' segment.
    "key_padding_segments": ("keep = np.ones((B, S), bool) if parts.key_padding is None else "
                             "parts.key_padding", "keep = np.ones((B, S), bool)", "valid_lens"),
    # Every head given head 0's mask in the MultiHeadMask.
    "mask_per_head": ("sa.NumpyMask(m[h % m.shape[0]])", "sa.NumpyMask(m[0])", "bool_mask"),
}
SPLASH_PLUGIN = """
import importlib.util
spec = importlib.util.spec_from_file_location("buggy_pallas_{name}", {path!r})
buggy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(buggy)


class Buggy(buggy.PallasTpuSplash):
    name = "bug.splash_{name}"
"""


def test_planted_splash_mask_mapping_bugs_fail_under_the_interpreter(tmp_path):
    pytest.importorskip("jax")
    source = PALLAS.read_text()
    args = []
    for bug, (right, wrong, _) in SPLASH_BUGS.items():
        assert source.count(right) == 1, f"the adapter no longer has {right!r}"
        (tmp_path / f"pallas_{bug}.py").write_text(source.replace(right, wrong))
        plugin = tmp_path / f"plugin_{bug}.py"
        plugin.write_text(SPLASH_PLUGIN.format(name=bug, path=str(tmp_path / f"pallas_{bug}.py")))
        args += ["--plugin", str(plugin), "--impl", f"bug.splash_{bug}"]
    out = tmp_path / "conformance.json"
    # Each buggy plugin runs only the case that must catch it (the right adapter passes
    # them all in `mha-suite check`): 3 interpreted cases.
    cases = " or ".join(f"(splash_{bug} and masking/{case}])"
                        for bug, (_, _, case) in SPLASH_BUGS.items())
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance.tests", "-q",
         *conformance_plugins(), "--conformance-json", str(out), *args, "--dtype", "float32",
         "-k", f"test_case and ({cases})"],  # about 45 s on 2 cores
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    outcome = {(r["impl"], r["case"]): r["outcome"] for r in results}
    assert {r["device"] for r in results} == {INTERPRETED_CPU}
    for bug, (_, _, case) in SPLASH_BUGS.items():
        mine = {c: o for (i, c), o in outcome.items() if i == f"bug.splash_{bug}"}
        assert mine == {case: "fail"}, (bug, mine)


def _decode_outcome(impl, problem):
    from suite.conformance.judge import Outcome, run_problem

    out = Outcome(impl.name, INTERPRETED_CPU, "float32", "test", "decode", 0, "pass")
    return run_problem(impl, out, problem)


def test_pallas_decode_key_lengths_and_gqa_agree_with_the_oracle():
    """One query against 300 keys (16 splits of the padded 304, the split-K path), GQA
    (4 query heads on 2 kv heads), key lengths 300, 37 and 0 (a row with no key: zeros)."""
    pytest.importorskip("jax")
    from implementations.kernels.pallas import PallasGpuDecode
    from suite.spec.problem import Mask, make_problem

    class LengthsIgnored(PallasGpuDecode):  # a planted translation bug: kv_seq_len dropped
        name = "bug.decode_lengths"

        def attend(self, q, k, v, mask, scale, need_weights):
            return super().attend(q, k, v, mask.replace(dead_keys=None), scale, need_weights)

    p = make_problem(7, 3, 1, 300, 32, 4, 2, mask=Mask(valid_lens=np.array([300, 37, 0])))
    right = _decode_outcome(PallasGpuDecode(), p)
    assert right.outcome == "pass", (right.outcome, right.reason, right.comparisons)
    assert _decode_outcome(LengthsIgnored(), p).outcome == "fail"


def _splash_gradient_outcome(impl, case_name, problem=None):
    from suite.conformance.catalog import get
    from suite.conformance.judge import Outcome

    case = get("gradients", case_name)
    out = Outcome(impl.name, INTERPRETED_CPU, "float32", "test", case_name, case.seed, "pass")
    return case.run(impl, out) if problem is None else case.judge_problem(impl, out, problem)


def test_pallas_splash_gradients_through_its_mqa_form_and_its_fused_backward():
    """The gradients family's GQA case has K = 2 kv heads (splash's MHA form): K = 1 runs its
    MQA form (make_splash_mqa_single_device); its fused backward (one dq/dkv kernel,
    use_fused_bwd_kernel) runs gradients/masked. Both against the float64 oracle (k = 3)."""
    pytest.importorskip("jax")
    import dataclasses

    from implementations.kernels.pallas import PallasTpuSplash
    from suite.spec.problem import make_problem

    class FusedBackward(PallasTpuSplash):
        name = "splash.fused_backward"

        def block_sizes(self, Lp):
            blocks = super().block_sizes(Lp)
            return dataclasses.replace(blocks, block_q_dq=None, block_kv_dq=None,
                                       use_fused_bwd_kernel=True) if self.grad else blocks

    mqa = make_problem(11, 2, 6, 6, 32, 4, 1)  # H = 4 query heads on one kv head
    for impl, case, p in [(PallasTpuSplash(), "gqa", mqa), (FusedBackward(), "masked", None)]:
        got = _splash_gradient_outcome(impl, case, p)
        assert got.outcome == "pass", (impl.name, case, got.outcome, got.reason)


def test_a_planted_splash_backward_bug_fails_under_the_interpreter():
    """dq without the scale (q reaches the kernel as q * scale; the planted q has q's value
    and d/dq = 1 / scale): the forward is unchanged, so masking/none passes, and the
    gradients of the query and its projection fail gradients/plain."""
    pytest.importorskip("jax")
    import jax

    from implementations.kernels.pallas import PallasTpuSplash
    from suite.conformance.catalog import get
    from suite.conformance.judge import Outcome

    class ScaleDroppedInDq(PallasTpuSplash):
        name = "bug.splash_dq_scale"

        def attend(self, q, k, v, mask, scale, need_weights):
            q = q / scale + jax.lax.stop_gradient(q - q / scale)  # value q, d/dq = 1 / scale
            return super().attend(q, k, v, mask, scale, need_weights)

    forward = get("masking", "none")
    out = Outcome("bug", INTERPRETED_CPU, "float32", "test", "none", forward.seed, "pass")
    assert forward.run(ScaleDroppedInDq(), out).outcome == "pass", out.reason
    got = _splash_gradient_outcome(ScaleDroppedInDq(), "plain")
    assert got.outcome == "fail" and "grad query" in got.reason, (got.outcome, got.reason)


TPU_FLASH_DQ_SCALE = (  # the dq kernel's scaling of ds, and the planted bug: it is dropped
    "    if sm_scale != 1.0:\n      ds = ds * sm_scale\n",
    "    pass  # planted: dq without sm_scale\n")


def test_a_planted_tpu_flash_backward_bug_fails_under_the_interpreter(tmp_path, monkeypatch):
    """The library's flash_attention module with its dq kernel's ``ds * sm_scale`` dropped
    (the forward and dkv kernels unchanged): masking/none still passes, and the gradients of
    the query and its projection fail gradients/plain."""
    pytest.importorskip("jax")
    import importlib.util

    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    from implementations.kernels.pallas import PallasTpuFlash
    from suite.conformance.catalog import get
    from suite.conformance.judge import Outcome

    right, wrong = TPU_FLASH_DQ_SCALE
    source = open(fa.__file__).read()
    assert source.count(right) == 1, f"the kernel's source no longer has {right!r}"
    path = tmp_path / "buggy_flash_attention.py"
    path.write_text(source.replace(right, wrong))
    spec = importlib.util.spec_from_file_location("buggy_flash_attention", path)
    buggy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, buggy)  # its dataclasses look themselves up
    spec.loader.exec_module(buggy)

    class ScaleDroppedInDq(PallasTpuFlash):
        name = "bug.tpu_flash_dq_scale"

        def kernel(self):
            return buggy.flash_attention

    forward = get("masking", "none")
    out = Outcome("bug", INTERPRETED_CPU, "float32", "test", "none", forward.seed, "pass")
    assert forward.run(ScaleDroppedInDq(), out).outcome == "pass", out.reason
    got = _splash_gradient_outcome(ScaleDroppedInDq(), "plain")
    assert got.outcome == "fail" and "grad query" in got.reason, (got.outcome, got.reason)
    failed = {c.what for c in got.comparisons if not c.passed}
    assert failed <= {"grad query", "grad w_q", "grad b_q"}, failed  # dk and dv are intact


def test_splash_caps_its_logits_packed_or_not_and_without_the_cap_fails():
    """Splash's attn_logits_soft_cap carries the problem's cap (#50 item 3: a kernel that
    takes a variant runs it in the inference forms it has): Gemma 2's cap beside causal
    padding, and padding-free (packed causal documents), pass under the interpreter; the
    same plugin building its kernels without the cap fails both."""
    pytest.importorskip("jax")
    from implementations.kernels.pallas import PallasTpuSplash
    from suite.conformance.catalog import get
    from suite.conformance.judge import Outcome

    class Uncapped(PallasTpuSplash):
        name = "bug.splash_uncapped"

        def check_shapes(self, problem, device):
            super().check_shapes(dataclasses.replace(problem, softcap=None), device)

    def run(impl, family, name):
        case = get(family, name)
        return case.run(impl, Outcome(impl.name, INTERPRETED_CPU, "float32", family, name,
                                      case.seed, "pass"))

    for family, name in (("variants", "softcap_self_causal_padding"),
                         ("packed", "softcap_causal_docs")):
        right = run(PallasTpuSplash(), family, name)
        assert right.outcome == "pass", (name, right.reason)
        wrong = run(Uncapped(), family, name)
        assert wrong.outcome == "fail", (name, wrong.outcome, wrong.reason)
