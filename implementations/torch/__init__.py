"""The PyTorch built-ins (torch is imported inside each module)."""
