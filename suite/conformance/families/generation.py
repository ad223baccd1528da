"""The generation family: a module that keeps its own key/value cache computes a causal
self-attention problem as a generating model does, a prefill and then decode steps
(``Problem.steps``, feature ``steps``), each chunk's rows attending what its cache holds.

The answer is the same attention as one call's, so the oracle judges every chunk's rows as
it judges the whole prefill: a cache appended twice, written one slot off, rolled early or
read past what it holds fails at the rows of the step where it goes wrong (the failing rows
name the step), and a module whose decode steps disagree with its own prefill fails too.
Cases: a prefill then single steps, one token at a time from an empty cache, a chunked
prefill, a static cache longer than the sequence (``Problem.cache_len``, feature
``static_cache``) and one exactly full, a sliding window whose boundary falls inside the
cache (given as the ``local_window+causal_flag`` mask form to a plugin that declares it, as a
sliding-window model's config takes it) and one that fills during the decode steps (a
prefill shorter than the window), and a grouped-query cache; with a score variant (issue 50):
Gemma 2's cap (and its steps against its own prefill), gpt-oss's sinks beside a window,
ALiBi at each step's absolute position, BLOOM's own ALiBi, and a score modifier whose i and
j are each step's positions in the whole sequence (and its steps against its own prefill).

``suite.conformance.cases`` registers ``BUILDERS`` into its ``CASES`` (this module does not import it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from suite.conformance.families.declare import family
from suite.spec.problem import Mask, Problem, make_problem
from suite.spec.variants import SCORE_MODS, Alibi, alibi_slopes

FAMILY = "generation"
GB, GE, GH = 2, 16, 4  # batch, width, heads (D = 4)
WINDOW = 4  # the window case: query i sees keys i - 3 .. i
WINDOW_FORM = "local_window+causal_flag"
BUILDERS, case = family(FAMILY)  # (name, seed -> problem, Case keywords), in order




def generation_problem(seed: int, steps: Sequence[int], cache_len: Optional[int] = None,
                       K: Optional[int] = None, window: Optional[int] = None,
                       input_scale: float = 1.0) -> Problem:
    """A causal self-attention problem of L = sum(steps) tokens computed in ``steps``."""
    L = int(sum(steps))
    allowed = None
    if window is not None:  # query i also sees only keys j > i - window
        i = np.arange(L)
        allowed = (i[None, :] > i[:, None] - window)[None, None]
    p = make_problem(seed, GB, L, L, GE, GH, K, self_attention=True,
                     mask=Mask(causal=True, allowed=allowed), input_scale=input_scale)
    return dataclasses.replace(p, steps=tuple(int(n) for n in steps), cache_len=cache_len)


@case("prefill_then_steps")
def _prefill_then_steps(seed):
    """A prefill of 6 tokens, then 5 decode steps of one token each."""
    return generation_problem(seed, (6, 1, 1, 1, 1, 1))


@case("token_by_token")
def _token_by_token(seed):
    """Eight steps of one token from an empty cache (no prefill)."""
    return generation_problem(seed, (1,) * 8)


@case("chunked_prefill")
def _chunked_prefill(seed):
    """A prefill in chunks of 5, 4 and 3 tokens, then a step of 2 (speculative decoding)."""
    return generation_problem(seed, (5, 4, 3, 2))


@case("static_cache")
def _static_cache(seed):
    """A static cache of 16 slots for 9 tokens (a prefill of 5, then 4 steps): the slots not
    yet written must not reach any row."""
    return generation_problem(seed, (5, 1, 1, 1, 1), cache_len=16)


def _window_judge(impl: Any, out: Any, p: Problem) -> Any:
    """The window as a sliding-window model's config takes it, to a plugin that declares
    that mask form; as the canonical mask to any other."""
    from suite.conformance.judge import run_problem
    from suite.plugins.adapters import with_form
    from suite.plugins.interface import declared

    if WINDOW_FORM in declared(impl, "mask_forms"):
        p = with_form(p, WINDOW_FORM)
    return run_problem(impl, out, p)


@case("window_in_cache", judge=_window_judge)
def _window_in_cache(seed):
    """A sliding window of 4 tokens over a prefill of 6 and 6 steps: from the second step
    on, the window's boundary falls inside the cache (a cache that rolls one step early or
    late reads a key too many or too few)."""
    return generation_problem(seed, (6,) + (1,) * 6, window=WINDOW)


@case("window_fills_in_steps", judge=_window_judge)
def _window_fills_in_steps(seed):
    """A sliding window of 4 tokens over a prefill of 2 and 7 single steps: the window fills
    during the steps (the cache reaches 4 tokens at the second) and slides from there, where
    ``window_in_cache`` fills it within the prefill (a cache that evicts one key too many,
    or too early, when it first fills at a decode step reads a key too few there)."""
    return generation_problem(seed, (2,) + (1,) * 7, window=WINDOW)


@case("static_cache_exactly_full")
def _static_cache_exactly_full(seed):
    """A static cache of 9 slots for 9 tokens (a prefill of 5, then 4 steps): the last step
    writes the last slot (a cache that takes a full cache for an overflow drops it)."""
    return generation_problem(seed, (5, 1, 1, 1, 1), cache_len=9)


@case("gqa_cache")
def _gqa_cache(seed):
    """Two key/value heads for four query heads in the cache: a prefill of 4, 3 steps."""
    return generation_problem(seed, (4, 1, 1, 1), K=2)


def _judge_prefill(impl: Any, out: Any, p: Problem) -> Any:
    """The module's prefill, then its decode steps, against its own prefill of the same
    tokens in one call: each step's rows and the one call's differ by no more than two
    results within the rule's bound can (the paths' agreement, beside the oracle's verdict
    on each)."""
    from suite.conformance.judge import forms_agree

    starts = np.cumsum((0,) + p.steps[:-1]).tolist()
    parts = [((slice(None), rows), (slice(None), rows),
              f"step {i + 1} of {len(p.steps)}, rows from {start}")
             for i, (start, n) in enumerate(zip(starts, p.steps))
             for rows in [slice(start, start + n)]]
    return forms_agree(impl, out, p, dataclasses.replace(p, steps=None, cache_len=None),
                       parts, "decode steps vs the module's own prefill")


@case("agrees_with_prefill", judge=_judge_prefill)
def _agrees_with_prefill(seed):
    """A prefill of 5 tokens and 4 single steps, and the same 9 tokens in one call: a
    module's decode path computes what its prefill path does (#40 item 6)."""
    return generation_problem(seed, (5, 1, 1, 1, 1))


