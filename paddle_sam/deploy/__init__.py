"""Runtimes for exported programs: Paddle Inference (``StaticSamPredictor``, SAM 3's
``StaticSam3Processor``) and onnxruntime (``OnnxSamPredictor``, optional ``onnx`` extra)."""

from .static_predictor import StaticSamPredictor
from .static_sam3 import StaticSam3Processor


def __getattr__(name: str):
    if name == "OnnxSamPredictor":  # lazy: onnxruntime is optional
        from .onnx_predictor import OnnxSamPredictor

        return OnnxSamPredictor
    raise AttributeError(name)


__all__ = ["OnnxSamPredictor", "StaticSam3Processor", "StaticSamPredictor"]
