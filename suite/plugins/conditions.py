"""Where a declaration holds: library versions, the CPU instruction-set level, the device.

A verdict belongs to an implementation *in an environment*. A declared deviation or known
failure says where it holds with a ``Where``; it is checked only there, and everywhere else the
spec's answer is required, so a behaviour fixed in one release cannot hide another bug in an
older one. ``Where`` is also written as text in known-failure files, between braces after the
test id glob: ``{torch>=2.4,<2.5; isa=avx512; device=cpu}`` (``;`` between conditions, a
PEP 440 specifier after a distribution's name, ``|`` between alternatives of ``isa`` and
``device``).

Nothing here imports a framework: versions come from the installed distributions' metadata
and the instruction-set level from the record (``suite.plugins.isa``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from importlib import metadata
from typing import Callable, Dict, FrozenSet, Mapping, Optional, Tuple

# The levels a library may dispatch its CPU kernels to, lowest first (x86; torch's names,
# lowercase, as ATEN_CPU_CAPABILITY takes them).
ISA_LEVELS = ("default", "avx2", "avx512")
# SIMD register width in bytes at each level: ATen's Vectorized<T> is 32 bytes wide at
# "default" (its generic fallback keeps the 256-bit layout) and at avx2, 64 at avx512.
VECTOR_BYTES = {"default": 32, "avx2": 32, "avx512": 64}


class WhereError(ValueError):
    """A condition that cannot be read (one line naming it)."""


def lanes(isa: Optional[str], dtype: str) -> int:
    """Elements of one SIMD vector of the type a CPU kernel accumulates ``dtype`` in
    (float32 for float32, float16 and bfloat16; float64 for float64) at level ``isa``
    (the widest, avx512, when unknown: the bound that covers every level)."""
    width = VECTOR_BYTES.get((isa or "avx512").lower(), 64)
    return width // (8 if dtype == "float64" else 4)


@functools.cache
def installed(dist: str) -> Optional[str]:
    """The installed version of distribution ``dist`` (None when absent)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def version_in(version: Optional[str], spec: str) -> bool:
    """True when ``version`` satisfies the PEP 440 ``spec`` (a local part such as +cpu is
    ignored, so torch 2.13.0+cpu is in ``<2.14``)."""
    if version is None:
        return False
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(version.split("+", 1)[0]) in SpecifierSet(spec)


def device_kind(device: str) -> str:
    """What a device condition names: "cuda" for "cuda:1" (the index is not part of it)."""
    return device.split("[")[0].split(":")[0]


