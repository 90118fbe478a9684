"""SAM 3's detection losses (upstream: ``sam3/train/loss/loss_fns.py`` and
``sam3/train/loss/mask_sampling.py``), on Paddle tensors.

Every loss is a :class:`LossWithWeights` called as
``loss_fn(outputs=..., targets=..., indices=..., num_boxes=..., is_aux=...)`` and returns a
dict of named terms plus :data:`CORE_LOSS_KEY`, their weighted sum (``weight_dict``).

* ``outputs``: the model's predictions for B images (find queries) and Q object queries:
  ``pred_logits`` ``B x Q x 1``, ``pred_boxes`` ``B x Q x 4`` (cx, cy, w, h in [0, 1]),
  ``pred_boxes_xyxy`` ``B x Q x 4``, optionally ``presence_logit_dec`` ``B x 1`` and
  ``pred_masks`` ``B x Q x h x w`` (logits);
* ``targets``: the batched find targets (upstream's ``back_convert``; see
  :func:`paddle_sam.train.sam3.sam3_loss.make_find_targets`): ``num_boxes`` int64 ``B``,
  ``boxes`` / ``boxes_xyxy`` ``N x 4`` packed over the batch (``N = sum(num_boxes)``),
  ``boxes_padded`` ``B x T x 4``, ``object_ids_padded`` int64 ``B x T`` (-1 = padding),
  ``is_exhaustive`` bool ``B``, ``masks`` bool ``N x H x W`` (or None) and ``is_valid_mask``
  bool ``N``;
* ``indices``: a matcher's ``(batch_idx, src_idx, tgt_idx)`` (see
  :mod:`paddle_sam.train.sam3.matcher`);
* ``num_boxes``: the normaliser (number of targets), a number or a 0-d tensor.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from ...models.sam3.box_ops import fast_diag_box_iou, fast_diag_generalized_box_iou

__all__ = [
    "CORE_LOSS_KEY",
    "Boxes",
    "IABCEMdetr",
    "LossWithWeights",
    "Masks",
    "SemanticSegCriterion",
    "calculate_uncertainty",
    "dice_loss",
    "get_uncertain_point_coords_with_randomness",
    "instance_masks_to_semantic_masks",
    "point_sample",
    "segment_miou",
    "sigmoid_focal_loss",
]

CORE_LOSS_KEY = "core_loss"


def _div(x: paddle.Tensor, n) -> paddle.Tensor:
    """``x / n`` with a tensor ``n`` cast to ``x``'s dtype (no float32/float64 promotion)."""
    if isinstance(n, paddle.Tensor):
        return x / n.astype(x.dtype)
    return x / n


def _zero(like: paddle.Tensor) -> paddle.Tensor:
    return paddle.zeros([], dtype=like.dtype).to(like.place)


# ---------------------------------------------------------------------------- elementwise losses


def dice_loss(inputs, targets, num_boxes, loss_on_multimask=False, reduce=True):
    """Dice loss ``1 - (2 |P ∩ G| + 1) / (|P| + |G| + 1)`` of mask logits ``inputs`` against
    binary ``targets`` (same shape, ``N x ...``; with ``loss_on_multimask`` ``N x M x H x W``,
    M candidate masks each).

    Returns the sum over the N masks divided by ``num_boxes`` (``reduce``), the ``N`` losses
    (not ``reduce``), or ``N x M`` losses / ``num_boxes`` (``loss_on_multimask``)."""
    inputs = F.sigmoid(inputs)
    targets = targets.astype(inputs.dtype)
    if loss_on_multimask:
        if inputs.ndim != 4 or targets.ndim != 4:
            raise ValueError("loss_on_multimask needs N x M x H x W inputs and targets")
        inputs, targets = inputs.flatten(2), targets.flatten(2)
    else:
        inputs, targets = inputs.flatten(1), targets.flatten(1)
    numerator = 2 * (inputs * targets).sum(-1)
    denominator = inputs.sum(-1) + targets.sum(-1)
    loss = 1 - (numerator + 1) / (denominator + 1)
    if loss_on_multimask:
        return _div(loss, num_boxes)
    if not reduce:
        return loss
    return _div(loss.sum(), num_boxes)


def _focal_terms(inputs, targets, alpha, gamma, weight_by_alpha):
    targets = targets.astype(inputs.dtype)
    prob = F.sigmoid(inputs)
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = prob * targets + (1 - prob) * (1 - targets)
    # gamma = 0: a factor of 1 (pow's gradient would be 0 * inf where p_t = 1)
    loss = ce if gamma == 0 else ce * (1 - p_t) ** gamma
    if weight_by_alpha:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return loss


