"""The adapter toolkit: the canonical problem in the terms each library takes.

A plugin translates; it never repairs the library it measures. What it translates is
the same everywhere, so it lives here, in NumPy (no framework is imported):

- the mask: ``split_mask(problem, ...)`` splits the canonical mask (``valid_lens``,
  causal, ``allowed``, ``bias``, combined with AND) into the parts a library takes, each
  in its convention: key padding (B, S), a native causal flag, the remaining boolean
  mask (per head or head-free, True = attend or True = masked) and the additive bias;
  ``MaskParts.additive(...)`` folds what was not split out into one float mask
  (Hugging Face's 4-D additive masks, a float ``attn_mask``);
- the weights: converters from the canonical right-multiply layout
  (``suite.spec.problem.Weights``) to ``nn.Linear`` (out, in) per projection, the packed
  ``in_proj_weight`` (3E, E) of ``nn.MultiheadAttention``, the Keras/Flax
  ``EinsumDense``/``DenseGeneral`` kernels (E, H, D) and (H, D, E), and Hugging Face's
  ``Conv1D`` (in, out), GPT-2's packed ``c_attn`` (E, 3E) included;
- the gradients: each layout's ``grads_from_*`` maps gradients in that layout back to
  the canonical names of ``suite.spec.problem.GRAD_NAMES`` (a layout is a rearrangement, so a
  gradient maps back exactly as its weight does).

Letters: B batch, L query length, S key length, E model width, H query heads, K kv heads
(GQA/MQA when K < H), D head width = E // H. Query head h reads kv head h // (H // K).

Example, a module with ``q_proj``/``k_proj``/``v_proj``/``out_proj`` (``nn.Linear``) and
Keras-style masks (head-free, True = attend, no native causal flag)::

    from suite.plugins import adapters

    lin = adapters.to_linear(problem.weights)  # role "q"|"k"|"v"|"o" -> Param(weight, bias)
    for role, layer in zip("qkvo", (m.q_proj, m.k_proj, m.v_proj, m.out_proj)):
        layer.weight.copy_(torch.as_tensor(lin[role].weight))  # (out, in)
    parts = adapters.split_mask(problem, true_means="attend", key_padding=False,
                                native_causal=(), per_head=False)
    # parts.mask: bool (B, L, S) or None; parts.bias: float (B, L, S) or None
    ...
    grads = adapters.grads_from_linear({r: adapters.Param(layer.weight.grad.numpy(),
                                                          layer.bias.grad.numpy()) ...})

Attention kernels written against the suite's adapter cores receive the mask as an
``AttendMask`` (``attend_mask``): one signature, ``attend(q, k, v, mask, scale,
need_weights)``, for the NumPy, torch and JAX cores.
"""

from suite.plugins.adapters.attend import *  # noqa: F401,F403
from suite.plugins.adapters.forms import *  # noqa: F401,F403
from suite.plugins.adapters.masks import *  # noqa: F401,F403
from suite.plugins.adapters.weights import *  # noqa: F401,F403
