"""Tiny-config parity against the official segment-anything, through the alignment tool."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("segment_anything")

from paddle_sam.align.sam_v1 import COS_THRESHOLD, align_sam, compare  # noqa: E402
from paddle_sam.predict.sam_v1.predictor import SamPredictor  # noqa: E402
from tests.helpers.pairs import image, make_pair  # noqa: E402
from tests.helpers.specs import TINY, TINY_B  # noqa: E402


@pytest.fixture(scope="module", params=["TINY", "TINY_B"])
def pair(request):
    spec = {"TINY": TINY, "TINY_B": TINY_B}[request.param]
    return make_pair(spec, seed=1)


@pytest.mark.parametrize(
    "hw", [(200, 300), (300, 170), (64, 64)], ids=["landscape", "portrait", "small-square"]
)
def test_every_module_aligned(pair, hw):
    ref, ours = pair
    report = align_sam(ref, ours, image(*hw, seed=hw[0]))
    assert report.passed, "\n" + report.format_table()
    # every module of the encoder and decoder was compared, per case
    modules = {r.module.split("] ")[-1].split("[")[0] for r in report.rows}
    depth = len(ours.image_encoder.blocks)
    for name in [
        "image_encoder.patch_embed",
        "image_encoder.neck",
        "prompt_encoder",
        "mask_decoder.transformer",
        "mask_decoder",
        "masks",
        "iou_predictions",
    ]:
        assert name in modules
    assert all(f"image_encoder.blocks.{i}" in modules for i in range(depth))
    for case in ["point", "points", "box", "box+neg", "refine"]:
        masks = report.row(f"[{case}] masks")
        # identical wherever the reference logit is clear of the threshold (GEMM kernels differ
        # by CPU, so a pixel within 1e-4 of it may round either way on either side)
        assert masks.agreement_decided == 1.0, f"{case}: {masks}"
        assert masks.agreement >= 0.9999, f"{case}: {masks}"
        assert masks.coverage is not None
        assert report.row(f"[{case}] iou_predictions").max_abs < 1e-5


def test_masks_are_not_trivial(pair):
    """Parity on all-empty masks would prove nothing: the prompts must give varied masks."""
    _, ours = pair
    p = SamPredictor(ours)
    p.set_image(image(200, 300))
    masks, _, _ = p.predict(np.array([[150, 100]]), np.array([1]))
    frac = masks.mean(axis=(1, 2))
    assert ((frac > 0.01) & (frac < 0.99)).any(), frac


def test_alignment_names_first_divergent_module(pair):
    """Break one block's weights: the report must fail there, not before."""
    ref, ours = pair
    blk = ours.image_encoder.blocks[1].mlp.lin1.weight
    saved = blk.numpy().copy()
    blk.set_value(saved * 1.5)
    try:
        report = align_sam(ref, ours, image(96, 128))
    finally:
        blk.set_value(saved)
    assert not report.passed
    assert report.first_divergent().module == "image_encoder.blocks.1"
    assert report.row("image_encoder.blocks.0").passed


def test_compare_metrics():
    a = np.arange(10, dtype=np.float32)
    assert compare("x", a, a).cosine == pytest.approx(1.0)
    row = compare("x", a, a + 0.5)
    assert row.max_abs == pytest.approx(0.5) and row.mean_abs == pytest.approx(0.5)
    assert not compare("x", a, -a).passed
    assert not compare("x", a, a[:5]).passed  # shape mismatch never passes
    assert not compare("x", a, np.full_like(a, np.nan)).passed
    m = np.zeros((100, 100), bool)
    m2 = m.copy()
    m2[0, :5] = True
    assert compare("m", m, m2).agreement == pytest.approx(0.9995)
    assert COS_THRESHOLD == 0.99999


