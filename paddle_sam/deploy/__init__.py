"""Runtimes for exported programs: Paddle Inference (``StaticSamPredictor``) and onnxruntime
(``OnnxSamPredictor``, optional ``onnx`` extra)."""

from .static_predictor import StaticSamPredictor


def __getattr__(name: str):
    if name == "OnnxSamPredictor":  # lazy: onnxruntime is optional
        from .onnx_predictor import OnnxSamPredictor

        return OnnxSamPredictor
    raise AttributeError(name)


__all__ = ["OnnxSamPredictor", "StaticSamPredictor"]
