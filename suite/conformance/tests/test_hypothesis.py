"""Property-based cases: Hypothesis draws B, Lq, Lk, E, H, H_kv and masks within bounds
(``test_random_shapes``), or a problem in one of the inference forms, decode rows at offsets
in a cache, packed sequences or a paged cache (``test_random_inference``), each with the
score variants the implementation declares drawn on top.

Derandomised and bounded (``--hypothesis-examples``: by default 25 per implementation,
dtype and device, fewer where each shape compiles or is interpreted) so CI is repeatable;
raise it for longer searches. Draws use only
features the implementation declares, so every example is a fair question.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import FlakyFailure  # noqa: E402

from suite.conformance.judge import FAILED, Outcome, run_problem  # noqa: E402
from suite.conformance.sample import examples  # noqa: E402
from suite.plugins.interface import declared, interpreted  # noqa: E402
from suite.spec.problem import Mask, make_problem  # noqa: E402
from suite.timeouts import Timeout, timed_out  # noqa: E402

# Examples when --hypothesis-examples is not given. Each new shape costs a compile on a
# plugin that compiles per shape and a trace on an interpreted kernel, and every case keeps
# a 3x margin under --timeout (300 s): 25 torch.flex examples took 137-177 s on 2 quiet
# cores (and hit 300 s on busy ones), 25 Pallas examples over 300 s on 2 loaded cores.
EXAMPLES = 25
COMPILED_EXAMPLES = 6
INTERPRETED_EXAMPLES = 5


@st.composite
def problems(draw, features: frozenset, self_attention: bool = False,
             causal: Optional[bool] = None, rotary: bool = False):
    """A seeded problem within small bounds, using only ``features``; ``self_attention``:
    one input as query, key and value (a plugin with ``kv_source = "self"``, which takes
    no other problem); ``causal`` and ``rotary``: the plugin's declarations of that name
    (True: always causal; even head widths). The score variants the plugin declares are
    drawn last, so a plugin declaring none draws what it always drew."""
    H = draw(st.integers(1, 6))
    K = draw(st.sampled_from([k for k in range(1, H + 1) if H % k == 0])) \
        if "gqa" in features else H
    D = draw(st.sampled_from(EVEN_WIDTHS)) if rotary else draw(st.integers(1, 9))
    B = draw(st.integers(1, 3))
    L = draw(st.integers(1, 24))
    S = draw(st.integers(1, 24)) if "cross" in features and not self_attention else L
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kw = {}
    if "valid_lens" in features and draw(st.booleans()):
        kw["valid_lens"] = rng.integers(1, S + 1, size=B)  # rows keep >= 1 key
    causal_kinds = [k for k in ("causal", "causal_bottom_right") if k in features]
    if causal_kinds and (causal or draw(st.booleans())):
        kind = draw(st.sampled_from(causal_kinds))
        kw["causal"] = True
        kw["causal_align"] = "top_left" if kind == "causal" else "bottom_right"
    if "bool_mask" in features and draw(st.booleans()):
        allowed = rng.random((B, H, L, S)) < 0.7
        allowed[..., 0] = True
        kw["allowed"] = allowed
    if "bias" in features and draw(st.booleans()):
        kw["bias"] = rng.standard_normal((1, H, L, S))
    # Keep key 0 visible so no row is fully masked (that behaviour has its own cases).
    if kw.get("causal_align") == "bottom_right" and L > S:  # its first L - S rows see nothing
        del kw["causal"], kw["causal_align"]
    V = None
    if "value_width" in features and draw(st.booleans()):
        V = draw(st.sampled_from([v for v in range(1, 10) if v != D]))
    p = make_problem(seed, B, L, S, H * D, H, K, mask=Mask(**kw), value_head_dim=V,
                     self_attention=self_attention, input_scale=2.0 if features & VARIANTS
                     else 1.0)
    return draw_variants(draw, p, features, rng)


# The head widths drawn for a plugin whose rotary embeddings turn pairs (``rotary``).
EVEN_WIDTHS = (2, 4, 6, 8)

# The score variants the random shapes draw (each with probability 1/2 where declared).
VARIANTS = frozenset({"softcap", "alibi", "rel_bias", "sinks"})


def draw_variants(draw, p, features: frozenset, rng: np.random.Generator,
                  aligns: Optional[Sequence[str]] = None):
    """``p`` with each score variant ``features`` declares drawn in (or not): a cap in
    [1, 30], ALiBi's slopes in a drawn convention and alignment (one of ``aligns``, default
    every one), sinks ~ N(0, 2^2), a relative table (T5's or a clipped distance, either
    direction), one of the suite's score modifiers (``SCORE_MODS``: they read the positions
    each form places its rows at)."""
    from suite.spec.variants import (
        ALIBI_CONVENTIONS,
        ALIGNS,
        SCORE_MODS,
        Alibi,
        RelBias,
        alibi_slopes,
    )

    aligns = ALIGNS if aligns is None else aligns
    out = {}
    if "softcap" in features and draw(st.booleans()):
        out["softcap"] = draw(st.integers(2, 60)) / 2.0
    if "alibi" in features and draw(st.booleans()):
        out["alibi"] = Alibi(alibi_slopes(p.H), draw(st.sampled_from(sorted(ALIBI_CONVENTIONS))),
                             draw(st.sampled_from(aligns)))
    if "sinks" in features and draw(st.booleans()):
        out["sinks"] = 2.0 * rng.standard_normal(p.H)
    if "rel_bias" in features and draw(st.booleans()):
        bucketing = draw(st.sampled_from(["t5", "clip"]))
        both = draw(st.booleans())
        if bucketing == "t5":  # exact buckets below n/2 (n/4 both ways), max_distance past them
            n = draw(st.integers(4, 16))
            far = draw(st.integers((n // 2 if both else n) // 2 + 1, 24))
        else:
            far = draw(st.integers(1, 12))
            n = 2 * far + 1 if both else far + 1
        out["rel_bias"] = RelBias(1.5 * rng.standard_normal((p.H, n)), bucketing, both, far,
                                  draw(st.sampled_from(aligns)))
    if "score_mod" in features and draw(st.booleans()):  # drawn last: the draws above stay
        out["score_mod"] = SCORE_MODS[draw(st.sampled_from(sorted(SCORE_MODS)))]
    return dataclasses.replace(p, **out) if out else p


def gqa_examples(features: frozenset, self_attention: bool = False) -> list:
    """Examples run before the drawn ones: a GQA problem where h // (H/K) and h % K pair
    different kv heads with most query heads (H = 6, K = 3: heads 1-4), so a library
    grouping its heads either way is checked (draws reach 1 < K < H in about one example in
    seven, and derandomised draws of 25 examples missed a wrong grouping)."""
    if "gqa" not in features:
        return []
    return [make_problem(20231124, 2, 5, 5, 12, 6, 3)]


# The inference forms (``suite.conformance.families``: decode, packed, paged), each drawn
# where a plugin declares what its family's cases need.
FORMS = ("decode", "packed", "paged")


def inference_forms(features: frozenset, self_attention: bool = False) -> List[str]:
    """The inference forms a plugin with ``features`` is drawn in: ``decode`` (rows at offsets
    into a cache: causality aligned at the offset), ``packed`` (sequences back to back), and
    ``paged`` (a decode step's cache, or one row per sequence masked by its length alone,
    read through a block table). Decode and paged pose separate query and cache inputs, so a
    plugin taking one input for query, key and value draws packed problems only."""
    decode = {"decode", "causal"} <= features and not self_attention
    return [form for form, ok in (
        ("decode", decode), ("packed", "packed" in features),
        ("paged", "paged" in features and not self_attention
         and (decode or "valid_lens" in features))) if ok]


def no_inference_form(features: frozenset, self_attention: bool = False) -> Optional[str]:
    """Why a plugin has no inference form to draw (its ``random_inference`` is unsupported),
    or None."""
    if inference_forms(features, self_attention):
        return None
    if self_attention and features & {"decode", "paged"} and "packed" not in features:
        return ("needs packed (decode and paged pose a cache apart from the queries, which a "
                "plugin taking one input for query, key and value cannot be given)")
    return "needs one of the inference forms decode (with causal), packed or paged"


def inference_examples(features: frozenset, self_attention: bool = False) -> list:
    """Examples run before the drawn ones: where the plugin is drawn in the decode form with
    a position variant, two rows per batch at offsets well inside the cache (caches filled to
    13, 6 and 9 of 16 slots, or offsets 9, 3 and 6 without lengths) carrying every score
    variant it declares, ALiBi as ``distance`` (the one convention that sees where a row
    sits: ``key`` and ``signed`` differ from a misplaced row by a row constant) and T5's
    decoder table. 25 derandomised draws missed ALiBi measured from row 0 at an offset
    (``tests/plugins/decode_planted.py``'s ``bug.alibi_at_zero``): most draw no position
    variant, another convention, or an offset near 0."""
    from suite.conformance.families.decode import DH, decode_problem
    from suite.spec.variants import Alibi, RelBias, alibi_slopes

    if "decode" not in inference_forms(features, self_attention) or "cross" not in features \
            or not features & {"alibi", "rel_bias"}:
        return []
    lengths = [13, 6, 9] if "valid_lens" in features else None
    p = decode_problem(20261124, 2, lengths, None if lengths else [9, 3, 6],
                       K=2 if "gqa" in features else None, input_scale=2.0,
                       value_head_dim=3 if "value_width" in features else None)
    rng = np.random.default_rng(20261124)
    out = {"softcap": 4.0 if "softcap" in features else None,
           "alibi": Alibi(alibi_slopes(DH), "distance") if "alibi" in features else None,
           "rel_bias": RelBias(1.5 * rng.standard_normal((DH, 16)), "t5", False, 12)
           if "rel_bias" in features else None,
           "sinks": 2.0 * rng.standard_normal(DH) if "sinks" in features else None}
    return [dataclasses.replace(p, **out).validate()]


def _heads(draw, features: frozenset, rotary: bool = False):
    """(H, K, D, V): query heads, key/value heads (a divisor of H where ``gqa``), head width
    (even where ``rotary``), value head width (another where ``value_width``, drawn as
    ``problems`` draws it)."""
    H = draw(st.integers(1, 6))
    K = draw(st.sampled_from([k for k in range(1, H + 1) if H % k == 0])) \
        if "gqa" in features else H
    D = draw(st.sampled_from(EVEN_WIDTHS)) if rotary else draw(st.integers(1, 9))
    V = draw(st.sampled_from([v for v in range(1, 10) if v != D])) \
        if "value_width" in features and draw(st.booleans()) else None
    return H, K, D, V


def _sees_a_key(p) -> bool:
    """Every query row may attend some key (a fully masked row has its own cases)."""
    return bool(p.mask.dense_allowed(p.B, p.H, p.L, p.S).any(axis=-1).all())


def _draw_decode(draw, features: frozenset, seed: int, B: int, heads, scale: float,
                 lengths_only: bool = False):
    """A decode problem (``decode_problem``): B batch items, Lq in [1, 4] rows per item at
    offsets into an S-slot cache (S in [Lq, 24]; S = Lq without ``cross``), filled to drawn
    lengths (where ``valid_lens``; slots past them hold garbage) or full; the rows at their
    cache's end or anywhere in it (past the length too); a sliding window where ``bool_mask``
    (dropped if it would leave a row no key). ``lengths_only``: one row per item seeing its
    whole cache up to its length, no causal mask or offset (vLLM's paged form)."""
    from suite.conformance.families.decode import decode_problem
    from suite.spec.problem import Mask

    H, K, D, V = heads
    cross = "cross" in features
    if lengths_only:
        S = draw(st.integers(1, 24)) if cross else 1
        lengths = draw(st.lists(st.integers(1, S), min_size=B, max_size=B))
        p = decode_problem(seed, 1, lengths, S=S, K=K, E=H * D, input_scale=scale,
                           value_head_dim=V, B=B, H=H)
        return dataclasses.replace(p, mask=Mask(valid_lens=p.mask.valid_lens))
    if cross:
        S = draw(st.integers(1, 24))
        L = draw(st.integers(1, min(4, S)))
    else:  # rows and cache of one length: the offsets are 0
        S = L = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(1, S), min_size=B, max_size=B)) \
        if "valid_lens" in features and draw(st.booleans()) else None
    if lengths is not None and draw(st.booleans()):  # each item's rows end at its length
        offsets = [min(max(n - L, 0), S - L) for n in lengths]
    else:
        offsets = draw(st.lists(st.integers(0, S - L), min_size=B, max_size=B))
    window = draw(st.integers(1, S)) if "bool_mask" in features and draw(st.booleans()) \
        else None
    p = decode_problem(seed, L, lengths, offsets, S=S, K=K, window=window, E=H * D,
                       input_scale=scale, value_head_dim=V, B=B, H=H)
    if window is not None and not _sees_a_key(p):  # the window left a row no key
        p = decode_problem(seed, L, lengths, offsets, S=S, K=K, E=H * D, input_scale=scale,
                           value_head_dim=V, B=B, H=H)
    return p


