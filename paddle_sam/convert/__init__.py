"""Checkpoint conversion: torch-free readers and per-model key maps."""
