"""Box format conversions, areas and IoUs (upstream: sam3/model/box_ops.py), on Paddle tensors.

Formats: ``xyxy`` = (x0, y0, x1, y1), ``xywh`` = (x0, y0, w, h), ``cxcywh`` = (cx, cy, w, h).
Every function takes boxes on the last axis (``... x 4``) unless it says otherwise.
"""

from __future__ import annotations

import paddle

from .perflib.masks_ops import fast_diag_box_iou

__all__ = [
    "box_area",
    "box_cxcywh_to_xywh",
    "box_cxcywh_to_xyxy",
    "box_iou",
    "box_xywh_inter_union",
    "box_xywh_to_cxcywh",
    "box_xywh_to_xyxy",
    "box_xyxy_to_cxcywh",
    "box_xyxy_to_xywh",
    "fast_diag_box_iou",
    "fast_diag_generalized_box_iou",
    "generalized_box_iou",
    "masks_to_boxes",
]


def _last_axis_4(x: paddle.Tensor, name: str) -> None:
    if x.ndim == 0 or x.shape[-1] != 4:
        raise ValueError(f"{name} must hold boxes on the last axis (... x 4), got {list(x.shape)}")


def box_cxcywh_to_xyxy(x: paddle.Tensor) -> paddle.Tensor:
    """``... x 4`` (cx, cy, w, h) -> ``... x 4`` (x0, y0, x1, y1)."""
    cx, cy, w, h = x.unbind(-1)
    return paddle.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], axis=-1)


def box_cxcywh_to_xywh(x: paddle.Tensor) -> paddle.Tensor:
    """``... x 4`` (cx, cy, w, h) -> ``... x 4`` (x0, y0, w, h)."""
    cx, cy, w, h = x.unbind(-1)
    return paddle.stack([cx - 0.5 * w, cy - 0.5 * h, w, h], axis=-1)


def box_xywh_to_xyxy(x: paddle.Tensor) -> paddle.Tensor:
    """``... x 4`` (x0, y0, w, h) -> ``... x 4`` (x0, y0, x1, y1)."""
    x0, y0, w, h = x.unbind(-1)
    return paddle.stack([x0, y0, x0 + w, y0 + h], axis=-1)


def box_xywh_to_cxcywh(x: paddle.Tensor) -> paddle.Tensor:
    """``... x 4`` (x0, y0, w, h) -> ``... x 4`` (cx, cy, w, h)."""
    x0, y0, w, h = x.unbind(-1)
    return paddle.stack([x0 + 0.5 * w, y0 + 0.5 * h, w, h], axis=-1)


def box_xyxy_to_xywh(x: paddle.Tensor) -> paddle.Tensor:
    """``... x 4`` (x0, y0, x1, y1) -> ``... x 4`` (x0, y0, w, h)."""
    x0, y0, x1, y1 = x.unbind(-1)
    return paddle.stack([x0, y0, x1 - x0, y1 - y0], axis=-1)


def box_xyxy_to_cxcywh(x: paddle.Tensor) -> paddle.Tensor:
    """``... x 4`` (x0, y0, x1, y1) -> ``... x 4`` (cx, cy, w, h)."""
    x0, y0, x1, y1 = x.unbind(-1)
    return paddle.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], axis=-1)


