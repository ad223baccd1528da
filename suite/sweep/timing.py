"""Measurement helpers for sweeps: FLOPs, threads, matmul peak, peak memory, memory budget.

Frameworks are imported inside the functions that need them, and only when
already imported by a plugin (``sys.modules``), so nothing here pulls one in.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from suite.results.environment import cpu_model, library_versions
from suite.sweep.point import Point

BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


# --- FLOPs ---------------------------------------------------------------------------------
def flops(point: Point) -> Dict[str, float]:
    """The point's FLOPs: forward, x3.5 with the backward (which costs 2.5x the forward).

    attention = 4·B·H·L·S·D (q·k and p·v, 2 FLOPs a multiply-add), halved when causal;
    projections = 2·B·(L·E·H·D + 2·S·E·K·D + L·H·D·E).
    """
    B, L, S, H, K, D, E = point.B, point.L, point.S, point.H, point.K, point.D, point.E
    attention = 4.0 * B * H * L * S * D * (0.5 if point.causal else 1.0)
    projections = 2.0 * B * (L * E * H * D + 2 * S * E * K * D + L * H * D * E)
    factor = 3.5 if point.grad else 1.0
    return {"flops_attention": attention * factor, "flops_projections": projections * factor,
            "flops": (attention + projections) * factor}


# --- timing a point ----------------------------------------------------------------------
PEDANTIC_MIN_S = 0.005  # a call at least this long is timed one call a round, uncalibrated


# When a point's rounds spread too widely for the report's comparisons (the ranking's
# speed-ups between medians, the baseline's quartile test), the point is flagged "noisy":
# - its interquartile range is over 20% of its median: a ratio of two such medians can be
#   off by 10% or more, and the baseline comparison calls any change under ~20% noise;
#   on an idle core the rounds of one point sit within a few percent of each other;
# - or over 10% of its rounds are outliers beyond Tukey's fences (1.5 IQR past the
#   quartiles): steady timings put under 1% there, so a tenth means the rounds were
#   interrupted (another process, more threads than free cores). Judged from 10 rounds on.
NOISY_IQR_SHARE = 0.20
NOISY_OUTLIER_SHARE = 0.10
NOISY_MIN_ROUNDS_FOR_OUTLIERS = 10
NOISY_ADVICE = "re-run it on an idle machine or with --threads 1"


def spread(median_s: float, iqr_s: float, iqr_outliers: int, rounds: int) -> Dict[str, Any]:
    """A point's spread over its rounds: IQR / median, the share of rounds outside Tukey's
    fences, and why it is too noisy for the report's comparisons (None when it is not)."""
    iqr_share = iqr_s / median_s if median_s > 0 else float("inf")
    outlier_share = iqr_outliers / rounds if rounds else 0.0
    why = []
    if iqr_share > NOISY_IQR_SHARE:
        why.append(f"IQR {100 * iqr_share:.0f}% of the median (> {100 * NOISY_IQR_SHARE:.0f}%)")
    if rounds >= NOISY_MIN_ROUNDS_FOR_OUTLIERS and outlier_share > NOISY_OUTLIER_SHARE:
        why.append(f"{iqr_outliers} of {rounds} rounds outliers "
                   f"(> {100 * NOISY_OUTLIER_SHARE:.0f}%)")
    return {"iqr_share": iqr_share, "outlier_share": outlier_share, "rounds": rounds,
            "noisy": "; ".join(why) or None}


def run_benchmark(benchmark: Any, fn: Callable[[], Any], warm_s: float,
                  options: Dict[str, Any]) -> str:
    """Time ``fn`` with pytest-benchmark's fixture, after the caller's one untimed call of
    ``fn`` (the warm-up whose output was checked) took ``warm_s`` seconds.

    A call of at least ``PEDANTIC_MIN_S``: pedantic mode, one call a round and
    max(min_rounds, ceil(max_time / warm_s)) rounds, as pytest-benchmark chooses them from
    its calibration. The checked call was the warm-up, so there is no other: the calibrated
    mode would add two untimed calls to calibrate (one with its warm-up on), a warm-up round,
    and one more call after the rounds for the return value, which for a 100 ms call cost
    more than its timed rounds. A shorter call: the calibrated mode (loops per round chosen
    from the timer's precision, and its warm-up), whose extra calls cost little there.
    Returns the mode used.
    """
    if warm_s >= PEDANTIC_MIN_S:
        rounds = max(int(options["min_rounds"]), math.ceil(options["max_time"] / warm_s))
        benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)
        return "pedantic"
    benchmark(fn)
    return "calibrated"


