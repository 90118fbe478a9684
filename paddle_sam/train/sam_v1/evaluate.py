"""Held-out evaluation: mIoU with 1 click, 3 clicks and a box, through :class:`SamPredictor`.

Clicks are deterministic (the point deepest inside the object, then the deepest point of the
error region, with the previous low-res logits fed back), boxes are the tight ground-truth
boxes, and IoU is measured at the original image resolution: exactly what a user gets.
"""

from __future__ import annotations

import numpy as np

from ...predict.sam_v1.predictor import SamPredictor
from .prompts import eval_correction_click, interior_point, mask_box


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def evaluate(sam, dataset, num_images: int | None = None, progress: bool = False) -> dict:
    """mIoU over every instance of the first ``num_images`` usable images of ``dataset``."""
    from tqdm import tqdm

    was_training = sam.training
    sam.eval()
    predictor = SamPredictor(sam)
    n = len(dataset) if num_images is None else min(num_images, len(dataset))
    ious: dict[str, list[float]] = {"1click": [], "3click": [], "box": []}
    images = 0
    try:
        for i in tqdm(range(n), desc="eval", disable=not progress, leave=False):
            item = dataset.load(i)
            if item is None:
                continue
            image, masks = item
            images += 1
            predictor.set_image(image)
            for gt in masks:
                x, y = interior_point(gt)
                coords, labels = [[x, y]], [1]
                m, s, logits = predictor.predict(np.array(coords), np.array(labels))
                best = int(np.argmax(s))
                ious["1click"].append(_iou(m[best], gt))
                pred, prev = m[best], logits[best][None]
                for _ in range(2):
                    x, y, lab = eval_correction_click(pred, gt)
                    coords.append([x, y])
                    labels.append(lab)
                    m, _, logits = predictor.predict(
                        np.array(coords),
                        np.array(labels),
                        mask_input=prev,
                        multimask_output=False,
                    )
                    pred, prev = m[0], logits[0][None]
                ious["3click"].append(_iou(pred, gt))
                m, _, _ = predictor.predict(box=mask_box(gt), multimask_output=False)
                ious["box"].append(_iou(m[0], gt))
    finally:
        if was_training:
            sam.train()
    out = {f"miou_{k}": float(np.mean(v)) if v else float("nan") for k, v in ious.items()}
    out["instances"] = len(ious["box"])
    out["images"] = images
    return out
