"""The interface every MHA implementation fulfils.

A plugin is a class. The harness constructs it once, asks what it can do
(``devices()``, ``dtypes(device)``, ``features``), then per call:

  state = impl.prepare(problem, device, dtype)   # untimed: weights and inputs to the device
  handle = impl.run(state)                       # timed: the forward (and backward if asked)
  impl.synchronize(state)                        # device barrier, before any clock is read
  result = impl.fetch(state, handle)             # untimed: back to NumPy float64

With ``grad=True`` the timed step is forward + backward of the scalar
``sum(out * suite.problem.cotangent(problem))``, and ``Result.grads`` maps each name
in ``suite.problem.GRAD_NAMES`` (inputs and weights; biases when present) to its
gradient. Treat query, key and value as separate leaves even when they are the same array
(a plugin with one key/value source, ``kv_source = "shared"``, returns that input's gradient
under "key" and none under "value").
A plugin that compiles (jax.jit, torch.compile) does so in ``prepare`` and stores the
seconds in ``state.compile_s`` or ``state["compile_s"]``. ``synchronize`` receives only
the state, so an asynchronous plugin keeps its last output in the state.

Feature names (``features``, meanings in ``FEATURE_MEANINGS``): valid_lens, causal,
causal_bottom_right, bool_mask, bias, cross (Lq != Lk), gqa (H_kv < H), scale (explicit
scale), weights (returns attention weights), grad (gradients), and the score variants
(``VARIANT_FEATURES``, ``suite.variants``): softcap, alibi, rel_bias, score_mod, sinks,
value_width. A problem the plugin cannot express
although it declares the features (say, a head width its kernel lacks) is refused by
raising ``Unsupported("why")`` in ``prepare``: the case is reported unsupported.

Deviations are checked policies, not excuses: ``deviations = {"fully_masked_rows":
Deviation("nan", "measured reason")}`` says what the plugin does where it differs from the
spec, and the conformance run checks that the affected rows do exactly that and that
every other row passes the agreement rule (``POLICIES`` lists the behaviours and policies).
A behaviour that depends on the dtype maps to one Deviation per dtype: ``{"fully_masked_rows":
{"float32": Deviation("mean_values", ...), "float16": Deviation("nan", ...)}}``; each is
checked, and reported stale, on its own dtype's cases only.

Mask forms (``mask_forms``): the forms of mask the library takes natively (``MASK_FORMS``:
a 2-D (L, S) mask, a mask with a broadcast dimension of 1, a (B, S) key padding mask beside
an attention mask, boolean beside additive, a native causal flag, ...). The ``mask_forms``
family runs each declared form against the same problem: the plugin reads the requested form
with ``suite.adapters.requested_form(problem)`` and gets the form's arrays, shaped as the
library takes them (nothing the library broadcasts is materialised), from
``suite.adapters.form_mask(problem, ...)``. The default declares none: the family reports
unsupported and every other case runs the plugin's usual translation.

The other attributes and hooks (``array_library``, ``kv_source``, ``kv_grouping``,
``projection_bias``, ``memory_model``, ``repeat_kv``, ``replaces_builtin``, ``repro_code``,
``after_prepare``) are declared on ``Implementation`` with their defaults and what reads
them; ``suite.adapters`` translates the canonical problem (masks, weight layouts, gradient
names) into a library's terms.
"""

from __future__ import annotations

import dataclasses
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from suite.layouts import LAYOUTS
from suite.problem import DTYPES, InputError, Problem
from suite.variants import ScoreMod
from suite.where import ANYWHERE, Where

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
             "suite.paging.paged_cache), blocks shared between sequences read-only",
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
    "alibi": "ALiBi: per-head slopes times a position term (suite.variants."
             "ALIBI_CONVENTIONS), top-left or bottom-right aligned",
    "rel_bias": "a relative position bias: a per-head table read at the bucketed "
                "query-key distance (T5's bucketing or a clipped distance)",
    "score_mod": "applies the problem's score modifier fn(score, b, h, i, j, xp)",
    "sinks": "one logit per head in the softmax's denominator that takes no value",
    "value_width": "value heads of a width of their own (V != D)",
}
FEATURES = frozenset(FEATURE_MEANINGS)
# The score variants (suite.variants): the built-ins that implement them declare them; a
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
    and where it holds (``suite.where.Where``: versions, instruction-set level, device, and the
    problems that show it). Outside ``where`` the spec's answer is required."""

    policy: str
    reason: str
    where: Where = ANYWHERE

    def describe(self, behaviour: str) -> str:
        held = "" if self.where == ANYWHERE else f" [where {self.where.text()}]"
        return (f"{behaviour}={self.policy} ({POLICIES[behaviour][self.policy]}): "
                f"{self.reason}{held}")


