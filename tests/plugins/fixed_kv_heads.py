"""Modules whose key/value head count is fixed by their design (``kv_heads``), on the NumPy
reference: a multi-query module and a grouped one with H // 2 kv heads."""

from implementations.numpy.mha import NumpyMHA


class MultiQuery(NumpyMHA):
    """One key/value head, whatever the problem's (timm's MultiQueryAttentionV2, say)."""

    name = "fixed.multi_query"
    kv_heads = 1
    features = NumpyMHA.features | {"gqa"}

    def prepare(self, problem, device, dtype, **kw):
        assert problem.K == 1, f"given {problem.K} kv heads"
        return super().prepare(problem, device, dtype, **kw)


class HalfHeads(NumpyMHA):
    """H // 2 key/value heads."""

    name = "fixed.half_heads"
    kv_heads = "half"
    features = NumpyMHA.features | {"gqa"}

    def prepare(self, problem, device, dtype, **kw):
        assert problem.K == problem.H // 2, f"given {problem.K} kv heads of {problem.H}"
        return super().prepare(problem, device, dtype, **kw)
