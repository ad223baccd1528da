"""The JAX and Flax built-ins."""
