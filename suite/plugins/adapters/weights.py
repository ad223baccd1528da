"""Weight layouts: converters from the canonical right-multiply layout to each library's
(``to_linear``, ``to_packed``, ``to_einsum``, ...) and the gradients' way back."""

from __future__ import annotations

import re
from typing import Dict, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from suite.plugins.adapters.masks import ROLES
from suite.plugins.interface import Unsupported
from suite.spec.problem import Weights

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
