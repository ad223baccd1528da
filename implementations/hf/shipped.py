"""Modules as shipped: a module run with its own weights, norms and rotary embeddings, judged
on the query, key and value it computes itself.

A module plugin (``TorchModuleCore``) loads the problem's weights into the module's four
projections, so whatever a module computes between them (multi-head latent attention's
``q_a_layernorm``/``kv_a_layernorm``, QK-norm, rotary embeddings) has to be an identity there.
``ShippedCore`` keeps the module whole instead. It builds the module with its own (seeded)
initial weights, loads nothing, runs it on the case's input and mask, and records what the
module hands its attention function: for a transformers layer, a function registered in
``transformers.AttentionInterface`` (``CAPTURE``) that every layer of the module is routed
to; it records query (B, H, L, d), key and value (B, K, S, d|V), the mask and the keyword
arguments (``scaling``, ``softcap``, ``s_aux``, ``dropout``, ...), calls the attention
function the layer was configured with (its modeling file's ``eager_attention_forward``, or
the registered ``sdpa``, ``flex_attention``, ...) and records its output (B, L, H, V).
A plain torch module (``capture = "sdpa"``) is read at its calls of
``torch.nn.functional.scaled_dot_product_attention`` instead.

``ShippedCore.fetch`` then poses the suite's problem on those tensors (``pose``): the
captured heads as the inputs, identity projections (exact in every dtype), the case's mask,
scale and score variants (a cap, sinks, ALiBi, a table), and returns the attention
function's output with that problem as ``Result.posed`` (``suite.plugins.interface.Posed``).
The usual harness (``mha-suite check --plugin FILE``, the conformance tests, ``run_problem``)
judges it on that problem: the agreement rule with its same-dtype baselines, the plugin's
declared deviations, the known behaviours and known-failure records, the results files and
the summary, as for any name. The scale is the problem's when it sets one, else 1/sqrt(d) of
the captured query heads. What is judged is the module's attention on its own q, k and v: the
projections, norms, rotary and output projection run as shipped and are not judged (the judge
does fail a module whose own q, k or v hold NaN or inf where the case's input has none;
``fetch`` raises, an error, for a module that calls its attention function other than once).
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import sys
import weakref
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from implementations.torch.common import TorchModuleCore
from suite.plugins.interface import Posed, Result, Unsupported
from suite.spec.problem import Problem, Weights
from suite.spec.variants import segment_positions

# The name the capturing function is registered under in transformers' AttentionInterface.
CAPTURE = "mha_suite_shipped"

# Why a ``rotary = True`` plugin does not run a case whose head width is odd.
ODD_ROTARY = "rotary embeddings rotate pairs: an odd head width"

# Problem fields that are about the projections, not the attention on q, k and v: a module
# as shipped has its own (``unposable``).
_PROJECTION_FEATURES = {
    "value_width": "the value heads' width is the module's own as shipped (the problem's "
                   "value_head_dim shapes W_v and W_o, which the module does not take)",
    "grad": "gradients of the problem's weights: the module keeps its own weights",
    "steps": "a generation problem calls the attention function once per chunk: not posed "
             "yet",
    "static_cache": "a static cache: not posed yet",
    "paged": "a paged cache: not posed yet",
    "dropout": "training mode draws: the dropout family judges repeated draws, not one call",
}


@dataclasses.dataclass
class Captured:
    """One call of a module's attention function, as float64 NumPy arrays."""

    query: np.ndarray  # (B, H, L, d)
    key: np.ndarray  # (B, K, S, d)
    value: np.ndarray  # (B, K, S, V)
    output: np.ndarray  # (B, L, H, V), as transformers' attention functions return it
    mask: Optional[np.ndarray]  # the attention_mask the module passed, as it passed it
    kwargs: Dict[str, Any]  # scaling, softcap, dropout, sliding_window, s_aux, is_causal, ...
    via: str  # the attention function that computed ``output``
    weights: Optional[np.ndarray] = None  # (B, H, L, S), where the function returns them

    def handed(self) -> str:
        """The keyword arguments the module passed, in one line."""
        def show(v: Any) -> str:
            if isinstance(v, np.ndarray):
                return f"array{v.shape}"
            return f"{v:.6g}" if isinstance(v, float) else repr(v)
        said = ", ".join(f"{k}={show(v)}" for k, v in sorted(self.kwargs.items()))
        return f"{self.via}({said})"


