"""Post-processing of the tracker's mask scores (upstream: sam3/model/sam3_tracker_utils.py).

Upstream finds connected components with cc_torch or Triton on the GPU and with scikit-image's
``label`` (full, i.e. 8-, connectivity) on the CPU; :func:`connected_components` gives the same
components and areas.
"""

from __future__ import annotations

import numpy as np
import paddle

from ..common import connected_components


def _component_areas(mask: np.ndarray) -> np.ndarray:
    """For an H x W bool mask, each pixel's 8-connected component area (0 outside the mask)."""
    _, labels, areas = connected_components(mask)
    per_pixel = areas[labels]
    per_pixel[~mask] = 0
    return per_pixel


def fill_holes_in_mask_scores(
    mask: paddle.Tensor, max_area: int, fill_holes: bool = True, remove_sprinkles: bool = True
) -> paddle.Tensor:
    """Mask scores ``B x 1 x H x W`` with small holes filled and small sprinkles removed.

    Background components of at most ``max_area`` pixels get the score 0.1 (foreground);
    then foreground components of at most ``min(max_area, half the mask's area)`` pixels get
    -0.1 (background), so that tiny objects are kept."""
    if max_area <= 0:
        return mask
    if mask.ndim != 4 or mask.shape[1] != 1:
        raise ValueError(f"mask scores must be B x 1 x H x W, got {list(mask.shape)}")
    scores = mask.astype("float32").numpy().copy()
    for b in range(scores.shape[0]):
        s = scores[b, 0]
        if fill_holes:
            bg = s <= 0
            s[bg & (_component_areas(bg) <= max_area)] = 0.1
        if remove_sprinkles:
            fg = s > 0
            thresh = min(int(fg.sum()) // 2, max_area)
            s[fg & (_component_areas(fg) <= thresh)] = -0.1
    return paddle.to_tensor(scores).astype(mask.dtype)


__all__ = ["fill_holes_in_mask_scores"]
