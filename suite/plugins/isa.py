"""CPU instruction-set levels: which a library dispatched to, and how to run a lower one.

Libraries compile their CPU kernels once per instruction set and pick one at start-up, so
a loop that only runs below one vector width exists on one CPU and not on the next. torch
reads ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``) once, at import: each level
runs in a process of its own (``mha-suite check --isa``). A plugin whose array library is
torch reports the level its process dispatched to (``Implementation.isa``); the record of
every case carries it.

Measured before it was relied on (torch 2.13.0+cpu): ``torch.backends.cpu.get_cpu_capability()``
follows the variable, and the kernels change with it (a NaN query row comes out as zeros for
key lengths under 8 at ``default``/``avx2`` and under 16 at ``avx512``: docs/repro/
torch-sdpa-nan-query-short-keys/). Not varied: XLA (jax), whose CPU code is generated per
shape by LLVM for the host, and NumPy/OpenBLAS, whose kernels are the oracle's and the
numpy built-ins' (README, "Instruction-set levels").
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
from typing import Dict, List, Optional

from suite.plugins import cache
from suite.plugins.conditions import ISA_LEVELS, installed

TORCH_ENV = "ATEN_CPU_CAPABILITY"
# The array libraries whose CPU kernels the suite can pin to a level, and the variable each reads.
DISPATCH_ENV: Dict[str, str] = {"torch": TORCH_ENV}


def dispatches(description) -> bool:
    """True for a registry description (``suite.plugins.registry.Description``, or None) of an
    implementation whose array library the suite can pin to a level."""
    return description is not None and \
        (description.array_library or description.framework) in DISPATCH_ENV


def torch_level() -> Optional[str]:
    """The level torch dispatched to in this process ("default", "avx2", "avx512", ...,
    lowercase), or None without torch. Imports torch: call it where torch runs anyway."""
    try:
        import torch
    except Exception:
        return None
    try:
        return str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:
        return None


@functools.lru_cache(maxsize=1)
def native_torch_level() -> Optional[str]:
    """The level torch picks on this CPU with no variable set. Read once in a child process
    (the variable of this one may be set, and importing torch here is not this module's
    call), then cached on disk under what decides it: the torch build and the CPU's flags
    (``mha-suite list`` answers without starting torch)."""
    key = native_level_key()
    if key is None:  # no torch installed: nothing to ask
        return None
    cached = cache.load_keyed(NATIVE_CACHE, key)
    if isinstance(cached, str) and cached:
        return cached
    level = _ask_torch()
    if level is not None:  # a failed child is asked again next time, not remembered
        cache.store_keyed(NATIVE_CACHE, key, level)
    return level


NATIVE_CACHE = "native-torch-level"


def native_level_key() -> Optional[Dict[str, str]]:
    """What torch's native level depends on: its build (version, local part included) and
    this CPU's feature flags (and the environment whose torch it is); None without torch."""
    version = installed("torch")
    if version is None:
        return None
    # The environment, not the interpreter's name: a virtual environment's ``python`` and
    # ``python3`` (the ``mha-suite`` script's and ``python -m suite.cli``'s) are one torch,
    # and keying on the name made each ask torch again (4 s) after the other had.
    return {"torch": version, "python": sys.prefix, "machine": platform.machine(),
            "cpu_flags": cpu_flags_digest()}


def cpu_flags_digest() -> str:
    """A digest of this CPU's feature flags (Linux: /proc/cpuinfo's flags line; elsewhere the
    processor's name, which is what the platform offers without a library)."""
    text = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86, arm
                    text = " ".join(sorted(line.split(":", 1)[1].split()))
                    break
    except OSError:
        pass
    text = text or f"{platform.processor()} {platform.machine()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ask_torch() -> Optional[str]:
    """The level a child process's torch reports with no variable set (None if it fails)."""
    env = {k: v for k, v in os.environ.items() if k != TORCH_ENV}
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    level = out.stdout.strip().lower()
    return level if out.returncode == 0 and level else None


def recorded_native_level() -> Optional[str]:
    """The native level for a results file's machine facts, where it costs nothing new: None
    unless torch is already imported in this process (a run that never loaded torch starts
    no child for it); torch's own level when no variable pins it, else the child's answer."""
    if "torch" not in sys.modules:
        return None
    return native_torch_level() if os.environ.get(TORCH_ENV) else torch_level()


def machine_levels() -> List[str]:
    """The levels this CPU can run torch's kernels at, lowest first: every level of
    ``ISA_LEVELS`` up to the native one (x86 only; elsewhere just the native level)."""
    native = native_torch_level()
    if native is None:
        return []
    if native not in ISA_LEVELS or platform.machine().lower() not in ("x86_64", "amd64"):
        return [native]
    return list(ISA_LEVELS[:ISA_LEVELS.index(native) + 1])


WORDS = ("all", "native", "lower")


def parse_levels(text: str) -> List[str]:
    """--isa's value: ``all`` (every level here), ``native``, ``lower`` (every level below
    the native one), or levels joined by commas."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if not words:
        raise ValueError("--isa: expected all, native, lower or levels such as default,avx2")
    bad = [w for w in words if w not in (*ISA_LEVELS, *WORDS)]
    if bad:
        raise ValueError(f"--isa: unknown level(s) {', '.join(bad)}; expected all, native, "
                         f"lower or some of {', '.join(ISA_LEVELS)}")
    return words


def env_for(level: str) -> Dict[str, str]:
    """The environment variables that pin every dispatching library to ``level``."""
    return {var: level for var in DISPATCH_ENV.values()}