_RECORDS: contextvars.ContextVar[Optional[List[Captured]]] = contextvars.ContextVar(
    "mha_suite_shipped_records", default=None)
# The attention implementation each routed layer was configured with, by layer.
_REAL: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def _np(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy().copy()
    return t


def _real_function(module: torch.nn.Module):
    """The attention function ``module`` was configured with: its modeling file's
    ``eager_attention_forward`` for "eager", else the one registered under its name."""
    from transformers import AttentionInterface

    name = _REAL.get(module)
    if name is None:
        raise RuntimeError(f"{type(module).__name__} called {CAPTURE!r} but was not routed "
                           f"by implementations.hf.shipped.route_attention")
    if name != "eager":
        return name, AttentionInterface()[name]
    for cls in type(module).__mro__:  # a subclass defined elsewhere: its base's modeling file
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if fn is not None:
            return f"{cls.__module__}.eager_attention_forward", fn
    raise RuntimeError(f"no eager_attention_forward in the modeling file of "
                       f"{type(module).__name__} or its bases")


def capture_forward(module, query, key, value, attention_mask, **kwargs):
    """The function registered as ``CAPTURE``: calls the real one and records the call."""
    via, real = _real_function(module)
    out, weights = real(module, query, key, value, attention_mask, **kwargs)
    records = _RECORDS.get()
    if records is not None:
        records.append(Captured(_np(query), _np(key), _np(value), _np(out), _np(attention_mask),
                                {k: _np(v) for k, v in kwargs.items()}, via, _np(weights)))
    return out, weights


def _recording_sdpa(real):
    """``real`` (torch's SDPA) recording each call as ``capture_forward`` does."""
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             **kwargs):
        out = real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                   is_causal=is_causal, scale=scale, **kwargs)
        records = _RECORDS.get()
        if records is not None:
            if out.dim() != 4:
                raise ValueError(f"as shipped: SDPA called with {query.dim()}-d query; the "
                                 f"capture reads (B, H, L, d) heads")
            records.append(Captured(
                _np(query), _np(key), _np(value), _np(out.transpose(1, 2)), _np(attn_mask),
                {"dropout_p": dropout_p, "is_causal": is_causal, "scale": scale,
                 **{k: _np(v) for k, v in kwargs.items()}},
                "torch.nn.functional.scaled_dot_product_attention"))
        return out
    return sdpa


def route_attention(module: torch.nn.Module) -> torch.nn.Module:
    """Route every layer of ``module`` whose config names an attention implementation
    through ``CAPTURE`` (each keeps the function it was configured with)."""
    from transformers import AttentionInterface

    if CAPTURE not in AttentionInterface():
        AttentionInterface.register(CAPTURE, capture_forward)
    for m in module.modules():
        config = getattr(m, "config", None)
        if config is None or not hasattr(config, "_attn_implementation"):
            continue
        name = config._attn_implementation
        if name != CAPTURE:  # routed already (a config shared by several layers): kept
            _REAL[m] = name or "eager"
    for m in module.modules():
        config = getattr(m, "config", None)
        if m in _REAL and config._attn_implementation != CAPTURE:
            config._attn_implementation = CAPTURE
    return module


class ShippedLayer(torch.nn.Module):
    """A transformers attention layer as its model runs it: its own rotary embedding
    (``rotary``, None for none; ``rotary_kwargs`` its other arguments, Gemma 3's
    ``layer_type``) computes cos and sin at ``positions`` (B, L) (default 0..L-1; a packed
    row's restart at each sequence, as padding-free training's ``position_ids`` do), the mask
    goes in as ``attention_mask`` and ``is_causal=False`` (the mask holds the problem's
    causality, a packed row's sequences kept apart included)."""

    def __init__(self, attn: torch.nn.Module, rotary: Optional[torch.nn.Module] = None,
                 **rotary_kwargs: Any):
        super().__init__()
        self.attn, self.rotary, self.rotary_kwargs = attn, rotary, rotary_kwargs

    def forward(self, hidden: torch.Tensor, attention_mask: Optional[torch.Tensor],
                positions: Optional[torch.Tensor] = None, **kwargs: Any):
        B, L = hidden.shape[:2]
        if self.rotary is not None:
            if positions is None:
                positions = torch.arange(L, device=hidden.device)[None].expand(B, L)
            kwargs["position_embeddings"] = self.rotary(hidden, positions,
                                                        **self.rotary_kwargs)
        return self.attn(hidden, attention_mask=attention_mask, is_causal=False, **kwargs)


