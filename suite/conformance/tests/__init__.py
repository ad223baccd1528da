"""The conformance session's pytest modules (``--pyargs suite.conformance.tests``)."""
