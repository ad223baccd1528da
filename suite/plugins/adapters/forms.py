"""Mask forms: the shapes and flags a library takes natively (``form_mask``), and the
chunks of a generation's cache (``cached_chunks``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Tuple

import numpy as np

from suite.plugins.adapters.masks import CONVENTIONS
from suite.plugins.interface import Unsupported
from suite.spec.problem import Problem

# ------------------------------------------------------------------------- mask forms

@dataclasses.dataclass(frozen=True)
class FormProblem(Problem):
    """A problem to be given to the library in the mask form ``mask_form`` (a name of
    ``suite.plugins.declarations.MASK_FORMS``); everything else, the oracle included, reads it as the
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
    from suite.plugins.declarations import MASK_FORMS

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
    from suite.plugins.declarations import MASK_FORMS

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