class ShippedCore(TorchModuleCore):
    """A module as shipped: ``build`` returns it (for a transformers layer,
    ``self.layer(attention, rotary, problem)``), ``call`` runs it (the default: a
    ``ShippedLayer`` with the mask folded into one additive mask, ``finfo.min`` where masked
    on transformers' eager path, -inf on the others). Nothing is loaded into it: its
    weights are its own initial ones, drawn with torch's generator seeded ``weight_seed``.
    ``fetch`` returns the attention its one call computed, posed as a problem
    (``Result.posed``): ``mha-suite check --plugin FILE`` judges it like any name."""

    framework = "hf"
    poses_problem = True  # its own q, k and v: ``fetch`` returns Result.posed
    kv_source = "self"  # a layer takes one hidden_states
    projection_bias = False  # the problem's projections are not the module's
    # packed: one call on a row of sequences back to back, the mask keeping them apart and
    # the rotary positions restarting at each (``ShippedLayer``)
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "packed"})
    attn = "eager"  # the attention implementation the layer's config names
    # Where the q, k, v are read: "attention_interface" (a transformers layer's call of its
    # attention function) or "sdpa" (a torch module's calls of
    # torch.nn.functional.scaled_dot_product_attention, looked up at call time as F.<name>)
    capture = "attention_interface"
    weight_seed = 0
    # True: the module's rotary embedding rotates pairs of the case's head width (``head_dim
    # = p.D``), so a case with an odd head width is unsupported (``ODD_ROTARY``), said before
    # the module is built. A module whose rotated width is its own (DeepSeek's
    # ``qk_rope_head_dim``) or that has no rotary embedding leaves it False.
    rotary = False

    def layer(self, attn: torch.nn.Module, rotary: Optional[torch.nn.Module],
              problem: Problem, **rotary_kwargs: Any) -> ShippedLayer:
        """``attn`` with its ``rotary`` embedding; the problem's scale, when it sets one, as
        the layer's ``scaling`` (what transformers' layers pass as ``scaling=``)."""
        if problem.scale is not None:
            attn.scaling = float(problem.scale)
        return ShippedLayer(attn, rotary, **rotary_kwargs)

    def build_for(self, problem: Problem, *, shared_input: bool) -> torch.nn.Module:
        if self.rotary and problem.D % 2:
            raise Unsupported(ODD_ROTARY)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.weight_seed)
            module = self.build(problem)
        return route_attention(module) if self.capture == "attention_interface" else module

    def prepare(self, problem: Problem, device: str, dtype: str, **kw: Any) -> Dict[str, Any]:
        why = unposable(problem)
        if why:
            raise Unsupported(f"as shipped: {why}")
        segments = problem.mask.segments  # each token's position within its own sequence
        self._packed_positions = None if segments is None else segment_positions(segments)
        return super().prepare(problem, device, dtype, **kw)

    def load_weights(self, module: torch.nn.Module, problem: Problem) -> None:
        """Nothing: the module keeps its own weights."""

    def check_wrapper(self, problem: Problem) -> List[str]:
        raise Unsupported("as shipped: the module keeps its own weights (nothing to read back)")

    def call(self, module, query, key, value, mask, need_weights):
        eager = self.capture == "attention_interface" and self.attn == "eager"
        fill = torch.finfo(query.dtype).min if eager else -math.inf
        packed = getattr(self, "_packed_positions", None)
        # (a module of the plugin's own gets the packed mask alone: its positions are its own)
        if packed is None or not isinstance(module, ShippedLayer):
            out = module(query, mask.additive(fill))
        else:
            out = module(query, mask.additive(fill),
                         positions=torch.as_tensor(packed, device=query.device))
        return (out[0] if isinstance(out, tuple) else out), None

    def run(self, state: Dict[str, Any]):
        records: List[Captured] = []
        token = _RECORDS.set(records)
        real = torch.nn.functional.scaled_dot_product_attention
        if self.capture == "sdpa":
            torch.nn.functional.scaled_dot_product_attention = _recording_sdpa(real)
        try:
            return super().run(state)
        finally:
            torch.nn.functional.scaled_dot_product_attention = real
            _RECORDS.reset(token)
            state["captured"] = records

    def fetch(self, state: Dict[str, Any], handle: Any) -> Result:
        """The attention function's output on the module's own q, k and v, with the problem
        posed on them (``Result.posed``; the judge takes that problem's oracle and bound);
        its weights where the function returned them. A module that called its attention
        function other than once, or whose call does not pair, raises (an error)."""
        calls: List[Captured] = state["captured"]
        if len(calls) != 1:
            raise RuntimeError(f"as shipped: the module called its attention function "
                               f"{len(calls)} times (one call is posed; routed through "
                               f"{CAPTURE!r} by ShippedCore.build_for)")
        c, p = calls[0], state["p"]
        wrong = _unpaired(c)
        if wrong:
            raise ValueError(f"as shipped: {wrong}; the module called {c.handed()}")
        posed = pose(p, c)
        if (posed.B, posed.L, posed.S, posed.H) == (p.B, p.L, p.S, p.H):
            posed.validate(finite=False)  # otherwise the judge names the shapes
        return Result(posed_output(c, posed), c.weights,
                      posed=Posed(posed, f"the module called {c.handed()}"))


