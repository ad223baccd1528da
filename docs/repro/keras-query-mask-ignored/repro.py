"""Reproducer: keras.layers.MultiHeadAttention ignores a ``query_mask`` passed to the call
(keras 3.15.1; the same on the torch and jax backends: run with KERAS_BACKEND=torch or jax).
Needs only NumPy and keras with a backend.

``MultiHeadAttention.call(query, value, key=None, query_mask=None, value_mask=None, ...)``
takes query_mask and value_mask, and ``_compute_attention_mask`` merges them (query mask
[B, T] -> [B, T, 1]). But ``call`` starts with ``query_mask = backend.get_keras_mask(query)``,
overwriting the argument with the query tensor's Keras mask, so a query_mask given as an
argument is dropped without a word, while value_mask given the same way is honoured.
"""
import keras
import numpy as np

layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
rng = np.random.default_rng(0)
q = rng.standard_normal((2, 5, 8)).astype("float32")  # (B, T, E)
v = rng.standard_normal((2, 7, 8)).astype("float32")  # (B, S, E)
query_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)  # (B, T)
value_mask = np.array([[1, 1, 1, 1, 0, 0, 0], [1] * 7], bool)  # (B, S)

plain = keras.ops.convert_to_numpy(layer(q, v))
with_query_mask = keras.ops.convert_to_numpy(layer(q, v, query_mask=query_mask))
with_value_mask = keras.ops.convert_to_numpy(layer(q, v, value_mask=value_mask))
as_attention_mask = keras.ops.convert_to_numpy(
    layer(q, v, attention_mask=np.broadcast_to(query_mask[:, :, None], (2, 5, 7))))
print(f"keras {keras.__version__}, {keras.config.backend()} backend")
print("query_mask argument: max change of the output", np.abs(with_query_mask - plain).max(),
      "(the same mask as attention_mask changes it by",
      f"{np.abs(as_attention_mask - plain).max():.3g})")
print("value_mask argument: max change of the output",
      f"{np.abs(with_value_mask - plain).max():.3g}")
