"""A library whose causal flag fills with the most negative finite float while its masks
drop keys (as x-transformers does): a row its causal mask alone empties gets uniform
weights, the mean of the values; a row a mask empties gets a zero head output, as the spec
says. Emulated on the float64 oracle, cast to the dtype asked for."""

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.plugins.declarations import VARIANT_FEATURES, Deviation
from suite.spec import oracle

MEAN = Deviation("mean_values", "the causal flag fills with -finfo.max (emulated)")


class CausalFillUndeclared(NumpyMHA):
    name = "causal_fill.undeclared"
    features = NumpyMHA.features - VARIANT_FEATURES - {"weights", "dropout", "paged"}

    def run(self, s):
        from suite.conformance.judge import _causal_emptied_rows

        p = s["p"]
        out, _ = oracle.oracle(p, "zero")
        rows = self.mean_rows(p, _causal_emptied_rows(p))
        out = np.where(rows, oracle.oracle(p, "mean_values")[0], out)
        return out.astype(s["query"].dtype), None

    def mean_rows(self, p, causal_rows):
        return causal_rows


class CausalFillDeclared(CausalFillUndeclared):
    name = "causal_fill.declared"
    deviations = {"causal_emptied_rows": MEAN}


class EveryRowDeclaredCausal(CausalFillDeclared):
    """Every row with no key gives the mean of the values, masks' rows too: the causal
    declaration must not excuse the rows a mask empties."""

    name = "causal_fill.every_row"

    def mean_rows(self, p, causal_rows):
        from suite.conformance.judge import _allowed

        return ~_allowed(p).any(-1).any(1)[..., None] | causal_rows


class CausalFillAsFullyMasked(CausalFillUndeclared):
    """The behaviour declared as fully_masked_rows=mean_values: wrong for the rows a mask
    empties (zeros there), so it fails where a mask empties a row."""

    name = "causal_fill.as_fully_masked"
    deviations = {"fully_masked_rows": MEAN}
