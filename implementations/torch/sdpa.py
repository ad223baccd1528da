"""torch.sdpa: ``F.scaled_dot_product_attention``, and one variant per SDPA backend.

``torch.sdpa`` lets torch choose the backend. ``backend_variants()`` registers
``torch.sdpa[flash|efficient|cudnn|math]``, each pinned with
``torch.nn.attention.sdpa_kernel`` (``torch.backends.cuda.sdp_kernel`` before torch 2.3)
and registered only where a probe call works, declaring only the devices, dtypes,
features and mask forms its probe calls ran (``FORMS``).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from implementations.torch.common import ALL_LAYOUTS, SDPA_FULLY_MASKED_NAN, TorchCore, cuda_available
from suite.plugins import cache, probes
from suite.plugins.adapters import AttendMask
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Unsupported
from suite.spec.problem import seq_lens


def _has_gqa() -> bool:
    """``enable_gqa`` arrived in torch 2.5; the builtin has no inspectable signature."""
    try:
        F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4),
                                       torch.zeros(1, 1, 1, 4), enable_gqa=True)
        return True
    except (TypeError, RuntimeError) as exc:
        probes.failed("F.scaled_dot_product_attention(enable_gqa=True)", exc)
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
    if mask.dropout:  # training mode: SDPA drops attention weights itself (dropout_p)
        kw["dropout_p"] = mask.dropout
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
    # SDPA takes value heads of their own width (E_v != E: multi-head latent attention)
    # and the decode form: rows at per-batch offsets, as a mask (SDPA has no offset of its own);
    # a packed row as a block-diagonal mask (the jagged path is torch.sdpa[jagged])
    features = TorchCore.features | {"value_width", "decode", "packed", "steps", "static_cache",
                                     "dropout"}
    layouts = ALL_LAYOUTS  # SDPA takes strided views, slices and expanded tensors as they come
    repeat_kv = not HAS_GQA
    mask_forms = SDPA_FORMS
    deviations: Dict[str, Deviation] = {
        "nan_padding": Deviation("confined", "NaN in a masked key or value position gives NaN "
                                 "rows: SDPA adds the mask to q.k^T (NaN + -inf is NaN) and "
                                 "0 * NaN is NaN in weights @ v (measured on every CPU backend, "
                                 f"torch {torch.__version__})"),
        "fully_masked_rows": SDPA_FULLY_MASKED_NAN}

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


class TorchSDPAJagged(TorchCore):
    """SDPA on nested jagged tensors (``torch.nested.nested_tensor_from_jagged``): a packed
    row's sequences become the jagged batch, their cumulative lengths its offsets, and each
    attends within itself with no mask at all (an unpacked problem: one sequence a row).
    Jagged SDPA takes no attn_mask; where it refuses a call (``is_causal`` on the CPU in
    torch 2.13: "No viable backend"), the case is unsupported with torch's reasons."""

    name = "torch.sdpa[jagged]"
    features = frozenset({"packed", "causal", "scale", "gqa", "grad"})
    repeat_kv = True  # jagged matmuls take no broadcast over heads: GQA as repeated heads

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        if not hasattr(torch.nested, "nested_tensor_from_jagged"):  # older torch in range
            raise Unsupported(f"torch {torch.__version__} has no "
                              f"torch.nested.nested_tensor_from_jagged")
        B, H, L, _ = q.shape
        seg = mask.segments if mask.segments is not None else np.zeros((B, L), np.int64)
        lens = [n for row in seq_lens(seg) for n in row]
        offsets = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), device=q.device)

        def jagged(x):  # (B, H, L, d) -> (sequences, H, j, d)
            rows = x.permute(0, 2, 1, 3).reshape(B * L, x.shape[1], x.shape[3])
            return torch.nested.nested_tensor_from_jagged(rows, offsets).transpose(1, 2)

        causal = "causal" in mask.kinds
        # torch logs each backend's refusal at WARNING on every call (eight lines a call in
        # a sweep's terminal), and on the first jagged tensor a note on its own fx tracing
        # check: read here (the refusals as a refused call's reason), not printed.
        with _held_log("torch.nested._internal.sdpa", "torch.fx._symbolic_trace") as said:
            try:
                out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v),
                                                     is_causal=causal, scale=scale)
            except RuntimeError as exc:
                if "No viable backend" not in str(exc):
                    raise
                why = "; ".join(dict.fromkeys(m for m in said if "not used because" not in m))
                raise Unsupported(f"{self.name}: torch {torch.__version__} runs no kernel for "
                                  f"this call ({why or 'torch gave no reason'})") from None
        heads = out.transpose(1, 2).values()  # (B*L, H, V)
        return heads.reshape(B, L, H, -1).permute(0, 2, 1, 3), None


