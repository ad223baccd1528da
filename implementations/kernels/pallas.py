"""JAX's own Pallas attention kernels (the jax wheel's ``jax.experimental.pallas.ops``).

- ``pallas.gpu.flash``: ``ops.gpu.attention.mha``, FlashAttention for GPUs (Triton lowering):
  causal (top left) through its flag. Its ``segment_ids`` is one (B, L) array read by queries
  and keys alike, so key padding is not expressible (padded positions would also be padded
  queries that see only padding): not declared.
- ``pallas.tpu.flash``: ``ops.tpu.flash_attention.flash_attention``: causal (top left)
  through its flag, key padding by ``valid_lens`` (B,) through ``SegmentIds`` (queries
  segment 0, keys past the length segment 1), and every other mask through its additive
  ``ab`` (B, H, L, S): the canonical additive form, -inf where not allowed, divided by the
  scale (the kernel adds ``ab`` to the unscaled logits, as its ``mha_reference`` does).
- ``pallas.tpu.splash``: ``ops.tpu.splash_attention``, its mask objects (``PallasTpuSplash``).
- ``pallas.gpu.decode``: ``ops.gpu.decode_attention.gqa``, one query (``PallasGpuDecode``).
- ``pallas.tpu.paged``: ``ops.tpu.paged_attention.paged_attention``, one query per sequence
  against a paged key/value cache read through its block table (``PallasTpuPaged``).
- ``pallas.gpu.paged``: ``ops.gpu.paged_attention.paged_attention``, the same form
  (``PallasGpuPaged``).

``pallas.gpu.flash``, ``pallas.tpu.flash`` and ``pallas.tpu.splash`` also run their kernels'
backward (gradients); ``pallas.gpu.decode`` and the paged kernels are forward only.

On their accelerator they run compiled (``cuda:i`` / ``tpu:i``); on a CPU they run under
Pallas's interpreter (device ``cpu-interpret``): ``interpret=True`` for the GPU kernels,
``pltpu.force_tpu_interpret_mode()`` around tracing for the TPU ones. Neither flash kernel
takes GQA: kv heads are repeated to H (``JaxCore``'s ``repeat_kv``); splash and decode read
K kv heads themselves.

Shapes: each kernel's block sizes decide what it takes, said in the ``Unsupported`` reason.
The GPU kernel takes Lq and Lk that are at most 128 (one block) or multiples of 128 (on a GPU,
powers of two up to 128 or multiples of 128: Triton blocks are powers of two). The TPU
kernel's key blocks are multiples of 128 lanes, so Lk is padded to a multiple of 128 with
the padded keys in their own segment (no query row sees them) and Lq to a multiple of 8.
A problem with a fully masked row is refused: the kernel gives the mean of the values
through segments and NaN through -inf in ``ab``, and padding would change the mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from implementations.jax.common import JaxCore, tf32_on_gpu
from suite.plugins import probes
from suite.plugins.adapters import AttendMask, form_mask, requested_form, split_mask
from suite.plugins.declarations import WINDOW_FORMS, Deviation
from suite.plugins.interface import INTERPRETED_CPU, Unsupported, interpreted
from suite.spec.paging import lengths_of
from suite.spec.problem import Problem

BLOCK = 128  # both kernels' default block along the sequence (their BlockSizes)
SUBLANES = 8  # TPU query blocks are multiples of 8 sublanes
BWD_BLOCK = 32  # the GPU kernel's default backward blocks (block_q_dq, block_kv_dkv, ...)


def _backend_count(platform: str) -> int:
    try:
        return len(jax.devices(platform))
    except RuntimeError as exc:  # no such backend here
        probes.failed(f"jax.devices({platform!r})", exc)
        return 0


class PallasCore(JaxCore):
    """Runs ``kernel_attend`` natively on ``platform`` when present, else interpreted."""

    platform = ""  # "gpu" or "tpu"
    memory_model = "linear"

    def devices(self) -> List[str]:
        n = _backend_count(self.platform)
        prefix = "cuda" if self.platform == "gpu" else self.platform
        return [f"{prefix}:{i}" for i in range(n)] if n else [INTERPRETED_CPU]

    def dtypes(self, device: str) -> Sequence[str]:
        return ("float32", "float16", "bfloat16")

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if device not in self.devices():
            raise ValueError(f"device: expected one of {self.devices()}, got {device!r}")
        if grad and "grad" not in self.features:  # this kernel's backward is not wired here
            raise Unsupported(f"{self.name}: forward only")
        self.interpret = interpreted(device)
        self.check_shapes(problem, device)
        if grad:
            self.check_grad_shapes(problem)
        return super().prepare(problem, device, dtype, need_weights=need_weights, grad=grad)

    def check_shapes(self, problem: Problem, device: str) -> None:
        """Raise ``Unsupported`` for a problem the kernel's blocks cannot take."""

    def check_grad_shapes(self, problem: Problem) -> None:
        """Raise ``Unsupported`` for a problem the kernel's backward blocks cannot take."""