# --- threads -------------------------------------------------------------------------------
def pin_threads(n: Optional[int] = None) -> Dict[str, Any]:
    """Fix BLAS/OpenMP threads (threadpoolctl) and torch's, and return what was set."""
    from threadpoolctl import threadpool_info, threadpool_limits

    n = n or os.cpu_count() or 1
    threadpool_limits(limits=n)
    info: Dict[str, Any] = {"requested": n, "blas": [
        {k: p.get(k) for k in ("internal_api", "version", "num_threads", "threading_layer",
                               "architecture")} for p in threadpool_info()]}
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
        info["torch"] = torch.get_num_threads()
    info["omp_env"] = os.environ.get("OMP_NUM_THREADS")
    return info


# --- machine facts -------------------------------------------------------------------------
def gpus() -> List[Dict[str, Any]]:
    torch = sys.modules.get("torch")
    out: List[Dict[str, Any]] = []
    if torch is not None and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            prop = torch.cuda.get_device_properties(i)
            out.append({"name": prop.name, "memory_bytes": int(prop.total_memory),
                        "driver": getattr(torch.version, "cuda", None)})
    return out


def machine_facts() -> Dict[str, Any]:
    from suite.plugins.isa import recorded_native_level

    # the CPU instruction-set level torch picks here unpinned (suite.plugins.isa), where torch ran
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "gpus": gpus(),
            "libraries": library_versions(), "isa_native": recorded_native_level()}


# --- matmul peak ---------------------------------------------------------------------------
PEAK_MIN_TOTAL_S = 1.0  # a peak is the best of repeated products totalling at least this


def _best_seconds(fn: Callable[[], Any], sync: Callable[[Any], Any],
                  min_total_s: float = PEAK_MIN_TOTAL_S, min_repeats: int = 3) -> float:
    """Fastest of repeated calls, after a warm-up, until they total ``min_total_s``.

    The best, not the median: on a shared CPU the other work only ever slows a call down,
    so the fastest call is the one closest to what the hardware does.
    """
    sync(fn())  # warm up (first-call allocation, JIT, BLAS thread start)
    times: List[float] = []
    while len(times) < min_repeats or sum(times) < min_total_s:
        start = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def _jax_device(device: str):
    """'cpu' or 'cuda[:i]' -> the jax device, asked of JAX itself."""
    import jax

    if device == "cpu":
        return jax.devices("cpu")[0]
    if device.startswith("cuda"):
        return jax.devices("gpu")[int(device.partition(":")[2] or 0)]
    raise ValueError(f"device: expected 'cpu' or 'cuda:i', got {device!r}")


def matmul_peak(framework: str, device: str, dtype: str, n: int = 2048,
                min_total_s: float = PEAK_MIN_TOTAL_S) -> Optional[float]:
    """Measured FLOP/s of an n x n x n matmul in ``framework``: the best of repeated
    products totalling at least ``min_total_s``; None where it cannot run here."""
    try:
        if framework == "numpy":
            if dtype not in ("float32", "float64", "float16"):
                return None
            a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
            seconds = _best_seconds(lambda: a @ a, lambda x: x, min_total_s)
        elif framework == "torch":
            import torch

            t = getattr(torch, dtype)
            a = torch.randn(n, n, device=device).to(t)
            sync = (lambda x: torch.cuda.synchronize(device)) if device.startswith("cuda") \
                else (lambda x: x)
            seconds = _best_seconds(lambda: a @ a, sync, min_total_s)
        elif framework == "jax":
            import jax
            import jax.numpy as jnp

            a = jax.device_put(jnp.ones((n, n), getattr(jnp, dtype)), _jax_device(device))
            mm = jax.jit(lambda x: x @ x)
            seconds = _best_seconds(lambda: mm(a), jax.block_until_ready, min_total_s)
        else:
            return None
    except Exception:  # a framework that cannot do this dtype here: no peak, not a crash
        return None
    return 2.0 * n ** 3 / seconds


def peak_key(framework: str, device: str, dtype: str) -> str:
    return f"{framework}:{device}:{dtype}"


# "n,seconds": the product a sweep's peak is measured with, where the harness's own tests
# set a smaller one (a sweep measures the peak twice: 3 s of a 4 s test sweep on 2 cores).
PEAK_PRODUCT_ENV = "MHA_SUITE_PEAK_PRODUCT"


def _peak_product() -> Tuple[int, float]:
    """(n, min_total_s) for ``matmul_peaks``: $MHA_SUITE_PEAK_PRODUCT, else 2048 and 1 s."""
    text = os.environ.get(PEAK_PRODUCT_ENV)
    if not text:
        return 2048, PEAK_MIN_TOTAL_S
    try:
        n, seconds = text.split(",")
        return int(n), float(seconds)
    except ValueError:
        raise ValueError(f"{PEAK_PRODUCT_ENV}: expected 'n,seconds' such as '512,0.05', "
                         f"got {text!r}") from None


