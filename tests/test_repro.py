"""Every standalone reproducer under docs/repro/ runs, and still shows its behaviour on the
pinned versions. One that runs but no longer shows it is reported (a warning naming it and
what it printed, and a line in ``repro-status.json`` under pytest's temporary folder), not
failed and not deleted: a library that fixed a bug is news, and the findings catalogue keeps
the record."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings

import pytest

from tests.conftest import ROOT

REPRO = ROOT / "docs" / "repro"

# folder -> (the library it needs, extra environment, what its output says when it shows the
# behaviour). A new reproducer adds its line here (a test checks that every folder has one).
SHOWS = {
    # fixed in openvino 2025.3: on newer pins it prints "ok" (2025.0-2025.2 print BUG)
    "openvino-sdpa-bool-mask-inverted": ("openvino", {}, r"^BUG$|^ok$"),
    "flax-causal-broadcast-mask": ("flax", {}, r"explicit path raises"),
    # fixed by onnx 1.23 (1.19.0 prints BUG for all seven, 1.20.1 for five; 1.23.2: ok)
    "onnx-reference-attention-1.19-1.20": ("onnx", {}, r" BUG$|^7 .* ok$"),
    # fixed by onnxruntime 1.25, 1.27 and 1.28 (1.24.1 prints BUG for all nine, 1.27.0 for
    # five; 1.28.0-1.32.0: ok)
    "onnxruntime-attention-1.24-1.27": ("onnxruntime", {}, r" BUG|^9 .* ok$"),
    # fixed by onnxruntime 1.24 (1.23.0-1.23.2 print BUG for all three; 1.24.1-1.32.0: ok)
    "onnxruntime-gqa-window-1.23": ("onnxruntime", {}, r"  BUG  |^3 decode.*  ok  "),
    # fixed in transformers 5.2: on newer pins it prints "ok" (the behaviour is gone there)
    "hf-gpt2-eager-causal-buffer": ("transformers", {}, r"vs unmasked attention [1-9]|^ok$"),
    "hf-gpt2-scale-by-layer-fp16-overflow": (
        "transformers", {}, r"eager reorder_and_upcast_attn=False: NaN in [1-9]"),
    "hf-gpt2-upcast-dtypes": ("transformers", {}, r"float64 with a mask raises"),
    "hf-packed-position-ids": ("transformers", {}, r"GptOssModel: .*attends the first sequence"),
    "keras-query-mask-ignored": ("keras", {"KERAS_BACKEND": "torch"},
                                 r"query_mask argument: max change of the output 0\.0 "),
    "pallas-gpu-causal-long-query": ("jax", {}, r"WRONG"),
    "pallas-gpu-decode-nan-padding": ("jax", {}, r"padded keys *: .*\[True"),
    # compiled for a GPU only (its interpreter, which a CPU runs, is right)
    "pallas-gpu-decode-cuda": ("jax", {}, r"compiled kernel WRONG"),
    "pallas-gpu-paged-cuda": ("jax", {}, r"compiled WRONG"),
    "jax-nn-float16-lengths-cuda": ("jax", {}, r"^float16 .*Lq=1 H=4 K=4 .*: \w*Error"),
    "pallas-tpu-masked-first-block": ("jax", {}, r"-inf: row 0 NaN: True"),
    "pallas-tpu-nan-padding": ("jax", {}, r"filled with nan: NaN in [1-9]"),
    "pallas-tpu-paged-bf16-pages": ("jax", {}, r"float32 pages: max error vs attention over "
                                               r"the float32 pages [1-9]\.\d+e-0[1-4]"),
    # CPUs with AVX-512 BF16 / AMX only (oneDNN picks its bfloat16 GEMM by the CPU's flags)
    "torch-bf16-matmul-odd-k-nan-row": ("torch", {}, r"NaN leaked into another row"),
    "torch-compile-fuse-attention-dynamic-scale": (
        "torch", {}, r"with a mask, 1/scale 2\.0: BackendCompilerFailed"),
    "torch-flex-nan-rows-zeroed": ("torch", {}, r"compiled flex = .*\(0 NaN"),
    # not the same shapes from one process to the next: a run may miss it
    "torch-flex-small-shapes": ("torch", {}, r"oracle (?:nan|[0-9.]+e-0[0-3]\b)|[1-9]\d* NaN of"),
    "torch-nn-fast-path-drops-is-causal": ("torch", {}, r"is_causal alone .* vs no mask: 0$"),
    # the AVX2 kernels only (default and AVX-512 give NaN): forced to AVX2, as any x86 CPU can
    "torch-sdpa-half-inf-mask-zero-row": ("torch", {"ATEN_CPU_CAPABILITY": "avx2"},
                                          r"torch\.(?:float16|bfloat16) .*\(0 NaN"),
    "torch-sdpa-nan-query-short-keys": ("torch", {}, r"NaN query row not NaN at key lengths"),
    "triton-interpret-bf16-dot": ("triton", {}, r"bfloat16: .*WRONG"),
    "sdpa-negative-scale-nan-cuda": ("torch", {}, r"(?:FLASH|CUDNN)_ATTENTION +negative scale: NaN in [1-9]"),
}
# Behaviours of GPU kernels: their reproducers run where torch sees a CUDA device.
CUDA_ONLY = {"sdpa-negative-scale-nan-cuda", "pallas-gpu-decode-cuda", "pallas-gpu-paged-cuda",
             "jax-nn-float16-lengths-cuda"}


# These run at the native level only: inductor generates its own code for the first three (the
# suite leaves per-shape compilers out of the lower levels: inductor's C++ does not build
# there); the last is a mask built in Python, the same at every level.
NATIVE_ONLY = {"torch-flex-nan-rows-zeroed", "torch-flex-small-shapes",
               "torch-compile-fuse-attention-dynamic-scale", "hf-packed-position-ids"}


class ReproducerStopped(UserWarning):
    """A reproducer that runs but no longer shows its behaviour here."""


def test_every_reproducer_has_a_readme_a_script_and_an_expectation():
    folders = sorted(p.name for p in REPRO.iterdir() if p.is_dir())
    assert folders == sorted(SHOWS), "add the new reproducer's line to SHOWS"
    for name in folders:
        assert (REPRO / name / "README.md").exists() and (REPRO / name / "repro.py").exists(), name


def _levels(name: str, library: str) -> list:
    """The torch CPU levels to run a torch reproducer at (its behaviour may live in one)."""
    if library not in ("torch", "transformers") or name in NATIVE_ONLY:
        return [None]
    from suite.plugins import isa

    return list(isa.machine_levels()) or [None]


# Slow (nox -s check_full): each reproducer runs at every CPU level in processes of its own
# (170 s of CI's pytest step); whether a library still shows a behaviour is a verdict of the
# whole matrix's run, and CI's covering check holds the known-failure entries themselves.
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHOWS))
def test_reproducer_still_shows_its_behaviour(name, tmp_path_factory):
    library, env, shows = SHOWS[name]
    if importlib.util.find_spec(library) is None:  # not imported here: keras binds a backend
        pytest.skip(f"{library} is not installed")
    if name in CUDA_ONLY:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("a CUDA kernel's behaviour: needs a CUDA device")
    shown, outputs = [], {}
    for level in _levels(name, library):
        run_env = {**os.environ, **env, **({"ATEN_CPU_CAPABILITY": level} if level else {})}
        done = subprocess.run([sys.executable, str(REPRO / name / "repro.py")], cwd=ROOT,
                              env=run_env, capture_output=True, text=True, timeout=600)
        # A reproducer that cannot run at all is broken, not news.
        assert "Traceback" not in done.stderr or re.search(shows, done.stdout, re.M), (
            f"{name} crashed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        outputs[level or "native"] = done.stdout
        if re.search(shows, done.stdout, re.M):
            shown.append(level or "native")
    status = tmp_path_factory.getbasetemp() / "repro-status.json"
    record = json.loads(status.read_text()) if status.exists() else {}
    record[name] = {"shows_at": shown, "ran_at": sorted(outputs)}
    status.write_text(json.dumps(record, indent=1))
    if not shown:
        warnings.warn(ReproducerStopped(
            f"docs/repro/{name} no longer shows its behaviour here (levels "
            f"{sorted(outputs)}); it printed:\n" + "\n".join(outputs.values())[-1500:]), stacklevel=2)