# Relations a contract (``contracts``) may state between a plugin and the other side of one
# of its options (``suite.contracts`` checks them).
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


class Unavailable(RuntimeError):
    """Raised by a plugin's constructor when it cannot run here (the message says why)."""


class Unsupported(Exception):
    """Raised by ``prepare`` for a problem the plugin cannot express (the message says why):
    the case is reported as unsupported, not as an error."""


@dataclasses.dataclass
class Result:
    """What an implementation returned, as float64 NumPy arrays."""

    output: np.ndarray  # (B, L, E)
    attn_weights: Optional[np.ndarray] = None  # (B, H, L, S)
    grads: Optional[Dict[str, np.ndarray]] = None  # name -> gradient, same shape as the input


class Implementation:
    """Base class of plugins. Subclasses set the class attributes and the four steps.

    Every attribute and hook the harness reads is declared here with its default; a plugin
    overrides only what differs.
    """

    # The stable registry name, e.g. "torch.sdpa" or "mine.keras".
    name: ClassVar[str] = ""
    # The library whose code is measured ("numpy", "torch", "jax", "keras", "flax", "hf", ...):
    # shown by ``mha-suite list``, in results and in the report's grouping.
    framework: ClassVar[str] = ""
    # The array library the computation runs on: the sweep measures that library's matmul
    # peak (the share-of-peak column; numpy, torch and jax are measured, others get none)
    # and uses its memory method (on CUDA: torch's or jax's allocator statistics). "" means
    # the same as ``framework``. A module from one library running on
    # another's arrays says both: Keras on torch is framework "keras", array_library
    # "torch" (an instance may set it in ``__init__`` when the backend is chosen at run time).
    array_library: ClassVar[str] = ""
    features: ClassVar[FrozenSet[str]] = frozenset()
    # behaviour -> Deviation(policy, reason), for behaviours the library differs on (POLICIES);
    # or behaviour -> {dtype: Deviation} when what it does depends on the dtype.
    deviations: ClassVar[Dict[str, Declaration]] = {}
    # Where key and value come from (KV_SOURCES): "separate" (two inputs, the default),
    # "shared" (one key/value input, as Hugging Face cross-attention's encoder_hidden_states):
    # such a plugin is given problems with value = key, a case that needs key != value is
    # unsupported for it, and its gradient of that one input is returned under "key";
    # or "self" (one input for query, key and value, as a decoder's self-attention block):
    # it is given problems with key = value = query (Lq == Lk), and its one gradient is
    # returned under "query".
    kv_source: ClassVar[str] = "separate"
    # How many key/value heads the module has, when that is fixed by its design rather than
    # by the problem: None (the problem's, the default), an int (1: a multi-query module), or
    # "half" (H // 2). Every case is given to such a plugin with that many kv heads, its
    # k/v projections the first ones of the case's (``expressible``); a case with fewer kv
    # heads than the module has is unsupported for it.
    kv_heads: ClassVar[Optional[Union[int, str]]] = None
    # Whether the module's q/k/v/o projections add biases. False (a Llama-style module whose
    # linear layers have none): every case and Hypothesis example is given to the plugin
    # without projection biases (``expressible``), and the oracle judges what it was given.
    projection_bias: ClassVar[bool] = True
    # The sweep's memory prediction: "quadratic" (a (B, H, L, S) score array is live) or
    # "linear" (tiled kernels that never hold one); points predicted not to fit are skipped.
    memory_model: ClassVar[str] = "quadratic"
    # How the library pairs query heads with kv heads under GQA (KV_GROUPINGS): "grouped"
    # (the spec: query head h reads kv head h // (H/K)) or "interleaved" (h % K). For
    # "interleaved" the harness reorders the problem's query heads (W_q, b_q, W_o, per-head
    # masks) before ``prepare`` and the attention weights and gradients back after ``fetch``.
    kv_grouping: ClassVar[str] = "grouped"
    # Read by the adapter cores (``implementations.*_common``): whether ``attend`` gets k/v
    # repeated to H heads (True) or the K kv heads as they are (False: native GQA).
    repeat_kv: ClassVar[bool] = True
    # A ``--plugin`` class whose name equals a built-in's replaces that built-in only when it
    # says so here (or the user passes ``--replace-builtin NAME``); otherwise it is refused.
    replaces_builtin: ClassVar[bool] = False
    # Source of ``attend(q, k, v, allowed, bias, scale)`` over NumPy arrays calling the library
    # as this plugin does, for ``mha-suite repro`` (None: no standalone reproducer).
    repro_code: ClassVar[Optional[str]] = None
    # Mask forms (names in ``MASK_FORMS``) the library takes natively: the ``mask_forms``
    # family gives the plugin each one (``suite.adapters.requested_form``) and compares it
    # with the oracle on the same problem. Empty (the default): the family is unsupported.
    mask_forms: ClassVar[FrozenSet[str]] = frozenset()
    # Memory layouts (names in ``suite.layouts.LAYOUTS``) the plugin hands its library as they
    # come (strided views, slices, stride-0 broadcasts): the ``layouts`` family asks for each
    # one (``suite.layouts.requested_layout``); a layout not declared is reported unsupported.
    layouts: ClassVar[FrozenSet[str]] = frozenset({"contiguous"})
    # What its options must change (``Contract``: a relation to another of its names, or to
    # itself with an option set otherwise): the ``contracts`` family runs both sides on the
    # same problems and fails an option whose outputs are bit-identical where they must
    # differ, or whose error against the oracle moves the wrong way (suite.contracts).
    contracts: ClassVar[Tuple[Contract, ...]] = ()
    # True for a plugin that compiles anew for each shape and mask kind (torch.compile,
    # FlexAttention: seconds to tens of seconds each on a CPU): the main job's sample
    # (suite.sample) gives it one case per family and fewer property-based examples.
    compiles_per_shape: ClassVar[bool] = False
    # Score modifiers of the plugin's own (suite.variants.ScoreMod: a name, the NumPy
    # function the oracle computes, a doc): the ``variants/own_score_mods`` case runs each one
    # (the plugin declares "score_mod" and recognises its own by name), so a variant of its
    # own needs no change to the suite.
    score_mods: ClassVar[Tuple[ScoreMod, ...]] = ()
    # The case families this name runs (None: all). A built-in variant that differs from its
    # base in one code path names the families that path changes, which keeps the CI's cost
    # down; the other families are reported unsupported with the list.
    families: ClassVar[Optional[FrozenSet[str]]] = None

    def framework_version(self) -> str:
        """The version of the library ``framework`` names (its installed distribution:
        ``hf`` -> transformers, ``flax`` -> flax, ...), "unknown" when none is installed."""
        from suite.environment import framework_version

        return framework_version(self.framework) or "unknown"

    def isa(self, device: str) -> Optional[str]:
        """The CPU instruction-set level this process's array library dispatched its kernels
        to on ``device`` (``suite.isa``): torch's level on the CPU for a plugin whose array
        library is torch, else None (a library the suite does not pin to a level)."""
        from suite import isa

        if device.split("[")[0] != "cpu" or array_library(self) not in isa.DISPATCH_ENV:
            return None
        return isa.torch_level()

    def devices(self) -> List[str]:
        """Devices usable now, e.g. ["cpu", "cuda:0"]."""
        return ["cpu"]

    def dtypes(self, device: str) -> Sequence[str]:
        return ("float32",)

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Any:
        raise NotImplementedError

    def after_prepare(self, state: Any) -> None:
        """Called by the adapter cores at the end of ``prepare`` (untimed): a compiling plugin
        warms up here and stores the seconds as ``compile_s`` in the state."""

    def run(self, state: Any) -> Any:
        raise NotImplementedError

    def synchronize(self, state: Any) -> None:
        """Block until the work started by ``run`` is finished."""

    def fetch(self, state: Any, handle: Any) -> Result:
        raise NotImplementedError

    # Convenience for one untimed call.
    def __call__(self, problem: Problem, device: str = "cpu", dtype: str = "float32", *,
                 need_weights: bool = False, grad: bool = False) -> Result:
        problem.validate()  # bad input gets the suite's clear error, not a kernel's
        needs = problem.features() | {f for f, on in (("weights", need_weights),
                                                       ("grad", grad)) if on}
        missing = sorted(needs - frozenset(self.features))
        if missing:  # it would ignore them and return wrong numbers
            raise InputError(f"problem: needs features {', '.join(missing)}, which "
                             f"{self.name or type(self).__name__} does not declare "
                             f"(features: {', '.join(sorted(self.features)) or 'none'})")
        return call(self, problem, device, dtype, need_weights=need_weights, grad=grad)

    def fresh(self) -> Implementation:
        """A new instance with nothing cached, for repeated runs (``--repeat``); plugins that
        compile also drop the process-wide compiled code here, so the repeat recompiles."""
        return type(self)()


