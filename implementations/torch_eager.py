"""torch.eager: the plain algorithm in torch ops (matmul, masked softmax, matmul)."""

from __future__ import annotations

from implementations.torch_common import ALL_LAYOUTS, TorchCore, masked_softmax, zero_dead_values
from suite.adapters import AttendMask
from suite.plugin import Deviation


class TorchEager(TorchCore):
    name = "torch.eager"
    features = TorchCore.features | {"weights"}
    layouts = ALL_LAYOUTS
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN or inf value at a key masked for some rows but not all reaches those "
                    "rows: their weight there is 0 and 0 * NaN is NaN in weights @ v (values "
                    "masked for every row are zeroed first; measured, special_values cases)")}

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, L, S)
        if mask.bias is not None:
            # Masked scores are exactly -inf, even where padded keys hold NaN.
            scores = (scores + mask.bias).masked_fill(~mask.allowed, float("-inf"))
        weights = masked_softmax(scores)  # fully masked row -> zeros (spec)
        v = zero_dead_values(v, mask)
        return weights @ v, (weights if need_weights else None)  # (B, H, L, D)
