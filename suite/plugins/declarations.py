"""What a plugin declares, as data: its features (and their meanings), the checked policies
of its deviations, the mask parts and forms a library takes natively, and the contracts
between its options. The interface (``suite.plugins.interface``) reads them; the manual's
reference pages are generated from them."""

from __future__ import annotations

import dataclasses
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Union,
)

from suite.plugins.conditions import ANYWHERE, Where
from suite.spec.problem import Problem

# What an implementation may declare it does (``features``); a problem needs those its
# ``Problem.features()`` names, and a plugin that lacks one reports the case unsupported.
FEATURE_MEANINGS: Dict[str, str] = {
    "valid_lens": "key padding by lengths, (B,) or (B, Lq)",
    "causal": "a causal mask aligned top-left (query i sees keys j <= i)",
    "causal_bottom_right": "a causal mask aligned bottom-right (j <= i + Lk - Lq)",
    "bool_mask": "a boolean mask broadcastable to (B, H, Lq, Lk), True = may attend",
    "bias": "an additive float bias broadcastable to (B, H, Lq, Lk)",
    "decode": "the decode form: query rows at per-batch offsets into a key/value cache, "
              "causal at the offset (Mask.query_offset)",
    "packed": "a packed batch: each row's tokens are sequences back to back "
              "(Mask.segments, ids 0, 1, ... along the row), each token attending only "
              "within its own sequence (cumulative lengths, document ids, jagged tensors)",
    "paged": "reads the key/value cache paged: a pool of fixed-size blocks through a "
             "per-sequence block table (Problem.paging; the pool from "
             "suite.spec.paging.paged_cache), blocks shared between sequences read-only",
    "steps": "computes a causal self-attention problem in chunks (Problem.steps: a prefill, "
             "then decode steps), each against its own key/value cache",
    "static_cache": "with steps, a static cache of Problem.cache_len slots rather than a "
                    "growing one",
    "dropout": "training mode: dropout of probability Problem.dropout on the attention "
               "weights (the kept ones scaled by 1 / (1 - p)), from the library's own random "
               "draws (AttendMask.dropout)",
    "cross": "Lq != Lk",
    "gqa": "fewer kv heads than query heads (GQA, MQA)",
    "scale": "an explicit scale instead of 1/sqrt(D)",
    "weights": "returns the attention weights (B, H, Lq, Lk)",
    "grad": "returns gradients of every input and weight",
    "softcap": "soft-capping: score -> cap * tanh(score / cap), after the scale, before "
               "any bias",
    "alibi": "ALiBi: per-head slopes times a position term (suite.spec.variants."
             "ALIBI_CONVENTIONS), top-left or bottom-right aligned",
    "rel_bias": "a relative position bias: a per-head table read at the bucketed "
                "query-key distance (T5's bucketing or a clipped distance)",
    "score_mod": "applies the problem's score modifier fn(score, b, h, i, j, xp)",
    "sinks": "one logit per head in the softmax's denominator that takes no value",
    "value_width": "value heads of a width of their own (V != D)",
}
FEATURES = frozenset(FEATURE_MEANINGS)
# The score variants (suite.spec.variants): the built-ins that implement them declare them; a
# subclass of one that replaces its attention core removes them.
VARIANT_FEATURES = frozenset({"softcap", "alibi", "rel_bias", "score_mod", "sinks",
                              "value_width"})

