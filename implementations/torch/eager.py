"""torch.eager: the plain algorithm in torch ops (matmul, masked softmax, matmul), with
every score variant (``suite.spec.variants``) in torch ops: the reference on torch. A paged
key/value cache (``suite.spec.paging``) is read by indexing the projected pool with the block table
(``TorchCore.read_pages``)."""

from __future__ import annotations

import torch

from implementations.torch.common import (
    ALL_LAYOUTS,
    TorchCore,
    masked_softmax,
    vary_scores,
    zero_dead_values,
)
from suite.plugins.adapters import AttendMask
from suite.plugins.declarations import VARIANT_FEATURES, Deviation


class TorchEager(TorchCore):
    name = "torch.eager"
    features = TorchCore.features | {"weights", "decode", "packed", "steps", "static_cache",
                                     "paged", "dropout"} | VARIANT_FEATURES
    layouts = ALL_LAYOUTS
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN or inf value at a key masked for some rows but not all reaches those "
                    "rows: their weight there is 0 and 0 * NaN is NaN in weights @ v (values "
                    "masked for every row are zeroed first; measured, special_values cases)")}

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, L, S)
        variants = mask.variants
        if variants is not None:  # cap, position biases, score_mod: before the mask
            scores = vary_scores(scores, variants, mask)
        if mask.bias is not None:
            # Masked scores are exactly -inf, even where padded keys hold NaN.
            scores = (scores + mask.bias).masked_fill(~mask.allowed, float("-inf"))
        # fully masked row -> zeros (spec), with a sink too
        weights = masked_softmax(scores, None if variants is None else variants.sinks)
        if mask.dropout is not None:  # training mode: inverted dropout of the weights
            weights = torch.nn.functional.dropout(weights, mask.dropout, training=True)
        v = zero_dead_values(v, mask)
        return weights @ v, (weights if need_weights else None)  # (B, H, L, V)
