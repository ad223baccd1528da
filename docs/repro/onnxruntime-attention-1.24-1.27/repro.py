"""onnxruntime's CPU kernel of the ONNX Attention op (opset 24) in 1.24 to 1.27: one check per
cause, each printing its measured error and BUG or ok (1.32.0: all ok)."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

rng = np.random.default_rng(0)


def r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def run(inputs, **attrs):
    """One Attention node (opset 24) on 4-D float32 Q, K, V (B, heads, L, d) and the inputs
    given by name (attn_mask, nonpad_kv_seqlen), on onnxruntime's CPU provider."""
    names = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    ins = [n if n in inputs else "" for n in names]
    while not ins[-1]:
        ins.pop()
    kind = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(bool): TensorProto.BOOL,
            np.dtype(np.int64): TensorProto.INT64}
    graph = helper.make_graph(
        [helper.make_node("Attention", ins, ["Y"], **attrs)], "g",
        [helper.make_tensor_value_info(n, kind[inputs[n].dtype], inputs[n].shape)
         for n in names if n in inputs],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0].astype(np.float64)


def softmax_attention(Q, K, V, bias):
    """softmax(Q K^T / sqrt(d) + bias) V in float64; a row with no key to attend is 0."""
    s = Q.astype(np.float64) @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1]) + bias
    top = s.max(-1, keepdims=True)
    seen = np.isfinite(top)
    e = np.exp(s - np.where(seen, top, 0))
    return np.where(seen, e / np.where(seen, e.sum(-1, keepdims=True), 1), 0) @ V


def causal(L, S, offset=0):
    return np.where(np.arange(S)[None] <= np.arange(L)[:, None] + offset, 0.0, -np.inf)


def err(a, b):
    return float(np.nan_to_num(np.abs(a - b), nan=np.inf).max())


def report(name, e, extra=""):
    print(f"{name:60s} err {e:<10.3g} {'ok' if e < 1e-5 else 'BUG'}{extra}")


print("onnxruntime", ort.__version__)
Q, K, V = r(1, 1, 2, 4), r(1, 1, 3, 4), r(1, 1, 3, 4)
# 1. a boolean attn_mask row with no True: the spec's zero row (1.24-1.27: the mean of V)
m = np.array([[[[True, False, True], [False, False, False]]]])
got = run({"Q": Q, "K": K, "V": V, "attn_mask": m})
report("1 fully masked row, boolean attn_mask (zero row)",
       err(got, softmax_attention(Q, K, V, np.where(m, 0.0, -np.inf))),
       f"  (row 1 vs mean of V: {err(got[0, 0, 1], V[0, 0].mean(0)):.2g})")
# 2. an additive attn_mask row of -inf: the spec's zero row (1.24-1.27: NaN)
b = np.where(m, 0.0, -np.inf).astype(np.float32)
report("2 fully masked row, additive -inf attn_mask (zero row)",
       err(run({"Q": Q, "K": K, "V": V, "attn_mask": b}), softmax_attention(Q, K, V, b)))
# 3. is_causal beside nonpad_kv_seqlen (L=3, S=5, lengths 5): the frontier j <= i + 5 - 3
#    (the spec's offset nonpad_kv_seqlen - q_sequence_length; 1.24-1.27: top left, j <= i)
Q, K, V = r(1, 1, 3, 4), r(1, 1, 5, 4), r(1, 1, 5, 4)
got = run({"Q": Q, "K": K, "V": V, "nonpad_kv_seqlen": np.array([5])}, is_causal=1)
report("3 is_causal beside nonpad_kv_seqlen (j <= i + nonpad - L)",
       err(got, softmax_attention(Q, K, V, causal(3, 5, 2))),
       f"  (vs top-left j <= i: {err(got, softmax_attention(Q, K, V, causal(3, 5))):.2g})")
# 4. com.microsoft GroupQueryAttention on a right-padded causal prompt (no past): item 1 has
#    2 of its 4 keys (seqlens_k = 1), so its rows 2 and 3 attend keys 0 and 1 (key padding
#    beside the causal mask); 1.23-1.27 give other rows there, not the same on every call
B, L, d = 2, 4, 8
q, k, v = r(B, L, d), r(B, L, d), r(B, L, d)
vi = helper.make_tensor_value_info
graph = helper.make_graph(
    [helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"],
                      ["Y", "pk", "pv"], domain="com.microsoft", num_heads=1, kv_num_heads=1)],
    "g", [vi("q", TensorProto.FLOAT, [B, L, d]), vi("k", TensorProto.FLOAT, [B, L, d]),
          vi("v", TensorProto.FLOAT, [B, L, d]), vi("seqlens_k", TensorProto.INT32, [B]),
          vi("total", TensorProto.INT32, [])],
    [vi(n, TensorProto.FLOAT, None) for n in ("Y", "pk", "pv")])
model = helper.make_model(graph, ir_version=10, opset_imports=[
    helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
feeds = {"q": q, "k": k, "v": v, "seqlens_k": np.array([3, 1], np.int32),
         "total": np.array(4, np.int32)}
want = softmax_attention(q[1], k[1], v[1], causal(L, L) + np.where(np.arange(L) < 2, 0, -np.inf))
errs = [err(sess.run(["Y"], feeds)[0][1].astype(np.float64), want) for _ in range(5)]
report("4 GroupQueryAttention, right-padded causal prompt", max(errs),
       f"  (5 calls: {', '.join(f'{e:.2g}' for e in errs)})")
