"""Planted bug: the value path is detached from autograd (forward right, gradients wrong)."""

from implementations.torch.eager import TorchEager


class DetachedValue(TorchEager):
    name = "bug.detached_value"

    def attend(self, q, k, v, mask, scale, need_weights):
        # No gradient reaches value, w_v or b_v; the forward is unchanged.
        return super().attend(q, k, v.detach(), mask, scale, need_weights)
