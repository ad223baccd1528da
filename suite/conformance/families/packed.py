"""The packed family: variable-length sequences packed back to back in one row of a batch
(``Mask.segments``, feature ``packed``), as servers and padding-free training run them.

Each row of the batch holds several sequences one after another (FlashAttention's
``cu_seqlens``, FlexAttention's document masks, SDPA's nested jagged tensors, Hugging Face's
padding-free ``position_ids``); ``segments[b, i]`` is the sequence of token i (0, 1, 2, ...
along the row). A token attends only within its own sequence, causally where the case is
causal. The oracle judges every row against that mask, so a token that sees another
sequence, or a sequence boundary off by one, fails. Cases: two or three sequences a row
with and without causality, sequences of one token, a loud neighbour (a sequence whose keys
and values are a thousand times larger: a leak into the next one is far off), one sequence
a row (the packed form of plain attention), GQA and MQA, and a sliding window inside each
sequence; with a score variant (issue 50): Gemma 2's cap (and the packed and padded paths
agreeing under it), gpt-oss's sinks, ALiBi and T5's encoder table at each pair's distance
within its sequence, and a score modifier reading each token's position in its sequence
(and the packed and padded paths agreeing under it).

``suite.conformance.cases`` registers ``BUILDERS`` into its ``CASES`` (this module does not import it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from suite.conformance.families.declare import family
from suite.spec.problem import Mask, Problem, make_problem, seq_lens
from suite.spec.variants import SCORE_MODS, Alibi, RelBias, alibi_slopes

FAMILY = "packed"
# E = 32 over H = 4 heads: D = 8, the smallest head width SDPA's fused CPU kernels take for
# jagged tensors (narrower heads fall back to the math path).
PE, PH = 32, 4
BUILDERS, case = family(FAMILY)  # (name, seed -> problem, Case keywords), in order
LOUD = 1e3  # the loud neighbour's scale: finite, so a leak is a large error, not NaN




def segments_of(rows: Sequence[Sequence[int]]) -> np.ndarray:
    """int64 (B, L) sequence ids from each row's sequence lengths (every row sums to L)."""
    return np.stack([np.repeat(np.arange(len(r)), r) for r in rows]).astype(np.int64)


def packed_problem(seed: int, rows: Sequence[Sequence[int]], causal: bool = False,
                   K: Optional[int] = None, window: Optional[int] = None,
                   self_attention: bool = True, input_scale: float = 1.0,
                   E: int = PE, H: int = PH, value_head_dim: Optional[int] = None) -> Problem:
    """Attention over rows packed with sequences of the given lengths (one input for query,
    key and value unless ``self_attention`` is False); ``window``: token i also sees only
    keys j > i - window (within its sequence); E, H and ``value_head_dim``:
    ``make_problem``'s."""
    seg = segments_of(rows)
    B, L = seg.shape
    allowed = None
    if window is not None:
        i = np.arange(L)
        allowed = (i[None, :] > i[:, None] - window)[None, None]  # (1, 1, L, L)
    return make_problem(seed, B, L, L, E, H, K, self_attention=self_attention,
                        mask=Mask(causal=causal, allowed=allowed, segments=seg),
                        input_scale=input_scale, value_head_dim=value_head_dim)


@case("loud_neighbour")
def _loud_neighbour(seed):
    """Rows of sequences 6+6 and 2+10, the values of each row's second sequence a thousand
    times louder (separate query, key and value inputs): a token of the first sequence that
    sees one of them is far off."""
    p = packed_problem(seed, [[6, 6], [2, 10]], self_attention=False)
    value = p.value.copy()
    value[p.mask.segments == 1] *= LOUD
    return dataclasses.replace(p, value=value)


@case("causal_docs")
def _causal_docs(seed):
    """Causal sequences 5+7 and 3+4+5: each token sees its sequence's earlier tokens only
    (the first token of each sequence sees itself alone)."""
    return packed_problem(seed, [[5, 7], [3, 4, 5]], causal=True)


@case("docs")
def _docs(seed):
    """Sequences 5+7 and 3+4+5 without causality: every token sees its whole sequence."""
    return packed_problem(seed, [[5, 7], [3, 4, 5]])


@case("single_token_docs")
def _single_token_docs(seed):
    """Sequences of one token among longer ones (1+1+3+3 and 4+1+1+1+1), causal: a
    one-token sequence attends to itself only."""
    return packed_problem(seed, [[1, 1, 3, 3], [4, 1, 1, 1, 1]], causal=True)


@case("one_sequence")
def _one_sequence(seed):
    """One sequence a row (12 and 12): the packed form of plain self-attention."""
    return packed_problem(seed, [[12], [12]])


@case("gqa")
def _gqa(seed):
    """Two key/value heads for four query heads, causal sequences 7+5 and 4+4+4."""
    return packed_problem(seed, [[7, 5], [4, 4, 4]], causal=True, K=2)


@case("mqa")
def _mqa(seed):
    """One key/value head for four query heads, sequences 9+3 and 2+10."""
    return packed_problem(seed, [[9, 3], [2, 10]], K=1)


@case("window_in_docs")
def _window_in_docs(seed):
    """A causal sliding window of 3 tokens inside sequences 8+4 and 3+9: the window and the
    sequence boundary both cut."""
    return packed_problem(seed, [[8, 4], [3, 9]], causal=True, window=3)