# Behaviours a plugin may declare it differs on (keys of ``deviations``), and the policies
# the suite can check for each: what the affected rows give instead of the spec's answer.
POLICIES: Dict[str, Dict[str, str]] = {
    "fully_masked_rows": {  # a query row with no key to attend (the spec: zero head output)
        "nan": "the row's output is NaN",
        "mean_values": "the row attends every key equally: its head output is the mean of "
                       "the values",
        "unmasked": "the row attends as if nothing were masked",
    },
    "causal_emptied_rows": {  # a query row the causal mask alone leaves without a key
        # (bottom-right alignment with more queries than keys, a decode row before its
        # cache's first key): a refinement of fully_masked_rows, which still holds for rows
        # the other parts empty (and for these where this is not declared)
        "mean_values": "the row the causal mask empties attends every key equally: its head "
                       "output is the mean of the values (a causal fill of the most negative "
                       "finite float instead of -inf); rows another mask part empties follow "
                       "fully_masked_rows",
    },
    "bias_masked_rows": {  # a query row whose every key a -inf additive bias masks (the
        # spec: a zero head output, as for a boolean mask; fully_masked_rows covers both)
        "nan": "the row's output is NaN: the -inf bias is added to the logits and the "
               "softmax of a row of -inf is NaN",
    },
    "nan_padding": {  # NaN in key or value positions the mask hides (the spec: no effect)
        "confined": "NaN reaches the output only in rows that read a NaN key or value; "
                    "every other row is right",
    },
    "query_padded_rows": {  # a query row a form's query lengths or query mask pad (the
        # spec: a zero head output, as for any row with no key; judged apart from
        # fully_masked_rows, so a library's declared policy for rows its attention mask
        # empties does not excuse what it does with the rows its query part pads)
        "nan": "the padded query row's output is NaN",
        "mean_values": "the padded query row attends every key equally: its head output is "
                       "the mean of the values",
        "unmasked": "the padded query row attends as if nothing were masked",
    },
    "float32_dots": {  # how float32 matrix products take their operands (the spec: as float32)
        "tf32": "float32 matrix products round their operands to TF32 (10 mantissa bits) and "
                "accumulate in float32, as tensor cores do: the rule's naive_t and rounding "
                "bound round the same operands, so every other error is still a failure",
    },
    "float64_softmax": {  # the dtype a float64 problem's softmax runs in (the spec: float64)
        "float32": "the softmax of float64 logits runs in float32 (the logits cast down, the "
                   "weights cast back): the rule's naive_t and rounding bound compute the "
                   "softmax so, so every other error (a wrong row, a NaN) is still a failure",
    },
    "nan_query_rows": {  # a query row holding NaN or inf (the spec: its output row is NaN)
        "zero": "the row's head outputs are zero (its output row is the output bias), as for "
                "a row with no key, instead of NaN",
    },
}
DEVIATIONS = frozenset(POLICIES)

# Mask forms a plugin may declare (``mask_forms``): one or more parts joined by "+", each the
# library's own argument in the shape written (its boolean polarity is the library's).
# Shapes name the canonical axes (B batch, H heads, L queries, S keys); "1" is an axis of
# size 1 the library broadcasts, "BH" the flattened (B*H) axis of torch.nn's 3-D masks.
_ATTN_SHAPES = {
    "BHLS": "(B, H, L, S), materialised in full",
    "B1LS": "(B, 1, L, S), broadcast over heads",
    "11LS": "(1, 1, L, S), broadcast over batch and heads",
    "B11S": "(B, 1, 1, S), a query dimension of 1 (padding as a 4-D mask)",
    "BHL1": "(B, H, L, 1), a key dimension of 1 (whole query rows)",
    "LS": "(L, S), a 2-D mask broadcast over batch and heads",
    "BLS": "(B, L, S), a head-free 3-D mask",
    "BHxLS": "(B*H, L, S), torch.nn's 3-D per-head mask",
}
MASK_PARTS: Dict[str, str] = {
    **{f"bool_{s}": f"a boolean mask {d}" for s, d in _ATTN_SHAPES.items()},
    **{f"float_{s}": f"an additive float mask {d}, -inf (or the library's fill) where "
                     "masked" for s, d in _ATTN_SHAPES.items()},
    "kpm_bool": "a boolean (B, S) key padding mask beside the attention mask",
    "kpm_float": "an additive float (B, S) key padding mask (0 or -inf)",
    "kv_lengths": "key lengths (B,) ints: key j is visible iff j < length",
    "q_lengths": "query lengths (B,) ints: query row i attends iff i < length",
    "qpm_bool": "a boolean (B, L) query mask: a masked query row attends no key",
    "causal_flag": "the library's causal flag (top-left), the rest of the mask beside it",
    "causal_hint": "the causal flag given together with the causal mask itself as the "
                   "attention mask (torch.nn's is_causal hint)",
    "local_window": "a sliding window given as its sizes (left, right): query i attends keys "
                    "i - left <= j <= i + right (top left: query i sits at key i when Lq != Lk)",
    "chunked_causal": "a chunk size c: query i attends keys j <= i in its own chunk "
                      "(i // c == j // c; top left)",
}
# Forms the mask_forms family has a case for: each its parts joined by "+".
MASK_FORMS: Dict[str, str] = {}
for _s in _ATTN_SHAPES:
    for _kind in ("bool", "float"):
        MASK_FORMS[f"{_kind}_{_s}"] = MASK_PARTS[f"{_kind}_{_s}"]