KV_SOURCES = ("separate", "shared", "self")
KV_GROUPINGS = ("grouped", "interleaved")
MEMORY_MODELS = ("quadratic", "linear")
# The device of an accelerator kernel (Pallas, Triton) run by its interpreter on the CPU:
# conformance checks it, sweeps never time it (interpreted times say nothing of the kernel).
INTERPRETED_CPU = "cpu-interpret"


def interpreted(device: str) -> bool:
    """True for a device on which a kernel runs under its interpreter (``cpu-interpret``)."""
    return device.endswith("-interpret")


def declared(impl: Any, hook: str) -> Any:
    """``impl``'s attribute ``hook``, or the default ``Implementation`` declares for it (a
    plugin need not subclass it): the one copy of each default."""
    return getattr(impl, hook, getattr(Implementation, hook))


def builtin_ancestors(impl: Any) -> List[str]:
    """For a plugin outside the built-ins, the names of the built-ins its class derives
    from, nearest first (a class of the ``implementations`` package with a ``name`` of its
    own other than ``impl``'s); none for a built-in (each lists its own entries)."""
    own = getattr(impl, "name", None)
    out: List[str] = []
    if type(impl).__module__.split(".")[0] == "implementations":
        return out
    for cls in type(impl).__mro__[1:]:
        name = vars(cls).get("name")
        if isinstance(name, str) and name != own and name not in out \
                and cls.__module__.split(".")[0] == "implementations":
            out.append(name)
    return out


