"""triton.flash: the suite's own Triton FlashAttention kernels, forward and backward
(``triton_kernels``; the backward through a ``torch.autograd.Function``, so gradients reach the
projections by torch autograd).

On a CUDA GPU it is compiled and runs as a normal kernel (device ``cuda:i``, swept). Without
one it runs under Triton's interpreter on torch CPU tensors: device ``cpu-interpret``,
checked by conformance, never timed (``suite.plugins.interface.interpreted``).

Triton 3.9 decides interpreter or compiler when ``@triton.jit`` decorates a kernel (it reads
``TRITON_INTERPRET`` through ``triton.knobs.runtime.interpret``), so this module sets
``TRITON_INTERPRET=1`` before importing the kernel module when torch sees no CUDA device; it
stays set for the process, so Triton kernels defined after it (a user's plugin) are
interpreted too. With a GPU it is left as the user set it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Sequence, Tuple

import torch

from implementations.torch.common import TORCH_DTYPES, TorchCore
from suite.plugins.adapters import AttendMask
from suite.plugins.conditions import Where
from suite.plugins.declarations import Deviation
from suite.plugins.interface import INTERPRETED_CPU, Unavailable, interpreted
from suite.spec.problem import Problem

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit of ours runs: see above

try:
    import triton

    from implementations.kernels import triton_kernels as triton_kernels
except ImportError as exc:  # the extra is not installed: listed as unavailable
    triton = triton_kernels = None
    _IMPORT_ERROR = f"triton is not installed (pip install 'mha-suite[triton]'): {exc}"

def helpers_interpreted() -> bool:
    """True when Triton's own @jit helpers were decorated for the interpreter (Triton decides
    once, when ``triton.language`` is first imported in the process)."""
    import triton.language.standard as std

    helper = getattr(std, "max", None)
    return helper is None or "Interpreted" in type(helper).__name__


# Block sizes: 64 x 64 on a GPU; under the interpreter each block is a NumPy step, so fewer,
# larger blocks are faster, but 32 still crosses block edges in the conformance shapes.
GPU_BLOCKS = (64, 64)
INTERPRET_BLOCKS = (32, 32)


class TritonCore(TorchCore):
    """A Triton kernel on torch tensors: compiled on CUDA devices, interpreted on the CPU
    (device ``cpu-interpret``) when torch sees no GPU. Subclasses write ``attend``; import
    this module before defining the kernel so ``TRITON_INTERPRET`` is set in time."""

    framework = "triton"
    array_library = "torch"

    def __init__(self) -> None:
        if triton is None:
            raise Unavailable(_IMPORT_ERROR)
        if os.environ.get("TRITON_INTERPRET") == "1" and not helpers_interpreted():
            raise Unavailable("triton was imported in this process before TRITON_INTERPRET=1 "
                              "was set (torch.compile's has_triton imports it), so its own "
                              "helpers (tl.max, tl.sum) cannot run under the interpreter: set "
                              "TRITON_INTERPRET=1 in the environment before starting")

    def framework_version(self) -> str:
        return triton.__version__

    def devices(self) -> List[str]:
        if os.environ.get("TRITON_INTERPRET") == "1":
            return [INTERPRETED_CPU]
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]

    def dtypes(self, device: str) -> Sequence[str]:
        return ("float32", "float16", "bfloat16")

    def target(self, device: str, dtype: str) -> Tuple[torch.device, torch.dtype]:
        if dtype not in self.dtypes(device):
            raise ValueError(f"dtype: expected one of {list(self.dtypes(device))}, got {dtype!r}")
        if device not in self.devices():
            raise ValueError(f"device: expected one of {self.devices()}, got {device!r}")
        return torch.device("cpu" if interpreted(device) else device), TORCH_DTYPES[dtype]


class TritonFlash(TritonCore):
    name = "triton.flash"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "cross", "gqa",
                          "scale", "grad"})
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN value at a key the causal mask hides from a row, inside a key block "
                    "the row reads, reaches that row: the masked weight is 0 and 0 * NaN is NaN "
                    "in tl.dot(p, v) (measured, special_values/nan_value_causal, interpreted, "
                    "triton 3.9.0); keys past a row's length are never loaded"),
        "float32_dots": Deviation(
            "tf32", "on a GPU tl.dot takes float32 operands as TF32 (its default input "
                    "precision; measured on an NVIDIA H200, triton 3.6.0); the interpreter "
                    "multiplies in float32", Where(device=frozenset({"cuda"})))}
    memory_model = "linear"
    repeat_kv = False  # the kernel maps query head h to kv head h // (H // K) itself
    kernels = triton_kernels  # the module holding the kernels (a test swaps in a variant)

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        state = super().prepare(problem, device, dtype, need_weights=need_weights, grad=grad)
        m = problem.mask
        lens = None
        if m.valid_lens is not None:  # (B,) or (B, L) -> (B, L) int32, one length per row
            vl = torch.as_tensor(m.valid_lens, dtype=torch.int32).reshape(problem.B, -1)
            lens = vl.expand(problem.B, problem.L).contiguous().to(state["device"])
        state["kernel_mask"] = {
            "causal": m.causal,
            "offset": 0 if m.causal_align == "top_left" else problem.S - problem.L,
            "lens": lens,
        }
        state["interpreted"] = interpreted(device)
        state["blocks"] = INTERPRET_BLOCKS if interpreted(device) else GPU_BLOCKS
        return state

    def forward(self, state: Dict[str, Any]):
        self._kernel_state = state  # ``attend`` needs the kernel's own mask terms
        return super().forward(state)

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        state = self._kernel_state
        km = state["kernel_mask"]
        lens = km["lens"]
        has_lens = lens is not None
        if not has_lens:  # unused by the kernels; a pointer is still passed
            lens = torch.zeros(1, dtype=torch.int32, device=q.device)
        maxlen = lens.amax(dim=1).to(torch.int32) if has_lens else lens
        launch = _Launch(kernels=self.kernels, lens=lens, maxlen=maxlen, has_lens=has_lens,
                         causal=km["causal"], offset=km["offset"], scale=scale,
                         blocks=state["blocks"],
                         dot_f32=state["interpreted"] and q.dtype == torch.bfloat16)
        return _FlashAttention.apply(q, k, v, launch), None  # (B, H, L, D)


@dataclasses.dataclass(frozen=True)
class _Launch:
    """What the kernels take besides q, k, v: the module holding them, the mask terms, the
    softmax scale, block sizes and whether ``tl.dot`` gets float32 operands."""

    kernels: Any
    lens: torch.Tensor  # (B, L) int32, or a 1-element placeholder when has_lens is False
    maxlen: torch.Tensor  # (B,) int32: the longest row length of each batch item
    has_lens: bool
    causal: bool
    offset: int  # key j visible to query i iff j <= i + offset
    scale: float
    blocks: Tuple[int, int]  # (BLOCK_M, BLOCK_N)
    dot_f32: bool

    def common(self, L: int, S: int, D: int, H: int, K: int) -> Tuple[tuple, Dict[str, Any]]:
        """The trailing positional and the constexpr arguments every kernel shares."""
        block_m, block_n = self.blocks
        args = (self.lens, self.maxlen, L, S, D, H, H // K, self.scale, self.offset)
        return args, dict(CAUSAL=self.causal, HAS_LENS=self.has_lens, DOT_F32=self.dot_f32,
                          BLOCK_M=block_m, BLOCK_N=block_n,
                          BLOCK_D=max(16, triton.next_power_of_2(D)))  # tl.dot needs >= 16


class _FlashAttention(torch.autograd.Function):
    """Attention heads by ``flash_forward``; its backward by ``flash_backward_dkdv`` and
    ``flash_backward_dq`` from the saved row log-sum-exp (FlashAttention-2, Algorithm 2)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                launch: _Launch) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # (B, H|K, L|S, D)
        B, H, L, D = q.shape
        K, S = k.shape[1], k.shape[2]
        out = torch.empty_like(q)  # (B, H, L, D)
        lse = torch.empty((B, H, L), dtype=torch.float32, device=q.device)  # (B, H, L)
        args, consts = launch.common(L, S, D, H, K)
        grid = (triton.cdiv(L, consts["BLOCK_M"]), B * H)
        launch.kernels.flash_forward[grid](q, k, v, out, lse, *args, **consts)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.launch = launch
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        launch = ctx.launch
        B, H, L, D = q.shape
        K, S = k.shape[1], k.shape[2]
        d_out = d_out.contiguous()  # (B, H, L, D)
        delta = (d_out.float() * out.float()).sum(-1).contiguous()  # (B, H, L) rowsum(dO * O)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        args, consts = launch.common(L, S, D, H, K)
        launch.kernels.flash_backward_dkdv[(triton.cdiv(S, consts["BLOCK_N"]), B * K)](
            q, k, v, d_out, lse, delta, dk, dv, *args, **consts)
        launch.kernels.flash_backward_dq[(triton.cdiv(L, consts["BLOCK_M"]), B * H)](
            q, k, v, d_out, lse, delta, dq, *args, **consts)
        return dq, dk, dv, None