class PallasGpuFlash(PallasCore):
    name = "pallas.gpu.flash"
    platform = "gpu"
    # Gradients through the kernel's custom VJP: its Pallas backward kernels (dq, dk/dv).
    features = frozenset({"causal", "cross", "gqa", "scale", "grad"})
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN value at a key the causal mask hides from a row reaches that row: "
                    "the masked weight is 0 and 0 * NaN is NaN in p @ v (measured, "
                    "special_values/nan_value_causal, interpreted, jax 0.10.2)"),
        "float32_dots": tf32_on_gpu("the kernel's float32 pl.dot products")}

    def check_shapes(self, problem: Problem, device: str) -> None:
        pow2 = not interpreted(device)  # Triton's blocks are powers of two on a GPU

        def fits(n: int) -> bool:
            return n % BLOCK == 0 or (n < BLOCK and (not pow2 or n & (n - 1) == 0))

        if not (fits(problem.L) and fits(problem.S)):
            rule = "powers of two up to 128" if pow2 else "at most 128"
            raise Unsupported(f"{self.name} takes Lq and Lk that are {rule} or multiples of "
                              f"128 (its 128 x 128 blocks); got Lq={problem.L}, Lk={problem.S}")

    def check_grad_shapes(self, problem: Problem) -> None:
        # The fused backward walks Lq in blocks of min(32, Lq) and Lk in blocks of
        # min(32, Lk) (its default BlockSizes) and needs as many of each (its ValueError).
        if problem.L // min(BWD_BLOCK, problem.L) != problem.S // min(BWD_BLOCK, problem.S):
            raise Unsupported(f"{self.name}'s backward takes Lq and Lk with as many blocks of "
                              f"32 (or one block each, both at most 32); got Lq={problem.L}, "
                              f"Lk={problem.S}")

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        from jax.experimental.pallas.ops.gpu import attention

        out = attention.mha(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),  # (B, L, H, D)
                            v.transpose(0, 2, 1, 3), None, sm_scale=scale,
                            causal="causal" in mask.kinds, interpret=self.interpret)
        return out.transpose(0, 2, 1, 3), None  # (B, H, L, D)


class PallasTpuCore(PallasCore):
    """A TPU kernel: compiled on a TPU, else traced under ``pltpu.force_tpu_interpret_mode``."""

    platform = "tpu"

    def __init__(self) -> None:
        super().__init__()
        self._caches: Dict[Any, Dict] = {}  # JaxCore's executable caches, one per static mask
        self.grad = False

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        self.grad = grad  # the kernels get backward block sizes only when gradients are asked
        if not interpreted(device):
            return super().prepare(problem, device, dtype, need_weights=need_weights,
                                   grad=grad)
        from jax.experimental.pallas import tpu as pltpu

        with pltpu.force_tpu_interpret_mode():  # the kernel is traced and compiled here
            return super().prepare(problem, device, dtype, need_weights=need_weights,
                                   grad=grad)