def array_library(impl: Implementation) -> str:
    """The array library ``impl`` computes with: its matmul peak and memory method."""
    return declared(impl, "array_library") or impl.framework


def compile_seconds(state: Any) -> Optional[float]:
    """Seconds a plugin's ``prepare`` spent compiling (``state["compile_s"]`` or
    ``state.compile_s``), or None when it did not say."""
    if isinstance(state, dict):
        return state.get("compile_s")
    return getattr(state, "compile_s", None)


def expressible(impl: Implementation, problem: Problem, *, distinct_kv: bool = False
                ) -> Problem:
    """``problem`` as ``impl`` can take it: a plugin with one key/value source
    (``kv_source = "shared"``) gets value = key (the same array), one with one input for all
    three (``kv_source = "self"``) gets key = value = query, one without projection biases
    (``projection_bias = False``) gets none; ``distinct_kv`` says the
    problem is about key != value, which neither can express (``Unsupported``)."""
    if not declared(impl, "projection_bias"):  # a bias-free module: no projection biases
        problem = without_projection_biases(problem)
    problem = with_kv_heads(problem, declared(impl, "kv_heads"))
    source = declared(impl, "kv_source")
    if source == "self":
        if problem.query is problem.key is problem.value:
            return problem
        if distinct_kv:
            raise Unsupported("needs key != value; the plugin takes one input for query, key "
                              "and value (kv_source='self')")
        if problem.L != problem.S:
            raise Unsupported(f"needs Lq != Lk (Lq={problem.L}, Lk={problem.S}); the plugin "
                              f"takes one input for query, key and value (kv_source='self')")
        return dataclasses.replace(problem, key=problem.query, value=problem.query)
    if source != "shared" or problem.value is problem.key:
        return problem
    if distinct_kv:
        raise Unsupported("needs key != value; the plugin takes one key/value source "
                          "(kv_source='shared')")
    return dataclasses.replace(problem, value=problem.key)


