"""Simulated correction clicks (``sam3_tracker_utils``) against sam3 0.1.4: the click at the
centre of the largest error agrees with upstream's CPU version (OpenCV's distance transform)
on random blobs, with and without padding (same label, both at the largest distance); uniform
clicks fall on the errors with the right labels (upstream draws them from torch's generator,
ours from paddle's: the same rule, not the same draws); bad inputs are one-line errors."""

from __future__ import annotations

import cv2
import numpy as np
import paddle
import pytest

from paddle_sam.models.sam3.sam3_tracker_utils import (
    get_next_point,
    sample_one_point_from_error_center,
    sample_random_points_from_errors,
)
from tests.helpers.sam3_ref import import_sam3

torch, _ = import_sam3()


def blobs(seed: int, b: int = 6, h: int = 40, w: int = 56) -> np.ndarray:
    """``b x 1 x h x w`` bool masks of a few overlapping discs and rectangles."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    out = np.zeros((b, 1, h, w), bool)
    for i in range(b):
        for _ in range(rng.integers(1, 4)):
            cy, cx, r = rng.integers(0, h), rng.integers(0, w), rng.integers(3, 12)
            out[i, 0] |= (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        y0, x0 = rng.integers(0, h - 5), rng.integers(0, w - 5)
        out[i, 0, y0 : y0 + rng.integers(2, 12), x0 : x0 + rng.integers(2, 16)] ^= True
    return out


def distances(err: np.ndarray, padding: bool) -> np.ndarray:
    """Each pixel's Euclidean distance to the outside of ``err`` (H x W bool)."""
    if not padding:
        return cv2.distanceTransform(err.astype(np.uint8), cv2.DIST_L2, 0)
    return cv2.distanceTransform(np.pad(err, 1).astype(np.uint8), cv2.DIST_L2, 0)[1:-1, 1:-1]


def assert_same_clicks(gt, pred, points, labels, r_points, r_labels, padding) -> None:
    """Our clicks and upstream's: the same label, and both at the largest distance of the
    chosen error region. Distances such as sqrt(50) come out of OpenCV's parallel transform
    as either of two neighbouring float32 values, depending on how rows were split between
    threads, so among equally distant pixels either side may take another one."""
    fp, fn = ~gt & pred, gt & ~pred
    for b in range(len(gt)):
        d_fn, d_fp = distances(fn[b, 0], padding), distances(fp[b, 0], padding)
        if abs(d_fn.max() - d_fp.max()) > 1e-4:  # a clear winner: the label is decided
            assert labels[b, 0] == r_labels[b, 0] == int(d_fn.max() > d_fp.max()), b
        for (x, y), label in ((points[b, 0], labels[b, 0]), (r_points[b, 0], r_labels[b, 0])):
            d = d_fn if label == 1 else d_fp
            assert d[int(y), int(x)] >= d.max() - 1e-4, (b, x, y)


@pytest.mark.parametrize("padding", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_error_center_click_matches_official(seed, padding):
    from sam3.model.sam3_tracker_utils import sample_one_point_from_error_center_slow

    gt, pred = blobs(seed), blobs(seed + 100)
    pred[0] = gt[0]  # one prediction already right (a negative click: no error farther in)
    # one prediction empty: only misses, a positive click whatever OpenCV's rounding (the
    # other cases' labels may hang on a tie, sqrt(50) against sqrt(50), that its threads
    # round either way)
    pred[1] = False
    r_points, r_labels = sample_one_point_from_error_center_slow(
        torch.from_numpy(gt), torch.from_numpy(pred), padding=padding
    )
    points, labels = sample_one_point_from_error_center(
        paddle.to_tensor(gt), paddle.to_tensor(pred), padding=padding
    )
    assert points.dtype == paddle.float32 and labels.dtype == paddle.int32
    assert points.shape == [len(gt), 1, 2] and labels.shape == [len(gt), 1]
    args = (points.numpy(), labels.numpy(), r_points.numpy(), r_labels.numpy(), padding)
    assert_same_clicks(gt, pred, *args)
    assert labels.numpy()[:2, 0].tolist() == [0, 1]  # both kinds of click
    # without a prediction every object pixel is missed: positive clicks inside the objects
    none = np.zeros_like(gt)
    r_points, r_labels = sample_one_point_from_error_center_slow(
        torch.from_numpy(gt), None, padding
    )
    points, labels = sample_one_point_from_error_center(paddle.to_tensor(gt), None, padding)
    args = (points.numpy(), labels.numpy(), r_points.numpy(), r_labels.numpy(), padding)
    assert_same_clicks(gt, none, *args)
    assert labels.numpy().all()
    if padding:  # get_next_point's "center" pads
        points, labels = get_next_point(paddle.to_tensor(gt), None, "center")
        assert_same_clicks(gt, none, points.numpy(), labels.numpy(), *args[2:])


def test_uniform_clicks_fall_on_the_errors():
    gt, pred = blobs(3, b=4), blobs(4, b=4)
    pred[1] = gt[1]  # right: a negative click on the background
    paddle.seed(0)
    points, labels = sample_random_points_from_errors(
        paddle.to_tensor(gt), paddle.to_tensor(pred), num_pt=50
    )
    assert points.shape == [4, 50, 2] and labels.shape == [4, 50]
    assert labels.dtype == paddle.int32
    pts, lab = points.numpy().astype(int), labels.numpy()
    for b in range(4):
        on_gt = gt[b, 0, pts[b, :, 1], pts[b, :, 0]]
        on_pred = pred[b, 0, pts[b, :, 1], pts[b, :, 0]]
        if b == 1:
            assert (lab[b] == 0).all() and not on_gt.any()
        else:
            np.testing.assert_array_equal(lab[b] == 1, on_gt & ~on_pred)
            np.testing.assert_array_equal(lab[b] == 0, ~on_gt & on_pred)
    assert 0 < lab.mean() < 1
    points, _ = get_next_point(paddle.to_tensor(gt), paddle.to_tensor(pred), "uniform")
    assert points.shape == [4, 1, 2]


def test_bad_inputs():
    gt = paddle.to_tensor(blobs(0, b=2))
    with pytest.raises(TypeError, match="bool masks"):
        sample_one_point_from_error_center(gt.astype("float32"), gt)
    with pytest.raises(ValueError, match="B x 1 x H x W"):
        sample_one_point_from_error_center(gt[:, 0], gt[:, 0])
    with pytest.raises(ValueError, match="num_pt"):
        sample_random_points_from_errors(gt, gt, num_pt=-1)
    with pytest.raises(ValueError, match="unknown sampling method"):
        get_next_point(gt, gt, "nearest")
