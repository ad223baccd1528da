"""Workers for NumPy kernels: a small thread pool with BLAS held to one thread, and the
memory they reuse across calls (per-thread buffers, named workspaces).

NumPy runs its elementwise passes on one core and BLAS runs its own threads; a kernel
that spreads its work units over these workers, with BLAS on one thread while they run,
keeps every core busy with one thing at a time (a multi-threaded BLAS call leaves its
threads spinning through the elementwise work that follows, taking a core).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import numpy as np


class Workers:
    """``num_threads`` workers (default: the CPU count), started on first use."""

    def __init__(self, num_threads: Optional[int] = None, name: str = "numpy-workers"):
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads: expected a positive int or None, got {num_threads!r}")
        self.num_threads = num_threads or os.cpu_count() or 1
        self._name = name
        self._pool: Optional[ThreadPoolExecutor] = None
        self._blas = None
        self.local = threading.local()  # per-thread state (tile buffers, scratch)
        self._work: Dict[str, np.ndarray] = {}  # named intermediates, kept across calls

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> None:
        """fn over items on the pool (in this thread when one worker suffices)."""
        items = list(items)
        if len(items) > 1 and self.num_threads > 1:
            list(self._executor().map(fn, items))
        else:
            for item in items:
                fn(item)

    def one_blas_thread(self):
        """Hold BLAS to one thread while the workers run (each worker is one core)."""
        if self.num_threads <= 1:
            return nullcontext()
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # threadpoolctl is a dependency; without it BLAS threads stay
            return nullcontext()
        if self._blas is None:
            self._blas = ThreadpoolController()
        return self._blas.limit(limits=1, user_api="blas")

    def workspace(self, name: str, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
        """A named intermediate, reused while its shape and dtype repeat: fresh arrays of
        the size of a run's intermediates cost page faults on every call (2-6 ms at
        L = 1024)."""
        a = self._work.get(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            self._work.pop(name, None)  # free the old one before allocating
            a = self._work[name] = np.empty(shape, dtype)
        return a

    def scratch(self, shape: Tuple[int, int], dtype: Any) -> np.ndarray:
        """This thread's (rows, cols) scratch array, grown as needed."""
        a = getattr(self.local, "scratch", None)
        if a is None or a.dtype != dtype or a.size < shape[0] * shape[1]:
            a = self.local.scratch = np.empty(shape[0] * shape[1], dtype)
        return a[:shape[0] * shape[1]].reshape(shape)

    def cached(self, key: Tuple, make: Callable[[], Any], keep: int = 4) -> Any:
        """This thread's object for ``key`` (``make()`` the first time), the last ``keep``
        keys kept."""
        objs = getattr(self.local, "objs", None)
        if objs is None:
            objs = self.local.objs = {}
        obj = objs.pop(key, None) or make()
        objs[key] = obj  # most recently used last
        while len(objs) > keep:
            objs.pop(next(iter(objs)))
        return obj

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix=self._name)
        return self._pool
