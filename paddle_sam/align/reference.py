"""The official PyTorch SAM, built for comparison (needs the ``torch`` extra).

Nothing here is imported by the runtime package; ``paddle-sam align`` and the parity tests
use it to build segment-anything's modules with the same sizes as a :class:`SamSpec`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..models.sam_v1.build_sam import SamSpec, module_kwargs
from .common import load_official, numpy_state_dict, perturb_torch_


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


def build_reference_sam(spec: SamSpec, checkpoint: str | None = None):
    """segment-anything's ``Sam`` with the sizes of ``spec`` in eval mode: random weights, or
    the official ``checkpoint`` loaded strictly (``torch.load`` with ``weights_only=True``)."""
    torch, _ = import_reference()
    from segment_anything.modeling import (
        ImageEncoderViT,
        MaskDecoder,
        PromptEncoder,
        Sam,
        TwoWayTransformer,
    )

    kw = module_kwargs(spec)
    sam = Sam(
        image_encoder=ImageEncoderViT(
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), **kw["image_encoder"]
        ),
        prompt_encoder=PromptEncoder(**kw["prompt_encoder"]),
        mask_decoder=MaskDecoder(
            transformer=TwoWayTransformer(**kw["transformer"]), **kw["mask_decoder"]
        ),
    )
    if checkpoint is not None:
        load_official(sam, checkpoint)
    return sam.eval()


def perturb_weights_(model, seed: int = 0, scale: float = 0.02) -> None:
    """Add small noise to every checkpoint tensor so none stays at a trivial 0 or 1
    (:func:`~.common.perturb_torch_`; pixel_mean/std are buffers outside the state dict)."""
    perturb_torch_(model, seed, scale)


__all__ = ["build_reference_sam", "import_reference", "numpy_state_dict", "perturb_weights_"]