def sigmoid_focal_loss(
    inputs,
    targets,
    num_boxes,
    alpha: float = 0.25,
    gamma: float = 2,
    loss_on_multimask=False,
    reduce=True,
    triton=True,
):
    """Sigmoid focal loss (Lin et al., RetinaNet) of logits ``inputs`` against targets in
    [0, 1] of the same shape ``N x D`` (``N x M x H x W`` with ``loss_on_multimask``):
    ``alpha_t * BCE * (1 - p_t) ** gamma``.

    ``triton`` selects the reductions of upstream's fused kernel (there is no Triton here; the
    values are the same formula): ``alpha`` must be in [0, 1] and the reduced loss is
    ``sum / (num_boxes * D)``. Without it, ``alpha < 0`` turns the alpha weighting off and
    the reduced loss is ``mean over axis 1, summed / num_boxes``. ``reduce=False`` returns the
    elementwise loss; ``loss_on_multimask`` the ``N x M`` spatial means / ``num_boxes``."""
    if triton and not 0 <= alpha <= 1:
        raise ValueError(f"alpha should be in [0, 1], got {alpha}")
    loss = _focal_terms(inputs, targets, alpha, gamma, weight_by_alpha=triton or alpha >= 0)
    if triton and reduce and not loss_on_multimask:
        return _div(loss.sum(), num_boxes * inputs.shape[1])
    if not reduce:
        return loss
    if loss_on_multimask:
        if loss.ndim != 4:
            raise ValueError("loss_on_multimask needs N x M x H x W inputs")
        return _div(loss.flatten(2).mean(-1), num_boxes)
    return _div(loss.mean(1).sum(), num_boxes)


