"""Property-based shapes: Hypothesis draws B, Lq, Lk, E, H, H_kv and masks within bounds.

Derandomised and bounded (``--hypothesis-examples``: by default 25 per implementation,
dtype and device, fewer where each shape compiles or is interpreted) so CI is repeatable;
raise it for longer searches. Draws use only
features the implementation declares, so every example is a fair question.
"""

from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import FlakyFailure  # noqa: E402

from suite.conformance import cover  # noqa: E402
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
def problems(draw, features: frozenset, self_attention: bool = False):
    """A seeded problem within small bounds, using only ``features``; ``self_attention``:
    one input as query, key and value (a plugin with ``kv_source = "self"``, which takes
    no other problem). The score variants the plugin declares are drawn last, so a plugin
    declaring none draws what it always drew."""
    H = draw(st.integers(1, 6))
    K = draw(st.sampled_from([k for k in range(1, H + 1) if H % k == 0])) \
        if "gqa" in features else H
    D = draw(st.integers(1, 9))
    B = draw(st.integers(1, 3))
    L = draw(st.integers(1, 24))
    S = draw(st.integers(1, 24)) if "cross" in features and not self_attention else L
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kw = {}
    if "valid_lens" in features and draw(st.booleans()):
        kw["valid_lens"] = rng.integers(1, S + 1, size=B)  # rows keep >= 1 key
    causal_kinds = [k for k in ("causal", "causal_bottom_right") if k in features]
    if causal_kinds and draw(st.booleans()):
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


# The score variants the random shapes draw (each with probability 1/2 where declared).
VARIANTS = frozenset({"softcap", "alibi", "rel_bias", "sinks"})


def draw_variants(draw, p, features: frozenset, rng: np.random.Generator):
    """``p`` with each score variant ``features`` declares drawn in (or not): a cap in
    [1, 30], ALiBi's slopes in a drawn convention and alignment, sinks ~ N(0, 2^2), a
    relative table (T5's or a clipped distance, either direction)."""
    import dataclasses

    from suite.spec.variants import ALIBI_CONVENTIONS, ALIGNS, Alibi, RelBias, alibi_slopes

    out = {}
    if "softcap" in features and draw(st.booleans()):
        out["softcap"] = draw(st.integers(2, 60)) / 2.0
    if "alibi" in features and draw(st.booleans()):
        out["alibi"] = Alibi(alibi_slopes(p.H), draw(st.sampled_from(sorted(ALIBI_CONVENTIONS))),
                             draw(st.sampled_from(ALIGNS)))
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
                                  draw(st.sampled_from(ALIGNS)))
    return dataclasses.replace(p, **out) if out else p


def gqa_examples(features: frozenset) -> list:
    """Examples run before the drawn ones: a GQA problem where h // (H/K) and h % K pair
    different kv heads with most query heads (H = 6, K = 3: heads 1-4), so a library
    grouping its heads either way is checked (draws reach 1 < K < H in about one example in
    seven, and derandomised draws of 25 examples missed a wrong grouping)."""
    if "gqa" not in features:
        return []
    return [make_problem(20231124, 2, 5, 5, 12, 6, 3)]


def test_random_shapes(target, conform, request, listed_known_failure, listed_to_show):
    n = request.config.getoption("--hypothesis-examples")
    if n is None:  # the default: bounded where each new shape costs seconds
        n = INTERPRETED_EXAMPLES if interpreted(target[1]) else COMPILED_EXAMPLES \
            if declared(target[0].impl, "compiles_per_shape") else EXAMPLES
        if request.config.getoption("--sample"):  # the main job's sample: fewer still
            n = examples(target[0].impl, target[1], n)
        elif request.config.getoption("--cover") and not listed_to_show:
            # CI's: fewer, one for a per-shape compiler. A listed known failure keeps its
            # full count: the draw that shows it may not be the first, and a strict run that
            # stopped short would call a standing entry stale (it stops at its first failure).
            n = cover.examples(target[0].impl, target[1], n)
    # A listed known failure runs to show it still fails: its first failing example says so,
    # and its reproducer is already written, so Hypothesis does not shrink it (on a plugin
    # that compiles each new shape, shrinking alone took 300 s, Hypothesis's own limit).
    phases = [ph for ph in Phase if ph not in (Phase.shrink, Phase.explain)] \
        if listed_known_failure else list(Phase)

    def judge(impl, out):
        tried = []

        def check(p):
            late = timed_out(request.node)
            if late:  # past --timeout: no further example runs (the case is an error)
                raise Timeout(late)
            o = run_problem(impl, Outcome(out.impl, out.device, out.dtype, "hypothesis",
                                          "random_shapes", 0, "pass"), p.validate())
            tried.append(o)
            if o.outcome in FAILED:
                raise AssertionError(
                    f"B={p.B} Lq={p.L} Lk={p.S} E={p.E} H={p.H} H_kv={p.K} "
                    f"mask={sorted(p.mask.kinds)}: {o.reason}")

        features = frozenset(impl.features)
        fixed = gqa_examples(features)
        for p in fixed:
            check = example(p)(check)
        # the fixed examples count in the bound: the case costs what it did (a compiled
        # plugin compiles each new shape) and its reason still says n examples
        check = settings(max_examples=max(1, n - len(fixed)), derandomize=True, deadline=None, database=None,
                         phases=phases, suppress_health_check=list(HealthCheck),
                         print_blob=True)(given(problems(
                             features, declared(impl, "kv_source") == "self"))(check))
        try:
            check()
        except FlakyFailure as exc:  # failed once, passed when Hypothesis replayed it
            first = next((e for e in exc.exceptions if isinstance(e, AssertionError)), exc)
            return out.classify("flaky", "an example failed, then passed when replayed: "
                                         + str(first).splitlines()[0])
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

    conform("hypothesis", "random_shapes", 0, judge)