class PallasTpuFlash(PallasTpuCore):
    name = "pallas.tpu.flash"
    # Gradients through the kernel's custom VJP: its own Pallas backward kernels (dkv, then dq).
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale", "grad"})
    deviations = {
        "nan_padding": Deviation(
            "confined", "NaN or inf in a key or value the mask hides reaches the rows of that "
                        "batch item: masked logits get a finite DEFAULT_MASK_VALUE, so their "
                        "weight is 0 and 0 * NaN is NaN (measured, masking/nan_padding and the "
                        "special_values key/value cases, interpreted, jax 0.10.2; reproducer "
                        "docs/repro/pallas-tpu-nan-padding/)")}

    def block_sizes(self, Lp: int) -> Any:
        """The kernel's ``BlockSizes`` for Lp query rows (padded): query blocks of up to 128
        rows, key blocks of 128; with gradients also the backward's blocks, the same sizes.

        The kernel's backward raises "not all backward blocks are specified" unless every
        block of its dkv and dq kernels is set (``BlockSizes.has_backward_blocks``), as a user
        who trains with it sets them; these are the library's ``BlockSizes.get_default()``
        sizes (all 128) with the query blocks cut to Lp like the forward's. Every shape the
        forward takes fits them (its ``_verify_block``: bq divides Lp, 128 divides Sp >= 128;
        measured against autodiff of the plain algorithm for Lq up to 384 and Lk up to 384,
        causal, ``ab`` and segment ids, float32 errors <= 2.7e-6): nothing more is refused.
        """
        from jax.experimental.pallas.ops.tpu import flash_attention as fa

        bq = min(BLOCK, Lp)
        backward = dict(block_q_major_dkv=bq, block_q_dkv=bq, block_k_major_dkv=BLOCK,
                        block_k_dkv=BLOCK, block_q_dq=bq, block_k_major_dq=BLOCK,
                        block_k_dq=BLOCK) if self.grad else {}
        return fa.BlockSizes(block_q=bq, block_k_major=BLOCK, block_k=BLOCK, block_b=1,
                             **backward)

    def kernel(self) -> Any:
        """The kernel called: ``ops.tpu.flash_attention.flash_attention``, its forward and its
        custom VJP (a subclass may give another build of it, e.g. one with a planted bug)."""
        from jax.experimental.pallas.ops.tpu import flash_attention as fa

        return fa.flash_attention

    def check_shapes(self, problem: Problem, device: str) -> None:
        m = problem.mask
        padded = problem.S % BLOCK != 0
        if split_mask(problem).fully_masked_rows() is not None:
            # Measured (Lk = 128, float32): a row masked through segments gives the mean of
            # the values (finite DEFAULT_MASK_VALUE), one masked through -inf in ``ab`` gives
            # NaN; with Lk padded to 128 the mean would also take in the padded keys.
            raise Unsupported(f"{self.name}: a fully masked row gives the mean of the values "
                              f"when masked through segment ids and NaN through -inf in ab, "
                              f"and padding Lk={problem.S} to a multiple of 128 would change "
                              f"the mean: no one policy to declare")
        # How the mask reaches the kernel (static under jit): the causal flag, segments for
        # key padding (B,), ``ab`` for the rest. Compiled code is kept per route.
        segments = padded or (m.valid_lens is not None and np.ndim(m.valid_lens) == 1)
        rest = m.kinds - {"causal"} - ({"valid_lens"} if np.ndim(m.valid_lens) == 1 else set())
        self.route = (segments, bool(rest))
        self._cache = self._caches.setdefault(self.route, {})  # JaxCore's executable cache

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        from jax.experimental.pallas.ops.tpu import flash_attention as fa

        B, H, L, D = q.shape
        S = k.shape[2]
        use_segments, use_ab = self.route
        # Rows and keys added at the end: query blocks of up to 128 rows (multiples of 8), key
        # blocks of 128.
        L_pad, S_pad = -L % (SUBLANES if L <= BLOCK else BLOCK), -S % BLOCK
        pad = ((0, 0), (0, 0), (0, L_pad), (0, 0))
        q = jnp.pad(q, pad)  # (B, H, Lp, D): padded query rows are dropped below
        k = jnp.pad(k, ((0, 0), (0, 0), (0, S_pad), (0, 0)))  # (B, H, Sp, D)
        v = jnp.pad(v, ((0, 0), (0, 0), (0, S_pad), (0, 0)))  # (B, H, Sp, D)
        segment_ids = None
        if use_segments:  # keys no query may attend, padded ones included, get segment 1
            dead = jnp.zeros((B, S), bool) if mask.dead_keys is None \
                else mask.dead_keys.all(axis=1)[..., 0]  # (B, S)
            kv = jnp.pad(dead, ((0, 0), (0, S_pad)), constant_values=True).astype(jnp.int32)
            segment_ids = fa.SegmentIds(q=jnp.zeros((B, L + L_pad), jnp.int32), kv=kv)
        ab = None
        if use_ab:  # the whole canonical mask, additive: bias, -inf where not allowed
            # The kernel adds ``ab`` before scaling (softmax((q.k + ab) * sm_scale)), so the
            # canonical bias, added after, is ab = bias / scale (-inf stays -inf).
            ab = jnp.broadcast_to(mask.bias / scale, (B, H, L, S)).astype(q.dtype)
            ab = jnp.pad(ab, ((0, 0), (0, 0), (0, L_pad), (0, S_pad)))  # (B, H, Lp, Sp)
        causal = "causal" in mask.kinds
        # With gradients, padded query rows get a zero cotangent (they are sliced off below),
        # so their ds is 0 and they change no gradient of the keys and values.
        out = self.kernel()(q, k, v, ab, segment_ids, causal=causal, sm_scale=scale,
                            block_sizes=self.block_sizes(L + L_pad))
        return out[:, :, :L], None  # (B, H, L, D)


