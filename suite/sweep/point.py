"""One sweep point, named with the canonical problem's letters.

B batch, L query length, S key/value length, H query heads, K key/value heads, D head
width, E = H·D model width; plus dtype, mask, device and grad. The grid builds these,
the point's problem, FLOPs, memory prediction, resume keys and every results file's
``extra_info`` all use them, so one quantity has one name everywhere.

Results files written before these names keep their old ones (``Lq``, ``Lk``, ``H_kv``,
``length``, ``kv_heads``, mask ``padding``); ``normalise`` maps them, so old files stay
readable and resumable.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Tuple

# Sweep masks and the implementation feature each needs.
MASK_FEATURE = {"none": None, "causal": "causal", "valid_lens": "valid_lens"}
MASKS = tuple(MASK_FEATURE)
MASK_ALIASES = {"padding": "valid_lens"}  # the name results files used before

# Old names of the same quantities -> the letters.
OLD_NAMES = {"Lq": "L", "length": "L", "Lk": "S", "H_kv": "K", "kv_heads": "K",
             "num_kv_heads": "K", "batch": "B", "head_dim": "D"}
KEY_FIELDS = ("impl", "device", "dtype", "B", "H", "K", "L", "S", "D", "mask", "grad")


@dataclasses.dataclass(frozen=True)
class Point:
    """A grid point: self-attention when S == L; K == H unless grouped (GQA/MQA)."""

    B: int
    L: int
    H: int
    D: int
    S: int = 0  # 0: S = L
    K: int = 0  # 0: K = H
    dtype: str = "float32"
    mask: str = "none"
    device: str = "cpu"
    grad: bool = False

    def __post_init__(self) -> None:
        if not self.S:
            object.__setattr__(self, "S", self.L)
        if not self.K:
            object.__setattr__(self, "K", self.H)
        object.__setattr__(self, "mask", MASK_ALIASES.get(self.mask, self.mask))
        if self.mask not in MASK_FEATURE:
            raise ValueError(f"mask: expected one of {', '.join(MASKS)}, got {self.mask!r}")
        if self.H % self.K:
            raise ValueError(f"K (kv heads) {self.K} does not divide H (heads) {self.H}")

    @property
    def E(self) -> int:
        return self.H * self.D

    @property
    def causal(self) -> bool:
        return self.mask == "causal"

    def info(self) -> Dict[str, Any]:
        """The point's fields as ``extra_info`` records them (E included)."""
        return {**dataclasses.asdict(self), "E": self.E}

    def id(self) -> str:
        return (f"{self.dtype}-L{self.L}" + (f"-S{self.S}" if self.S != self.L else "")
                + f"-H{self.H}" + (f"-K{self.K}" if self.K != self.H else "")
                + f"-B{self.B}-D{self.D}-{self.mask}" + ("-grad" if self.grad else ""))


def normalise(info: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``info`` with old names replaced by the letters (a letter already there
    wins); an old file's missing S or K filled from L or H."""
    out = {k: v for k, v in info.items() if k not in OLD_NAMES}
    for old, new in OLD_NAMES.items():
        if old in info and out.get(new) is None:
            out[new] = info[old]
    if out.get("mask") in MASK_ALIASES:
        out["mask"] = MASK_ALIASES[out["mask"]]
    if out.get("S") is None and out.get("L") is not None:
        out["S"] = out["L"]
    if out.get("K") is None and out.get("H") is not None:
        out["K"] = out["H"]
    return out


def point_key(info: Dict[str, Any]) -> Tuple:
    """Identity of a measured point (for --resume and merging), from either naming."""
    info = normalise(info)
    return tuple(info.get(k) for k in KEY_FIELDS)
