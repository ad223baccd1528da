"""The canonical mask in each library's parts and conventions (``split_mask``,
``MaskParts``), a wrapper's own translation checked against it, and the ``AttendMask``
the adapter cores hand their kernels."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from suite.plugins.interface import Unsupported
from suite.spec.problem import Mask, Problem, Weights

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
# case family, ``suite.conformance.families.wrapper``).

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
