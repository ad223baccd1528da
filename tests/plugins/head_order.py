"""Planted bug: splits heads as (B, L, D, H) instead of (B, L, H, D)."""


from implementations.numpy.mha import NumpyMHA
from suite.plugins.declarations import VARIANT_FEATURES


class WrongHeadOrder(NumpyMHA):
    name = "bug.head_order"
    features = NumpyMHA.features - VARIANT_FEATURES  # its own core: no score variants

    def run(self, s):
        p, w = s["p"], s["w"]
        B, L, S, H, D = p.B, p.L, p.S, p.H, p.D
        if p.K != H:
            raise NotImplementedError("this planted bug only handles H_kv == H")

        def split(x, n):  # the bug: the head index taken as the fastest-moving one
            return x.reshape(B, n, D, H).transpose(0, 3, 1, 2)  # (B, H, n, D)

        q = split(s["query"] @ w["w_q"] + (0 if w["b_q"] is None else w["b_q"]), L)
        k = split(s["key"] @ w["w_k"] + (0 if w["b_k"] is None else w["b_k"]), S)
        v = split(s["value"] @ w["w_v"] + (0 if w["b_v"] is None else w["b_v"]), S)
        heads, weights = self.attend(q, k, v, s["mask"], s["scale"], s["need_weights"])
        out = heads.transpose(0, 2, 3, 1).reshape(B, L, H * D) @ w["w_o"]  # same wrong order
        return (out if w["b_o"] is None else out + w["b_o"]), weights