MASK_FORMS.update({
    "kpm_bool": MASK_PARTS["kpm_bool"] + ", alone",
    "kpm_float": MASK_PARTS["kpm_float"] + ", alone",
    "kpm_bool+bool_LS": "key padding (B, S) beside a 2-D (L, S) boolean mask",
    "kpm_bool+bool_BHxLS": "key padding (B, S) beside a 3-D (B*H, L, S) boolean mask",
    "kpm_bool+float_LS": "a boolean key padding mask beside an additive 2-D mask (mixed kinds)",
    "kpm_float+float_LS": "additive key padding beside an additive 2-D mask",
    "kpm_float+float_BHxLS": "additive key padding beside an additive 3-D mask",
    "kpm_bool+bool_BLS": "key padding (B, S) beside a head-free (B, L, S) mask",
    "kv_lengths": MASK_PARTS["kv_lengths"] + ", alone",
    "kv_lengths+bool_B1LS": "key lengths beside a (B, 1, L, S) boolean mask",
    "q_lengths": MASK_PARTS["q_lengths"] + ", alone (no key lengths)",
    "q_lengths+kv_lengths": "query and key lengths together",
    "qpm_bool": MASK_PARTS["qpm_bool"] + ", alone",
    "qpm_bool+kpm_bool": "query mask (B, L) and key padding (B, S) together",
    "causal_flag": "the causal flag alone",
    "causal_flag+bool_B11S": "the causal flag beside a (B, 1, 1, S) padding mask",
    "causal_flag+bool_BLS": "the causal flag beside a head-free (B, L, S) mask",
    "causal_flag+kpm_bool": "the causal flag beside a (B, S) key padding mask",
    "causal_flag+kv_lengths": "the causal flag beside key lengths",
    "causal_hint+bool_LS": "is_causal=True with the causal (L, S) mask as attn_mask",
    "causal_hint+kpm_bool+bool_LS": "the causal hint and mask beside key padding",
    "local_window": MASK_PARTS["local_window"] + ", alone",
    "local_window+kv_lengths": "a sliding window beside key lengths (B,)",
    "local_window+causal_flag": "a sliding window beside the causal flag (its right side cut)",
    "chunked_causal": MASK_PARTS["chunked_causal"] + ", alone",
})
# The forms given as sizes, not arrays (their cases are longer: L = 200, S = 300).
WINDOW_FORMS = frozenset(f for f in MASK_FORMS
                         if {"local_window", "chunked_causal"} & set(f.split("+")))


@dataclasses.dataclass(frozen=True)
class Deviation:
    """A declared behaviour: ``policy`` (one of ``POLICIES[behaviour]``), the measured reason,
    and where it holds (``suite.plugins.conditions.Where``: versions, instruction-set level, device, and the
    problems that show it). Outside ``where`` the spec's answer is required."""

    policy: str
    reason: str
    where: Where = ANYWHERE

    def describe(self, behaviour: str) -> str:
        held = "" if self.where == ANYWHERE else f" [where {self.where.text()}]"
        return (f"{behaviour}={self.policy} ({POLICIES[behaviour][self.policy]}): "
                f"{self.reason}{held}")


