"""SAM v1 sizes as frozen specs in a registry, and the model of a spec (upstream:
build_sam.py, without the checkpoint loading, which :mod:`paddle_sam.loading.sam_v1` adds).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common import Spec
from .image_encoder import ImageEncoderViT
from .mask_decoder import MaskDecoder
from .prompt_encoder import PromptEncoder
from .sam import Sam
from .transformer import TwoWayTransformer


@dataclass(frozen=True)
class SamSpec(Spec):
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
        self._check_positive(
            "encoder_embed_dim",
            "encoder_depth",
            "encoder_num_heads",
            "image_size",
            "vit_patch_size",
            "window_size",
            "mlp_ratio",
            "prompt_embed_dim",
            "mask_in_chans",
            "decoder_depth",
            "decoder_mlp_dim",
            "decoder_num_heads",
            "num_multimask_outputs",
            "iou_head_depth",
            "iou_head_hidden_dim",
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


def build_sam_model(spec: SamSpec) -> Sam:
    """A SAM v1 model of ``spec`` with fresh (random) weights, in eval mode, ``spec`` attached."""
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
    return sam


__all__ = ["SAM_SPECS", "SamSpec", "build_sam_model", "module_kwargs"]
