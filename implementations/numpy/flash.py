"""NumPy FlashAttention: tiled attention with an online softmax, memory linear in length.

The adapter: ``NumpyCore``'s translation with the mask kept in its parts (its
``attention_mask`` hook gives a ``numpy_tiles.TileMask``, so no (B, H, L, S) array is
built), and a forward whose every matmul runs on a small thread pool with BLAS held to
one thread (``numpy_workers.Workers``), so the exp2 passes, which NumPy runs on one core,
are spread over the cores as well as the matmuls. The tiled online softmax itself
(FlashAttention, Dao et al., 2022: masked tiles skipped, causal diagonal strips, base-2
logits, a lazy row max) is ``numpy_tiles.TiledAttention``.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Tuple

import numpy as np

from implementations.numpy.mha import NumpyCore
from implementations.numpy.tiles import BLOCK_DIAG, TiledAttention, TileMask, compute_dtype, stage, tile_mask
from implementations.numpy.workers import Workers
from suite.plugins.declarations import Deviation
from suite.spec.problem import Problem


class NumpyFlashMHA(NumpyCore):
    """FlashAttention's tiled online softmax in NumPy: O(L) memory, masked tiles skipped.

    ``block_q`` / ``block_k`` are the query / key tile lengths and ``heads_per_unit`` the
    heads one batched matmul covers (None: ``TILES``, or ``CAUSAL_TILES`` for a causal
    mask), ``block_diag`` the query rows of a causal diagonal strip, ``num_threads`` the
    worker count (default: the CPU count); all may be set per instance (tests use small
    tiles).
    """

    name = "numpy.flash"
    # No "weights": returning (B, H, L, S) would undo the point of the algorithm.
    features = NumpyCore.features
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN or inf value at a key masked for some rows of a key tile the kernel "
                    "visits reaches those rows: their weight there is 0 and 0 * NaN is NaN in "
                    "p @ v (tiles masked for every row are skipped; measured, special_values "
                    "cases)")}
    memory_model = "linear"  # the sweep's memory prediction: no (B, H, L, S) array

    def __init__(self, block_q: Optional[int] = None, block_k: Optional[int] = None,
                 num_threads: Optional[int] = None, heads_per_unit: Optional[int] = None,
                 block_diag: int = BLOCK_DIAG):
        for arg, val in (("block_q", block_q), ("block_k", block_k),
                         ("heads_per_unit", heads_per_unit), ("block_diag", block_diag)):
            if val is None and arg != "block_diag":
                continue
            if not isinstance(val, (int, np.integer)) or val < 1:
                raise ValueError(f"{arg}: expected a positive int, got {val!r}")
        self.workers = Workers(num_threads, name="numpy-flash")  # checks num_threads
        self.block_q = None if block_q is None else int(block_q)
        self.block_k = None if block_k is None else int(block_k)
        self.heads_per_unit = None if heads_per_unit is None else int(heads_per_unit)
        self.block_diag = int(block_diag)
        self.num_threads = self.workers.num_threads
        self.kernel = TiledAttention(self.workers, self.block_q, self.block_k,
                                     self.heads_per_unit, self.block_diag)
        self._run_lock = threading.Lock()

    def attention_mask(self, problem: Problem, dtype: type) -> TileMask:
        """The mask in its canonical parts (nothing of size L*S), the bias in the tiles'
        compute dtype."""
        return tile_mask(problem, compute_dtype(dtype))

    def run(self, s: Dict[str, Any]) -> Tuple[np.ndarray, None]:
        """NumpyCore's forward, with every matmul on the workers and BLAS on one thread.

        Calling multi-threaded BLAS for the projections would leave its own worker
        spinning through the attention core that follows, taking a core from the workers. The
        three input projections are one batch of row chunks: k is projected straight into
        its transposed layout, v chunks are staged into theirs while still in cache; small
        chunks keep the workers evenly loaded when another process takes part of a core.
        """
        with self._run_lock:  # the intermediates are this instance's, one call at a time
            return self._run(s)

    def _run(self, s: Dict[str, Any]) -> Tuple[np.ndarray, None]:
        p, w = s["p"], s["w"]
        B, L, S, H, K, D = p.B, p.L, p.S, p.H, p.K, p.D
        t = compute_dtype(s["query"].dtype)
        q = self.workers.workspace("q", (B, L, H * D), np.result_type(s["query"], w["w_q"]))
        kt = self.workers.workspace("kt", (B, K, D, S), t)
        va = self.workers.workspace("va", (B, K, S, D + 1), t)
        heads = self.workers.workspace("heads", (B, L, H, D), t)

        def project(item: Tuple[str, int, int, int]) -> None:
            name, b, r0, r1 = item
            x = s[{"q": "query", "k": "key", "v": "value"}[name]][b, r0:r1]  # (Tr, E)
            # b_k is left out: it adds q_i . b_k to every logit of row i, which softmax cancels.
            wt, bias = w["w_" + name], None if name == "k" else w["b_" + name]
            if name == "k" and np.result_type(x, wt) == t:
                np.matmul(wt.T, x.T, out=kt[b].reshape(K * D, S)[:, r0:r1])  # k^T = W_k^T x^T
                return
            y = q[b, r0:r1] if name == "q" else self.workers.scratch(
                (r1 - r0, wt.shape[1]), np.result_type(x, wt))
            np.matmul(x, wt, out=y)  # (Tr, H*D or K*D)
            if bias is not None:
                y += bias
            if name != "q":
                stage(y.reshape(r1 - r0, K, D), kt if name == "k" else va, name, b, r0)

        with self.workers.one_blas_thread():
            self.workers.map(project, [(name, b, r0, min(r0 + step, n)) for name, n in
                                (("q", L), ("k", S), ("v", S)) for b in range(B)
                                for step in [self._chunk(B * n)] for r0 in range(0, n, step)])
            heads = self.kernel(q.reshape(B, L, H, D).transpose(0, 2, 1, 3),  # (B, H, L, D)
                                 kt, va, s["mask"], s["scale"], heads)
            # heads is a (B, L, H, D) buffer seen as (B, H, L, D): this reshape is free.
            out = self._project(heads.transpose(0, 2, 1, 3).reshape(B, L, H * D),
                                w["w_o"], w["b_o"])  # (B, L, E)
        return out, None

    def _chunk(self, rows: int) -> int:
        """Rows per projection work item: about 4 items per worker, at least 512 rows (a
        (512, 512) @ (512, 512) float32 matmul runs at ~96% of a core's peak, 256 rows ~90%
        once the weights are no longer in cache)."""
        return max(512, -(-rows // (4 * self.num_threads)))

    def _project(self, x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
        """x @ w (+ b), row chunks on the workers: x (B, N, E_in) -> (B, N, E_out)."""
        rows = x.reshape(-1, x.shape[-1])  # (B*N, E_in)
        y = np.empty((rows.shape[0], w.shape[1]), np.result_type(x, w))  # (B*N, E_out)
        step = self._chunk(rows.shape[0])

        def part(r0: int) -> None:
            np.matmul(rows[r0:r0 + step], w, out=y[r0:r0 + step])
            if b is not None:
                y[r0:r0 + step] += b

        self.workers.map(part, list(range(0, rows.shape[0], step)))
        return y.reshape(*x.shape[:-1], w.shape[1])

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Optional[TileMask],
               scale: float, need_weights: bool) -> Tuple[np.ndarray, None]:
        """The cores' ``attend`` signature with this kernel's own mask type: q (B, H, L, D),
        k/v (B, K, S, D) with K dividing H (query head h reads kv head h // (H // K)),
        ``mask`` a TileMask or None -> (heads (B, H, L, D) over a (B, L, H, D) buffer, None)."""
        B, H, L, D = q.shape
        K, S = k.shape[1], k.shape[2]
        t = compute_dtype(q.dtype)
        kt = np.empty((B, K, D, S), t)  # (B, K, D, S)
        va = np.empty((B, K, S, D + 1), t)  # (B, K, S, D+1)
        with self.workers.one_blas_thread():
            self.workers.map(lambda b: (stage(k[b].transpose(1, 0, 2), kt, "k", b, 0),
                                        stage(v[b].transpose(1, 0, 2), va, "v", b, 0)), range(B))
            return self.kernel(q, kt, va, mask, scale), None

    def __getstate__(self) -> Dict[str, Any]:
        return {"block_q": self.block_q, "block_k": self.block_k,
                "num_threads": self.num_threads, "heads_per_unit": self.heads_per_unit,
                "block_diag": self.block_diag}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(**state)
