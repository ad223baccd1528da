"""What the first GPU run (an H200) found in the suite's own rules: a device condition
``cuda`` must hold on ``cuda:0``, and float32 products on TF32 operands (JAX's and Triton's
default on a GPU) are a declared, checked policy (float32_dots=tf32), not a blanket excuse."""

import numpy as np
import pytest

from suite.conformance import judge
from suite.conformance.cases import get
from suite.plugins.conditions import Where
from suite.plugins.declarations import Deviation
from suite.spec import oracle
from suite.spec.agreement import compare
from tests.plugins import tf32_numpy


def test_a_device_condition_holds_on_every_index_of_that_device():
    cuda = Where(device=frozenset({"cuda"}))
    assert cuda.holds("cuda:0") and cuda.holds("cuda:1") and cuda.holds("cuda")
    assert not cuda.holds("cpu") and not cuda.holds("cpu-interpret")
    assert not Where(device=frozenset({"cpu"})).holds("cpu-interpret")


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0**-10)  # TF32's spacing at 1.0
    x = np.array([one + ulp / 4, one + 3 * ulp / 4, one + ulp / 2, one + 3 * ulp / 2,
                  np.inf, -np.inf, np.nan], np.float32)
    got = oracle.round_to(x, "tf32")
    assert got[:4].tolist() == [1.0, 1.0 + 2.0**-10, 1.0, 1.0 + 2 * 2.0**-10]  # ties to even
    assert np.isposinf(got[4]) and np.isneginf(got[5]) and np.isnan(got[6])
    assert oracle.UNIT_ROUNDOFF["tf32"] == 2.0**-11


def _outcomes(impl, names):
    return {n: judge.run_case(impl, impl.name, "cpu", "float32", get(*n.split("/"))) for n in names}


@pytest.mark.parametrize("name", ["shapes/odd_lengths", "masking/combined", "numerics/large_logits",
                                  "masking/causal_bottom_right_long_query"])
def test_tf32_products_fail_the_float32_rule_unless_declared_and_then_are_checked(name):
    undeclared = _outcomes(tf32_numpy.Tf32Undeclared(), [name])[name]
    declared = _outcomes(tf32_numpy.Tf32Declared(), [name])[name]
    assert undeclared.outcome == "fail", undeclared.reason
    assert declared.outcome == "deviation", declared.reason
    assert "float32_dots=tf32" in declared.reason and "float32_dots" in declared.policies_used


def test_the_tf32_policy_does_not_excuse_a_real_bug():
    for name in ("masking/combined", "masking/causal_bottom_right_long_query"):
        out = _outcomes(tf32_numpy.Tf32IgnoresMask(), [name])[name]
        assert out.outcome == "fail" and "nor does it follow the declared policy" in out.reason


def test_a_tf32_policy_for_cuda_does_not_hold_on_the_cpu():
    class OnCuda(tf32_numpy.Tf32Undeclared):
        name = "tf32.cuda_only"
        deviations = {"float32_dots": Deviation("tf32", "on a GPU only",
                                                Where(device=frozenset({"cuda"})))}

    assert _outcomes(OnCuda(), ["shapes/odd_lengths"])["shapes/odd_lengths"].outcome == "fail"


def test_the_tf32_bound_separates_what_the_h200_measured():
    """Errors recorded on an NVIDIA H200 (jax 0.11.2, triton 3.6.0): JAX's TF32 errors equal
    the TF32 naive's and pass; the masking errors of jax.nn there stay far outside."""
    measured = {("shapes", "length_1"): (0.0011, 17.3), ("masking", "causal_bottom_right_long_query"):
                (0.00149, 0.761), ("tiles", "masked_blocks_bool"): (0.000492, 0.229)}
    for (family, name), (tf32_err, bug_err) in measured.items():
        p = get(family, name).problem()
        ref, _ = oracle.oracle(p)
        naive = [n[0] for n in oracle.baselines(p, "float32", dots="tf32")]
        model, _ = oracle.first_order(p, "float32", dots="tf32")
        c = compare("output", ref, ref, naive, "float32", model=model)
        plain = compare("output", ref, ref, [n[0] for n in oracle.baselines(p, "float32")],
                        "float32", model=oracle.first_order(p, "float32")[0])
        assert plain.bound < tf32_err <= c.bound < bug_err / 10, (name, plain.bound, c.bound)


