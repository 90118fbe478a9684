"""``SamOnnxModel``, where upstream keeps it (``segment_anything.utils.onnx``): the prompt
encoder, mask decoder and mask postprocessing of a SAM v1 model with upstream's ONNX
interface. ``paddle_sam.export.onnx.export_onnx`` (``paddle-sam export --format onnx``)
exports it with the image encoder."""

from ..export.onnx import SamOnnxModel

__all__ = ["SamOnnxModel"]
