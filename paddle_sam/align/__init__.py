"""Alignment against the official PyTorch code (needs the ``torch`` extra)."""
