"""Denoising queries (paddle_sam.train.sam3.denoise), a training aid that is not in upstream: the
noised boxes and their assignment, the real queries' outputs unchanged by them, and their
terms in the step's loss; and the classification loss's query divisor (``loss.pad_n_queries``),
the other from-scratch setting of the criterion."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("scipy")  # the Hungarian matcher

import paddle  # noqa: E402

from paddle_sam.loading.sam3 import build_sam3_image_model  # noqa: E402
from paddle_sam.models.sam3.box_ops import box_cxcywh_to_xyxy  # noqa: E402
from paddle_sam.train.sam3 import step as STEP  # noqa: E402
from paddle_sam.train.sam3.denoise import make_denoising_queries  # noqa: E402
from paddle_sam.train.sam3.loss_fns import CORE_LOSS_KEY  # noqa: E402
from paddle_sam.train.sam3.sam3_loss import (  # noqa: E402
    build_roboflow_v100_loss,
    make_find_targets,
)
from tests.helpers.specs import tiny_sam3_spec  # noqa: E402

TINY = tiny_sam3_spec()
TEXTS = ["a red car", "a purple giraffe", "a blue car"]
COUNTS = [3, 0, 1]  # the second prompt has no target


def targets_for(counts, size, seed=3):
    rng = np.random.default_rng(seed)
    boxes, masks = [], []
    for n in counts:
        wh = rng.uniform(0.1, 0.4, size=(n, 2))
        centre = rng.uniform(0.3, 0.7, size=(n, 2))
        b = np.concatenate([centre, wh], 1).astype(np.float32)
        m = np.zeros((n, size, size), bool)
        for i, (cx, cy, w, h) in enumerate(b):
            m[i, int((cy - h / 2) * size) : int((cy + h / 2) * size)] = True
            m[i, :, : int((cx - w / 2) * size)] = False
            m[i, :, int((cx + w / 2) * size) :] = False
        boxes.append(paddle.to_tensor(b.reshape(-1, 4)))
        masks.append(paddle.to_tensor(m))
    return make_find_targets(boxes, masks=masks)


def iou(a, b):
    a, b = (box_cxcywh_to_xyxy(paddle.to_tensor(x)).numpy() for x in (a, b))
    lt, rb = np.maximum(a[..., :2], b[..., :2]), np.minimum(a[..., 2:], b[..., 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area = lambda x: np.prod(x[..., 2:] - x[..., :2], -1)  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def test_noised_boxes_and_assignment():
    targets = targets_for(COUNTS, 32)
    anchors = paddle.to_tensor(np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32))
    dn = make_denoising_queries(anchors, targets, np.random.default_rng(1), box_noise=0.5)
    most = max(COUNTS)
    assert dn.num_queries == 2 * most
    assert dn.boxes.shape == [2 * most, len(COUNTS), 4]
    assert dn.anchor_ids.shape == [2 * most, len(COUNTS)]
    assert int(dn.anchor_ids.max()) < 6
    find, slot, tgt = (t.numpy().tolist() for t in dn.indices)
    assert find == [0, 0, 0, 2] and slot == [0, 1, 2, 0] and tgt == [0, 1, 2, 3]
    boxes = dn.boxes.numpy()
    packed = targets["boxes"].numpy()
    assert (boxes[..., 2:] > 0).all() and (boxes >= 0).all() and (boxes <= 1).all()
    pos = iou(boxes[slot, find], packed[tgt])
    neg = iou(boxes[[most + s for s in slot], find], packed[tgt])
    # corners moved by < 1/4 of the box's size: IoU above (1/2 / (3/2)) ** 2; negatives moved
    # by 1/4 to 1/2 of it on each corner
    assert (pos > 1 / 9).all() and (pos < 1).all()
    assert (neg < pos).all(), (pos, neg)
    # the nearest anchor's content
    centres = 1 / (1 + np.exp(-anchors.numpy()[:, :2]))
    d = np.abs(boxes[:, :, None, :2] - centres[None, None]).sum(-1)
    np.testing.assert_array_equal(dn.anchor_ids.numpy(), d.argmin(-1))


def test_none_without_targets_and_bad_noise():
    anchors = paddle.zeros([4, 4])
    targets = targets_for([0, 0], 16)
    assert make_denoising_queries(anchors, targets, np.random.default_rng(0)) is None
    with pytest.raises(ValueError, match="box_noise"):
        make_denoising_queries(anchors, targets_for([1], 16), np.random.default_rng(0), 0.0)


@pytest.fixture(scope="module")
def model(bpe_path):
    paddle.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = build_sam3_image_model(bpe_path=bpe_path, spec=TINY)
    m.train()
    return STEP.disable_dropout(m)


def batch():
    rng = np.random.default_rng(4)
    size = TINY.image_size
    images = rng.uniform(-1, 1, size=(len(TEXTS), 3, size, size)).astype(np.float32)
    return {
        "images": paddle.to_tensor(images),
        "texts": list(TEXTS),
        "targets": targets_for(COUNTS, size),
    }


def test_real_queries_unchanged_by_denoising_queries(model):
    b = batch()
    ref = model.transformer.decoder.reference_points.weight
    dn = make_denoising_queries(ref, b["targets"], np.random.default_rng(0))
    with paddle.no_grad():
        plain = STEP.forward_train(model, b["images"], b["texts"], recompute=False)
        with_dn = STEP.forward_train(model, b["images"], b["texts"], recompute=False, denoise=dn)
    assert "dn" not in plain
    keys = [k for k, v in plain.items() if isinstance(v, paddle.Tensor)]
    assert {"pred_logits", "pred_boxes", "pred_masks", "pred_logits_o2m"} <= set(keys)
    for k in keys:
        np.testing.assert_allclose(
            with_dn[k].numpy(), plain[k].numpy(), rtol=1e-5, atol=1e-5, err_msg=k
        )
    out = with_dn["dn"]
    n, k = len(TEXTS), dn.num_queries
    assert out["pred_logits"].shape == [n, k, 1]
    assert out["pred_boxes"].shape == [n, k, 4]
    assert out["pred_masks"].shape[:2] == [n, k]
    assert len(out["aux_outputs"]) == len(plain["aux_outputs"])
    assert all(level["indices"] is dn.indices for level in [out, *out["aux_outputs"]])


def test_step_loss_adds_the_denoising_terms(model):
    criterion = build_roboflow_v100_loss(True)
    b = batch()
    core0, plain = STEP.step_loss(model, b, criterion, recompute=False)
    core, losses = STEP.step_loss(
        model, b, criterion, recompute=False, denoise_weight=0.5, rng=np.random.default_rng(0)
    )
    for key in ("loss_ce", "loss_bbox", "loss_giou", "loss_mask", "loss_dice"):
        assert key in plain and float(losses[key]) == pytest.approx(float(plain[key]), rel=1e-5)
        assert np.isfinite(float(losses[f"{key}_dn"]))
    dn = criterion.compute_loss(
        STEP.forward_train(
            model,
            b["images"],
            b["texts"],
            recompute=False,
            denoise=make_denoising_queries(
                model.transformer.decoder.reference_points.weight,
                b["targets"],
                np.random.default_rng(0),
            ),
        )["dn"],
        b["targets"],
    )[CORE_LOSS_KEY]
    # the criterion's sqrt(find queries) scaling applies to both parts
    expected = float(core0) + 0.5 * len(TEXTS) ** 0.5 * float(dn)
    assert float(core) == pytest.approx(expected, rel=1e-5)
    assert float(losses[CORE_LOSS_KEY]) == pytest.approx(expected, rel=1e-5)
    # the denoising terms reach the learned queries' content
    model.clear_gradients()
    core.backward()
    grad_dn = model.transformer.decoder.query_embed.weight.grad.numpy().copy()
    model.clear_gradients()
    core0.backward()
    grad_plain = model.transformer.decoder.query_embed.weight.grad.numpy()
    assert np.abs(grad_dn - grad_plain).max() > 1e-6
    with pytest.raises(ValueError, match="rng"):
        STEP.step_loss(model, b, criterion, denoise_weight=0.5)


def test_classification_divisor_pad_n_queries(model):
    """``loss.pad_n_queries``: upstream divides the classification sum by 200 queries per
    prompt, its own count; ``None`` divides by the model's queries (here fewer), the other
    terms unchanged."""
    b = batch()
    q = model.transformer.decoder.num_queries
    assert q < 200
    _, padded = STEP.step_loss(model, b, build_roboflow_v100_loss(True), recompute=False)
    _, own = STEP.step_loss(
        model, b, build_roboflow_v100_loss(True, pad_n_queries=None), recompute=False
    )
    _, same = STEP.step_loss(
        model, b, build_roboflow_v100_loss(True, pad_n_queries=q), recompute=False
    )
    assert float(padded["loss_ce"]) > 0
    assert float(own["loss_ce"]) == pytest.approx(float(padded["loss_ce"]) * 200 / q, rel=1e-5)
    assert float(same["loss_ce"]) == pytest.approx(float(own["loss_ce"]), rel=1e-6)
    for key in ("presence_loss", "loss_bbox", "loss_giou", "loss_dice"):
        assert float(own[key]) == pytest.approx(float(padded[key]), rel=1e-6)
