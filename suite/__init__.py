"""mha-suite: conformance and benchmarks for multi-head attention implementations.

The wings: ``suite.spec`` (the problem, the oracle, the agreement rule), ``suite.plugins``
(the interface, declarations, registry, adapters), ``suite.conformance`` (the cases and their
session), ``suite.sweep`` (presets, measuring, timing) and ``suite.results`` (the results
files); ``suite.cli`` and ``suite.pytest_plugin`` on top.
"""

from suite.moved import SUITE as _SUITE
from suite.moved import install as _install

__getattr__ = _install("suite", _SUITE)  # the module names before the wings, for a while
