"""Paired models for parity tests: the official torch SAM and ours with identical weights."""

from __future__ import annotations

import numpy as np
import paddle

from paddle_sam.loading.sam_v1 import build_sam
from paddle_sam.models.sam_v1.build_sam import SamSpec


def make_pair(spec: SamSpec, seed: int = 0, scale: float = 0.1):
    """(torch_sam, paddle_sam) with the same perturbed random weights."""
    import torch

    from paddle_sam.align.reference import build_reference_sam, numpy_state_dict, perturb_weights_
    from paddle_sam.convert.sam_v1 import convert_state_dict

    torch.manual_seed(seed)
    ref = build_reference_sam(spec)
    perturb_weights_(ref, seed, scale)
    ours = build_sam(spec)
    state = convert_state_dict(numpy_state_dict(ref), spec)
    ours.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    return ref, ours


def image(h: int, w: int, seed: int = 0) -> np.ndarray:
    from paddle_sam.align.sam_v1 import default_image

    return default_image(h, w, seed)