def _binary_f1_score(probs: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    """Binary F1 (torchmetrics' ``f1_score(task="binary")``): predictions are ``probs > 0.5``,
    F1 = 2 TP / (2 TP + FP + FN), 0 when that is 0 / 0."""
    pred = probs > 0.5
    true = target.astype("bool")
    tp = paddle.logical_and(pred, true).astype("float32").sum()
    fp = paddle.logical_and(pred, ~true).astype("float32").sum()
    fn = paddle.logical_and(~pred, true).astype("float32").sum()
    denom = 2 * tp + fp + fn
    return paddle.where(denom > 0, 2 * tp / paddle.clip(denom, min=1), paddle.zeros_like(denom))


# -------------------------------------------------------------------------------- point sampling


def point_sample(input, point_coords, **kwargs):
    """Bilinear samples ``N x C x P`` (or ``N x C x Hg x Wg``) of feature maps ``N x C x H x W``
    at points ``N x P x 2`` (or ``N x Hg x Wg x 2``) given as (x, y) in [0, 1] x [0, 1].
    Keyword arguments go to ``grid_sample``; ``align_corners`` defaults to False as torch's."""
    kwargs.setdefault("align_corners", False)
    add_dim = point_coords.ndim == 3
    if add_dim:
        point_coords = point_coords.unsqueeze(2)
    output = F.grid_sample(input, 2.0 * point_coords - 1.0, **kwargs)
    return output.squeeze(3) if add_dim else output


def calculate_uncertainty(logits):
    """Uncertainty ``-|logit|`` of class-agnostic mask logits ``R x 1 x ...`` (highest at 0)."""
    if logits.shape[1] != 1:
        raise ValueError(f"expected R x 1 x ... logits, got {list(logits.shape)}")
    return -paddle.abs(logits)


def _uniform(shape: list[int], like: paddle.Tensor) -> paddle.Tensor:
    return paddle.rand(shape, dtype=like.dtype).to(like.place)


def get_uncertain_point_coords_with_randomness(
    logits,
    uncertainty_func: Callable,
    num_points: int,
    oversample_ratio: int,
    importance_sample_ratio: float,
    rand_fn: Callable | None = None,
):
    """PointRend's point selection: ``N x num_points x 2`` coordinates in [0, 1]^2 for mask
    logits ``N x 1 x H x W``.

    Draws ``num_points * oversample_ratio`` uniform points, keeps the
    ``int(importance_sample_ratio * num_points)`` most uncertain ones (``uncertainty_func`` of
    the sampled logits, ``N x 1 x P`` -> ``N x 1 x P``) and fills up with fresh uniform points.
    ``rand_fn(shape)`` supplies the uniform draws (default ``paddle.rand`` in the logits'
    dtype and place); pass a seeded one to reproduce a draw."""
    if oversample_ratio < 1:
        raise ValueError(f"oversample_ratio must be >= 1, got {oversample_ratio}")
    if not 0 <= importance_sample_ratio <= 1:
        raise ValueError(
            f"importance_sample_ratio must be in [0, 1], got {importance_sample_ratio}"
        )
    draw = rand_fn if rand_fn is not None else (lambda shape: _uniform(shape, logits))
    num_boxes = logits.shape[0]
    num_sampled = int(num_points * oversample_ratio)
    point_coords = draw([num_boxes, num_sampled, 2])
    point_logits = point_sample(logits, point_coords, align_corners=False)
    # uncertainty of the interpolated logits, not interpolated uncertainty
    point_uncertainties = uncertainty_func(point_logits)
    num_uncertain_points = int(importance_sample_ratio * num_points)
    num_random_points = num_points - num_uncertain_points
    idx = paddle.topk(point_uncertainties[:, 0, :], k=num_uncertain_points, axis=1)[1]
    point_coords = paddle.take_along_axis(
        point_coords, idx.unsqueeze(-1).expand([num_boxes, num_uncertain_points, 2]), axis=1
    )
    if num_random_points > 0:
        point_coords = paddle.concat(
            [point_coords, draw([num_boxes, num_random_points, 2])], axis=1
        )
    return point_coords


# -------------------------------------------------------------------------------------- losses


def _keep_only_trk_queries_in_match_inds(inds, Q_det):
    """The matched pairs of ``inds`` whose prediction is a tracking query (index >= Q_det)."""
    batch_idx, src_idx, tgt_idx = inds
    if batch_idx.numel() == 0:
        return inds
    keep = paddle.nonzero(src_idx >= Q_det).flatten()
    take = lambda x: paddle.gather(x, keep)  # noqa: E731
    return take(batch_idx), take(src_idx), (take(tgt_idx) if tgt_idx is not None else None)


def _matched(x: paddle.Tensor, indices) -> paddle.Tensor:
    """``x[batch_idx, src_idx]``: the matched predictions of a ``B x Q x ...`` tensor."""
    return x[indices[0], indices[1]]


def _targets(x: paddle.Tensor, indices) -> paddle.Tensor:
    """The matched pairs' targets: ``x[tgt_idx]``, or all of ``x`` when ``tgt_idx`` is None."""
    return x if indices[2] is None else paddle.gather(x, indices[2], axis=0)


def _query_mask(B: int, Q: int, Q_det: int, det_value: float, like: paddle.Tensor):
    """``B x Q`` tensor: ``det_value`` on the first Q_det queries, 1 on the others."""
    det = paddle.full([B, Q_det], det_value, dtype=like.dtype)
    rest = paddle.ones([B, Q - Q_det], dtype=like.dtype)
    return paddle.concat([det, rest], axis=1).to(like.place)


class LossWithWeights(nn.Layer):
    """Base of the losses: ``forward`` computes the terms (:meth:`get_loss`) and adds their
    weighted sum under :data:`CORE_LOSS_KEY`; terms missing from ``weight_dict`` are reported
    but not added. With ``compute_aux=False`` the loss skips auxiliary outputs (``is_aux``)."""

    def __init__(self, weight_dict, compute_aux, supports_o2m_loss=True):
        super().__init__()
        self.weight_dict = weight_dict if weight_dict is not None else {}
        self.compute_aux = compute_aux
        self.supports_o2m_loss = supports_o2m_loss
        self.target_keys = []

    def forward(self, *args, is_aux=False, **kwargs):
        if is_aux and not self.compute_aux:
            return {CORE_LOSS_KEY: 0.0}
        losses = self.get_loss(*args, **kwargs)
        losses[CORE_LOSS_KEY] = self.reduce_loss(losses)
        return losses

    def get_loss(self, **kwargs):
        raise NotImplementedError

    def reduce_loss(self, losses):
        """Sum of ``weight * losses[key]`` over ``weight_dict`` (zero weights skipped)."""
        reduced = 0.0
        for key, weight in self.weight_dict.items():
            if key not in losses:
                raise ValueError(f"{type(self).__name__} doesn't compute {key}")
            if weight != 0:
                reduced = reduced + losses[key] * weight
        return reduced


class IABCEMdetr(LossWithWeights):
    """SAM 3's classification loss: IoU-aware BCE on the object queries plus the presence loss.

    Matched queries are positives with the soft target ``clamp(p ** alpha * IoU ** (1 - alpha),
    0.01)`` (p the query's probability, IoU with its matched box; both detached) weighted by
    ``pos_weight`` (focal with alpha 0.5 when ``pos_focal``); unmatched queries are negatives
    with target 0 weighted by ``p ** gamma``. The per-query losses are averaged: over the
    supervised entries (``weak_loss``: images whose annotation is not exhaustive get no
    negative loss), else over ``B x Q`` queries, or ``B x pad_n_queries`` when the model has
    fewer queries than ``pad_n_queries`` (the positives then scaled by ``pad_scale_pos``).

    With ``use_presence``, images without any visible target (a negative prompt) get no query
    loss, and the presence logit ``presence_logit_dec`` (``B x 1``) is trained with a focal
    loss (``presence_alpha``, ``presence_gamma``) towards "has a target" (``presence_loss``,
    averaged over B). ``use_separate_loss_for_det_and_trk`` and the ``*_loss_scale_*``
    arguments weight detection and tracking queries (video) instead of ``weak_loss``.

    Returns ``loss_ce``, ``ce_f1`` (F1 of ``p > 0.5``, a metric), ``presence_loss`` and
    ``presence_dec_acc`` (a metric)."""

    def __init__(
        self,
        pos_weight,
        weight_dict=None,
        compute_aux=True,
        gamma=0,
        weak_loss=True,
        alpha=0.25,
        pad_n_queries=None,
        pad_scale_pos=1.0,
        use_separate_loss_for_det_and_trk=False,
        num_det_queries=None,
        det_exhaustive_loss_scale_pos=1.0,
        det_exhaustive_loss_scale_neg=1.0,
        det_non_exhaustive_loss_scale_pos=1.0,
        det_non_exhaustive_loss_scale_neg=1.0,
        trk_loss_scale_pos=1.0,
        trk_loss_scale_neg=1.0,
        no_loss_for_fp_propagation=False,
        apply_loss_to_det_queries_in_video_grounding=True,
        use_presence=False,
        use_presence_semgseg=False,
        presence_alpha=0.5,
        presence_gamma=0.0,
        pos_focal: bool = False,
    ):
        super().__init__(weight_dict, compute_aux)
        self.pos_weight = pos_weight
        self.gamma = gamma
        self.weak_loss = weak_loss
        self.alpha = alpha
        self.target_keys.append("boxes_xyxy")
        self.no_loss_for_fp_propagation = no_loss_for_fp_propagation
        if self.weak_loss:
            self.target_keys.append("is_exhaustive")
        self.pad_n_queries = pad_n_queries
        self.pad_scale_pos = pad_scale_pos
        if pad_scale_pos != 1.0 and pad_n_queries is None:
            raise ValueError("pad_scale_pos needs pad_n_queries")
        self.use_presence = use_presence
        self.use_presence_semgseg = use_presence_semgseg
        if use_presence_semgseg and not use_presence:
            raise ValueError("use_presence_semgseg needs use_presence")
        self.presence_alpha = presence_alpha
        self.presence_gamma = presence_gamma
        self.pos_focal = pos_focal
        self.apply_loss_to_det_queries_in_video_grounding = (
            apply_loss_to_det_queries_in_video_grounding
        )
        self.use_separate_loss_for_det_and_trk = use_separate_loss_for_det_and_trk
        if num_det_queries is not None:
            logging.warning("note: num_det_queries is no longer needed")
        scales = (
            det_exhaustive_loss_scale_pos,
            det_exhaustive_loss_scale_neg,
            det_non_exhaustive_loss_scale_pos,
            det_non_exhaustive_loss_scale_neg,
            trk_loss_scale_pos,
            trk_loss_scale_neg,
        )
        if use_separate_loss_for_det_and_trk:
            if weak_loss:
                raise ValueError(
                    "use_separate_loss_for_det_and_trk replaces weak_loss: set it False"
                )
            (
                self.det_exhaustive_loss_scale_pos,
                self.det_exhaustive_loss_scale_neg,
                self.det_non_exhaustive_loss_scale_pos,
                self.det_non_exhaustive_loss_scale_neg,
                self.trk_loss_scale_pos,
                self.trk_loss_scale_neg,
            ) = scales
        elif any(s != 1.0 for s in scales):
            raise ValueError(
                "the detection / tracking loss scales need use_separate_loss_for_det_and_trk"
            )

    def _soft_targets(self, outputs, targets, indices, prob):
        """``(target_classes, positive_target_classes)`` ``B x Q``: 1 / the IoU-aware soft
        target on the matched queries, 0 elsewhere (no gradient)."""
        B, Q = prob.shape
        flat = (indices[0] * Q + indices[1]).numpy()
        # a query matched several times (one-to-many) keeps its last pair, as an index_put
        _, last_rev = np.unique(flat[::-1], return_index=True)
        last = np.sort(len(flat) - 1 - last_rev)
        with paddle.no_grad():
            src_boxes_xyxy = _matched(outputs["pred_boxes_xyxy"], indices).detach()
            tgt_boxes_xyxy = _targets(targets["boxes_xyxy"], indices)
            iou = fast_diag_box_iou(src_boxes_xyxy, tgt_boxes_xyxy.astype(src_boxes_xyxy.dtype))
            p = _matched(prob.detach(), indices)
            t = paddle.clip(p**self.alpha * iou ** (1 - self.alpha), min=0.01)
            pos = paddle.to_tensor(flat[last], dtype="int64", place=prob.place)
            t = paddle.gather(t, paddle.to_tensor(last, dtype="int64", place=prob.place))
            zeros = paddle.zeros([B * Q], dtype=prob.dtype).to(prob.place)
            target_classes = paddle.scatter(zeros, pos, paddle.ones_like(t)).reshape([B, Q])
            positive = paddle.scatter(zeros, pos, t).reshape([B, Q])
        return target_classes, positive

    def get_loss(self, outputs, targets, indices, num_boxes):
        logits = outputs["pred_logits"]
        if logits.ndim <= 2 or logits.shape[-1] != 1:
            raise ValueError(f"pred_logits must be B x Q x 1, got {list(logits.shape)}")
        src_logits = logits.squeeze(-1)
        prob = F.sigmoid(src_logits)
        B, Q = src_logits.shape
        target_classes, positive_target_classes = self._soft_targets(
            outputs, targets, indices, prob
        )

        # positives: soft targets
        if self.pos_focal:
            loss_bce = sigmoid_focal_loss(
                src_logits,
                positive_target_classes,
                num_boxes=1,
                alpha=0.5,
                gamma=self.gamma,
                reduce=False,
            )
        else:
            loss_bce = F.binary_cross_entropy_with_logits(
                src_logits, positive_target_classes, reduction="none"
            )
        loss_bce = loss_bce * target_classes * self.pos_weight
        padded = isinstance(self.pad_n_queries, int) and Q < self.pad_n_queries
        if self.pad_n_queries is not None and padded:
            loss_bce = loss_bce * self.pad_scale_pos
        # negatives
        neg = F.binary_cross_entropy_with_logits(src_logits, target_classes, reduction="none")
        loss_bce = loss_bce + neg * (1 - target_classes) * (prob**self.gamma)

        if outputs.get("is_video_grounding_batch", False) and (
            not self.apply_loss_to_det_queries_in_video_grounding
        ):
            loss_bce = loss_bce * _query_mask(B, Q, outputs["Q_det"], 0.0, loss_bce)

        presence_loss = _zero(src_logits)
        presence_dec_acc = _zero(src_logits)
        if self.use_presence:
            # images without a visible target (padding ids are < 0, invisible boxes have no
            # size) get no query loss: only the presence logit is trained there
            ids = targets["object_ids_padded"]
            boxes = targets["boxes_padded"]
            visible = paddle.logical_and(
                ids >= 0, paddle.logical_and(boxes[..., 2] > 0, boxes[..., 3] > 0)
            )
            keep_loss = (visible.astype("int64").sum(-1, keepdim=True) != 0).astype(loss_bce.dtype)
            loss_bce = loss_bce * keep_loss
            if self.use_presence_semgseg:
                if "presence_logit_dec" in outputs:
                    raise ValueError("use_presence_semgseg: the decoder's presence is not used")
            elif "presence_logit_dec" in outputs:
                presence_logits = outputs["presence_logit_dec"].reshape(keep_loss.shape)
                presence_loss = sigmoid_focal_loss(
                    presence_logits,
                    keep_loss.astype(presence_logits.dtype),
                    num_boxes=presence_logits.shape[0],  # an average over the batch
                    alpha=self.presence_alpha,
                    gamma=self.presence_gamma,
                )
                pred = (F.sigmoid(presence_logits) > 0.5).astype(keep_loss.dtype)
                presence_dec_acc = (pred == keep_loss).astype(keep_loss.dtype).mean()
            # else one-to-many outputs: no presence logit

        is_exhaustive = targets.get("is_exhaustive")
        if self.weak_loss:
            if is_exhaustive.ndim != 1 or is_exhaustive.shape[0] != B:
                raise ValueError(f"is_exhaustive must be bool B={B}, got {is_exhaustive.shape}")
            # no negative loss on images whose annotation is not exhaustive
            unsupervised = paddle.logical_and(
                ~is_exhaustive.astype("bool").reshape([-1, 1]), target_classes < 0.5
            )
            loss_mask = (~unsupervised).astype(loss_bce.dtype)
            loss_bce = (loss_bce * loss_mask).sum() / (loss_mask.sum() + 1e-6)
        else:
            if self.use_separate_loss_for_det_and_trk:
                loss_bce = loss_bce * self._det_trk_scales(outputs, targets, target_classes)
            if self.pad_n_queries is None or Q >= self.pad_n_queries:
                loss_bce = loss_bce.mean()
            else:
                loss_bce = loss_bce.sum() / (self.pad_n_queries * B)

        return {
            "loss_ce": loss_bce,
            "ce_f1": _binary_f1_score(prob.detach().flatten(), target_classes.flatten()).astype(
                prob.dtype
            ),
            "presence_loss": presence_loss,
            "presence_dec_acc": presence_dec_acc,
        }

    def _det_trk_scales(self, outputs, targets, target_classes):
        """``B x Q`` loss scales of the detection (first Q_det) and tracking queries."""
        Q_det = outputs["Q_det"]
        Q = target_classes.shape[1]
        if Q < Q_det:
            raise ValueError(f"{Q} queries, fewer than Q_det={Q_det}")
        dt = target_classes.dtype
        positive = target_classes > 0.5
        exhaustive = targets["is_exhaustive"].astype("bool").unsqueeze(1)
        f = lambda m: m.astype(dt)  # noqa: E731
        pos_det, pos_trk = positive[:, :Q_det], positive[:, Q_det:]
        det = (
            f(exhaustive & pos_det) * self.det_exhaustive_loss_scale_pos
            + f(exhaustive & ~pos_det) * self.det_exhaustive_loss_scale_neg
            + f(~exhaustive & pos_det) * self.det_non_exhaustive_loss_scale_pos
            + f(~exhaustive & ~pos_det) * self.det_non_exhaustive_loss_scale_neg
        )
        trk = f(pos_trk) * self.trk_loss_scale_pos + f(~pos_trk) * self.trk_loss_scale_neg
        scales = paddle.concat([det, trk], axis=1)
        if self.no_loss_for_fp_propagation:
            # id -2 marks a propagated false positive: no loss there on non-exhaustive images
            original = outputs["pred_old_obj_ids"] != -2
            scales = scales * f(paddle.logical_or(exhaustive, original))
        return scales


class Boxes(LossWithWeights):
    """Box regression of the matched queries: ``loss_bbox`` (L1 on cx, cy, w, h) and
    ``loss_giou`` (1 - GIoU on ``pred_boxes_xyxy`` vs ``targets["boxes_xyxy"]``), each summed
    over the pairs and divided by ``num_boxes``."""

    def __init__(
        self,
        weight_dict=None,
        compute_aux=True,
        apply_loss_to_det_queries_in_video_grounding=True,
    ):
        super().__init__(weight_dict, compute_aux)
        self.apply_loss_to_det_queries_in_video_grounding = (
            apply_loss_to_det_queries_in_video_grounding
        )
        self.target_keys.extend(["boxes", "boxes_xyxy"])

    def get_loss(self, outputs, targets, indices, num_boxes):
        if outputs.get("is_video_grounding_batch", False) and (
            not self.apply_loss_to_det_queries_in_video_grounding
        ):
            indices = _keep_only_trk_queries_in_match_inds(indices, Q_det=outputs["Q_det"])
        src_boxes = _matched(outputs["pred_boxes"], indices)
        src_boxes_xyxy = _matched(outputs["pred_boxes_xyxy"], indices)
        target_boxes = _targets(targets["boxes"], indices).astype(src_boxes.dtype)
        target_boxes_xyxy = _targets(targets["boxes_xyxy"], indices).astype(src_boxes.dtype)
        loss_bbox = F.l1_loss(src_boxes, target_boxes, reduction="none")
        loss_giou = 1 - fast_diag_generalized_box_iou(src_boxes_xyxy, target_boxes_xyxy)
        return {
            "loss_bbox": _div(loss_bbox.sum(), num_boxes),
            "loss_giou": _div(loss_giou.sum(), num_boxes),
        }


class Masks(LossWithWeights):
    """Mask loss of the matched queries: ``loss_mask`` (sigmoid focal, ``focal_alpha``,
    ``focal_gamma``, averaged over pixels) and ``loss_dice``, each summed over the masks and
    divided by ``num_boxes``. Targets whose ``is_valid_mask`` is False are left out; without
    target masks (``targets["masks"]`` None) both are 0.

    By default the predicted ``h x w`` logits are resized (bilinear) to the targets' ``H x W``.
    With ``num_sample_points`` the losses use PointRend-sampled points instead
    (``oversample_ratio``, ``importance_sample_ratio``; ``rand_fn`` supplies the uniform draws,
    see :func:`get_uncertain_point_coords_with_randomness`). SAM 3's configs use the full
    resolution (no sampling) and ``compute_aux=False``."""

    def __init__(
        self,
        weight_dict=None,
        compute_aux=False,
        focal_alpha=0.25,
        focal_gamma=2,
        num_sample_points=None,
        oversample_ratio=None,
        importance_sample_ratio=None,
        apply_loss_to_det_queries_in_video_grounding=True,
        rand_fn: Callable | None = None,
    ):
        super().__init__(weight_dict, compute_aux)
        if compute_aux:
            warnings.warn("Masks loss usually shouldn't be applied to aux outputs", stacklevel=2)
        self.focal_alpha = focal_alpha
        self.focal_gamma = focal_gamma
        self.num_sample_points = num_sample_points
        self.oversample_ratio = oversample_ratio
        self.importance_sample_ratio = importance_sample_ratio
        self.apply_loss_to_det_queries_in_video_grounding = (
            apply_loss_to_det_queries_in_video_grounding
        )
        self.rand_fn = rand_fn
        self.target_keys.extend(["masks", "is_valid_mask"])

    def _sampled_loss(self, src_masks, target_masks, num_boxes):
        """Focal and dice losses of ``N x h x w`` logits vs ``N x H x W`` targets on sampled
        points."""
        src_masks, target_masks = src_masks.unsqueeze(1), target_masks.unsqueeze(1)
        with paddle.no_grad():
            point_coords = get_uncertain_point_coords_with_randomness(
                src_masks.detach(),
                calculate_uncertainty,
                self.num_sample_points,
                self.oversample_ratio,
                self.importance_sample_ratio,
                rand_fn=self.rand_fn,
            )
            sampled_targets = point_sample(target_masks, point_coords).squeeze(1)
        sampled_src = point_sample(src_masks, point_coords).squeeze(1)
        return {
            "loss_mask": sigmoid_focal_loss(
                sampled_src,
                sampled_targets,
                num_boxes,
                alpha=self.focal_alpha,
                gamma=self.focal_gamma,
            ),
            "loss_dice": dice_loss(sampled_src, sampled_targets, num_boxes),
        }

    def get_loss(self, outputs, targets, indices, num_boxes):
        if "pred_masks" not in outputs:
            raise KeyError("Masks needs outputs['pred_masks']")
        if "is_valid_mask" not in targets:
            raise KeyError("Masks needs targets['is_valid_mask']")
        if outputs.get("is_video_grounding_batch", False) and (
            not self.apply_loss_to_det_queries_in_video_grounding
        ):
            indices = _keep_only_trk_queries_in_match_inds(indices, Q_det=outputs["Q_det"])
        pred_masks = outputs["pred_masks"]
        if targets.get("masks") is None:  # a dataset without masks
            return {"loss_mask": _zero(pred_masks), "loss_dice": _zero(pred_masks)}

        work_dtype = "float32" if pred_masks.dtype == paddle.bfloat16 else pred_masks.dtype
        target_masks = _targets(targets["masks"], indices).astype(pred_masks.dtype)
        keep = _targets(targets["is_valid_mask"], indices).astype("bool")
        src_masks = _matched(pred_masks, indices)
        src_masks, target_masks = src_masks[keep], target_masks[keep]

        if self.num_sample_points is not None:
            return self._sampled_loss(src_masks, target_masks, num_boxes)
        if src_masks.shape[0] == 0 and target_masks.shape[0] == 0:
            src_masks = src_masks.flatten(1)
            target_masks = target_masks.reshape(src_masks.shape)
        else:
            if src_masks.ndim == 3:
                src_masks = src_masks.unsqueeze(1)
            src_masks = F.interpolate(
                src_masks.astype(work_dtype),
                size=list(target_masks.shape[-2:]),
                mode="bilinear",
                align_corners=False,
            )
            src_masks = src_masks[:, 0].flatten(1)
            target_masks = target_masks.flatten(1).astype(src_masks.dtype)
        return {
            "loss_mask": sigmoid_focal_loss(
                src_masks, target_masks, num_boxes, alpha=self.focal_alpha, gamma=self.focal_gamma
            ),
            "loss_dice": dice_loss(src_masks, target_masks, num_boxes),
        }


# ------------------------------------------------------------------------- semantic segmentation


def instance_masks_to_semantic_masks(
    instance_masks: paddle.Tensor, num_instances: paddle.Tensor
) -> paddle.Tensor:
    """Packed instance masks ``N x H x W`` (``num_instances[b]`` of them for batch element b)
    -> ``B x H x W``: each element's union (all False for an element without instances). A
    batch without any instance gives upstream's ``B x 1 x 1`` zeros."""
    counts = num_instances.astype("int64")
    if int(counts.sum()) == 0:
        return counts.unsqueeze(-1).unsqueeze(-1)
    owner = paddle.repeat_interleave(paddle.arange(len(counts)), counts)  # N
    onehot = F.one_hot(owner, len(counts)).T.astype("float32")  # B x N
    union = onehot @ instance_masks.astype("float32").flatten(1)
    return (union > 0).reshape([len(counts), *instance_masks.shape[1:]])


def segment_miou(source: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    """Mean IoU of boolean ``B x H x W`` masks over the elements whose target is not empty
    (1 when none is)."""
    if source.shape != target.shape or source.ndim != 3:
        raise ValueError(f"two B x H x W masks needed, got {source.shape} and {target.shape}")
    source, target = source.astype("bool"), target.astype("bool")
    valid = (target.astype("int64").sum(axis=[1, 2]) > 0).astype("int64").sum()
    if int(valid) == 0:
        return paddle.to_tensor(1.0)
    inter = (source & target).astype("int64").sum(axis=[1, 2]).astype("float32")
    union = (source | target).astype("int64").sum(axis=[1, 2]).astype("float32")
    return (inter / (union + 1e-8)).sum() / valid.astype("float32")


class SemanticSegCriterion(LossWithWeights):
    """Loss of the segmentation head's semantic map (``semantic_seg``, ``B x 1 x h x w``)
    against each query's union of target masks (or ``targets["semantic_masks"]``): focal or
    BCE, and dice. ``downsample`` resizes the targets to the map, else the map is upsampled to
    the targets. ``presence_head``: per-query losses averaged over the queries whose concept is
    present only, with a presence BCE on ``presence_logit`` when ``presence_loss`` (else 0).
    Terms: ``loss_semantic_seg``, ``loss_semantic_dice``, ``miou_semantic_seg`` and, with the
    presence head, ``loss_semantic_presence`` and ``presence_acc``."""

    def __init__(
        self,
        weight_dict,
        focal: bool = False,
        focal_alpha: float = 0.6,
        focal_gamma: float = 1.6,
        downsample: bool = True,
        presence_head: bool = False,
        presence_loss: bool = True,
    ):
        super().__init__(weight_dict, False)
        self.focal = focal
        self.focal_alpha = focal_alpha
        self.focal_gamma = focal_gamma
        self.downsample = downsample
        self.presence_head = presence_head
        self.presence_loss = presence_loss

    @staticmethod
    def _resize(masks: paddle.Tensor, size) -> paddle.Tensor:
        return F.interpolate(
            masks.astype("float32").unsqueeze(1), size=list(size), mode="bilinear"
        ).squeeze(1)

    def get_loss(self, out_dict, targets):
        outputs = out_dict["semantic_seg"]
        presence_logit = out_dict.get("presence_logit")
        semantic = targets.get("semantic_masks")
        with paddle.no_grad():
            if semantic is not None and semantic.shape[0] > 0:
                if self.downsample:
                    semantic = self._resize(semantic, outputs.shape[-2:]).astype("bool")
            else:
                segments = targets["masks"]
                if self.downsample:
                    segments = self._resize(segments, outputs.shape[-2:]).astype("bool")
                else:
                    segments = segments.astype("bool")
                semantic = instance_masks_to_semantic_masks(segments, targets["num_boxes"])
                if self.downsample and semantic.shape[-2:] != outputs.shape[-2:]:
                    # no instance in the batch: all-background maps of the map's size (upstream
                    # fails here, comparing its 1 x 1 placeholder with the map)
                    semantic = paddle.zeros([semantic.shape[0], *outputs.shape[-2:]], "bool")
        if not self.downsample:
            outputs = F.interpolate(
                outputs.astype("float32"),
                size=list(semantic.shape[-2:]),
                mode="bilinear",
                align_corners=False,
            )
        logits = outputs.squeeze(1)
        target = semantic.astype("float32")
        if self.focal:
            loss = sigmoid_focal_loss(
                logits.flatten(-2),
                target.flatten(-2),
                num_boxes=len(target),
                alpha=self.focal_alpha,
                gamma=self.focal_gamma,
                reduce=not self.presence_head,
            )
            if self.presence_head:
                loss = loss.mean(1)
        else:
            loss = F.binary_cross_entropy_with_logits(
                logits, target, reduction="none" if self.presence_head else "mean"
            )
            if self.presence_head:
                loss = loss.flatten(1).mean(1)
        loss_dice = dice_loss(
            logits.flatten(1), target.flatten(1), len(target), reduce=not self.presence_head
        )
        with paddle.no_grad():
            miou = segment_miou(F.sigmoid(logits) > 0.5, semantic.astype("bool"))
        out = {}
        if self.presence_head:
            present = (target.flatten(1) > 0).any(-1)
            if self.presence_loss:
                flat = presence_logit.flatten()
                out["loss_semantic_presence"] = F.binary_cross_entropy_with_logits(
                    flat, present.astype(flat.dtype)
                )
                out["presence_acc"] = ((F.sigmoid(flat) > 0.5) == present).astype("float32").mean()
            else:
                out["loss_semantic_presence"] = _zero(loss)
                out["presence_acc"] = _zero(loss)
            weight = present.astype(loss.dtype)
            n_valid = float(weight.sum())
            loss = (loss * weight).sum() / (n_valid + 1e-6)
            loss_dice = (loss_dice * weight).sum() / (n_valid + 1e-6)
        out.update(
            {"loss_semantic_seg": loss, "loss_semantic_dice": loss_dice, "miou_semantic_seg": miou}
        )
        return out
