"""Non-maximum suppression on a pairwise IoU matrix (upstream: sam3/perflib/nms.py).

Upstream runs ``generic_nms`` with the ``torch_generic_nms`` CUDA extension or a Triton kernel
on the GPU and with ``generic_nms_cpu`` on the CPU; here ``generic_nms`` always computes what
``generic_nms_cpu`` does.
"""

from __future__ import annotations

import numpy as np
import paddle

from .masks_ops import mask_iou


def nms_masks(
    pred_probs: paddle.Tensor,
    pred_masks: paddle.Tensor,
    prob_threshold: float,
    iou_threshold: float,
) -> paddle.Tensor:
    """``(num_det,)`` bool: which detections survive the score threshold and a mask NMS
    (upstream: ``perflib.nms.nms_masks``).

    ``pred_probs``: ``(num_det,)`` scores; ``pred_masks``: ``(num_det, H, W)`` mask logits
    (foreground where > 0). Detections scoring above ``prob_threshold`` go through NMS with
    ``iou_threshold`` on their mask IoUs."""
    # the threshold in the scores' dtype, as torch compares a tensor with a Python scalar
    is_valid = pred_probs > paddle.full_like(pred_probs, prob_threshold)
    valid_np = is_valid.numpy()
    if not valid_np.any():
        return is_valid  # no valid detection, return empty keep mask
    valid_idx = np.flatnonzero(valid_np)
    index = paddle.to_tensor(valid_idx, dtype="int64", place=pred_probs.place)
    probs = paddle.gather(pred_probs, index)
    masks_binary = paddle.gather(pred_masks, index) > 0
    ious = mask_iou(masks_binary, masks_binary)  # (num_valid, num_valid)
    kept_inds = generic_nms(ious, probs, iou_threshold)
    keep = np.zeros(valid_np.shape, dtype=bool)
    keep[valid_idx[kept_inds.numpy()]] = True
    return paddle.to_tensor(keep, place=pred_probs.place)


def generic_nms(
    ious: paddle.Tensor, scores: paddle.Tensor, iou_threshold: float = 0.5
) -> paddle.Tensor:
    """Indices (int64) of the kept boxes, best score first, given their pairwise IoU matrix
    (upstream: ``perflib.nms.generic_nms``, a ``torchvision.ops.nms`` on an IoU matrix)."""
    if ious.ndim != 2 or ious.shape[0] != ious.shape[1]:
        raise ValueError(f"ious must be a square matrix, got {list(ious.shape)}")
    if scores.ndim != 1 or scores.shape[0] != ious.shape[0]:
        raise ValueError(f"scores must be ({ious.shape[0]},), got {list(scores.shape)}")
    return generic_nms_cpu(ious, scores, iou_threshold)


def generic_nms_cpu(
    ious: paddle.Tensor, scores: paddle.Tensor, iou_threshold: float = 0.5
) -> paddle.Tensor:
    """Greedy NMS in NumPy (upstream: ``perflib.nms.generic_nms_cpu``): visit the boxes by
    decreasing score, keep one, drop the remaining boxes whose IoU with it exceeds
    ``iou_threshold``."""
    ious_np = ious.astype("float32").numpy()
    scores_np = scores.astype("float32").numpy()
    order = scores_np.argsort()[::-1]
    kept_inds = []
    while order.size > 0:
        i = order.item(0)
        kept_inds.append(i)
        inds = np.where(ious_np[i, order[1:]] <= iou_threshold)[0]
        order = order[inds + 1]
    return paddle.to_tensor(np.asarray(kept_inds, dtype=np.int64), place=scores.place)
