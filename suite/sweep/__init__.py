"""Sweeps: presets, the session, measuring and timing, points, shards, fidelity."""