def matmul_peaks(combos: Iterable[Tuple[str, str, str]]) -> Dict[str, float]:
    """{'framework:device:dtype': FLOP/s} for each (framework, device, dtype) measurable."""
    out = {}
    n, min_total_s = _peak_product()
    for framework, device, dtype in sorted(set(combos)):
        peak = matmul_peak(framework, device, dtype, n=n, min_total_s=min_total_s)
        if peak is not None:
            out[peak_key(framework, device, dtype)] = peak
    return out


def combine_peaks(before: Dict[str, float], after: Dict[str, float]
                  ) -> Tuple[Dict[str, float], Dict[str, Dict[str, Optional[float]]]]:
    """The peaks a share is computed from (the higher of before and after the points) and
    both measurements with their spread, |before - after| / higher."""
    higher: Dict[str, float] = {}
    runs: Dict[str, Dict[str, Optional[float]]] = {}
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        best = max(v for v in (b, a) if v is not None)
        higher[key] = best
        spread = abs(b - a) / best if b is not None and a is not None else None
        runs[key] = {"before": b, "after": a, "spread": spread}
    return higher, runs


# --- peak memory ---------------------------------------------------------------------------
def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    """Reset the process's peak RSS (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# glibc mallopt parameters: large buffers mapped on allocation and unmapped on free, so a
# buffer freed by one call leaves the RSS and the next call's peak shows again (by default
# glibc raises its threshold after a free and keeps later buffers in the heap: torch.sdpa
# then showed 4 KiB at L = 1024).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 128 * 1024
RSS_METHOD = "rss_hwm_delta"  # every CPU framework: the same method, so comparable


def fix_malloc_thresholds() -> bool:
    """Pin glibc's mmap and trim thresholds (once per process); False where not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                    and libc.mallopt(_M_TRIM_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):  # not glibc: mallopt absent
        return False


@contextlib.contextmanager
def peak_memory(framework: str, device: str) -> Iterator[Dict[str, Any]]:
    """Measure the peak bytes allocated inside the block; fills {'peak_bytes', 'peak_method'}.

    CPU, every framework: the rise of the process's peak RSS (VmHWM, reset before) above
    its RSS at the start, which counts every allocator alike, with glibc's thresholds
    pinned (``fix_malloc_thresholds``). CUDA, chosen at run time: the allocator's own
    statistics (torch's max_memory_allocated, JAX's peak_bytes_in_use).
    """
    result: Dict[str, Any] = {"peak_bytes": None, "peak_method": "not measured"}
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and framework == "torch" and torch is not None:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        yield result
        torch.cuda.synchronize(device)
        result.update(peak_bytes=int(torch.cuda.max_memory_allocated(device) - base),
                      peak_method="cuda_max_memory_allocated")
        return
    if device.startswith("cuda") and framework == "jax":
        stats = _jax_device(device).memory_stats() or {}
        base = stats.get("bytes_in_use", 0)
        yield result
        stats = _jax_device(device).memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            result.update(peak_bytes=int(stats["peak_bytes_in_use"] - base),
                          peak_method="jax_peak_bytes_in_use (not reset: upper bound)")
        return
    if device == "cpu" and _reset_hwm():
        base = _status_kb("VmRSS")
        yield result
        hwm = _status_kb("VmHWM")
        if base is not None and hwm is not None:
            result.update(peak_bytes=max(0, (hwm - base) * 1024), peak_method=RSS_METHOD)
        return
    yield result


# --- memory budget -------------------------------------------------------------------------
def available_bytes(device: str) -> Optional[int]:
    if device.startswith("cuda"):
        torch = sys.modules.get("torch")
        if torch is not None:
            free, _ = torch.cuda.mem_get_info(device)
            return int(free)
        return None
    kb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    kb = int(line.split()[1])
    except OSError:
        return None
    return None if kb is None else kb * 1024


def predicted_bytes(point: Point, memory_model: str = "quadratic") -> int:
    """A generous estimate of the peak: inputs, projections, and the (B, H, L, S) scores
    (three live copies: logits, exp, weights; x2 with the backward) unless linear."""
    B, L, S, H, K, D, E = point.B, point.L, point.S, point.H, point.K, point.D, point.E
    grad, b = point.grad, BYTES[point.dtype]
    linear = b * (B * (L + 2 * S) * E * 3 + 4 * E * E + B * (L * H + 2 * S * K) * D * 3)
    if memory_model == "linear":
        return int(linear * (3 if grad else 1) + 64 * 2**20)
    return int(linear + 3 * b * B * H * L * S * (2 if grad else 1))
