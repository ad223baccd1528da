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
# 5. softcap beside a boolean mask: the cap on the scores, then the mask (1.24-1.26: the cap
#    after the mask, so the masked key gets weight)
Q, K, V = r(1, 1, 2, 4), r(1, 1, 3, 4), r(1, 1, 3, 4)
m = np.array([[[[True, False, True], [True, False, True]]]])
s = Q.astype(np.float64) @ np.swapaxes(K, -1, -2) / 2
report("5 softcap=1 beside a boolean attn_mask", err(
    run({"Q": Q, "K": K, "V": V, "attn_mask": m}, softcap=1.0),
    softmax_attention(Q, K, V, np.tanh(s) - s + np.where(m, 0.0, -np.inf))))
# 6. nonpad_kv_seqlen alone (B=2, lengths 2 and 3 of 4 keys): the padding is not attended
#    (1.24: every key is)
Q, K, V = r(2, 1, 2, 4), r(2, 1, 4, 4), r(2, 1, 4, 4)
lens = np.array([2, 3])
pad = np.where(np.arange(4)[None] < lens[:, None], 0.0, -np.inf)[:, None, None]
got = run({"Q": Q, "K": K, "V": V, "nonpad_kv_seqlen": lens})
report("6 nonpad_kv_seqlen alone", err(got, softmax_attention(Q, K, V, pad)),
       f"  (vs every key attended: {err(got, softmax_attention(Q, K, V, 0)):.2g})")
# 7. is_causal, one query row, 2 keys, no past: top left, key 0 only (1.24-1.27: every key)
Q, K, V = r(1, 1, 1, 4), r(1, 1, 2, 4), r(1, 1, 2, 4)
got = run({"Q": Q, "K": K, "V": V}, is_causal=1)
report("7 is_causal, L=1 < S=2, no past (top left)", err(got, softmax_attention(Q, K, V, causal(1, 2))),
       f"  (vs no mask: {err(got, softmax_attention(Q, K, V, 0)):.2g})")
# 8. an attn_mask with a head axis of q_num_heads beside one kv head (the spec: broadcastable
#    to (B, q_num_heads, L, S); 1.24 refuses it)
Q, K, V = r(1, 2, 1, 4), r(1, 1, 1, 4), r(1, 1, 1, 4)
b = r(1, 2, 1, 1)
try:
    report("8 attn_mask (1, q_num_heads, L, S) beside 1 kv head", err(
        run({"Q": Q, "K": K, "V": V, "attn_mask": b}),
        softmax_attention(Q, np.repeat(K, 2, 1), np.repeat(V, 2, 1), b)))
except Exception as exc:  # onnxruntime's own exception types
    print(f"{'8 attn_mask (1, q_num_heads, L, S) beside 1 kv head':60s} raises     BUG "
          f"({str(exc).strip()[-100:]})")
# 9. TensorScatter (opset 24), the static cache's write: one row written at slot 1
graph = helper.make_graph(
    [helper.make_node("TensorScatter", ["c", "u", "w"], ["o"], axis=2)], "g",
    [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 1, 4, 2]),
     helper.make_tensor_value_info("u", TensorProto.FLOAT, [1, 1, 1, 2]),
     helper.make_tensor_value_info("w", TensorProto.INT64, [1])],
    [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)
try:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = sess.run(None, {"c": np.zeros((1, 1, 4, 2), np.float32),
                          "u": np.ones((1, 1, 1, 2), np.float32), "w": np.array([1])})[0]
    report("9 TensorScatter-24 (a static cache's write)", err(out[0, 0, :, 0], np.eye(4)[1]))
except Exception as exc:
    print(f"{'9 TensorScatter-24 (a static cache write)':60s} raises     BUG "
          f"({str(exc).strip()[-70:]})")