def test_batched_predict_paddle_matches_predict_torch(pair):
    ref, ours = pair
    from segment_anything import SamPredictor as TorchPredictor

    img = image(180, 260, seed=5)
    tp, pp = TorchPredictor(ref), SamPredictor(ours)
    with torch.no_grad():
        tp.set_image(img)
    pp.set_image(img)
    boxes = np.array([[10, 20, 120, 150], [100, 30, 250, 170], [0, 0, 259, 179]], dtype=np.float64)
    pts = np.array(
        [[[50, 60], [70, 80]], [[150, 90], [200, 40]], [[10, 10], [250, 170]]], dtype=np.float64
    )
    labels = np.array([[1, 0], [1, 1], [0, 1]])
    tb = tp.transform.apply_boxes(boxes, tp.original_size)
    tc = tp.transform.apply_coords(pts, tp.original_size)
    for multimask in (True, False):
        with torch.no_grad():
            mt, it, lt = tp.predict_torch(
                torch.as_tensor(tc, dtype=torch.float),
                torch.as_tensor(labels),
                torch.as_tensor(tb, dtype=torch.float),
                None,
                multimask,
            )
        mp, ip, lp = pp.predict_paddle(
            paddle.to_tensor(tc, dtype="float32"),
            paddle.to_tensor(labels),
            paddle.to_tensor(tb, dtype="float32"),
            None,
            multimask,
        )
        assert tuple(mp.shape) == tuple(mt.shape)
        assert (mp.numpy() == mt.numpy()).mean() >= 0.9999
        np.testing.assert_allclose(ip.numpy(), it.numpy(), atol=1e-5)
        assert compare("low_res", lt.numpy(), lp.numpy()).passed


def test_sam_forward_batched(pair):
    """Sam.forward over two images with points, boxes and mask inputs, as upstream."""
    ref, ours = pair
    from segment_anything.utils.transforms import ResizeLongestSide

    size = ours.image_encoder.img_size
    tr = ResizeLongestSide(size)
    rng = np.random.default_rng(0)
    batch_t, batch_p = [], []
    for i, (h, w) in enumerate([(120, 200), (200, 90)]):
        img = tr.apply_image(image(h, w, seed=i))
        coords = tr.apply_coords(rng.uniform(0, [w, h], size=(2, 3, 2)), (h, w))
        labels = np.array([[1, 0, 1], [1, 1, 0]])
        boxes = tr.apply_boxes(
            np.array([[5, 5, w / 2, h / 2], [w / 3, h / 3, w - 1, h - 1]]), (h, w)
        )
        mask_in = rng.normal(size=(2, 1, *ours.prompt_encoder.mask_input_size)).astype(np.float32)
        common = dict(original_size=(h, w))
        batch_t.append(
            dict(
                image=torch.as_tensor(img).permute(2, 0, 1).contiguous(),
                point_coords=torch.as_tensor(coords, dtype=torch.float),
                point_labels=torch.as_tensor(labels),
                boxes=torch.as_tensor(boxes, dtype=torch.float),
                mask_inputs=torch.as_tensor(mask_in),
                **common,
            )
        )
        batch_p.append(
            dict(
                image=paddle.to_tensor(img).transpose([2, 0, 1]),
                point_coords=paddle.to_tensor(coords, dtype="float32"),
                point_labels=paddle.to_tensor(labels),
                boxes=paddle.to_tensor(boxes, dtype="float32"),
                mask_inputs=paddle.to_tensor(mask_in),
                **common,
            )
        )
    with torch.no_grad():
        out_t = ref(batch_t, multimask_output=True)
    out_p = ours(batch_p, multimask_output=True)
    for ot, op in zip(out_t, out_p, strict=True):
        assert (ot["masks"].numpy() == op["masks"].numpy()).mean() >= 0.9999
        np.testing.assert_allclose(
            op["iou_predictions"].numpy(), ot["iou_predictions"].numpy(), atol=1e-5
        )
        assert compare("low", ot["low_res_logits"].numpy(), op["low_res_logits"].numpy()).passed


@pytest.mark.parametrize("q,k,length", [(14, 14, 27), (14, 14, 15), (8, 16, 9), (16, 8, 63)])
def test_get_rel_pos_matches_upstream(q, k, length):
    """Including the resampling branch used when a table was trained at another size."""
    from segment_anything.modeling.image_encoder import get_rel_pos as ref_get_rel_pos

    from paddle_sam.models.sam_v1.image_encoder import get_rel_pos

    table = np.random.default_rng(q * k + length).normal(size=(length, 6)).astype(np.float32)
    expected = ref_get_rel_pos(q, k, torch.as_tensor(table)).numpy()
    got = get_rel_pos(q, k, paddle.to_tensor(table)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