@dataclasses.dataclass(frozen=True)
class Where:
    """The environment (and, with ``when``, the problems) a declaration holds in.

    ``versions``: distribution -> PEP 440 specifier (``{"torch": "<2.5"}``);
    ``isa``: the instruction-set levels (``ISA_LEVELS``) the library dispatched to;
    ``device``: device names (``cpu``, ``cuda``); ``cpu``: CPU feature flags (as
    /proc/cpuinfo names them, e.g. ``avx512_bf16``), any of which the machine must have,
    for a behaviour of a library that picks its kernels by the CPU's features itself
    (oneDNN's bfloat16 GEMM), not by ``isa``; ``when``: a predicate on
    (problem, dtype, isa) for a behaviour that shows only on some problems (a key length
    under one vector), with ``when_text`` saying it in words. None means any."""

    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    isa: Optional[FrozenSet[str]] = None
    device: Optional[FrozenSet[str]] = None
    cpu: Optional[FrozenSet[str]] = None
    when: Optional[Callable[..., bool]] = dataclasses.field(default=None, compare=False)
    when_text: str = ""
    # The behaviour shows in some processes or on some machines and not on others where the
    # rest holds, for a reason not pinned down (a compiler's nondeterminism, code generated
    # for the host's vector ISA): a run where it held and never showed is not stale.
    intermittent: bool = False

    def __post_init__(self) -> None:
        for dist, spec in self.versions.items():
            try:
                from packaging.specifiers import SpecifierSet

                SpecifierSet(spec)
            except Exception:
                raise WhereError(f"version condition {dist}{spec}: expected a PEP 440 "
                                 "specifier such as >=2.4,<2.5") from None
        for name, levels in (("isa", self.isa), ("device", self.device), ("cpu", self.cpu)):
            if levels is not None and (isinstance(levels, str) or not levels):
                raise WhereError(f"{name}: expected a set of names, got {levels!r}")
        bad = sorted(set(self.isa or ()) - set(ISA_LEVELS))
        if bad:
            raise WhereError(f"isa: unknown level(s) {bad}; known: {', '.join(ISA_LEVELS)}")

    def holds(self, device: Optional[str] = None, isa: Optional[str] = None) -> bool:
        """True in this environment (the problem condition ``when`` aside)."""
        if self.device is not None and device_kind(device or "") not in self.device:
            return False
        if self.isa is not None and (isa or "") not in self.isa:
            return False
        if self.cpu is not None and not self.cpu & cpu_flags():
            return False
        return self.versions_hold()

    def everywhere(self) -> bool:
        """True for a condition on no environment and no problem (``intermittent`` alone)."""
        return not (self.versions or self.isa or self.device or self.cpu or self.when)

    def versions_hold(self) -> bool:
        """True when the installed distributions are in the version ranges (the other
        conditions aside: they depend on the run, the versions on the environment only)."""
        return all(version_in(installed(d), s) for d, s in self.versions.items())

    def holds_for(self, problem, dtype: str, isa: Optional[str]) -> bool:
        """True when the problem condition holds (always, without one)."""
        return self.when is None or bool(self.when(problem, dtype, isa))

    def text(self) -> str:
        """The condition in the known-failure files' syntax (without the braces)."""
        parts = [f"{d}{s}" for d, s in sorted(self.versions.items())]
        if self.isa is not None:
            parts.append("isa=" + "|".join(sorted(self.isa, key=ISA_LEVELS.index)))
        if self.device is not None:
            parts.append("device=" + "|".join(sorted(self.device)))
        if self.cpu is not None:
            parts.append("cpu=" + "|".join(sorted(self.cpu)))
        if self.when_text:
            parts.append(self.when_text)
        if self.intermittent:
            parts.append("intermittent")
        return "; ".join(parts) or "anywhere"


ANYWHERE = Where()
_CONDITION = re.compile(r"^([A-Za-z0-9_.-]+)\s*((?:[<>=!~]=?|===).*)$")


def parse(text: str) -> Where:
    """A ``Where`` from its text, e.g. ``torch>=2.4,<2.5; isa=avx2|avx512; device=cpu``."""
    versions: Dict[str, str] = {}
    named: Dict[str, FrozenSet[str]] = {}
    intermittent = False
    for part in filter(None, (p.strip() for p in text.split(";"))):
        if part == "intermittent":
            intermittent = True
            continue
        key, eq, value = part.partition("=")
        if eq and key.strip() in ("isa", "device", "cpu") and not value.startswith("="):
            named[key.strip()] = frozenset(v.strip() for v in value.split("|") if v.strip())
            continue
        m = _CONDITION.match(part)
        if not m:
            raise WhereError(f"condition {part!r}: expected DIST<specifier> (torch<2.5), "
                             "isa=LEVEL[|LEVEL], device=NAME[|NAME], cpu=FLAG[|FLAG] or "
                             "intermittent")
        versions[m.group(1)] = m.group(2).replace(" ", "")
    return Where(versions=versions, isa=named.get("isa"), device=named.get("device"),
                 cpu=named.get("cpu"), intermittent=intermittent)


@functools.cache
def cpu_flags() -> FrozenSet[str]:
    """This machine's CPU feature flags (Linux's /proc/cpuinfo; empty where it has none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def split_line(line: str) -> Tuple[str, Optional[Where], str]:
    """A known-failure line's (test id glob, condition or None, reason)."""
    head, _, reason = line.partition("#")
    head = head.strip()
    where = None
    m = re.match(r"^(\S+)\s*\{(.*)\}\s*$", head)
    if m:
        head, where = m.group(1), parse(m.group(2))
    return head, where, reason.strip()
