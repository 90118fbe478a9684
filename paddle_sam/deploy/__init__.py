"""Runtimes for exported programs (Paddle Inference)."""

from .static_predictor import StaticSamPredictor

__all__ = ["StaticSamPredictor"]
