"""SamPredictor behaviour that needs no reference: caching, formats, clear errors."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_sam import SamPredictor, build_sam
from tests.helpers.pairs import image
from tests.helpers.specs import TINY


@pytest.fixture(scope="module")
def predictor():
    p = SamPredictor(build_sam(TINY))
    p.set_image(image(120, 160))
    return p


def test_embedding_computed_once_and_reused():
    model = build_sam(TINY)
    calls = []
    handle = model.image_encoder.register_forward_post_hook(lambda *a: calls.append(1))
    p = SamPredictor(model)
    p.set_image(image(100, 150))
    emb = p.get_image_embedding().numpy().copy()
    for i in range(5):
        p.predict(np.array([[10 + 20 * i, 30]]), np.array([1]))
    p.predict(box=np.array([5, 5, 100, 80]))
    handle.remove()
    assert len(calls) == 1
    np.testing.assert_array_equal(p.get_image_embedding().numpy(), emb)
    assert tuple(emb.shape) == (1, TINY.prompt_embed_dim, 16, 16)


def test_outputs_shapes_dtypes(predictor):
    m, s, lr = predictor.predict(np.array([[40, 50]]), np.array([1]))
    assert m.shape == (3, 120, 160) and m.dtype == bool
    assert s.shape == (3,) and lr.shape == (3, 64, 64)
    m1, s1, _ = predictor.predict(np.array([[40, 50]]), np.array([1]), multimask_output=False)
    assert m1.shape == (1, 120, 160)
    logits, _, _ = predictor.predict(np.array([[40, 50]]), np.array([1]), return_logits=True)
    assert logits.dtype == np.float32
    np.testing.assert_array_equal(logits > 0.0, m)
    # refinement with the previous low-res logits
    m2, _, _ = predictor.predict(
        np.array([[40, 50]]), np.array([1]), mask_input=lr[np.argmax(s)][None]
    )
    assert m2.shape == (3, 120, 160)


def test_bgr_equals_flipped_rgb():
    p1, p2 = SamPredictor(build_sam(TINY)), None
    model = p1.model
    p2 = SamPredictor(model)
    img = image(90, 70)
    p1.set_image(img)
    p2.set_image(np.ascontiguousarray(img[..., ::-1]), image_format="BGR")
    np.testing.assert_array_equal(
        p1.get_image_embedding().numpy(), p2.get_image_embedding().numpy()
    )


def test_reset_image(predictor):
    p = SamPredictor(predictor.model)
    p.set_image(image(50, 60))
    p.reset_image()
    with pytest.raises(RuntimeError, match="set_image"):
        p.predict(np.array([[1, 1]]), np.array([1]))
    with pytest.raises(RuntimeError, match="set_image"):
        p.get_image_embedding()


@pytest.mark.parametrize(
    "img, match",
    [
        (np.zeros((40, 50), np.uint8), r"H x W x 3.*grayscale"),
        (np.zeros((40, 50, 4), np.uint8), r"H x W x 3.*RGBA"),
        (np.zeros((40, 50, 3), np.uint16), r"uint8.*uint16"),
        (np.zeros((40, 50, 3), np.float32), r"uint8.*float32"),
        (np.zeros((0, 50, 3), np.uint8), r"empty"),
    ],
    ids=["grayscale", "rgba", "16-bit", "float", "empty"],
)
def test_bad_images(predictor, img, match):
    with pytest.raises(ValueError, match=match):
        predictor.set_image(img)


@pytest.mark.parametrize("shape", [(1, 100_000), (100_000, 1), (1, 513), (3, 1537)])
def test_too_elongated_image(predictor, shape):
    """Resized to 256 on its longer side, the shorter side would round to 0 pixels: a
    ValueError naming the shape, not an error deep inside Paddle."""
    with pytest.raises(ValueError, match=rf"{shape[0]} x {shape[1]} \(H x W\).*elongated"):
        predictor.set_image(np.zeros((*shape, 3), np.uint8))


def test_most_elongated_image_accepted():
    """The limit is exact: 1 x 512 resizes to 1 x 256 and is segmented."""
    p = SamPredictor(build_sam(TINY))
    p.set_image(np.full((1, 512, 3), 200, np.uint8))
    assert p.input_size == (1, 256)
    masks, scores, _ = p.predict(np.array([[300, 0]]), np.array([1]))
    assert masks.shape == (3, 1, 512) and np.isfinite(scores).all()


def test_sam3_preprocessing_takes_elongated_images():
    """SAM 3 resizes to a square, so no side can round to 0 there."""
    from paddle_sam.predict.sam3.processor import preprocess_sam3_image

    x = preprocess_sam3_image(np.full((1, 100_000, 3), 255, np.uint8), 56)
    assert x.shape == (3, 56, 56) and np.isfinite(x).all()
    np.testing.assert_allclose(x, 1.0, atol=1e-6)


def test_bad_image_type_and_format(predictor):
    with pytest.raises(TypeError, match="numpy array"):
        predictor.set_image([[1, 2, 3]])
    with pytest.raises(ValueError, match="image_format"):
        predictor.set_image(image(10, 10), image_format="HSV")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(point_coords=np.array([[10, 10]])), "point_labels must be supplied"),
        (dict(point_labels=np.array([1])), "point_labels must be supplied"),
        (dict(point_coords=np.zeros((0, 2)), point_labels=np.zeros(0)), "empty"),
        (dict(point_coords=np.array([10, 10]), point_labels=np.array([1])), r"N x 2"),
        (dict(point_coords=np.array([[10, 10]]), point_labels=np.array([1, 1])), r"shape \(1,\)"),
        (dict(point_coords=np.array([[10, 10]]), point_labels=np.array([2])), "must be 1"),
        (dict(point_coords=np.array([[200, 10]]), point_labels=np.array([1])), "outside the image"),
        (dict(point_coords=np.array([[-1, 10]]), point_labels=np.array([1])), "outside the image"),
        (dict(point_coords=np.array([[np.nan, 10]]), point_labels=np.array([1])), "NaN"),
        (dict(box=np.array([10, 10, 5, 50])), "x0 <= x1"),
        (dict(box=np.array([10, 10, 50])), r"shape \(4,\)"),
        (dict(box=np.array([[0, 0, 10, 10], [0, 0, 20, 20]])), "predict_paddle"),
        (dict(box=np.array([0, 0, 170, 50])), "outside the image"),
        (dict(mask_input=np.zeros((256, 256))), r"1 x 64 x 64"),
        (dict(mask_input=np.full((1, 64, 64), np.inf)), "infinite"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_prompts(predictor, kwargs, match):
    with pytest.raises(ValueError, match=match):
        predictor.predict(**kwargs)


def test_edge_points_are_inside(predictor):
    # the image is 160 wide and 120 high: its far corner is a valid click
    masks, _, _ = predictor.predict(np.array([[160, 120], [0, 0]]), np.array([1, 0]))
    assert masks.shape[1:] == (120, 160)


def test_set_paddle_image_checks_shape(predictor):
    import paddle

    with pytest.raises(ValueError, match="long side 256"):
        predictor.set_paddle_image(paddle.zeros([1, 3, 100, 100]), (100, 100))
    with pytest.raises(ValueError, match="1 x 3 x h x w"):
        predictor.set_paddle_image(paddle.zeros([3, 256, 256]), (256, 256))


def test_drop_in_names():
    import inspect

    from paddle_sam import SamAutomaticMaskGenerator, sam_model_registry

    assert set(sam_model_registry) == {"default", "vit_h", "vit_l", "vit_b"}
    sig = inspect.signature(SamPredictor.predict)
    assert list(sig.parameters)[1:] == [
        "point_coords",
        "point_labels",
        "box",
        "mask_input",
        "multimask_output",
        "return_logits",
    ]
    assert sig.parameters["multimask_output"].default is True
    assert SamPredictor.predict_torch is SamPredictor.predict_paddle
    assert SamPredictor.set_torch_image is SamPredictor.set_paddle_image
    assert callable(SamAutomaticMaskGenerator)


@pytest.mark.parametrize(
    "prompt",
    [
        {"point_coords": np.array([[40, 50]]), "point_labels": np.array([1])},
        {"box": np.array([10, 20, 90, 100])},
        {
            "point_coords": np.array([[40, 50]]),
            "point_labels": np.array([0]),
            "box": np.array([10, 20, 90, 100]),
        },
    ],
    ids=["click", "box", "box+negative"],
)
@pytest.mark.parametrize("multimask", [True, False])
def test_fast_decoder_is_the_same_function(predictor, prompt, multimask):
    """A prompt of few tokens and no mask input skips the mask decoder's module path (the
    faster form runs instead) and gives what the module path gives."""
    calls = []
    handle = predictor.model.mask_decoder.register_forward_post_hook(lambda *a: calls.append(1))
    try:
        fast = predictor.predict(**prompt, multimask_output=multimask, return_logits=True)
    finally:
        handle.remove()
    assert calls == []
    predictor.fast_decoder = False
    try:
        slow = predictor.predict(**prompt, multimask_output=multimask, return_logits=True)
    finally:
        del predictor.fast_decoder  # back to the class default
    for a, b in zip(fast, slow, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)


def test_many_points_or_a_mask_input_take_the_module_path(predictor):
    calls = []
    handle = predictor.model.mask_decoder.register_forward_post_hook(lambda *a: calls.append(1))
    try:
        pts = np.stack([np.arange(10, 130, 12), np.full(10, 60)], axis=1)
        predictor.predict(pts, np.ones(10, int))  # 1 + 4 + 11 tokens > the few-token bound
        _, _, low = predictor.predict(np.array([[40, 50]]), np.array([1]), multimask_output=False)
        predictor.predict(np.array([[40, 50]]), np.array([1]), mask_input=low)
    finally:
        handle.remove()
    assert len(calls) == 2


def test_predict_equals_predict_paddle(predictor):
    """predict (numpy API; on the CPU it upscales in numpy) gives predict_paddle's masks,
    logits, IoU and low-res logits for the same prompt."""
    pts, labels = np.array([[40, 50], [90, 70]]), np.array([1, 0])
    for logits in (False, True):
        got = predictor.predict(pts, labels, return_logits=logits)
        coords = predictor.transform.apply_coords(pts.astype(np.float32), predictor.original_size)
        want = predictor.predict_paddle(
            paddle.to_tensor(coords[None]), paddle.to_tensor(labels[None]), return_logits=logits
        )
        for a, b in zip(got, want, strict=True):
            b = b.numpy()[0]
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        assert got[0].flags.c_contiguous
