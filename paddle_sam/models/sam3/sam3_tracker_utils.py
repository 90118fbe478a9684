"""Post-processing of the tracker's mask scores and simulated correction clicks (upstream:
sam3/model/sam3_tracker_utils.py).

Upstream finds connected components with cc_torch or Triton on the GPU and with scikit-image's
``label`` (full, i.e. 8-, connectivity) on the CPU; :func:`connected_components` gives the same
components and areas. Upstream's click at the centre of an error region takes a Euclidean
distance transform in Triton on the GPU, OpenCV's ``distanceTransform`` on the CPU (its
``_slow`` variant); :func:`sample_one_point_from_error_center` is the OpenCV one.
"""

from __future__ import annotations

import cv2
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


def _error_masks(gt_masks: paddle.Tensor, pred_masks: paddle.Tensor | None):
    """(false positives, false negatives) of bool ``B x 1 x H x W`` masks, as NumPy."""
    gt = gt_masks.numpy() if isinstance(gt_masks, paddle.Tensor) else np.asarray(gt_masks)
    if pred_masks is None:  # no prediction: every object pixel is a miss
        pred = np.zeros_like(gt)
    else:
        pred = (
            pred_masks.numpy() if isinstance(pred_masks, paddle.Tensor) else np.asarray(pred_masks)
        )
    if gt.dtype != np.bool_ or pred.dtype != np.bool_:
        raise TypeError(f"bool masks expected, got {gt.dtype} and {pred.dtype}")
    if gt.ndim != 4 or gt.shape[1] != 1 or pred.shape != gt.shape:
        raise ValueError(
            f"masks must be B x 1 x H x W of one shape, got {list(gt.shape)} and {list(pred.shape)}"
        )
    return gt, ~gt & pred, gt & ~pred


def sample_random_points_from_errors(
    gt_masks: paddle.Tensor, pred_masks: paddle.Tensor | None, num_pt: int = 1
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """``num_pt`` clicks per mask drawn uniformly from its error region (upstream
    ``sample_random_points_from_errors``): a negative click (label 0) on a false positive or
    a positive one (label 1) on a false negative, each error pixel as likely; where the
    prediction is already right, a negative click on the background. Returns points
    ``B x num_pt x 2`` float32 ``(x, y)`` and labels ``B x num_pt`` int32 (paddle's random
    generator: the same distribution as upstream's, not the same draws)."""
    if num_pt < 0:
        raise ValueError(f"num_pt must be >= 0, got {num_pt}")
    gt, fp, fn = _error_masks(gt_masks, pred_masks)
    B, _, H, W = gt.shape
    all_correct = ~np.any(fp | fn, axis=(1, 2, 3), keepdims=True)
    noise = paddle.rand([B, num_pt, H, W, 2]).numpy()
    noise[..., 0] *= fp | (all_correct & ~gt)
    noise[..., 1] *= fn
    idx = noise.reshape(B, num_pt, -1).argmax(axis=2)
    labels = (idx % 2).astype(np.int32)
    idx = idx // 2
    points = np.stack([idx % W, idx // W], axis=2).astype(np.float32)
    return paddle.to_tensor(points), paddle.to_tensor(labels)


def sample_one_point_from_error_center(
    gt_masks: paddle.Tensor, pred_masks: paddle.Tensor | None, padding: bool = True
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """One click per mask at the centre of its largest error (upstream
    ``sample_one_point_from_error_center``, the RITM rule): the error pixel farthest from the
    error region's boundary (Euclidean distance transform, the image border counting as
    boundary with ``padding``), positive (label 1) if it is a false negative farther in than
    any false positive, else negative. Returns points ``B x 1 x 2`` float32 ``(x, y)`` and
    labels ``B x 1`` int32."""
    _, fp, fn = _error_masks(gt_masks, pred_masks)
    B, _, _, W = fp.shape
    points = np.zeros((B, 1, 2), np.float32)
    labels = np.ones((B, 1), np.int32)
    pad = ((1, 1), (1, 1)) if padding else ((0, 0), (0, 0))
    for b in range(B):
        dists = []
        for err in (fn[b, 0], fp[b, 0]):
            dt = cv2.distanceTransform(np.pad(err, pad).astype(np.uint8), cv2.DIST_L2, 0)
            dists.append((dt[1:-1, 1:-1] if padding else dt).reshape(-1))
        fn_dt, fp_dt = dists
        fn_arg, fp_arg = int(np.argmax(fn_dt)), int(np.argmax(fp_dt))
        positive = bool(fn_dt[fn_arg] > fp_dt[fp_arg])
        idx = fn_arg if positive else fp_arg
        points[b, 0] = (idx % W, idx // W)
        labels[b, 0] = int(positive)
    return paddle.to_tensor(points), paddle.to_tensor(labels)


def get_next_point(
    gt_masks: paddle.Tensor, pred_masks: paddle.Tensor | None, method: str
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The next simulated correction click: ``"uniform"`` from the errors or ``"center"`` of
    the largest error (upstream ``get_next_point``)."""
    if method == "uniform":
        return sample_random_points_from_errors(gt_masks, pred_masks)
    if method == "center":
        return sample_one_point_from_error_center(gt_masks, pred_masks)
    raise ValueError(f"unknown sampling method {method!r} (uniform, center)")


__all__ = [
    "fill_holes_in_mask_scores",
    "get_next_point",
    "sample_one_point_from_error_center",
    "sample_random_points_from_errors",
]
