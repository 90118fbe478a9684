"""Held-out score of a SAM 2 video model on synthetic clips it never saw: every object seen on
the first frame is clicked once there (at the point farthest from its edge) and tracked through
the clip by the video predictor users run (:class:`~...predict.sam2.SAM2VideoPredictor`).

The score is the mean IoU over every object and frame (the region similarity J of DAVIS): a
frame where the object is hidden and the prediction empty counts 1, a prediction on a hidden
object 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def frame_ious(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per-frame IoU of ``T x H x W`` bool masks (1 where both are empty)."""
    inter = (pred & truth).reshape(len(pred), -1).sum(1)
    union = (pred | truth).reshape(len(pred), -1).sum(1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def track_clicks(predictor, frames: Any, points: dict[int, tuple[float, float]]) -> dict:
    """Track objects clicked once on frame 0 (``{obj_id: (x, y)}`` in the video's pixels):
    ``{obj_id: T x H x W bool}``."""
    state = predictor.init_state(frames)
    for obj_id, (x, y) in points.items():
        predictor.add_new_points_or_box(
            state, frame_idx=0, obj_id=obj_id, points=[[x, y]], labels=[1]
        )
    out: dict[int, list[np.ndarray]] = {o: [] for o in points}
    for _, obj_ids, masks in predictor.propagate_in_video(state):
        logits = masks.numpy()[:, 0]
        for i, obj_id in enumerate(obj_ids):
            out[obj_id].append(logits[i] > 0)
    return {o: np.stack(m) for o, m in out.items()}


def clip_miou(predictor, frames: np.ndarray, masks: np.ndarray, min_area: int = 64) -> list[float]:
    """Mean IoU over the frames of each object of a clip (``masks`` ``T x N x H x W``) seen on
    its first frame with at least ``min_area`` pixels."""
    from ..clips import inside_point

    points = {
        i + 1: inside_point(masks[0, i])
        for i in range(masks.shape[1])
        if masks[0, i].sum() >= min_area
    }
    if not points:
        return []
    tracked = track_clicks(predictor, list(frames), points)
    return [float(frame_ious(tracked[o], masks[:, o - 1]).mean()) for o in points]


def video_predictor_of(model):
    """A :class:`SAM2VideoPredictor` with ``model``'s spec and weights (upstream's video
    settings: masks of clicked frames binarised for the memory, small holes filled)."""
    from ...loading.sam2 import build_sam2_video_predictor

    predictor = build_sam2_video_predictor(model.spec)
    predictor.set_state_dict(model.state_dict())
    predictor.eval()
    return predictor


def evaluate_clips(model, clips: Any, num_clips: int, progress: bool = False) -> dict:
    """Mean IoU of ``model`` (a SAM 2 model) over ``num_clips`` clips of ``clips`` (a
    ``ClipSpec``: seed, frames, sizes); also per object in ``ious``."""
    from tqdm import tqdm

    from ..clips import clip_at

    predictor = model if hasattr(model, "init_state") else video_predictor_of(model)
    ious: list[float] = []
    for index in tqdm(range(num_clips), desc="eval", disable=not progress, leave=False):
        clip = clip_at(clips, index)
        ious.extend(clip_miou(predictor, clip.frames, clip.masks))
    return {"miou": float(np.mean(ious)) if ious else 0.0, "objects": len(ious), "ious": ious}
