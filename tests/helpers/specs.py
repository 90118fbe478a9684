"""The tiny model sizes of the tests, each defined once. A test that needs another size says
so with an explicit override (``tiny_sam3_spec(num_queries=4)``, ``dataclasses.replace``).

SAM v1: :data:`TINY` and :data:`TINY_B`, and :func:`tiny_train_spec` (a training config's
``model.spec``). SAM 3: :func:`tiny_sam3_spec` and the sizes derived
from it, :func:`tiny_sam3_tracker_spec` and :func:`one_layer_sam3_spec`.
"""

from __future__ import annotations

from typing import Any

from paddle_sam.models.sam3.build_sam3 import Sam3Spec
from paddle_sam.models.sam_v1.build_sam import SamSpec

# SAM v1, window 5 on a 16x16 grid: padding in every windowed block; one global block
TINY = SamSpec(
    encoder_embed_dim=64,
    encoder_depth=3,
    encoder_num_heads=2,
    encoder_global_attn_indexes=(1,),
    image_size=256,
    window_size=5,
    prompt_embed_dim=32,
    decoder_mlp_dim=64,
    decoder_num_heads=2,
    iou_head_hidden_dim=32,
)
# SAM v1, windows that tile the grid exactly, patch 8, more heads, two global blocks, deeper
# decoder
TINY_B = SamSpec(
    encoder_embed_dim=48,
    encoder_depth=4,
    encoder_num_heads=3,
    encoder_global_attn_indexes=(1, 3),
    image_size=128,
    vit_patch_size=8,
    window_size=4,
    prompt_embed_dim=48,
    mask_in_chans=8,
    decoder_depth=3,
    decoder_mlp_dim=96,
    decoder_num_heads=4,
    iou_head_depth=2,
    iou_head_hidden_dim=24,
)


def tiny_sam3_spec(**overrides: Any) -> Sam3Spec:
    """The reduced SAM 3 of the model, CLI and service tests: 112 px / patch 14 = 8 x 8 tokens,
    windows of 4, FPN levels 32, 16, 8, 12 queries; ``overrides`` replace fields."""
    fields = dict(
        image_size=112,
        pretrain_image_size=56,
        encoder_embed_dim=32,
        encoder_depth=2,
        encoder_num_heads=2,
        window_size=4,
        encoder_global_attn_indexes=(1,),
        text_width=32,
        text_heads=2,
        text_layers=2,
        d_model=32,
        num_heads=4,
        dim_feedforward=64,
        encoder_layers=2,
        decoder_layers=2,
        num_queries=12,
        geometry_layers=1,
    )
    return Sam3Spec(**(fields | overrides))


def tiny_sam3_tracker_spec(**overrides: Any) -> Sam3Spec:
    """:func:`tiny_sam3_spec` for a model with the tracker: the tracker's SAM heads keep the
    released widths (256 channels, 8 heads, MLP 2048), so the detector's d_model (which sizes
    the SAM 2 neck) is 256 too; 112 px images, 8 x 8 tokens."""
    fields = dict(d_model=256, num_heads=8, dim_feedforward=2048)
    return tiny_sam3_spec(**(fields | overrides))


def one_layer_sam3_spec(**overrides: Any) -> Sam3Spec:
    """:func:`tiny_sam3_spec` with every transformer of the detector and the text encoder one
    layer deep, 2 heads, a text context of 8 and 6 queries (the conversion tests); the
    vocabulary stays CLIP's, which the tokenizer needs."""
    fields = dict(
        text_layers=1,
        context_length=8,
        num_heads=2,
        dim_feedforward=48,
        encoder_layers=1,
        decoder_layers=1,
        num_queries=6,
    )
    return tiny_sam3_spec(**(fields | overrides))


def tiny_train_spec() -> dict[str, Any]:
    """A tiny SAM v1 as a training config's ``model.spec`` (64 px, two blocks), a fresh dict."""
    return dict(
        image_size=64,
        vit_patch_size=8,
        encoder_embed_dim=32,
        encoder_depth=2,
        encoder_num_heads=2,
        encoder_global_attn_indexes=[1],
        window_size=4,
        prompt_embed_dim=32,
        decoder_mlp_dim=64,
        decoder_num_heads=2,
        iou_head_hidden_dim=32,
    )
