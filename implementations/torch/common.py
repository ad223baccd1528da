"""The PyTorch adapter: device and dtype handling, projections, mask translation, gradients.

``TorchCore`` moves inputs and weights to the device once (untimed), projects q, k, v,
splits heads, calls ``attend``, merges heads and projects the output, under
``torch.inference_mode()`` or, with ``grad=True``, with autograd (forward + backward of
``sum(out * cotangent(problem))``). A torch kernel that only computes attention from
per-head q, k, v subclasses it and writes ``attend``; the adapter does the rest::

    import torch
    from implementations.torch.common import TorchCore, masked_softmax

    class MyKernel(TorchCore):
        name = "mine.torch"
        features = TorchCore.features  # masks, cross, GQA, scale, grad: narrow if needed

        def attend(self, q, k, v, mask, scale, need_weights):
            # q (B, H, L, D); k, v (B, H, S, D), kv heads already repeated for GQA
            # (set ``repeat_kv = False`` to get them as (B, K, S, D));
            # mask.bias: float (B, H|1, L, S) with -inf where not allowed, or None.
            s = q @ k.transpose(-1, -2) * scale  # (B, H, L, S)
            if mask.bias is not None:
                s = s + mask.bias
            return masked_softmax(s) @ v, None  # heads (B, H, L, D), no weights

Register it with ``--plugin path/to/file.py:MyKernel``. ``mask`` is a
``suite.plugins.adapters.AttendMask`` of tensors on the device (the signature the NumPy and JAX
cores share): also ``allowed`` (bool, True = attend), ``causal_only`` (the whole mask is
top-left causal) and ``dead_keys``; ``zero_dead_values(v, mask)`` zeroes padded values
(NaN padding).
"""

from __future__ import annotations

import dataclasses
import math
import os
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from suite.plugins import adapters
from suite.plugins.adapters import AttendMask, attend_mask
from suite.plugins.conditions import Where
from suite.plugins.declarations import Deviation
from suite.plugins.interface import Implementation, Result, Unsupported
from suite.spec.layouts import LAYOUTS, requested_layout
from suite.spec.layouts import check as check_layout
from suite.spec.paging import paged_cache
from suite.spec.problem import GRAD_NAMES, Problem, cotangent

if not torch.cuda.is_available():
    # Triton, where installed, picks interpreter or compiler when ``triton.language`` first
    # decorates its own helpers (tl.max, tl.sum, ...), at its first import in the process.
    # torch.compile and FlexAttention import it (torch.utils._triton.has_triton): set here,
    # before any torch plugin compiles, or no Triton kernel (triton.flash, a user's) can be
    # interpreted later in the same process. Without a GPU nothing compiles Triton code.
    os.environ.setdefault("TRITON_INTERPRET", "1")

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32,
                "float16": torch.float16, "bfloat16": torch.bfloat16}


TorchMask = AttendMask  # the mask ``attend`` receives, tensors on the device


def tensor_copy(a: np.ndarray, device: Any) -> torch.Tensor:
    """A contiguous copy of ``a`` on ``device``: the problem's arrays may be read-only or
    strided views (torch warns on read-only memory it would share, and a library may
    ``.view`` its input, which needs contiguous strides)."""
    return torch.tensor(np.ascontiguousarray(a), device=device)


def translate_mask(p: Problem, device: torch.device, dtype: torch.dtype) -> AttendMask:
    """The canonical mask of ``p`` as tensors on ``device`` (the bias in ``dtype``)."""
    return attend_mask(p, put_float=lambda a: torch.as_tensor(a, device=device, dtype=dtype),
                       put_bool=lambda a: torch.as_tensor(a, device=device))


# Every layout: the torch kernels' built-ins hand torch each one as it comes.
ALL_LAYOUTS = frozenset(LAYOUTS)

# SDPA before torch 2.5 (every CPU backend, and the modules that call it) answers a query row
# with no key to attend with NaN: the softmax of a row of -inf. 2.5 gives the spec's zero row.
# Keyed by version, so on 2.5 and later the spec's answer is required, and on 2.4.0 a NaN in
# a row that has keys to attend (pytorch #127055) still fails.
SDPA_FULLY_MASKED_NAN = Deviation(
    "nan", "SDPA gives NaN, not a zero head output, for a query row with no key to attend "
           "(measured on torch 2.4.0 and 2.4.1, CPU, math and flash backends, float32: every "
           "masking/fully_masked*, lanes/fully_masked_S* and tiles/masked_blocks_* case)",
    where=Where(versions={"torch": "<2.5"}))


