"""torch.sdpa: ``F.scaled_dot_product_attention``, and one variant per SDPA backend.

``torch.sdpa`` lets torch choose the backend. ``backend_variants()`` registers
``torch.sdpa[flash|efficient|cudnn|math]``, each pinned with
``torch.nn.attention.sdpa_kernel`` and registered only where a probe call works,
with only the devices and mask kinds that backend accepts.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Sequence

import torch
import torch.nn.functional as F

from implementations.torch_common import TorchCore, cuda_available
from suite import cache
from suite.adapters import AttendMask
from suite.plugin import Deviation


def _has_gqa() -> bool:
    """``enable_gqa`` arrived in torch 2.5; the builtin has no inspectable signature."""
    try:
        F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4),
                                       torch.zeros(1, 1, 1, 4), enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


HAS_GQA = _has_gqa()


# Mask forms SDPA takes natively: attn_mask broadcastable to (B, H, L, S), boolean (True =
# attend) or additive float, 2-D or 4-D with any broadcast axis (a key axis of 1 included),
# and is_causal (which SDPA refuses beside an attn_mask).
SDPA_FORMS = frozenset({f"{kind}_{shape}" for kind in ("bool", "float")
                        for shape in ("BHLS", "B1LS", "11LS", "B11S", "BHL1", "LS")}
                       | {"causal_flag"})


def _sdpa(q, k, v, mask: AttendMask, scale: float) -> torch.Tensor:
    kw = {"scale": scale}
    if HAS_GQA and q.shape[1] != k.shape[1]:
        kw["enable_gqa"] = True
    if mask.form_name:  # the mask form asked for, as the library takes it
        if mask.form.attn is not None:
            kw["attn_mask"] = mask.form.attn
        return F.scaled_dot_product_attention(q, k, v, is_causal=mask.form_name == "causal_flag",
                                              **kw)
    if mask.causal_only:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
    if mask.bias is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    # A float mask carries both the bias and -inf where masked; values go in untouched, so
    # NaN padding shows as the library handles it (the declared nan_padding deviation).
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bias, **kw)


class TorchSDPA(TorchCore):
    name = "torch.sdpa"
    repeat_kv = not HAS_GQA
    mask_forms = SDPA_FORMS
    deviations: Dict[str, Deviation] = {
        "nan_padding": Deviation("confined", "NaN in a masked key or value position gives NaN "
                                 "rows: SDPA adds the mask to q.k^T (NaN + -inf is NaN) and "
                                 "0 * NaN is NaN in weights @ v (measured on every CPU backend, "
                                 f"torch {torch.__version__})")}

    repro_code = """
        import torch
        import torch.nn.functional as F


        def attend(q, k, v, allowed, bias, scale):
            t = lambda a: torch.from_numpy(a).to(DEVICE, getattr(torch, DTYPE))  # noqa: E731
            kw = {"scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
            if bias is not None:
                kw["attn_mask"] = t(bias)  # the bias with -inf where not allowed
            out = F.scaled_dot_product_attention(t(q), t(k), t(v), **kw)
            return out.to("cpu", torch.float64).numpy()
    """

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        with self.backend():
            return _sdpa(q, k, v, mask, scale), None

    def backend(self):
        return contextlib.nullcontext()


BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
# What each backend accepts beyond plain attention (masks other than is_causal need a
# float attn_mask, which flash does not take).
MASKED = frozenset({"valid_lens", "causal_bottom_right", "bool_mask", "bias"})


def _probe(backend, device: str, dtype: torch.dtype, masked: bool) -> bool:
    """True when a tiny call with this backend works on this device and dtype."""
    from torch.nn.attention import sdpa_kernel

    try:
        q = torch.randn(1, 2, 8, 16, device=device, dtype=dtype)
        mask = torch.zeros(1, 1, 8, 8, device=device, dtype=dtype) if masked else None
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return True
    except RuntimeError:
        return False


def _probe_backends() -> Dict[str, Dict[str, Any]]:
    """Per SDPA backend that works on some device here: its dtypes per device and whether
    it takes a float mask."""
    from torch.nn.attention import SDPBackend

    devices = ["cpu"] + ([f"cuda:{i}" for i in range(torch.cuda.device_count())]
                         if cuda_available() else [])
    found: Dict[str, Dict[str, Any]] = {}
    for short, attr in BACKENDS.items():
        backend = getattr(SDPBackend, attr, None)
        if backend is None:
            continue
        dtypes: Dict[str, Sequence[str]] = {}
        masked_ok = True
        for dev in devices:
            ok = [n for n, t in (("float32", torch.float32), ("float16", torch.float16),
                                 ("bfloat16", torch.bfloat16), ("float64", torch.float64))
                  if _probe(backend, dev, t, masked=False)]
            if ok:
                dtypes[dev] = ok
                masked_ok &= _probe(backend, dev, torch.float32 if "float32" in ok
                                    else torch.float16, masked=True)
        if dtypes:
            found[short] = {"dtypes": dtypes, "masked": masked_ok}
    return found


def backend_variants() -> List[type]:
    """One class per SDPA backend that works on some device here (probed once per process
    and cached on disk per library versions)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for short, found in cache.memo("torch.sdpa backends", _probe_backends).items():
        features = TorchSDPA.features - {"grad"} | ({"grad"} if short != "cudnn" else set())
        if not found["masked"]:
            features = features - MASKED
        out.append(_variant(short, getattr(SDPBackend, BACKENDS[short]), found["dtypes"],
                            frozenset(features), sdpa_kernel))
    return out


def _variant(short: str, backend, dtypes: Dict[str, Sequence[str]], features: frozenset,
             sdpa_kernel) -> type:
    class Variant(TorchSDPA):
        name = f"torch.sdpa[{short}]"

        def devices(self) -> List[str]:
            return list(dtypes)

        def dtypes(self, device: str) -> Sequence[str]:
            return dtypes.get(device, ())

        def backend(self):
            return sdpa_kernel(backend)

    Variant.features = features
    Variant.__name__ = Variant.__qualname__ = f"TorchSDPA_{short}"
    return Variant

