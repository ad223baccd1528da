"""The main job's sample of the conformance cases: every family, a few cases of each.

``mha-suite run`` (the main job) checks every implementation on every case family, but
not every case: a first run must end in minutes on a laptop (the full float32 matrix of
the built-ins takes over half an hour on 2 cores, most of it torch.compile and
FlexAttention compiling each new shape). ``mha-suite check`` runs every case; the main
job's output and its report say how many cases of each family it left to it.

The cases below are ordered by what they reach that the others do not (where real bugs
were found). A plugin that compiles anew for each shape (``compiles_per_shape``, a few
seconds to tens of seconds each on a CPU) or a kernel run by its interpreter takes only
the first of each family, and fewer property-based examples.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Tuple

from suite.plugins.declarations import WINDOW_FORMS
from suite.plugins.interface import declared, interpreted, is_builtin

# family -> case names, first = the one a per-shape compiler runs.
SAMPLE: Dict[str, Tuple[str, ...]] = {
    # key padding + boolean mask + bias at once; padded keys holding NaN; bottom-right causal
    # with more queries than keys (rows with no key); a fully masked row
    "masking": ("combined", "nan_padding", "causal_bottom_right_long_query",
                "fully_masked_bool_row"),
    "shapes": ("gqa", "odd_lengths", "length_1", "cross_key_ne_value"),
    "numerics": ("large_logits", "negative_scale"),
    # whole 512-key blocks masked at the start, middle and end of rows; causal past a tile
    "tiles": ("masked_blocks_bool", "causal_bottom_right_1025x257"),
    "special_values": ("nan_key_causal", "inf_bias_entry", "nan_query"),
    # a NaN query row with every key in a vector loop's tail; rows with no key and NaN
    # padding across one vector
    "lanes": ("nan_query_S4", "fully_masked_S9", "nan_padding_S17"),
    # q/k/v out of a 1x1 convolution (the last axis strided) with a bias; heads split from
    # (B, L, H, D) without a copy; one kv head broadcast with stride 0
    "layouts": ("last_strided+bias", "transposed", "expanded+causal"),
    # a per-shape compiler runs one shape: two identical calls (batch_equals_items compiles
    # one shape per batch item: 90 s on torch.flex, cold)
    "properties": ("repeatable", "batch_equals_items", "weights_are_distributions"),
    "gradients": ("plain", "masked", "causality"),
    # every score variant at once (cap, ALiBi bottom-right, T5 table, sinks, value width,
    # GQA, a batch item with no key); an infinite score the cap must make finite; ALiBi's
    # distance measured bottom-right; rows with no key beside a sink
    "variants": ("combined", "softcap_inf_score", "alibi_distance_bottom_right",
                 "sinks_fully_masked"),
    # rows at their own offsets with only causality hiding the later slots (one row: a
    # decode kernel's first); several rows per step; a static cache's unfilled slots
    "decode": ("offsets_alone", "few_rows", "static_cache"),
    # a prefill then single steps; a static cache; a window whose boundary is in the cache;
    # the decode steps against the module's own prefill of the same tokens
    "generation": ("prefill_then_steps", "static_cache", "window_in_cache",
                   "agrees_with_prefill"),
    # a leak into the next sequence made loud; causality restarting at each boundary;
    # sequences of one token
    "packed": ("loud_neighbour", "causal_docs", "single_token_docs"),
    # blocks shared by sequences, one ending inside a shared block (one row each: what a
    # one-query paged kernel takes); a page size that divides no length; rows at offsets
    # inside the cache, the later blocks hidden by causality alone
    "paged": ("shared_prefix", "page_not_dividing", "rows_at_offsets"),
    # training mode with dropout 0 is eval mode; the draws' mean and spread, no mask
    "dropout": ("p_zero_is_eval", "mean_and_spread"),
    "hypothesis": ("random_shapes", "random_inference"),
    # a wrapper's own translation read back (no library call, milliseconds): the weights, and
    # the two mask parts most often turned over or dropped; non-wrappers are unsupported at once
    "wrapper": ("weights", "mask_key_padding", "mask_bool"),
}
# mask_forms: this many of a plugin's declared forms, spread evenly over them in MASK_FORMS
# order (from the 4-D broadcasts through 2-D and 3-D masks to padding masks and flags).
MASK_FORMS_SAMPLED = 3
# Property-based examples in the main job, when ``--hypothesis-examples`` is not given (the
# draws are derandomised, the smallest shapes first): 10; 3 on a plugin whose kernels a code
# generator compiles for each new shape (a built-in ``compile_path``: XLA, an exporter or a
# converter, about a second a shape cold: jax.jit's 10 took 13 s in CI's selection); 1 on a
# per-shape compiler or an interpreted kernel (5-30 s a shape cold: torch.flex's 3 took 33 s).
SAMPLE_EXAMPLES = 10
SAMPLE_EXAMPLES_COMPILE_PATH = 3
SAMPLE_EXAMPLES_COMPILED = 1


def compiles_per_shape(impl: object, device: str) -> bool:
    """True for a plugin that compiles anew for every shape (its cases cost seconds each)
    or a kernel run by its interpreter on ``device``."""
    return bool(declared(impl, "compiles_per_shape")) or interpreted(device)


def sampled(impl: object, device: str, family: str, name: str,
            form_order: Optional[Iterable[str]] = None) -> bool:
    """Whether the main job runs case ``family/name`` on ``impl`` (on ``device``).
    ``form_order``: every mask form's name, in MASK_FORMS order (for the mask_forms family)."""
    small = compiles_per_shape(impl, device)
    if family == "mask_forms":
        forms = declared(impl, "mask_forms")
        # Window forms (long cases, a compile each) are left to mha-suite check.
        chosen = [f for f in (form_order or ()) if f in forms and f not in WINDOW_FORMS]
        k = 1 if small else MASK_FORMS_SAMPLED
        if not chosen:  # its library takes none natively: one case says so (unsupported)
            return name == next(iter(form_order or ()), None)
        return name in {chosen[len(chosen) * (i + 1) // (k + 1)] for i in range(k)}
    names = SAMPLE.get(family)
    if names is None:  # a family this sample does not know yet: all of it (never silently none)
        return True
    return name in names[:1 if small else len(names)]


def counted(impl: object, family: str, name: str) -> bool:
    """Whether a case the sample leaves out is counted as left to ``mha-suite check``: not a
    mask form the plugin does not declare (that case is unsupported without running)."""
    return family != "mask_forms" or name in declared(impl, "mask_forms")


def sweep_left_out(impl: object, device: str, point: Any, spec: Dict[str, Any]
                   ) -> Optional[str]:
    """Why the main job's sweep leaves ``point`` of ``impl`` untimed, or None to time it.

    A per-shape compiler (torch.compile, FlexAttention: each point compiles anew, 2-7 s
    cold on a CPU, the default sweep's largest cost) times every other length of the grid
    (the longest always) at the grid's most common head count, both masks: four lengths
    of the default's seven, enough for the fitted exponent. A preset whose
    ``sample_compiled`` is ``longest`` (ci: a smoke test) times only the longest length."""
    if not declared(impl, "compiles_per_shape"):
        return None
    points = spec.get("points") or []
    lengths = sorted({p["L"] for p in points})
    heads = [p["H"] for p in points]
    usual = max(sorted(set(heads)), key=heads.count) if heads else point.H
    kept = set(lengths[-1:]) if spec.get("sample_compiled") == "longest" \
        else set(lengths[::2]) | set(lengths[-1:])
    if point.L in kept and point.H == usual:
        return None
    return (f"main job's sample: a per-shape compiler times L in "
            f"{', '.join(map(str, sorted(kept)))} at H={usual} (mha-suite sweep times all)")


def examples(impl: object, device: str, full: int) -> int:
    """Property-based examples for ``impl`` in the main job and CI's selection (at most
    ``full``)."""
    if compiles_per_shape(impl, device):
        return min(full, SAMPLE_EXAMPLES_COMPILED)
    if declared(impl, "compile_path") and is_builtin(type(impl)):
        return min(full, SAMPLE_EXAMPLES_COMPILE_PATH)
    return min(full, SAMPLE_EXAMPLES)


def left_line(left: Dict[str, Dict[str, int]], by: str = "the main job's sample"
              ) -> Optional[str]:
    """One line saying what ``by`` (a selection) left to ``mha-suite check``: impl -> family
    -> count."""
    per_family: Dict[str, int] = {}
    for fams in left.values():
        for fam, n in fams.items():
            per_family[fam] = per_family.get(fam, 0) + n
    total = sum(per_family.values())
    if not total:
        return None
    return (f"{by} left {total} cases to `mha-suite check` ("
            + ", ".join(f"{fam} {n}" for fam, n in sorted(per_family.items())) + ")")
