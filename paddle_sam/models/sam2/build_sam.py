"""SAM 2 / 2.1 sizes as frozen :class:`Sam2Spec` values in a registry, and the model of a spec
(upstream: sam2/build_sam.py with the configs in sam2/configs/sam2 and sam2/configs/sam2.1,
read here as plain values; no hydra).

The registry's names are the official checkpoints' (``sam2.1_hiera_tiny`` is
``sam2.1_hiera_tiny.pt`` with ``configs/sam2.1/sam2.1_hiera_t.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common import Spec
from ..sam3.position_encoding import PositionEmbeddingSine
from .hieradet import Hiera
from .image_encoder import FpnNeck, ImageEncoder
from .memory import (
    CXBlock,
    Fuser,
    MaskDownSampler,
    MemoryAttention,
    MemoryAttentionLayer,
    MemoryEncoder,
    RoPEAttention,
)
from .sam2_base import SAM2Base

#: the decoder's fallback to the best multimask output when a single mask is unstable, as
#: upstream's ``build_sam2(..., apply_postprocessing=True)`` (its default) sets it
POSTPROCESSING_DECODER_ARGS = {
    "dynamic_multimask_via_stability": True,
    "dynamic_multimask_stability_delta": 0.05,
    "dynamic_multimask_stability_thresh": 0.98,
}


@dataclass(frozen=True)
class Sam2Spec(Spec):
    """Every size of a SAM 2 / 2.1 model; defaults are the released configs' shared values.
    Fields that mean the same as in ``SamSpec`` have its names (image_size, encoder_*)."""

    # Hiera trunk
    encoder_embed_dim: int
    encoder_num_heads: int
    encoder_stages: tuple[int, ...]
    encoder_global_attn_indexes: tuple[int, ...]
    encoder_window_spec: tuple[int, ...] = (8, 4, 14, 7)
    encoder_window_pos_embed_size: tuple[int, ...] = (14, 14)
    encoder_q_pool: int = 3
    image_size: int = 1024
    # the hidden width (neck, SAM heads, memory attention) and the SAM decoder's MLP: the
    # released models' 256 and 2048; smaller for models trained from scratch
    d_model: int = 256
    sam_mlp_dim: int = 2048
    # memory
    num_maskmem: int = 7
    memory_attention_layers: int = 4
    memory_attention_dim_feedforward: int = 2048
    mem_dim: int = 64
    # SAM 2.1 over 2.0: a no-object embedding in the spatial memory, and a signed, projected
    # temporal encoding of the object pointers
    no_obj_embed_spatial: bool = True
    add_tpos_enc_to_obj_ptrs: bool = True
    proj_tpos_enc_in_obj_ptrs: bool = True
    use_signed_tpos_enc_to_obj_ptrs: bool = True

    def __post_init__(self) -> None:
        flags = (
            "no_obj_embed_spatial",
            "add_tpos_enc_to_obj_ptrs",
            "proj_tpos_enc_in_obj_ptrs",
            "use_signed_tpos_enc_to_obj_ptrs",
        )
        bad = [f"{n}={getattr(self, n)!r}" for n in flags if not isinstance(getattr(self, n), bool)]
        if bad:
            raise ValueError(f"Sam2Spec: flags must be true or false: {', '.join(bad)}")
        for name in (
            "encoder_stages",
            "encoder_global_attn_indexes",
            "encoder_window_spec",
            "encoder_window_pos_embed_size",
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self._check_positive(
            "encoder_embed_dim",
            "encoder_num_heads",
            "image_size",
            "d_model",
            "sam_mlp_dim",
            "num_maskmem",
            "memory_attention_layers",
            "memory_attention_dim_feedforward",
            "mem_dim",
        )
        if len(self.encoder_stages) != 4 or min(self.encoder_stages) < 1:
            raise ValueError(f"encoder_stages must be 4 positive depths, got {self.encoder_stages}")
        if len(self.encoder_window_spec) != 4 or min(self.encoder_window_spec) < 1:
            raise ValueError(
                f"encoder_window_spec must be 4 positive sizes, got {self.encoder_window_spec}"
            )
        size = self.encoder_window_pos_embed_size
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"encoder_window_pos_embed_size must be 2 positive sizes, got {size}")
        if not 0 <= self.encoder_q_pool <= 3:
            raise ValueError(f"encoder_q_pool must be 0..3, got {self.encoder_q_pool}")
        depth = sum(self.encoder_stages)
        bad = [i for i in self.encoder_global_attn_indexes if not 0 <= i < depth]
        if bad:
            raise ValueError(f"global attention indexes {bad} outside 0..{depth - 1}")
        # the trunk's grid (stride 4) must tile into the first stage's windows, and the
        # coarsest kept level is stride 16: image sizes are multiples of 4 * window and of 32
        stride = 4 * self.encoder_window_spec[0]
        if self.image_size % 32 or self.image_size % stride:
            raise ValueError(
                f"image_size {self.image_size} must be a multiple of 32 and of 4 x the first "
                f"window size ({stride})"
            )
        if self.proj_tpos_enc_in_obj_ptrs and not self.add_tpos_enc_to_obj_ptrs:
            raise ValueError("proj_tpos_enc_in_obj_ptrs needs add_tpos_enc_to_obj_ptrs")
        if self.d_model % 32:
            raise ValueError(f"d_model must be a multiple of 32, got {self.d_model}")
        if self.mem_dim > self.d_model or self.d_model % self.mem_dim:
            raise ValueError(
                f"mem_dim must divide the hidden width d_model={self.d_model}, got {self.mem_dim}"
            )

    @property
    def channel_list(self) -> list[int]:
        """The trunk's stage widths, coarsest first (the neck's ``backbone_channel_list``)."""
        return [self.encoder_embed_dim * 2**i for i in range(3, -1, -1)]


_SAM2_0 = dict(
    no_obj_embed_spatial=False,
    add_tpos_enc_to_obj_ptrs=False,
    proj_tpos_enc_in_obj_ptrs=False,
    use_signed_tpos_enc_to_obj_ptrs=False,
)
_TINY = dict(
    encoder_embed_dim=96,
    encoder_num_heads=1,
    encoder_stages=(1, 2, 7, 2),
    encoder_global_attn_indexes=(5, 7, 9),
    encoder_window_pos_embed_size=(7, 7),
)
_SMALL = dict(
    encoder_embed_dim=96,
    encoder_num_heads=1,
    encoder_stages=(1, 2, 11, 2),
    encoder_global_attn_indexes=(7, 10, 13),
    encoder_window_pos_embed_size=(7, 7),
)
_BASE_PLUS = dict(
    encoder_embed_dim=112,
    encoder_num_heads=2,
    encoder_stages=(2, 3, 16, 3),
    encoder_global_attn_indexes=(12, 16, 20),
)
_LARGE = dict(
    encoder_embed_dim=144,
    encoder_num_heads=2,
    encoder_stages=(2, 6, 36, 4),
    encoder_global_attn_indexes=(23, 33, 43),
    encoder_window_pos_embed_size=(7, 7),
    encoder_window_spec=(8, 4, 16, 8),
)
_SIZES = {"tiny": _TINY, "small": _SMALL, "base_plus": _BASE_PLUS, "large": _LARGE}

#: the released models by checkpoint name: ``sam2.1_hiera_*`` (SAM 2.1) and ``sam2_hiera_*``
SAM2_SPECS: dict[str, Sam2Spec] = {
    **{f"sam2.1_hiera_{name}": Sam2Spec(**size) for name, size in _SIZES.items()},
    **{f"sam2_hiera_{name}": Sam2Spec(**size, **_SAM2_0) for name, size in _SIZES.items()},
}

#: upstream's config file of each released model (under the sam2 package)
SAM2_CONFIGS = {
    f"{prefix}_hiera_{name}": f"configs/{version}/{prefix}_hiera_{short}.yaml"
    for prefix, version in (("sam2.1", "sam2.1"), ("sam2", "sam2"))
    for name, short in (("tiny", "t"), ("small", "s"), ("base_plus", "b+"), ("large", "l"))
}


def build_sam2_model(
    spec: Sam2Spec,
    apply_postprocessing: bool = True,
    model_cls: type[SAM2Base] = SAM2Base,
    **model_kwargs: Any,
) -> SAM2Base:
    """A SAM 2 model of ``spec`` with fresh (random) weights, in eval mode, ``spec`` attached.
    ``apply_postprocessing``: the decoder's dynamic multimask fallback, as upstream's
    ``build_sam2`` (on by default). ``model_cls``: :class:`SAM2Base` or a subclass (the video
    predictor), given ``model_kwargs`` too."""
    if not issubclass(model_cls, SAM2Base):
        raise TypeError(f"model_cls must subclass SAM2Base, got {model_cls!r}")
    d_model, stride, side = spec.d_model, 16, spec.image_size // 16
    trunk = Hiera(
        embed_dim=spec.encoder_embed_dim,
        num_heads=spec.encoder_num_heads,
        q_pool=spec.encoder_q_pool,
        stages=spec.encoder_stages,
        global_att_blocks=spec.encoder_global_attn_indexes,
        window_pos_embed_bkg_spatial_size=spec.encoder_window_pos_embed_size,
        window_spec=spec.encoder_window_spec,
    )
    neck = FpnNeck(
        position_encoding=PositionEmbeddingSine(
            num_pos_feats=d_model, normalize=True, scale=None, temperature=10000
        ),
        d_model=d_model,
        backbone_channel_list=spec.channel_list,
        fpn_top_down_levels=[2, 3],
        fpn_interp_model="nearest",
    )

    def rope(**kw) -> RoPEAttention:
        return RoPEAttention(
            rope_theta=10000.0,
            feat_sizes=[side, side],
            embedding_dim=d_model,
            num_heads=1,
            downsample_rate=1,
            dropout=0.1,
            **kw,
        )

    layer = MemoryAttentionLayer(
        activation="relu",
        dim_feedforward=spec.memory_attention_dim_feedforward,
        dropout=0.1,
        pos_enc_at_attn=False,
        self_attention=rope(),
        d_model=d_model,
        pos_enc_at_cross_attn_keys=True,
        pos_enc_at_cross_attn_queries=False,
        cross_attention=rope(rope_k_repeat=True, kv_in_dim=spec.mem_dim),
    )
    memory_attention = MemoryAttention(
        d_model=d_model,
        pos_enc_at_input=True,
        layer=layer,
        num_layers=spec.memory_attention_layers,
    )
    memory_encoder = MemoryEncoder(
        out_dim=spec.mem_dim,
        in_dim=d_model,
        position_encoding=PositionEmbeddingSine(
            num_pos_feats=spec.mem_dim, normalize=True, scale=None, temperature=10000
        ),
        mask_downsampler=MaskDownSampler(kernel_size=3, stride=2, padding=1, embed_dim=d_model),
        fuser=Fuser(
            layer=CXBlock(
                dim=d_model, kernel_size=7, padding=3, layer_scale_init_value=1e-6, use_dwconv=True
            ),
            num_layers=2,
        ),
    )
    model = model_cls(
        image_encoder=ImageEncoder(trunk=trunk, neck=neck, scalp=1),
        memory_attention=memory_attention,
        memory_encoder=memory_encoder,
        sam_mlp_dim=spec.sam_mlp_dim,
        num_maskmem=spec.num_maskmem,
        image_size=spec.image_size,
        backbone_stride=stride,
        no_obj_embed_spatial=spec.no_obj_embed_spatial,
        add_tpos_enc_to_obj_ptrs=spec.add_tpos_enc_to_obj_ptrs,
        proj_tpos_enc_in_obj_ptrs=spec.proj_tpos_enc_in_obj_ptrs,
        use_signed_tpos_enc_to_obj_ptrs=spec.use_signed_tpos_enc_to_obj_ptrs,
        sam_mask_decoder_extra_args=POSTPROCESSING_DECODER_ARGS if apply_postprocessing else None,
        **model_kwargs,
    )
    model.spec = spec
    model.eval()
    return model


__all__ = [
    "POSTPROCESSING_DECODER_ARGS",
    "SAM2_CONFIGS",
    "SAM2_SPECS",
    "Sam2Spec",
    "build_sam2_model",
]
