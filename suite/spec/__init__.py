"""The spec: the canonical problem, the float64 oracle and its gradient, the agreement rule,
row diagnosis, input layouts, score variants, paged caches."""
