"""SAM 3's training criterion (upstream: ``sam3/train/loss/sam3_loss.py``): the detection losses
of :mod:`.loss_fns` over the final, auxiliary (per decoder layer), first-stage and
one-to-many outputs, plus the targets layout and the roboflow_v100 defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import paddle
from paddle import nn

from ...models.sam3.box_ops import box_cxcywh_to_xyxy
from .loss_fns import CORE_LOSS_KEY, Boxes, IABCEMdetr, Masks, SemanticSegCriterion
from .matcher import BinaryHungarianMatcherV2, BinaryOneToManyMatcher

__all__ = [
    "ROBOFLOW_V100_LOSS_WEIGHTS",
    "ROBOFLOW_V100_MASK_LOSS_WEIGHTS",
    "ROBOFLOW_V100_SEMANTIC_LOSS_WEIGHTS",
    "DummyLoss",
    "Sam3LossWrapper",
    "build_roboflow_v100_loss",
    "compute_matching",
    "make_find_targets",
    "roboflow_v100_loss_weights",
]

# weights of upstream's sam3/train/configs/roboflow_v100/*.yaml (identical in the fine-tuning
# and eval configs): Boxes and IABCEMdetr terms
ROBOFLOW_V100_LOSS_WEIGHTS = {
    "loss_bbox": 5.0,
    "loss_giou": 2.0,
    "loss_ce": 20.0,
    "presence_loss": 20.0,
}
# the Masks terms of the configs' segmentation variant (commented out there: "in case of
# segmentation")
ROBOFLOW_V100_MASK_LOSS_WEIGHTS = {"loss_mask": 200.0, "loss_dice": 10.0}
# and its SemanticSegCriterion (the semantic map: focal alpha 0.6, gamma 2, on the queries whose
# concept is present, map upsampled to the targets, no presence term)
ROBOFLOW_V100_SEMANTIC_LOSS_WEIGHTS = {
    "loss_semantic_seg": 20.0,
    "loss_semantic_presence": 1.0,
    "loss_semantic_dice": 30.0,
}


def roboflow_v100_loss_weights(with_masks: bool = False) -> dict[str, float]:
    """A fresh copy of the roboflow_v100 loss weights (``with_masks``: plus the mask terms)."""
    weights = dict(ROBOFLOW_V100_LOSS_WEIGHTS)
    if with_masks:
        weights.update(ROBOFLOW_V100_MASK_LOSS_WEIGHTS)
    return weights


class DummyLoss(nn.Layer):
    """A loss that is always 0 (upstream's placeholder for evaluation-only datasets).
    ``device``: where the zero lives (Paddle's device strings; upstream's "cuda" means "gpu";
    None: the current device)."""

    def __init__(self, core_loss_key: str = CORE_LOSS_KEY, device: str | None = None, **kwargs):
        super().__init__()
        self.core_loss_key = core_loss_key
        self.device = "gpu" + device[4:] if device and device.startswith("cuda") else device

    def _zero(self) -> paddle.Tensor:
        zero = paddle.zeros([], dtype="float32")
        return zero.to(self.device) if self.device else zero

    def forward(self, *args, **kwargs):
        return {self.core_loss_key: self._zero()}

    def accumulate(self, out_dict):
        """Add a zero core loss to ``out_dict`` when it has none (iterative losses)."""
        if self.core_loss_key not in out_dict:
            out_dict[self.core_loss_key] = self._zero()
        return out_dict


def _world_size() -> int:
    dist = paddle.distributed
    return dist.get_world_size() if dist.is_initialized() else 1


class Sam3LossWrapper(nn.Layer):
    """Applies the find losses to SAM 3's outputs and sums them.

    Each output dict (the final one, each of ``aux_outputs`` with suffix ``_aux_{i}``,
    ``first_stage`` with ``_fs``) must carry its one-to-one matching in ``out["indices"]``
    (upstream has the model compute it; see :func:`compute_matching`). Outputs with
    one-to-many predictions (``pred_logits_o2m``, ``pred_boxes_o2m``,
    ``pred_boxes_xyxy_o2m``, optionally ``pred_masks_o2m``) get the same losses on those,
    matched by ``o2m_matcher`` (or ``matcher`` on auxiliary outputs when
    ``use_o2m_matcher_on_o2m_aux`` is False), weighted by ``o2m_weight``, under the suffix
    ``_o2m``.

    The losses are normalised by the number of targets (``num_boxes``): ``"global"`` averages it
    over the processes of ``paddle.distributed`` (when initialised), ``"local"`` uses this
    process's, both at least 1; ``"none"`` uses 1. ``normalize_by_valid_object_num`` counts only
    boxes with positive width and height. ``normalize_by_stage_num`` divides each stage's core
    loss by the number of stages, ``scale_by_find_batch_size`` multiplies it by ``sqrt(B)``.
    ``loss_fn_semantic_seg`` (optional) adds a semantic-segmentation criterion's terms.

    ``forward(find_stages, find_targets)``: ``find_stages`` is a list of stages, each a list of
    step outputs (upstream's ``SAM3Output``, whose ``loss_stages`` attribute, when set, picks
    the targets of the stages), ``find_targets`` one targets dict per stage. Returns the dict of
    all terms summed over stages and steps, with their total under :data:`CORE_LOSS_KEY`.
    """

    def __init__(
        self,
        loss_fns_find,
        normalization="global",
        matcher=None,
        o2m_matcher=None,
        o2m_weight=1.0,
        use_o2m_matcher_on_o2m_aux=True,
        loss_fn_semantic_seg=None,
        normalize_by_valid_object_num=False,
        normalize_by_stage_num=False,
        scale_by_find_batch_size=False,
    ):
        super().__init__()
        if normalization not in ("global", "local", "none"):
            raise ValueError(f"normalization must be global, local or none, got {normalization!r}")
        self.loss_fns_find = loss_fns_find
        self.normalization = normalization
        self.normalize_by_valid_object_num = normalize_by_valid_object_num
        self.normalize_by_stage_num = normalize_by_stage_num
        self.matcher = matcher
        self.o2m_matcher = o2m_matcher
        self.o2m_weight = o2m_weight
        self.use_o2m_matcher_on_o2m_aux = use_o2m_matcher_on_o2m_aux
        self.loss_fn_semantic_seg = loss_fn_semantic_seg
        self.scale_by_find_batch_size = scale_by_find_batch_size

    def _get_num_boxes(self, targets):
        """The loss normaliser: a float32 0-d tensor (1 for ``normalization="none"``)."""
        if self.normalize_by_valid_object_num:
            wh = targets["boxes"].reshape([-1, 4])[:, 2:]
            num_boxes = (wh > 0).all(axis=-1).astype("float32").sum()
        else:
            num_boxes = targets["num_boxes"].astype("float32").sum()
        if self.normalization == "global":
            world = _world_size()
            if world > 1:
                paddle.distributed.all_reduce(num_boxes)
            return paddle.clip(num_boxes / world, min=1)
        if self.normalization == "local":
            return paddle.clip(num_boxes, min=1)
        return 1

    def compute_loss(self, nested_out, targets):
        """All the terms of one step's outputs (``nested_out``) against ``targets``."""
        num_boxes = self._get_num_boxes(targets)
        o2m_out_is_valid = nested_out.get("o2m_out_is_valid", None)
        o2m_target_is_valid_padded = nested_out.get("o2m_target_is_valid_padded", None)

        output_list = [(nested_out, "", False)]  # (outputs, key suffix, is_aux)
        output_list.extend(
            (aux, f"_aux_{i}", True) for i, aux in enumerate(nested_out.get("aux_outputs", []))
        )
        if "first_stage" in nested_out:
            output_list.append((nested_out["first_stage"], "_fs", True))

        losses = {}
        total_core_loss = 0.0
        for out, suffix, is_aux in output_list:
            indices = out["indices"]
            has_o2m_out = "pred_logits_o2m" in out
            if has_o2m_out:
                o2m_out = {k[: -len("_o2m")]: v for k, v in out.items() if k.endswith("_o2m")}
                o2m_targets = targets
                o2m_matcher = (
                    self.o2m_matcher
                    if self.use_o2m_matcher_on_o2m_aux or not is_aux
                    else self.matcher
                )
                o2m_indices = o2m_matcher(
                    o2m_out,
                    o2m_targets,
                    out_is_valid=o2m_out_is_valid,
                    target_is_valid_padded=o2m_target_is_valid_padded,
                )

            for loss_fn in self.loss_fns_find:
                l_dict = loss_fn(
                    outputs=out,
                    targets=targets,
                    indices=indices,
                    num_boxes=num_boxes,
                    is_aux=is_aux,
                )
                total_core_loss = total_core_loss + l_dict.pop(CORE_LOSS_KEY)
                losses.update({f"{k}{suffix}": v for k, v in l_dict.items()})

                compute_o2m_loss = has_o2m_out and getattr(loss_fn, "supports_o2m_loss", True)
                if isinstance(loss_fn, Masks):  # no mask loss without o2m masks
                    compute_o2m_loss = compute_o2m_loss and "pred_masks" in o2m_out
                if compute_o2m_loss:
                    l_dict = loss_fn(
                        outputs=o2m_out,
                        targets=o2m_targets,
                        indices=o2m_indices,
                        num_boxes=num_boxes,
                        is_aux=is_aux,
                    )
                    l_dict = {k: v * self.o2m_weight for k, v in l_dict.items()}
                    total_core_loss = total_core_loss + l_dict.pop(CORE_LOSS_KEY)
                    losses.update({f"{k}{suffix}_o2m": v for k, v in l_dict.items()})

        losses[CORE_LOSS_KEY] = total_core_loss
        return losses

    def forward(self, find_stages, find_targets):
        loss_stages = getattr(find_stages, "loss_stages", None)
        if loss_stages is not None:
            find_targets = [find_targets[i] for i in loss_stages]
        # every step of every stage (upstream's IterMode.ALL_STEPS_PER_STAGE)
        stages = list(getattr(find_stages, "output", find_stages))
        if len(stages) != len(find_targets):
            raise ValueError(f"{len(stages)} stages vs {len(find_targets)} targets")
        total_losses = {}
        for stage_outputs, targets in zip(stages, find_targets, strict=True):
            for outputs in stage_outputs:
                cur = self.compute_loss(outputs, targets)
                if self.loss_fn_semantic_seg is not None:
                    semantic = self.loss_fn_semantic_seg(outputs, targets)
                    cur[CORE_LOSS_KEY] = cur[CORE_LOSS_KEY] + semantic.pop(CORE_LOSS_KEY)
                    overlap = set(cur) & set(semantic)
                    if overlap:
                        raise ValueError(f"semantic-seg terms clash with find terms: {overlap}")
                    cur.update(semantic)
                if self.normalize_by_stage_num:
                    cur[CORE_LOSS_KEY] = cur[CORE_LOSS_KEY] / len(stages)
                if self.scale_by_find_batch_size:
                    bs = targets["num_boxes"].shape[0]
                    cur[CORE_LOSS_KEY] = cur[CORE_LOSS_KEY] * bs**0.5
                for k, v in cur.items():
                    total_losses[k] = v if k not in total_losses else total_losses[k] + v
        return total_losses


def compute_matching(out: dict, targets: dict, matcher) -> dict:
    """Set ``out["indices"]`` and each ``out["aux_outputs"][i]["indices"]`` to ``matcher``'s
    one-to-one matching against ``targets`` (upstream's ``Sam3Image._compute_matching``, which
    the model runs before the loss). Returns ``out``."""
    out["indices"] = matcher(out, targets)
    for aux in out.get("aux_outputs", []):
        aux["indices"] = matcher(aux, targets)
    return out


def _packed_to_padded(packed: paddle.Tensor, counts: Sequence[int], fill_value) -> paddle.Tensor:
    """``B x max(counts) x ...`` from ``sum(counts) x ...`` rows, ``fill_value`` after each
    image's rows (upstream's ``packed_to_padded_naive``)."""
    B, T, rest = len(counts), max(counts, default=0), list(packed.shape[1:])
    if T == 0:
        return paddle.full([B, 0, *rest], fill_value, dtype=packed.dtype).to(packed.place)
    rows, start = [], 0
    for n in counts:
        row = packed[start : start + n]
        if n < T:
            pad = paddle.full([T - n, *rest], fill_value, dtype=packed.dtype).to(packed.place)
            row = paddle.concat([row, pad], axis=0)
        rows.append(row)
        start += n
    return paddle.stack(rows)


def _tensor(x, place) -> paddle.Tensor:
    return x if isinstance(x, paddle.Tensor) else paddle.to_tensor(np.asarray(x), place=place)


def make_find_targets(
    boxes: Sequence[paddle.Tensor],
    masks: Sequence[paddle.Tensor] | None = None,
    is_valid_mask: Sequence[paddle.Tensor] | None = None,
    is_exhaustive: Sequence[bool] | paddle.Tensor | None = None,
    object_ids: Sequence[paddle.Tensor] | None = None,
) -> dict:
    """The batched targets dict the losses and matchers read, from per-image (per find query)
    lists, laid out as upstream's collator + ``Sam3Image.back_convert``.

    ``boxes[b]``: ``T_b x 4`` normalized (cx, cy, w, h) boxes of image b (``T_b = 0`` for a
    negative prompt); ``masks[b]``: ``T_b x H x W`` bool (None: no mask supervision);
    ``is_valid_mask[b]``: bool ``T_b`` (default all True); ``is_exhaustive``: bool per image
    (default all True); ``object_ids[b]``: int64 ``T_b`` (default 0..T_b-1 over the batch).

    Returns ``num_boxes`` (int64 B), ``boxes`` / ``boxes_xyxy`` (packed ``N x 4``),
    ``boxes_padded`` (``B x max T_b x 4``, zero padding), ``positive_map`` (ones ``N x 1``),
    ``masks``, ``semantic_masks`` (None), ``is_valid_mask``, ``is_exhaustive``,
    ``object_ids_packed`` and ``object_ids_padded`` (-1 padding)."""
    counts = [int(b.shape[0]) for b in boxes]
    place = boxes[0].place if boxes else paddle.CPUPlace()
    dtype = boxes[0].dtype if boxes else paddle.float32
    packed = paddle.concat([b.reshape([-1, 4]).astype(dtype) for b in boxes], axis=0)
    if object_ids is None:
        ids = paddle.arange(sum(counts), dtype="int64").to(place)
    else:
        ids = paddle.concat([_tensor(o, place).astype("int64") for o in object_ids])
    if is_exhaustive is None:
        is_exhaustive = [True] * len(boxes)
    if not isinstance(is_exhaustive, paddle.Tensor):
        is_exhaustive = paddle.to_tensor(np.asarray(is_exhaustive, dtype=bool), place=place)
    packed_masks = valid = None
    if masks is not None:
        packed_masks = paddle.concat([m.astype("bool") for m in masks], axis=0)
        if is_valid_mask is None:
            valid = paddle.ones([sum(counts)], dtype="bool").to(place)
        else:
            valid = paddle.concat([_tensor(v, place).astype("bool") for v in is_valid_mask])
    return {
        "boxes": packed,
        "boxes_xyxy": box_cxcywh_to_xyxy(packed),
        "boxes_padded": _packed_to_padded(packed, counts, 0),
        "positive_map": paddle.ones([sum(counts), 1], dtype=dtype).to(place),
        "num_boxes": paddle.to_tensor(np.asarray(counts, dtype=np.int64), place=place),
        "masks": packed_masks,
        "semantic_masks": None,
        "is_valid_mask": valid,
        "is_exhaustive": is_exhaustive,
        "object_ids_packed": ids,
        "object_ids_padded": _packed_to_padded(ids, counts, -1),
    }


def build_roboflow_v100_loss(
    with_masks: bool = False,
    normalization: str = "global",
    o2m_weight: float = 2.0,
    scale_by_find_batch_size: bool = True,
    semantic_seg: bool = False,
    pad_n_queries: int | None = 200,
) -> Sam3LossWrapper:
    """The criterion of upstream's roboflow_v100 fine-tuning config: the focal Hungarian matcher
    (cost_class 2, cost_bbox 5, cost_giou 2, alpha 0.25, gamma 2) and the one-to-many matcher
    (alpha 0.3, threshold 0.4, topk 4, weight 2, the Hungarian one on auxiliary one-to-many
    queries); ``Boxes`` and ``IABCEMdetr`` (pos_weight 10, alpha 0.25, gamma 2, presence,
    pad_n_queries 200, not weak) with :data:`ROBOFLOW_V100_LOSS_WEIGHTS`; the core loss scaled
    by ``sqrt(batch size)``. ``with_masks`` adds the config's segmentation variant's ``Masks``
    loss (focal alpha 0.25, gamma 2, final outputs only) with
    :data:`ROBOFLOW_V100_MASK_LOSS_WEIGHTS`. Its ``matcher`` fills ``out["indices"]``
    (:func:`compute_matching`). ``o2m_weight`` and ``scale_by_find_batch_size`` are the
    config's (2.0, True); without the scaling, data-parallel processes average to exactly the
    loss of one process with their batches together. ``semantic_seg`` adds the segmentation
    variant's ``SemanticSegCriterion`` on the semantic map with
    :data:`ROBOFLOW_V100_SEMANTIC_LOSS_WEIGHTS`. ``pad_n_queries``: the classification loss's
    divisor per prompt (upstream's 200, its query count; ``None``: the model's queries)."""
    w = roboflow_v100_loss_weights(with_masks)
    loss_fns = [
        Boxes(weight_dict={"loss_bbox": w["loss_bbox"], "loss_giou": w["loss_giou"]}),
        IABCEMdetr(
            weak_loss=False,
            weight_dict={"loss_ce": w["loss_ce"], "presence_loss": w["presence_loss"]},
            pos_weight=10.0,
            alpha=0.25,
            gamma=2,
            use_presence=True,
            pos_focal=False,
            pad_n_queries=pad_n_queries,
            pad_scale_pos=1.0,
        ),
    ]
    if with_masks:
        loss_fns.append(
            Masks(
                focal_alpha=0.25,
                focal_gamma=2.0,
                weight_dict={"loss_mask": w["loss_mask"], "loss_dice": w["loss_dice"]},
                compute_aux=False,
            )
        )
    return Sam3LossWrapper(
        loss_fns_find=loss_fns,
        normalization=normalization,
        matcher=BinaryHungarianMatcherV2(
            focal=True,
            cost_class=2.0,
            cost_bbox=5.0,
            cost_giou=2.0,
            alpha=0.25,
            gamma=2,
            stable=False,
        ),
        o2m_matcher=BinaryOneToManyMatcher(alpha=0.3, threshold=0.4, topk=4),
        o2m_weight=o2m_weight,
        use_o2m_matcher_on_o2m_aux=False,
        loss_fn_semantic_seg=SemanticSegCriterion(
            weight_dict=dict(ROBOFLOW_V100_SEMANTIC_LOSS_WEIGHTS),
            presence_head=True,
            presence_loss=False,
            focal=True,
            focal_alpha=0.6,
            focal_gamma=2.0,
            downsample=False,
        )
        if semantic_seg
        else None,
        scale_by_find_batch_size=scale_by_find_batch_size,
    )
