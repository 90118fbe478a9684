"""SAM 3 sizes as a frozen :class:`Sam3Spec` (``SAM3_SPEC`` is the released model) and the image
model of a spec (upstream: sam3/model_builder.py, without the checkpoint loading, which
:mod:`paddle_sam.loading.sam3` adds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from paddle import nn

from ..common import Spec
from .decoder import TransformerDecoder, TransformerDecoderLayer
from .encoder import TransformerEncoderFusion, TransformerEncoderLayer
from .geometry_encoders import SequenceGeometryEncoder
from .maskformer_segmentation import PixelDecoder, UniversalSegmentationHead
from .model_misc import MLP, DotProductScoring, MultiheadAttention, TransformerWrapper
from .sam3_image import Sam3Image


@dataclass(frozen=True)
class Sam3Spec(Spec):
    """Every size of the SAM 3 image model; defaults are the released checkpoint's. Fields that
    mean the same as in ``SamSpec`` have its names (image_size, vit_patch_size, encoder_*)."""

    # vision trunk (Perception Encoder ViT) and neck
    image_size: int = 1008
    pretrain_image_size: int = 336
    vit_patch_size: int = 14
    encoder_embed_dim: int = 1024
    encoder_depth: int = 32
    encoder_num_heads: int = 16
    mlp_ratio: float = 4.625
    window_size: int = 24
    encoder_global_attn_indexes: tuple[int, ...] = (7, 15, 23, 31)
    scale_factors: tuple[float, ...] = (4.0, 2.0, 1.0, 0.5)
    scalp: int = 1
    # not in upstream (empty for every released model): (width, stride) of 3 x 3 convolutions
    # with batch norm before the patch projection, for small models trained from scratch
    conv_stem: tuple[tuple[int, int], ...] = ()
    # upstream ViT's init_values: LayerScale on each block's branches, starting at this value
    # (None, no LayerScale, in the released model)
    encoder_init_values: float | None = None
    # text encoder
    text_width: int = 1024
    text_heads: int = 16
    text_layers: int = 24
    context_length: int = 32
    vocab_size: int = 49408
    # detector heads
    d_model: int = 256
    num_heads: int = 8
    dim_feedforward: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    num_queries: int = 200
    geometry_layers: int = 3
    upsampling_stages: int = 3

    # names of sidecars written before the fields were aligned with SamSpec's
    RENAMED = {
        "img_size": "image_size",
        "pretrain_img_size": "pretrain_image_size",
        "patch_size": "vit_patch_size",
        "vit_embed_dim": "encoder_embed_dim",
        "vit_depth": "encoder_depth",
        "vit_num_heads": "encoder_num_heads",
        "vit_mlp_ratio": "mlp_ratio",
        "global_att_blocks": "encoder_global_attn_indexes",
    }

    def __post_init__(self) -> None:
        for name in ("encoder_global_attn_indexes", "scale_factors"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        try:  # a sidecar holds lists
            stem = tuple((int(w), int(s)) for w, s in self.conv_stem)
        except (TypeError, ValueError):
            raise ValueError(f"conv_stem {self.conv_stem!r}: needs (width, stride) pairs") from None
        object.__setattr__(self, "conv_stem", stem)
        self._check_positive(
            "image_size",
            "pretrain_image_size",
            "vit_patch_size",
            "encoder_embed_dim",
            "encoder_depth",
            "encoder_num_heads",
            "mlp_ratio",
            "window_size",
            "text_width",
            "text_heads",
            "text_layers",
            "context_length",
            "vocab_size",
            "d_model",
            "num_heads",
            "dim_feedforward",
            "encoder_layers",
            "decoder_layers",
            "num_queries",
            "geometry_layers",
            "upsampling_stages",
        )
        if self.image_size % self.vit_patch_size:
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of the patch size "
                f"{self.vit_patch_size}"
            )
        for width, heads, what in (
            (self.encoder_embed_dim, self.encoder_num_heads, "encoder"),
            (self.text_width, self.text_heads, "text"),
            (self.d_model, self.num_heads, "detector"),
        ):
            if width % heads:
                raise ValueError(f"{what} heads {heads} must divide its width {width}")
        if self.encoder_init_values is not None and not self.encoder_init_values > 0:
            raise ValueError(
                f"encoder_init_values must be positive or None, got {self.encoder_init_values!r}"
            )
        strides = math.prod(s for _, s in self.conv_stem)
        if any(min(layer) <= 0 for layer in self.conv_stem) or self.vit_patch_size % strides:
            raise ValueError(
                f"conv_stem {[list(x) for x in self.conv_stem]}: needs positive widths and "
                f"strides whose product divides the patch size {self.vit_patch_size}"
            )
        bad = [i for i in self.encoder_global_attn_indexes if not 0 <= i < self.encoder_depth]
        if bad:
            raise ValueError(f"global attention indexes {bad} outside 0..{self.encoder_depth - 1}")


SAM3_SPEC = Sam3Spec()


def _mha(spec: Sam3Spec, dropout: float = 0.1, batch_first: bool = False) -> MultiheadAttention:
    return MultiheadAttention(
        spec.d_model, spec.num_heads, dropout=dropout, batch_first=batch_first
    )


def _position_encoding(spec: Sam3Spec, precompute_resolution: int | None = None) -> nn.Layer:
    from .position_encoding import PositionEmbeddingSine

    return PositionEmbeddingSine(
        num_pos_feats=spec.d_model,
        normalize=True,
        scale=None,
        temperature=10000,
        precompute_resolution=precompute_resolution,
    )


def build_vision_backbone(spec: Sam3Spec, enable_inst_interactivity: bool) -> nn.Layer:
    """Vision trunk + dual neck (the second, SAM 2 style neck with ``enable_inst_interactivity``:
    the tracker reads it)."""
    from .necks import Sam3DualViTDetNeck
    from .vitdet import ViT

    trunk = ViT(
        img_size=spec.image_size,
        pretrain_img_size=spec.pretrain_image_size,
        patch_size=spec.vit_patch_size,
        embed_dim=spec.encoder_embed_dim,
        depth=spec.encoder_depth,
        num_heads=spec.encoder_num_heads,
        mlp_ratio=spec.mlp_ratio,
        window_size=spec.window_size,
        global_att_blocks=spec.encoder_global_attn_indexes,
        conv_stem=spec.conv_stem,
        init_values=spec.encoder_init_values,
    )
    return Sam3DualViTDetNeck(
        trunk=trunk,
        position_encoding=_position_encoding(spec, precompute_resolution=spec.image_size),
        d_model=spec.d_model,
        scale_factors=spec.scale_factors,
        add_sam2_neck=enable_inst_interactivity,
    )


def build_backbone(
    spec: Sam3Spec, tokenizer: Callable[..., object] | None, enable_inst_interactivity: bool
) -> nn.Layer:
    """Vision trunk + dual neck + text encoder (S3A's modules), combined as upstream."""
    from .vl_combiner import SAM3VLBackbone

    neck = build_vision_backbone(spec, enable_inst_interactivity)
    text = build_text_encoder(spec, tokenizer)
    return SAM3VLBackbone(visual=neck, text=text, scalp=spec.scalp)


def build_text_encoder(spec: Sam3Spec, tokenizer: Callable[..., object] | None) -> nn.Layer:
    """The text encoder (``backbone.language_backbone``) of a ``spec`` model."""
    from .text_encoder import VETextEncoder

    return VETextEncoder(
        d_model=spec.d_model,
        tokenizer=tokenizer,
        width=spec.text_width,
        heads=spec.text_heads,
        layers=spec.text_layers,
        context_length=spec.context_length,
        vocab_size=spec.vocab_size,
    )


def build_transformer(spec: Sam3Spec) -> TransformerWrapper:
    """Fusion encoder + decoder, configured as upstream's ``_create_sam3_transformer``."""
    enc_layer = TransformerEncoderLayer(
        activation="relu",
        d_model=spec.d_model,
        dim_feedforward=spec.dim_feedforward,
        dropout=0.1,
        pos_enc_at_attn=True,
        pos_enc_at_cross_attn_keys=False,
        pos_enc_at_cross_attn_queries=False,
        pre_norm=True,
        self_attention=_mha(spec, batch_first=True),
        cross_attention=_mha(spec, batch_first=True),
    )
    encoder = TransformerEncoderFusion(
        layer=enc_layer,
        num_layers=spec.encoder_layers,
        d_model=spec.d_model,
        num_feature_levels=1,
        add_pooled_text_to_img_feat=False,
        pool_text_with_mask=True,
    )
    dec_layer = TransformerDecoderLayer(
        activation="relu",
        d_model=spec.d_model,
        dim_feedforward=spec.dim_feedforward,
        dropout=0.1,
        cross_attention=_mha(spec),
        n_heads=spec.num_heads,
        use_text_cross_attention=True,
    )
    decoder = TransformerDecoder(
        layer=dec_layer,
        num_layers=spec.decoder_layers,
        num_queries=spec.num_queries,
        return_intermediate=True,
        box_refine=True,
        num_o2m_queries=0,
        dac=True,
        boxRPB="log",
        d_model=spec.d_model,
        frozen=False,
        interaction_layer=None,
        dac_use_selfatt_ln=True,
        resolution=spec.image_size,
        stride=spec.vit_patch_size,
        presence_token=True,
    )
    return TransformerWrapper(encoder=encoder, decoder=decoder, d_model=spec.d_model)


def build_dot_product_scoring(spec: Sam3Spec) -> DotProductScoring:
    prompt_mlp = MLP(
        spec.d_model,
        spec.dim_feedforward,
        spec.d_model,
        num_layers=2,
        dropout=0.1,
        residual=True,
        out_norm=nn.LayerNorm(spec.d_model),
    )
    return DotProductScoring(d_model=spec.d_model, d_proj=spec.d_model, prompt_mlp=prompt_mlp)


def build_segmentation_head(spec: Sam3Spec) -> UniversalSegmentationHead:
    return UniversalSegmentationHead(
        hidden_dim=spec.d_model,
        upsampling_stages=spec.upsampling_stages,
        pixel_decoder=PixelDecoder(
            spec.d_model, spec.upsampling_stages, interpolation_mode="nearest"
        ),
        cross_attend_prompt=_mha(spec, dropout=0.0),
    )


def build_geometry_encoder(spec: Sam3Spec) -> SequenceGeometryEncoder:
    layer = TransformerEncoderLayer(
        activation="relu",
        d_model=spec.d_model,
        dim_feedforward=spec.dim_feedforward,
        dropout=0.1,
        pos_enc_at_attn=False,
        pre_norm=True,
        self_attention=_mha(spec),
        pos_enc_at_cross_attn_queries=False,
        pos_enc_at_cross_attn_keys=True,
        cross_attention=_mha(spec),
    )
    return SequenceGeometryEncoder(
        pos_enc=_position_encoding(spec),
        encode_boxes_as_points=False,
        points_direct_project=True,
        points_pool=True,
        points_pos_enc=True,
        boxes_direct_project=True,
        boxes_pool=True,
        boxes_pos_enc=True,
        d_model=spec.d_model,
        num_layers=spec.geometry_layers,
        layer=layer,
        add_cls=True,
        add_post_encode_proj=True,
    )


def build_interactive_predictor(spec: Sam3Spec):
    """The SAM 1 task predictor of ``predict_inst`` (tracker prompt encoder + mask decoder)."""
    from .interactive import SAM3InteractiveImagePredictor, Sam3TrackerHeads

    heads = Sam3TrackerHeads(
        image_size=spec.image_size,
        backbone_stride=spec.vit_patch_size,
        hidden_dim=spec.d_model,
        num_heads=spec.num_heads,
        mlp_dim=spec.dim_feedforward,
    )
    return SAM3InteractiveImagePredictor(heads)


# The released tracker's settings (upstream ``model_builder.build_tracker``), sizes aside.
TRACKER_SETTINGS: dict = {
    "num_maskmem": 7,
    "multimask_output_in_sam": True,
    "multimask_output_for_tracking": True,
    "multimask_min_pt_num": 0,
    "multimask_max_pt_num": 1,
    "always_start_from_first_ann_frame": False,
    "non_overlap_masks_for_mem_enc": False,
    "non_overlap_masks_for_output": False,
    "max_cond_frames_in_attn": 4,
    "sam_mask_decoder_extra_args": {
        "dynamic_multimask_via_stability": True,
        "dynamic_multimask_stability_delta": 0.05,
        "dynamic_multimask_stability_thresh": 0.98,
    },
    "clear_non_cond_mem_around_input": True,
    "fill_hole_area": 0,
}


def build_tracker_model(
    spec: Sam3Spec = SAM3_SPEC,
    apply_temporal_disambiguation: bool = False,
    with_backbone: bool = False,
    tracker_cls: type | None = None,
    **overrides: object,
):
    """SAM 3's video tracker (upstream ``build_tracker``) for the image size and patch size of
    ``spec``, with fresh (random) weights, in eval mode: memory encoder, memory attention, SAM
    heads, released settings (:data:`TRACKER_SETTINGS`, changed by ``overrides``).
    ``apply_temporal_disambiguation`` turns on memory selection. ``with_backbone`` adds the
    vision backbone with its SAM 2 neck (no text encoder) as ``backbone``, upstream's layout.
    ``tracker_cls``: a subclass of :class:`Sam3TrackerPredictor` to build instead."""
    from .memory import build_tracker_maskmem_backbone
    from .memory_attention import build_tracker_memory_attention
    from .sam3_tracking_predictor import Sam3TrackerPredictor
    from .vl_combiner import SAM3VLBackbone

    if spec.d_model != 256:
        raise ValueError(f"the tracker's memory is built for d_model 256, got {spec.d_model}")
    side = spec.image_size // spec.vit_patch_size
    cls = Sam3TrackerPredictor if tracker_cls is None else tracker_cls
    if not issubclass(cls, Sam3TrackerPredictor):
        raise TypeError(f"tracker_cls must subclass Sam3TrackerPredictor, got {cls!r}")
    unknown = set(overrides) - set(TRACKER_SETTINGS)
    if unknown:
        raise TypeError(f"unknown tracker settings: {sorted(unknown)}")
    model = cls(
        transformer=TransformerWrapper(build_tracker_memory_attention((side, side)), None, 256),
        maskmem_backbone=build_tracker_maskmem_backbone(spec.image_size, spec.vit_patch_size),
        image_size=spec.image_size,
        backbone_stride=spec.vit_patch_size,
        use_memory_selection=apply_temporal_disambiguation,
        **{**TRACKER_SETTINGS, **overrides},
    )
    if with_backbone:
        visual = build_vision_backbone(spec, enable_inst_interactivity=True)
        model.backbone = SAM3VLBackbone(visual=visual, text=None, scalp=spec.scalp)
    model.spec = spec
    model.eval()
    return model


# The released dense video model's settings (upstream ``model_builder.build_sam3_video_model``):
# with temporal disambiguation (hot-start, reconditioning), and upstream's ablation without
_VIDEO_COMMON: dict = {
    "score_threshold_detection": 0.5,
    "assoc_iou_thresh": 0.1,
    "det_nms_thresh": 0.1,
    "new_det_thresh": 0.7,
    "suppress_unmatched_only_within_hotstart": True,
    "min_trk_keep_alive": -1,
    "max_trk_keep_alive": 30,
    "init_trk_keep_alive": 30,
    "suppress_overlapping_based_on_recent_occlusion_threshold": 0.7,
    "suppress_det_close_to_boundary": False,
    "fill_hole_area": 16,
    "masklet_confirmation_enable": False,
    "decrease_trk_keep_alive_for_empty_masklets": False,
}
VIDEO_SETTINGS: dict = {
    True: {
        **_VIDEO_COMMON,
        "hotstart_delay": 15,
        "hotstart_unmatch_thresh": 8,
        "hotstart_dup_thresh": 8,
        "recondition_every_nth_frame": 16,
    },
    False: {
        **_VIDEO_COMMON,
        "hotstart_delay": 0,
        "hotstart_unmatch_thresh": 0,
        "hotstart_dup_thresh": 0,
        "recondition_every_nth_frame": 0,
    },
}


def build_video_model(
    detector: Sam3Image,
    tracker: nn.Layer,
    apply_temporal_disambiguation: bool = True,
    model_cls: type | None = None,
    **overrides: object,
):
    """SAM 3's dense video model around a detector (the image model with its SAM 2 neck) and
    a tracker (:func:`build_tracker_model`), with the released settings
    (:data:`VIDEO_SETTINGS`, changed by ``overrides``), in eval mode. The detector is set up
    as upstream's video detector: joint box scores supervised, no interactive predictor of
    its own (the tracker does the clicks). ``model_cls``: a subclass of
    ``Sam3VideoInferenceWithInstanceInteractivity`` to build instead."""
    from .sam3_video_inference import Sam3VideoInferenceWithInstanceInteractivity

    cls = Sam3VideoInferenceWithInstanceInteractivity if model_cls is None else model_cls
    if not issubclass(cls, Sam3VideoInferenceWithInstanceInteractivity):
        raise TypeError(
            f"model_cls must subclass Sam3VideoInferenceWithInstanceInteractivity, got {cls!r}"
        )
    settings = VIDEO_SETTINGS[bool(apply_temporal_disambiguation)]
    unknown = set(overrides) - set(settings)
    if unknown:
        raise TypeError(f"unknown video model settings: {sorted(unknown)}")
    if not getattr(detector.backbone.vision_backbone, "has_sam2_neck", False):
        raise ValueError("the detector needs the SAM 2 neck (enable_inst_interactivity=True)")
    detector.supervise_joint_box_scores = True
    detector.inst_interactive_predictor = None
    model = cls(
        detector=detector,
        tracker=tracker,
        image_size=detector.spec.image_size,
        **{**settings, **overrides},
    )
    model.spec = detector.spec
    model.eval()
    return model


def build_sam3_model(
    spec: Sam3Spec = SAM3_SPEC,
    tokenizer: Callable[..., object] | None = None,
    enable_segmentation: bool = True,
    enable_inst_interactivity: bool = False,
) -> Sam3Image:
    """The SAM 3 image model of ``spec`` with fresh (random) weights, in eval mode, ``spec``
    attached. ``tokenizer``: text -> token ids for the text encoder (``SimpleTokenizer``);
    without one the model takes token ids only."""
    model = Sam3Image(
        backbone=build_backbone(spec, tokenizer, enable_inst_interactivity),
        transformer=build_transformer(spec),
        input_geometry_encoder=build_geometry_encoder(spec),
        segmentation_head=build_segmentation_head(spec) if enable_segmentation else None,
        num_feature_levels=1,
        o2m_mask_predict=True,
        dot_prod_scoring=build_dot_product_scoring(spec),
        use_instance_query=False,
        multimask_output=True,
        inst_interactive_predictor=(
            build_interactive_predictor(spec) if enable_inst_interactivity else None
        ),
    )
    model.spec = spec
    model.eval()
    return model


__all__ = [
    "SAM3_SPEC",
    "TRACKER_SETTINGS",
    "VIDEO_SETTINGS",
    "Sam3Spec",
    "build_sam3_model",
    "build_tracker_model",
    "build_video_model",
]
