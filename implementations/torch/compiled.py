"""torch.compile of the eager implementation, and FlexAttention, where they work here.

Compilation happens in ``prepare`` (a warm call, untimed); the seconds of that call go to
``state["compile_s"]``. Each plugin instance keeps its compiled callable, and dynamo
caches the compiled graphs per shape, dtype and mask kind, so a second prepare of the
same shape does not recompile (its warm call then costs one run). ``variants()``
registers each only where a tiny probe compiles and runs on the CPU; why one was
dropped is kept in ``DROPPED``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

from implementations.torch.common import (
    ALL_LAYOUTS,
    TorchCore,
    alibi_bias,
    masked_softmax,
    relative_bias,
    token_positions,
    zero_dead_values,
)
from implementations.torch.eager import TorchEager
from suite.plugins import adapters, cache
from suite.plugins.adapters import AttendMask
from suite.plugins.declarations import VARIANT_FEATURES, Contract, Deviation
from suite.spec.problem import Problem

cache.enable_compile_caches()  # inductor's graphs persist in the user's cache: compile once


# The dtypes the compiled names' agreement with their uncompiled selves is checked in: those
# models are compiled in (each dtype compiles its own graphs: 10-20 s a dtype, cold).
COMPILED_DTYPES = frozenset({"float32", "bfloat16"})


class CompiledPerShape:
    """What the compiled names share: compiling happens in ``prepare`` (a warm call whose
    seconds go to ``state["compile_s"]``), and ``fresh`` drops every compiled graph."""

    compiles_per_shape = True

    def after_prepare(self, state: Dict[str, Any]) -> None:
        state["compile_s"] = warm_call(self, state)

    def fresh(self):
        return fresh_compiled(self)


class TorchCompiled(CompiledPerShape, TorchEager):
    """``torch.compile`` of torch.eager's attention core (inductor; shapes turn dynamic
    after the first recompile)."""

    name = "torch.compile"
    # its compiled core is the plain algorithm: no score variants
    # no steps: a compile for every chunk's shape
    features = TorchEager.features - {"weights", "steps", "static_cache"} - VARIANT_FEATURES
    compiles_per_shape = True  # each new shape or mask kind recompiles (2-20 s cold, CPU)
    compiled = True  # False: the same core run eagerly (the other side of its contract)
    contracts = (Contract("agrees_uncompiled", "agrees", {"compiled": False},
                          "the compiled core computes what the same core run eagerly does",
                          dtypes=COMPILED_DTYPES),)

    def __init__(self) -> None:
        # Shapes become dynamic after a recompile, so sizes alone rarely add graphs.
        self._compiled = torch.compile(self._core) if self.compiled else self._core
        allow_recompiles()

    @staticmethod
    def _core(q, k, v, bias, allowed, dead, scale: float, dropout: Optional[float] = None):
        scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, L, S)
        if bias is not None:
            scores = (scores + bias).masked_fill(~allowed, float("-inf"))
        if dead is not None:
            v = v.masked_fill(dead, 0.0)
        weights = masked_softmax(scores)
        if dropout is not None:  # training mode: inductor draws the dropout mask itself
            weights = torch.nn.functional.dropout(weights, dropout, training=True)
        return weights @ v  # (B, H, L, D)

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        dead = mask.dead_keys
        if dead is not None and dead.shape[1] not in (1, v.shape[1]):
            v = zero_dead_values(v, mask)
            dead = None
        return self._compiled(q, k, v, mask.bias, mask.allowed, dead, scale,
                              mask.dropout), None



def _textbook(q, k, v, inv_scale: float):
    """Attention as models write it (inductor's fuse_attention pattern 1)."""
    return torch.matmul(q, k.transpose(-2, -1)).div(inv_scale).softmax(dim=-1).matmul(v)


def _textbook_biased(q, k, v, bias, inv_scale: float):
    """The same with the mask as an additive bias (inductor's fuse_attention pattern 5)."""
    return torch.softmax(q @ k.transpose(-2, -1) / inv_scale + bias, dim=-1) @ v


def _constant_floats() -> Any:
    """dynamo's setting that keeps a float argument a constant of the graph (a recompile
    for each value, as a model's fixed scale), where this torch has it."""
    import torch._dynamo

    cfg = torch._dynamo.config
    return cfg.patch(specialize_float=True) if hasattr(cfg, "specialize_float") \
        else contextlib.nullcontext()


class TorchCompiledPattern(CompiledPerShape, TorchCore):
    """``torch.compile`` of attention as models write it: matmul, scale, softmax, matmul, the
    mask as an additive bias (-inf where not allowed). Inductor's attention pattern matcher
    (``torch._inductor.fx_passes.fuse_attention``) rewrites these graphs into SDPA's kernels
    where the inputs allow it, so this name checks the compiler's own rewrite, not the
    suite's algorithm (``torch.compile`` compiles the suite's masked softmax, which the
    matcher never rewrites). Values go in untouched: NaN padding and rows without keys show
    as the rewritten kernel handles them. ``rewritten_ops(impl, state)`` says which kernel
    one call reached."""

    name = "torch.compile[pattern]"
    deviations = {
        "nan_padding": Deviation(
            "confined", "NaN in a masked key or value position gives NaN rows, as in the "
            "textbook graph and in SDPA (NaN + -inf is NaN, 0 * NaN is NaN; measured, torch "
            f"{torch.__version__})"),
        "fully_masked_rows": Deviation(
            "nan", "a query row with no key to attend gives NaN where the graph is not "
            "rewritten (the textbook softmax of a row of -inf; measured at one key), zeros "
            f"where SDPA's kernel runs it (measured, torch {torch.__version__})")}
    layouts = ALL_LAYOUTS
    # q, k, v contiguous per head, as a model hands them after ``.contiguous()``: inductor's
    # patterns do not match a matmul of transposed views (measured: no rewrite, bmm kernels)
    own_layout = "contiguous"
    compiled = True  # False: the same graphs run eagerly (the other side of its contract)
    contracts = (Contract("agrees_uncompiled", "agrees", {"compiled": False},
                          "the compiled graph (rewritten into SDPA where the matcher fires) "
                          "computes what the same graph run eagerly does",
                          dtypes=COMPILED_DTYPES),)

    def __init__(self) -> None:
        compile_ = torch.compile if self.compiled else (lambda fn: fn)
        self._plain = compile_(_textbook)
        self._biased = compile_(_textbook_biased)
        allow_recompiles()

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        # The scale stays a constant of each graph, as a model's does: left dynamic (dynamo's
        # default after a second value), the masked pattern's rewrite fails to compile
        # (torch 2.13: docs/repro/torch-compile-fuse-attention-dynamic-scale).
        inv_scale = 1.0 / float(scale)
        with _constant_floats():
            if mask.bias is None:
                return self._plain(q, k, v, inv_scale), None
            return self._biased(q, k, v, mask.bias, inv_scale), None



def rewritten_ops(impl: TorchCore, state: Dict[str, Any]) -> List[str]:
    """The attention kernels (aten ops named ``*scaled_dot_product*``) one call of a prepared
    ``impl`` ran, read from torch's profiler: what the compiled graph really calls, whatever
    inductor's caches did (its counters stay at 0 when a graph comes from the cache)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        impl.run(state)
        impl.synchronize(state)
    return sorted({e.name for e in prof.events() if "scaled_dot_product" in e.name})


class TorchFlex(CompiledPerShape, TorchCore):
    """FlexAttention (``torch.nn.attention.flex_attention``) with the whole mask as a score_mod.

    The score_mod reads the bias and the allowed mask through one flat index: indexing a
    (B, H, L, S) tensor by head fails to compile on the CPU (inductor CppCompileError,
    measured, torch 2.13). Values go in untouched, so NaN padding shows as the library
    handles it.
    """

    name = "torch.flex"
    layouts = ALL_LAYOUTS
    compiles_per_shape = True  # each new shape or block mask recompiles (5-25 s cold, CPU)
    # Windows as a mask_mod given to create_block_mask (its block sparsity), not a dense mask.
    mask_forms = frozenset({"local_window", "local_window+kv_lengths", "chunked_causal"})
    # Score variants through its score_mod (sinks and value widths are not FlexAttention's).
    # The decode form and generation steps through a block mask that reads each batch's
    # offset and cache length (``_decode_block_mask``), as FlexAttention's decoding users write
    # it; steps against a static cache (a growing one would recompile at every step).
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale", "softcap", "alibi", "rel_bias", "score_mod",
                          "packed", "decode", "steps", "static_cache"})
    deviations = {
        "nan_padding": Deviation(
            "confined", "NaN in a padded value position gives NaN rows: the masked weight is 0 "
                        "and 0 * NaN is NaN in weights @ v (NaN keys are dropped by the mask) "
                        f"(measured on the CPU, torch {torch.__version__})")}
    repeat_kv = False
    repro_code = """
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)


        def attend(q, k, v, allowed, bias, scale):
            t = lambda a: torch.from_numpy(a).to(DEVICE, getattr(torch, DTYPE))  # noqa: E731
            kw = {"scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
            if bias is not None:
                B, Hm, L, S = bias.shape
                flat_bias = t(bias).reshape(-1)
                flat_allowed = torch.from_numpy(allowed).to(DEVICE).expand(B, Hm, L, S).reshape(-1)

                def score_mod(score, b, h, q_idx, kv_idx):
                    i = ((b * Hm + (h if Hm > 1 else 0)) * L + q_idx) * S + kv_idx
                    return torch.where(flat_allowed[i], score + flat_bias[i], float("-inf"))

                kw["score_mod"] = score_mod
            return flex(t(q), t(k), t(v), **kw).to("cpu", torch.float64).numpy()
    """

    compiled = True  # False: flex_attention called as is (torch.flex[eager])
    # FlexAttention's two paths must agree: compiled, its generated kernel; uncompiled, the
    # reference its eager call runs (the score_mod and block mask applied to a full matrix).
    contracts = (Contract("agrees_uncompiled", "agrees", {"compiled": False},
                          "FlexAttention compiled computes what its uncompiled call does"),)

    def __init__(self) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        if not self.compiled:
            def uncompiled(*args: Any, **kw: Any) -> Any:
                # The call warns (a dozen lines, once a process) that it is not the fused
                # kernel: what this path is, by name.
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", category=UserWarning,
                                            message="flex_attention called without torch.compile")
                    return flex_attention(*args, **kw)

            self._flex = uncompiled
            return
        # Static shapes: FlexAttention's dynamic-shape CPU kernel fails to build (inductor
        # CppCompileError, measured, torch 2.13), so each shape compiles once.
        self._flex = torch.compile(flex_attention, dynamic=False)
        allow_recompiles()

    def dtypes(self, device: str) -> Sequence[str]:
        # FlexAttention's CPU lowering takes float32, float16 and bfloat16 only (measured).
        return [d for d in super().dtypes(device) if d != "float64"]

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        kw: Dict[str, Any] = {"scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
        # The score_mod's steps in the spec's order: the variants, then the mask.
        steps = _variant_mods(mask.variants, q.shape[2], k.shape[2], mask, device=q.device)
        if mask.form_name:  # a window form: its mask_mod, FlexAttention's own block mask
            kw["block_mask"] = _form_block_mask(mask, q.shape[0], q.shape[2], k.shape[2],
                                                q.device)
        elif mask.segments is not None:  # packed: the document mask its users write
            kw["block_mask"] = _document_block_mask(mask, q.shape[2], q.device)
        elif mask.query_offset is not None:  # decode: rows at each batch's offset in a cache
            kw["block_mask"] = _decode_block_mask(mask, q.shape[2], k.shape[2], q.device)
        # What the block mask holds; the rest of the mask (a window, a bias) is the score_mod's.
        held = frozenset({"packed", "causal"}) if mask.segments is not None else \
            frozenset({"decode", "causal"} | ({"valid_lens"} if _key_lengths(mask) is not None
                                             else set())) \
            if mask.query_offset is not None else frozenset()
        if not mask.form_name and mask.bias is not None and (not held or mask.kinds - held):
            B, Hm, L, S = mask.bias.shape  # Hm is H or 1 (head-free mask)
            bias = mask.bias.reshape(-1)  # (B*Hm*L*S,)
            allowed = mask.allowed.expand(B, Hm, L, S).reshape(-1)  # (B*Hm*L*S,)

            def masked(score, b, h, q_idx, kv_idx):
                i = ((b * Hm + (h if Hm > 1 else 0)) * L + q_idx) * S + kv_idx
                # Masked scores are exactly -inf, whatever a padded key holds.
                return torch.where(allowed[i], score + bias[i], float("-inf"))

            steps.append(masked)
        if steps:
            def score_mod(score, b, h, q_idx, kv_idx):
                for step in steps:
                    score = step(score, b, h, q_idx, kv_idx)
                return score

            kw["score_mod"] = score_mod
        return self._flex(q, k, v, **kw), None  # (B, H, L, D)

    def attend_in_steps(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        mask: AttendMask, p: Problem) -> torch.Tensor:
        """The rows chunk by chunk (``p.steps``) as a FlexAttention decoding loop runs them: a
        static cache of ``p.cache_len`` slots (of L where the problem's cache grows: one shape
        for every step, where a growing cache recompiles at each), each chunk's rows the
        decode form at offset ``start`` against the ``end`` slots written (the decode block
        mask); a window stays in the score_mod. Heads (B, H, L, D)."""
        static = dataclasses.replace(p, cache_len=p.cache_len or p.L)
        B, slots = q.shape[0], static.cache_len

        def empty(n: int):
            return (k.new_zeros(k.shape[:2] + (n, k.shape[3])),
                    v.new_zeros(v.shape[:2] + (n, v.shape[3])))

        heads = []
        for start, end, kc, vc in adapters.cached_chunks(static, k, v, empty, self.cache_append,
                                                         self.cache_write):
            n = end - start
            allowed = mask.allowed.new_zeros(mask.allowed.shape[:2] + (n, slots))
            allowed[..., :end] = mask.allowed[:, :, start:end, :end]  # (B, H|1, n, slots)
            bias = mask.bias.new_full(mask.bias.shape[:2] + (n, slots), -math.inf)
            bias[..., :end] = mask.bias[:, :, start:end, :end]  # (B, H|1, n, slots)
            rows = mask.replace(bias=bias, allowed=allowed, causal_only=False,
                                kinds=mask.kinds | {"decode", "valid_lens"},
                                query_offset=np.full(B, start), valid_lens=np.full(B, end))
            h, _ = self.attend(q[:, :, start:end], kc, vc, rows, p.effective_scale, False)
            heads.append(h)
        return torch.cat(heads, dim=2)


class TorchFlexEager(TorchFlex):
    """FlexAttention called without ``torch.compile``: the path its users take while they
    write and debug a score_mod or mask_mod (the call warns that it is not the fast path).
    The same translation as ``torch.flex``; the library runs its reference implementation,
    so nothing compiles per shape."""

    name = "torch.flex[eager]"
    compiled = False
    compiles_per_shape = False
    contracts = ()  # torch.flex holds the contract between the two paths

    def after_prepare(self, state: Dict[str, Any]) -> None:
        pass

    def fresh(self):
        return self


def _variant_mods(variants: Any, L: int, S: int, mask: Any = None,
                  device: Any = None) -> List[Any]:
    """The problem's score variants as FlexAttention score_mod steps, as its users write
    them: the cap as ``cap * tanh(score / cap)``, ALiBi and a relative table as a bias
    (B|1, H, L, S) read through one flat index (a by-head index does not compile on the
    CPU), at the rows' absolute positions (``mask``: a decode row at its batch's offset, a
    packed token within its own document), a score_mod called with FlexAttention's own
    (b, h) and those positions as floats (q_idx and kv_idx mapped through position tables on
    ``device`` where a form places the rows)."""
    if variants is None:
        return []
    steps: List[Any] = []
    if variants.softcap is not None:
        cap = variants.softcap

        def capped(score, b, h, q_idx, kv_idx):
            return cap * torch.tanh(score / cap)

        steps.append(capped)
    position = None
    if variants.alibi is not None:
        position = alibi_bias(variants.alibi, L, S, mask)  # (B|1, H, L, S)
    if variants.rel_bias is not None:
        table = relative_bias(variants.rel_bias, L, S, mask)
        position = table if position is None else position + table
    if position is not None:
        flat = position.reshape(-1)
        Bp, H = position.shape[:2]  # Bp: B where the positions differ by batch, else 1

        def positioned(score, b, h, q_idx, kv_idx):
            return score + flat[(((b if Bp > 1 else 0) * H + h) * L + q_idx) * S + kv_idx]

        steps.append(positioned)
    if variants.score_mod is not None:
        fn = variants.score_mod.fn
        # q_idx is the row within the query tensor and kv_idx the slot within the keys: the
        # absolute positions are read through flat tables, as the bias above: a decode row
        # at its batch's offset (B * L,), a packed token within its own document (queries
        # (B * L,) and keys (B * S,)); a cache slot is its own position
        qpos = kpos = None
        packed = mask is not None and getattr(mask, "segments", None) is not None
        if packed or (mask is not None and getattr(mask, "query_offset", None) is not None):
            i, j = token_positions("top_left", L, S, mask,
                                   torch.zeros((), dtype=torch.long, device=device))
            qpos = i.reshape(-1)  # (B * L,)
            kpos = j.reshape(-1) if packed else None  # (B * S,); a cache slot is its position

        def modified(score, b, h, q_idx, kv_idx):
            f = score.dtype
            if qpos is not None:
                q_idx = qpos[b * L + q_idx]
            if kpos is not None:
                kv_idx = kpos[b * S + kv_idx]
            return fn(score, b.to(f), h.to(f), q_idx.to(f), kv_idx.to(f), torch)

        steps.append(modified)
    return steps



def _form_block_mask(mask: AttendMask, B: int, L: int, S: int, device: torch.device) -> Any:
    """FlexAttention's ``BlockMask`` of a window form, from a ``mask_mod`` as its users write
    one: the window (left, right) or chunked causal rule, key lengths (B,) beside it."""
    from torch.nn.attention.flex_attention import create_block_mask

    form = mask.form
    lens = None if form.kv_lengths is None else torch.as_tensor(form.kv_lengths, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        if form.window is not None:  # query i attends keys i - left .. i + right
            left, right = form.window
            keep = (kv_idx >= q_idx - left) & (kv_idx <= q_idx + right)
        else:  # causal within chunks of form.chunk
            keep = (kv_idx <= q_idx) & (q_idx // form.chunk == kv_idx // form.chunk)
        return keep if lens is None else keep & (kv_idx < lens[b])

    return create_block_mask(mask_mod, B if lens is not None else None, None, L, S,
                             device=str(device))


def _key_lengths(mask: AttendMask) -> Optional[np.ndarray]:
    """The key lengths (B,) of ``mask`` (a cache's fill), or None (none, or per query row)."""
    lens = mask.valid_lens
    return lens if lens is not None and lens.ndim == 1 else None


def _decode_block_mask(mask: AttendMask, L: int, S: int, device: torch.device) -> Any:
    """FlexAttention's ``BlockMask`` of the decode form, as its decoding users write one: row
    q_idx of batch b sits at position offset[b] + q_idx of the cache and sees the keys up to
    it (causal at the offset), below the cache's length where the problem has one."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = torch.as_tensor(mask.query_offset, device=device)  # (B,)
    lens = _key_lengths(mask)
    lens = None if lens is None else torch.as_tensor(lens, device=device)  # (B,)

    def mask_mod(b, h, q_idx, kv_idx):
        keep = kv_idx <= offset[b] + q_idx
        return keep if lens is None else keep & (kv_idx < lens[b])

    return create_block_mask(mask_mod, offset.shape[0], None, L, S, device=str(device))


def _document_block_mask(mask: AttendMask, L: int, device: torch.device) -> Any:
    """FlexAttention's ``BlockMask`` of a packed batch, as its document-masking example
    writes it: token q sees token kv of the same document (causally where the problem is);
    the rest of a mask, if any, stays in the score_mod."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.as_tensor(mask.segments, device=device)  # (B, L)
    causal = "causal" in mask.kinds

    def mask_mod(b, h, q_idx, kv_idx):
        same = doc[b, q_idx] == doc[b, kv_idx]
        return same & (kv_idx <= q_idx) if causal else same

    return create_block_mask(mask_mod, doc.shape[0], None, L, L, device=str(device))


def fresh_compiled(impl: TorchCore) -> TorchCore:
    """A new instance after dropping every compiled graph of the process (dynamo and inductor
    caches), so a repeated run compiles again, as a new process would."""
    import torch._dynamo

    torch._dynamo.reset()
    return type(impl)()


# Compiled graphs a process may keep per function and in all: a conformance run compiles
# every shape x dtype x mask kind x gradient combination (~150 per plugin), a sweep every
# point's shape. dynamo's defaults (8 and 256) would fall back to eager part-way through.
RECOMPILE_LIMIT = 4096
ACCUMULATED_RECOMPILE_LIMIT = 65536


# dynamo's config names for the same settings, newest first: torch 2.6 renamed
# cache_size_limit to recompile_limit (2.4 and 2.5 have only the old names).
LIMIT_NAMES = {"recompile": ("recompile_limit", "cache_size_limit"),
               "accumulated": ("accumulated_recompile_limit", "accumulated_cache_size_limit"),
               "fail_on_hit": ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit")}


def config_name(cfg: Any, setting: str) -> str:
    """The name this torch's dynamo config gives ``setting`` (a key of LIMIT_NAMES): the
    first name the config answers to, found by reading it, not by version."""
    for name in LIMIT_NAMES[setting]:
        try:
            getattr(cfg, name)
            return name
        except AttributeError:
            continue
    raise AttributeError(f"torch._dynamo.config: none of {LIMIT_NAMES[setting]} exists in "
                         f"torch {torch.__version__}")


def allow_recompiles() -> None:
    """Raise dynamo's recompile limits (never lower them); warm_call still refuses the
    eager fallback should a run get past them."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for setting, limit in (("recompile", RECOMPILE_LIMIT),
                           ("accumulated", ACCUMULATED_RECOMPILE_LIMIT)):
        name = config_name(cfg, setting)
        setattr(cfg, name, max(getattr(cfg, name), limit))


def warm_call(impl: TorchCore, state: Dict[str, Any]) -> float:
    """Seconds of one untimed call (compiling on first use of a shape), barrier included.

    Past dynamo's recompile limit a compiled function quietly runs eagerly; here that is
    an error instead, so a sweep never times the eager code under a compiled name.
    """
    import torch._dynamo

    start = time.perf_counter()
    with refuse_eager_fallback(torch._dynamo.config):
        impl.run(state)
    impl.synchronize(state)
    return time.perf_counter() - start


# What dynamo logs (logger torch._dynamo.convert_frame, WARNING) when a function reaches a
# recompile limit and runs eagerly from then on, in every release that has the limits.
LIMIT_HIT_MESSAGE = "torch._dynamo hit config."


class _LimitHit(logging.Handler):
    """Records dynamo's "hit config.<limit>" warnings while installed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.hits: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith(LIMIT_HIT_MESSAGE):
            self.hits.append(record.getMessage().splitlines()[0])


@contextlib.contextmanager
def refuse_eager_fallback(cfg: Any) -> Iterator[None]:
    """Make a compiled call that reaches dynamo's recompile limit an error, not an eager run.

    Where dynamo has a setting for it (``fail_on_recompile_limit_hit``, before that
    ``fail_on_cache_limit_hit``), that setting; where it has none (torch 2.4 and older), the
    warning dynamo logs when it falls back is watched and raised as a RuntimeError after the
    call, so the compiled names run on those releases too."""
    try:
        name = config_name(cfg, "fail_on_hit")
    except AttributeError:
        name = None
    if name is not None:
        with cfg.patch(**{name: True}):
            yield
        return
    logger = logging.getLogger("torch._dynamo.convert_frame")
    watch = _LimitHit()
    logger.addHandler(watch)
    try:
        yield
    finally:
        logger.removeHandler(watch)
    if watch.hits:
        raise RuntimeError(f"torch.compile ran eagerly past dynamo's recompile limit: "
                           f"{watch.hits[0]}")


PROBE_PREFIX = "torch.compile probe:"  # suite.plugins.cache names: prefix + variant name
# name -> why that variant is not registered here (filled by ``variants()``).
DROPPED: Dict[str, str] = {}


def _probe(cls: type) -> Optional[str]:
    """None when a tiny masked float32 problem compiles and runs on the CPU, else why not."""
    from suite.spec.problem import Mask, make_problem

    p = make_problem(0, B=2, L=5, S=7, E=8, H=2, mask=Mask(valid_lens=np.array([7, 3])))
    try:
        impl = cls()
        state = impl.prepare(p, "cpu", "float32")
        out = impl.fetch(state, impl.run(state)).output
    except Exception as exc:  # any compile failure means: not usable here
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None if np.isfinite(out).all() else "the probe gave non-finite output"


def forced_below_native() -> Optional[str]:
    """Why inductor's code is not measured in this process, or None: ATEN_CPU_CAPABILITY
    forces torch's kernels below the CPU's own level, and inductor's generated C++ then gives
    wrong numbers and out-of-bounds indexing (measured, torch 2.13.0+cpu forced to avx2 on an
    AVX-512 CPU: NaN in large_logits, two identical calls 5e13 apart, FlexAttention's index out
    of bounds), so a lower level stands in for a CPU only for torch's own kernels."""
    from suite.plugins import isa

    forced = os.environ.get(isa.TORCH_ENV)
    if not forced:
        return None
    native = isa.native_torch_level()
    if native is None or forced.lower() == native:
        return None
    return (f"{isa.TORCH_ENV}={forced} forces torch below this CPU's level ({native}): "
            "inductor's generated code is wrong there (measured); run without it")


def variants() -> List[type]:
    """The compiled variants whose probe compiles and runs here (probed once per process
    and cached on disk per library versions: a probe compiles for seconds)."""
    candidates: List[type] = [TorchCompiled, TorchCompiledPattern]
    below = forced_below_native()
    if below:
        DROPPED.update({c.name: below for c in (*candidates, TorchFlex, TorchFlexEager)})
        return []
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
        candidates += [TorchFlex, TorchFlexEager]
    except ImportError as exc:
        for cls in (TorchFlex, TorchFlexEager):
            DROPPED[cls.name] = f"torch.nn.attention.flex_attention is missing: {exc}"
    out = []
    for cls in candidates:
        why = cache.memo(f"{PROBE_PREFIX}{cls.name}", functools.partial(_probe, cls))
        if why is None:
            out.append(cls)
        else:
            DROPPED[cls.name] = why
    return out
