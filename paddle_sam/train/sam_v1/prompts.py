"""Prompt simulation as in the SAM paper (sec. 3 and appendix A), on numpy masks.

Training: a positive point uniformly from the mask, or the mask's box with noise (std 10% of
the side, at most 20 px); then correction clicks sampled uniformly from the error region of
the previous prediction, positive on a false negative, negative on a false positive.
Evaluation uses deterministic clicks: the point of the (error) region farthest from its
boundary. Points are (x, y) pixels.
"""

from __future__ import annotations

import numpy as np


def random_point(mask: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """A pixel of ``mask`` (H x W bool) uniformly at random: (x, y)."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        raise ValueError("cannot sample a point from an empty mask")
    i = int(rng.integers(len(xs)))
    return float(xs[i]), float(ys[i])


def mask_box(mask: np.ndarray) -> np.ndarray:
    """Tight xyxy box of ``mask`` (x1, y1 = last pixel + 1)."""
    ys, xs = np.nonzero(mask)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float64)


def noisy_box(
    mask: np.ndarray,
    rng: np.random.Generator,
    noise: float = 0.1,
    max_noise: float = 20.0,
) -> np.ndarray:
    """The mask's box with each coordinate moved by N(0, noise * side), clipped to
    +-``max_noise`` px and to the image."""
    box = mask_box(mask)
    w, h = box[2] - box[0], box[3] - box[1]
    std = noise * np.array([w, h, w, h])
    box = box + np.clip(rng.normal(0, 1, 4) * std, -max_noise, max_noise)
    H, W = mask.shape
    box = np.clip(box, 0, [W, H, W, H])
    x0, x1 = sorted(box[[0, 2]])
    y0, y1 = sorted(box[[1, 3]])
    return np.array([x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)])


def correction_click(
    pred: np.ndarray, gt: np.ndarray, rng: np.random.Generator
) -> tuple[float, float, int]:
    """(x, y, label) sampled uniformly from the error region ``pred ^ gt``: label 1 where the
    object was missed, 0 where background was included. With no error, a positive point."""
    err = pred != gt
    if not err.any():
        x, y = random_point(gt, rng)
        return x, y, 1
    x, y = random_point(err, rng)
    return x, y, int(gt[int(y), int(x)])


def interior_point(region: np.ndarray) -> tuple[float, float]:
    """The pixel of ``region`` farthest from its boundary (city-block distance), found by
    repeated erosion; ties go to the one nearest the centroid of the deepest pixels."""
    if not region.any():
        raise ValueError("cannot pick a point in an empty region")
    cur = np.pad(region, 1)
    while True:
        nxt = cur.copy()
        nxt[1:-1, 1:-1] &= cur[:-2, 1:-1] & cur[2:, 1:-1] & cur[1:-1, :-2] & cur[1:-1, 2:]
        nxt[0, :] = nxt[-1, :] = False
        nxt[:, 0] = nxt[:, -1] = False
        if not nxt.any():
            break
        cur = nxt
    ys, xs = np.nonzero(cur[1:-1, 1:-1])
    cy, cx = ys.mean(), xs.mean()
    i = int(np.argmin((ys - cy) ** 2 + (xs - cx) ** 2))
    return float(xs[i]), float(ys[i])


def eval_correction_click(pred: np.ndarray, gt: np.ndarray) -> tuple[float, float, int]:
    """Deterministic correction: the deepest point of the error region, labelled as above."""
    err = pred != gt
    if not err.any():
        x, y = interior_point(gt)
        return x, y, 1
    x, y = interior_point(err)
    return x, y, int(gt[int(y), int(x)])
