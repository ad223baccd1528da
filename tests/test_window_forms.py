"""The window mask forms (``local_window``, ``chunked_causal``): the form's sizes are read back
from the canonical mask exactly, and a library's window code path given wrong sizes fails.

The planted bugs are the mistakes an adapter makes with window sizes: one side off by one,
the query offset of a window wrong, a chunk size off by one, left and right swapped.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from suite.conformance.families import mask_forms
from suite.conformance.judge import Outcome
from suite.plugins import adapters
from suite.plugins.interface import Unsupported
from suite.spec.problem import Mask, make_problem
from tests.conftest import ROOT

CASES = {c.form: c for c in mask_forms.CASES}


def test_the_window_forms_read_their_sizes_from_the_canonical_mask():
    window = adapters.form_mask(adapters.with_form(CASES["local_window"].problem(),
                                                   "local_window"))
    assert window.window == mask_forms.WINDOW == (37, 11) and window.attn is None
    p = CASES["local_window+kv_lengths"].problem()
    both = adapters.form_mask(adapters.with_form(p, "local_window+kv_lengths"))
    assert both.window == (37, 11) and both.kv_lengths.tolist() == [171, 205]
    chunk = adapters.form_mask(adapters.with_form(CASES["chunked_causal"].problem(),
                                                  "chunked_causal"))
    assert chunk.chunk == mask_forms.CHUNK == 48 and mask_forms.WINDOW_L % 48  # last partial
    # A window of other sizes and L > S, and a plain causal mask as one chunk of L.
    band = adapters.window_allowed(9, 7, 0, 3)[None, None]
    assert adapters.form_mask(make_problem(0, 1, 9, 7, mask=Mask(allowed=band)),
                              "local_window").window == (0, 3)
    causal = make_problem(0, 1, 9, 7, mask=Mask(causal=True))
    assert adapters.form_mask(causal, "chunked_causal").chunk == 9
    assert adapters.form_mask(causal, "local_window").window == (8, 0)


def test_a_mask_that_is_no_window_is_refused():
    band = adapters.window_allowed(9, 12, 2, 3)
    holed = band.copy()
    holed[4, 4] = False
    with pytest.raises(Unsupported, match="not a sliding window"):
        adapters.form_mask(make_problem(0, 1, 9, 12, mask=Mask(allowed=holed)), "local_window")
    across = adapters.chunked_causal_allowed(9, 9, 3)
    across[7, 2] = True  # row 7 (chunk 2) sees key 2 (chunk 0)
    with pytest.raises(Unsupported, match="not causal within chunks"):
        adapters.form_mask(make_problem(0, 1, 9, 9, mask=Mask(allowed=across)),
                           "chunked_causal")
    with pytest.raises(Unsupported, match="varies along axis B"):
        varying = np.stack([band, adapters.window_allowed(9, 12, 1, 3)])[:, None]
        adapters.form_mask(make_problem(0, 2, 9, 12, mask=Mask(allowed=varying)),
                           "local_window")


def _outcome(impl, form: str) -> Outcome:
    device = impl.devices()[0]
    out = Outcome(impl.name, device, "float32", "test", form, 0, "pass")
    return CASES[form].run(impl, out)


def test_jax_nn_takes_the_window_sizes_in_order():
    pytest.importorskip("jax")
    from implementations.jax.nn import JaxNN

    class Swapped(JaxNN):  # a planted translation bug: local_window_size=(right, left)
        name = "bug.jax_nn_swapped_window"

        def attend(self, q, k, v, mask, scale, need_weights):
            form = mask.form._replace(window=mask.form.window[::-1])
            return super().attend(q, k, v, mask.replace(form=form), scale, need_weights)

    for form in ("local_window", "local_window+kv_lengths", "local_window+causal_flag"):
        right = _outcome(JaxNN(), form)
        assert right.outcome == "pass", (form, right.outcome, right.reason)
        assert _outcome(Swapped(), form).outcome == "fail", form


PALLAS = ROOT / "implementations" / "kernels" / "pallas.py"
LOCAL = "sa.LocalMask(shape, window_size=form.window, offset=0)"
CHUNKED = "sam.ChunkedCausalMask(shape, chunk_size=form.chunk)"
SPLASH_WINDOW_BUGS = {  # name -> (source text, its buggy replacement, the form that catches it)
    "right_off_by_one": (LOCAL, "sa.LocalMask(shape, window_size=(form.window[0], "
                                "form.window[1] + 1), offset=0)", "local_window"),
    "offset_off_by_one": (LOCAL, "sa.LocalMask(shape, window_size=form.window, offset=1)",
                          "local_window"),
    "chunk_off_by_one": (CHUNKED, "sam.ChunkedCausalMask(shape, chunk_size=form.chunk + 1)",
                         "chunked_causal"),
}


def _splash_from(tmp_path, name: str, source: str):
    path = tmp_path / f"pallas_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"pallas_window_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PallasTpuSplash()


def test_planted_splash_window_bugs_fail_under_the_interpreter(tmp_path):
    """The right adapter passes a window and a chunked case; each planted bug fails its case
    (5 interpreted splash runs, about 20 s on 2 cores)."""
    pytest.importorskip("jax")
    from implementations.kernels.pallas import PallasTpuSplash

    for form in ("local_window", "chunked_causal"):
        right = _outcome(PallasTpuSplash(), form)
        assert right.outcome == "pass", (form, right.outcome, right.reason)
    source = PALLAS.read_text()
    for bug, (text, wrong, form) in SPLASH_WINDOW_BUGS.items():
        assert source.count(text) == 1, f"the adapter no longer has {text!r}"
        buggy = _splash_from(tmp_path, bug, source.replace(text, wrong))
        got = _outcome(buggy, form)
        assert got.outcome == "fail", (bug, got.outcome, got.reason)