# --- score variants through a module's own cache (issue 50) -----------------------------------
@case("softcap_steps")
def _softcap_steps(seed):
    """Gemma 2 generating: cap 4 on logits up to ~10 (inputs x3), a prefill of 6 tokens and 4
    single steps through the module's cache."""
    p = generation_problem(seed, (6, 1, 1, 1, 1), input_scale=3.0)
    return dataclasses.replace(p, softcap=4.0)


@case("sinks_window_steps", judge=_window_judge)
def _sinks_window_steps(seed):
    """gpt-oss generating with its sliding-window layers: sinks beside a window of 4 tokens,
    a prefill of 6 and 5 steps, two key/value heads (the window as the model's config takes
    it, to a plugin that declares that form)."""
    p = generation_problem(seed, (6,) + (1,) * 5, K=2, window=WINDOW, input_scale=2.0)
    return dataclasses.replace(p, sinks=2.0 * np.random.default_rng(seed + 2).standard_normal(GH))


@case("softcap_agrees_with_prefill", judge=_judge_prefill)
def _softcap_agrees_with_prefill(seed):
    """``agrees_with_prefill`` with Gemma 2's cap (4, inputs x3): a module whose decode path
    drops the cap its prefill keeps disagrees with itself, whatever the oracle says."""
    p = generation_problem(seed, (5, 1, 1, 1, 1), input_scale=3.0)
    return dataclasses.replace(p, softcap=4.0)


@case("alibi_steps")
def _alibi_steps(seed):
    """ALiBi through a generating module's cache (-slope |i - j|, FlashAttention's
    ``alibi_slopes`` as MPT-style decoders generate with it): a prefill of 5 and 4 single
    steps, each step's row at its absolute position. A step whose ALiBi is measured from the
    chunk's own row 0 sees its keys at the wrong distances (not a row constant)."""
    p = generation_problem(seed, (5, 1, 1, 1, 1))
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(GH), "distance"))


@case("alibi_key_steps")
def _alibi_key_steps(seed):
    """BLOOM generating: its own ALiBi (slope * j, the paper's slopes for H = 4), a prefill
    of 4, then 3 single steps and a chunk of 2: the form BloomModel runs with its own cache
    (under a causal softmax every convention is the same up to a row constant, so this case
    checks that the bias is there at every step, not where a step places its rows)."""
    p = generation_problem(seed, (4, 1, 1, 1, 2))
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(GH), "key"))


@case("score_mod_steps")
def _score_mod_steps(seed):
    """A score modifier through a generating module's cache (FlexAttention's decoding loop
    with a score_mod): the suite's position_wave, which reads positions as they are, over a
    prefill of 4, two single steps, a chunk of 2 and a step (inputs x2): a step's i is its
    rows' position in the whole sequence, j the key's slot in the cache. A step that hands
    the modifier its rows' indices within the chunk (0 for a single step) moves it from
    step 2 on."""
    p = generation_problem(seed, (4, 1, 1, 2, 1), input_scale=2.0)
    return dataclasses.replace(p, score_mod=SCORE_MODS["position_wave"])


@case("score_mod_agrees_with_prefill", judge=_judge_prefill)
def _score_mod_agrees_with_prefill(seed):
    """``agrees_with_prefill`` with the position_wave modifier (inputs x2): a module whose
    decode steps hand the modifier other positions than its prefill does disagrees with
    itself, whatever the oracle says."""
    p = generation_problem(seed, (5, 1, 1, 1, 1), input_scale=2.0)
    return dataclasses.replace(p, score_mod=SCORE_MODS["position_wave"])
