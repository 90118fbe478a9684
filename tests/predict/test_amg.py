"""Automatic mask generator: amg_utils parity with segment_anything.utils.amg, and end-to-end
parity of SamAutomaticMaskGenerator with upstream's on a tiny random-weight model."""

from __future__ import annotations

import dataclasses
import sys
import types

import numpy as np
import paddle
import pytest

from paddle_sam.predict.sam_v1 import amg_utils as au
from tests.helpers.pairs import make_pair
from tests.helpers.specs import TINY

# pycocotools 2.0.x's decode trips a numpy 2 deprecation inside the library; not ours to fix.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

# ---------------------------------------------------------------------------- helpers


def _torch_amg():
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    pytest.importorskip("segment_anything")
    from segment_anything.utils import amg

    return amg


def _random_masks(rng: np.random.Generator, b: int, h: int, w: int) -> np.ndarray:
    """B x H x W masks with blobs, holes and islands, plus all-empty / all-full / 1-pixel cases."""
    yy, xx = np.mgrid[0:h, 0:w]
    out = np.zeros((b, h, w), dtype=bool)
    for i in range(b):
        field = np.zeros((h, w))
        for _ in range(rng.integers(1, 6)):
            cy, cx = rng.uniform(0, h), rng.uniform(0, w)
            r = rng.uniform(1, 1 + max(h, w) / 3)
            field += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r**2))
        out[i] = field + 0.15 * rng.standard_normal((h, w)) > rng.uniform(0.2, 0.8)
    if b >= 4:
        out[0] = False
        out[1] = True
        out[2] = False
        out[2, rng.integers(h), rng.integers(w)] = True
        out[3] = rng.random((h, w)) > 0.5  # salt and pepper: many tiny components
    return out


