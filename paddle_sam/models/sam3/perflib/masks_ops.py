"""Boxes and IoUs of binary masks (upstream: sam3/perflib/masks_ops.py; ``mask_to_box`` from
sam3/model/sam3_tracker_utils.py and ``fast_diag_box_iou`` from sam3/model/box_ops.py)."""

from __future__ import annotations

from collections.abc import Sequence

import paddle


def masks_to_boxes(masks: paddle.Tensor, obj_ids: Sequence[int]) -> paddle.Tensor:
    """``N x 4`` float32 xyxy boxes (inclusive pixel indices) of ``N x H x W`` masks
    (upstream: ``perflib.masks_ops.masks_to_boxes``).

    A pixel belongs to a mask where it is non-zero. An empty mask gets ``[W, H, 0, 0]``, and
    an input without elements a ``0 x 4`` result, as upstream."""
    if masks.shape[0] != len(obj_ids):
        raise ValueError(f"{masks.shape[0]} masks but {len(obj_ids)} object ids")
    if masks.ndim != 3:
        raise ValueError(f"masks must be N x H x W, got {list(masks.shape)}")
    if masks.numel() == 0:
        return paddle.zeros([0, 4], dtype="float32")

    _, H, W = masks.shape
    with_obj = masks if masks.dtype == paddle.bool else masks != 0
    cols = with_obj.any(axis=1)  # N x W: which columns hold the object
    rows = with_obj.any(axis=2)  # N x H: which rows hold the object
    x = paddle.arange(W, dtype="int64").unsqueeze(0).expand_as(cols)
    y = paddle.arange(H, dtype="int64").unsqueeze(0).expand_as(rows)
    zero_x, zero_y = paddle.zeros_like(x), paddle.zeros_like(y)
    x0 = paddle.where(cols, x, paddle.full_like(x, W)).min(axis=1)
    y0 = paddle.where(rows, y, paddle.full_like(y, H)).min(axis=1)
    x1 = paddle.where(cols, x, zero_x).max(axis=1)
    y1 = paddle.where(rows, y, zero_y).max(axis=1)
    return paddle.stack([x0, y0, x1, y1], axis=1).astype("float32")


def mask_iou(pred_masks: paddle.Tensor, gt_masks: paddle.Tensor) -> paddle.Tensor:
    """``N x M`` float32 IoUs between bool masks ``N x H x W`` and ``M x H x W`` (upstream:
    ``perflib.masks_ops.mask_iou``); a pair whose union is empty gets 0.

    Intersections come from one float32 matmul instead of upstream's ``N x M x HW`` broadcast:
    every partial sum is an integer below 2**24, so the counts, and the IoUs, are the same."""
    if pred_masks.dtype != paddle.bool or gt_masks.dtype != paddle.bool:
        raise TypeError(f"bool masks expected, got {pred_masks.dtype} and {gt_masks.dtype}")
    N, H, W = pred_masks.shape
    M = gt_masks.shape[0]
    if N == 0 or M == 0 or H * W == 0:
        return paddle.zeros([N, M], dtype="float32")
    pred = pred_masks.reshape([N, H * W]).astype("float32")
    gt = gt_masks.reshape([M, H * W]).astype("float32")
    intersection = paddle.matmul(pred, gt, transpose_y=True)
    union = pred.sum(axis=1).unsqueeze(1) + gt.sum(axis=1).unsqueeze(0) - intersection
    return intersection / union.clip(min=1.0)


def mask_to_box(masks: paddle.Tensor) -> paddle.Tensor:
    """``B x 1 x 4`` int32 xyxy boxes (inclusive pixel indices) of bool masks ``B x 1 x H x W``
    (upstream: ``sam3_tracker_utils.mask_to_box``); an empty mask gets ``[0, 0, 0, 0]``."""
    if masks.dtype != paddle.bool:
        raise TypeError(f"bool masks expected, got {masks.dtype}")
    B, _, h, w = masks.shape
    if B == 0:
        return paddle.zeros([0, masks.shape[1], 4], dtype="int32")
    # the min/max over the pixels of an object are those over its rows and columns
    cols = masks.any(axis=-2)  # B x 1 x w
    rows = masks.any(axis=-1)  # B x 1 x h
    xs = paddle.arange(w, dtype="int32").reshape([1, 1, w]).expand_as(cols)
    ys = paddle.arange(h, dtype="int32").reshape([1, 1, h]).expand_as(rows)
    min_xs = paddle.where(cols, xs, paddle.full_like(xs, w)).min(axis=-1)
    max_xs = paddle.where(cols, xs, paddle.full_like(xs, -1)).max(axis=-1)
    min_ys = paddle.where(rows, ys, paddle.full_like(ys, h)).min(axis=-1)
    max_ys = paddle.where(rows, ys, paddle.full_like(ys, -1)).max(axis=-1)
    boxes = paddle.stack([min_xs, min_ys, max_xs, max_ys], axis=-1)
    nonempty = cols.any(axis=-1, keepdim=True).expand_as(boxes)
    return paddle.where(nonempty, boxes, paddle.zeros_like(boxes))


def fast_diag_box_iou(boxes1: paddle.Tensor, boxes2: paddle.Tensor) -> paddle.Tensor:
    """IoUs of the pairs ``(boxes1[i], boxes2[i])`` of two ``N x 4`` xyxy box sets (upstream:
    ``box_ops.fast_diag_box_iou``)."""
    if len(boxes1) != len(boxes2):
        raise ValueError(f"{len(boxes1)} boxes vs {len(boxes2)}")
    box1_xy, box1_XY = boxes1[:, 2:], boxes1[:, :2]
    box2_xy, box2_XY = boxes2[:, 2:], boxes2[:, :2]
    area1 = (box1_xy - box1_XY).prod(-1)
    area2 = (box2_xy - box2_XY).prod(-1)
    lt = paddle.maximum(box1_XY, box2_XY)  # N x 2
    rb = paddle.minimum(box1_xy, box2_xy)  # N x 2
    inter = (rb - lt).clip(min=0).prod(-1)
    union = area1 + area2 - inter
    return inter / union
