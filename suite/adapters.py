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
  (``suite.problem.Weights``) to ``nn.Linear`` (out, in) per projection, the packed
  ``in_proj_weight`` (3E, E) of ``nn.MultiheadAttention``, the Keras/Flax
  ``EinsumDense``/``DenseGeneral`` kernels (E, H, D) and (H, D, E), and Hugging Face's
  ``Conv1D`` (in, out), GPT-2's packed ``c_attn`` (E, 3E) included;
- the gradients: each layout's ``grads_from_*`` maps gradients in that layout back to
  the canonical names of ``suite.problem.GRAD_NAMES`` (a layout is a rearrangement, so a
  gradient maps back exactly as its weight does).

Letters: B batch, L query length, S key length, E model width, H query heads, K kv heads
(GQA/MQA when K < H), D head width = E // H. Query head h reads kv head h // (H // K).

Example, a module with ``q_proj``/``k_proj``/``v_proj``/``out_proj`` (``nn.Linear``) and
Keras-style masks (head-free, True = attend, no native causal flag)::

    from suite import adapters

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

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from suite.plugin import Unsupported
from suite.problem import VARIANT_FIELDS, Mask, Problem, Weights
from suite.variants import Alibi, RelBias, ScoreMod

CONVENTIONS = ("attend", "masked")
CAUSAL_ALIGNS = ("top_left", "bottom_right")
ROLES = ("q", "k", "v", "o")


# ----------------------------------------------------------------------------- masks