def _draw_packed(draw, features: frozenset, seed: int, B: int, heads, scale: float,
                 self_attention: bool, always_causal: bool = False):
    """A packed problem (``packed_problem``): B rows of L in [1, 20] tokens, each cut into
    sequences at drawn boundaries; causal where ``causal`` (drawn), a sliding window inside
    each sequence where ``bool_mask`` (drawn); one input for query, key and value where the
    plugin takes only that, else drawn."""
    from suite.conformance.families.packed import packed_problem

    H, K, D, V = heads
    L = draw(st.integers(1, 20))
    rows = []
    for _ in range(B):
        cuts = draw(st.lists(st.booleans(), min_size=L - 1, max_size=L - 1))
        ends = [i + 1 for i, cut in enumerate(cuts) if cut] + [L]
        rows.append(np.diff([0] + ends).tolist())
    causal = "causal" in features and (always_causal or draw(st.booleans()))
    window = draw(st.integers(1, L)) if "bool_mask" in features and draw(st.booleans()) \
        else None
    one_input = self_attention or draw(st.booleans())
    return packed_problem(seed, rows, causal=causal, K=K, window=window,
                          self_attention=one_input, input_scale=scale, E=H * D, H=H,
                          value_head_dim=V)


def _draw_paged(draw, features: frozenset, seed: int, B: int, heads, scale: float,
                always_causal: bool = False):
    """A paged problem (``paged``): a drawn decode problem (rows at offsets, or by lengths
    alone where ``valid_lens``; by lengths alone only, without ``decode``) paged in blocks of
    1 to 6 slots, 1 to 4 spare garbage blocks in the pool, and sometimes a later sequence
    sharing the first sequence's first whole blocks (prefix sharing)."""
    from suite.conformance.families.paged import paged
    from suite.spec.paging import blocks_used, lengths_of

    decode = {"decode", "causal"} <= features
    lengths_only = not decode or (not always_causal and "valid_lens" in features
                                  and draw(st.booleans()))
    p = _draw_decode(draw, features, seed, B, heads, scale, lengths_only=lengths_only)
    P = draw(st.integers(1, 6))
    shared = []
    if B > 1 and draw(st.booleans()):
        b = draw(st.integers(1, B - 1))
        lengths = lengths_of(p)
        most = min(int(lengths[0]) // P, int(blocks_used(lengths, P)[b]))  # whole blocks
        if most >= 1:
            shared = [(b, 0, draw(st.integers(1, most)))]
    return paged(p, seed, P, spare=draw(st.integers(1, 4)), shared=shared)


@st.composite
def inference_problems(draw, features: frozenset, self_attention: bool = False,
                       causal: Optional[bool] = None, rotary: bool = False):
    """A seeded problem in one of the inference forms ``features`` allows
    (``inference_forms``), at small random sizes, with the score variants the plugin
    declares drawn on top (``draw_variants``): ALiBi and the relative table at top_left
    beside an offset or sequences (the form places each row at its absolute position, which
    ``Problem.validate`` requires), in either alignment by lengths alone."""
    form = draw(st.sampled_from(inference_forms(features, self_attention)))
    heads = _heads(draw, features, rotary)
    B = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = 2.0 if features & VARIANTS else 1.0
    if form == "decode":
        p = _draw_decode(draw, features, seed, B, heads, scale)
    elif form == "packed":
        p = _draw_packed(draw, features, seed, B, heads, scale, self_attention, bool(causal))
    else:
        p = _draw_paged(draw, features, seed, B, heads, scale, bool(causal))
    placed = p.mask.query_offset is not None or p.mask.segments is not None
    return draw_variants(draw, p, features, np.random.default_rng(seed),
                         aligns=("top_left",) if placed else None)


def test_random_shapes(target, conform, request, listed_known_failure, listed_to_show):
    run_drawn("random_shapes", problems, target, conform, request, listed_known_failure,
              listed_to_show, fixed=gqa_examples)


def test_random_inference(target, conform, request, listed_known_failure, listed_to_show):
    run_drawn("random_inference", inference_problems, target, conform, request,
              listed_known_failure, listed_to_show, fixed=inference_examples,
              refuse=no_inference_form)


def example_count(request, target, listed_to_show: bool) -> int:
    """How many examples a drawn case runs on ``target``: ``--hypothesis-examples``, else
    bounded where each new shape costs seconds, fewer in the main job's sample (``--sample``)
    and in CI's selection (``--cover``)."""
    n = request.config.getoption("--hypothesis-examples")
    if n is not None:
        return n
    n = INTERPRETED_EXAMPLES if interpreted(target[1]) else COMPILED_EXAMPLES \
        if declared(target[0].impl, "compiles_per_shape") else EXAMPLES
    if request.config.getoption("--sample"):  # the main job's sample: fewer still
        return examples(target[0].impl, target[1], n)
    if request.config.getoption("--cover") and not listed_to_show:
        # CI's: fewer, one for a per-shape compiler. A listed known failure keeps its
        # full count: the draw that shows it may not be the first, and a strict run that
        # stopped short would call a standing entry stale (it stops at its first failure).
        return examples(target[0].impl, target[1], n)
    return n


def drawn_within(impl) -> Tuple[frozenset, dict]:
    """The features ``impl``'s draws use and what its module fixes beyond them (the
    ``causal`` and ``rotary`` declarations, as the strategies take them): drawn within, its
    examples are judged rather than refused (a causal decoder was handed a non-causal problem
    half the time). An encoder (``causal = False``) draws without its causal features."""
    features = frozenset(impl.features)
    fixes = {"causal": declared(impl, "causal"), "rotary": declared(impl, "rotary")}
    if fixes["causal"] is False:
        features -= {"causal", "causal_bottom_right"}
    return features, fixes


def describe(p) -> str:
    """One line naming a drawn problem: its shape, mask kinds, the form's offsets, cache
    lengths, sequences or page size, and the variants drawn."""
    from suite.spec.problem import VARIANT_FIELDS, seq_lens

    m = p.mask
    text = (f"B={p.B} Lq={p.L} Lk={p.S} E={p.E} H={p.H} H_kv={p.K} "
            f"mask={sorted(m.kinds)}")
    if m.query_offset is not None:
        text += f" offsets={np.asarray(m.query_offset).tolist()}"
    if m.valid_lens is not None and (m.query_offset is not None or p.paging is not None):
        text += f" cache_lengths={np.asarray(m.valid_lens).tolist()}"
    if m.segments is not None:
        text += f" sequences={seq_lens(m.segments)}"
    if p.paging is not None:
        text += f" page_size={p.paging.page_size}"
    drawn = [n for n in VARIANT_FIELDS if getattr(p, n) is not None] + \
        (["value_width"] if p.V != p.D else [])
    return text + (f" variants={drawn}" if drawn else "")


def run_drawn(name: str, strategy, target, conform, request, listed_known_failure: bool,
              listed_to_show: bool, fixed=lambda f, s: [], refuse=lambda f, s: None
              ) -> None:
    """Run the drawn case ``hypothesis/name`` on ``target``: ``strategy(features,
    self_attention)`` draws its problems, ``fixed(features, self_attention)`` gives examples
    run first,
    ``refuse(features, self_attention)`` a reason the plugin has nothing to draw (the case is
    unsupported without running)."""
    n = example_count(request, target, listed_to_show)
    # A listed known failure runs to show it still fails: its first failing example says so,
    # and its reproducer is already written, so Hypothesis does not shrink it (on a plugin
    # that compiles each new shape, shrinking alone took 300 s, Hypothesis's own limit).
    phases = [ph for ph in Phase if ph not in (Phase.shrink, Phase.explain)] \
        if listed_known_failure else list(Phase)

    def judge(impl, out):
        tried = []
        features, fixes = drawn_within(impl)
        self_attention = declared(impl, "kv_source") == "self"
        refused = refuse(features, self_attention)
        if refused:
            return out.classify("unsupported", refused)

        def check(p):
            late = timed_out(request.node)
            if late:  # past --timeout: no further example runs (the case is an error)
                raise Timeout(late)
            o = run_problem(impl, Outcome(out.impl, out.device, out.dtype, "hypothesis",
                                          name, 0, "pass"), p.validate())
            tried.append(o)
            if o.outcome in FAILED:
                raise AssertionError(f"{describe(p)}: {o.reason}")

        first = fixed(features, self_attention)
        for p in first:
            check = example(p)(check)
        # the fixed examples count in the bound: the case costs what it did (a compiled
        # plugin compiles each new shape) and its reason still says n examples
        check = settings(max_examples=max(1, n - len(first)), derandomize=True, deadline=None,
                         database=None, phases=phases, suppress_health_check=list(HealthCheck),
                         print_blob=True,
                         # one failure, the smallest: two distinct ones came back as an
                         # ExceptionGroup, an error naming neither (hf.model.llama[flex])
                         report_multiple_bugs=False)(
            given(strategy(features, self_attention, **fixes))(check))
        try:
            check()
        except FlakyFailure as exc:  # failed once, passed when Hypothesis replayed it
            failed = next((e for e in exc.exceptions if isinstance(e, AssertionError)), exc)
            return out.classify("flaky", "an example failed, then passed when replayed: "
                                         + str(failed).splitlines()[0])
        except AssertionError as exc:
            out.comparisons = tried[-1].comparisons
            return out.classify(tried[-1].outcome, str(exc).splitlines()[0])
        refused = [o for o in tried if o.outcome == "unsupported"]
        if tried and len(refused) == len(tried):  # nothing was judged: no verdict, no pass
            return out.classify("unsupported", f"all {len(tried)} examples unsupported (first: "
                                               f"{refused[0].reason})")
        comparisons = [c for o in tried for c in o.comparisons]
        out.comparisons = [max(comparisons, key=lambda c: c.err / c.bound)] if comparisons else []
        return out.classify("pass", f"{len(tried)} examples" + (
            f" ({len(refused)} of them unsupported)" if refused else ""))

    conform("hypothesis", name, 0, judge)
