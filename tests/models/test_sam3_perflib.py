"""Parity of SAM 3's video helper ops (``paddle_sam.models.sam3.perflib``) against the official
sam3 functions on random inputs, empty ones included: exact for boxes and indices, within 1e-6
for IoUs."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_sam.models.sam3.perflib import masks_ops as PM
from paddle_sam.models.sam3.perflib import nms as PN
from tests.helpers.sam3_ref import import_sam3

torch, _ = import_sam3()

from sam3.model import box_ops as TB  # noqa: E402
from sam3.model import sam3_tracker_utils as TU  # noqa: E402
from sam3.perflib import masks_ops as TM  # noqa: E402
from sam3.perflib import nms as TN  # noqa: E402


def _rects(
    rng: np.random.Generator, n: int, h: int, w: int, empty: float = 0.2, side: int = 1
) -> np.ndarray:
    """``n x h x w`` bool masks: random rectangles of sides >= ``side``, a share of them empty."""
    masks = np.zeros((n, h, w), bool)
    for k in range(n if h and w else 0):
        if rng.random() < empty:
            continue
        y0, x0 = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
        y1, x1 = rng.integers(y0 + side, h + 1), rng.integers(x0 + side, w + 1)
        masks[k, y0:y1, x0:x1] = True
    return masks


def _both(x: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(x)), paddle.to_tensor(x)


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x.numpy()


def _exact(ref, ours) -> None:
    ref, ours = _np(ref), _np(ours)
    assert ref.dtype == ours.dtype, (ref.dtype, ours.dtype)
    assert ref.shape == ours.shape, (ref.shape, ours.shape)
    np.testing.assert_array_equal(ours, ref)


# --- masks_ops ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,m,h,w", [(5, 4, 9, 7), (1, 6, 4, 4), (0, 3, 5, 5), (3, 0, 5, 5), (0, 0, 5, 5), (2, 3, 0, 4)]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_mask_iou(n, m, h, w, seed):
    rng = np.random.default_rng(seed)
    pred = rng.random((n, h, w)) < rng.random((n, 1, 1))
    shared = pred[: m // 2]
    gt = np.concatenate([shared, rng.random((m - len(shared), h, w)) < 0.4])
    if n and m:  # shared and empty masks: IoU 1 and the 0/0 pair
        pred[0], gt[0] = False, False
    (tp, pp), (tg, pg) = _both(pred), _both(gt)
    ref, ours = TM.mask_iou(tp, tg), PM.mask_iou(pp, pg)
    assert ours.dtype == paddle.float32 and list(ours.shape) == [n, m]
    np.testing.assert_allclose(_np(ours), _np(ref), rtol=0, atol=1e-6)


@pytest.mark.parametrize("n,h,w", [(6, 11, 13), (1, 1, 1), (3, 5, 1), (0, 4, 4), (2, 0, 3)])
@pytest.mark.parametrize("dtype", ["bool", "float32", "uint8"])
def test_masks_to_boxes(n, h, w, dtype):
    rng = np.random.default_rng(n * 100 + h)
    masks = _rects(rng, n, h, w) | (rng.random((n, h, w)) < 0.03)
    masks = masks.astype(dtype) if dtype != "float32" else masks * rng.normal(size=masks.shape)
    tm, pm = _both(masks.astype("float32") if dtype == "float32" else masks)
    ids = list(range(n))
    _exact(TM.masks_to_boxes(tm, ids), PM.masks_to_boxes(pm, ids))


@pytest.mark.parametrize("b,h,w", [(7, 10, 12), (1, 3, 3), (4, 1, 6), (0, 5, 5)])
def test_mask_to_box(b, h, w):
    rng = np.random.default_rng(b + 7 * h)
    masks = (_rects(rng, b, h, w, empty=0.3) | (rng.random((b, h, w)) < 0.02))[:, None]
    tm, pm = _both(masks)
    _exact(TU.mask_to_box(tm), PM.mask_to_box(pm))
    if b:  # the video code's call on one mask
        _exact(TU.mask_to_box(tm[0][None]), PM.mask_to_box(pm[0].unsqueeze(0)))


@pytest.mark.parametrize("n", [9, 1, 0])
def test_fast_diag_box_iou(n):
    rng = np.random.default_rng(n)
    xy0 = rng.random((2, n, 2)).astype("float32")
    boxes = np.concatenate([xy0, xy0 + rng.random((2, n, 2)).astype("float32") * 0.6], axis=-1)
    if n > 1:
        boxes[1, 0] = boxes[0, 0]  # identical boxes
        boxes[1, 1, :2] = boxes[0, 1, 2:] + 0.1  # disjoint boxes
        boxes[1, 1, 2:] = boxes[1, 1, :2] + 0.2
    (t1, p1), (t2, p2) = _both(boxes[0]), _both(boxes[1])
    ref, ours = TB.fast_diag_box_iou(t1, t2), PM.fast_diag_box_iou(p1, p2)
    assert ours.dtype == paddle.float32 and list(ours.shape) == [n]
    np.testing.assert_allclose(_np(ours), _np(ref), rtol=0, atol=1e-6)


# --- nms ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [12, 2, 1, 0])
@pytest.mark.parametrize("thresh", [0.5, 0.1])
def test_generic_nms(n, thresh):
    rng = np.random.default_rng(n)
    ious = rng.random((n, n)).astype("float32")
    ious = np.triu(ious, 1) + np.triu(ious, 1).T + np.eye(n, dtype="float32")
    scores = rng.integers(0, 4, n).astype("float32") / 4  # ties in the scores
    (ti, pi), (ts, ps) = _both(ious), _both(scores)
    ref = TN.generic_nms(ti, ts, thresh)
    _exact(ref, PN.generic_nms(pi, ps, thresh))
    _exact(ref, PN.generic_nms_cpu(pi, ps, thresh))


@pytest.mark.parametrize("n,h,w", [(10, 12, 12), (1, 5, 5), (0, 6, 6)])
@pytest.mark.parametrize("prob_threshold,iou_threshold", [(0.3, 0.5), (0.7, 0.1), (1.1, 0.5)])
def test_nms_masks(n, h, w, prob_threshold, iou_threshold):
    rng = np.random.default_rng(n + h)
    rects = _rects(rng, n, h, w, empty=0.1, side=min(h, 4))
    # duplicates with jitter, so that NMS removes some
    if n > 3:
        rects[n // 2 :] = np.roll(rects[: n - n // 2], 1, axis=2)
    logits = np.where(rects, 1.0, -1.0) * rng.random((n, h, w)) + 0.01 * (rects - 0.5)
    probs = (0.2 + 0.8 * rng.random(n)).astype("float32")
    if n > 1:
        probs[0] = np.float32(0.3)  # the threshold itself, in float32
    (tp, pp), (tm, pm) = _both(probs), _both(logits.astype("float32"))
    ref = TN.nms_masks(tp, tm, prob_threshold, iou_threshold)
    ours = PN.nms_masks(pp, pm, prob_threshold, iou_threshold)
    _exact(ref, ours)