@dataclasses.dataclass(frozen=True)
class MaskParts:
    """The canonical mask split into a library's parts; ``None`` parts are absent.

    key_padding: bool (B, S), per-batch key padding from ``valid_lens`` of shape (B,), in
        the convention ``true_means`` (True = attend: key j < valid_lens[b]).
    causal: None, "top_left" or "bottom_right": a native causal flag to pass to the
        library (only alignments the caller listed in ``native_causal``); any other
        causal mask is folded into ``mask``.
    mask: bool (B, H|1, L, S) (``per_head``; 1 when no part varies over heads) or
        head-free (B, L, S), everything boolean not split out, in ``true_means``.
    bias: float64, the canonical additive bias broadcast to the shape of ``mask``
        (without any -inf: the boolean parts stay boolean).
    true_means: "attend" (Keras, Flax, JAX) or "masked" (``nn.MultiheadAttention``).
    shape: (B, H, L, S) of the problem.
    """

    key_padding: Optional[np.ndarray]
    causal: Optional[str]
    mask: Optional[np.ndarray]
    bias: Optional[np.ndarray]
    true_means: str
    per_head: bool
    shape: Tuple[int, int, int, int]
    heads: int  # the head axis of mask/bias: H, or 1 when the mask is the same for every head

    @property
    def only_causal(self) -> bool:
        """True when the whole mask is the native causal flag (e.g. ``is_causal=True``)."""
        return self.causal is not None and self.key_padding is None and self.mask is None \
            and self.bias is None

    @property
    def is_empty(self) -> bool:
        return self.causal is None and self.key_padding is None and self.mask is None \
            and self.bias is None

    def _attend(self, a: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """A boolean part turned to True = attend."""
        return None if a is None else (a if self.true_means == "attend" else ~a)

    def _convention(self, allowed: np.ndarray) -> np.ndarray:
        return allowed if self.true_means == "attend" else ~allowed

    def allowed(self) -> np.ndarray:
        """Every boolean part recombined: bool (B, heads, L, S), True = may attend."""
        B, _, L, S = self.shape
        out = np.ones((B, self.heads, L, S), dtype=bool)
        kp = self._attend(self.key_padding)
        if kp is not None:
            out &= kp[:, None, None, :]  # (B, 1, 1, S)
        if self.causal is not None:
            out &= causal_allowed(L, S, self.causal)  # (L, S)
        m = self._attend(self.mask)
        if m is not None:
            out &= m if self.per_head else m[:, None]  # (B, H|1, L, S)
        return out

    def additive(self, fill: float = -np.inf, dtype=np.float64) -> Optional[np.ndarray]:
        """``mask`` and ``bias`` folded into one float mask: the bias where attended, ``fill``
        elsewhere (-inf, or a large negative such as ``np.finfo(dtype).min``), in ``dtype``.

        Parts split out (``key_padding``, the native ``causal`` flag) stay out; split with
        ``key_padding=False, native_causal=()`` to fold everything. Shape (B, heads, L, S),
        or (B, L, S) for a head-free split; None when there is nothing to fold.
        """
        if self.mask is None and self.bias is None:
            return None
        m = self._attend(self.mask)
        bias = np.zeros(()) if self.bias is None else self.bias
        allowed = np.ones((), dtype=bool) if m is None else m
        out = np.where(allowed, bias, fill)
        B, _, L, S = self.shape
        shape = (B, self.heads, L, S) if self.per_head else (B, L, S)
        return np.broadcast_to(out, shape).astype(dtype)

    def dead_keys(self) -> Optional[np.ndarray]:
        """bool (B, heads, S, 1): keys no query row may attend, or None when there are none."""
        dead = ~self.allowed().any(axis=2)[..., None]  # (B, heads, S, 1)
        return dead if dead.any() else None

    def fully_masked_rows(self) -> Optional[np.ndarray]:
        """bool (B, heads, L): query rows with no key to attend, or None when there are none."""
        rows = ~self.allowed().any(axis=-1)  # (B, heads, L)
        return rows if rows.any() else None


def causal_allowed(L: int, S: int, align: str = "top_left") -> np.ndarray:
    """bool (L, S), True = may attend: key j <= i (top left) or j <= i + S - L (bottom right)."""
    if align not in CAUSAL_ALIGNS:
        raise ValueError(f"align: expected one of {CAUSAL_ALIGNS}, got {align!r}")
    offset = 0 if align == "top_left" else S - L
    return np.arange(S)[None, :] <= np.arange(L)[:, None] + offset  # (L, S)


def mask_heads(mask: Mask, H: int) -> int:
    """H when a part of the mask varies over heads, else 1 (a head-free mask suffices)."""
    head_free = all(a is None or np.ndim(a) < 3 or np.shape(a)[-3] == 1
                    for a in (mask.allowed, mask.bias))
    return 1 if head_free else H


def native_alignment(mask: Mask, L: int, S: int, native_causal: Sequence[str]
                     ) -> Optional[str]:
    """The library's causal flag (one of ``native_causal``) that expresses ``mask``'s causal
    part for L queries and S keys, else None: its own alignment, or, when L == S (top left
    and bottom right then mask the same keys), the first flag the library has."""
    if not mask.causal or mask.query_offset is not None:  # per-batch offsets: no flag has them
        return None
    if mask.causal_align in native_causal:
        return mask.causal_align
    return native_causal[0] if L == S and native_causal else None


def split_mask(problem: Problem, *, true_means: str = "attend", key_padding: bool = True,
               native_causal: Sequence[str] = ("top_left",), per_head: bool = True
               ) -> MaskParts:
    """Split the canonical mask of ``problem`` into the parts a library takes.

    true_means: the library's boolean convention, "attend" (Keras, Flax, JAX, SDPA) or
        "masked" (``nn.MultiheadAttention``, ``F.multi_head_attention_forward``).
    key_padding: put ``valid_lens`` of shape (B,) in ``key_padding`` (B, S); per-query
        lengths (B, L) are not key padding and always go into ``mask``.
    native_causal: the causal alignments the library has a flag for; causal masks of another
        alignment are folded into ``mask`` (when Lq == Lk the two alignments are one mask,
        so either flag serves).
    per_head: ``mask``/``bias`` as (B, H|1, L, S); False: head-free (B, L, S), and a mask
        that varies over heads raises ``Unsupported`` (the library cannot express it).
    """
    if true_means not in CONVENTIONS:
        raise ValueError(f"true_means: expected one of {CONVENTIONS}, got {true_means!r}")
    unknown = set(native_causal) - set(CAUSAL_ALIGNS)
    if unknown or isinstance(native_causal, str):
        raise ValueError(f"native_causal: expected a tuple of {CAUSAL_ALIGNS}, "
                         f"got {native_causal!r}")
    m, B, H, L, S = problem.mask, problem.B, problem.H, problem.L, problem.S
    heads = mask_heads(m, H)
    if not per_head and heads != 1:
        raise Unsupported("the mask varies over heads and this library takes a head-free "
                          "(B, L, S) mask")
    parts: Dict[str, Optional[np.ndarray]] = {"key_padding": None, "mask": None, "bias": None}
    rest = m
    if key_padding and m.valid_lens is not None and np.ndim(m.valid_lens) == 1:
        keep = np.arange(S)[None, :] < np.asarray(m.valid_lens)[:, None]  # (B, S)
        parts["key_padding"] = keep if true_means == "attend" else ~keep
        rest = dataclasses.replace(rest, valid_lens=None)
    causal = native_alignment(m, L, S, native_causal)
    if causal is not None:
        rest = dataclasses.replace(rest, causal=False)
    if (rest.valid_lens is not None or rest.causal or rest.allowed is not None
            or rest.segments is not None):
        allowed = rest.dense_allowed(B, heads, L, S)  # (B, H|1, L, S), True = attend
        allowed = allowed if per_head else allowed[:, 0]  # (B, L, S)
        parts["mask"] = allowed if true_means == "attend" else ~allowed
    if m.bias is not None:
        bias = np.broadcast_to(np.asarray(m.bias, dtype=np.float64), (B, heads, L, S))
        parts["bias"] = np.array(bias if per_head else bias[:, 0])
    return MaskParts(parts["key_padding"], causal, parts["mask"], parts["bias"], true_means,
                     per_head, (B, H, L, S), heads)


def additive_mask(problem: Problem, *, fill: float = -np.inf, dtype=np.float64,
                  per_head: bool = True) -> Optional[np.ndarray]:
    """The whole mask as one additive float mask (B, H|1, L, S) (head-free: (B, L, S)):
    the bias where attended, ``fill`` elsewhere; None for an unmasked problem."""
    return split_mask(problem, key_padding=False, native_causal=(),
                      per_head=per_head).additive(fill, dtype)


# ----------------------------------------------------------- the wrapper's own translation
# A module wrapper translates the canonical problem into its library's terms; these read a
# translation back and say where it differs from the canonical problem, so a plugin author
# sees the wrapper's own mistake as such, before any verdict on the library (the ``wrapper``
# case family, ``suite.wrapper_cases``).

def mask_differences(problem: Problem, parts: MaskParts) -> List[str]:
    """What the ``MaskParts`` a wrapper hands its library (NumPy arrays) mean, against the
    canonical mask of ``problem``: each boolean part turned back to True = attend by its
    ``true_means`` and joined with AND (key padding, the native causal flag, ``mask``), -inf
    bias entries masked too, as a (B, H, L, S) allowed matrix, and the bias where both allow.
    Returns what differs, with the likely cause where one part explains it (empty: the
    translation holds)."""
    B, H, L, S = problem.B, problem.H, problem.L, problem.S
    full = (B, H, L, S)
    if parts.true_means not in CONVENTIONS:
        return [f"true_means: expected one of {CONVENTIONS}, got {parts.true_means!r}"]
    out: List[str] = []
    lift_mask = (lambda a: a) if parts.per_head else (lambda a: a[:, None])
    shapes = {"key_padding": "(B, S)",
              "mask": "(B, H|1, L, S)" if parts.per_head else "(B, L, S) (per_head=False)"}
    bools: Dict[str, np.ndarray] = {}  # part -> (B, H, L, S), True = attend
    for name, lift in (("key_padding", lambda a: a[:, None, None, :]), ("mask", lift_mask)):
        a = getattr(parts, name)
        if a is None:
            continue
        a = np.asarray(a)
        if a.dtype != bool:
            out.append(f"{name}: dtype {a.dtype}, expected bool (True = {parts.true_means})")
            continue
        try:
            bools[name] = np.broadcast_to(lift(a if parts.true_means == "attend" else ~a), full)
        except (ValueError, IndexError):
            out.append(f"{name}: shape {a.shape} is not {shapes[name]} of {full}")
    if parts.causal is not None:
        if parts.causal not in CAUSAL_ALIGNS:
            out.append(f"causal: expected None or one of {CAUSAL_ALIGNS}, got {parts.causal!r}")
        else:
            bools["causal"] = np.broadcast_to(causal_allowed(L, S, parts.causal), full)
    bias = None
    if parts.bias is not None:
        try:
            bias = np.broadcast_to(lift_mask(np.asarray(parts.bias, dtype=np.float64)), full)
        except (ValueError, IndexError):
            out.append(f"bias: shape {np.shape(parts.bias)} is not {shapes['mask']} of {full}")
    if out:
        return out

    def allowed(parts_bools: Dict[str, np.ndarray]) -> np.ndarray:
        a = np.ones(full, dtype=bool)
        for b in parts_bools.values():
            a = a & b
        return a if bias is None else a & (bias > -np.inf)

    m = problem.mask
    want = m.dense_allowed(B, H, L, S)
    want_bias = None if m.bias is None else np.broadcast_to(np.asarray(m.bias, np.float64), full)
    if want_bias is not None:
        want = want & (want_bias > -np.inf)
    got = allowed(bools)
    if not np.array_equal(got, want):
        extra, lost = got & ~want, want & ~got
        where = np.argwhere(extra if extra.any() else lost)[0]
        line = (f"the mask allows {int(extra.sum())} entries the canonical mask masks and masks "
                f"{int(lost.sum())} it allows of {got.size} (first at b={where[0]}, h={where[1]}, "
                f"i={where[2]}, j={where[3]})")
        flipped = [n for n in ("key_padding", "mask") if n in bools and np.array_equal(
            allowed({**bools, n: ~bools[n]}), want)]
        if flipped:
            line += (f"; {flipped[0]} turned over matches: its True/False convention is "
                     f"inverted (the parts say true_means={parts.true_means!r})")
        else:
            dropped = [k for k in sorted(m.kinds) if k != "bias" and np.array_equal(
                got, _without(m, k).dense_allowed(B, H, L, S)
                & (True if want_bias is None else want_bias > -np.inf))]
            if dropped:
                line += f"; it is the canonical mask without its {dropped[0]} part"
        out.append(line)
    both = got & want
    g = np.zeros(full) if bias is None else bias
    w = np.zeros(full) if want_bias is None else want_bias
    if not np.allclose(np.where(both, g, 0.0), np.where(both, w, 0.0), rtol=1e-9, atol=1e-12):
        diff = np.abs(np.where(both, g - w, 0.0))
        what = "missing" if bias is None else "not the canonical one" if want_bias is not None \
            else "present, the problem has none"
        out.append(f"the bias is {what}: max abs difference {float(diff.max()):.3g} where "
                   f"both allow")
    return out


def _without(mask: Mask, kind: str) -> Mask:
    """``mask`` without its part of kind ``kind`` (a ``Mask.kinds`` name)."""
    field = {"valid_lens": ("valid_lens", None), "causal": ("causal", False),
             "causal_bottom_right": ("causal", False), "bool_mask": ("allowed", None),
             "bias": ("bias", None)}[kind]
    return dataclasses.replace(mask, **{field[0]: field[1]})


def weight_differences(weights: Weights, back: Mapping[str, Any], *, rtol: float = 1e-12,
                       atol: float = 0.0) -> List[str]:
    """The weights a wrapper's module holds, read back under the canonical names (``back``:
    name -> array), against the problem's ``weights``: a weight missing or shaped otherwise,
    a value that differs (named when it is the weight transposed or another role's), and a
    nonzero bias the problem does not have (a layer's initial bias left in). ``atol`` is
    relative to the largest weight. Empty: the round trip holds."""
    out: List[str] = []
    want = {n: np.asarray(a, np.float64) for n, a in weights.as_dict().items() if a is not None}
    for n, w in want.items():
        b = back.get(n)
        if b is None:
            out.append(f"{n}: not read back; the problem's is {w.shape}")
            continue
        b = np.asarray(b, np.float64)
        tol = atol * float(np.abs(w).max(initial=0.0))
        if b.shape == w.shape and np.allclose(b, w, rtol=rtol, atol=tol):
            continue
        line = f"{n}: read back {b.shape} differs from the problem's {w.shape}"
        if b.shape == w.shape:
            line += f" (max abs difference {float(np.abs(b - w).max()):.3g})"
        if b.shape == w.T.shape and np.allclose(b, w.T, rtol=rtol, atol=tol):
            line += ": it is the problem's transposed"
        else:
            same = [m for m, x in want.items() if m != n and x.shape == b.shape
                    and np.allclose(b, x, rtol=rtol, atol=tol)]
            if same:
                line += f": it holds the problem's {same[0]}"
        out.append(line)
    for n, b in back.items():
        if n not in want and n.startswith("b_") and b is not None and np.any(np.asarray(b) != 0):
            out.append(f"{n}: the module holds a nonzero bias, the problem has none (a layer's "
                       f"initial bias left in)")
    return out


@dataclasses.dataclass
class AttendMask:
    """The mask as an attention kernel's ``attend(q, k, v, mask, scale, need_weights)``
    receives it from the adapter cores (``implementations.numpy_mha.NumpyCore``,
    ``torch_common.TorchCore``, ``jax_common.JaxCore``), in the core's array type; every
    array part is None for an unmasked problem.

    bias: float (B, H|1, L, S): the additive bias with -inf where not allowed;
    allowed: bool (B, H|1, L, S), True = may attend;
    dead_keys: bool (B, H|1, S, 1): keys no query may attend (padding may hold NaN there),
        or None when every key is read by some query;
    causal_only: the whole mask is top-left causal (a native ``is_causal`` flag suffices);
    kinds: the canonical mask's kinds (``Mask.kinds``); causal_align its alignment;
    variants: the problem's score variants (``ScoreVariants``), or None without any.
    """

    bias: Any = None
    allowed: Any = None
    dead_keys: Any = None
    causal_only: bool = False
    kinds: frozenset = frozenset()
    causal_align: str = "top_left"
    # The mask form asked for (``requested_form``) and its arrays (``form_mask``, True =
    # attend, -inf fill, in the kernel's array type), or "" and None.
    form_name: str = ""
    form: Optional[FormMask] = None
    variants: Optional[ScoreVariants] = None
    # A packed batch's sequence ids, int (B, L) NumPy (``Mask.segments``; already in
    # ``bias``/``allowed``): for a kernel that packs natively (document masks, jagged
    # tensors, cumulative lengths); None for an unpacked problem.
    segments: Optional[np.ndarray] = None
    # The decode form's per-batch positions, int (B,) NumPy (``Mask.query_offset``; already
    # in ``bias``/``allowed``), and key lengths, int (B,) or (B, L) NumPy (``Mask.valid_lens``):
    # for a kernel that takes a cache's offsets and lengths itself (a block mask reading
    # them); None where the problem has none.
    query_offset: Optional[np.ndarray] = None
    valid_lens: Optional[np.ndarray] = None
    # Training mode: the probability of dropping each attention weight (``Problem.dropout``,
    # feature ``dropout``); None in eval mode.
    dropout: Optional[float] = None

    def replace(self, **arrays: Any) -> AttendMask:
        return dataclasses.replace(self, **arrays)


@dataclasses.dataclass(frozen=True)
class ScoreVariants:
    """The problem's score variants as ``attend`` receives them (``AttendMask.variants``):
    ``suite.variants``' fields with their arrays in the kernel's array type, dtype and
    device; the kernel computes positions and buckets itself. A core gives None when the
    problem has none; the spec's order is cap, ALiBi and table added, score_mod, mask,
    softmax with the sinks in its denominator."""

    softcap: Optional[float] = None
    alibi: Optional[Alibi] = None  # slopes (H,)
    rel_bias: Optional[RelBias] = None  # table (H, n_buckets)
    score_mod: Optional[ScoreMod] = None
    sinks: Any = None  # (H,)


def score_variants(problem: Problem, put_float: Callable[[np.ndarray], Any] = lambda a: a
                   ) -> Optional[ScoreVariants]:
    """The ``ScoreVariants`` of ``problem`` (None without any); ``put_float`` moves the
    float64 arrays (slopes, table, sinks) into the kernel's array type, dtype and device."""
    p = problem
    if all(getattr(p, n) is None for n in VARIANT_FIELDS):
        return None
    alibi = None if p.alibi is None else dataclasses.replace(
        p.alibi, slopes=put_float(np.asarray(p.alibi.slopes, np.float64)))
    rel = None if p.rel_bias is None else dataclasses.replace(
        p.rel_bias, table=put_float(np.asarray(p.rel_bias.table, np.float64)))
    sinks = None if p.sinks is None else put_float(np.asarray(p.sinks, np.float64))
    return ScoreVariants(p.softcap, alibi, rel, p.score_mod, sinks)


def attend_mask(problem: Problem, put_float: Callable[[np.ndarray], Any] = lambda a: a,
                put_bool: Callable[[np.ndarray], Any] = lambda a: a) -> AttendMask:
    """The ``AttendMask`` of ``problem``; ``put_float``/``put_bool`` move the float64 and
    bool NumPy arrays into the kernel's array type, dtype and device."""
    m = problem.mask
    variants = score_variants(problem, put_float)
    if m.is_empty():
        return AttendMask(causal_align=m.causal_align, variants=variants,
                          dropout=problem.dropout)
    parts = split_mask(problem, key_padding=False, native_causal=())  # everything in "mask"
    dead = parts.dead_keys()
    form_name, form = requested_form(problem) or "", None
    if form_name:
        form = form_mask(problem).map(
            lambda a: put_bool(a) if a.dtype == bool else a if a.dtype.kind == "i"
            else put_float(a))
    return AttendMask(put_float(parts.additive()), put_bool(parts.allowed()),
                      None if dead is None else put_bool(dead), m.kinds == {"causal"},
                      m.kinds, m.causal_align, form_name, form, variants,
                      *(None if a is None else np.asarray(a, np.int64)
                        for a in (m.segments, m.query_offset, m.valid_lens)),
                      dropout=problem.dropout)


# ------------------------------------------------------------------------- mask forms

@dataclasses.dataclass(frozen=True)
class FormProblem(Problem):
    """A problem to be given to the library in the mask form ``mask_form`` (a name of
    ``suite.plugin.MASK_FORMS``); everything else, the oracle included, reads it as the
    canonical problem."""

    mask_form: str = ""


def cached_chunks(p: Problem, k: Any, v: Any, empty: Callable[[int], Tuple[Any, Any]],
                  append: Callable[..., Tuple[Any, Any]], write: Callable[..., Tuple[Any, Any]]
                  ) -> Iterator[Tuple[int, int, Any, Any]]:
    """Walk ``p.steps`` as a generating module does, in any array library: each chunk's
    keys and values (k, v (B, heads, L, D), sliced on axis 2) go into the cache first,
    ``append(kc, vc, k, v)`` to a growing one or ``write(kc, vc, k, v, start)`` into a
    static one of ``p.cache_len`` slots (``empty(slots)`` makes a cache); yields (start,
    end, the cache's keys, its values) per chunk, the chunk's rows being start..end-1."""
    static = p.cache_len is not None
    kc, vc = empty(p.cache_len if static else 0)
    start = 0
    for n in p.steps:
        end = start + n
        ks, vs = k[:, :, start:end], v[:, :, start:end]
        kc, vc = write(kc, vc, ks, vs, start) if static else append(kc, vc, ks, vs)
        yield start, end, kc, vc
        start = end


def with_form(problem: Problem, form: str) -> FormProblem:
    """``problem`` asking for mask form ``form`` (checked against ``MASK_FORMS``)."""
    from suite.plugin import MASK_FORMS

    if form not in MASK_FORMS:
        raise ValueError(f"form: expected one of {sorted(MASK_FORMS)}, got {form!r}")
    fields = {f.name: getattr(problem, f.name) for f in dataclasses.fields(Problem)}
    return FormProblem(**fields, mask_form=form)


def requested_form(problem: Problem) -> Optional[str]:
    """The mask form the ``mask_forms`` family asks for, or None (the plugin's usual
    translation)."""
    return getattr(problem, "mask_form", None) or None


def form_parts(form: str) -> Tuple[str, ...]:
    """The parts of a form name: "kpm_bool+bool_LS" -> ("kpm_bool", "bool_LS")."""
    return tuple(form.split("+"))


class FormMask(NamedTuple):
    """A mask form's arrays, shaped as the library takes them (None: not in the form).

    attn: the attention mask in the form's shape (bool in the library's polarity, or float
        additive with ``fill`` where masked); key_padding: (B, S) bool in the library's
        polarity or float 0/``fill``; query_mask: (B, L) bool, True = the row attends;
    kv_lengths, q_lengths: (B,) int32 lengths. The causal flag is in the form's name
    (``"causal_flag" in form_parts(form)``), not here: it is static where arrays are traced.
    window: (left, right) Python ints of ``local_window`` (query i attends keys
        i - left <= j <= i + right, top left); chunk: the int chunk size of
        ``chunked_causal``. Both are static (sizes a library takes as Python ints).
    """

    attn: Any = None
    key_padding: Any = None
    query_mask: Any = None
    kv_lengths: Any = None
    q_lengths: Any = None
    window: Optional[Tuple[int, int]] = None
    chunk: Optional[int] = None

    def map(self, fn: Callable[[np.ndarray], Any]) -> FormMask:
        """The same form with each present array passed through ``fn`` (to a device); the
        static sizes (``window``, ``chunk``) stay Python ints."""
        return self._replace(**{n: fn(a) for n, a in self.arrays().items() if a is not None})

    def arrays(self) -> Dict[str, Any]:
        """The array fields (None where absent), without the static sizes."""
        return {n: getattr(self, n) for n in self._fields if n not in _FORM_STATIC}

    def static(self) -> Tuple[Tuple[str, Any], ...]:
        """The static sizes as hashable (name, value) pairs (for a compile cache key)."""
        return tuple((n, getattr(self, n)) for n in _FORM_STATIC)


_FORM_STATIC = ("window", "chunk")  # FormMask fields that are sizes, not arrays


_SHAPES = {"BHLS": "BHLS", "B1LS": "B1LS", "11LS": "11LS", "B11S": "B11S", "BHL1": "BHL1",
           "LS": "11LS", "BLS": "B1LS", "BHxLS": "BHLS"}  # shape -> the 4-D pattern it holds


def _reduce(a: np.ndarray, pattern: str, form: str) -> np.ndarray:
    """(B, H, L, S) -> the pattern's 4-D shape: each "1" axis must be constant, then is
    kept with size 1 (the library broadcasts it); Unsupported when the mask varies there."""
    for axis, letter in enumerate(pattern):
        if letter == "1" and a.shape[axis] > 1:
            first = np.take(a, [0], axis=axis)
            if not np.array_equal(a, np.broadcast_to(first, a.shape), equal_nan=True):
                raise Unsupported(f"mask form {form}: the mask varies along axis "
                                  f"{'BHLS'[axis]}, which the form broadcasts")
            a = first
    return a


def form_mask(problem: Problem, form: Optional[str] = None, *, true_means: str = "attend",
              fill: float = -np.inf, dtype=np.float64) -> FormMask:
    """The canonical mask of ``problem`` in mask form ``form`` (default: the requested
    one), as the library takes it, without materialising what the library broadcasts.

    Native parts come from the canonical mask's own structure: ``causal_flag`` from its
    top-left causal part, ``kpm_*``/``kv_lengths`` from ``valid_lens`` of shape (B,),
    ``qpm_bool``/``q_lengths`` from query rows no key may be attended from; what remains
    (boolean parts and the bias) goes into the form's attention mask, reduced to its shape.
    A problem the form cannot express raises ``Unsupported`` naming what is left over.
    true_means: the library's boolean polarity ("attend" or "masked"); fill: the additive
    value where masked (-inf, or the library's own such as ``np.finfo(t).min``), in ``dtype``.
    """
    from suite.plugin import MASK_FORMS

    form = requested_form(problem) if form is None else form
    if form not in MASK_FORMS:
        raise ValueError(f"form: expected one of {sorted(MASK_FORMS)}, got {form!r}")
    if true_means not in CONVENTIONS:
        raise ValueError(f"true_means: expected one of {CONVENTIONS}, got {true_means!r}")
    parts = form_parts(form)
    m, B, H, L, S = problem.mask, problem.B, problem.H, problem.L, problem.S
    rest = m
    out: Dict[str, Any] = {}

    def polarity(a: np.ndarray) -> np.ndarray:
        return a if true_means == "attend" else ~a

    if "causal_flag" in parts:
        if not (m.causal and m.causal_align == "top_left") or m.query_offset is not None:
            raise Unsupported(f"mask form {form}: the problem has no top-left causal mask")
        rest = dataclasses.replace(rest, causal=False)
    if {"kpm_bool", "kpm_float", "kv_lengths"} & set(parts):
        if m.valid_lens is None or np.ndim(m.valid_lens) != 1:
            raise Unsupported(f"mask form {form}: the problem has no key lengths (B,)")
        lens = np.asarray(m.valid_lens)
        keep = np.arange(S)[None, :] < lens[:, None]  # (B, S), True = attend
        if "kv_lengths" in parts:
            out["kv_lengths"] = lens.astype(np.int32)
        elif "kpm_bool" in parts:
            out["key_padding"] = polarity(keep)
        else:
            out["key_padding"] = np.where(keep, 0.0, fill).astype(dtype)
        rest = dataclasses.replace(rest, valid_lens=None)
    allowed = rest.dense_allowed(B, H, L, S)  # (B, H, L, S), True = attend
    if {"qpm_bool", "q_lengths"} & set(parts):
        rows = allowed.any(axis=-1)  # (B, H, L): rows that attend some key
        if not (rows == rows[:, :1]).all():
            raise Unsupported(f"mask form {form}: the empty query rows differ between heads")
        rows = rows[:, 0]  # (B, L)
        if "q_lengths" in parts:
            lens = rows.sum(axis=-1)
            if not (rows == (np.arange(L)[None, :] < lens[:, None])).all():
                raise Unsupported(f"mask form {form}: the empty query rows are not a suffix")
            out["q_lengths"] = lens.astype(np.int32)
        else:
            out["query_mask"] = rows
        allowed = allowed | ~rows[:, None, :, None]  # those rows are masked by the query part
    attn = [p for p in parts if p.split("_", 1)[0] in ("bool", "float")]
    bias = None if m.bias is None else np.broadcast_to(np.asarray(m.bias, np.float64),
                                                       (B, H, L, S))
    if {"local_window", "chunked_causal"} & set(parts):
        if bias is not None:
            raise Unsupported(f"mask form {form}: a window or chunk cannot carry the bias")
        band = _reduce(allowed, "11LS", form)[0, 0]  # (L, S): the same for every item and head
        if "local_window" in parts:
            out["window"] = _fit_window(band, form)
        else:
            out["chunk"] = _fit_chunk(band, form)
        allowed = np.ones_like(allowed)  # the window or chunk is the whole rest of the mask
    if not attn:
        if not allowed.all() or bias is not None:
            raise Unsupported(f"mask form {form}: the problem's mask has parts the form has "
                              f"no place for")
        return FormMask(**out)
    kind, shape = attn[0].split("_", 1)
    if kind == "bool":
        if bias is not None:
            raise Unsupported(f"mask form {form}: a boolean mask cannot carry the bias")
        a = _reduce(allowed, _SHAPES[shape], form)
    else:
        a = _reduce(np.where(allowed, 0.0 if bias is None else bias, fill), _SHAPES[shape], form)
    if shape == "LS":
        a = a[0, 0]  # (L, S)
    elif shape == "BLS":
        a = a[:, 0]  # (B, L, S)
    elif shape == "BHxLS":
        a = a.reshape(B * H, L, S)  # (B*H, L, S), batch-major as torch.nn flattens
    out["attn"] = polarity(a) if kind == "bool" else a.astype(dtype)
    return FormMask(**out)


def window_allowed(L: int, S: int, left: int, right: int) -> np.ndarray:
    """(L, S) bool, True = attend: query i attends keys i - left <= j <= i + right (query i
    sits at key i, top left, whatever Lq and Lk: jax.nn's ``local_window_size`` and splash's
    ``LocalMask`` with offset 0)."""
    d = np.arange(S)[None, :] - np.arange(L)[:, None]  # (L, S): key j minus query i
    return (d >= -left) & (d <= right)


def chunked_causal_allowed(L: int, S: int, chunk: int) -> np.ndarray:
    """(L, S) bool, True = attend: query i attends keys j <= i with i // chunk == j // chunk
    (top left; splash's ``ChunkedCausalMask``)."""
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    return (j <= i) & (i // chunk == j // chunk)


def _fit_window(band: np.ndarray, form: str) -> Tuple[int, int]:
    """The smallest (left, right) whose window is exactly ``band`` (L, S), else Unsupported."""
    L, S = band.shape
    rows = np.flatnonzero(band.any(axis=-1))
    if rows.size == 0:
        raise Unsupported(f"mask form {form}: the mask allows no key at all")
    first = band[rows].argmax(axis=-1)  # first allowed key of each row
    last = S - 1 - band[rows, ::-1].argmax(axis=-1)  # last allowed key of each row
    left, right = int((rows - first).max()), int((last - rows).max())
    if not np.array_equal(band, window_allowed(L, S, left, right)):
        raise Unsupported(f"mask form {form}: the mask is not a sliding window (i - left <= "
                          f"j <= i + right)")
    return left, right


def _fit_chunk(band: np.ndarray, form: str) -> int:
    """The chunk size whose chunked causal mask is exactly ``band`` (L, S), else Unsupported
    (a plain causal mask is one chunk of L)."""
    L, S = band.shape
    starts = [i for i in range(1, min(L, S)) if band[i, i] and not band[i, i - 1]]  # restarts
    chunk = starts[0] if starts else L
    if not np.array_equal(band, chunked_causal_allowed(L, S, chunk)):
        raise Unsupported(f"mask form {form}: the mask is not causal within chunks of one size")
    return chunk


# --------------------------------------------------------------------------- weights

class Param(NamedTuple):
    """One layer's parameters in a library's layout (``bias`` None when absent)."""

    weight: np.ndarray
    bias: Optional[np.ndarray] = None


def _shapes(w: Weights) -> Tuple[int, int, int]:
    """(E, H*D, K*D) from the weights."""
    return w.w_q.shape[0], w.w_q.shape[1], w.w_k.shape[1]


def _canonical(w_q, w_k, w_v, w_o, b_q=None, b_k=None, b_v=None, b_o=None
               ) -> Dict[str, np.ndarray]:
    """Canonical name -> array, biases only when present (as ``GRAD_NAMES`` reads them)."""
    out = {"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o,
           "b_q": b_q, "b_k": b_k, "b_v": b_v, "b_o": b_o}
    return {n: np.asarray(a) for n, a in out.items() if a is not None}


def _np(a) -> Optional[np.ndarray]:
    """A NumPy view of an array-like (a torch tensor must be detached and on the CPU)."""
    return None if a is None else np.asarray(a)


def to_linear(w: Weights) -> Dict[str, Param]:
    """``nn.Linear`` layout per projection: role "q"|"k"|"v"|"o" -> Param(weight (out, in),
    bias (out,)); q (H*D, E), k/v (K*D, E), o (E, H*D)."""
    return {"q": Param(w.w_q.T, w.b_q), "k": Param(w.w_k.T, w.b_k),
            "v": Param(w.w_v.T, w.b_v), "o": Param(w.w_o.T, w.b_o)}


def grads_from_linear(grads: Mapping[str, Param]) -> Dict[str, np.ndarray]:
    """Gradients in the ``nn.Linear`` layout (as ``to_linear`` returns) -> canonical names."""
    g = {r: Param(_np(grads[r].weight), _np(grads[r].bias)) for r in ROLES}
    return _canonical(g["q"].weight.T, g["k"].weight.T, g["v"].weight.T, g["o"].weight.T,
                      g["q"].bias, g["k"].bias, g["v"].bias, g["o"].bias)


def to_packed(w: Weights) -> Dict[str, Optional[np.ndarray]]:
    """``nn.MultiheadAttention`` / ``F.multi_head_attention_forward`` layout, keyed by their
    argument names: in_proj_weight (3E, E), in_proj_bias (3E,), out_proj_weight (E, E),
    out_proj_bias (E,). Packing needs K == H (one head count for q, k and v)."""
    E, HD, KD = _shapes(w)
    if KD != HD:
        raise Unsupported(f"the packed in_proj layout has one head count: k/v width {KD} "
                          f"differs from q width {HD} (GQA)")
    bias = None if w.b_q is None else np.concatenate([w.b_q, w.b_k, w.b_v])  # (3E,)
    return {"in_proj_weight": np.concatenate([w.w_q.T, w.w_k.T, w.w_v.T]),  # (3E, E)
            "in_proj_bias": bias, "out_proj_weight": w.w_o.T, "out_proj_bias": w.b_o}


def grads_from_packed(grads: Mapping[str, Optional[np.ndarray]]) -> Dict[str, np.ndarray]:
    """Gradients keyed like ``to_packed`` -> canonical names."""
    g_in = _np(grads["in_proj_weight"])  # (3E, E)
    q, k, v = np.split(g_in, 3)  # each (E, E)
    b = _np(grads.get("in_proj_bias"))
    bq, bk, bv = (None, None, None) if b is None else np.split(b, 3)
    return _canonical(q.T, k.T, v.T, _np(grads["out_proj_weight"]).T, bq, bk, bv,
                      _np(grads.get("out_proj_bias")))


def to_einsum(w: Weights, num_heads: int, num_kv_heads: Optional[int] = None
              ) -> Dict[str, Param]:
    """Keras ``EinsumDense`` / Flax ``DenseGeneral`` layout: role -> Param(kernel, bias) with
    q kernel (E, H, D), k/v (E, K, D), biases (H, D)/(K, D); o kernel (H, D, E), bias (E,)."""
    E, HD, KD = _shapes(w)
    H = num_heads
    K = H if num_kv_heads is None else num_kv_heads
    if HD % H or KD % K or HD // H != KD // K:
        raise ValueError(f"num_heads/num_kv_heads: widths {HD}/{KD} do not split into "
                         f"H={H}/K={K} heads of one width")
    D = HD // H

    def heads(a: Optional[np.ndarray], n: int) -> Optional[np.ndarray]:
        return None if a is None else a.reshape(*a.shape[:-1], n, D)  # (..., n, D)

    return {"q": Param(heads(w.w_q, H), heads(w.b_q, H)),  # (E, H, D), (H, D)
            "k": Param(heads(w.w_k, K), heads(w.b_k, K)),  # (E, K, D), (K, D)
            "v": Param(heads(w.w_v, K), heads(w.b_v, K)),
            "o": Param(w.w_o.reshape(H, D, E), w.b_o)}  # (H, D, E), (E,)


def grads_from_einsum(grads: Mapping[str, Param]) -> Dict[str, np.ndarray]:
    """Gradients in the einsum layout (as ``to_einsum`` returns) -> canonical names."""
    g = {r: Param(_np(grads[r].weight), _np(grads[r].bias)) for r in ROLES}

    def flat(a: Optional[np.ndarray], lead: int) -> Optional[np.ndarray]:
        return None if a is None else a.reshape(*a.shape[:lead], -1)

    w_o = g["o"].weight  # (H, D, E)
    return _canonical(flat(g["q"].weight, 1), flat(g["k"].weight, 1), flat(g["v"].weight, 1),
                      w_o.reshape(-1, w_o.shape[-1]), flat(g["q"].bias, 0),
                      flat(g["k"].bias, 0), flat(g["v"].bias, 0), g["o"].bias)


def to_conv1d(w: Weights) -> Dict[str, Param]:
    """Hugging Face ``Conv1D`` layout (in, out), the canonical one: role -> Param."""
    return {"q": Param(w.w_q, w.b_q), "k": Param(w.w_k, w.b_k),
            "v": Param(w.w_v, w.b_v), "o": Param(w.w_o, w.b_o)}


def grads_from_conv1d(grads: Mapping[str, Param]) -> Dict[str, np.ndarray]:
    """Gradients in the ``Conv1D`` layout (as ``to_conv1d`` returns) -> canonical names."""
    g = {r: Param(_np(grads[r].weight), _np(grads[r].bias)) for r in ROLES}
    return _canonical(*(g[r].weight for r in ROLES), *(g[r].bias for r in ROLES))


def to_conv1d_packed(w: Weights) -> Dict[str, Param]:
    """GPT-2's packed layout: "c_attn" Param(weight (E, H*D+2*K*D), bias) whose output
    splits into q, k, v in that order, and "c_proj" Param(weight (H*D, E), bias (E,))."""
    bias = None if w.b_q is None else np.concatenate([w.b_q, w.b_k, w.b_v])
    return {"c_attn": Param(np.concatenate([w.w_q, w.w_k, w.w_v], axis=1), bias),
            "c_proj": Param(w.w_o, w.b_o)}


def grads_from_conv1d_packed(grads: Mapping[str, Param], num_heads: int,
                             num_kv_heads: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Gradients keyed like ``to_conv1d_packed`` -> canonical names."""
    g_attn, g_proj = grads["c_attn"], grads["c_proj"]
    wa, ba = _np(g_attn.weight), _np(g_attn.bias)  # (E, H*D + 2*K*D)
    HD = _np(g_proj.weight).shape[0]
    K = num_heads if num_kv_heads is None else num_kv_heads
    KD = HD // num_heads * K
    cuts = [HD, HD + KD]
    q, k, v = np.split(wa, cuts, axis=1)
    bq, bk, bv = (None, None, None) if ba is None else np.split(ba, cuts)
    return _canonical(q, k, v, _np(g_proj.weight), bq, bk, bv, _np(g_proj.bias))


def to_linear_fused(w: Weights) -> Param:
    """One ``nn.Linear`` computing q, k and v (timm's ``qkv``, a 1x1 convolution's
    ``qkv``): weight (H*D + 2*K*D, E), its rows q, then k, then v; bias likewise."""
    lin = to_linear(w)
    bias = None if w.b_q is None else np.concatenate([lin[r].bias for r in "qkv"])
    return Param(np.concatenate([lin[r].weight for r in "qkv"]), bias)


def split_linear_fused(grad: Param, q_rows: int) -> Dict[str, Param]:
    """A fused q/k/v gradient (``to_linear_fused``'s layout, ``q_rows`` = H*D) -> role ->
    Param in the ``nn.Linear`` layout (k and v share the remaining rows equally)."""
    w, b = _np(grad.weight), _np(grad.bias)
    cuts = [q_rows, q_rows + (w.shape[0] - q_rows) // 2]
    ws, bs = np.split(w, cuts), ([None] * 3 if b is None else np.split(b, cuts))
    return {r: Param(ws[i], bs[i]) for i, r in enumerate("qkv")}


def _groups(axes: str) -> Tuple[Tuple[str, ...], ...]:
    """"h (d e)" -> (("h",), ("d", "e")): an array's axes, parentheses joining atoms."""
    out, group = [], None
    for tok in re.findall(r"\(|\)|\w+", axes):
        if tok == "(":
            group = []
        elif tok == ")":
            out.append(tuple(group or ()))
            group = None
        elif group is not None:
            group.append(tok)
        else:
            out.append((tok,))
    return tuple(out)


def rearrange(a, src: str, dst: str, **sizes: int) -> np.ndarray:
    """``a`` with axes ``src`` rearranged to axes ``dst`` (einops notation: names, with
    parentheses for axes merged into one, row-major), e.g. ``rearrange(w_q, "e (h d)",
    "h d e", h=H)``. An atom on one side only must have size 1 (MQA's single kv head: "e (h
    d)" with h = 1 -> "e d"); ``sizes`` give what the shape cannot tell."""
    a = np.asarray(a)
    src_g, dst_g = _groups(src), _groups(dst)
    if len(src_g) != a.ndim:
        raise ValueError(f"rearrange: {src!r} names {len(src_g)} axes, the array has {a.ndim}")
    known = dict(sizes)
    for group, n in zip(src_g, a.shape):
        unknown = [x for x in group if x not in known]
        if len(unknown) > 1:
            raise ValueError(f"rearrange: give the sizes of {unknown[1:]} (axis {group})")
        if unknown:
            known[unknown[0]] = n // int(np.prod([known[x] for x in group if x in known]))
        if int(np.prod([known[x] for x in group])) != n:
            raise ValueError(f"rearrange: axis {group} of size {n} is not {known}")
    src_atoms = [x for g in src_g for x in g]
    dst_atoms = [x for g in dst_g for x in g]
    for x in set(src_atoms) ^ set(dst_atoms):
        if known.get(x, 1) != 1:
            raise ValueError(f"rearrange: {x!r} (size {known[x]}) is in one of {src!r} and "
                             f"{dst!r} only")
    common = [x for x in src_atoms if x in dst_atoms]
    a = a.reshape([known[x] for x in common])  # atoms of size 1 dropped
    a = a.transpose([common.index(x) for x in dst_atoms if x in common])
    return a.reshape([int(np.prod([known.get(x, 1) for x in g])) for g in dst_g])


# The canonical weights' axes in ``rearrange``'s letters: e model width, h heads (H for q
# and o, K for k and v), d head width.
CANONICAL_AXES = {"q": ("e (h d)", "(h d)"), "k": ("e (h d)", "(h d)"),
                  "v": ("e (h d)", "(h d)"), "o": ("(h d) e", "e")}


def to_layout(w: Weights, role: str, axes: str, num_heads: int,
              num_kv_heads: Optional[int] = None, bias_axes: Optional[str] = None) -> Param:
    """Projection ``role`` ("q"|"k"|"v"|"o") as an array with ``axes`` (letters e, h, d,
    as ``rearrange``; h is H for q and o, K for k and v), e.g. a multi-query module's
    ``query_proj`` (H, D, E) = ``to_layout(w, "q", "h d e", H)``; its bias with
    ``bias_axes`` (default: canonical, "(h d)" or "e")."""
    weight, bias = {"q": (w.w_q, w.b_q), "k": (w.w_k, w.b_k), "v": (w.w_v, w.b_v),
                    "o": (w.w_o, w.b_o)}[role]
    sizes = _head_sizes(w, role, num_heads, num_kv_heads)
    src, src_b = CANONICAL_AXES[role]
    return Param(rearrange(weight, src, axes, **sizes),
                 None if bias is None else rearrange(bias, src_b, bias_axes or src_b, **sizes))


def grad_from_layout(grad: Param, role: str, axes: str, E: int, num_heads: int,
                     num_kv_heads: Optional[int] = None, bias_axes: Optional[str] = None
                     ) -> Param:
    """A gradient in ``to_layout``'s layout -> Param in the canonical layout of ``role``."""
    h = num_heads if role in ("q", "o") or num_kv_heads is None else num_kv_heads
    sizes = {"e": E, "h": h, "d": None}
    src, src_b = CANONICAL_AXES[role]
    w = _np(grad.weight)
    sizes["d"] = w.size // (E * h)
    b = _np(grad.bias)
    return Param(rearrange(w, axes, src, **sizes),
                 None if b is None else rearrange(b, bias_axes or src_b, src_b, **sizes))


def _head_sizes(w: Weights, role: str, num_heads: int, num_kv_heads: Optional[int]
                ) -> Dict[str, int]:
    E, HD, _ = _shapes(w)
    K = num_heads if num_kv_heads is None else num_kv_heads
    return {"e": E, "h": num_heads if role in ("q", "o") else K, "d": HD // num_heads}


def image_size(L: int) -> Tuple[int, int]:
    """(H', W') with H' * W' == L, as square as L allows (H' <= W'; a prime L is (1, L)):
    the feature map a sequence of L positions is read as."""
    h = int(np.sqrt(L))
    while L % h:
        h -= 1
    return h, L // h


def to_image(a: np.ndarray) -> np.ndarray:
    """(B, L, E) -> (B, E, H', W') (NCHW, ``image_size(L)``), position l at row l // W',
    column l % W' (the order of ``x.flatten(2)``, as vision modules flatten a map)."""
    B, L, E = a.shape
    return np.ascontiguousarray(np.swapaxes(a, 1, 2).reshape(B, E, *image_size(L)))


def from_image(a) -> np.ndarray:
    """(B, E, H', W') -> (B, L, E), the inverse of ``to_image``."""
    a = np.asarray(a)
    return np.swapaxes(a.reshape(*a.shape[:2], -1), 1, 2)
