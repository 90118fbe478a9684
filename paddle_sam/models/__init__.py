"""The networks, one subpackage per family: :mod:`.sam_v1` (segment-anything) and :mod:`.sam3`
(sam3), with upstream module and parameter names. Pure layers and their specs: no file I/O,
nothing else of paddle_sam imported; checkpoints are read one level up (:mod:`paddle_sam.loading`).
"""

from .sam_v1 import (
    SAM_SPECS,
    ImageEncoderViT,
    MaskDecoder,
    PromptEncoder,
    Sam,
    SamSpec,
    TwoWayTransformer,
    build_sam_model,
)

__all__ = [
    "SAM_SPECS",
    "ImageEncoderViT",
    "MaskDecoder",
    "PromptEncoder",
    "Sam",
    "SamSpec",
    "TwoWayTransformer",
    "build_sam_model",
]
