"""The accelerator kernels: Triton and Pallas (interpreted on a CPU)."""