def padded_form(p: Problem) -> Tuple[Problem, List[Tuple[int, int, int]]]:
    """The same sequences as a padded batch: one row each, zeros after its length, key
    padding by ``valid_lens``, the packed problem's causality; and where each came from,
    (row b of the packed problem, start, length) per padded row."""
    where = [(b, start, n) for b, lens in enumerate(seq_lens(p.mask.segments))
             for start, n in zip(np.cumsum([0] + lens[:-1]).tolist(), lens)]
    width = max(n for _, _, n in where)

    def pad(x: np.ndarray) -> np.ndarray:
        out = np.zeros((len(where), width, x.shape[2]), x.dtype)
        for i, (b, start, n) in enumerate(where):
            out[i, :n] = x[b, start:start + n]
        return out

    q = pad(p.query)
    k = q if p.key is p.query else pad(p.key)
    v = k if p.value is p.key else pad(p.value)
    lens = np.array([n for _, _, n in where], dtype=np.int64)
    return dataclasses.replace(p, query=q, key=k, value=v,
                               mask=Mask(valid_lens=lens, causal=p.mask.causal)), where


def _judge_padded(impl: Any, out: Any, p: Problem) -> Any:
    """The packed row against the same sequences padded: each sequence's rows from both
    calls differ by no more than two results within the rule's bound can."""
    from suite.conformance.judge import forms_agree

    padded, where = padded_form(p)
    parts = [((b, slice(start, start + n)), (i, slice(0, n)),
              f"the sequence of {n} tokens at {start} of row {b}")
             for i, (b, start, n) in enumerate(where)]
    return forms_agree(impl, out, p, padded, parts, "packed vs padded")


@case("agrees_with_padded", judge=_judge_padded)
def _agrees_with_padded(seed):
    """The causal sequences 5+7 and 3+4+5 packed, and the same five sequences padded to 7
    tokens with key padding: one module's two paths (cumulative lengths or document ids vs
    an attention mask) give each sequence the same rows."""
    return packed_problem(seed, [[5, 7], [3, 4, 5]], causal=True)


# --- score variants in packed sequences (issue 50) --------------------------------------------
@case("softcap_causal_docs")
def _softcap_causal_docs(seed):
    """Gemma 2 trained padding-free: cap 4 on logits up to ~10 (inputs x3), causal sequences
    5+7 and 3+4+5."""
    p = packed_problem(seed, [[5, 7], [3, 4, 5]], causal=True, input_scale=3.0)
    return dataclasses.replace(p, softcap=4.0)


@case("sinks_causal_docs")
def _sinks_causal_docs(seed):
    """gpt-oss padding-free: sinks in every sequence's softmax, causal sequences 6+6 and
    2+10, GQA (two key/value heads)."""
    p = packed_problem(seed, [[6, 6], [2, 10]], causal=True, K=2, input_scale=2.0)
    return dataclasses.replace(p, sinks=2.0 * np.random.default_rng(seed + 2).standard_normal(PH))


@case("alibi_docs")
def _alibi_docs(seed):
    """ALiBi in packed sequences (-slope |i - j|, each sequence's positions from 0), not
    causal, sequences 5+7 and 3+4+5: keys on both sides of a row, inside its sequence."""
    p = packed_problem(seed, [[5, 7], [3, 4, 5]])
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(PH), "distance"))


@case("rel_t5_docs")
def _rel_t5_docs(seed):
    """T5's encoder packed: its bidirectional table (16 buckets, max_distance 8) at each
    pair's distance inside its sequence (8+4 and 3+9)."""
    p = packed_problem(seed, [[8, 4], [3, 9]])
    table = 1.5 * np.random.default_rng(seed + 2).standard_normal((PH, 16))
    return dataclasses.replace(p, rel_bias=RelBias(table, "t5", True, 8))


@case("score_mod_docs")
def _score_mod_docs(seed):
    """FlexAttention's document masking with a score_mod: the suite's distance_wave modifier
    (every index in play) in causal sequences 5+7 and 3+4+5, its i and j each token's
    position within its own sequence (``suite.spec.oracle.score_mod_at``); inputs x2."""
    p = packed_problem(seed, [[5, 7], [3, 4, 5]], causal=True, input_scale=2.0)
    return dataclasses.replace(p, score_mod=SCORE_MODS["distance_wave"])


@case("score_mod_positions_docs")
def _score_mod_positions_docs(seed):
    """A score_mod that reads positions as they are (the suite's position_wave), not their
    distance: in causal sequences 5+7 and 3+4+5 its i and j must be each token's position
    within its own sequence, so a path that hands it the packed row's indices moves every
    later sequence (distance_wave cannot tell: i - j is the same either way)."""
    p = packed_problem(seed, [[5, 7], [3, 4, 5]], causal=True, input_scale=2.0)
    return dataclasses.replace(p, score_mod=SCORE_MODS["position_wave"])


@case("softcap_agrees_with_padded", judge=_judge_padded)
def _softcap_agrees_with_padded(seed):
    """``agrees_with_padded`` with Gemma 2's cap (4, inputs x3): a module whose packed path
    drops the cap its padded path keeps disagrees with itself, whatever the oracle says."""
    p = packed_problem(seed, [[5, 7], [3, 4, 5]], causal=True, input_scale=3.0)
    return dataclasses.replace(p, softcap=4.0)


@case("score_mod_agrees_with_padded", judge=_judge_padded)
def _score_mod_agrees_with_padded(seed):
    """``agrees_with_padded`` with the position_wave modifier (inputs x2), which reads
    positions as they are: a padded sequence's rows start at 0, so a module whose packed path
    hands the modifier the packed row's indices (or drops it) disagrees with its own padded
    path, whatever the oracle says."""
    p = packed_problem(seed, [[5, 7], [3, 4, 5]], causal=True, input_scale=2.0)
    return dataclasses.replace(p, score_mod=SCORE_MODS["position_wave"])
