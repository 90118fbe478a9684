"""SAM 3 evaluation on a COCO instance dataset whose categories are concepts: every category
name is prompted as text on every image, and the instances found are scored against the
annotations with pycocotools' COCO evaluation (box and mask AP, per concept and overall).
Prompting every concept on every image counts the concepts absent from an image too: what the
model finds there is a false positive, as in upstream's open-vocabulary evaluation.

:func:`instance_recall` is the demo-level check: the share of an image's instances of one
concept that an answer covers with IoU >= a threshold (one answer mask per instance).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np

from ...predict.io import coco_rle, load_image, resolve_under
from ...predict.sam_v1.amg_utils import box_xyxy_to_xywh

# detections kept for AP: low, as COCO evaluation ranks them by score (a high threshold only
# drops recall); `paddle-sam eval --confidence-threshold` and training's evaluations
AP_CONFIDENCE_THRESHOLD = 0.05


def _mask_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every mask of ``a`` (N x H x W) with every mask of ``b`` (M x H x W): N x M."""
    a2 = a.reshape(len(a), -1).astype(np.float32)
    b2 = b.reshape(len(b), -1).astype(np.float32)
    inter = a2 @ b2.T
    union = a2.sum(1)[:, None] + b2.sum(1)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1), 0.0)


def instance_recall(
    pred_masks: np.ndarray, gt_masks: np.ndarray, iou_threshold: float = 0.8
) -> dict[str, Any]:
    """How many ground-truth instances an answer finds: each instance matched to a distinct
    answer mask, greedily by highest IoU first, found when that IoU >= ``iou_threshold``.
    (Visible instance masks do not overlap, so with a threshold above 0.5 a mask can reach it
    with one instance at most: the count is that of any one-to-one matching.) Returns
    ``{"instances", "found", "recall", "ious"}`` (``ious``: per instance, 0 when no mask was
    left for it)."""
    gt = np.asarray(gt_masks, dtype=bool)
    pred = np.asarray(pred_masks, dtype=bool)
    ious = np.zeros(len(gt))
    if len(gt) and len(pred):
        m = _mask_iou(gt, pred)
        free_gt, free_pred = np.ones(len(gt), bool), np.ones(len(pred), bool)
        for flat in np.argsort(-m, axis=None, kind="stable"):
            i, j = divmod(int(flat), len(pred))
            if free_gt[i] and free_pred[j]:
                ious[i], free_gt[i], free_pred[j] = m[i, j], False, False
    found = int((ious >= iou_threshold).sum())
    return {
        "instances": int(len(gt)),
        "found": found,
        "recall": found / len(gt) if len(gt) else 1.0,
        "ious": [round(float(v), 4) for v in ious],
    }


def _summary(gt, detections: list[dict], iou_type: str) -> dict[str, Any]:
    """COCO AP and AP50 overall and per category for ``iou_type`` ("bbox" or "segm")."""
    from pycocotools.cocoeval import COCOeval

    cat_ids = sorted(gt.getCatIds())
    if not detections:  # every concept with ground truth at 0; those without: not applicable
        per = {c: (0.0, 0.0) if gt.getAnnIds(catIds=[c]) else (None, None) for c in cat_ids}
        return {"AP": 0.0, "AP50": 0.0, "per_category": per}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its tables
        dt = gt.loadRes(detections)
        ev = COCOeval(gt, dt, iou_type)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    precision = ev.eval["precision"]  # T x R x K x A x M; area "all" = 0, maxDets 100 = -1

    def ap(p: np.ndarray) -> float | None:
        p = p[p > -1]  # COCO's -1: no ground truth of the category, not applicable
        return float(p.mean()) if p.size else None

    per = {}
    for k, c in enumerate(ev.params.catIds):
        per[c] = (ap(precision[:, :, k, 0, -1]), ap(precision[0, :, k, 0, -1]))
    return {"AP": float(ev.stats[0]), "AP50": float(ev.stats[1]), "per_category": per}


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def evaluate_concepts(
    predictor: Any,
    annotations: str | Path,
    images: str | Path | None = None,
    num_images: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Box and mask AP of ``predictor`` (a ``Sam3Predictor``) on a COCO instance file whose
    category names are the concepts. ``images``: the image folder (default: the file's own
    folder, or ``images/`` beside it when that exists); ``num_images``: the first N images.

    Returns ``{"images", "concepts", "detections", "box": {"AP", "AP50"}, "mask": {...},
    "per_concept": {name: {"box_AP", "box_AP50", "mask_AP", "mask_AP50", "instances"}}}``.
    """
    from pycocotools.coco import COCO
    from tqdm import tqdm

    path = Path(annotations)
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(path))
    if images is None:
        images = path.parent / "images" if (path.parent / "images").is_dir() else path.parent
    root = Path(images)
    cats = {c["id"]: c["name"] for c in gt.loadCats(gt.getCatIds())}
    if not cats:
        raise ValueError(f"{path}: no categories: SAM 3 evaluation prompts their names")
    image_ids = sorted(gt.getImgIds())[:num_images]
    # only the images evaluated count (COCOeval reads params.imgIds)
    gt.dataset["images"] = [gt.imgs[i] for i in image_ids]
    kept = set(image_ids)
    gt.dataset["annotations"] = [a for a in gt.dataset["annotations"] if a["image_id"] in kept]
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    detections: list[dict] = []
    for image_id in tqdm(image_ids, desc="eval", disable=not progress):
        info = gt.imgs[image_id]
        predictor.set_image(load_image(resolve_under(root, info["file_name"])))
        for cat_id, name in cats.items():
            found = predictor.ground(name)
            for m, s, b in zip(found.masks, found.scores, found.boxes, strict=True):
                det = {"image_id": image_id, "category_id": cat_id, "score": float(s)}
                det["bbox"] = [float(v) for v in box_xyxy_to_xywh(np.asarray(b, np.float64))]
                det["segmentation"] = coco_rle(np.asarray(m, dtype=bool))
                detections.append(det)
    box = _summary(gt, detections, "bbox")
    mask = _summary(gt, detections, "segm")
    per_concept = {}
    for cat_id, name in cats.items():
        b_ap, b_ap50 = box["per_category"].get(cat_id, (None, None))
        m_ap, m_ap50 = mask["per_category"].get(cat_id, (None, None))
        per_concept[name] = {  # None (null): no ground truth here, as COCO's -1
            "instances": len(gt.getAnnIds(catIds=[cat_id], iscrowd=False)),
            "box_AP": _rounded(b_ap),
            "box_AP50": _rounded(b_ap50),
            "mask_AP": _rounded(m_ap),
            "mask_AP50": _rounded(m_ap50),
        }
    return {
        "images": len(image_ids),
        "concepts": len(cats),
        "detections": len(detections),
        "box": {"AP": round(box["AP"], 4), "AP50": round(box["AP50"], 4)},
        "mask": {"AP": round(mask["AP"], 4), "AP50": round(mask["AP50"], 4)},
        "per_concept": per_concept,
    }


__all__ = ["AP_CONFIDENCE_THRESHOLD", "evaluate_concepts", "instance_recall"]