# --- posing the problem on the captured tensors, and judging ----------------------------------
def pose(p: Problem, c: Captured) -> Problem:
    """The suite's problem on the captured heads: inputs the captured q, k, v (each head's
    q and k zero-padded to D' = max(d, V), which leaves every q.k unchanged), identity
    projections (exact in every dtype), no biases; the mask, score variants and scale of
    ``p`` (its scale, or 1/sqrt(d) of the captured heads). Its output's first H*V columns
    are the attention function's heads; the rest are zero."""
    B, H, L, d = c.query.shape
    K, V = c.key.shape[1], c.value.shape[3]
    Dp = max(d, V)
    E = H * Dp

    def heads_to_rows(x: np.ndarray, width: int) -> np.ndarray:  # (B, n, T, w) -> (B, T, E)
        n, T, w = x.shape[1], x.shape[2], x.shape[3]
        padded = np.zeros((B, n, T, width))
        padded[..., :w] = x
        rows = padded.transpose(0, 2, 1, 3).reshape(B, T, n * width)
        out = np.zeros((B, T, E))
        out[..., :n * width] = rows
        return out

    eye = np.eye(E)
    weights = Weights(w_q=eye, w_k=eye[:, :K * Dp], w_v=eye[:, :K * V], w_o=eye[:H * V])
    scale = p.scale if p.scale is not None else 1.0 / math.sqrt(d)
    return dataclasses.replace(
        p, query=heads_to_rows(c.query, Dp), key=heads_to_rows(c.key, Dp),
        value=heads_to_rows(c.value, V), weights=weights, num_heads=H, num_kv_heads=K,
        scale=scale, value_head_dim=None if V == Dp else V, grad_output=None)


def posed_output(c: Captured, posed: Problem) -> np.ndarray:
    """The attention function's output (B, L, H, V) through the posed problem's identity
    output projection, in float64 (exact; a NaN head spreads over its row as it does in the
    oracle's product)."""
    B, L, H, V = c.output.shape
    with np.errstate(invalid="ignore"):
        return c.output.reshape(B, L, H * V) @ posed.weights.w_o


def unposable(p: Problem) -> Optional[str]:
    """Why ``p`` cannot be posed on a module as shipped (None: it can): a field about the
    projections, the weights or more than one call."""
    needs = p.features()
    for feature, why in _PROJECTION_FEATURES.items():
        if feature in needs:
            return why
    return None


def _unpaired(c: Captured) -> Optional[str]:
    """Why the captured call's tensors do not pair as one attention (None: they do)."""
    B, H, L, d = c.query.shape
    K = c.key.shape[1]
    if c.key.shape[0] != B or c.key.shape[3] != d or c.value.shape[:3] != c.key.shape[:3] \
            or H % K:
        return f"query {c.query.shape}, key {c.key.shape}, value {c.value.shape} do not pair"
    if c.output.shape != (B, L, H, c.value.shape[3]):
        return (f"the attention function returned {c.output.shape}, expected "
                f"(B, L, H, V) = {(B, L, H, c.value.shape[3])}")
    return None
