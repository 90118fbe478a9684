"""Runtimes for exported programs: Paddle Inference (``StaticSamPredictor``, SAM 3's
``StaticSam3Processor``) and onnxruntime (``OnnxSamPredictor``, optional ``onnx`` extra)."""

from .sam3 import StaticSam3Processor
from .sam_v1 import StaticSamPredictor


def __getattr__(name: str):
    if name == "OnnxSamPredictor":  # lazy: onnxruntime is optional
        from .onnx import OnnxSamPredictor

        return OnnxSamPredictor
    raise AttributeError(name)


__all__ = ["OnnxSamPredictor", "StaticSam3Processor", "StaticSamPredictor"]
