"""A library that pairs query head h with kv head h % K (interleaved, as some libraries tile
their kv heads), declared and undeclared, in NumPy (with weights) and torch (with gradients)."""

import numpy as np

from implementations.numpy.mha import NumpyMHA


class Interleaved(NumpyMHA):
    """Declares its grouping: the harness reorders the query heads for it."""

    name = "grouping.interleaved"
    kv_grouping = "interleaved"
    # its own projections read the logical key and value: not a paged cache's pool
    features = NumpyMHA.features - {"paged"}

    def run(self, s):
        p, w = s["p"], s["w"]
        B, L, S, H, K, D, V = p.B, p.L, p.S, p.H, p.K, p.D, p.V

        def heads(x, n, h, width):  # (B, n, h*width) -> (B, h, n, width)
            return x.reshape(B, n, h, width).transpose(0, 2, 1, 3)

        q = heads(s["query"] @ w["w_q"] + (0 if w["b_q"] is None else w["b_q"]), L, H, D)
        k = heads(s["key"] @ w["w_k"] + (0 if w["b_k"] is None else w["b_k"]), S, K, D)
        v = heads(s["value"] @ w["w_v"] + (0 if w["b_v"] is None else w["b_v"]), S, K, V)
        k, v = np.tile(k, (1, H // K, 1, 1)), np.tile(v, (1, H // K, 1, 1))  # h reads h % K
        out, weights = self.attend(q, k, v, s["mask"], s["scale"], s["need_weights"])
        out = out.transpose(0, 2, 1, 3).reshape(B, L, H * V) @ w["w_o"]  # (B, L, E)
        return (out if w["b_o"] is None else out + w["b_o"]), weights


class Undeclared(Interleaved):
    """The same library, its grouping not declared: a wrong answer under GQA."""

    name = "grouping.undeclared"
    kv_grouping = "grouped"


try:
    from implementations.torch.eager import TorchEager
except ImportError:  # torch not installed: the NumPy plugins only
    TorchEager = None

if TorchEager is not None:
    class TorchInterleaved(TorchEager):
        """torch with gradients: kv heads tiled, so query head h reads kv head h % K."""

        name = "grouping.torch_interleaved"
        kv_grouping = "interleaved"
        repeat_kv = False

        def attend(self, q, k, v, mask, scale, need_weights):
            reps = q.shape[1] // k.shape[1]
            return super().attend(q, k.repeat(1, reps, 1, 1), v.repeat(1, reps, 1, 1), mask,
                                  scale, need_weights)  # (B, H, S, D): h reads h % K