def _reference_components(img: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Independent 8-connected labelling: min-label propagation over pixels + pointer jumping.

    Labels 1..n in raster order of each component's first pixel, like OpenCV's.
    """
    fg = img.astype(bool)
    h, w = fg.shape
    big = h * w
    lab = np.where(fg, np.arange(h * w).reshape(h, w), big)
    while True:
        pad = np.full((h + 2, w + 2), big)
        pad[1:-1, 1:-1] = lab
        nb = np.min([pad[dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)], axis=0)
        new = np.where(fg, nb, big)
        ext = np.append(new.ravel(), big)
        while True:
            jumped = ext[ext]
            if np.array_equal(jumped, ext):
                break
            ext = jumped
        new = ext[:-1].reshape(h, w)
        if np.array_equal(new, lab):
            break
        lab = new
    roots = np.unique(lab[fg])
    labels = np.zeros((h, w), dtype=np.int32)
    labels[fg] = np.searchsorted(roots, lab[fg]) + 1
    areas = np.bincount(labels.ravel(), minlength=len(roots) + 1)
    return len(roots) + 1, labels, areas


def _fake_cv2() -> types.ModuleType:
    """A stand-in for ``cv2.connectedComponentsWithStats`` so upstream code runs without OpenCV."""
    mod = types.ModuleType("cv2")

    def connected_components_with_stats(image, connectivity=8):
        assert connectivity == 8
        n, labels, areas = _reference_components(np.asarray(image))
        stats = np.zeros((n, 5), dtype=np.int32)
        stats[:, -1] = areas
        return n, labels, stats, np.zeros((n, 2))

    mod.connectedComponentsWithStats = connected_components_with_stats
    return mod


@pytest.fixture
def cv2_module(monkeypatch):
    """Real OpenCV if installed, else the fake above (upstream imports cv2 inside functions)."""
    try:
        import cv2  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "cv2", _fake_cv2())
    return sys.modules["cv2"]


# ---------------------------------------------------------------------------- pure numpy


def test_connected_components_matches_reference():
    rng = np.random.default_rng(0)
    for h, w in [(1, 1), (1, 9), (9, 1), (13, 17), (40, 33)]:
        for m in _random_masks(rng, 6, h, w):
            n, labels, areas = au.connected_components(m)
            n_ref, labels_ref, areas_ref = _reference_components(m)
            assert n == n_ref
            np.testing.assert_array_equal(labels, labels_ref)
            np.testing.assert_array_equal(areas, areas_ref)
    # diagonal touching counts as connected (8-connectivity), a spiral is one component
    diag = np.eye(6, dtype=bool)
    assert au.connected_components(diag)[0] == 2
    spiral = np.zeros((9, 9), dtype=bool)
    spiral[0, :] = spiral[:, 8] = spiral[8, :] = spiral[2:, 0] = spiral[2, :7] = True
    spiral[2:7, 6] = spiral[6, 2:7] = spiral[4:7, 2] = True
    n, labels, areas = au.connected_components(spiral)
    assert n == 2 and areas[1] == spiral.sum()


def test_point_grids_and_crop_boxes():
    amg = _torch_amg()
    for n in [1, 2, 5, 8, 32]:
        np.testing.assert_array_equal(au.build_point_grid(n), amg.build_point_grid(n))
    for n, layers, scale in [(32, 0, 1), (32, 2, 2), (16, 3, 2), (10, 1, 3)]:
        ours = au.build_all_layer_point_grids(n, layers, scale)
        ref = amg.build_all_layer_point_grids(n, layers, scale)
        assert len(ours) == len(ref)
        for a, b in zip(ours, ref, strict=True):
            np.testing.assert_array_equal(a, b)
    for size in [(96, 128), (128, 96), (1, 1), (333, 517), (1500, 2250)]:
        for layers in [0, 1, 2, 3]:
            for ratio in [512 / 1500, 0.0, 0.5]:
                assert au.generate_crop_boxes(size, layers, ratio) == amg.generate_crop_boxes(
                    size, layers, ratio
                )


def test_rle_roundtrip_area_and_coco():
    amg = _torch_amg()
    import torch

    rng = np.random.default_rng(1)
    for b, h, w in [(8, 17, 23), (5, 1, 7), (4, 30, 1), (0, 5, 6), (4, 64, 48)]:
        masks = _random_masks(rng, b, h, w)
        ours = au.mask_to_rle_paddle(paddle.to_tensor(masks))
        ref = amg.mask_to_rle_pytorch(torch.from_numpy(masks))
        assert ours == ref
        for rle, m in zip(ours, masks, strict=True):
            np.testing.assert_array_equal(au.rle_to_mask(rle), m)
            np.testing.assert_array_equal(au.rle_to_mask(rle), amg.rle_to_mask(rle))
            assert au.area_from_rle(rle) == amg.area_from_rle(rle) == int(m.sum())
            assert au.coco_encode_rle(rle) == amg.coco_encode_rle(rle)


def test_remove_small_regions(cv2_module):
    amg = _torch_amg()
    rng = np.random.default_rng(2)
    changed = {"holes": 0, "islands": 0}
    for m in _random_masks(rng, 12, 37, 53):
        for mode in ["holes", "islands"]:
            for thresh in [1, 3, 20, 150, 10_000]:
                ours, ours_changed = au.remove_small_regions(m, thresh, mode)
                ref, ref_changed = amg.remove_small_regions(m, thresh, mode)
                assert ours_changed == ref_changed
                np.testing.assert_array_equal(ours, ref)
                changed[mode] += int(ours_changed)
    assert changed["holes"] > 5 and changed["islands"] > 5  # the cases were not trivial
    with pytest.raises(ValueError, match="holes"):
        au.remove_small_regions(np.zeros((3, 3), bool), 2, "blobs")


def test_batch_iterator_and_xywh():
    amg = _torch_amg()
    import torch

    a, b = np.arange(10), list(range(10, 20))
    assert [list(map(list, x)) for x in au.batch_iterator(3, a, b)] == [
        list(map(list, x)) for x in amg.batch_iterator(3, a, b)
    ]
    assert len(list(au.batch_iterator(5, a))) == 2
    with pytest.raises(ValueError, match="same size"):
        list(au.batch_iterator(2, a, b[:3]))
    box = np.array([3, 4, 10, 20])
    assert au.box_xyxy_to_xywh(box).tolist() == [3, 4, 7, 16]
    assert box.tolist() == [3, 4, 10, 20]  # input untouched
    tbox = paddle.to_tensor(box)
    assert au.box_xyxy_to_xywh(tbox).tolist() == amg.box_xyxy_to_xywh(torch.tensor(box)).tolist()
    assert tbox.tolist() == [3, 4, 10, 20]


# ---------------------------------------------------------------------------- tensor helpers


def test_stability_score():
    amg = _torch_amg()
    import torch

    rng = np.random.default_rng(3)
    logits = rng.normal(0, 3, size=(2, 5, 21, 19)).astype(np.float32)
    logits[0, 0] = np.round(logits[0, 0])  # values exactly at the +-offset thresholds
    logits[0, 1] = -10.0  # empty at both thresholds -> 0 / 0
    for thr, off in [(0.0, 1.0), (0.0, 0.5), (0.3, 2.0)]:
        ours = au.calculate_stability_score(paddle.to_tensor(logits), thr, off).numpy()
        ref = amg.calculate_stability_score(torch.from_numpy(logits), thr, off).numpy()
        assert ours.shape == ref.shape == (2, 5) and ours.dtype == np.float32
        np.testing.assert_array_equal(ours, ref)  # NaNs compare equal here
        # numpy in, numpy out (the generator's CPU path): the same bits
        ours_np = au.calculate_stability_score(logits, thr, off)
        assert isinstance(ours_np, np.ndarray) and ours_np.dtype == np.float32
        np.testing.assert_array_equal(ours_np, ref)


def test_batched_mask_to_box():
    amg = _torch_amg()
    import torch

    rng = np.random.default_rng(4)
    masks = _random_masks(rng, 12, 19, 26)
    for m in [masks, masks.reshape(3, 4, 19, 26), masks[5], masks[:0]]:
        ours = au.batched_mask_to_box(paddle.to_tensor(m)).numpy()
        ref = amg.batched_mask_to_box(torch.from_numpy(m)).numpy()
        assert ours.shape == ref.shape
        np.testing.assert_array_equal(ours, ref)
    assert au.batched_mask_to_box(paddle.to_tensor(masks)).dtype == paddle.int64


def test_uncrop_and_crop_edge():
    amg = _torch_amg()
    import torch

    rng = np.random.default_rng(5)
    crop = [30, 20, 90, 70]
    boxes = rng.integers(0, 60, size=(20, 4))
    boxes[:, 2:] += boxes[:, :2]
    boxes[:4] = [[0, 0, 10, 10], [50, 40, 60, 50], [0, 0, 60, 50], [0, 0, 0, 0]]
    np.testing.assert_array_equal(
        au.uncrop_boxes_xyxy(paddle.to_tensor(boxes), crop).numpy(),
        amg.uncrop_boxes_xyxy(torch.from_numpy(boxes), crop).numpy(),
    )
    np.testing.assert_array_equal(
        au.uncrop_boxes_xyxy(boxes[None], crop),
        amg.uncrop_boxes_xyxy(torch.from_numpy(boxes[None]), crop),
    )
    pts = rng.uniform(0, 60, size=(7, 2))
    np.testing.assert_array_equal(
        au.uncrop_points(pts, crop), amg.uncrop_points(torch.from_numpy(pts), crop).numpy()
    )
    np.testing.assert_array_equal(
        au.uncrop_points(paddle.to_tensor(pts), crop).numpy(),
        amg.uncrop_points(torch.from_numpy(pts), crop).numpy(),
    )
    for orig in [[0, 0, 90, 70], [0, 0, 200, 150]]:
        ours = au.is_box_near_crop_edge(paddle.to_tensor(boxes), crop, orig).numpy()
        ref = amg.is_box_near_crop_edge(torch.from_numpy(boxes), crop, orig).numpy()
        np.testing.assert_array_equal(ours, ref)
    masks = _random_masks(rng, 3, 50, 60)
    for crop_box, (oh, ow) in [
        (crop, (80, 100)),
        ([0, 0, 60, 50], (50, 60)),
        ([0, 0, 60, 50], (55, 60)),
    ]:
        ours = au.uncrop_masks(paddle.to_tensor(masks), crop_box, oh, ow).numpy()
        ref = amg.uncrop_masks(torch.from_numpy(masks), crop_box, oh, ow).numpy()
        np.testing.assert_array_equal(ours, ref)


def test_mask_data_filter_and_cat():
    rng = np.random.default_rng(6)
    d = au.MaskData(
        t=paddle.to_tensor(rng.random((5, 2)).astype(np.float32)),
        a=np.arange(5),
        lst=list("abcde"),
    )
    d.cat(au.MaskData(t=paddle.ones([2, 2]), a=np.arange(5, 7), lst=["f", "g"]))
    assert d["t"].shape == [7, 2] and d["a"].tolist() == list(range(7)) and len(d["lst"]) == 7
    d.filter(paddle.to_tensor([True, False, True, True, False, False, True]))
    assert d["a"].tolist() == [0, 2, 3, 6] and d["lst"] == ["a", "c", "d", "g"]
    d.filter(np.array([3, 0]))  # index order is kept
    assert d["a"].tolist() == [6, 0] and d["lst"] == ["g", "a"]
    np.testing.assert_array_equal(d["t"].numpy()[0], [1.0, 1.0])
    d.filter(paddle.to_tensor([False, False]))
    assert d["t"].shape == [0, 2] and d["lst"] == []
    d.to_numpy()
    assert isinstance(d["t"], np.ndarray)
    with pytest.raises(TypeError):
        au.MaskData(x=3)


# ---------------------------------------------------------------------------- NMS


@pytest.mark.parametrize("n_max", [60, 1500])  # torchvision: coordinate trick / per-class loop
def test_batched_nms_matches_torchvision(n_max):
    pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    import torch

    rng = np.random.default_rng(7 + n_max)
    for trial in range(25):
        n = int(rng.integers(0, n_max))
        xy = rng.integers(0, 60, size=(n, 2)).astype(np.float32)
        wh = rng.integers(0, 25, size=(n, 2)).astype(np.float32)
        boxes = np.concatenate([xy, xy + wh], axis=1)
        if trial % 2:
            boxes += rng.random((n, 4)).astype(np.float32)
        # few distinct scores -> many ties; exact duplicates of boxes too
        scores = rng.integers(0, 5, size=n).astype(np.float32)
        if trial % 3 == 0:
            scores = rng.random(n).astype(np.float32)
        if n > 4:
            boxes[1] = boxes[0]
        cats = rng.integers(0, 1 + trial % 4, size=n)
        thr = float(rng.choice([0.0, 0.3, 0.5, 0.7, 1 / 3, 1.0]))
        ref = torchvision.ops.batched_nms(
            torch.from_numpy(boxes), torch.from_numpy(scores), torch.from_numpy(cats), thr
        ).numpy()
        ours = au.batched_nms(boxes, scores, cats, thr)
        if boxes.size > 4000 and len(np.unique(scores)) < n:
            # torchvision's per-class path ends with an unstable sort: equal scores come out in
            # an unspecified order (we keep index order). Same kept set, same score sequence.
            assert sorted(ours.tolist()) == sorted(ref.tolist())
            np.testing.assert_array_equal(scores[ours], scores[ref])
        else:
            np.testing.assert_array_equal(ours, ref)
        ours_t = au.batched_nms(
            paddle.to_tensor(boxes), paddle.to_tensor(scores), paddle.to_tensor(cats), thr
        )
        assert isinstance(ours_t, paddle.Tensor) and ours_t.dtype == paddle.int64
        np.testing.assert_array_equal(ours_t.numpy(), ours)


def test_batched_nms_semantics():
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [1, 0, 11, 10], [0, 0, 10, 10]], np.float32)
    scores = np.array([0.5, 0.9, 0.8, 0.9], np.float32)
    # identical boxes (IoU 1) suppress; ties keep the lower index first
    assert au.batched_nms(boxes, scores, np.zeros(4), 0.95).tolist() == [1, 2]
    # IoU(box0, box2) = 90 / 110 = 0.818...: not suppressed at a higher threshold
    assert au.batched_nms(boxes, scores, np.zeros(4), 0.82).tolist() == [1, 2]
    assert au.batched_nms(boxes, scores, np.zeros(4), 0.81).tolist() == [1]
    # other categories never suppress each other
    assert au.batched_nms(boxes, scores, np.array([0, 1, 2, 3]), 0.0).tolist() == [1, 3, 2, 0]
    assert au.batched_nms(np.zeros((0, 4), np.float32), np.zeros(0), np.zeros(0), 0.5).size == 0


# ---------------------------------------------------------------------------- generator


def _have_paddle_sam_stack() -> bool:
    try:
        from paddle_sam.loading.sam_v1 import build_sam  # noqa: F401
        from paddle_sam.predict.sam_v1.predictor import SamPredictor  # noqa: F401
    except ImportError:
        return False
    return True


# window 7 on a 16x16 grid (padded windows), a narrow mask-input branch
AMG_SPEC = dataclasses.replace(TINY, encoder_depth=2, window_size=7, mask_in_chans=4)


@pytest.fixture(scope="module")
def sam_pair():
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    pytest.importorskip("segment_anything")
    if not _have_paddle_sam_stack():
        pytest.skip("paddle_sam.models / paddle_sam.predict.sam_v1.predictor not available yet")
    import torch

    # Torch's intra-op threads and Paddle's spinning OpenMP workers oversubscribe small CPU
    # machines (upstream's generate ran 10x slower); one torch thread is plenty for tiny models.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield make_pair(AMG_SPEC, seed=0, scale=0.05)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def test_image() -> np.ndarray:
    rng = np.random.default_rng(11)
    h, w = 96, 136
    yy, xx = np.mgrid[0:h, 0:w] / 20.0
    base = np.stack([np.sin(xx + 0.3 * c) * np.cos(yy * (1 + 0.2 * c)) for c in range(3)], -1)
    img = 127.5 + 90 * base + 20 * rng.standard_normal((h, w, 3))
    img[20:60, 30:80] = [230, 40, 40]  # a flat object
    return np.clip(img, 0, 255).astype(np.uint8)


def _decode(seg, mode: str) -> np.ndarray:
    if mode == "binary_mask":
        return np.asarray(seg)
    if mode == "uncompressed_rle":
        return au.rle_to_mask(seg)
    from pycocotools import mask as mask_utils

    rle = dict(seg)
    rle["counts"] = rle["counts"].encode("utf-8")
    return mask_utils.decode(rle).astype(bool)


def _compare_records(ours: list[dict], ref: list[dict], mode: str) -> float:
    """Assert parity record by record; return the worst pixel agreement."""
    assert len(ours) == len(ref), (len(ours), len(ref))
    worst = 1.0
    for a, b in zip(ours, ref, strict=True):
        assert set(a) == set(b)
        assert a["crop_box"] == b["crop_box"]
        # a pixel whose logit sits on the threshold may round either way (GEMM order differs
        # by CPU): areas within 0.1% (the mask agreement below), boxes within a pixel
        np.testing.assert_allclose(a["bbox"], b["bbox"], rtol=0, atol=1)
        assert abs(a["area"] - b["area"]) <= 1 + 1e-3 * b["area"], (a["area"], b["area"])
        np.testing.assert_allclose(a["point_coords"], b["point_coords"], rtol=0, atol=1e-9)
        np.testing.assert_allclose(a["predicted_iou"], b["predicted_iou"], rtol=0, atol=1e-4)
        np.testing.assert_allclose(
            a["stability_score"], b["stability_score"], rtol=0, atol=1e-4, equal_nan=True
        )
        assert type(a["segmentation"]) is type(b["segmentation"])
        if mode != "binary_mask":
            assert a["segmentation"]["size"] == b["segmentation"]["size"]
        ma, mb = _decode(a["segmentation"], mode), _decode(b["segmentation"], mode)
        assert ma.shape == mb.shape and ma.dtype == mb.dtype == np.bool_
        worst = min(worst, float((ma == mb).mean()))
    assert worst >= 0.999, worst
    return worst


GEN_CASES = [
    (0, 0, "binary_mask"),
    (0, 0, "uncompressed_rle"),
    (1, 0, "coco_rle"),
    (0, 40, "binary_mask"),
    (1, 40, "coco_rle"),
]


@pytest.mark.parametrize("crop_n_layers, min_area, mode", GEN_CASES)
def test_generate_matches_upstream(sam_pair, test_image, cv2_module, crop_n_layers, min_area, mode):
    """The real tiny models end to end: image encoder, prompt encoder, decoder, generator."""
    from segment_anything import SamAutomaticMaskGenerator as RefGenerator

    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    torch_sam, paddle_sam_model = sam_pair
    # Random-weight masks are noisy and cover the whole image (every box is the full image),
    # so NMS is switched off here to keep many masks in the comparison; the synthetic-decoder
    # test below covers NMS, crops and the crop-edge filter with localised masks.
    kwargs = dict(
        points_per_side=4,
        points_per_batch=10,
        pred_iou_thresh=0.0,
        stability_score_thresh=0.0,
        stability_score_offset=0.05,
        box_nms_thresh=1.0,
        crop_nms_thresh=1.0,
        crop_n_layers=crop_n_layers,
        crop_n_points_downscale_factor=2,
        min_mask_region_area=min_area,
        output_mode=mode,
    )
    ref = RefGenerator(torch_sam, **kwargs).generate(test_image)
    ours = SamAutomaticMaskGenerator(paddle_sam_model, **kwargs).generate(test_image)
    assert len(ref) >= 40, "thresholds too strict for a meaningful comparison"
    _compare_records(ours, ref, mode)


def _synthetic_decoder(coords_in: np.ndarray, original_size, input_size):
    """Deterministic localised mask logits for B x 1 x 2 prompts in the resized frame.

    Per point: a disc with a small hole and a detached island, a larger textured ellipse, and a
    square with an island; sizes and IoU scores vary with the point. Returns B x 3 x H x W logits
    and B x 3 IoU predictions (float32), in the crop's original frame.
    """
    h, w = original_size
    new_h, new_w = input_size
    pts = coords_in[:, 0, :].astype(np.float64) * np.array([w / new_w, h / new_h])
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    logits = np.empty((len(pts), 3, h, w), dtype=np.float32)
    iou = np.empty((len(pts), 3), dtype=np.float32)
    for i, (px, py) in enumerate(pts):
        u = np.modf(np.abs(np.sin(px * 12.9898 + py * 78.233)) * 43758.5453)[0]
        r = 4.0 + 18.0 * u
        dx, dy = xx - px, yy - py
        d = np.hypot(dx, dy)
        hole = 2.5 - np.hypot(dx - r / 2, dy)
        island = 2.0 - np.hypot(dx - r - 7, dy - 2)
        m0 = np.maximum(np.minimum(r - d, -hole * 3), island * 3)
        m1 = 1.6 * r - np.hypot(dx / 1.5, dy) + 1.5 * np.sin(xx / 3.0) * np.cos(yy / 4.0)
        m2 = np.maximum(
            0.8 * r - np.maximum(np.abs(dx), np.abs(dy)), 3 * (1.5 - np.hypot(dx + r, dy + r))
        )
        logits[i] = np.stack([m0, m1, m2])
        iou[i] = np.modf(np.abs(np.sin(np.array([1.0, 2.0, 3.0]) * (px + 3 * py + 0.1))) * 97.0)[0]
    return logits, iou


@pytest.mark.parametrize("crop_n_layers, min_area, mode", GEN_CASES)
def test_generate_logic_matches_upstream_exactly(
    sam_pair, test_image, cv2_module, monkeypatch, crop_n_layers, min_area, mode
):
    """Both generators on the same synthetic decoder output: every record must be identical
    (the filters, their order, NMS, crops, RLEs; the upscaling is the identity here)."""
    import torch
    from segment_anything import SamAutomaticMaskGenerator as RefGenerator
    from segment_anything.predictor import SamPredictor as RefPredictor

    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator
    from paddle_sam.predict.sam_v1.predictor import SamPredictor

    def ref_predict(
        self,
        point_coords,
        point_labels,
        boxes=None,
        mask_input=None,
        multimask_output=True,
        return_logits=False,
    ):
        assert multimask_output and return_logits and point_coords.shape[1:] == (1, 2)
        logits, iou = _synthetic_decoder(point_coords.numpy(), self.original_size, self.input_size)
        return torch.from_numpy(logits), torch.from_numpy(iou), None

    def our_point_grid(self, points):
        # the synthetic logits are already at the crop's size: the upscaling is the identity
        assert points.ndim == 2 and points.shape[1] == 2
        logits, iou = _synthetic_decoder(points[:, None], self.original_size, self.input_size)
        return iou, logits

    monkeypatch.setattr(RefPredictor, "predict_torch", ref_predict)
    monkeypatch.setattr(SamPredictor, "predict_point_grid", our_point_grid)
    monkeypatch.setattr(
        SamAutomaticMaskGenerator, "_upscale_masks", lambda _, m: paddle.to_tensor(m)
    )
    torch_sam, paddle_sam_model = sam_pair
    kwargs = dict(
        points_per_side=8,
        points_per_batch=20,
        pred_iou_thresh=0.2,
        stability_score_thresh=0.6,
        crop_n_layers=crop_n_layers,
        crop_n_points_downscale_factor=2,
        min_mask_region_area=min_area,
        output_mode=mode,
    )
    ref = RefGenerator(torch_sam, **kwargs).generate(test_image)
    ours = SamAutomaticMaskGenerator(paddle_sam_model, **kwargs).generate(test_image)
    assert len(ref) >= 10
    assert len({tuple(r["bbox"]) for r in ref}) == len(ref)  # localised, distinct masks
    if crop_n_layers:
        assert len({tuple(r["crop_box"]) for r in ref}) > 2
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref, strict=True):
        assert a["bbox"] == b["bbox"] and a["crop_box"] == b["crop_box"] and a["area"] == b["area"]
        assert a["point_coords"] == b["point_coords"]
        assert a["predicted_iou"] == b["predicted_iou"]
        assert a["stability_score"] == b["stability_score"]
        if mode == "binary_mask":
            np.testing.assert_array_equal(a["segmentation"], b["segmentation"])
        else:
            assert a["segmentation"] == b["segmentation"]


def test_generate_progress_and_default_thresholds(sam_pair, test_image, capsys):
    from segment_anything import SamAutomaticMaskGenerator as RefGenerator

    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    torch_sam, paddle_sam_model = sam_pair
    kwargs = dict(points_per_side=4, points_per_batch=5, stability_score_offset=0.05)
    ref = RefGenerator(torch_sam, **kwargs).generate(test_image)
    ours = SamAutomaticMaskGenerator(paddle_sam_model, progress=True, **kwargs).generate(test_image)
    assert len(ours) == len(ref)
    if ref:
        _compare_records(ours, ref, "binary_mask")
    err = capsys.readouterr().err
    assert "point batches" in err and "4/4" in err  # 16 points in batches of 5
    # No mask in any crop: upstream fails on its empty crop-box tensor; we return [].
    gen = SamAutomaticMaskGenerator(
        paddle_sam_model, points_per_side=2, crop_n_layers=1, pred_iou_thresh=2.0, progress=True
    )
    assert gen.generate(test_image) == []
    assert "5/5" in capsys.readouterr().err  # one batch for each of the 5 crops


def test_generator_signature_matches_upstream():
    pytest.importorskip("torch")
    pytest.importorskip("segment_anything")
    import inspect

    from segment_anything import SamAutomaticMaskGenerator as RefGenerator

    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    ref = inspect.signature(RefGenerator.__init__).parameters
    ours = inspect.signature(SamAutomaticMaskGenerator.__init__).parameters
    assert list(ours)[: len(ref)] == list(ref)
    assert list(ours)[len(ref) :] == ["progress"] and ours["progress"].default is False
    for name, p in ref.items():
        assert ours[name].default == p.default, name


def test_generator_argument_errors(sam_pair):
    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    _, model = sam_pair
    with pytest.raises(ValueError, match="output_mode"):
        SamAutomaticMaskGenerator(model, output_mode="png")
    with pytest.raises(ValueError, match="Exactly one"):
        SamAutomaticMaskGenerator(model, points_per_side=None)
    with pytest.raises(ValueError, match="Exactly one"):
        SamAutomaticMaskGenerator(model, point_grids=[au.build_point_grid(4)])
    with pytest.raises(ValueError, match="crop_n_layers"):
        SamAutomaticMaskGenerator(
            model, points_per_side=None, point_grids=[au.build_point_grid(4)], crop_n_layers=1
        )
    gen = SamAutomaticMaskGenerator(
        model, points_per_side=None, point_grids=[au.build_point_grid(2)]
    )
    with pytest.raises(ValueError, match=r"\(32, 32\)"):
        gen.generate(np.zeros((32, 32), np.uint8))
    with pytest.raises(ValueError, match="float32"):
        gen.generate(np.zeros((32, 32, 3), np.float32))
    with pytest.raises(ValueError, match="4"):
        gen.generate(np.zeros((32, 32, 4), np.uint8))


@pytest.mark.parametrize("threads", [1, 3])
def test_point_grid_decoder_equals_predict_paddle(sam_pair, test_image, monkeypatch, threads):
    """``predict_point_grid`` (image terms, reassociated attention, prompts on worker threads)
    computes what ``predict_paddle`` computes for one positive point per prompt."""
    import threading

    import paddle_sam._runtime as runtime
    from paddle_sam.models.sam_v1 import sam as sam_module
    from paddle_sam.predict.sam_v1 import predictor as predictor_module
    from paddle_sam.predict.sam_v1.predictor import SamPredictor

    _, model = sam_pair
    monkeypatch.setattr(runtime, "get_num_threads", lambda: threads)
    names: list[str] = []
    real = sam_module.decode_from_image_terms

    def counted(*args):
        names.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(predictor_module, "decode_from_image_terms", counted)
    p = SamPredictor(model)
    p.set_image(test_image)
    rng = np.random.default_rng(5)
    pts = rng.uniform(0, 1, (7, 2)) * np.array(p.input_size[::-1]) - 0.5
    iou, low_res = p.predict_point_grid(pts)
    assert iou.shape == (7, 3) and low_res.shape == (7, 3, *p.mask_input_size)
    grid_calls = list(names)  # predict_paddle below may decode the same way
    with paddle.no_grad():
        _, ref_iou, ref_low = p.predict_paddle(
            paddle.to_tensor(pts[:, None], dtype="float32"),
            paddle.ones([7, 1], "int32"),
            multimask_output=True,
        )
    np.testing.assert_allclose(iou, ref_iou.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(low_res, ref_low.numpy(), rtol=0, atol=1e-4)
    assert len(grid_calls) == 7  # one prompt per call
    if threads > 1:
        assert all(n.startswith("paddle-sam-worker") for n in grid_calls), grid_calls
    else:
        assert set(grid_calls) == {threading.current_thread().name}
    # the per-image terms are kept for this image only
    terms = p._image_terms()
    assert p._image_terms()[0] is terms[0]
    p.set_image(test_image[::-1].copy())
    assert p._image_terms()[0] is not terms[0]
    # a decoder whose attention would not gain from the few-token form: upstream's form
    monkeypatch.setattr(predictor_module, "few_tokens_max", lambda sam: 0)
    names.clear()
    iou2, low2 = p.predict_point_grid(pts)
    assert names == []
    with paddle.no_grad():
        _, ref_iou, ref_low = p.predict_paddle(
            paddle.to_tensor(pts[:, None], dtype="float32"),
            paddle.ones([7, 1], "int32"),
            multimask_output=True,
        )
    np.testing.assert_array_equal(iou2, ref_iou.numpy())
    np.testing.assert_array_equal(low2, ref_low.numpy())


def test_generate_on_exported_runtime_matches_upstream(
    sam_pair, test_image, cv2_module, tmp_path_factory
):
    """The generator on ``StaticSamPredictor`` (Paddle Inference) gives upstream's records."""
    from segment_anything import SamAutomaticMaskGenerator as RefGenerator

    from paddle_sam.deploy import StaticSamPredictor
    from paddle_sam.export.sam_v1 import export_sam
    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    torch_sam, model = sam_pair
    d = tmp_path_factory.mktemp("amg_export") / "tiny"
    export_sam(model, d, model_type="tiny")
    kwargs = dict(
        points_per_side=4,
        points_per_batch=6,
        pred_iou_thresh=0.0,
        stability_score_thresh=0.0,
        stability_score_offset=0.05,
        box_nms_thresh=1.0,
        crop_nms_thresh=1.0,
        crop_n_layers=1,
        crop_n_points_downscale_factor=2,
        output_mode="uncompressed_rle",
    )
    ref = RefGenerator(torch_sam, **kwargs).generate(test_image)
    static = StaticSamPredictor(d)
    ours = SamAutomaticMaskGenerator(static, **kwargs).generate(test_image)
    assert len(ref) >= 40
    _compare_records(ours, ref, "uncompressed_rle")


def test_generator_refuses_a_predictor_without_point_grid(sam_pair):
    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    class Clicks:
        def set_image(self, image):
            pass

    with pytest.raises(TypeError, match="predict_point_grid.*Clicks has none"):
        SamAutomaticMaskGenerator(Clicks())
