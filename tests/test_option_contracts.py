"""Option contracts: an option that is accepted and ignored fails its contract, one that is
honoured passes it, and a sign the problems cannot tell is never a pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from suite.conformance.families import contracts
from suite.conformance.judge import Outcome
from suite.plugins.declarations import Contract
from suite.plugins.interface import check_interface
from tests.conftest import PLUGINS, ROOT, conformance_plugins, planted

FILE = PLUGINS / "option_contracts.py"


def _plugins():
    return planted("option_contracts")


def _judge(impl, dtype: str) -> Outcome:
    (case,) = contracts.cases_of(impl)
    return case.run(impl, Outcome(impl.name, "cpu", dtype, case.family, case.name, case.seed,
                                  "pass"))


@pytest.mark.parametrize("cls, dtype, outcome, says", [
    ("HalfSoftmax", "float16", "pass", "smaller rms error on 16 of 16"),
    ("IgnoresFp32Softmax", "float16", "fail", "bit-identical outputs on all 16 problems"),
    ("Unscaled", "float32", "pass", "differ on all 16 problems"),
    ("IgnoresUnscaled", "float32", "fail", "bit-identical outputs on all 16 problems"),
])
def test_ignored_option_fails_its_contract_and_honoured_one_passes(cls, dtype, outcome, says):
    out = _judge(getattr(_plugins(), cls)(), dtype)
    assert out.outcome == outcome, out.reason
    assert says in out.reason


def test_a_scale_option_ignored_also_breaks_the_rule_at_the_scale_it_gives():
    out = _judge(_plugins().IgnoresUnscaled(), "float32")
    assert "on problem 0 (no mask): fail: output: err" in out.reason


def test_sign_test_counts_and_cannot_tell():
    assert contracts.sign_test(16, 0)[0] == pytest.approx(2.0 ** -16)
    assert contracts.sign_test(8, 8)[0] > contracts.ALPHA
    # An option that moves the error both ways as often: "cannot tell", reported unsupported.
    mod = _plugins()

    class Coin(mod.HalfSoftmax):
        """Closer on the causal problems, farther on the unmasked ones: 8 against 8."""

        name = "coin.fp32_softmax"

        def attend(self, q, k, v, mask, scale, need_weights):
            heads, w = super().attend(q, k, v, mask, scale, need_weights)
            worse = self.fp32_softmax and mask.bias is None
            return (heads * q.dtype.type(1.01) if worse else heads), w

    out = _judge(Coin(), "float16")
    assert out.outcome == "unsupported", out.reason
    assert out.reason.startswith("cannot tell: smaller rms error on 8 of 16 problems, larger "
                                 "on 8"), out.reason


def test_a_contract_outside_its_dtypes_is_unsupported():
    out = _judge(_plugins().HalfSoftmax(), "float32")
    assert out.outcome == "unsupported" and "holds in float16" in out.reason


def test_declarations_are_checked():
    mod = _plugins()
    with pytest.raises(TypeError, match="relation expected one of"):
        check_interface(type("Bad", (mod.HalfSoftmax,), {
            "contracts": (Contract("x", "better", {"fp32_softmax": False}, "r"),)}))
    with pytest.raises(TypeError, match="expected a tuple of Contract"):
        check_interface(type("Bad", (mod.HalfSoftmax,), {"contracts": ("x",)}))
    check_interface(mod.HalfSoftmax)


def test_conformance_records_contracts_like_other_cases(tmp_path):
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance.tests", "-q",
         *conformance_plugins(), "-n", "0", "--conformance-json", str(out), "--plugin",
         str(FILE), "--impl", "bug.fp32_softmax_ignored", "--impl", "ok.fp32_softmax",
         "-k", "test_contract"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    doc = json.loads(out.read_text())
    got = {(r["impl"], r["family"], r["case"], r["outcome"]) for r in doc["results"]}
    assert got == {("bug.fp32_softmax_ignored", "contracts", "fp32_softmax", "fail"),
                   ("ok.fp32_softmax", "contracts", "fp32_softmax", "pass")}, got
    assert proc.returncode == 1
    assert "test_contract[bug.fp32_softmax_ignored-cpu-float16-contracts/fp32_softmax]" \
        in proc.stdout


def test_readme_contract_example_declares_a_checked_contract():
    import re

    text = (ROOT / "docs" / "own-module" / "torch.md").read_text()  # the manual's page
    section = text.split("**Option contracts.**", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert len([line for line in code.splitlines() if line.strip()]) <= 10, code
    scope: dict = {}
    exec(compile(code, "torch.md", "exec"), scope)  # noqa: S102 (the manual's own block)
    cls = scope["Upcast"]
    check_interface(cls)
    (case,) = contracts.cases_of(cls())
    assert (case.family, case.name) == ("contracts", "upcast")
    # NumpyMHA's attend reads no upcast attribute: the contract says the option is ignored.
    out = case.run(cls(), Outcome(cls.name, "cpu", "float16", case.family, case.name,
                                  case.seed, "pass"))
    assert out.outcome == "fail" and "bit-identical outputs on all 16" in out.reason
