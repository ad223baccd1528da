"""onnxruntime 1.23's com.microsoft.GroupQueryAttention (CPU) reads local_window_size + 1 keys
per row: its window leaves out the current token, where 1.24 and later count it (a window
of local_window_size keys ending at the row's own). One node, float32, one head of 8.
Each check prints its error against both readings and BUG (1.23.0) or ok (1.24.1 and later)."""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

D = 8  # the CPU kernel takes head sizes that are multiples of 8
rng = np.random.default_rng(0)


def r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def gqa(q, k, v, past, window):
    """One GroupQueryAttention node (num_heads = kv_num_heads = 1), rows after a past of
    ``past`` slots (BNSH past_key/past_value), local_window_size = ``window``; the op's own
    causal frontier (1.23's op is always causal; 1.24+ default causal=1)."""
    B, L, _ = q.shape
    vi = helper.make_tensor_value_info
    names = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total"]
    graph = helper.make_graph(
        [helper.make_node("GroupQueryAttention", names, ["Y", "pk", "pv"], domain="com.microsoft",
                          num_heads=1, kv_num_heads=1, local_window_size=window)],
        "g", [vi("q", TensorProto.FLOAT, [B, L, D]), vi("k", TensorProto.FLOAT, [B, L, D]),
              vi("v", TensorProto.FLOAT, [B, L, D]),
              vi("past_key", TensorProto.FLOAT, [B, 1, past, D]),
              vi("past_value", TensorProto.FLOAT, [B, 1, past, D]),
              vi("seqlens_k", TensorProto.INT32, [B]), vi("total", TensorProto.INT32, [])],
        [vi(n, TensorProto.FLOAT, None) for n in ("Y", "pk", "pv")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["Y"], {"q": q, "k": k[:, past:], "v": v[:, past:],
                            "past_key": k[:, None, :past], "past_value": v[:, None, :past],
                            "seqlens_k": np.full(B, past + L - 1, np.int32),
                            "total": np.array(past + L, np.int32)})[0].astype(np.float64)


def windowed(q, k, v, past, keys):
    """float64 causal attention, row i (at position past + i) reading the ``keys`` keys
    past + i - keys < j <= past + i."""
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / np.sqrt(D)
    pos = past + np.arange(q.shape[1])[:, None]
    j = np.arange(k.shape[1])[None]
    s = np.where((j <= pos) & (j > pos - keys), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def err(a, b):
    return float(np.nan_to_num(np.abs(a - b), nan=np.inf).max())


schema = [s for s in ort.capi.onnxruntime_pybind11_state.get_all_operator_schema()
          if s.name == "GroupQueryAttention" and s.domain == "com.microsoft"][0]
print("onnxruntime", ort.__version__, "onnx", onnx.__version__, "numpy", np.__version__)
print("local_window_size, in this release's schema:",
      repr(schema.attributes["local_window_size"].description))
checks = [  # (name, B, L query rows, past slots, local_window_size)
    ("1 prompt L=S=2, local_window_size=1 (the suite's drawn failure)", 1, 2, 0, 1),
    ("2 prompt L=S=6, local_window_size=3", 2, 6, 0, 3),
    ("3 decode: 1 row after a past of 5, local_window_size=2", 2, 1, 5, 2),
]
for name, B, L, past, W in checks:
    q, k, v = r(B, L, D), r(B, past + L, D), r(B, past + L, D)
    got = gqa(q, k, v, past, W)
    counts = err(got, windowed(q, k, v, past, W))  # W keys, the current one included
    excludes = err(got, windowed(q, k, v, past, W + 1))  # W keys before it, plus its own
    print(f"{name:64s} err {counts:<9.3g} {'ok' if counts < 1e-5 else 'BUG'}"
          f"  (vs W + 1 keys, the current token left out of W: {excludes:.2g})")
