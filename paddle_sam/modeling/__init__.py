"""``segment_anything.modeling`` under paddle-sam: the SAM v1 modules, weight-compatible with
upstream's, under upstream's import path."""

from ..models.sam_v1 import (
    ImageEncoderViT,
    MaskDecoder,
    PromptEncoder,
    Sam,
    TwoWayTransformer,
)

__all__ = ["ImageEncoderViT", "MaskDecoder", "PromptEncoder", "Sam", "TwoWayTransformer"]
