"""Planted wrappers of a small torch module (and JAX ones), as a user writes them with the
module cores: a correct one, one whose own ``call`` raises, one that hands torch an argument it
refuses, one whose ``load_weights`` transposes the weights, two whose ``module_mask`` gets the
mask wrong (True/False turned over; the key padding dropped), and a Flax module loaded right
and loaded with k and v swapped (the wrapper's bugs, not the library's: the ``wrapper``
family says so). Their ``framework`` names another library than the core's array library."""

import dataclasses

import torch

from implementations.jax.common import JaxModuleCore
from implementations.torch.common import TorchModuleCore
from suite.plugins import adapters


class Attention(torch.nn.Module):
    def __init__(self, E: int, H: int):
        super().__init__()
        self.H = H
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            torch.nn.Linear(E, E) for _ in range(4))

    def forward(self, q, k, v, mask, softmax_dim=-1):
        B, L, E = q.shape
        heads = [p(x).view(B, x.shape[1], self.H, -1).transpose(1, 2)
                 for p, x in ((self.q_proj, q), (self.k_proj, k), (self.v_proj, v))]
        scores = heads[0] @ heads[1].transpose(-1, -2) / heads[0].shape[-1] ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.nn.functional.softmax(scores, dim=softmax_dim)
        return self.out_proj((weights @ heads[2]).transpose(1, 2).reshape(B, L, E))


class Wrapped(TorchModuleCore):
    name = "wrap.ok"
    framework = "hf"  # a torch module from another library: its version is that library's
    features = frozenset({"cross", "bool_mask"})

    def build(self, p):
        return Attention(p.E, p.H)

    def call(self, module, query, key, value, mask, need_weights):
        return module(query, key, value, mask.mask), None


class OwnBug(Wrapped):
    name = "wrap.own_bug"

    def call(self, module, query, key, value, mask, need_weights):
        options = {"mask": mask.mask}
        return module(query, key, value, options["attn_mask"]), None  # the wrapper's typo


class LibraryRefuses(Wrapped):
    name = "wrap.library_refuses"

    def call(self, module, query, key, value, mask, need_weights):
        return module(query, key, value, mask.mask, softmax_dim=7), None  # torch raises


class Transposed(Wrapped):
    name = "wrap.transposed"

    def load_weights(self, module, problem):
        for role, layer in self.layers.items():
            w = getattr(problem.weights, f"w_{role}")
            getattr(module, layer).weight.copy_(torch.as_tensor(w))  # (in, out): not transposed
            getattr(module, layer).bias.copy_(torch.as_tensor(getattr(problem.weights,
                                                                      f"b_{role}")))


class FlaxNamed(JaxModuleCore):
    name = "wrap.flax"
    framework = "flax"

    def call(self, module, params, query, key, value, mask, need_weights):
        raise NotImplementedError


class MaskInverted(Wrapped):
    """Hands the module the mask turned over (True = masked) while its parts still say True =
    attend: every masking case would blame torch."""

    name = "wrap.mask_inverted"

    def module_mask(self, problem, device, dtype):
        parts = super().module_mask(problem, device, dtype)
        return parts if parts.mask is None else dataclasses.replace(parts, mask=~parts.mask)


class DropsPadding(Wrapped):
    """Splits the key padding out (``key_padding=True``) and then leaves it behind."""

    name = "wrap.drops_padding"
    features = frozenset({"cross", "bool_mask", "valid_lens"})

    def module_mask(self, problem, device, dtype):
        parts = adapters.split_mask(problem, true_means="attend", key_padding=True,
                                    native_causal=(), per_head=True)
        mask = None if parts.mask is None else torch.as_tensor(parts.mask, device=device)
        return dataclasses.replace(parts, key_padding=None, mask=mask)  # the padding is lost

    def call(self, module, query, key, value, mask, need_weights):
        return module(query, key, value, mask.mask), None


class FlaxWrapped(JaxModuleCore):
    """A Flax linen module with four ``nn.Dense`` projections, loaded right."""

    name = "wrap.flax_ok"
    framework = "flax"
    features = frozenset({"valid_lens", "causal", "bool_mask", "cross"})

    def build(self, p, dtype):
        from examples.my_jax_attention import MyJaxAttention  # flax: only these names need it

        return MyJaxAttention(p.H, bias=p.weights.b_q is not None), self.dense_params(p, dtype)

    def call(self, module, params, query, key, value, mask, need_weights):
        return module.apply({"params": params}, query, key, value, mask=mask.mask)


class FlaxSwappedKV(FlaxWrapped):
    """Loads the key projection's weights into ``v_proj`` and the value's into ``k_proj``."""

    name = "wrap.flax_swapped_kv"

    def build(self, p, dtype):
        module, params = super().build(p, dtype)
        params["k_proj"], params["v_proj"] = params["v_proj"], params["k_proj"]
        return module, params
