"""The official PyTorch SAM, built for comparison (needs the ``torch`` extra).

Nothing here is imported by the runtime package; ``paddle-sam align`` and the parity tests
use it to build segment-anything's modules with the same sizes as a :class:`SamSpec`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ..models.build_sam import SamSpec


def import_reference() -> tuple[Any, Any]:
    """``(torch, segment_anything)`` or an ImportError that says how to install them."""
    try:
        import segment_anything
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the PyTorch reference is not installed; it is a test-only extra: "
            "pip install 'paddle-sam[torch]' (torch==2.14.1, segment-anything==1.0)"
        ) from exc
    return torch, segment_anything


def build_reference_sam(spec: SamSpec):
    """segment-anything's ``Sam`` with the sizes of ``spec`` (random init, eval mode)."""
    torch, _ = import_reference()
    from segment_anything.modeling import (
        ImageEncoderViT,
        MaskDecoder,
        PromptEncoder,
        Sam,
        TwoWayTransformer,
    )

    grid = spec.image_embedding_size
    sam = Sam(
        image_encoder=ImageEncoderViT(
            depth=spec.encoder_depth,
            embed_dim=spec.encoder_embed_dim,
            img_size=spec.image_size,
            mlp_ratio=spec.mlp_ratio,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
            num_heads=spec.encoder_num_heads,
            patch_size=spec.vit_patch_size,
            qkv_bias=True,
            use_rel_pos=True,
            global_attn_indexes=spec.encoder_global_attn_indexes,
            window_size=spec.window_size,
            out_chans=spec.prompt_embed_dim,
        ),
        prompt_encoder=PromptEncoder(
            embed_dim=spec.prompt_embed_dim,
            image_embedding_size=(grid, grid),
            input_image_size=(spec.image_size, spec.image_size),
            mask_in_chans=spec.mask_in_chans,
        ),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=spec.num_multimask_outputs,
            transformer=TwoWayTransformer(
                depth=spec.decoder_depth,
                embedding_dim=spec.prompt_embed_dim,
                mlp_dim=spec.decoder_mlp_dim,
                num_heads=spec.decoder_num_heads,
            ),
            transformer_dim=spec.prompt_embed_dim,
            iou_head_depth=spec.iou_head_depth,
            iou_head_hidden_dim=spec.iou_head_hidden_dim,
        ),
    )
    return sam.eval()


def perturb_weights_(model, seed: int = 0, scale: float = 0.02) -> None:
    """Add small noise to every checkpoint tensor so none stays at a trivial 0 or 1.

    Default inits leave norms at 1, biases and rel-pos tables at 0: a port could get those
    wrong and still match. Relative noise keeps large tensors' statistics sane.
    """
    torch, _ = import_reference()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # state_dict(): parameters and persistent buffers only (pixel_mean/std are fixed)
        for t in model.state_dict().values():
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
            t.add_(scale * noise * (t.abs().mean() + 0.5))


def numpy_state_dict(model) -> dict[str, np.ndarray]:
    """A torch module's state dict as float numpy arrays (official key names and layouts)."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