def arrange(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` (4-D: per-head (B, H, L, D), or a (B, H|1, L, S) mask) with the same values in
    ``layout`` (``suite.spec.layouts.LAYOUTS``), built with torch's own views; ``expanded``:
    contiguous (the core broadcasts kv heads with ``expand_heads``, the mask in
    ``arrange_mask``)."""
    check_layout(layout)
    if layout in ("contiguous", "expanded"):
        return x.contiguous()
    if layout == "last_strided":
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "sliced":
        B, H, L, D = x.shape
        buf = torch.full((B + 1, H, L + 2, D + 5), True if x.dtype == torch.bool else
                         float("nan"), dtype=x.dtype, device=x.device)  # garbage around it
        view = buf[1:, :, 1:L + 1, 2:D + 2]
        view.copy_(x)
        return view
    return x.transpose(1, 2).contiguous().transpose(1, 2)  # transposed


def expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """A (B, 1, ...) tensor broadcast to ``heads`` heads with stride 0 (``expand``, no copy)."""
    return x.expand(x.shape[0], heads, *x.shape[2:])


def arrange_mask(mask: AttendMask, problem: Problem) -> AttendMask:
    """``mask``'s bias and allowed tensors in the layout ``problem`` asks for (the layouts
    family), else ``mask``: ``expanded`` broadcasts a (B, 1, L, S) mask over the heads with
    stride 0, the other layouts arrange it as they arrange q, k and v."""
    layout = requested_layout(problem)
    if layout is None:
        return mask

    def put(x):
        if x is None:
            return None
        if layout == "expanded":
            return x.expand(problem.B, problem.H, *x.shape[2:]) if x.shape[1] == 1 else x
        return arrange(x, layout)
    return mask.replace(bias=put(mask.bias), allowed=put(mask.allowed))


class TorchCore(Implementation):
    """Projections and heads in torch; subclasses supply ``attend``."""

    poses_problem = False  # it computes the handed problem (a module as shipped: ShippedCore)
    framework = "torch"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale", "grad"})
    # Whether ``attend`` wants k/v repeated to H heads (False: it takes K kv heads itself).
    repeat_kv = True
    # The layout (suite.spec.layouts) ``attend`` gets q, k, v in outside the layouts family; None:
    # heads split from (B, L, H, D) without a copy (``transposed``, the projections' views).
    own_layout: Optional[str] = None

    # The array library, shown beside the framework's version ("hf 5.24.0 on torch").
    array_library = "torch"

    def framework_version(self) -> str:
        # a subclass naming another framework (hf, timm, ...) reports that library's version
        return torch.__version__ if self.framework == "torch" else super().framework_version()

    def devices(self) -> List[str]:
        cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())] \
            if torch.cuda.is_available() else []
        return ["cpu", *cuda]

    def dtypes(self, device: str) -> Sequence[str]:
        if device.startswith("cuda"):
            return ("float32", "float16", "bfloat16")
        return ("float64", "float32", "float16", "bfloat16")

    def target(self, device: str, dtype: str) -> Tuple[torch.device, torch.dtype]:
        """The run's torch device and dtype, once both are checked to be offered here."""
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
        if device not in self.devices():
            raise ValueError(f"device: expected one of {self.devices()}, got {device!r}")
        return torch.device(device), TORCH_DTYPES[dtype]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttendMask,
               scale: float, need_weights: bool):
        """q (B, H, L, D), k/v (B, H, S, D) -> (heads (B, H, L, D), weights or None)."""
        raise NotImplementedError

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        dev, t = self.target(device, dtype)
        p = problem

        def put(a: Optional[np.ndarray]) -> Optional[torch.Tensor]:
            if a is None:
                return None
            x = tensor_copy(a, dev).to(t)
            return x.requires_grad_(True) if grad else x

        tensors = {"query": put(p.query), "key": put(p.key), "value": put(p.value)}
        tensors.update({k: put(v) for k, v in p.weights.as_dict().items()})
        pages = None
        if p.paging is not None:  # a paged cache: the pool and its table replace key and value
            if grad:
                raise Unsupported("gradients through a paged cache: the pool is not the "
                                  "problem's key and value inputs")
            cache = paged_cache(p)
            tensors.update(key=None, value=None)
            pages = {"key_pages": put(cache.key_pages), "value_pages": put(cache.value_pages),
                     "block_table": torch.as_tensor(cache.block_table, device=dev).long(),
                     "lengths": torch.as_tensor(cache.lengths, device=dev).long()}
        state = {"p": p, "device": dev, "tensors": tensors, "need_weights": need_weights,
                 "grad": grad, "mask": arrange_mask(translate_mask(p, dev, t), p),
                 "cotangent": torch.as_tensor(cotangent(p), device=dev).to(t) if grad else None,
                 "compile_s": None, "pages": pages}
        self.after_prepare(state)
        return state

    def forward(self, state: Dict[str, Any]):
        p, x = state["p"], state["tensors"]
        B, L, S, H, K, D, V = p.B, p.L, p.S, p.H, p.K, p.D, p.V

        def proj(inp, w, b):
            return inp @ w if b is None else torch.addmm(b, inp.reshape(-1, inp.shape[-1]), w
                                                          ).reshape(*inp.shape[:-1], -1)

        q = proj(x["query"], x["w_q"], x["b_q"]).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        pages = state.get("pages")
        if pages is None:
            k = proj(x["key"], x["w_k"], x["b_k"])  # (B, S, K*D)
            v = proj(x["value"], x["w_v"], x["b_v"])  # (B, S, K*V)
        else:  # the pool's blocks projected (per token), then read through the block table
            table, lengths = pages["block_table"], pages["lengths"]
            k = self.read_pages(proj(pages["key_pages"], x["w_k"], x["b_k"]), table, lengths,
                                S)  # (B, S, K*D)
            v = self.read_pages(proj(pages["value_pages"], x["w_v"], x["b_v"]), table, lengths,
                                S)  # (B, S, K*V)
        k = k.view(B, S, K, D).transpose(1, 2)  # (B, K, S, D)
        v = v.view(B, S, K, V).transpose(1, 2)  # (B, K, S, V)
        layout = requested_layout(p) or self.own_layout
        if layout == "expanded":  # contiguous q, kv heads broadcast with stride 0
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            if self.repeat_kv and K == 1 and H > 1:
                k, v = expand_heads(k, H), expand_heads(v, H)
        if self.repeat_kv and k.shape[1] != H:  # query head h reads kv head h // (H // K)
            k = k.repeat_interleave(H // K, dim=1)  # (B, H, S, D)
            v = v.repeat_interleave(H // K, dim=1)  # (B, H, S, V)
        if layout not in (None, "expanded"):  # the layouts family: this memory layout
            q, k, v = arrange(q, layout), arrange(k, layout), arrange(v, layout)
        if p.steps is not None:  # a generating module: chunk by chunk against a cache
            heads, weights = self.attend_in_steps(q, k, v, state["mask"], p), None
        else:
            heads, weights = self.attend(q, k, v, state["mask"], p.effective_scale,
                                         state["need_weights"])
        concat = heads.transpose(1, 2).reshape(B, L, H * V)  # (B, L, H*V)
        return proj(concat, x["w_o"], x["b_o"]), weights  # (B, L, E)

    def read_pages(self, pages: torch.Tensor, block_table: torch.Tensor, lengths: torch.Tensor,
                   S: int) -> torch.Tensor:
        """The logical cache (B, S, X) of a paged one (``suite.spec.paging``): ``pages``
        (N, P, X), projected, indexed by the block table (B, T); ``lengths`` (B,) the filled
        slots (the mask hides the rest)."""
        B, T = block_table.shape
        rows = pages[block_table]  # (B, T, P, X)
        return rows.reshape(B, T * pages.shape[1], pages.shape[2])[:, :S]  # (B, S, X)

    def attend_in_steps(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        mask: AttendMask, p: Problem) -> torch.Tensor:
        """The rows chunk by chunk (``p.steps``), each chunk's keys and values put in a cache
        first (``cache_append``, or ``cache_write`` into a static cache of ``p.cache_len``
        slots) and its rows given to ``attend`` with the cache and the mask's rows over it
        (slots not yet written masked; no causal flag: a chunk's rows sit at an offset):
        heads (B, H, L, V)."""
        def empty(slots: int):
            return (k.new_zeros(k.shape[:2] + (slots, k.shape[3])),
                    v.new_zeros(v.shape[:2] + (slots, v.shape[3])))

        heads = []
        for start, end, kc, vc in adapters.cached_chunks(p, k, v, empty, self.cache_append,
                                                         self.cache_write):
            n = end - start
            allowed = mask.allowed.new_zeros(mask.allowed.shape[:2] + (n, kc.shape[2]))
            allowed[..., :end] = mask.allowed[:, :, start:end, :end]
            bias = mask.bias.new_full(mask.bias.shape[:2] + (n, kc.shape[2]), -math.inf)
            bias[..., :end] = mask.bias[:, :, start:end, :end]
            rows = mask.replace(bias=bias, allowed=allowed, causal_only=False,
                                dead_keys=~allowed.any(dim=-2).unsqueeze(-1))
            var = mask.variants
            if var is not None and (var.alibi is not None or var.rel_bias is not None
                                    or var.score_mod is not None):
                # the chunk's rows sit at positions start.. (ALiBi, the table and a
                # score_mod read them)
                rows = rows.replace(query_offset=np.full(q.shape[0], start))
            h, _ = self.attend(q[:, :, start:end], kc, vc, rows, p.effective_scale, False)
            heads.append(h)
        return torch.cat(heads, dim=2)

    def cache_append(self, kc: torch.Tensor, vc: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A growing cache: the chunk's keys and values after those held."""
        return torch.cat([kc, k], dim=2), torch.cat([vc, v], dim=2)

    def cache_write(self, kc: torch.Tensor, vc: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, start: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """A static cache: the chunk's keys and values at their positions start.."""
        kc, vc = kc.clone(), vc.clone()
        kc[:, :, start:start + k.shape[2]] = k
        vc[:, :, start:start + v.shape[2]] = v
        return kc, vc

    def run(self, state: Dict[str, Any]):
        if not state["grad"]:
            with torch.inference_mode():
                return self.forward(state)
        for t in state["tensors"].values():
            if t is not None:
                t.grad = None
        out, weights = self.forward(state)
        out.backward(state["cotangent"])
        return out.detach(), weights

    def synchronize(self, state: Dict[str, Any]) -> None:
        if state["device"].type == "cuda":
            torch.cuda.synchronize(state["device"])

    def fetch(self, state: Dict[str, Any], handle) -> Result:
        out, weights = handle
        grads = None
        if state["grad"]:
            grads = {n: _np(t.grad) for n, t in state["tensors"].items()
                     if n in GRAD_NAMES and t is not None and t.grad is not None}
        return Result(_np(out), None if weights is None else _np(weights), grads)


@dataclasses.dataclass(frozen=True)
class TensorMaskParts(adapters.MaskParts):
    """``suite.plugins.adapters.MaskParts`` as ``TorchModuleCore.call`` receives it: its arrays are
    tensors on ``device``, and ``additive()`` folds ``mask`` and ``bias`` there into one
    float tensor (in the compute ``dtype`` unless asked otherwise), as Hugging Face takes it."""

    device: Any = None
    dtype: Any = None
    # A generation problem's chunk (``TorchModuleCore.call_in_steps``): the cache
    # ``new_cache`` returned, which ``call`` hands the library (transformers' ``cache=``), and
    # the chunk's absolute positions, long (n,) (transformers' ``cache_position``); None in
    # every other call.
    cache: Any = None
    positions: Any = None

    def additive(self, fill: float = -math.inf, dtype: Any = None) -> Any:
        if not any(isinstance(a, torch.Tensor) for a in (self.mask, self.bias)):
            return super().additive(fill, np.float64 if dtype is None else dtype)
        if self.mask is None and self.bias is None:
            return None
        dtype = dtype or self.dtype
        m = self.mask if self.mask is None or self.true_means == "attend" else ~self.mask
        bias = torch.zeros((), dtype=dtype, device=self.device) if self.bias is None \
            else self.bias.to(dtype)
        if m is not None:
            bias = torch.where(m, bias, torch.tensor(fill, dtype=dtype, device=self.device))
        B, _, L, S = self.shape
        return bias.expand((B, self.heads, L, S) if self.per_head else (B, L, S))


class TorchModuleCore(TorchCore):
    """A whole torch module (projections included) as a plugin: subclasses write ``build``
    (the module for a problem) and ``call`` (one forward); weights go in and gradients come
    back through ``suite.plugins.adapters``, by default in the ``nn.Linear`` layout of the four
    submodules named in ``layers`` (override ``load_weights``/``weight_grads`` for others).
    A ``layers`` entry is a dotted path (``"attn.q_proj"``) of a module with ``weight`` (out,
    in) and ``bias``: an ``nn.Linear`` or a 1x1 convolution (out, in, 1, 1); the role
    ``"qkv"`` names one fused layer whose rows are q, then k, then v (timm's ``qkv``); an
    ``Einsum`` entry names a bare parameter in an einsum layout (a multi-query module's
    ``query_proj`` (H, D, E): ``Einsum("query_proj", "h d e")``).

    The mask reaches ``call`` as ``suite.plugins.adapters.MaskParts`` split with ``mask_split``
    (default: everything in one per-head boolean ``mask``, True = attend; per problem:
    ``mask_split_for``), its arrays as tensors on the device (``bias`` in the compute dtype);
    a library with its own mask arguments overrides ``module_mask``. ``batch_first = False``
    gives ``call`` inputs (L, B, E) and takes its output in that layout; ``shares_input``
    says when query, key and value go in as one tensor (a module's self-attention path).

    Generation (feature ``steps``, and ``static_cache``): ``new_cache(module, problem)``
    returns the library's cache, and ``call`` runs once per chunk (``call_in_steps``), its
    mask the chunk's rows over the cache's slots (``chunk_masks``) with ``mask.cache`` (to
    hand the module) and ``mask.positions`` (the rows' absolute positions) set.
    """

    features = frozenset({"cross", "grad"})  # declare what the module really handles
    layers: Dict[str, Any] = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    mask_split: Dict[str, Any] = {"true_means": "attend", "key_padding": False,
                                  "native_causal": (), "per_head": True}
    batch_first = True  # False: inputs, output and cotangent are sequence first, (L, B, E)
    # True: a vision module's NCHW feature map: ``call`` gets the query as (B, E, H', W'),
    # L = H' * W' (``adapters.to_image``), returns its output so, and self-attention only.
    image_input = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # An image map attends to itself: one input for query, key and value, so the suite
        # hands the module every case in its self-attention form (#42 item 4: without it, 110
        # of 172 cases per name were unsupported as cross-attention). An explicit one stays.
        own = cls.__mro__[:cls.__mro__.index(TorchModuleCore)]
        if cls.image_input and not any("kv_source" in vars(c) for c in own):
            cls.kv_source = "self"

    def mask_split_for(self, problem: Problem) -> Dict[str, Any]:
        """``split_mask``'s arguments for ``problem`` (default: the class's ``mask_split``).
        Override for a library whose conventions change with the problem, e.g. a causal
        flag it honours only when no other mask is passed."""
        return self.mask_split

    def build(self, problem: Problem) -> torch.nn.Module:
        """The module for ``problem`` (its sizes; weights are loaded afterwards)."""
        raise NotImplementedError

    def build_for(self, problem: Problem, *, shared_input: bool) -> torch.nn.Module:
        """The module for ``problem`` when ``shares_input`` decided ``shared_input`` (a
        module whose self-attention form is another module overrides this); ``build``."""
        return self.build(problem)

    def call(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor, mask: Any, need_weights: bool):
        """One forward: -> (output (B, L, E), attention weights (B, H, L, S) or None)."""
        raise NotImplementedError

    def shares_input(self, problem: Problem, grad: bool) -> bool:
        """Whether query, key and value go in as one tensor (default: never; separate
        leaves are needed for their gradients)."""
        return False

    def module_mask(self, problem: Problem, device: torch.device, dtype: torch.dtype) -> Any:
        """The mask as ``call`` receives it: ``TensorMaskParts`` split with
        ``mask_split_for``, its arrays as tensors on ``device`` (``bias`` in ``dtype``)."""
        parts = adapters.split_mask(problem, **self.mask_split_for(problem))
        return TensorMaskParts(**{**vars(parts), **{
            n: None if a is None else torch.as_tensor(
                np.ascontiguousarray(a), device=device, dtype=dtype if n == "bias" else None)
            for n, a in (("key_padding", parts.key_padding), ("mask", parts.mask),
                         ("bias", parts.bias))}}, device=device, dtype=dtype)

    def load_weights(self, module: torch.nn.Module, problem: Problem) -> None:
        p = problem
        _SIZES[module] = (p.E, p.H, p.K)
        linear = adapters.to_linear(p.weights)
        if "qkv" in self.layers:
            linear["qkv"] = adapters.to_linear_fused(p.weights)
        for role, where in self.layers.items():
            if isinstance(where, Einsum):
                param = adapters.to_layout(p.weights, role, where.axes, p.H, p.K, where.bias_axes)
                weight, bias = where.tensors(module)
            else:  # nn.Linear layout; a 1x1 convolution's (out, in, 1, 1) holds the same
                param, layer = linear[role], self.layer(module, role, where)
                weight, bias = layer.weight, layer.bias
            weight.copy_(torch.tensor(param.weight).reshape(weight.shape))
            if param.bias is not None:
                if bias is None:
                    raise Unsupported(f"{where} has no bias, the problem has one")
                bias.copy_(torch.tensor(param.bias).reshape(bias.shape))
            elif bias is not None:  # the problem has none: a zero bias, not the initial one
                bias.zero_()

    def layer(self, module: torch.nn.Module, role: str, where: str) -> torch.nn.Module:
        """The submodule ``layers[role]`` names; a ValueError naming the entry, the module's
        class and the projections it does hold when it has no such submodule."""
        try:
            return module.get_submodule(where)
        except AttributeError:
            held = [n for n, m in module.named_modules() if n and hasattr(m, "weight")]
            raise ValueError(f"layers[{role!r}] = {where!r}: {type(module).__name__} has no "
                             f"such submodule (its layers with a weight: "
                             f"{', '.join(held) or 'none'}); set layers to its names") from None

    def read_weights(self, module: torch.nn.Module) -> Dict[str, np.ndarray]:
        """The weights the built module holds, under canonical names (the inverse of
        ``load_weights``, read through ``layers`` as ``weight_grads`` reads gradients).
        A wrapper with its own weight layout (a packed ``in_proj_weight``, a ``Conv1D``)
        overrides it beside ``load_weights``, so the ``wrapper`` checks can read it."""
        return self._by_role(module, lambda t: None if t is None else _np(t.detach()))

    def check_wrapper(self, problem: Problem) -> List[str]:
        """The wrapper's own translation, before any verdict on the library: the weights
        read back from the module built and loaded for ``problem`` (float64, on the CPU)
        must equal the problem's. Returns what differs (empty: the round trip holds);
        ``Unsupported`` when the wrapper loads its own layout and gives no ``read_weights``
        that the suite could read it back with."""
        own_load = _overrides(self, "load_weights") and not _overrides(self, "read_weights")
        module = self.build_for(problem, shared_input=False).to(torch.float64).eval()
        if own_load:  # read through ``layers`` only where they are what the module holds
            why = self._unreadable(module)
            if why:
                raise Unsupported(f"load_weights is the wrapper's own and it gives no "
                                  f"read_weights (its inverse): {why}")
        with torch.no_grad():
            self.load_weights(module, problem)
        return adapters.weight_differences(problem.weights, self.read_weights(module))

    def _unreadable(self, module: torch.nn.Module) -> Optional[str]:
        """Why ``layers`` cannot stand for an overridden ``load_weights``'s layout on
        ``module`` (None: every role is a layer whose type fixes its layout: ``nn.Linear``,
        a 1x1 convolution, or an ``Einsum`` entry)."""
        roles = set(self.layers) - {"qkv"} | ({"q", "k", "v"} if "qkv" in self.layers else set())
        if roles != set(adapters.ROLES) or any(w is None for w in self.layers.values()):
            return f"layers {self.layers!r} does not name a layer for each of q, k, v and o"
        for role, where in self.layers.items():
            if isinstance(where, Einsum):
                continue
            try:
                layer = module.get_submodule(where)
            except AttributeError:
                return f"the module has no layer {where!r} (layers[{role!r}])"
            conv = isinstance(layer, torch.nn.modules.conv._ConvNd) and all(
                k == 1 for k in layer.kernel_size)
            if not (isinstance(layer, torch.nn.Linear) or conv):
                return (f"layer {where!r} is a {type(layer).__name__}, not an nn.Linear or a "
                        f"1x1 convolution")
        return None

    def check_mask(self, problem: Problem) -> List[str]:
        """The wrapper's own mask translation: the ``MaskParts`` ``module_mask`` hands to
        ``call`` (float64, on the CPU), read back by its convention into a (B, H, L, S)
        allowed matrix and bias, must mean the canonical mask of ``problem``
        (``suite.plugins.adapters.mask_differences``). ``Unsupported`` when ``module_mask`` returns
        the library's own arguments (a dict) rather than ``MaskParts``."""
        parts = self.module_mask(problem, torch.device("cpu"), torch.float64)
        if not isinstance(parts, adapters.MaskParts):
            raise Unsupported(f"module_mask returns {type(parts).__name__}, not "
                              f"suite.plugins.adapters.MaskParts: the suite cannot read the library's "
                              f"own mask arguments back")
        return adapters.mask_differences(problem, dataclasses.replace(parts, **{
            n: None if a is None else a.detach().cpu().numpy() if isinstance(a, torch.Tensor)
            else np.asarray(a)
            for n, a in (("key_padding", parts.key_padding), ("mask", parts.mask),
                         ("bias", parts.bias))}))

    def weight_grads(self, module: torch.nn.Module) -> Dict[str, np.ndarray]:
        return self._by_role(module, lambda t: None if t is None or t.grad is None
                             else _np(t.grad))

    def _by_role(self, module: torch.nn.Module, pick) -> Dict[str, np.ndarray]:
        """``pick`` (a tensor -> array or None) of each layer's weight and bias, in the
        canonical names and layout (the layers named in ``layers``: linear, 1x1 conv, fused
        qkv, einsum)."""
        E, H, K = _SIZES.get(module, (0, 1, 1))  # needed by "qkv" and ``Einsum`` only
        per_role: Dict[str, adapters.Param] = {}
        for role, where in self.layers.items():
            if isinstance(where, Einsum):
                weight, bias = where.tensors(module)
                per_role[role] = adapters.Param(*adapters.grad_from_layout(
                    adapters.Param(pick(weight), pick(bias)), role, where.axes, E, H, K,
                    where.bias_axes))
                continue
            layer = self.layer(module, role, where)
            g = adapters.Param(pick(layer.weight), pick(layer.bias))
            g = g._replace(weight=g.weight.reshape(g.weight.shape[0], -1))  # 1x1 conv: 2-D
            for r, lin in (adapters.split_linear_fused(g, H * (E // H)).items()
                           if role == "qkv" else ((role, g),)):
                per_role[r] = adapters.Param(lin.weight.T, lin.bias)  # canonical (in, out)
        return adapters.grads_from_conv1d(per_role)

    def _layout(self, a: np.ndarray) -> np.ndarray:
        """(B, L, E) -> the layout ``call`` takes: as is, sequence first (L, B, E) or an
        image (B, E, H', W')."""
        if self.image_input:
            return adapters.to_image(a)
        return a if self.batch_first else np.swapaxes(a, 0, 1)

    def _unlayout(self, a: np.ndarray) -> np.ndarray:
        """The inverse of ``_layout``: back to (B, L, E)."""
        if self.image_input:
            return adapters.from_image(a)
        return a if self.batch_first else np.swapaxes(a, 0, 1)

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        p, (dev, t) = problem, self.target(device, dtype)
        layout = requested_layout(p)
        if layout not in (None, "contiguous"):
            # The layouts family arranges the per-head q, k, v (and mask) a kernel core
            # (TorchCore.attend) is given; a module takes (B, L, E) inputs, contiguous here.
            # Declaring layouts on a module passed every layout case with nothing rearranged.
            raise Unsupported(f"layout {layout}: a module wrapper (TorchModuleCore) is given its "
                              f"inputs contiguous; the layouts family arranges the per-head "
                              f"tensors of a kernel core (TorchCore.attend)")
        shared = self.shares_input(p, grad)
        if self.image_input:
            _check_one_map(p, grad)
        # Cast first, then load: the canonical float64 weights are rounded once, to the run's
        # dtype (loading into a float32 module first would round float64 runs to float32).
        module = self.build_for(p, shared_input=shared).to(dev, t)
        # Training mode only where the problem asks for it (dropout): the module draws then.
        module = module.train() if p.dropout is not None else module.eval()
        with torch.no_grad():
            self.load_weights(module, p)

        def put(a: np.ndarray) -> torch.Tensor:
            x = tensor_copy(self._layout(a), dev).to(t)
            return x.requires_grad_(True) if grad else x

        if shared:  # one tensor as query, key and value
            x = put(p.query)
            tensors = {"query": x, "key": x, "value": x}
        else:  # separate leaves, so each gets its own gradient
            tensors = {n: put(getattr(p, n)) for n in ("query", "key", "value")}
        state = {"p": p, "device": dev, "module": module, "need_weights": need_weights,
                 "tensors": tensors, "grad": grad, "mask": self.module_mask(p, dev, t),
                 "compile_s": None,
                 "cotangent": torch.as_tensor(self._layout(cotangent(p)), device=dev).to(t)
                 if grad else None}
        self.after_prepare(state)
        return state

    def forward(self, state: Dict[str, Any]):
        x, p = state["tensors"], state["p"]
        if p.steps is not None:  # a generating module: chunk by chunk through its own cache
            return self.call_in_steps(state["module"], x["query"], state["mask"], p), None
        return self.call(state["module"], x["query"], x["key"], x["value"], state["mask"],
                         state["need_weights"])

    def new_cache(self, module: torch.nn.Module, problem: Problem) -> Any:
        """The library's own cache for a generation problem (feature ``steps``): a growing
        one, or a static one of ``problem.cache_len`` slots (feature ``static_cache``).
        ``call`` finds it as ``mask.cache`` and hands it to the module."""
        raise NotImplementedError(f"{type(self).__name__} declares 'steps' but writes no "
                                  f"new_cache(module, problem): the cache its call hands the "
                                  f"module as mask.cache")

    def call_in_steps(self, module: torch.nn.Module, query: torch.Tensor, mask: Any,
                      p: Problem) -> torch.Tensor:
        """A generation problem (``p.steps``) as a generating model runs it: one cache from
        ``new_cache``, then each chunk alone through ``call`` (query, key and value the
        chunk's rows, no weights), its mask from ``chunk_masks`` with ``cache`` set: output
        (B, L, E)."""
        if not isinstance(mask, TensorMaskParts):
            raise Unsupported(f"module_mask returns {type(mask).__name__}, not MaskParts: "
                              f"override call_in_steps to run a generation problem")
        if self.image_input or not self.batch_first:
            raise Unsupported("generation takes batch-first (B, L, E) inputs")
        cache, outs = self.new_cache(module, p), []
        for parts in self.chunk_masks(p, mask.device, mask.dtype):
            start = int(parts.positions[0])
            rows = query[:, start:start + parts.shape[2]].contiguous()  # a tensor of its own
            out, _ = self.call(module, rows, rows, rows, dataclasses.replace(parts, cache=cache),
                               False)
            outs.append(out)
        return torch.cat(outs, dim=1)

    def chunk_masks(self, p: Problem, device: torch.device, dtype: torch.dtype
                    ) -> List[TensorMaskParts]:
        """Each chunk's mask (``p.steps``): its rows over the cache after their keys went in,
        ``end`` slots for a growing cache or ``p.cache_len`` for a static one (the slots not
        yet written masked). Everything is in ``mask`` (and ``bias``), in ``mask_split_for``'s
        convention and head layout: no key padding and no causal flag, since a chunk's rows
        sit at an offset; ``positions`` are the rows' absolute positions, long (n,)."""
        split = {**self.mask_split_for(p), "key_padding": False, "native_causal": ()}
        whole = adapters.split_mask(p, **split)  # mask (B, H|1, L, S) or (B, L, S)
        B, H, _, _ = whole.shape

        def rows(a: Optional[np.ndarray], fill: Any, start: int, end: int,
                 slots: int) -> Optional[torch.Tensor]:
            """Rows start:end of ``a`` over ``slots`` keys: keys past ``end`` are ``fill``."""
            if a is None:
                return None
            x = np.full(a.shape[:-2] + (end - start, slots), fill, dtype=a.dtype)
            x[..., :end] = a[..., start:end, :end]
            return torch.as_tensor(x, device=device, dtype=dtype if x.dtype.kind == "f" else None)

        out, start = [], 0
        for n in p.steps:
            end = start + n
            slots = end if p.cache_len is None else p.cache_len
            out.append(TensorMaskParts(
                key_padding=None, causal=None,
                mask=rows(whole.mask, whole.true_means != "attend", start, end, slots),
                bias=rows(whole.bias, 0.0, start, end, slots), true_means=whole.true_means,
                per_head=whole.per_head, shape=(B, H, n, slots), heads=whole.heads,
                device=device, dtype=dtype, positions=torch.arange(start, end, device=device)))
            start = end
        return out

    def run(self, state: Dict[str, Any]):
        if state["grad"]:
            state["module"].zero_grad(set_to_none=True)
        return super().run(state)

    def fetch(self, state: Dict[str, Any], handle) -> Result:
        result = super().fetch(state, handle)
        if self.image_input or not self.batch_first:  # back to (B, L, E)
            result.output = self._unlayout(result.output)
            if state["grad"]:
                result.grads = {n: self._unlayout(g) if n in state["tensors"] else g
                                for n, g in result.grads.items()}
        if state["grad"]:
            result.grads = {**result.grads, **self.weight_grads(state["module"])}
        return result


class Einsum(NamedTuple):
    """A ``TorchModuleCore.layers`` entry for a projection held as bare parameters: the
    dotted path of the weight, its axes in ``suite.plugins.adapters.rearrange`` letters (e model
    width, h heads: H for q and o, K for k and v, d head width), and optionally the path of
    its bias and the bias's axes (default canonical: "(h d)", "e" for o)."""

    weight: str
    axes: str
    bias: Optional[str] = None
    bias_axes: Optional[str] = None

    def tensors(self, module: torch.nn.Module):
        return (module.get_parameter(self.weight),
                None if self.bias is None else module.get_parameter(self.bias))


def _overrides(impl: Any, name: str) -> bool:
    """Whether ``impl``'s class replaces ``TorchModuleCore``'s method ``name``."""
    return getattr(type(impl), name) is not getattr(TorchModuleCore, name)


# (E, H, K) of the problem whose weights a module holds, for mapping its gradients back.
_SIZES: weakref.WeakKeyDictionary[torch.nn.Module, Tuple[int, int, int]] = \
    weakref.WeakKeyDictionary()


def _check_one_map(p: Problem, grad: bool) -> None:
    """A module that takes one feature map attends it to itself."""
    same = p.query is p.key is p.value or (
        np.array_equal(p.query, p.key, equal_nan=True)
        and np.array_equal(p.key, p.value, equal_nan=True))
    if not same:
        raise Unsupported("a feature map attends itself: query, key and value must be the "
                          "same array")
    if grad:
        raise Unsupported("one feature map goes in: only the sum of the query, key and value "
                          "gradients exists")


def zero_dead_values(v: torch.Tensor, mask: AttendMask) -> torch.Tensor:
    """Zero value rows no query may attend (padding may hold NaN, and 0 * NaN is NaN).

    v (B, K, S, D) may have fewer heads than the mask (GQA): a kv head's key is dead
    only when it is dead for every query head that reads it.
    """
    dead = mask.dead_keys  # (B, H|1, S, 1)
    if dead is None:
        return v
    if dead.shape[1] not in (1, v.shape[1]):
        B, H, S, _ = dead.shape
        dead = dead.view(B, v.shape[1], H // v.shape[1], S, 1).all(dim=2)  # (B, K, S, 1)
    return v.masked_fill(dead, 0.0)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def cuda_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def masked_softmax(scores: torch.Tensor, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Softmax over the last axis; a row with no finite score gives zeros, not NaN.
    ``sinks`` (H,): one logit per head in each row's denominator, taking no weight of a key
    (the weights of a row then sum to less than 1; a row with no key gives zeros)."""
    # The row max is a shift softmax cancels exactly, so no gradient flows through it;
    # detached, inductor's float16/bfloat16 backward is also finite (through amax it gave
    # NaN, measured, torch 2.13 CPU).
    top = scores.amax(dim=-1, keepdim=True).detach()
    if sinks is not None:  # the sink's logit joins the max (a NaN max stays NaN)
        sink = sinks.view(1, -1, 1, 1)  # (1, H, 1, 1)
        top = torch.maximum(top, sink.detach())
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(scores - top)
    total = e.sum(dim=-1, keepdim=True)
    if sinks is not None:  # in the denominator only: the sink takes no value
        total = total + torch.exp(sink - top)
    return e / torch.where(total > 0, total, torch.ones_like(total))


# --- score variants (suite.spec.variants), in torch ops on the scores' device and dtype ---------
def vary_scores(scores: torch.Tensor, variants: Any, mask: Any = None) -> torch.Tensor:
    """scores (B, H, L, S) with ``variants`` (``suite.plugins.adapters.ScoreVariants``, tensors on the
    device) in the spec's order: cap, ALiBi and the relative table added, score_mod; the
    position variants at the rows' absolute positions in ``mask`` (an ``AttendMask``: a
    decode row at its offset, a packed token in its own sequence)."""
    L, S = scores.shape[-2:]
    if variants.softcap is not None:  # cap * tanh(score / cap): an inf score becomes +-cap
        scores = variants.softcap * torch.tanh(scores / variants.softcap)
    if variants.alibi is not None:
        scores = scores + alibi_bias(variants.alibi, L, S, mask)  # (B|1, H, L, S)
    if variants.rel_bias is not None:
        scores = scores + relative_bias(variants.rel_bias, L, S, mask)  # (B|1, H, L, S)
    if variants.score_mod is not None:
        scores = score_modified(scores, variants.score_mod, mask)
    return scores


def query_positions(align: str, L: int, S: int, like: torch.Tensor) -> torch.Tensor:
    """(L, 1) key position of each query row: i, or i + S - L bottom-right aligned."""
    offset = S - L if align == "bottom_right" else 0
    return (torch.arange(L, device=like.device, dtype=like.dtype) + offset)[:, None]


def token_positions(align: str, L: int, S: int, mask: Any, like: torch.Tensor):
    """(queries (B|1, 1, L, 1), keys (B|1, 1, 1, S)) positions in ``like``'s device and
    dtype: a decode row of batch b at ``mask.query_offset[b] + i`` (keys at their slots), a
    packed token at its index within its own sequence (``mask.segments``), else query i at
    ``query_positions``."""
    def put(a):
        return torch.as_tensor(np.asarray(a), device=like.device).to(like.dtype)

    if mask is not None and getattr(mask, "segments", None) is not None:
        seg = put(mask.segments).long()  # (B, L), L = S
        idx = torch.arange(seg.shape[1], device=like.device).expand_as(seg)
        new = torch.ones_like(seg, dtype=torch.bool)
        new[:, 1:] = seg[:, 1:] != seg[:, :-1]  # a sequence starts here
        first = torch.cummax(torch.where(new, idx, torch.zeros_like(idx)), dim=1).values
        pos = (idx - first).to(like.dtype)  # (B, L)
        return pos[:, None, :, None], pos[:, None, None, :]
    keys = torch.arange(S, device=like.device, dtype=like.dtype)[None, None, None, :]
    if mask is not None and getattr(mask, "query_offset", None) is not None:
        rows = put(mask.query_offset)[:, None] + torch.arange(L, device=like.device,
                                                              dtype=like.dtype)  # (B, L)
        return rows[:, None, :, None], keys
    return query_positions(align, L, S, like)[None, None], keys


def alibi_bias(alibi: Any, L: int, S: int, mask: Any = None) -> torch.Tensor:
    """(B|1, H, L, S): each head's slope times the convention's position term, at the
    positions ``token_positions`` gives."""
    slopes = alibi.slopes  # (H,)
    i, j = token_positions(alibi.align, L, S, mask, slopes)  # (B|1, 1, L, 1), (B|1, 1, 1, S)
    if alibi.convention == "key":  # BLOOM: the key position alone
        term = j + 0 * i
    elif alibi.convention == "distance":  # FlashAttention: -|i - j|
        term = -(i - j).abs()
    elif alibi.convention == "signed":
        term = j - i
    else:
        raise ValueError(f"alibi.convention: expected key, distance or signed, got "
                         f"{alibi.convention!r}")
    return slopes[:, None, None] * term  # (B|1, H, L, S)


def relative_bias(rel: Any, L: int, S: int, mask: Any = None) -> torch.Tensor:
    """(B|1, H, L, S): each head's table read at the bucket of the distance j - i."""
    table = rel.table  # (H, n)
    i, j = token_positions(rel.align, L, S, mask, torch.zeros((), dtype=torch.long,
                                                                 device=table.device))
    distance = (j - i)[:, 0]  # (B|1, L, S) memory - context
    if rel.bucketing == "clip":
        high = rel.max_distance if rel.bidirectional else 0
        buckets = distance.clamp(-rel.max_distance, high) + rel.max_distance
    else:
        buckets = t5_bucket(distance, rel.bidirectional, table.shape[-1], rel.max_distance)
    return table[:, buckets].transpose(0, 1)  # (B|1, H, L, S)


def t5_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int,
              max_distance: int) -> torch.Tensor:
    """Hugging Face T5's ``T5Attention._relative_position_bucket``, as it is written."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def score_modified(scores: torch.Tensor, mod: Any, mask: Any = None) -> torch.Tensor:
    """``mod.fn`` (``suite.spec.variants.ScoreMod``) on (B, H, L, S) torch scores, ``xp = torch``,
    its indices as floats of the scores' dtype; i and j are the rows' and keys' absolute
    positions (``token_positions``, top-left): a decode row at its batch's offset
    (``mask.query_offset``; keys at their cache slots), a packed token within its own
    sequence (``mask.segments``), else row i and key j."""
    B, H, L, S = scores.shape

    def index(n: int, shape: Tuple[int, ...]) -> torch.Tensor:
        return torch.arange(n, device=scores.device, dtype=scores.dtype).view(shape)

    i, j = token_positions("top_left", L, S, mask, scores.new_zeros(()))
    return mod.fn(scores, index(B, (B, 1, 1, 1)), index(H, (1, H, 1, 1)), i, j, torch)