def _pinned_flash(monkeypatch, raise_with: str):
    pytest.importorskip("torch")
    import warnings

    from implementations.torch import sdpa as torch_sdpa

    def refuses(*args, **kwargs):
        warnings.warn("Flash attention kernel not used because:", stacklevel=2)
        warnings.warn("Flash attention requires the head dimension to be a multiple of 8 "
                      "(Triggered internally at sdp_utils.cpp:1)", stacklevel=2)
        raise RuntimeError(raise_with)

    flash = torch_sdpa._variant("flash", torch_sdpa.kernel_context("flash"), {"cpu": ["float32"]},
                                torch_sdpa.FORMS[1:])
    monkeypatch.setattr(torch_sdpa, "_sdpa", refuses)
    return flash()


def test_a_pinned_sdpa_backend_without_a_kernel_for_the_call_is_unsupported_with_torchs_reason(
        monkeypatch):
    """On CUDA, torch's efficient and cuDNN backends refuse head widths and mask layouts call
    by call ("No available kernel"): 43 such errors in the first GPU run."""
    impl = _pinned_flash(monkeypatch, "No available kernel. Aborting execution.")
    out = judge.run_case(impl, impl.name, "cpu", "float32", get("shapes", "odd_lengths"))
    assert out.outcome == "unsupported", out.reason
    assert "no flash kernel" in out.reason and "multiple of 8" in out.reason
    assert "Triggered internally" not in out.reason and "not used because" not in out.reason


def test_any_other_error_of_a_pinned_sdpa_backend_stays_an_error(monkeypatch):
    impl = _pinned_flash(monkeypatch, "(*bias): last dimension must be contiguous")
    out = judge.run_case(impl, impl.name, "cpu", "float32", get("shapes", "odd_lengths"))
    assert out.outcome == "error" and "last dimension must be contiguous" in out.reason


class _LibraryNYI(tf32_numpy.Tf32Declared):
    """Calls into the standard library, which raises NotImplementedError (an abstract
    property), as torch's inductor does for FlexAttention head widths under 16 on CUDA."""

    name = "nyi.library"

    def attend(self, q, k, v, mask, scale, need_weights):
        import numbers

        numbers.Complex.real.fget(None)


class _OwnNYI(tf32_numpy.Tf32Declared):
    name = "nyi.own"

    def attend(self, q, k, v, mask, scale, need_weights):
        raise NotImplementedError("the plugin's own stub")


def test_a_library_that_does_not_implement_a_call_makes_it_unsupported_a_plugin_stub_an_error():
    lib = judge.run_case(_LibraryNYI(), "nyi.library", "cpu", "float32", get("shapes", "odd_lengths"))
    own = judge.run_case(_OwnNYI(), "nyi.own", "cpu", "float32", get("shapes", "odd_lengths"))
    assert lib.outcome == "unsupported" and "does not implement" in lib.reason, lib.reason
    assert "inside the standard library" in lib.reason
    assert own.outcome == "error" and "in the plugin" in own.reason, own.reason


def _fresh(code: str) -> str:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_triton_kernels_stay_interpretable_after_torch_compile_imported_triton():
    """torch.compile's has_triton() imports triton; before the fix, a later triton.flash call
    in the same process (an xdist worker that ran a compile test first) raised "Cannot call
    @triton.jit'd outside of the scope of a kernel" (tl.max decorated for a compiler)."""
    pytest.importorskip("triton")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU compiles Triton kernels: nothing is interpreted")
    out = _fresh(
        "from implementations.torch import common\n"  # any torch plugin comes first
        "from torch.utils._triton import has_triton; has_triton()\n"
        "from implementations.kernels.triton_flash import TritonFlash\n"
        "from suite.conformance import judge; from suite.conformance.cases import get\n"
        "o = judge.run_case(TritonFlash(), 'triton.flash', 'cpu-interpret', 'float32',"
        " get('masking', 'causal_bottom_right_long_query'))\n"
        "print(o.outcome, o.reason)\n")
    assert out.startswith("pass"), out


def test_triton_imported_before_the_interpreter_was_chosen_is_unavailable_with_the_reason():
    pytest.importorskip("triton")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU compiles Triton kernels: nothing is interpreted")
    out = _fresh(
        "import triton.language\n"  # imported by something else, before any torch plugin
        "from implementations.kernels.triton_flash import TritonFlash\n"
        "from suite.plugins.interface import Unavailable\n"
        "try:\n    TritonFlash()\nexcept Unavailable as exc:\n    print('unavailable:', exc)\n")
    assert out.startswith("unavailable:") and "TRITON_INTERPRET=1" in out, out
