"""The built-in plugins, grouped by framework: numpy, torch, jax (with Flax), keras, hf
(Hugging Face transformers) and kernels (Triton and Pallas)."""

from suite.moved import IMPLEMENTATIONS as _MOVED
from suite.moved import install as _install

__getattr__ = _install("implementations", _MOVED)  # the module names before the folders
