"""The interface every MHA implementation fulfils.

A plugin is a class. The harness constructs it once, asks what it can do
(``devices()``, ``dtypes(device)``, ``features``), then per call:

  state = impl.prepare(problem, device, dtype)   # untimed: weights and inputs to the device
  handle = impl.run(state)                       # timed: the forward (and backward if asked)
  impl.synchronize(state)                        # device barrier, before any clock is read
  result = impl.fetch(state, handle)             # untimed: back to NumPy float64

With ``grad=True`` the timed step is forward + backward of the scalar
``sum(out * suite.spec.problem.cotangent(problem))``, and ``Result.grads`` maps each name
in ``suite.spec.problem.GRAD_NAMES`` (inputs and weights; biases when present) to its
gradient. Treat query, key and value as separate leaves even when they are the same array
(a plugin with one key/value source, ``kv_source = "shared"``, returns that input's gradient
under "key" and none under "value").
A plugin that computes another problem than the one handed (a module as shipped, with its
own weights, norms and rotary: ``implementations.hf.shipped``) returns that problem in
``Result.posed`` (``Posed``), and is judged on it.
A plugin that compiles (jax.jit, torch.compile) does so in ``prepare`` and stores the
seconds in ``state.compile_s`` or ``state["compile_s"]``. ``synchronize`` receives only
the state, so an asynchronous plugin keeps its last output in the state.

Feature names (``features``, meanings in ``FEATURE_MEANINGS``): valid_lens, causal,
causal_bottom_right, bool_mask, bias, cross (Lq != Lk), gqa (H_kv < H), scale (explicit
scale), weights (returns attention weights), grad (gradients), and the score variants
(``VARIANT_FEATURES``, ``suite.spec.variants``): softcap, alibi, rel_bias, score_mod, sinks,
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
with ``suite.plugins.adapters.requested_form(problem)`` and gets the form's arrays, shaped as the
library takes them (nothing the library broadcasts is materialised), from
``suite.plugins.adapters.form_mask(problem, ...)``. The default declares none: the family reports
unsupported and every other case runs the plugin's usual translation.

The other attributes and hooks (``array_library``, ``kv_source``, ``kv_grouping``,
``projection_bias``, ``memory_model``, ``repeat_kv``, ``replaces_builtin``, ``repro_code``,
``poses_problem``, ``after_prepare``) are declared on ``Implementation`` with their defaults and what reads
them; ``suite.plugins.adapters`` translates the canonical problem (masks, weight layouts, gradient
names) into a library's terms.
"""

from __future__ import annotations