class PallasTpuSplash(PallasTpuCore):
    """``ops.tpu.splash_attention``: the canonical mask as splash's own mask objects.

    Causal alone is a ``CausalMask`` (top left: offset 0; bottom right: offset Lk - Lq, which
    the kernel computes in its blocks); every other mask (a boolean mask, per-query lengths,
    causal beside them) is a ``NumpyMask`` per head in a ``MultiHeadMask``, built per batch
    item (splash masks are static and per head: a mask that varies over the batch gets one
    kernel per item); key padding by ``valid_lens`` (B,) is its ``SegmentIds`` (queries
    segment 0, padded keys 1). A packed row is its ``SegmentIds`` too, as its users pack:
    the sequence ids for queries and keys (padded keys -1), beside the causal or full mask.
    GQA through its MHA form (query head h reads kv head h // (H // K)) and MQA (K = 1)
    through its MQA form. Splash takes no scale: q is scaled before the kernel. No additive
    bias: ``bias`` is not declared. A cap (``Problem.softcap``) is the kernel's
    ``attn_logits_soft_cap``, on the scaled logits, packed or not.
    """

    name = "pallas.tpu.splash"
    # Gradients through the kernel's custom VJP: its own Pallas backward kernels (dkv, then dq).
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "cross",
                          "gqa", "scale", "grad", "packed", "softcap"})
    # Splash's computed masks: LocalMask (a window, key lengths as its SegmentIds beside it)
    # and ChunkedCausalMask, built by ``_splash_form_mask``.
    mask_forms = frozenset({"local_window", "local_window+kv_lengths", "chunked_causal"})
    repeat_kv = False  # the MHA form reads K kv heads itself
    deviations = {"nan_padding": Deviation(
        "confined", "NaN in a key or value the mask hides inside a key block the kernel "
                    "visits reaches the rows of that batch item: masked logits get a finite "
                    "mask_value, so their weight is 0 and 0 * NaN is NaN (measured, "
                    "masking/nan_padding, interpreted, jax 0.10.2)")}

    def block_sizes(self, Lp: int) -> Any:
        """Splash's ``BlockSizes`` for Lp query rows (padded): query blocks of up to 128 rows,
        key blocks of 128; with gradients also the backward's blocks, the same sizes.

        The kernel's backward raises "Need to specify backward blocks" unless every block
        of its dkv and dq kernels is set (``BlockSizes.has_backward_blocks``), as a user who
        trains with splash sets them; these are the library's ``BlockSizes.get_default()``
        sizes (separate dkv and dq kernels, ``use_fused_bwd_kernel=False``) with the query
        blocks cut to Lp like the forward's. Every shape the forward takes fits them: bq
        divides Lp, 128 divides Sp >= 128.
        """
        from jax.experimental.pallas.ops.tpu import splash_attention as sa

        bq = min(BLOCK, Lp)
        backward = dict(block_q_dkv=bq, block_kv_dkv=BLOCK, block_kv_dkv_compute=BLOCK,
                        block_q_dq=bq, block_kv_dq=BLOCK) if self.grad else {}
        return sa.BlockSizes(block_q=bq, block_kv=BLOCK, block_kv_compute=BLOCK, **backward)

    def check_shapes(self, problem: Problem, device: str) -> None:
        import hashlib

        from jax.experimental.pallas.ops.tpu import splash_attention as sa

        if split_mask(problem).fully_masked_rows() is not None:
            # Measured (jax 0.10.2, interpreted): a row with no key gives the mean of the
            # values of the key blocks the kernel visits (masked logits get a finite
            # mask_value) and NaN when it skips every block: it depends on the 128-key blocks.
            raise Unsupported(f"{self.name}: a fully masked row gives the mean of the values "
                              f"of the 128-key blocks the kernel visits, NaN when it visits "
                              f"none: no one policy to declare")
        B, H, L, S = problem.B, problem.H, problem.L, problem.S
        packed = problem.mask.segments  # as SegmentIds below, not in the mask
        if packed is not None:
            problem = dataclasses.replace(
                problem, mask=dataclasses.replace(problem.mask, segments=None))
        parts = split_mask(problem, native_causal=("top_left", "bottom_right"))
        if parts.mask is not None and parts.causal:  # causal beside another mask: one mask
            parts = split_mask(problem, native_causal=())
        # Key blocks are multiples of 128 lanes (block_kv_compute); query blocks of up to 128
        # rows (multiples of 8 sublanes). Added keys are in segment 1, added rows dropped.
        # The backward's dkv kernel reads query segment ids in lanes: its query blocks are
        # multiples of 128 (its NotImplementedError), so with gradients Lq is padded to 128.
        self.L_pad = L + (-L % (SUBLANES if L <= BLOCK and not self.grad else BLOCK))
        self.S_pad = S + -S % BLOCK
        Lp, Sp = self.L_pad, self.S_pad
        self.segments = None  # (B, Sp) int32: 1 for keys no query may read
        if parts.key_padding is not None or Sp != S:
            keep = np.ones((B, S), bool) if parts.key_padding is None else parts.key_padding
            self.segments = np.pad(~keep, ((0, 0), (0, Sp - S)), constant_values=True
                                   ).astype(np.int32)  # (B, Sp)
        self.q_segments = None  # (B, Lp) int32: the queries' ids, else all segment 0
        if packed is not None:  # each token's sequence; padded keys in none (-1)
            kv = np.pad(packed, ((0, 0), (0, Sp - S)), constant_values=-1)
            if self.segments is not None:
                kv = np.where(self.segments == 1, -1, kv)
            self.segments = kv.astype(np.int32)
            self.q_segments = np.pad(packed, ((0, 0), (0, Lp - L)), mode="edge"
                                     ).astype(np.int32)  # added rows: dropped
        # A window form: splash's computed mask (key lengths beside it: the segments above).
        masks = _splash_form_mask(problem, (Lp, Sp))
        if masks is None and parts.mask is None:
            shape = (Lp, Sp)
            one = (sa.FullMask(shape) if parts.causal is None else
                   sa.CausalMask(shape, offset=0 if parts.causal == "top_left" else S - L))
            masks = [sa.MultiHeadMask([one] * H)]
        elif masks is None:
            allowed = np.pad(parts.mask, ((0, 0), (0, 0), (0, Lp - L), (0, Sp - S)))
            per_item = allowed if allowed.shape[0] > 1 else allowed[:1]  # (B|1, H|1, Lp, Sp)
            masks = [sa.MultiHeadMask([sa.NumpyMask(m[h % m.shape[0]]) for h in range(H)])
                     for m in per_item]
        blocks = self.block_sizes(Lp)
        make = sa.make_splash_mqa_single_device if problem.K == 1 else \
            sa.make_splash_mha_single_device
        check_softcap(self.name, problem, sa.make_splash_mha, "make_splash_mha")
        # Gemma 2's cap as the kernel's own attn_logits_soft_cap (cap * tanh(logits / cap) on
        # the logits of the scaled q, before the mask), in a packed batch too.
        self.kernels = [make(m, block_sizes=blocks, attn_logits_soft_cap=problem.softcap)
                        for m in masks]
        digest = hashlib.sha1(repr((L, S, H, problem.K == 1, parts.causal,
                                    requested_form(problem), problem.softcap)).encode())
        for a in (parts.mask, self.segments, self.q_segments):
            digest.update(b"-" if a is None else np.ascontiguousarray(a).tobytes())
        self._cache = self._caches.setdefault(digest.hexdigest(), {})  # the masks are static

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        from jax.experimental.pallas.ops.tpu import splash_attention as sa

        B, H, L, D = q.shape
        S = k.shape[2]
        Lp, Sp = self.L_pad, self.S_pad
        q = jnp.pad(q * scale, ((0, 0), (0, 0), (0, Lp - L), (0, 0)))  # (B, H, Lp, D)
        k = jnp.pad(k, ((0, 0), (0, 0), (0, Sp - S), (0, 0)))  # (B, K, Sp, D)
        v = jnp.pad(v, ((0, 0), (0, 0), (0, Sp - S), (0, 0)))  # (B, K, Sp, D)
        if k.shape[1] == 1:  # the MQA form takes one kv head without a head axis
            k, v = k[:, 0], v[:, 0]  # (B, Sp, D)
        segs = None if self.segments is None else jnp.asarray(self.segments)  # (B, Sp)
        q_segs = None if self.q_segments is None else jnp.asarray(self.q_segments)

        def one(kernel, qb, kb, vb, b):  # one batch item: (H, Lp, D) -> (H, Lp, D)
            ids = None if segs is None else sa.SegmentIds(
                q=jnp.zeros(Lp, jnp.int32) if q_segs is None else q_segs[b], kv=segs[b])
            return kernel(qb, kb, vb, ids)

        # One call per batch item: the interpreted TPU kernel does not batch under jax.vmap
        # (jax 0.10.2), and a mask that varies over the batch is one kernel per item.
        out = jnp.stack([one(self.kernels[b % len(self.kernels)], q[b], k[b], v[b], b)
                         for b in range(B)])
        return out[:, :, :L].astype(q.dtype), None  # (B, H, L, D)


