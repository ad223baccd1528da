"""The suite's own Triton FlashAttention kernels: forward (online softmax over key blocks) and
backward.

Written from the published algorithm (Dao et al., FlashAttention-2, Algorithm 1): each program
owns ``BLOCK_M`` query rows of one (batch, head), walks the key blocks in order keeping the
running row max ``m``, the running sum ``l`` and the unnormalised output ``acc`` in float32,
rescales ``l`` and ``acc`` by ``exp(m_old - m_new)`` when the max grows, and divides once at
the end. Masks: causal (``causal_offset`` = 0 top-left, S - L bottom-right), key lengths per
query row (``lens`` (B, L): key j visible iff j < lens[b, i]), GQA (query head h reads kv
head h // (H // K)). A row with no visible key gives zeros (the spec), not 0/0.

The forward also stores each row's log-sum-exp of its scaled scores (natural log, float32;
+inf for a row with no visible key, so its recomputed weights exp(s - lse) are all 0). The
backward follows FlashAttention-2's Algorithm 2: with ``delta = rowsum(dO * O)`` (computed by
the caller), ``flash_backward_dkdv`` owns a block of keys of one kv head and walks the query
blocks of each of its ``GROUP`` query heads (the GQA sum happens inside the program: no
atomics), ``flash_backward_dq`` owns a block of query rows and walks the key blocks as the
forward does. A fully masked row has weights 0, so it passes no gradient (its output is the
constant 0).

Import this module only after deciding between a GPU and the interpreter: triton 3.9 reads
``TRITON_INTERPRET`` when ``@triton.jit`` decorates (``triton.knobs.runtime.interpret``), so
``implementations.kernels.triton_flash`` sets it before importing this module when no CUDA device is
present.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def key_end(b, pid_m, S, maxlen_ptr, causal_offset, CAUSAL: tl.constexpr,
            HAS_LENS: tl.constexpr, BLOCK_M: tl.constexpr):
    """One past the last key query block ``pid_m`` of batch item ``b`` may see: keys past it
    are never read (they may hold NaN padding)."""
    end = S
    if HAS_LENS:
        end = tl.minimum(end, tl.load(maxlen_ptr + b))
    if CAUSAL:  # the last key the last row of this block may see, plus one
        end = tl.minimum(end, tl.maximum((pid_m + 1) * BLOCK_M + causal_offset, 0))
    return end


@triton.jit
def visible_keys(rows, cols, row_ok, col_ok, lens_ptr, b, L, causal_offset,
                 CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bool: key ``cols[j]`` visible to query ``rows[i]`` of batch item
    ``b`` (causal with ``causal_offset``, and j < lens[b, i]); the one mask of all kernels."""
    visible = col_ok[None, :] & row_ok[:, None]
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
    if HAS_LENS:
        lens = tl.load(lens_ptr + b * L + rows, mask=row_ok, other=0)  # (BLOCK_M,)
        visible = visible & (cols[None, :] < lens[:, None])
    return visible