def with_kv_heads(problem: Problem, kv_heads: Optional[Union[int, str]]) -> Problem:
    """``problem`` with ``kv_heads`` key/value heads (None: as it is; "half": H // 2): the
    k/v projections (and biases) of its first kv heads, so query head h reads kv head
    h // (H / kv_heads) as the spec groups them. Unsupported when the problem has fewer kv
    heads than that, or when H is not a multiple of it."""
    if kv_heads is None:
        return problem
    n = problem.H // 2 if kv_heads == "half" else kv_heads
    if n == problem.K:
        return problem
    if n < 1:
        raise Unsupported(f"the module has H // 2 key/value heads: none at H={problem.H}")
    if problem.H % n:
        raise Unsupported(f"the module's {n} key/value heads do not divide the problem's "
                          f"H={problem.H} query heads")
    if n > problem.K:
        raise Unsupported(f"the case has {problem.K} key/value head(s), fewer than the "
                          f"module's {n} (kv_heads={kv_heads!r})")
    w, D, V = problem.weights, problem.D, problem.V
    cut = lambda a, width: None if a is None else a[..., :n * width]  # noqa: E731
    weights = dataclasses.replace(w, w_k=cut(w.w_k, D), b_k=cut(w.b_k, D),
                                  w_v=cut(w.w_v, V), b_v=cut(w.b_v, V))
    return dataclasses.replace(problem, weights=weights, num_kv_heads=n)


def without_projection_biases(problem: Problem) -> Problem:
    """``problem`` with no q/k/v/o projection biases (the same arrays otherwise)."""
    w = problem.weights
    if w.b_q is None and w.b_k is None and w.b_v is None and w.b_o is None:
        return problem
    weights = dataclasses.replace(w, b_q=None, b_k=None, b_v=None, b_o=None)
    return dataclasses.replace(problem, weights=weights)


def call(impl: Implementation, problem: Problem, device: str, dtype: str, *,
         need_weights: bool = False, grad: bool = False) -> Result:
    """One untimed call: prepare, run, synchronize, fetch (in the plugin's ``kv_grouping``:
    the problem's query heads reordered for it, its result back in the canonical order)."""
    order = query_head_order(impl, problem)
    state = impl.prepare(grouped_for(impl, problem), device, dtype, need_weights=need_weights,
                         grad=grad)
    handle = impl.run(state)
    impl.synchronize(state)
    result = impl.fetch(state, handle)
    return result if order is None or not isinstance(result, Result) else \
        _canonical_heads(result, order, problem)