@contextlib.contextmanager
def _held_log(*names: str) -> Iterator[List[str]]:
    """What the loggers ``names`` say while the block runs, one line a record, kept from
    their handlers (torch's own words, for a reason; not printed)."""
    import logging

    said: List[str] = []

    def hold(record: logging.LogRecord) -> bool:
        said.append(" ".join(record.getMessage().split()))
        return False

    logs = [logging.getLogger(name) for name in names]
    for log in logs:
        log.addFilter(hold)
    try:
        yield said
    finally:
        for log in logs:
            log.removeFilter(hold)


BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
# Mask kinds that reach SDPA as a float attn_mask (everything but is_causal alone).
MASKED = frozenset({"valid_lens", "causal_bottom_right", "bool_mask", "bias", "decode",
                    "packed", "steps", "static_cache"})  # (a chunk's rows over its cache: a mask)
# torch < 2.3 has no torch.nn.attention.sdpa_kernel: its context manager takes one flag
# per backend (cudnn has none there).
LEGACY_FLAGS = {"flash": "enable_flash", "efficient": "enable_mem_efficient", "math": "enable_math"}


def kernel_context(short: str) -> Optional[Callable[[], Any]]:
    """A factory of the context that pins SDPA backend ``short``, by what this torch has:
    ``torch.nn.attention.sdpa_kernel`` (2.3 on) or ``torch.backends.cuda.sdp_kernel``
    (flags, before it); None when neither can name that backend."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        legacy = getattr(torch.backends.cuda, "sdp_kernel", None)
        if legacy is None or short not in LEGACY_FLAGS:
            return None
        flags = {f: f == LEGACY_FLAGS[short] for f in LEGACY_FLAGS.values()}
        return functools.partial(legacy, **flags)
    backend = getattr(SDPBackend, BACKENDS[short], None)
    return None if backend is None else functools.partial(sdpa_kernel, backend)


# What a backend is probed for, one tiny call each (q (1, 2, 8, 16)): "plain" decides
# whether it runs at all in a dtype; the rest decide each declared feature or mask form.
# A backend that refuses one (flash on the CPU of torch 2.4/2.5 takes no broadcast mask,
# no GQA, no gradient through a masked call: "No available kernel") leaves it undeclared,
# so those cases are unsupported, never errors.
FORMS = ("plain", "causal", "mask", "mask_broadcast", "mask_strided", "gqa", "grad", "grad_mask",
         "qkv_strided", "value_width", "dropout")
# Layouts whose q/k/v last dimension is strided (suite.spec.layouts): a backend that refuses
# "qkv_strided" (flash on the CPU: "No available kernel") does not declare them.
LAST_STRIDED_LAYOUTS = frozenset({"last_strided", "channels_last"})


def _probe_form(context: Callable[[], Any], device: str, dtype: torch.dtype, form: str) -> bool:
    """True when backend ``context`` runs ``form`` (a name in FORMS) on device and dtype."""
    try:
        grad = form.startswith("grad")
        q = torch.randn(1, 2, 8, 16, device=device, dtype=dtype, requires_grad=grad)
        k = v = q
        kw: Dict[str, Any] = {}
        if form == "causal":
            kw["is_causal"] = True
        elif form in ("mask", "grad_mask"):
            kw["attn_mask"] = torch.zeros(1, 2, 8, 8, device=device, dtype=dtype)  # (B, H, L, S)
        elif form == "mask_broadcast":
            kw["attn_mask"] = torch.zeros(1, 1, 1, 8, device=device, dtype=dtype)  # (1, 1, 1, S)
        elif form == "mask_strided":  # a (B, H, L, S) view whose last dimension is not contiguous
            kw["attn_mask"] = torch.zeros(1, 2, 8, 8, device=device, dtype=dtype).transpose(-1, -2)
        elif form == "qkv_strided":  # q, k, v (B, H, L, D) whose last dimension is strided
            q = k = v = torch.randn(1, 2, 16, 8, device=device, dtype=dtype).transpose(-1, -2)
        elif form == "dropout":  # training mode: the backend draws its own dropout
            kw["dropout_p"] = 0.5
        elif form == "value_width":  # value heads twice as wide as query/key heads
            v = torch.randn(1, 2, 8, 32, device=device, dtype=dtype)
        elif form == "gqa":
            k = v = torch.randn(1, 1, 8, 16, device=device, dtype=dtype)  # (B, K=1, S, D)
            if HAS_GQA:
                kw["enable_gqa"] = True
            else:  # the plugin repeats kv heads itself: that is the call the backend sees
                k = v = k.repeat_interleave(2, dim=1)  # (B, H, S, D)
        with context(), warnings.catch_warnings():  # "kernel not used because": the answer
            warnings.simplefilter("ignore")
            out = F.scaled_dot_product_attention(q, k, v, **kw)
            if grad:
                out.sum().backward()
        return bool(torch.isfinite(out).all())
    except RuntimeError as exc:  # "No available kernel" and its kin: not run here
        probes.failed(f"an SDPA {form} call ({dtype}, {device})", exc)
        return False


def _probe_backends() -> Dict[str, Dict[str, Any]]:
    """Per SDPA backend that runs on some device here: its dtypes per device and the forms
    (FORMS) it runs in float32 (or its first dtype) on every device it runs on."""
    devices = ["cpu"] + ([f"cuda:{i}" for i in range(torch.cuda.device_count())]
                         if cuda_available() else [])
    found: Dict[str, Dict[str, Any]] = {}
    for short in BACKENDS:
        context = kernel_context(short)
        if context is None:
            continue
        dtypes: Dict[str, Sequence[str]] = {}
        forms = set(FORMS[1:])
        for dev in devices:
            ok = [n for n, t in (("float32", torch.float32), ("float16", torch.float16),
                                 ("bfloat16", torch.bfloat16), ("float64", torch.float64))
                  if _probe_form(context, dev, t, "plain")]
            if ok:
                dtypes[dev] = ok
                t = torch.float32 if "float32" in ok else getattr(torch, ok[0])
                forms &= {f for f in FORMS[1:] if _probe_form(context, dev, t, f)}
        if dtypes:
            found[short] = {"dtypes": dtypes, "forms": sorted(forms)}
    return found


def declared(forms: Sequence[str]) -> frozenset:
    """The features a backend that runs ``forms`` declares (of TorchSDPA's)."""
    features = set(TorchSDPA.features)
    if "mask" not in forms:
        features -= MASKED
    if "causal" not in forms:
        features -= {"causal"}
    if "gqa" not in forms:
        features -= {"gqa"}
    if "grad" not in forms:
        features -= {"grad"}
    if "value_width" not in forms:
        features -= {"value_width"}
    if "dropout" not in forms:
        features -= {"dropout"}
    return frozenset(features)


def backend_variants() -> List[type]:
    """One class per SDPA backend that works on some device here, declaring only what its
    probes ran (probed once per process and cached on disk per library versions)."""
    out = []
    for short, found in cache.memo(f"torch.sdpa backends:{','.join(FORMS)}", _probe_backends).items():
        context = kernel_context(short)
        if context is not None:
            out.append(_variant(short, context, found["dtypes"], found["forms"]))
    return out


def _variant(short: str, context: Callable[[], Any], dtypes: Dict[str, Sequence[str]],
             forms: Sequence[str]) -> type:
    class Variant(TorchSDPA):
        name = f"torch.sdpa[{short}]"
        runs = frozenset(forms)
        contracts = (Contract("agrees_with_dispatch", "agrees", "torch.sdpa",
                              f"the {short} kernel computes what SDPA's own choice of kernel "
                              f"does"),)

        def devices(self) -> List[str]:
            return list(dtypes)

        def dtypes(self, device: str) -> Sequence[str]:
            return dtypes.get(device, ())

        def backend(self):
            return context()

        def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
            refused = refused_form(self.runs, q, mask)
            if refused:
                raise Unsupported(f"{self.name} does not run {refused} on torch "
                                  f"{torch.__version__} (its probe call raised)")
            try:
                return super().attend(q, k, v, mask, scale, need_weights)
            except RuntimeError as exc:
                if NO_KERNEL not in str(exc):
                    raise
                why = refusal(lambda: super(Variant, self).attend(q, k, v, mask, scale, False))
                raise Unsupported(f"{self.name}: torch {torch.__version__} has no {short} kernel "
                                  f"for this call ({why})") from None

    Variant.features = declared(forms)
    if "qkv_strided" not in forms:
        Variant.layouts = TorchSDPA.layouts - LAST_STRIDED_LAYOUTS
    Variant.__name__ = Variant.__qualname__ = f"TorchSDPA_{short}"
    return Variant


# What SDPA raises when the backend a context pins cannot take a call; the reasons come as
# warnings ("Memory efficient kernel not used because: ...") just before it.
NO_KERNEL = "No available kernel"


def refusal(call: Callable[[], Any]) -> str:
    """Why the pinned backend refused ``call``: the reasons torch warned of as it did, run
    again (only after a refusal: the timed path records no warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except RuntimeError:
            pass
    said = [" ".join(str(w.message).split(" (Triggered internally")[0].split()) for w in caught]
    reasons = [m for m in said if "not used because" not in m] or said
    return "; ".join(dict.fromkeys(reasons)) or "torch gave no reason"


def refused_form(runs: frozenset, q: torch.Tensor, mask: AttendMask) -> Optional[str]:
    """The form of this call (q (B, H, L, D)) that the backend's probes did not run, or None:
    a mask that broadcasts over batch, heads or queries, a mask whose last dimension is not
    contiguous (a broadcast bias laid out by the toolkit), or a gradient through a mask."""
    if mask.bias is None or mask.causal_only:
        return None
    if "mask_strided" not in runs and mask.bias.stride(-1) != 1:
        return "an attn_mask whose last dimension is not contiguous"
    if "mask_broadcast" not in runs and any(m == 1 and n > 1 for m, n in
                                           zip(mask.bias.shape[:3], q.shape[:3])):
        return "a broadcast attn_mask"
    if "grad_mask" not in runs and q.requires_grad:
        return "a gradient through an attn_mask"
    return None