def _splash_form_mask(problem: Problem, shape: Tuple[int, int]) -> Optional[List[Any]]:
    """A window form as splash's own computed masks, or None when no such form is asked for:
    [MultiHeadMask] of ``LocalMask(shape, (left, right), offset=0)`` or
    ``ChunkedCausalMask(shape, chunk)`` for every head. ``shape`` is (Lp, Sp), the padded
    lengths: the masks are top left, so added rows (dropped) and added keys (segment 1)
    change no answer."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    # ChunkedCausalMask is not re-exported by the package (jax 0.10.2): its own module.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sam

    name = requested_form(problem)
    if name not in WINDOW_FORMS:
        return None
    form = form_mask(problem)
    one = (sa.LocalMask(shape, window_size=form.window, offset=0) if form.window is not None
           else sam.ChunkedCausalMask(shape, chunk_size=form.chunk))
    return [sa.MultiHeadMask([one] * problem.H)]


class PallasGpuDecode(PallasCore):
    """``ops.gpu.decode_attention.gqa``: one query per sequence against Lk keys, GQA in the
    kernel (query head h reads kv head h // (H // K)), key padding by ``valid_lens`` (B,)
    through its ``kv_seq_len``. It takes Lq = 1 only and no other mask but causality (no
    causal flag: the one row's keys are a prefix, its length what ``kv_seq_len`` takes): the
    decode form, a row at its offset into each sequence's cache (``Mask.query_offset``), is
    what it is for. The keys are split in ``k_splits`` parts of 16 or
    more keys each (its asserts), so Lk is padded to a multiple of 16 (of 2048 past 2048:
    parts of at most 128 keys or multiples of 128); the added keys lie past ``kv_seq_len``,
    which the kernel masks.
    """

    name = "pallas.gpu.decode"
    platform = "gpu"
    features = frozenset({"valid_lens", "causal", "decode", "cross", "gqa", "scale"})
    repeat_kv = False  # the kernel reads K kv heads itself
    deviations = {"nan_padding": Deviation(
        "confined", "NaN in a key or value past kv_seq_len reaches the output when the length "
                    "ends inside one of the kernel's key splits: those keys get a finite "
                    "0.7 * finfo.min added to their scores (NaN + finite is NaN) and weight 0 "
                    "(0 * NaN is NaN); splits wholly past the length are skipped (measured, "
                    "masking/nan_padding_one_query, interpreted, jax 0.10.2; reproducer "
                    "docs/repro/pallas-gpu-decode-nan-padding/)"),
        "float32_dots": tf32_on_gpu("the kernel's float32 dots")}

    def check_shapes(self, problem: Problem, device: str) -> None:
        m = problem.mask
        if problem.L != 1:
            raise Unsupported(f"{self.name} takes one query per sequence (Lq = 1); "
                              f"got Lq={problem.L}")
        if m.valid_lens is not None and np.ndim(m.valid_lens) != 1:
            raise Unsupported(f"{self.name} takes key lengths per sequence (B,) only")
        step = 16 if problem.S <= 2048 else 2048
        self.S_pad = problem.S + -problem.S % step
        self.k_splits = min(16, self.S_pad // 16)  # the library's default, fewer when short

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        from jax.experimental.pallas.ops.gpu import decode_attention as da

        B, H, _, D = q.shape
        S = k.shape[2]
        pad = ((0, 0), (0, 0), (0, self.S_pad - S), (0, 0))
        k = jnp.pad(k, pad).transpose(0, 2, 1, 3)  # (B, Sp, K, D)
        v = jnp.pad(v, pad).transpose(0, 2, 1, 3)  # (B, Sp, K, D)
        lens = None
        # Key lengths: the masks declared (valid_lens (B,), causality at the one row's
        # position) leave each batch item's live keys a prefix: their count is its length.
        if mask.dead_keys is not None or self.S_pad != S:
            lens = jnp.full((B,), S, jnp.int32) if mask.dead_keys is None else \
                jnp.sum(~mask.dead_keys[:, 0, :, 0], axis=-1).astype(jnp.int32)  # (B,)
        out = da.gqa(q[:, :, 0], k, v, kv_seq_len=lens, sm_scale=scale,
                     k_splits=self.k_splits, interpret=self.interpret)  # (B, H, D)
        return out[:, :, None], None  # (B, H, 1, D)


def check_softcap(name: str, problem: Problem, kernel: Any, called: str) -> None:
    """Raise ``Unsupported`` for a capped problem where the installed jax's ``kernel``
    (``called``) takes no ``attn_logits_soft_cap`` (the paged kernels gained theirs after
    splash)."""
    import inspect

    if problem.softcap is not None and \
            "attn_logits_soft_cap" not in inspect.signature(kernel).parameters:
        raise Unsupported(f"{name}: jax {jax.__version__}'s {called} takes no "
                          f"attn_logits_soft_cap (the cap)")


def check_paged_step(name: str, problem: Problem) -> None:
    """Raise ``Unsupported`` unless ``problem`` is what a paged decode kernel takes: a paged
    cache, one query per sequence, and that row seeing exactly its cache's filled slots (the
    kernels mask by the lengths alone)."""
    if problem.paging is None:
        raise Unsupported(f"{name} reads a paged key/value cache only (Problem.paging: the "
                          f"paged family)")
    if problem.L != 1:
        raise Unsupported(f"{name} takes one query per sequence (Lq = 1); got Lq={problem.L}")
    B, S = problem.B, problem.S
    sees = problem.mask.dense_allowed(B, 1, 1, S)[:, 0, 0]  # (B, S)
    filled = np.arange(S)[None, :] < lengths_of(problem)[:, None]  # (B, S)
    if not np.array_equal(sees, filled):
        b = int(np.flatnonzero((sees != filled).any(axis=1))[0])
        raise Unsupported(f"{name} masks by the cache lengths alone: the one row must see "
                          f"exactly its sequence's filled slots (sequence {b} sees "
                          f"{int(sees[b].sum())} of its {int(filled[b].sum())})")


class PallasTpuPaged(PallasTpuCore):
    """``ops.tpu.paged_attention.paged_attention``: one query per sequence (q (B, H, D))
    against a paged key/value cache, the pool (K, N, P, D) read page by page through the
    block table (``page_indices`` (B, T)) up to each sequence's ``lengths`` (B,): the paged
    family's form (``suite.spec.paging``), which is what it is for. GQA in the kernel (query head h
    reads kv head h // (H // K)). It takes no scale (q is scaled before the kernel) and no
    mask but the lengths, so the one row must see exactly its cache's filled slots: a decode
    step at its cache's last slot (``query_offset = lengths - 1``, causal), or no offset and
    key padding alone. ``pages_per_compute_block`` = 1 (it must divide T; any value reads the
    same pages), no megacore. A problem without a paged cache is unsupported.

    The kernel loads each page and casts it to bfloat16 before its dots
    (``MultiPageAsyncCopyDescriptor._maybe_dequantize``'s default dtype, with no
    quantization scales): float32 and float16 pages are read at bfloat16 precision.
    """

    name = "pallas.tpu.paged"
    features = frozenset({"valid_lens", "causal", "decode", "paged", "cross", "gqa", "scale",
                          "softcap"})
    repeat_kv = False  # the kernel reads K kv heads itself

    def check_shapes(self, problem: Problem, device: str) -> None:
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

        check_paged_step(self.name, problem)
        check_softcap(self.name, problem, paged_attention, "paged_attention")
        self.softcap = problem.softcap  # its attn_logits_soft_cap, on the scaled q's logits

    def attend_paged(self, q, k_pages, v_pages, block_table, lengths, mask: AttendMask,
                     scale: float, S: int):
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

        out = paged_attention((q[:, :, 0] * scale).astype(q.dtype),  # (B, H, D)
                              k_pages.transpose(2, 0, 1, 3),  # (K, N, P, D)
                              v_pages.transpose(2, 0, 1, 3), lengths, block_table,
                              pages_per_compute_block=1,
                              attn_logits_soft_cap=self.softcap)  # (B, H, D)
        return out[:, :, None]  # (B, H, 1, D)


class PallasGpuPaged(PallasCore):
    """``ops.gpu.paged_attention.paged_attention``: the GPU paged decode kernel, one query per
    sequence against the pool (K, N, P, D) read through ``block_tables`` (B, T) up to
    ``lengths`` (B,), the same form as ``pallas.tpu.paged`` (``check_paged_step``). Each
    sequence's pages are split in ``k_splits`` partitions combined at the end (its assert:
    k_splits divides T): the library's default 16, cut to the largest divisor of T, so the
    partitions past a sequence's length are skipped and the combine sees them empty. Query
    heads in blocks of ``block_h`` = 16 (its default; fewer heads per kv head are padded).
    GQA in the kernel; no scale (q is scaled before it).
    """

    name = "pallas.gpu.paged"
    platform = "gpu"
    features = frozenset({"valid_lens", "causal", "decode", "paged", "cross", "gqa", "scale",
                          "softcap"})
    repeat_kv = False  # the kernel reads K kv heads itself
    deviations = {"float32_dots": tf32_on_gpu("the kernel's float32 dots")}

    def check_shapes(self, problem: Problem, device: str) -> None:
        from jax.experimental.pallas.ops.gpu import paged_attention as pa

        check_paged_step(self.name, problem)
        check_softcap(self.name, problem, pa.paged_attention, "paged_attention")
        self.softcap = problem.softcap  # its attn_logits_soft_cap, on the scaled q's logits
        P = problem.paging.page_size
        if not interpreted(device) and P & (P - 1):  # its Triton lowering's ValueError
            raise Unsupported(f"{self.name} compiled for a GPU takes pages of a power-of-two "
                              f"size (its Triton lowering wants array sizes that are powers "
                              f"of two); got page_size={P}")
        T = problem.paging.block_table.shape[1]
        self.k_splits = max(n for n in range(1, min(16, T) + 1) if T % n == 0)

    def attend_paged(self, q, k_pages, v_pages, block_table, lengths, mask: AttendMask,
                     scale: float, S: int):
        from jax.experimental.pallas.ops.gpu import paged_attention as pa

        out = pa.paged_attention((q[:, :, 0] * scale).astype(q.dtype),  # (B, H, D)
                                 k_pages.transpose(2, 0, 1, 3),  # (K, N, P, D)
                                 v_pages.transpose(2, 0, 1, 3), block_table, lengths,
                                 k_splits=self.k_splits, interpret=self.interpret,
                                 attn_logits_soft_cap=self.softcap)  # (B, H, D)
        return out[:, :, None]  # (B, H, 1, D)
