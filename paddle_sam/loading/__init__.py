"""Builders that read checkpoints: the models of :mod:`paddle_sam.models` with the weights of a
converted ``.pdparams`` or an official file (read through :mod:`paddle_sam.convert`), as
upstream's ``build_sam.py`` / ``model_builder.py`` do. One module per family."""

from .sam3 import build_sam3_image_model, load_sam3, load_sam3_weights
from .sam_v1 import (
    DEFAULT_MODEL,
    build_sam,
    build_sam_vit_b,
    build_sam_vit_h,
    build_sam_vit_l,
    load_sam,
    load_sam_weights,
    sam_model_registry,
)

__all__ = [
    "DEFAULT_MODEL",
    "build_sam",
    "build_sam3_image_model",
    "build_sam_vit_b",
    "build_sam_vit_h",
    "build_sam_vit_l",
    "load_sam",
    "load_sam3",
    "load_sam3_weights",
    "load_sam_weights",
    "sam_model_registry",
]