import dataclasses
from typing import (
    Any,
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

from suite.plugins.conditions import Where
from suite.plugins.declarations import (
    FEATURES,
    MASK_FORMS,
    POLICIES,
    RELATIONS,
    Contract,
    Declaration,
    Deviation,
)
from suite.spec.layouts import LAYOUTS
from suite.spec.paging import pool_only
from suite.spec.problem import DTYPES, InputError, Problem
from suite.spec.variants import ScoreMod


class Unavailable(RuntimeError):
    """Raised by a plugin's constructor when it cannot run here (the message says why)."""


class Unsupported(Exception):
    """Raised by ``prepare`` for a problem the plugin cannot express (the message says why):
    the case is reported as unsupported, not as an error."""


@dataclasses.dataclass
class Posed:
    """The problem a plugin computed, where that is not the problem it was handed.

    A module as shipped (``implementations.hf.shipped``) keeps its own weights, norms and
    rotary embeddings: what it computes is the attention on the query, key and value it made
    itself, not the handed problem's projections. Such a plugin returns ``Result(output,
    attn_weights, posed=Posed(problem, how))``: ``problem`` is that attention as a problem
    (the captured per-head q, k, v as the inputs, identity projections, the handed problem's
    mask, score variants and scale), ``output`` and ``attn_weights`` its results in that
    problem's shapes; ``how`` says how the plugin came to it (say, the call it captured) and
    ends a failure's reason. The judge (``suite.conformance.judge``) then takes the oracle,
    the baselines and the bound of ``problem`` instead of the handed one. It fails the result
    where ``problem`` has another batch, query or key length, head count or mask than the
    handed problem, or holds NaN or inf at a position where the handed inputs are finite.
    A case that compares several calls (the property families) cannot judge a posed problem
    and reports the case unsupported. A plugin that cannot say what it computed (say, it
    called its attention function twice) raises in ``fetch``: the case is an error."""

    problem: Problem
    how: str = ""


@dataclasses.dataclass
class Result:
    """What an implementation returned, as float64 NumPy arrays."""

    output: np.ndarray  # (B, L, E), or ``posed.problem``'s (B, L, E)
    attn_weights: Optional[np.ndarray] = None  # (B, H, L, S)
    grads: Optional[Dict[str, np.ndarray]] = None  # name -> gradient, same shape as the input
    # The problem the plugin computed, where it is not the handed one (``Posed``); None: the
    # handed problem, as for every built-in.
    posed: Optional[Posed] = None


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
    # Whether ``fetch`` may return ``Result.posed`` (a module as shipped judged on the problem
    # it poses itself): True, False (never), None (not said: ``mha-suite repro`` then calls
    # the plugin once on the case to find out which problem to save; a built-in poses none
    # unless its class says True). The toolkit's cores say False.
    poses_problem: ClassVar[Optional[bool]] = None
    # Mask forms (names in ``MASK_FORMS``) the library takes natively: the ``mask_forms``
    # family gives the plugin each one (``suite.plugins.adapters.requested_form``) and compares it
    # with the oracle on the same problem. Empty (the default): the family is unsupported.
    mask_forms: ClassVar[FrozenSet[str]] = frozenset()
    # Memory layouts (names in ``suite.spec.layouts.LAYOUTS``) the plugin hands its library as they
    # come (strided views, slices, stride-0 broadcasts): the ``layouts`` family asks for each
    # one (``suite.spec.layouts.requested_layout``); a layout not declared is reported unsupported.
    layouts: ClassVar[FrozenSet[str]] = frozenset({"contiguous"})
    # What its options must change (``Contract``: a relation to another of its names, or to
    # itself with an option set otherwise): the ``contracts`` family runs both sides on the
    # same problems and fails an option whose outputs are bit-identical where they must
    # differ, or whose error against the oracle moves the wrong way (suite.conformance.families.contracts).
    contracts: ClassVar[Tuple[Contract, ...]] = ()
    # True for a plugin that compiles anew for each shape and mask kind (torch.compile,
    # FlexAttention: seconds to tens of seconds each on a CPU): the main job's sample
    # (suite.conformance.sample) gives it one case per family and fewer property-based examples.
    compiles_per_shape: ClassVar[bool] = False
    # Names that share one compile path (the same converter, exporter, model integration or
    # code generator, around different modules) say so with one string: CI's covering
    # selection (suite.conformance.cover) spreads a per-shape compiler's families over its
    # siblings, and the lanes cases (vector tails) over any siblings; ``mha-suite check``
    # runs every name on every case.
    compile_path: ClassVar[Optional[str]] = None
    # Score modifiers of the plugin's own (suite.spec.variants.ScoreMod: a name, the NumPy
    # function the oracle computes, a doc): the ``variants/own_score_mods`` case runs each one
    # (the plugin declares "score_mod" and recognises its own by name), so a variant of its
    # own needs no change to the suite.
    score_mods: ClassVar[Tuple[ScoreMod, ...]] = ()
    # The case families this name runs (None: all). A built-in variant that differs from its
    # base in one code path names the families that path changes, which keeps the CI's cost
    # down; the other families are reported unsupported with the list.
    families: ClassVar[Optional[FrozenSet[str]]] = None
    # What the plugin's module fixes beyond its features: ``causal`` True for a decoder that
    # takes causal problems only, False for a module that takes none (an encoder), None for
    # either; ``rotary`` True where rotary embeddings turn pairs of the head width (an odd
    # width is unsupported). The property-based family draws within them, so its examples
    # are judged rather than refused; every other family's cases are posed as they are.
    causal: ClassVar[Optional[bool]] = None
    rotary: ClassVar[bool] = False

    def framework_version(self) -> str:
        """The version of the library ``framework`` names (its installed distribution:
        ``hf`` -> transformers, ``flax`` -> flax, ...), "unknown" when none is installed."""
        from suite.results.environment import framework_version

        return framework_version(self.framework) or "unknown"

    def isa(self, device: str) -> Optional[str]:
        """The CPU instruction-set level this process's array library dispatched its kernels
        to on ``device`` (``suite.plugins.isa``): torch's level on the CPU for a plugin whose array
        library is torch, else None (a library the suite does not pin to a level)."""
        from suite.plugins import isa

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


def is_builtin(cls: type) -> bool:
    """Whether ``cls`` is one of the built-ins' classes (defined in ``implementations``)."""
    return cls.__module__.split(".")[0] == "implementations"


def builtin_ancestors(impl: Any) -> List[str]:
    """For a plugin outside the built-ins, the names of the built-ins its class derives
    from, nearest first (a class of the ``implementations`` package with a ``name`` of its
    own other than ``impl``'s); none for a built-in (each lists its own entries)."""
    own = getattr(impl, "name", None)
    out: List[str] = []
    if is_builtin(type(impl)):
        return out
    for cls in type(impl).__mro__[1:]:
        name = vars(cls).get("name")
        if isinstance(name, str) and name != own and name not in out \
                and is_builtin(cls):
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
    state = impl.prepare(handed(impl, problem), device, dtype, need_weights=need_weights,
                         grad=grad)
    handle = impl.run(state)
    impl.synchronize(state)
    result = impl.fetch(state, handle)
    return result if order is None or not isinstance(result, Result) else \
        _canonical_heads(result, order, problem)


def handed(impl: Any, problem: Problem) -> Problem:
    """``problem`` exactly as ``impl.prepare`` receives it: its query heads in the order the
    plugin's kv grouping needs (``grouped_for``), and a paged cache's pool as the only copy of
    the keys and values (``suite.spec.paging.pool_only``: the logical key and value replaced
    by garbage, so a plugin that declares ``paged`` and reads them fails)."""
    return pool_only(grouped_for(impl, problem))


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

    def in_canonical_order(a: Optional[np.ndarray], shape: tuple, axis: int) -> Optional[np.ndarray]:
        if a is None or np.size(a) != np.prod(shape):  # a wrong shape is the judge's to see
            return a
        out = np.empty(shape, dtype=np.asarray(a).dtype)
        idx = [slice(None)] * len(shape)
        idx[axis] = order
        out[tuple(idx)] = np.asarray(a).reshape(shape)  # library head h holds canonical order[h]
        return out.reshape(np.shape(a))

    weights = result.attn_weights
    if weights is not None and np.ndim(weights) == 4 and np.shape(weights)[1] == H:
        weights = in_canonical_order(weights, np.shape(weights), 1)
    grads = result.grads
    if grads:
        grads = dict(grads)
        for name, shape, axis in (("w_q", (E, H, D), 1), ("b_q", (H, D), 0),
                                  ("w_o", (H, V, E), 0)):
            if grads.get(name) is not None:
                grads[name] = in_canonical_order(grads[name], shape, axis)
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
    if not (declared(cls, "causal") is None or isinstance(declared(cls, "causal"), bool)):
        raise TypeError(f"{cls.__name__}.causal: expected None, True or False, got "
                        f"{cls.causal!r}")
    if not isinstance(declared(cls, "rotary"), bool):
        raise TypeError(f"{cls.__name__}.rotary: expected True or False, got {cls.rotary!r}")
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
                        f"suite.spec.variants.ScoreMod, got {mods!r}")
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