def box_area(boxes: paddle.Tensor) -> paddle.Tensor:
    """Areas ``...`` of xyxy boxes ``... x 4`` (negative where x1 < x0 or y1 < y0)."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    return (x1 - x0) * (y1 - y0)


def masks_to_boxes(masks: paddle.Tensor) -> paddle.Tensor:
    """``N x 4`` float32 xyxy boxes around masks ``N x H x W`` (or one ``H x W`` mask: ``1 x 4``).

    As upstream: x0 / y0 are the first column / row a mask covers and x1 / y1 one past the
    last (exclusive ends), a mask that covers nothing gets ``[0, 0, 0, 0]``, and no mask at all
    a ``0 x 4`` result. Non-zero values count as covered; x1 / y1 come from the largest
    ``value * coordinate``, so masks should be binary (0/1 or bool), as upstream's.

    Upstream multiplies the ``N x 4`` boxes by the ``N`` per-mask flags, which broadcasts only
    for one mask (or four, then mixing them up); here each box is zeroed by its own flag."""
    if masks.ndim not in (2, 3):
        raise ValueError(f"masks must be N x H x W or H x W, got {list(masks.shape)}")
    if masks.numel() == 0:
        return paddle.zeros([0, 4], dtype="float32")
    m = masks.astype("float32")
    if m.ndim == 2:
        m = m.unsqueeze(0)
    h, w = m.shape[-2:]
    ys = paddle.arange(h, dtype="float32").reshape([1, h, 1])
    xs = paddle.arange(w, dtype="float32").reshape([1, 1, w])
    covered = m != 0
    big = paddle.full_like(m, 1e8)
    x_mask, y_mask = m * xs, m * ys
    x_max = x_mask.flatten(1).max(-1) + 1
    y_max = y_mask.flatten(1).max(-1) + 1
    x_min = paddle.where(covered, x_mask, big).flatten(1).min(-1)
    y_min = paddle.where(covered, y_mask, big).flatten(1).min(-1)
    boxes = paddle.stack([x_min, y_min, x_max, y_max], axis=1)
    nonempty = covered.flatten(1).any(-1).astype("float32").unsqueeze(-1)
    return boxes * nonempty


def box_iou(boxes1: paddle.Tensor, boxes2: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Pairwise IoU and union ``... x N x M`` of xyxy boxes ``... x N x 4`` and ``... x M x 4``
    (leading axes broadcast). A pair of empty boxes divides 0 by 0 (NaN), as upstream."""
    _last_axis_4(boxes1, "boxes1")
    _last_axis_4(boxes2, "boxes2")
    area1, area2 = box_area(boxes1), box_area(boxes2)
    a, b = boxes1.unsqueeze(-2), boxes2.unsqueeze(-3)  # ... x N x 1 x 4, ... x 1 x M x 4
    lt = paddle.maximum(a[..., :2], b[..., :2])
    rb = paddle.minimum(a[..., 2:], b[..., 2:])
    wh = (rb - lt).clip(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area1.unsqueeze(-1) + area2.unsqueeze(-2) - inter
    return inter / union, union


def generalized_box_iou(boxes1: paddle.Tensor, boxes2: paddle.Tensor) -> paddle.Tensor:
    """Pairwise generalized IoU ``... x N x M`` of xyxy boxes ``... x N x 4``, ``... x M x 4``:
    IoU minus the part of the smallest enclosing box that the union leaves empty."""
    iou, union = box_iou(boxes1, boxes2)
    a, b = boxes1.unsqueeze(-2), boxes2.unsqueeze(-3)
    lt = paddle.minimum(a[..., :2], b[..., :2])
    rb = paddle.maximum(a[..., 2:], b[..., 2:])
    wh = (rb - lt).clip(min=0)
    enclosing = wh[..., 0] * wh[..., 1]
    return iou - (enclosing - union) / enclosing


def fast_diag_generalized_box_iou(boxes1: paddle.Tensor, boxes2: paddle.Tensor) -> paddle.Tensor:
    """Generalized IoUs ``N`` of the pairs ``(boxes1[i], boxes2[i])`` of two ``N x 4`` xyxy
    box sets (the diagonal of :func:`generalized_box_iou`, without the ``N x N`` matrix)."""
    if len(boxes1) != len(boxes2):
        raise ValueError(f"{len(boxes1)} boxes vs {len(boxes2)}")
    lo1, hi1 = boxes1[:, :2], boxes1[:, 2:]
    lo2, hi2 = boxes2[:, :2], boxes2[:, 2:]
    area1 = (hi1 - lo1).prod(-1)
    area2 = (hi2 - lo2).prod(-1)
    inter = (paddle.minimum(hi1, hi2) - paddle.maximum(lo1, lo2)).clip(min=0).prod(-1)
    enclosing = (paddle.maximum(hi1, hi2) - paddle.minimum(lo1, lo2)).clip(min=0).prod(-1)
    union = area1 + area2 - inter
    return inter / union - (enclosing - union) / enclosing


def box_xywh_inter_union(
    boxes1: paddle.Tensor, boxes2: paddle.Tensor
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Intersection and union areas ``...`` of xywh boxes ``... x 4`` taken in pairs (leading
    axes broadcast). A box whose area w * h is negative is refused, as upstream."""
    _last_axis_4(boxes1, "boxes1")
    _last_axis_4(boxes2, "boxes2")
    b1, b2 = box_xywh_to_xyxy(boxes1), box_xywh_to_xyxy(boxes2)
    area1 = (b1[..., 2:] - b1[..., :2]).prod(-1)
    area2 = (b2[..., 2:] - b2[..., :2]).prod(-1)
    if bool((area1 < 0).any()) or bool((area2 < 0).any()):
        raise ValueError("boxes1 and boxes2 must have areas (w * h) >= 0")
    tl = paddle.maximum(b1[..., :2], b2[..., :2])
    br = paddle.minimum(b1[..., 2:], b2[..., 2:])
    inter = (br - tl).clip(min=0).prod(-1)
    return inter, area1 + area2 - inter
