"""Planted Keras layers on KerasModuleCore, as a user writes them: one whose q, k and v come
from one fused ``Dense`` (E, 3E) and whose output is a ``Dense`` (E, E), nested one level
down; the same with the fused projection's columns read in the wrong order (k before q: the
layer's bug, which the cases must catch); and a wrapper whose ``layers`` name a sub-layer the
layer does not have."""

import keras

from implementations.keras.common import KerasModuleCore


class Attention(keras.layers.Layer):
    def __init__(self, heads, order=(0, 1, 2), **kwargs):
        super().__init__(**kwargs)
        self.heads, self.order = heads, order

    def build(self, query_shape):
        E = query_shape[-1]
        self.inner = keras.layers.Layer(dtype=self.dtype_policy)  # projections one level down
        self.inner.qkv = keras.layers.Dense(3 * E, dtype=self.dtype_policy)
        self.inner.qkv.build(query_shape)
        self.out = keras.layers.Dense(E, dtype=self.dtype_policy)
        self.out.build(query_shape)

    def call(self, x, allowed):
        B, L, E = x.shape
        ops, H = keras.ops, self.heads
        parts = ops.split(self.inner.qkv(x), 3, axis=-1)
        q, k, v = (ops.transpose(ops.reshape(parts[i], (B, L, H, E // H)), (0, 2, 1, 3))
                   for i in self.order)
        s = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / (E // H) ** 0.5
        if allowed is not None:  # (B, H|1, L, S), True = attend
            s = ops.where(allowed, s, ops.full_like(s, float("-inf")))
        w = ops.softmax(s, axis=-1)
        return self.out(ops.reshape(ops.transpose(ops.matmul(w, v), (0, 2, 1, 3)), (B, L, E)))


class Fused(KerasModuleCore):
    name = "kfused.ok"
    kv_source = "self"  # one input: query, key and value are the same tensor
    features = frozenset({"grad", "bool_mask", "causal", "valid_lens"})
    layers = {"qkv": "inner.qkv", "o": "out"}
    order = (0, 1, 2)

    def build(self, p, dtype):
        return Attention(p.H, self.order, dtype=dtype)  # built by the core on the inputs

    def call(self, layer, query, key, value, mask, need_weights):
        return layer(query, mask.mask)


class FusedWrongOrder(Fused):
    name = "kfused.k_before_q"
    order = (1, 0, 2)


class NoSuchLayer(Fused):
    name = "kfused.no_such_layer"
    layers = {"qkv": "inner.qkv", "o": "output_dense"}
