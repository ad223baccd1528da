"""``mha-suite repro CASE_ID``: a standalone reproducer of one conformance case, for an upstream
bug report.

It runs the case's problem through the plugin once, capturing the arrays the plugin hands
to the library (per-head q, k, v, the mask as ``allowed`` and ``bias``, the scale), and
writes two files to the output folder:

- ``inputs.npz``: those arrays, the float64 oracle's head outputs for them, and the
  same-dtype plain algorithm's error (the best the dtype allows);
- ``repro.py``: a short script that imports only NumPy and the library, calls it on the
  saved arrays the way the plugin does (the plugin's ``repro_code``), and prints the max abs
  error against the oracle's heads.

Only plugins that declare ``repro_code`` (a function ``attend(q, k, v, allowed, bias,
scale)`` over NumPy arrays) and adapt a torch kernel (``TorchCore.attend``) can be captured.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np

from suite import cases, measure, oracle

CASE_ID = re.compile(r"^(?:test_case\[)?(?P<impl>.+?)-(?P<device>cpu|cuda(?::\d+)?)-"
                     r"(?P<dtype>float64|float32|float16|bfloat16)-(?P<family>[a-z_]+)/"
                     r"(?P<case>[a-z0-9_]+)\]?$")

SCRIPT = '''\
"""Reproducer: {impl} ({library}) on case {family}/{case}, {dtype} on {device}.

Written by `mha-suite repro`; needs only NumPy and the library. The arrays in inputs.npz
are exactly what the implementation passed to the library: q (B, H, L, D), k and v
(B, H|K, S, D), allowed (True = may attend) and bias (added to the logits), or none.
"""
from pathlib import Path

import numpy as np
{code}


DTYPE = "{dtype}"  # the arrays are saved in float64 and go to the library in this dtype
DEVICE = "{device}"

data = np.load(Path(__file__).with_name("inputs.npz"))
allowed = data["allowed"] if "allowed" in data else None
bias = data["bias"] if "bias" in data else None
for run in range(2):
    heads = np.asarray(attend(data["q"], data["k"], data["v"], allowed, bias,
                              float(data["scale"])), dtype=np.float64)
    err = np.abs(heads - data["expected"])
    print(f"run {{run + 1}}: max abs error vs the float64 oracle "
          f"{{np.nanmax(err) if not np.isnan(heads).all() else float('nan'):.3g}}, "
          f"{{int(np.isnan(heads).sum())}} NaN of {{heads.size}} "
          f"(the plain algorithm in {dtype}: {{float(data['naive_err']):.3g}})")
'''


class ReproError(ValueError):
    """A case id or implementation that cannot be reproduced standalone (one line)."""


def parse(case_id: str) -> Dict[str, str]:
    """'torch.flex-cpu-float32-shapes/no_projection_bias' (or the test id) -> its parts."""
    m = CASE_ID.match(case_id.strip())
    if not m:
        raise ReproError(f"case id: expected IMPL-DEVICE-DTYPE-FAMILY/CASE as in a test id, "
                         f"e.g. torch.flex-cpu-float32-shapes/no_projection_bias; got {case_id!r}")
    parts = m.groupdict()
    try:
        cases.get(parts["family"], parts["case"])
    except KeyError:
        known = sorted(f"{c.family}/{c.name}" for c in cases.CASES)
        raise ReproError(f"case: expected one of the masking, shapes and numerics cases "
                         f"({', '.join(known)}); got {parts['family']}/{parts['case']}") from None
    return parts


def _array(t: Any) -> np.ndarray:
    """A torch tensor as a float64 NumPy array on the host (torch is not imported here)."""
    return t.detach().to("cpu").double().numpy()


def capture(impl: Any, problem: Any, device: str, dtype: str) -> Dict[str, np.ndarray]:
    """The arrays ``impl`` passes to its library for ``problem``: its ``attend(q, k, v,
    mask, scale, need_weights)`` (a torch-based built-in's core) is spied on for one call."""
    if not callable(getattr(impl, "attend", None)):
        raise ReproError(f"{impl.name}: only plugins built on TorchCore (with an attend "
                         "method) can be captured")
    seen: Dict[str, np.ndarray] = {}
    attend = impl.attend

    def spy(q, k, v, mask, scale, need_weights):
        seen.update(q=_array(q), k=_array(k), v=_array(v), scale=np.float64(scale))
        if mask.bias is not None:
            seen.update(allowed=mask.allowed.cpu().numpy(), bias=_array(mask.bias))
        return attend(q, k, v, mask, scale, need_weights)

    impl.attend = spy
    try:
        measure.prepare(impl, problem, device, dtype).call()  # as a sweep point prepares
    except Exception as exc:  # the library is missing or refuses: one line, not a traceback
        from suite.check import error_text

        raise ReproError(f"{impl.name}: running the case on {device}/{dtype} failed: "
                         f"{error_text(exc)}") from None
    finally:
        del impl.attend
    return seen


def write(impl: Any, case_id: str, out: Path) -> Tuple[Path, Path]:
    """Write ``repro.py`` and ``inputs.npz`` for ``case_id`` into folder ``out``."""
    parts = parse(case_id)
    code = getattr(impl, "repro_code", None)
    if not code:
        raise ReproError(f"{impl.name} has no standalone reproducer (it declares no "
                         f"repro_code); replay the case with mha-suite check -k instead")
    problem = cases.get(parts["family"], parts["case"]).problem()
    arrays = capture(impl, problem, parts["device"], parts["dtype"])
    f = oracle.forward(problem)
    # The per-head reference: the oracle's heads; the plain algorithm's in the same dtype.
    naive = max(float(np.nanmax(np.abs(oracle.forward(problem, ar)["heads"] - f["heads"])))
                for ar in (oracle.Arithmetic(parts["dtype"], o) for o in oracle.ORDERS))
    out.mkdir(parents=True, exist_ok=True)
    inputs = out / "inputs.npz"
    np.savez(inputs, expected=f["heads"], naive_err=np.float64(naive), **arrays)
    script = out / "repro.py"
    script.write_text(SCRIPT.format(library=f"{impl.framework} {impl.framework_version()}",
                                    code=textwrap.dedent(code).strip(), **parts))
    return script, inputs
