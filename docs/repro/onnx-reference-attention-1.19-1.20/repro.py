"""onnx.reference's Attention (op_attention._compute_attention) in onnx 1.19 and 1.20.1: one
check per cause, each printing its measured error and BUG or ok (onnx 1.23.2: all ok)."""
import numpy as np
import onnx
from onnx.reference.ops.op_attention import _compute_attention as attention

rng = np.random.default_rng(0)


def r(*shape):
    return rng.standard_normal(shape)


def softmax_attention(Q, K, V, bias, cap=None):
    """softmax(cap(Q K^T / sqrt(d)) + bias) V in float64; a row with no key to attend is 0."""
    s = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    s = (s if cap is None else cap * np.tanh(s / cap)) + bias
    top = s.max(-1, keepdims=True)
    seen = np.isfinite(top)
    e = np.exp(s - np.where(seen, top, 0))
    return np.where(seen, e / np.where(seen, e.sum(-1, keepdims=True), 1), 0) @ V


def causal(L, S, offset=0):
    return np.where(np.arange(S)[None] <= np.arange(L)[:, None] + offset, 0.0, -np.inf)


def err(a, b):
    return float(np.nan_to_num(np.abs(a - b), nan=np.inf).max())


def report(name, e):
    print(f"{name:58s} err {e:<10.3g} {'ok' if e < 1e-12 else 'BUG'}")


print("onnx", onnx.__version__)
# 1. nonpad_kv_seqlen with batch 2: 1.19/1.20 add the (B,1,1,S) padding bias in place into a
#    (1,1,L,S) array
Q, K, V = r(2, 2, 3, 4), r(2, 2, 5, 4), r(2, 2, 5, 4)
pad = np.where(np.arange(5)[None] < np.array([3, 5])[:, None], 0.0, -np.inf)[:, None, None]
try:
    report("1 nonpad_kv_seqlen, B=2", err(attention(Q, K, V, nonpad_kv_seqlen=np.array([3, 5]))[0],
                                          softmax_attention(Q, K, V, pad)))
except ValueError as exc:
    print(f"{'1 nonpad_kv_seqlen, B=2':58s} raises     BUG ({exc})")
# 2. GQA, 4 query heads on 2 kv heads: query head h must read kv head h // 2 (1.19 tiles: h % 2)
Q, K, V = r(1, 4, 3, 4), r(1, 2, 5, 4), r(1, 2, 5, 4)
g = [0, 0, 1, 1]
report("2 GQA (vs query head h reading kv head h // 2)",
       err(attention(Q, K, V)[0], softmax_attention(Q, K[:, g], V[:, g], 0)))
# 3. a row whose every key the additive mask sets to -inf: the spec's zero row, not NaN
Q, K, V = r(1, 1, 2, 4), r(1, 1, 3, 4), r(1, 1, 3, 4)
m = np.zeros((2, 3))
m[1] = -np.inf
report("3 fully masked row (zero, not NaN)", err(attention(Q, K, V, attn_mask=m)[0],
                                                softmax_attention(Q, K, V, m)))
# 4. softcap beside a mask: the cap on the scores, then the mask (1.19/1.20 cap the masked sum)
m = np.array([[0.0, -np.inf, 0.0], [0.0, -np.inf, 0.0]])
report("4 softcap=1 beside a mask", err(attention(Q, K, V, attn_mask=m, softcap=1.0)[0],
                                        softmax_attention(Q, K, V, m, cap=1.0)))
# 5. is_causal beside a boolean attn_mask (all True): (1 - mask) * -inf is 0 * -inf = NaN
Q, K, V = r(1, 1, 3, 4), r(1, 1, 3, 4), r(1, 1, 3, 4)
report("5 is_causal beside a boolean attn_mask", err(
    attention(Q, K, V, attn_mask=np.ones((3, 3), bool), is_causal=1)[0],
    softmax_attention(Q, K, V, causal(3, 3))))
# 6. is_causal with a past of 2: query i sees keys j <= i + 2 (1.19: j <= i)
PK, PV = r(1, 1, 2, 4), r(1, 1, 2, 4)
report("6 is_causal beside past_key (frontier j <= i + past)", err(
    attention(Q, K, V, past_key=PK, past_value=PV, is_causal=1)[0],
    softmax_attention(Q, np.concatenate([PK, K], 2), np.concatenate([PV, V], 2), causal(3, 5, 2))))
# 7. is_causal beside nonpad_kv_seqlen = S (L=3, S=5): j <= i + nonpad - L (1.19/1.20: j <= i)
Q, K, V = r(1, 1, 3, 4), r(1, 1, 5, 4), r(1, 1, 5, 4)
report("7 is_causal beside nonpad_kv_seqlen (j <= i + nonpad - L)", err(
    attention(Q, K, V, is_causal=1, nonpad_kv_seqlen=np.array([5]))[0],
    softmax_attention(Q, K, V, causal(3, 5, 2))))
