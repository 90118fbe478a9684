"""Model sizes as frozen specs in a registry, and the builders (upstream: build_sam.py).

``sam_model_registry["vit_b"](checkpoint=...)`` works as upstream, with a converted
``.pdparams`` file (see ``paddle-sam convert``). Smaller custom sizes are declared with
:class:`SamSpec` and built with :func:`build_sam`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .image_encoder import ImageEncoderViT
from .mask_decoder import MaskDecoder
from .prompt_encoder import PromptEncoder
from .sam import Sam
from .transformer import TwoWayTransformer


@dataclass(frozen=True)
class SamSpec:
    """Every size of a SAM v1 model. Defaults are the shared values of the official models."""

    encoder_embed_dim: int
    encoder_depth: int
    encoder_num_heads: int
    encoder_global_attn_indexes: tuple[int, ...]
    image_size: int = 1024
    vit_patch_size: int = 16
    window_size: int = 14
    mlp_ratio: float = 4.0
    prompt_embed_dim: int = 256
    mask_in_chans: int = 16
    decoder_depth: int = 2
    decoder_mlp_dim: int = 2048
    decoder_num_heads: int = 8
    num_multimask_outputs: int = 3
    iou_head_depth: int = 3
    iou_head_hidden_dim: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "encoder_global_attn_indexes", tuple(self.encoder_global_attn_indexes)
        )
        if self.image_size % self.vit_patch_size:
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of the patch size "
                f"{self.vit_patch_size}"
            )
        if self.encoder_embed_dim % self.encoder_num_heads:
            raise ValueError(
                f"encoder_num_heads {self.encoder_num_heads} must divide encoder_embed_dim "
                f"{self.encoder_embed_dim}"
            )
        bad = [i for i in self.encoder_global_attn_indexes if not 0 <= i < self.encoder_depth]
        if bad:
            raise ValueError(f"global attention indexes {bad} outside 0..{self.encoder_depth - 1}")

    @property
    def image_embedding_size(self) -> int:
        return self.image_size // self.vit_patch_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SamSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown SamSpec fields: {unknown}")
        return cls(**d)


SAM_SPECS: dict[str, SamSpec] = {
    "vit_h": SamSpec(1280, 32, 16, (7, 15, 23, 31)),
    "vit_l": SamSpec(1024, 24, 16, (5, 11, 17, 23)),
    "vit_b": SamSpec(768, 12, 12, (2, 5, 8, 11)),
    # the bundled default model (paddle_sam/assets/sam_tiny_synthetic.pdparams): trained by
    # configs/sam_tiny_synthetic.yaml on generated shapes only; 256 px input, 16 x 16 grid
    "vit_tiny_synthetic": SamSpec(
        encoder_embed_dim=128,
        encoder_depth=4,
        encoder_num_heads=4,
        encoder_global_attn_indexes=(1, 3),
        image_size=256,
        window_size=4,
        prompt_embed_dim=128,
        decoder_mlp_dim=512,
        decoder_num_heads=4,
        iou_head_hidden_dim=128,
    ),
}


def module_kwargs(spec: SamSpec) -> dict[str, dict]:
    """Constructor arguments of each submodule, as upstream's ``_build_sam`` passes them.

    Shared with the PyTorch reference builder (``paddle_sam.align.reference``), which adds its
    own ``norm_layer``; ours takes the encoder's LayerNorm eps as ``norm_eps``.
    """
    grid = spec.image_embedding_size
    return {
        "image_encoder": dict(
            depth=spec.encoder_depth,
            embed_dim=spec.encoder_embed_dim,
            img_size=spec.image_size,
            mlp_ratio=spec.mlp_ratio,
            num_heads=spec.encoder_num_heads,
            patch_size=spec.vit_patch_size,
            qkv_bias=True,
            use_rel_pos=True,
            global_attn_indexes=spec.encoder_global_attn_indexes,
            window_size=spec.window_size,
            out_chans=spec.prompt_embed_dim,
        ),
        "prompt_encoder": dict(
            embed_dim=spec.prompt_embed_dim,
            image_embedding_size=(grid, grid),
            input_image_size=(spec.image_size, spec.image_size),
            mask_in_chans=spec.mask_in_chans,
        ),
        "transformer": dict(
            depth=spec.decoder_depth,
            embedding_dim=spec.prompt_embed_dim,
            mlp_dim=spec.decoder_mlp_dim,
            num_heads=spec.decoder_num_heads,
        ),
        "mask_decoder": dict(
            num_multimask_outputs=spec.num_multimask_outputs,
            transformer_dim=spec.prompt_embed_dim,
            iou_head_depth=spec.iou_head_depth,
            iou_head_hidden_dim=spec.iou_head_hidden_dim,
        ),
    }


def build_sam(spec: SamSpec, checkpoint: str | os.PathLike | None = None) -> Sam:
    """Build a SAM model of ``spec``; load a converted checkpoint strictly if given."""
    kw = module_kwargs(spec)
    sam = Sam(
        image_encoder=ImageEncoderViT(norm_eps=1e-6, **kw["image_encoder"]),
        prompt_encoder=PromptEncoder(**kw["prompt_encoder"]),
        mask_decoder=MaskDecoder(
            transformer=TwoWayTransformer(**kw["transformer"]), **kw["mask_decoder"]
        ),
    )
    sam.spec = spec
    sam.eval()
    if checkpoint is not None:
        from ..convert.checkpoint import load_sam_weights

        load_sam_weights(sam, checkpoint)
    return sam


def _builder(name: str):
    def build(checkpoint: str | os.PathLike | None = None) -> Sam:
        return build_sam(SAM_SPECS[name], checkpoint)

    build.__name__ = f"build_sam_{name}"
    build.__doc__ = f"Build SAM {name}; ``checkpoint`` is a converted .pdparams file."
    return build


build_sam_vit_h = _builder("vit_h")
build_sam_vit_l = _builder("vit_l")
build_sam_vit_b = _builder("vit_b")

sam_model_registry = {
    "default": build_sam_vit_h,
    "vit_h": build_sam_vit_h,
    "vit_l": build_sam_vit_l,
    "vit_b": build_sam_vit_b,
}

__all__ = ["SAM_SPECS", "SamSpec", "build_sam", "sam_model_registry"]
