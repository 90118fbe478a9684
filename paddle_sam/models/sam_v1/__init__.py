"""SAM v1 modules, weight-compatible with facebookresearch/segment-anything."""

from .build_sam import SAM_SPECS, SamSpec, build_sam_model, module_kwargs
from .image_encoder import ImageEncoderViT
from .mask_decoder import MaskDecoder
from .prompt_encoder import PromptEncoder
from .sam import Sam
from .transformer import TwoWayTransformer

__all__ = [
    "SAM_SPECS",
    "ImageEncoderViT",
    "MaskDecoder",
    "PromptEncoder",
    "Sam",
    "SamSpec",
    "TwoWayTransformer",
    "build_sam_model",
    "module_kwargs",
]
