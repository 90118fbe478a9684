"""Loading: one place that turns a source into a model or a predictor.

:func:`resolve` / :func:`sniff` read what a source is (a checkpoint, an HF folder, an export
folder, a bundled model) once; :func:`load_model`, :func:`load_image_predictor` and
:func:`load_video_predictor` give what it can do, or a :class:`SourceRefused` naming what it
lacks (:mod:`.registry`). The builders with upstream's names and arguments live beside it, one
module per family: :mod:`.sam_v1` (segment-anything's ``build_sam.py``) and :mod:`.sam3`
(sam3's ``model_builder.py``).
"""

from .registry import (
    BUNDLED_GENERATOR,
    FAMILIES,
    RUNTIMES,
    Family,
    Source,
    SourceRefused,
    as_image_predictor,
    as_video_predictor,
    bundled,
    bundled_notice,
    family_of_model_type,
    generator_defaults_for,
    image_predictor_of_video,
    is_bundled,
    is_video_model,
    load_image_predictor,
    load_model,
    load_video_predictor,
    outside_vocabulary,
    require,
    resolve,
    sniff,
    video_predictor_or_refusal,
    video_refusal,
    vocabulary,
)
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
    "BUNDLED_GENERATOR",
    "DEFAULT_MODEL",
    "FAMILIES",
    "RUNTIMES",
    "Family",
    "Source",
    "SourceRefused",
    "as_image_predictor",
    "as_video_predictor",
    "build_sam",
    "build_sam3_image_model",
    "build_sam_vit_b",
    "build_sam_vit_h",
    "build_sam_vit_l",
    "bundled",
    "bundled_notice",
    "family_of_model_type",
    "generator_defaults_for",
    "image_predictor_of_video",
    "is_bundled",
    "is_video_model",
    "load_image_predictor",
    "load_model",
    "load_sam",
    "load_sam3",
    "load_sam3_weights",
    "load_sam_weights",
    "load_video_predictor",
    "outside_vocabulary",
    "require",
    "resolve",
    "sam_model_registry",
    "sniff",
    "video_predictor_or_refusal",
    "video_refusal",
    "vocabulary",
]
