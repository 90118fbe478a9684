"""Builder of the SAM 3 image model (upstream: sam3/model_builder.py).

Sizes are a frozen :class:`Sam3Spec`; ``SAM3_SPEC`` is the released model. Our builder never
downloads anything: pass ``checkpoint_path`` (an official ``sam3.pt`` or a converted
``.pdparams``), or get random weights.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass

import paddle
from paddle import nn

from .decoder import TransformerDecoder, TransformerDecoderLayer
from .encoder import TransformerEncoderFusion, TransformerEncoderLayer
from .geometry_encoders import SequenceGeometryEncoder
from .maskformer_segmentation import PixelDecoder, UniversalSegmentationHead
from .model_misc import MLP, DotProductScoring, MultiheadAttention, TransformerWrapper
from .sam3_image import Sam3Image


@dataclass(frozen=True)
class Sam3Spec:
    """Every size of the SAM 3 image model; defaults are the released checkpoint's."""

    # vision trunk (Perception Encoder ViT) and neck
    img_size: int = 1008
    pretrain_img_size: int = 336
    patch_size: int = 14
    vit_embed_dim: int = 1024
    vit_depth: int = 32
    vit_num_heads: int = 16
    vit_mlp_ratio: float = 4.625
    window_size: int = 24
    global_att_blocks: tuple[int, ...] = (7, 15, 23, 31)
    scale_factors: tuple[float, ...] = (4.0, 2.0, 1.0, 0.5)
    scalp: int = 1
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

    @classmethod
    def from_dict(cls, d: dict) -> Sam3Spec:
        """The spec of a ``dataclasses.asdict`` dict (a converted checkpoint's sidecar)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown Sam3Spec fields: {unknown}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


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


def build_backbone(
    spec: Sam3Spec, bpe_path: str | os.PathLike | None, enable_inst_interactivity: bool
) -> nn.Layer:
    """Vision trunk + dual neck + text encoder (S3A's modules), combined as upstream."""
    from .necks import Sam3DualViTDetNeck
    from .text_encoder import VETextEncoder
    from .tokenizer import SimpleTokenizer
    from .vitdet import ViT
    from .vl_combiner import SAM3VLBackbone

    trunk = ViT(
        img_size=spec.img_size,
        pretrain_img_size=spec.pretrain_img_size,
        patch_size=spec.patch_size,
        embed_dim=spec.vit_embed_dim,
        depth=spec.vit_depth,
        num_heads=spec.vit_num_heads,
        mlp_ratio=spec.vit_mlp_ratio,
        window_size=spec.window_size,
        global_att_blocks=spec.global_att_blocks,
    )
    neck = Sam3DualViTDetNeck(
        trunk=trunk,
        position_encoding=_position_encoding(spec, precompute_resolution=spec.img_size),
        d_model=spec.d_model,
        scale_factors=spec.scale_factors,
        add_sam2_neck=enable_inst_interactivity,
    )
    text = VETextEncoder(
        d_model=spec.d_model,
        tokenizer=SimpleTokenizer(bpe_path=bpe_path),
        width=spec.text_width,
        heads=spec.text_heads,
        layers=spec.text_layers,
        context_length=spec.context_length,
        vocab_size=spec.vocab_size,
    )
    return SAM3VLBackbone(visual=neck, text=text, scalp=spec.scalp)


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
        resolution=spec.img_size,
        stride=spec.patch_size,
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
        image_size=spec.img_size,
        backbone_stride=spec.patch_size,
        hidden_dim=spec.d_model,
        num_heads=spec.num_heads,
        mlp_dim=spec.dim_feedforward,
    )
    return SAM3InteractiveImagePredictor(heads)


def build_sam3_image_model(
    bpe_path: str | os.PathLike | None = None,
    device: str | None = None,
    eval_mode: bool = True,
    checkpoint_path: str | os.PathLike | None = None,
    load_from_HF: bool = False,  # noqa: N803 - upstream name
    enable_segmentation: bool = True,
    enable_inst_interactivity: bool = False,
    compile: bool = False,
    spec: Sam3Spec = SAM3_SPEC,
) -> Sam3Image:
    """Build the SAM 3 image model; same arguments as upstream's ``build_sam3_image_model``.

    ``checkpoint_path``: the official ``sam3.pt`` (read without torch, converted on the fly) or
    a ``.pdparams`` written by ``paddle-sam convert``; loading is strict. Without it the weights
    are random. ``device`` (e.g. ``"cpu"``, ``"gpu:0"``) calls ``paddle.set_device`` when given.
    ``load_from_HF`` must stay False: nothing is ever downloaded. ``compile`` is ignored
    (use ``paddle-sam export`` for static graphs).
    """
    if load_from_HF and checkpoint_path is None:
        raise ValueError(
            "paddle-sam never downloads weights: pass checkpoint_path (official sam3.pt or a "
            "converted .pdparams)"
        )
    if device is not None:
        paddle.set_device(device)
    model = Sam3Image(
        backbone=build_backbone(spec, bpe_path, enable_inst_interactivity),
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
    if checkpoint_path is not None:
        load_sam3_weights(model, checkpoint_path, spec)
    else:
        warnings.warn(
            "build_sam3_image_model: no checkpoint_path, the weights are random", stacklevel=2
        )
    if eval_mode:
        model.eval()
    return model


def load_sam3_weights(
    model: Sam3Image, path: str | os.PathLike, spec: Sam3Spec = SAM3_SPEC
) -> None:
    """Strictly load an official checkpoint or a converted ``.pdparams`` into ``model``."""
    from ...convert import sam3 as convert_sam3

    state = convert_sam3.read_sam3_weights(path, spec=spec, model=model)
    convert_sam3.load_state_strict(model, state)
