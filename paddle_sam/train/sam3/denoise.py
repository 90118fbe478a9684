"""Denoising queries for training SAM 3's detector from scratch (not in upstream SAM 3).

A DETR-style decoder trained from random weights first learns the priors and only slowly
starts to look at the image: its queries must find the objects before the box, mask and score
heads can learn from them, and they cannot find them before those heads are useful. DN-DETR
(Li et al., 2022) breaks that loop with extra training-only queries whose reference boxes are
the ground-truth boxes with noise: each is supervised directly against its own target, with
no matching, so the heads learn what to do with a query that sits on an object from the first
step. DINO (Zhang et al., 2022) adds negatives: the same boxes with more noise, to be scored
as background.

Here every find query (an image with one phrase) gets ``2 T`` such queries, ``T`` the most
targets of any find query in the batch: a positive and a negative per target, and boxes drawn
at random in the slots its own targets leave free (negatives too). Each starts from the
content of the learned query whose anchor is nearest its box (``query_embed``), so what the
layers learn for it is what they do for the real queries near an object. They attend to no
other query and no query attends to them (as DAC's one-to-many copies), so the outputs of the
real queries are exactly those of a step without them. Inference never sees them; the weights
keep upstream's layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle

__all__ = ["DenoisingQueries", "make_denoising_queries"]


@dataclass
class DenoisingQueries:
    """``anchor_ids`` ``K x N`` (the learned query each one starts from), ``boxes`` ``K x N x
    4`` (cx, cy, w, h in (0, 1)), and ``indices`` in the matchers' format ``(find query,
    slot, packed target)``: the positive slots and their targets."""

    anchor_ids: paddle.Tensor
    boxes: paddle.Tensor
    indices: tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]

    @property
    def num_queries(self) -> int:
        return int(self.boxes.shape[0])


def _noised(box: np.ndarray, rng: np.random.Generator, low: float, high: float) -> np.ndarray:
    """``box`` (cx, cy, w, h) with each corner moved by a fraction in ``[low, high)`` of half
    the box's size, in a random direction (DINO's box noise); clipped to the image."""
    cx, cy, w, h = box
    xyxy = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    half = np.array([w, h, w, h]) / 2
    sign = rng.choice([-1.0, 1.0], size=4)
    xyxy = np.clip(xyxy + sign * rng.uniform(low, high, size=4) * half, 0.0, 1.0)
    x0, x1 = sorted(xyxy[0::2])
    y0, y1 = sorted(xyxy[1::2])
    w, h = max(x1 - x0, 1e-3), max(y1 - y0, 1e-3)
    return np.array([(x0 + x1) / 2, (y0 + y1) / 2, w, h])


def make_denoising_queries(
    reference_points: paddle.Tensor,
    targets: dict,
    rng: np.random.Generator,
    box_noise: float = 0.5,
) -> DenoisingQueries | None:
    """Denoising queries for a batch of find queries: ``reference_points`` is the decoder's
    ``Q x 4`` anchor table (before the sigmoid), ``targets`` the find targets
    (:func:`~.sam3_loss.make_find_targets`). Positives move each corner by less than
    ``box_noise`` of half the box, negatives by ``box_noise`` to ``2 box_noise``. None when no
    find query has a target."""
    if not 0.0 < box_noise <= 1.0:
        raise ValueError(f"box_noise must be in (0, 1], got {box_noise}")
    counts = [int(n) for n in np.asarray(targets["num_boxes"].numpy()).reshape([-1])]
    most = max(counts, default=0)
    if most == 0:
        return None
    n, k = len(counts), 2 * most
    packed = np.asarray(targets["boxes"].numpy(), dtype=np.float64).reshape([-1, 4])
    wh = rng.uniform(0.05, 0.4, size=(n, k, 2))
    centre = rng.uniform(wh / 2, 1 - wh / 2)
    boxes = np.concatenate([centre, wh], axis=-1)  # free slots: random boxes, negatives
    find, slot, tgt = [], [], []
    start = 0
    for b, count in enumerate(counts):
        for i in range(count):
            gt = packed[start + i]
            boxes[b, i] = _noised(gt, rng, 0.0, box_noise)
            boxes[b, most + i] = _noised(gt, rng, box_noise, 2 * box_noise)
            find.append(b)
            slot.append(i)
            tgt.append(start + i)
        start += count
    anchors = 1 / (1 + np.exp(-np.asarray(reference_points.numpy(), dtype=np.float64)))
    dist = np.abs(boxes[:, :, None, :2] - anchors[None, None, :, :2]).sum(-1)
    anchor_ids = dist.argmin(-1).T  # K x N
    place = reference_points.place

    def as_int(values) -> paddle.Tensor:
        return paddle.to_tensor(np.asarray(values, dtype=np.int64), place=place)

    return DenoisingQueries(
        anchor_ids=as_int(anchor_ids),
        boxes=paddle.to_tensor(boxes.transpose(1, 0, 2).astype(np.float32), place=place),
        indices=(as_int(find), as_int(slot), as_int(tgt)),
    )