# Relations a contract (``contracts``) may state between a plugin and the other side of one
# of its options (``suite.conformance.families.contracts`` checks them).
RELATIONS: Dict[str, str] = {
    "differs": "the two outputs differ on every problem (never bit-identical), and each side "
               "passes the agreement rule on its own problem",
    "closer_to_oracle": "this side's error against the float64 oracle is smaller than the "
                        "other side's on the same problems: a one-sided sign test over them",
    "agrees": "another path of the same module (eager vs sdpa vs flex, fused vs unfused, "
              "compiled vs eager, with and without weights): on every problem the two outputs "
              "are within the sum of the two sides' bounds of the rule of each other (two "
              "answers each within the rule of one function can differ by no more), whether "
              "or not either matches the oracle; the problems carry the score variants both "
              "declare",
}


@dataclasses.dataclass(frozen=True)
class Contract:
    """What an option must change: this plugin, against another of its names (``against``
    a registry name) or itself with an option set otherwise (``against`` a mapping of class
    attributes overriding this plugin's, e.g. ``{"force_fp32_for_softmax": False}``), must
    stand in ``relation`` (one of ``RELATIONS``) on the same problems, in ``dtypes`` (None:
    every dtype both run) and where ``where`` holds. ``scale``: the scale this side's problems
    are given, from the problem (None: the problem's own), for options that change the scale
    (the other side keeps the problem's). ``name`` is the case's name in the ``contracts``
    family."""

    name: str
    relation: str
    against: Union[str, Mapping[str, Any]]
    reason: str
    dtypes: Optional[FrozenSet[str]] = None
    scale: Optional[Callable[[Problem], float]] = dataclasses.field(default=None, compare=False)
    where: Where = ANYWHERE

    def against_text(self) -> str:
        """The other side in words: its name, or the option values it sets."""
        if isinstance(self.against, str):
            return self.against
        return ", ".join(f"{k}={v!r}" for k, v in sorted(self.against.items()))


# What ``deviations`` maps a behaviour to: one Deviation for every dtype, or a dict
# dtype -> Deviation when the behaviour depends on the dtype (say, the mean of the values in
# float32 and NaN in float16, where the library's mask fill overflows); a dtype the dict does
# not name must give the spec's answer.
Declaration = Union[Deviation, Mapping[str, Deviation]]


def deviations_for(impl: Any, dtype: str, device: Optional[str] = None,
                   isa: Optional[str] = None) -> Dict[str, Deviation]:
    """behaviour -> the Deviation ``impl`` declares for runs in ``dtype``; given the
    ``device`` (and the instruction-set level ``isa``), only those whose ``where`` holds in
    that environment (the problem condition is the judge's)."""
    out = {}
    for behaviour, decl in dict(getattr(impl, "deviations", {}) or {}).items():
        d = decl if isinstance(decl, Deviation) else decl.get(dtype)
        if d is not None and (device is None or d.where.holds(device, isa)):
            out[behaviour] = d
    return out


def declaration_labels(behaviour: str, decl: Declaration) -> List[str]:
    """How a declaration is named in results and warnings: the behaviour, or one
    ``behaviour[dtype]`` per dtype of a per-dtype declaration (each judged on its dtype)."""
    if isinstance(decl, Deviation):
        return [behaviour]
    return [f"{behaviour}[{dtype}]" for dtype in decl]


def policy_text(decl: Declaration) -> str:
    """The declared policy in a word: ``nan``, or ``float16=nan,float32=mean_values``."""
    if isinstance(decl, Deviation):
        return decl.policy
    return ",".join(f"{dtype}={d.policy}" for dtype, d in sorted(decl.items()))