@triton.jit
def flash_forward(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, lens_ptr, maxlen_ptr,  # tensors
                  L, S, D, H, GROUP,  # sizes; GROUP = H // K query heads per kv head
                  scale,  # softmax scale, folded into the exponent base 2 below
                  causal_offset,  # key j visible to query i iff j <= i + causal_offset
                  CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, DOT_F32: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """q, o (B, H, L, D); k, v (B, K, S, D), all contiguous; lse (B, H, L) float32; lens
    (B, L) int32; maxlen (B,).

    DOT_F32: give ``tl.dot`` float32 operands. Products of two bfloat16 (or float16) numbers
    are exact in float32, so with float32 accumulation this is the same arithmetic; it is
    set under the interpreter only, whose bfloat16 ``tl.dot`` is wrong (triton 3.9.0,
    docs/repro/triton-interpret-bf16-dot/), and not on a GPU (float32 dots there may use TF32).
    """
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kv = b * (H // GROUP) + h // GROUP  # the (batch, kv head) this query head reads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this program
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < L
    d_ok = offs_d < D
    q = tl.load(q_ptr + (bh * L + offs_m[:, None]) * D + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    if DOT_F32:
        q = q.to(tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (scaled, base 2)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # running unnormalised output
    end = key_end(b, pid_m, S, maxlen_ptr, causal_offset, CAUSAL, HAS_LENS, BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < end
        k = tl.load(k_ptr + (kv * S + cols[:, None]) * D + offs_d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N), float32
        visible = visible_keys(offs_m, cols, row_ok, col_ok, lens_ptr, b, L, causal_offset,
                               CAUSAL, HAS_LENS)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with nothing visible so far keeps m = -inf: shift by 0 so exp2 stays 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)  # rescale of the old sum and output (0 when m_i = -inf)
        p = tl.exp2(s - m_safe[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + (kv * S + cols[:, None]) * D + offs_d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        p = p.to(v.dtype)  # the second matmul in the input dtype, as FlashAttention does
        if DOT_F32:
            p, v = p.to(tl.float32), v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v)  # (BLOCK_M, BLOCK_D)
        m_i = m_new
    # A row that saw no key divides by 1: its output stays 0 (the spec), not 0/0.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + (bh * L + offs_m[:, None]) * D + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    # Natural-log LSE of the scaled scores; +inf where the row saw nothing (weights 0 there).
    lse = tl.where(l_i > 0, (m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))) * 0.6931471805599453,
                   float("inf"))
    tl.store(lse_ptr + bh * L + offs_m, lse, mask=row_ok)


@triton.jit
def flash_backward_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                        lens_ptr, maxlen_ptr,  # tensors
                        L, S, D, H, GROUP, scale, causal_offset,  # as in ``flash_forward``
                        CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, DOT_F32: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """dk, dv (B, K, S, D) of one block of BLOCK_N keys of one (batch, kv head).

    q, do (B, H, L, D); k, v (B, K, S, D); lse, delta (B, H, L) float32; lens, maxlen as in
    ``flash_forward``. The weights are recomputed from lse: p = exp(s - lse); then
    dv = sum over the group's rows of p^T dO, dp = dO v^T, ds = p (dp - delta), dk = scale ds^T q.
    """
    pid_n = tl.program_id(0)
    bk = tl.program_id(1)  # b * K + kv head
    K = H // GROUP
    b = bk // K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # key rows of this program
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = offs_n < S
    d_ok = offs_d < D
    if HAS_LENS:  # keys past every row's length are never read (they may hold NaN padding)
        col_ok = col_ok & (offs_n < tl.load(maxlen_ptr + b))
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + (bk * S + offs_n[:, None]) * D + offs_d[None, :], mask=kv_mask,
                other=0.0)  # (BLOCK_N, BLOCK_D)
    v = tl.load(v_ptr + (bk * S + offs_n[:, None]) * D + offs_d[None, :], mask=kv_mask,
                other=0.0)  # (BLOCK_N, BLOCK_D)
    if DOT_F32:
        k, v = k.to(tl.float32), v.to(tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # Query rows before the first one that may see this block's first key see none of it.
    start = 0
    if CAUSAL:
        start = tl.maximum(pid_n * BLOCK_N - causal_offset, 0) // BLOCK_M * BLOCK_M
    for g in range(0, GROUP):  # the query heads reading this kv head: their sum, no atomics
        bh = bk * GROUP + g  # b * H + h with h = kv head * GROUP + g
        for start_m in range(start, L, BLOCK_M):
            rows = start_m + offs_m
            row_ok = rows < L
            q = tl.load(q_ptr + (bh * L + rows[:, None]) * D + offs_d[None, :],
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
            do = tl.load(do_ptr + (bh * L + rows[:, None]) * D + offs_d[None, :],
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
            lse = tl.load(lse_ptr + bh * L + rows, mask=row_ok, other=float("inf"))  # (BLOCK_M,)
            delta = tl.load(delta_ptr + bh * L + rows, mask=row_ok, other=0.0)  # (BLOCK_M,)
            if DOT_F32:
                q, do = q.to(tl.float32), do.to(tl.float32)
            s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N), base-2 logits
            visible = visible_keys(rows, offs_n, row_ok, col_ok, lens_ptr, b, L, causal_offset,
                                   CAUSAL, HAS_LENS)
            # The forward's normalised weights; 0 where hidden and on rows that saw nothing.
            p = tl.where(visible, tl.exp2(s - (lse * 1.4426950408889634)[:, None]), 0.0)
            pt = p.to(do_ptr.dtype.element_ty)  # in the input dtype, as the forward's p @ v
            if DOT_F32:
                pt = pt.to(tl.float32)
            dv += tl.dot(tl.trans(pt), do)  # (BLOCK_N, BLOCK_D)
            dp = tl.dot(do, tl.trans(v))  # (BLOCK_M, BLOCK_N)
            ds = p * (dp - delta[:, None])  # (BLOCK_M, BLOCK_N), float32
            dst = ds.to(q_ptr.dtype.element_ty)
            if DOT_F32:
                dst = dst.to(tl.float32)
            dk += tl.dot(tl.trans(dst), q)  # (BLOCK_N, BLOCK_D)
    tl.store(dk_ptr + (bk * S + offs_n[:, None]) * D + offs_d[None, :],
             (dk * scale).to(dk_ptr.dtype.element_ty), mask=(offs_n < S)[:, None] & d_ok[None, :])
    tl.store(dv_ptr + (bk * S + offs_n[:, None]) * D + offs_d[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=(offs_n < S)[:, None] & d_ok[None, :])


@triton.jit
def flash_backward_dq(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                      lens_ptr, maxlen_ptr,  # tensors
                      L, S, D, H, GROUP, scale, causal_offset,  # as in ``flash_forward``
                      CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, DOT_F32: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """dq (B, H, L, D) of one block of BLOCK_M query rows of one (batch, head): the forward's
    key loop, with dq = scale * sum over keys of ds k (ds as in ``flash_backward_dkdv``)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kv = b * (H // GROUP) + h // GROUP  # the (batch, kv head) this query head reads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < L
    d_ok = offs_d < D
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + (bh * L + offs_m[:, None]) * D + offs_d[None, :], mask=q_mask,
                other=0.0)  # (BLOCK_M, BLOCK_D)
    do = tl.load(do_ptr + (bh * L + offs_m[:, None]) * D + offs_d[None, :], mask=q_mask,
                 other=0.0)  # (BLOCK_M, BLOCK_D)
    if DOT_F32:
        q, do = q.to(tl.float32), do.to(tl.float32)
    lse2 = tl.load(lse_ptr + bh * L + offs_m, mask=row_ok, other=float("inf")) \
        * 1.4426950408889634  # (BLOCK_M,), base 2
    delta = tl.load(delta_ptr + bh * L + offs_m, mask=row_ok, other=0.0)  # (BLOCK_M,)
    qk_scale = scale * 1.4426950408889634
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # The forward's key range: keys it never read get no gradient and are not read.
    end = key_end(b, pid_m, S, maxlen_ptr, causal_offset, CAUSAL, HAS_LENS, BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < end
        kv_mask = col_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + (kv * S + cols[:, None]) * D + offs_d[None, :], mask=kv_mask,
                    other=0.0)  # (BLOCK_N, BLOCK_D)
        v = tl.load(v_ptr + (kv * S + cols[:, None]) * D + offs_d[None, :], mask=kv_mask,
                    other=0.0)  # (BLOCK_N, BLOCK_D)
        if DOT_F32:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N), base-2 logits
        visible = visible_keys(offs_m, cols, row_ok, col_ok, lens_ptr, b, L, causal_offset,
                               CAUSAL, HAS_LENS)
        p = tl.where(visible, tl.exp2(s - lse2[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)
        dp = tl.dot(do, tl.trans(v))  # (BLOCK_M, BLOCK_N)
        ds = (p * (dp - delta[:, None])).to(k_ptr.dtype.element_ty)
        if DOT_F32:
            ds = ds.to(tl.float32)
        dq += tl.dot(ds, k)  # (BLOCK_M, BLOCK_D)
    tl.store(dq_ptr + (bh * L + offs_m[:, None]) * D + offs_d[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=q_mask)
