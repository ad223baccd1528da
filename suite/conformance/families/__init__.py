"""The conformance families, one module each; ``suite.conformance.cases`` registers them in order."""
