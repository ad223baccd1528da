"""The ``wrapper`` family: a module wrapper's own translation, checked before any verdict on
the library it wraps.

A plugin built on a module core (``TorchModuleCore``, ``JaxModuleCore``,
``KerasModuleCore``) translates the
canonical problem into its library's terms: the weights into the module's layers, the mask
into the parts ``call`` hands the library. A mistake there (weights loaded transposed, a
mask's True/False turned over, the key padding dropped) would otherwise show as the
library failing the masking or shapes cases. These cases read the translation back and
compare it with the canonical problem, without running the library:

- ``weights``: the weights read back from the built, loaded module (``read_weights``)
  equal the problem's (``check_wrapper``);
- ``mask_*``: the ``MaskParts`` that ``module_mask`` gives ``call``, turned back into a
  (B, H, L, S) allowed matrix and bias by its own convention, mean the canonical mask
  (``check_mask``), one case per mask kind the plugin declares in ``features``.

An implementation that is not a module wrapper, or whose own weight layout or mask
arguments the suite cannot read back (it loads a packed ``in_proj_weight`` and gives no
``read_weights``; its ``module_mask`` returns the library's keyword arguments), is
unsupported here, with the reason. Problems are square self-attention (L = S), so any
key/value source and no ``cross`` feature is needed.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from suite.conformance.families.declare import Case, case
from suite.conformance.judge import Outcome, error_text, missing_features
from suite.plugins.interface import Implementation, Unsupported, expressible
from suite.spec.problem import Mask, Problem, make_problem

FAMILY = "wrapper"
CASES: List[Case] = []
B, L, E, H = 2, 7, 16, 4
WRONG = "the wrapper's own translation is wrong, not the library"


def _judge(method: str, what: str):
    def judge(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
        check = getattr(impl, method, None)
        if not callable(check):
            return out.classify("unsupported", f"not a module wrapper: no {method} (the module "
                                               f"cores TorchModuleCore, JaxModuleCore and "
                                               f"KerasModuleCore give one)")
        try:  # as the module takes it (its kv heads, one input, no biases)
            p = expressible(impl, p)
        except Unsupported as exc:
            return out.classify("unsupported", str(exc) or type(exc).__name__)
        missing = missing_features(impl, p)
        if missing:
            return out.classify("unsupported", f"needs {', '.join(missing)}")
        try:
            differences = check(p)
        except Unsupported as exc:
            return out.classify("unsupported", str(exc) or type(exc).__name__)
        except Exception as exc:  # the wrapper's own code raised: where, as every case says
            return out.classify("error", error_text(exc, impl))
        if differences:
            return out.classify("fail", f"{WRONG}: {what}: " + "; ".join(differences))
        return out
    return judge


def _problem(seed: int, mask: Optional[Mask] = None) -> Problem:
    return make_problem(seed, B, L, L, E, H, mask=mask, self_attention=True)


@case(FAMILY, "weights", judge=_judge("check_wrapper", "the weights the module holds (read "
                                                       "back) differ from the problem's"),
      into=CASES)
def _weights(seed):
    """The weights read back from the built module (``read_weights``) equal the problem's."""
    return _problem(seed)


@case(FAMILY, "weights_no_bias", judge=_judge("check_wrapper", "the weights the module holds "
                                                               "(read back) differ from the "
                                                               "problem's"), into=CASES)
def _weights_no_bias(seed):
    """Projections without biases: the module holds the weights and zero biases (a layer's
    initial bias left in would be added to every output)."""
    return make_problem(seed, B, L, L, E, H, self_attention=True, bias=False)


MASK_WRONG = "the mask module_mask hands to call does not mean the canonical one"


@case(FAMILY, "mask_key_padding", judge=_judge("check_mask", MASK_WRONG), into=CASES)
def _key_padding(seed):
    """Key padding, valid_lens (B,) = (7, 3): the mask handed to the module masks keys j >= 3
    of batch item 1, in the module's convention."""
    return _problem(seed, Mask(valid_lens=np.array([L, 3])))


@case(FAMILY, "mask_causal", judge=_judge("check_mask", MASK_WRONG), into=CASES)
def _causal(seed):
    """Causal (top left): the mask handed to the module (or its causal flag) lets query i see
    keys j <= i."""
    return _problem(seed, Mask(causal=True))


@case(FAMILY, "mask_bool", judge=_judge("check_mask", MASK_WRONG), into=CASES)
def _bool(seed):
    """A random boolean (B, H, L, S) mask, True = may attend: the module's boolean mask is it
    in the module's convention (True = attend or True = masked)."""
    allowed = np.random.default_rng(seed).random((B, H, L, L)) < 0.6
    allowed[..., 0] = True
    return _problem(seed, Mask(allowed=allowed))


@case(FAMILY, "mask_bias", judge=_judge("check_mask", MASK_WRONG), into=CASES)
def _bias(seed):
    """An additive float (B, H, L, S) bias: the module's bias equals it."""
    return _problem(seed, Mask(bias=np.random.default_rng(seed).standard_normal((B, H, L, L))))


@case(FAMILY, "mask_combined", judge=_judge("check_mask", MASK_WRONG), into=CASES)
def _combined(seed):
    """Key padding AND causal AND a boolean (B, 1, L, S) mask, plus a bias: every part the
    module is handed, joined, means the canonical mask."""
    rng = np.random.default_rng(seed)
    allowed = rng.random((B, 1, L, L)) < 0.7
    allowed[..., 0] = True
    return _problem(seed, Mask(valid_lens=np.array([L, 4]), causal=True, allowed=allowed,
                               bias=rng.standard_normal((1, H, L, L))))
