"""Planted bug that exists at one instruction-set level only: torch.eager's answer, except that
where torch dispatched to its ``default`` kernels (ATEN_CPU_CAPABILITY=default) the head
outputs are off by 1e-2, as a tail loop compiled for one level alone would be."""

import torch

from implementations.torch.eager import TorchEager


class IsaBug(TorchEager):
    name = "bug.isa_default"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        if str(torch.backends.cpu.get_cpu_capability()).lower() == "default":
            heads = heads + 1e-2
        return heads, weights
