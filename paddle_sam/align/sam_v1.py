"""Per-module alignment of the Paddle SAM against the official PyTorch SAM (segment-anything).

Both models run the same image and prompts through their predictors; forward hooks record
every compared module's output (:mod:`.common`), and each pair is scored by cosine similarity
and max/mean absolute error. The first module below the bar is named: that is where to look
for a bug. The parity tests use this same code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .common import (
    COS_THRESHOLD,
    MASK_AGREEMENT,
    MASK_MARGIN,
    Alignment,
    AlignReport,
    AlignRow,
    click_cases,
    compare,
    default_image,
    numpy_state_dict,
    run_click_cases,
    submodule,
)

# modules compared on every call, in execution order (names are shared by both models)
ENCODER_MODULES = ("image_encoder.patch_embed", "image_encoder.blocks.*", "image_encoder.neck")
DECODER_MODULES = ("prompt_encoder", "mask_decoder.transformer", "mask_decoder")

# segment-anything's predictor takes SAM 2's prompts
default_cases = click_cases


def module_names(depth: int) -> list[str]:
    """The compared modules of a SAM with ``depth`` encoder blocks."""
    out = []
    for n in ENCODER_MODULES + DECODER_MODULES:
        if n.endswith(".*"):
            out.extend(f"{n[:-2]}.{i}" for i in range(depth))
        else:
            out.append(n)
    return out


def converted_model(torch_sam, spec):
    """Our SAM of ``spec`` with ``torch_sam``'s weights, through our converter."""
    from ..convert.core import load_state_strict
    from ..convert.sam_v1 import convert_state_dict
    from ..models.sam_v1.build_sam import build_sam_model

    ours = build_sam_model(spec)
    load_state_strict(ours, convert_state_dict(numpy_state_dict(torch_sam), spec))
    return ours


def random_pair(spec, seed: int = 0, scale: float = 0.1) -> tuple[Any, Any]:
    """(segment-anything's SAM, ours) of ``spec`` with the same random weights, every tensor
    perturbed (none at a trivial 0 or 1)."""
    import torch

    from .reference import build_reference_sam, perturb_weights_

    torch.manual_seed(seed)
    ref = build_reference_sam(spec)
    perturb_weights_(ref, seed, scale)
    return ref, converted_model(ref, spec)


def align_sam(
    torch_sam,
    paddle_sam,
    image: np.ndarray | None = None,
    cases: list[tuple[str, dict[str, Any]]] | None = None,
) -> AlignReport:
    """Run both models through their predictors and compare module by module: the image
    encoder's patch embedding, blocks and neck on ``set_image``, then the prompt encoder and
    mask decoder on each of ``cases`` (:func:`~.common.click_cases` by default)."""
    import torch
    from segment_anything import SamPredictor as TorchPredictor

    from ..predict.sam_v1.predictor import SamPredictor

    image = default_image() if image is None else image
    cases = click_cases(*image.shape[:2]) if cases is None else cases
    names = module_names(len(paddle_sam.image_encoder.blocks))
    pairs = [(n, submodule(torch_sam, n), submodule(paddle_sam, n)) for n in names]
    with Alignment(pairs) as al:
        ref, ours = TorchPredictor(torch_sam), SamPredictor(paddle_sam)
        ours.fast_decoder = False  # upstream's modules, so that each one can be compared
        with al.stage():
            with torch.no_grad():
                ref.set_image(image)
            ours.set_image(image)
        al.output("image_embedding", ref.get_image_embedding(), ours.get_image_embedding())
        run_click_cases(al, ref.predict, ours.predict, cases, float(torch_sam.mask_threshold))
    al.report.meta.update(family="sam_v1", image_size=list(image.shape[:2]))
    return al.report


__all__ = [
    "COS_THRESHOLD",
    "MASK_AGREEMENT",
    "MASK_MARGIN",
    "AlignReport",
    "AlignRow",
    "align_sam",
    "compare",
    "converted_model",
    "default_cases",
    "default_image",
    "module_names",
    "random_pair",
]
