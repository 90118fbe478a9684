"""Prediction-to-target matchers of SAM 3 training (upstream: ``sam3/train/matcher.py``).

Both matchers take the model's detection outputs and the batched find targets and return the
matched pairs as three int64 tensors ``(batch_idx, src_idx, tgt_idx)``:

* ``batch_idx[k]``, ``src_idx[k]``: the image (find query) and the prediction (object query) of
  the k-th pair, so ``outputs["pred_boxes"][batch_idx, src_idx]`` are the matched predictions;
* ``tgt_idx[k]``: the index of the matched target in the *packed* targets (``targets["boxes"]``,
  all images' boxes one after the other), or ``None`` when the pairs are already in packed
  target order (one-to-one matching that matched every target, see
  :class:`BinaryHungarianMatcherV2`).

Inputs, as upstream:

* ``outputs["pred_logits"]``: ``B x Q x 1`` logits, ``outputs["pred_boxes"]``: ``B x Q x 4``
  normalized (cx, cy, w, h) boxes;
* ``batched_targets["num_boxes"]``: int64 ``B`` (targets per image, ``T_b``),
  ``batched_targets["boxes_padded"]``: ``B x max(T_b) x 4`` (cx, cy, w, h) boxes, each image's
  ``T_b`` boxes first, then padding.

The assignment itself runs on the CPU (scipy's ``linear_sum_assignment``); the matchers pull the
``B x Q x T`` cost matrix there and return the indices on the predictions' device.
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from ...models.sam3.box_ops import box_cxcywh_to_xyxy, box_iou, generalized_box_iou

__all__ = ["BinaryHungarianMatcherV2", "BinaryOneToManyMatcher"]

# costs at or above this mark an invalid prediction / target (upstream's value)
_INVALID_COST = 1e9
_VALID_THRESH = 1e8


def _linear_sum_assignment(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "SAM 3's Hungarian matching needs scipy (scipy.optimize.linear_sum_assignment): "
            "pip install scipy"
        ) from exc
    return linear_sum_assignment(cost)


def _do_matching(
    cost: np.ndarray,
    repeats: int = 1,
    return_tgt_indices: bool = False,
    do_filtering: bool = False,
):
    """Minimum-cost one-to-one assignment of the rows (predictions) of a ``Q x T`` cost matrix
    to its columns (targets).

    ``repeats > 1`` tiles the columns ``repeats`` times, so each target can take up to that many
    predictions (column ``j`` of the result then means target ``j % T`` in copy ``j // T``).
    ``do_filtering`` drops the pairs whose cost is at least 1e8 (invalid predictions/targets).
    Returns ``(rows, cols)`` when ``return_tgt_indices``, else only the rows, sorted by their
    column (so the k-th row is matched to the k-th target)."""
    if repeats > 1:
        cost = np.tile(cost, (1, repeats))
    rows, cols = _linear_sum_assignment(cost)
    if do_filtering:
        keep = cost[rows, cols] < _VALID_THRESH
        rows = np.asarray(rows[keep], dtype=np.int64)
        cols = np.asarray(cols[keep], dtype=np.int64)
    if return_tgt_indices:
        return rows, cols
    return rows[np.argsort(cols)]


def _int64(values, place) -> paddle.Tensor:
    return paddle.to_tensor(np.asarray(values, dtype=np.int64).reshape([-1]), place=place)


def _as_numpy(x) -> np.ndarray:
    return x.numpy() if isinstance(x, paddle.Tensor) else np.asarray(x)


def _take(x: paddle.Tensor, keep: np.ndarray) -> paddle.Tensor:
    """Rows ``keep`` (a numpy index array) of ``x`` along axis 0."""
    return paddle.gather(x, _int64(keep, x.place), axis=0)


class BinaryHungarianMatcherV2(nn.Layer):
    """One-to-one (Hungarian) matching of the object queries to the ground-truth boxes.

    The cost of matching prediction ``q`` to target ``t`` is
    ``cost_bbox * L1(box_q, box_t) + cost_class * class_cost(q) - cost_giou * GIoU(box_q, box_t)``
    where ``class_cost`` is ``-sigmoid(logit)`` or, with ``focal``, the difference of the focal
    losses of calling ``q`` positive and negative (``alpha``, ``gamma``). ``stable`` (focal
    only) scales the probability by the GIoU rescaled to [0, 1] first.

    ``remove_samples_with_0_gt`` leaves out the images without any target (their predictions
    are then all unmatched). Queries beyond the targets stay unmatched; when some image has
    more targets than queries (times ``repeats``), only ``Q`` of its targets are matched and
    ``tgt_idx`` says which.

    SAM 3's image configs (roboflow_v100, odinw) use ``focal=True, cost_class=2, cost_bbox=5,
    cost_giou=2, alpha=0.25, gamma=2``.
    """

    def __init__(
        self,
        cost_class: float = 1,
        cost_bbox: float = 1,
        cost_giou: float = 1,
        focal: bool = False,
        alpha: float = 0.25,
        gamma: float = 2.0,
        stable: bool = False,
        remove_samples_with_0_gt: bool = True,
    ):
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("cost_class, cost_bbox and cost_giou cannot all be 0")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou
        self.focal = focal
        if focal:
            self.alpha = alpha
            self.gamma = gamma
            self.stable = stable
        self.remove_samples_with_0_gt = remove_samples_with_0_gt

    def _class_cost(self, out_score: paddle.Tensor, cost_giou: paddle.Tensor) -> paddle.Tensor:
        """``B x Q x T`` classification cost from logits ``B x Q`` (and ``-GIoU`` for stable)."""
        out_prob = F.sigmoid(out_score)
        if not self.focal:
            return (-out_prob).unsqueeze(-1).expand_as(cost_giou)
        if self.stable:
            p = out_prob.unsqueeze(-1).expand_as(cost_giou) * ((-cost_giou + 1) / 2)
            return -self.alpha * (1 - p) ** self.gamma * paddle.log(p) + (
                1 - self.alpha
            ) * p**self.gamma * paddle.log(1 - p)
        # log-sigmoids straight from the logits (no log of a rounded probability)
        cost = -self.alpha * (1 - out_prob) ** self.gamma * F.log_sigmoid(out_score) + (
            1 - self.alpha
        ) * out_prob**self.gamma * F.log_sigmoid(-out_score)
        return cost.unsqueeze(-1).expand_as(cost_giou)

    @paddle.no_grad()
    def forward(
        self,
        outputs: dict,
        batched_targets: dict,
        repeats: int = 1,
        repeat_batch: int = 1,
        out_is_valid: paddle.Tensor | None = None,
        target_is_valid_padded: paddle.Tensor | None = None,
    ):
        """Match ``outputs`` (``pred_logits`` ``B x Q x 1``, ``pred_boxes`` ``B x Q x 4``) to
        ``batched_targets`` (``num_boxes`` ``B``, ``boxes_padded`` ``B x T x 4``).

        ``repeats``: each target may take up to that many predictions; ``repeat_batch``: the
        outputs hold ``repeat_batch`` stacked copies of the batch (``repeat_batch * B`` rows,
        e.g. final and auxiliary outputs), matched each against the same targets.
        ``out_is_valid`` (bool ``B x Q``) and ``target_is_valid_padded`` (bool ``B x T``) leave
        out the predictions / targets marked False.

        Returns ``(batch_idx, src_idx, tgt_idx)`` int64 (``tgt_idx`` None when the pairs follow
        the packed target order, see the module docstring)."""
        num_queries = outputs["pred_logits"].shape[1]
        out_score = outputs["pred_logits"].squeeze(-1)  # B x Q
        out_bbox = outputs["pred_boxes"]  # B x Q x 4
        place = out_score.place

        num_boxes = _as_numpy(batched_targets["num_boxes"]).astype(np.int64).reshape([-1])
        tgt_bbox = batched_targets["boxes_padded"]
        batch_keep = None
        if self.remove_samples_with_0_gt:
            batch_keep = num_boxes > 0
            kept = np.nonzero(batch_keep)[0]
            num_boxes = num_boxes[batch_keep]
            tgt_bbox = _take(tgt_bbox, kept)
            if target_is_valid_padded is not None:
                target_is_valid_padded = _take(target_is_valid_padded, kept)
        if repeat_batch > 1:
            num_boxes = np.tile(num_boxes, repeat_batch)
            tgt_bbox = tgt_bbox.tile([repeat_batch, 1, 1])
            if target_is_valid_padded is not None:
                target_is_valid_padded = target_is_valid_padded.tile([repeat_batch, 1])
        if self.remove_samples_with_0_gt:
            if repeat_batch > 1:
                batch_keep = np.tile(batch_keep, repeat_batch)
            kept = np.nonzero(batch_keep)[0]
            out_score = _take(out_score, kept)
            out_bbox = _take(out_bbox, kept)
            if out_is_valid is not None:
                out_is_valid = _take(out_is_valid, kept)
        if out_bbox.shape[0] != tgt_bbox.shape[0] or out_bbox.shape[0] != len(num_boxes):
            raise ValueError(
                f"{out_bbox.shape[0]} output rows vs {tgt_bbox.shape[0]} target rows "
                f"(repeat_batch={repeat_batch})"
            )

        do_filtering = out_is_valid is not None or target_is_valid_padded is not None
        return_tgt_indices = do_filtering or bool(np.any(num_queries < num_boxes * max(repeats, 1)))
        if len(num_boxes) == 0:
            # every image of the batch is without targets: nothing to match
            empty = _int64([], place)
            return empty, empty, (empty if return_tgt_indices else None)

        tgt_bbox = tgt_bbox.astype(out_bbox.dtype)
        cost_bbox = (out_bbox.unsqueeze(2) - tgt_bbox.unsqueeze(1)).abs().sum(-1)  # B x Q x T
        cost_giou = -generalized_box_iou(box_cxcywh_to_xyxy(out_bbox), box_cxcywh_to_xyxy(tgt_bbox))
        cost_class = self._class_cost(out_score, cost_giou)
        C = self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou
        if out_is_valid is not None:
            C = paddle.where(out_is_valid.unsqueeze(-1), C, paddle.full_like(C, _INVALID_COST))
        if target_is_valid_padded is not None:
            C = paddle.where(
                target_is_valid_padded.unsqueeze(1), C, paddle.full_like(C, _INVALID_COST)
            )
        C = C.numpy()
        costs = [C[i, :, :s] for i, s in enumerate(num_boxes.tolist())]

        if return_tgt_indices:
            pairs = [
                _do_matching(c, repeats, return_tgt_indices=True, do_filtering=do_filtering)
                for c in costs
            ]
            indices = [p[0] for p in pairs]
            offsets = np.concatenate([[0], np.cumsum(num_boxes)[:-1]])
            tgt_idx = _int64(
                np.concatenate(
                    [np.asarray(p[1], np.int64) + o for p, o in zip(pairs, offsets, strict=True)]
                ),
                place,
            )
        else:
            indices = [_do_matching(c, repeats, do_filtering=do_filtering) for c in costs]
            tgt_idx = None

        rows = np.nonzero(batch_keep)[0] if batch_keep is not None else np.arange(len(costs))
        batch_idx = np.concatenate(
            [np.full(len(src), rows[i], dtype=np.int64) for i, src in enumerate(indices)]
        )
        src_idx = np.concatenate([np.asarray(src, np.int64) for src in indices])
        return _int64(batch_idx, place), _int64(src_idx, place), tgt_idx


def _quantile_dim1(x: paddle.Tensor, q: float) -> paddle.Tensor:
    """``torch.quantile(x, q, dim=1, keepdim=True)`` (linear interpolation) for ``B x N x T``
    ``x``, with torch's float arithmetic: the rank ``q * (N - 1)`` in the dtype of ``x`` and
    torch's two-sided ``lerp`` between the neighbouring order statistics."""
    n = x.shape[1]
    dtype = np.float64 if x.dtype == paddle.float64 else np.float32
    rank = dtype(q) * dtype(n - 1)
    below, above = int(np.floor(rank)), int(np.ceil(rank))
    weight = float(rank - dtype(below))
    ordered = paddle.sort(x, axis=1)
    lo, hi = ordered[:, below : below + 1], ordered[:, above : above + 1]
    if weight < 0.5:
        return lo + weight * (hi - lo)
    return hi - (hi - lo) * (1 - weight)


class BinaryOneToManyMatcher(nn.Layer):
    """One-to-many matching (DAC-DETR style) for SAM 3's auxiliary one-to-many queries.

    Scores every (prediction, target) pair as ``alpha * sigmoid(logit) + (1 - alpha) * IoU``
    and matches a pair when its score is among the ``topk`` best of that target (strictly above
    the score quantile ``1 - topk / Q`` over the queries) and above ``threshold``. A target
    thus gets up to ``topk`` predictions; nothing keeps a prediction from matching several
    targets (as upstream). SAM 3's image configs use ``alpha=0.3, threshold=0.4, topk=4``.
    """

    def __init__(self, alpha: float = 0.3, threshold: float = 0.4, topk: int = 6):
        super().__init__()
        self.alpha = alpha
        self.threshold = threshold
        self.topk = topk

    @paddle.no_grad()
    def forward(
        self,
        outputs: dict,
        batched_targets: dict,
        repeats: int = 1,
        repeat_batch: int = 1,
        out_is_valid: paddle.Tensor | None = None,
        target_is_valid_padded: paddle.Tensor | None = None,
    ):
        """Match ``outputs`` (``pred_logits`` ``B x Q x 1``, ``pred_boxes`` ``B x Q x 4``) to
        ``batched_targets`` (``num_boxes`` ``B``, ``boxes_padded`` ``B x T x 4``); invalid
        predictions / targets (``out_is_valid`` ``B x Q``, ``target_is_valid_padded``
        ``B x T``, bool) are never matched. ``repeats`` and ``repeat_batch`` must be 1.

        Returns ``(batch_idx, src_idx, tgt_idx)`` int64, ordered by image, query, target;
        ``tgt_idx`` indexes the packed targets."""
        if repeats > 1 or repeat_batch > 1:
            raise ValueError("BinaryOneToManyMatcher supports repeats=1 and repeat_batch=1 only")
        bs, num_queries = outputs["pred_logits"].shape[:2]
        out_prob = F.sigmoid(outputs["pred_logits"]).squeeze(-1)  # B x Q
        out_bbox = outputs["pred_boxes"]
        place = out_prob.place
        num_boxes = _as_numpy(batched_targets["num_boxes"]).astype(np.int64).reshape([-1])
        tgt_bbox = batched_targets["boxes_padded"]
        if len(tgt_bbox) != bs:
            raise ValueError(f"{len(tgt_bbox)} target rows for a batch of {bs}")
        num_targets = tgt_bbox.shape[1]
        if num_targets == 0:
            empty = _int64([], place)
            return empty, empty, empty
        q = 1 - self.topk / num_queries
        if not 0 <= q <= 1:
            raise ValueError(f"topk={self.topk} needs at least as many queries, got {num_queries}")

        tgt_bbox = tgt_bbox.astype(out_bbox.dtype)
        iou, _ = box_iou(box_cxcywh_to_xyxy(out_bbox), box_cxcywh_to_xyxy(tgt_bbox))  # B x Q x T
        # higher is better here (unlike the Hungarian costs)
        C = self.alpha * out_prob.unsqueeze(-1) + (1 - self.alpha) * iou
        if out_is_valid is not None:
            C = paddle.where(out_is_valid.unsqueeze(-1), C, paddle.full_like(C, -_INVALID_COST))
        if target_is_valid_padded is not None:
            C = paddle.where(
                target_is_valid_padded.unsqueeze(1), C, paddle.full_like(C, -_INVALID_COST)
            )

        matches = paddle.logical_and(C > _quantile_dim1(C, q), C > self.threshold)
        if out_is_valid is not None:
            matches = paddle.logical_and(matches, out_is_valid.unsqueeze(-1))
        if target_is_valid_padded is not None:
            matches = paddle.logical_and(matches, target_is_valid_padded.unsqueeze(1))
        real = np.arange(num_targets)[None] < num_boxes[:, None]  # B x T: not padding
        matches = paddle.logical_and(matches, paddle.to_tensor(real[:, None, :], place=place))

        found = paddle.nonzero(matches).numpy().reshape([-1, 3])
        offsets = np.concatenate([[0], np.cumsum(num_boxes)[:-1]]).astype(np.int64)
        batch_idx, src_idx, tgt_idx = found[:, 0], found[:, 1], found[:, 2]
        tgt_idx = tgt_idx + offsets[batch_idx]
        return _int64(batch_idx, place), _int64(src_idx, place), _int64(tgt_idx, place)
