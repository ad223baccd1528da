"""The user's cache directory: probe results and built-in descriptions on disk, keyed by
library versions, and the folders the compile caches (inductor, JAX) write into.

Everything here is an optimisation: an unreadable, corrupt or stale entry is recomputed,
an unwritable directory is ignored, and nothing imports a framework.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Optional, TypeVar

from suite.results.environment import library_versions

CACHE_ENV = "MHA_SUITE_CACHE_DIR"  # overrides the user cache directory
# The libraries whose versions decide what a probe finds.
KEY_LIBRARIES = ("numpy", "torch", "jax", "jaxlib", "transformers", "keras", "flax")
# Environment variables that decide which devices a framework offers in a process, and the
# instruction-set level torch's kernels dispatch to (what a probe finds can differ there).
PLATFORM_ENV = ("JAX_PLATFORMS", "JAX_PLATFORM_NAME", "ATEN_CPU_CAPABILITY")
# Source folders whose content decides what a built-in declares (features, deviations).
_SOURCE_PACKAGES = ("implementations", "suite")

T = TypeVar("T")
_MISSING = object()
_MEMORY: Dict[str, Any] = {}  # name -> value, this process
READ: set = set()  # the names whose value this process read back from disk
_REFRESH = False  # refresh(): nothing is read back; every value is computed and written again


def refresh() -> None:
    """From now on in this process, compute every cached value again and overwrite it."""
    global _REFRESH
    _REFRESH = True
    _MEMORY.clear()
    READ.clear()


def cache_dir() -> Path:
    """$MHA_SUITE_CACHE_DIR, else the platform's user cache dir (~/.cache/mha-suite)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("mha-suite", appauthor=False))


def subdir(name: str) -> Path:
    """A folder in the cache directory (created; for the compile caches)."""
    path = cache_dir() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def fingerprint() -> Dict[str, Optional[str]]:
    """What a cached probe or description depends on: library versions, every installed
    distribution (a library's own dependency installed or removed changes what a probe
    finds), Python, the machine, the visible GPUs and the suite's own sources."""
    key = library_versions(KEY_LIBRARIES)
    key.update(python=platform.python_version(), machine=platform.machine(),
               cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
               # which platforms JAX starts: a run with JAX_PLATFORMS=bogus probes nothing,
               # and what it found must not be read by a run with the default platforms
               **{v.lower(): os.environ.get(v) for v in PLATFORM_ENV if os.environ.get(v)},
               nvidia_driver=str(os.path.exists("/proc/driver/nvidia/version")),
               distributions=_distributions_digest(), sources=_sources_digest())
    return key


# The suite's own metadata folder: in an editable install it lies in the source tree, which is
# on ``sys.path`` only when a run starts there (``python -m suite.cli`` from the clone, pytest's
# rootdir) and not from the ``mha-suite`` script; the sources digest stands for the suite.
_OWN_METADATA = re.compile(r"mha[_-]suite([-.].*)?\.(dist|egg)-info$", re.IGNORECASE)


def _distributions_digest() -> str:
    """The installed distributions and their versions, as their metadata folders on
    ``sys.path`` name them (``optax-0.2.4.dist-info``): a listing, no file read. The suite's
    own is left out: where a run starts must not change the key (the ``mha-suite`` script
    and ``python -m suite.cli`` in the clone described every built-in anew, 10 s, each time
    the other had written the cache)."""
    names = set()
    for entry in sys.path:
        try:
            names.update(n for n in os.listdir(entry or ".")
                         if n.endswith((".dist-info", ".egg-info"))
                         and not _OWN_METADATA.match(n))
        except OSError:
            continue
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def _sources_digest(root: Optional[Path] = None) -> str:
    digest = hashlib.sha256()
    root = root or Path(__file__).resolve().parents[2]  # the folder holding suite/, implementations/
    for package in _SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):  # every wing, every framework folder
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _path(name: str) -> Path:
    return cache_dir() / "probes" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".json")


def load(name: str, default: Any = None) -> Any:
    """The value stored under ``name`` for this fingerprint, else ``default`` (missing,
    stale or corrupt: all mean "compute it again")."""
    return load_keyed(name, fingerprint(), default)


def store(name: str, value: Any) -> None:
    """Write ``value`` (JSON) under ``name`` atomically; a failure to write is ignored."""
    _write(_path(name), {"key": fingerprint(), "value": value})


def _write(path: Path, doc: dict) -> None:
    """``doc`` as JSON at ``path``, atomically; a failure to write is ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp",
                                         delete=False) as f:
            json.dump(doc, f)
        os.replace(f.name, path)  # readers see the old file or the new one, never half
    except OSError:
        return


def load_keyed(name: str, key: Dict[str, Any], default: Any = None) -> Any:
    """Like ``load``, for a value that depends on ``key`` alone rather than on the whole
    fingerprint (no library is imported and no source read to check it)."""
    if _REFRESH:
        return default
    try:
        doc = json.loads(_path(name).read_text())
    except (OSError, ValueError):
        return default
    if not isinstance(doc, dict) or doc.get("key") != key or "value" not in doc:
        return default
    READ.add(name)
    return doc["value"]


def store_keyed(name: str, key: Dict[str, Any], value: Any) -> None:
    """Write ``value`` under ``name`` with its own ``key`` (read by ``load_keyed``)."""
    _write(_path(name), {"key": key, "value": value})


def memo(name: str, compute: Callable[[], T]) -> T:
    """``compute()`` once per process and once per fingerprint on disk (JSON values)."""
    if name in _MEMORY:
        return _MEMORY[name]
    value = load(name, _MISSING)
    if value is _MISSING:
        value = json.loads(json.dumps(compute()))  # the same types as a value read back
        store(name, value)
    _MEMORY[name] = value
    return value


# Compile caches: inductor's FX graph cache (on by default, but in /tmp) and JAX's
# persistent compilation cache (off by default), both in the user's cache directory.
# Set as environment defaults by the plugins that compile, when they are imported; a
# user's own setting wins. JAX writes every entry: attention compiles on the CPU in well under the
# default 1 s threshold.
COMPILE_CACHE_ENV = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "JAX_COMPILATION_CACHE_DIR": "jax",
}
JAX_CACHE_THRESHOLDS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
}


def enable_compile_caches() -> Dict[str, str]:
    """Point inductor and JAX at persistent caches here (unless the environment already
    does); returns the settings in effect. Call before a framework compiles."""
    try:
        for var, folder in COMPILE_CACHE_ENV.items():
            os.environ.setdefault(var, str(subdir(folder)))
    except OSError:  # an unwritable cache directory: the frameworks' own defaults
        return {}
    for var, value in JAX_CACHE_THRESHOLDS.items():
        os.environ.setdefault(var, value)
    jax = sys.modules.get("jax")
    if jax is not None:  # imported already: its flags read the environment at import
        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
        jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                          int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))
    return {k: os.environ[k] for k in (*COMPILE_CACHE_ENV, *JAX_CACHE_THRESHOLDS)}