def query_head_order(impl: Any, problem: Problem) -> Optional[np.ndarray]:
    """For a plugin whose library pairs query head h with kv head h % K (``kv_grouping =
    "interleaved"``): which canonical query head each of the library's heads must hold, so
    that it reads the kv head the spec pairs it with (h // (H/K)); None when no reordering
    is needed (the default grouping, K == H or K == 1, where both groupings agree)."""
    grouping = getattr(impl, "kv_grouping", "grouped")
    H, K = problem.H, problem.K
    if grouping == "grouped" or K in (1, H):
        return None
    if grouping != "interleaved":
        raise ValueError(f"kv_grouping: expected one of {list(KV_GROUPINGS)}, got {grouping!r}")
    heads = np.arange(H)
    # The library's head h reads kv head h % K; canonical head g reads kv head g // (H/K):
    # give it canonical head (h % K) * (H/K) + h // K, which reads kv head h % K.
    return (heads % K) * (H // K) + heads // K


def grouped_for(impl: Any, problem: Problem) -> Problem:
    """``problem`` with its query heads in the order ``impl``'s kv grouping needs: the
    columns of W_q and b_q, the rows of W_o and any per-head mask or bias reordered (the
    output is the same; the weights and gradients come back with ``_canonical_heads``)."""
    order = query_head_order(impl, problem)
    if order is None:
        return problem
    w, (E, H, D, V) = problem.weights, (problem.E, problem.H, problem.D, problem.V)

    def heads_last(a: Optional[np.ndarray], shape: tuple, axis: int) -> Optional[np.ndarray]:
        return None if a is None else np.take(a.reshape(shape), order, axis=axis).reshape(a.shape)

    weights = dataclasses.replace(
        w, w_q=heads_last(w.w_q, (E, H, D), 1),  # (E, H*D) by head blocks
        b_q=heads_last(w.b_q, (H, D), 0), w_o=heads_last(w.w_o, (H, V, E), 0))  # (H*V, E)

    def per_head(a: Optional[np.ndarray]) -> Optional[np.ndarray]:  # (..., H|1, L, S)
        return a if a is None or np.ndim(a) < 3 or np.shape(a)[-3] == 1 else \
            np.take(a, order, axis=-3)

    mask = dataclasses.replace(problem.mask, allowed=per_head(problem.mask.allowed),
                               bias=per_head(problem.mask.bias))
    if problem.score_mod is not None:  # its h is the canonical head: no reordering of a function
        raise Unsupported("a score_mod reads the canonical head index; the plugin's library "
                          "pairs heads otherwise (kv_grouping='interleaved')")
    heads = {}  # per-head variant parameters, in the library's head order
    if problem.alibi is not None:
        heads["alibi"] = dataclasses.replace(problem.alibi, slopes=problem.alibi.slopes[order])
    if problem.rel_bias is not None:
        heads["rel_bias"] = dataclasses.replace(problem.rel_bias,
                                                table=problem.rel_bias.table[order])
    if problem.sinks is not None:
        heads["sinks"] = problem.sinks[order]
    return dataclasses.replace(problem, weights=weights, mask=mask, **heads)


def _canonical_heads(result: Result, order: np.ndarray, problem: Problem) -> Result:
    """A result of the reordered problem (``grouped_for``) in the canonical head order:
    attention weights (B, H, L, S) and the gradients of W_q, b_q and W_o."""
    E, H, D, V = problem.E, problem.H, problem.D, problem.V

    def back(a: Optional[np.ndarray], shape: tuple, axis: int) -> Optional[np.ndarray]:
        if a is None or np.size(a) != np.prod(shape):  # a wrong shape is the judge's to see
            return a
        out = np.empty(shape, dtype=np.asarray(a).dtype)
        idx = [slice(None)] * len(shape)
        idx[axis] = order
        out[tuple(idx)] = np.asarray(a).reshape(shape)  # library head h holds canonical order[h]
        return out.reshape(np.shape(a))

    weights = result.attn_weights
    if weights is not None and np.ndim(weights) == 4 and np.shape(weights)[1] == H:
        weights = back(weights, np.shape(weights), 1)
    grads = result.grads
    if grads:
        grads = dict(grads)
        for name, shape, axis in (("w_q", (E, H, D), 1), ("b_q", (H, D), 0),
                                  ("w_o", (H, V, E), 0)):
            if grads.get(name) is not None:
                grads[name] = back(grads[name], shape, axis)
    return dataclasses.replace(result, attn_weights=weights, grads=grads)


REQUIRED = ("prepare", "run", "fetch")


def check_interface(cls: type) -> None:
    """Raise TypeError naming what a plugin class is missing (checked at load time)."""
    if not isinstance(cls, type):
        raise TypeError(f"expected a class, got {type(cls).__name__}")
    missing = [m for m in REQUIRED if not callable(getattr(cls, m, None))
               or getattr(cls, m) is getattr(Implementation, m, None)]
    if missing:
        raise TypeError(f"{cls.__name__} does not implement {', '.join(missing)}")
    for attr, allowed in (("kv_source", KV_SOURCES), ("memory_model", MEMORY_MODELS),
                          ("kv_grouping", KV_GROUPINGS)):
        value = declared(cls, attr)
        if value not in allowed:
            raise TypeError(f"{cls.__name__}.{attr}: expected one of {list(allowed)}, "
                            f"got {value!r}")
    kv = declared(cls, "kv_heads")
    if not (kv is None or kv == "half" or (isinstance(kv, int) and not isinstance(kv, bool)
                                           and kv >= 1)):
        raise TypeError(f"{cls.__name__}.kv_heads: expected None, a positive int or 'half', "
                        f"got {kv!r}")
    if not isinstance(declared(cls, "projection_bias"), bool):
        raise TypeError(f"{cls.__name__}.projection_bias: expected True or False, got "
                        f"{cls.projection_bias!r}")
    unknown = set(declared(cls, "features")) - FEATURES
    if unknown:
        raise TypeError(f"{cls.__name__} declares unknown features {sorted(unknown)}; "
                        f"known: {sorted(FEATURES)}")
    mods = declared(cls, "score_mods")
    if isinstance(mods, ScoreMod) or not all(isinstance(m, ScoreMod) for m in mods):
        raise TypeError(f"{cls.__name__}.score_mods: expected a tuple of "
                        f"suite.variants.ScoreMod, got {mods!r}")
    if mods and "score_mod" not in set(declared(cls, "features")):
        raise TypeError(f"{cls.__name__}.score_mods: declares score modifiers of its own but "
                        f"not the feature 'score_mod' that runs them")
    families = declared(cls, "families")
    if families is not None and (isinstance(families, str)
                                 or not all(isinstance(f, str) for f in families)):
        raise TypeError(f"{cls.__name__}.families: expected None or a set of family names, "
                        f"got {families!r}")
    forms = declared(cls, "mask_forms")
    if isinstance(forms, str) or not all(isinstance(f, str) for f in forms):
        raise TypeError(f"{cls.__name__}.mask_forms: expected a set of form names, got {forms!r}")
    unknown = set(forms) - set(MASK_FORMS)
    if unknown:
        raise TypeError(f"{cls.__name__} declares unknown mask forms {sorted(unknown)}; "
                        f"known: {sorted(MASK_FORMS)}")
    layouts = declared(cls, "layouts")
    if isinstance(layouts, str) or not set(layouts) <= set(LAYOUTS):
        raise TypeError(f"{cls.__name__}.layouts: expected a set of names in {sorted(LAYOUTS)}, "
                        f"got {layouts!r}")
    contracts = declared(cls, "contracts")
    if isinstance(contracts, (str, Contract)) or not all(isinstance(c, Contract)
                                                         for c in contracts):
        raise TypeError(f"{cls.__name__}.contracts: expected a tuple of Contract, got "
                        f"{contracts!r}")
    for c in contracts:
        if c.relation not in RELATIONS:
            raise TypeError(f"{cls.__name__}.contracts[{c.name!r}]: relation expected one of "
                            f"{sorted(RELATIONS)}, got {c.relation!r}")
        if not isinstance(c.against, (str, Mapping)) or not c.against:
            raise TypeError(f"{cls.__name__}.contracts[{c.name!r}]: against expected a "
                            f"registry name or a mapping of class attributes, got {c.against!r}")
        if c.dtypes is not None and (isinstance(c.dtypes, str) or set(c.dtypes) - set(DTYPES)):
            raise TypeError(f"{cls.__name__}.contracts[{c.name!r}]: dtypes expected a set of "
                            f"{', '.join(DTYPES)}, got {c.dtypes!r}")
    if len({c.name for c in contracts}) != len(contracts):
        raise TypeError(f"{cls.__name__}.contracts: two contracts share a name")
    for behaviour, dev in dict(getattr(cls, "deviations", {})).items():
        if behaviour not in POLICIES:
            raise TypeError(f"{cls.__name__} declares a deviation on unknown behaviour "
                            f"{behaviour!r}; known: {sorted(POLICIES)}")
        known = sorted(POLICIES[behaviour])
        if isinstance(dev, Mapping) and dev:  # per dtype: each key a dtype, each value a policy
            bad = sorted(set(dev) - set(DTYPES))
            if bad:
                raise TypeError(f"{cls.__name__}.deviations[{behaviour!r}]: expected dtypes "
                                f"({', '.join(DTYPES)}) as keys, got {bad}")
            per = {f"[{dtype!r}]": d for dtype, d in dev.items()}
        else:
            per = {"": dev}
        for where, d in per.items():
            if not isinstance(d, Deviation) or d.policy not in POLICIES[behaviour] \
                    or not isinstance(d.where, Where):
                raise TypeError(f"{cls.__name__}.deviations[{behaviour!r}]{where}: expected "
                                f"Deviation(policy, reason[, where]) with policy one of {known} (or a "
                                f"dict dtype -> Deviation), got {d!r}")
