"""The NumPy built-ins."""
