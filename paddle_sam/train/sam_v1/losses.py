"""SAM's training loss: focal + dice (20:1) on the masks, MSE on the IoU prediction.

All functions take logits and targets of shape K x C x H x W (K prompts, C mask outputs)
and an optional ``valid`` weight (1 x 1 x H x W or broadcastable) that excludes padding.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F


def _sum_hw(x: paddle.Tensor) -> paddle.Tensor:
    return x.sum(axis=[-2, -1])


def focal_loss(
    logits: paddle.Tensor,
    target: paddle.Tensor,
    valid: paddle.Tensor,
    alpha: float = 0.25,
    gamma: float = 2.0,
) -> paddle.Tensor:
    """Sigmoid focal loss (Lin et al.), mean over valid pixels: K x C."""
    p = F.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    p_t = p * target + (1 - p) * (1 - target)
    q = 1 - p_t
    loss = ce * (q * q if gamma == 2.0 else q**gamma)
    if alpha >= 0:
        loss = loss * (alpha * target + (1 - alpha) * (1 - target))
    return _sum_hw(loss * valid) / _sum_hw(valid).clip(min=1.0)


def dice_loss(logits: paddle.Tensor, target: paddle.Tensor, valid: paddle.Tensor) -> paddle.Tensor:
    """1 - soft Dice over valid pixels (smoothing 1): K x C."""
    p = F.sigmoid(logits) * valid
    t = target * valid
    return 1 - (2 * _sum_hw(p * t) + 1) / (_sum_hw(p) + _sum_hw(t) + 1)


def mask_iou(logits: paddle.Tensor, target: paddle.Tensor, valid: paddle.Tensor) -> paddle.Tensor:
    """IoU of the thresholded prediction (logit > 0) with the target: K x C, no gradient."""
    pred = (logits.detach() > 0).astype("float32") * valid
    t = target * valid
    inter = _sum_hw(pred * t)
    union = _sum_hw(pred) + _sum_hw(t) - inter
    return inter / union.clip(min=1.0)


def sam_loss(
    logits: paddle.Tensor,
    iou_pred: paddle.Tensor,
    target: paddle.Tensor,
    valid: paddle.Tensor,
    focal_weight: float = 20.0,
    dice_weight: float = 1.0,
    iou_weight: float = 1.0,
    focal_alpha: float = 0.25,
    focal_gamma: float = 2.0,
) -> tuple[paddle.Tensor, dict[str, paddle.Tensor], paddle.Tensor]:
    """Loss for K prompts with C outputs each: only the output with the lowest mask loss is
    supervised (SAM's "best of the multimask outputs"); the IoU head is trained on every
    output. Returns (loss, parts, index of the supervised output per prompt: K)."""
    focal = focal_loss(logits, target, valid, focal_alpha, focal_gamma)
    dice = dice_loss(logits, target, valid)
    per_output = focal_weight * focal + dice_weight * dice  # K x C
    best = paddle.argmin(per_output.detach(), axis=1, keepdim=True)  # K x 1
    mask_loss = paddle.take_along_axis(per_output, best, axis=1).mean()
    iou_true = mask_iou(logits, target, valid)
    iou_loss = F.mse_loss(iou_pred, iou_true)
    parts = {
        "focal": paddle.take_along_axis(focal, best, axis=1).mean().detach(),
        "dice": paddle.take_along_axis(dice, best, axis=1).mean().detach(),
        "iou_mse": iou_loss.detach(),
        "iou": paddle.take_along_axis(iou_true, best, axis=1).mean(),
    }
    return mask_loss + iou_weight * iou_loss, parts, best.squeeze(1)
