"""SAM 3 behind the service: text and exemplar-box prompts give Sam3Processor's answers;
clicks give predict_inst's when the model has the interactive predictor and are refused with
their reason otherwise, as are "everything" and points mixed with text; sessions stay apart."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient

from paddle_sam.predict.sam3.predictor import Sam3Predictor
from paddle_sam.serve import create_app
from tests.helpers.pairs import image as make_image
from tests.helpers.server import (
    assert_error,
    decode_mask_png,
    png_bytes,
    sam3_reference,
    sam3_threshold,
    tiny_sam3_model,
)


@pytest.fixture(scope="module")
def model():
    return tiny_sam3_model()


@pytest.fixture(scope="module")
def images():
    return {"a": make_image(90, 130, seed=3), "b": make_image(120, 100, seed=4)}


def client_for(model, threshold: float) -> TestClient:
    return TestClient(create_app(Sam3Predictor(model, confidence_threshold=threshold)))


def upload(c, image) -> str:
    r = c.post("/sessions", files={"image": ("x.png", png_bytes(image), "image/png")})
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def assert_answer(r, masks: np.ndarray, scores: np.ndarray) -> None:
    """The API's answer is the processor's: same instances, same order, same pixels."""
    from pycocotools import mask as mask_utils

    assert r.status_code == 200, r.text
    body = r.json()
    assert body["instances"] is True
    got = body["masks"]
    assert len(got) == len(scores)
    assert body["best"] == (0 if len(scores) else None)
    np.testing.assert_allclose([m["score"] for m in got], scores, rtol=1e-6)
    for m, want in zip(got, masks, strict=True):
        np.testing.assert_array_equal(decode_mask_png(base64.b64decode(m["png"])), want)
        rle = {"size": m["rle"]["size"], "counts": m["rle"]["counts"].encode()}
        np.testing.assert_array_equal(mask_utils.decode(rle).astype(bool), want)
        assert m["area"] == int(want.sum())


def cxcywh(box, image) -> list[float]:
    h, w = image.shape[:2]
    x0, y0, x1, y1 = box
    return [(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h]


def test_health_reports_sam3(model):
    with client_for(model, 0.5) as c:
        m = c.get("/health").json()["model"]
    assert m["type"] == "sam3"
    assert m["takes_text"] is True and m["takes_points"] is False
    assert m["returns_instances"] is True and m["everything"] is False


def test_text_prompt_matches_processor(model, images):
    img = images["a"]
    thr = sam3_threshold(model, img, "a dog")
    masks, scores = sam3_reference(model, img, "a dog", threshold=thr)
    assert len(scores) == 3 and (np.diff(scores) <= 0).all()
    with client_for(model, thr) as c:
        sid = upload(c, img)
        assert_answer(c.post(f"/sessions/{sid}/prompt", json={"text": "a dog"}), masks, scores)
        # the masks download by index, best first
        png = c.get(f"/sessions/{sid}/masks/0.png")
        np.testing.assert_array_equal(decode_mask_png(png.content), masks[0])


def test_text_and_box_and_box_alone(model, images):
    img, box = images["a"], [20.0, 15.0, 70.0, 60.0]
    ex = cxcywh(box, img)
    thr = sam3_threshold(model, img, "a cat", ex)
    masks, scores = sam3_reference(model, img, "a cat", ex, threshold=thr)
    assert len(scores) == 3
    with client_for(model, thr) as c:
        sid = upload(c, img)
        r = c.post(f"/sessions/{sid}/prompt", json={"text": "a cat", "box": box})
        assert_answer(r, masks, scores)
        # a box alone: an exemplar, every matching instance ("visual" as the text)
        masks, scores = sam3_reference(model, img, None, ex, threshold=thr)
        assert_answer(c.post(f"/sessions/{sid}/prompt", json={"box": box}), masks, scores)


def test_nothing_found_is_an_empty_answer(model, images):
    with client_for(model, 0.99) as c:
        sid = upload(c, images["a"])
        r = c.post(f"/sessions/{sid}/prompt", json={"text": "a dog"})
        assert r.status_code == 200, r.text
        assert r.json()["masks"] == [] and r.json()["best"] is None
        assert_error(c.get(f"/sessions/{sid}/masks/0.png"), 404, "no_such_mask")


def test_refused_prompts_name_the_reason(model, images):
    with client_for(model, 0.5) as c:
        sid = upload(c, images["a"])
        r = c.post(f"/sessions/{sid}/prompt", json={"points": [[5, 5]]})
        assert_error(r, 400, "points_not_supported", "predict_inst", "text", "box")
        r = c.post(f"/sessions/{sid}/prompt", json={"points": [[5, 5]], "text": "a dog"})
        assert_error(r, 400, "invalid_prompt", "points and text")
        assert c.post(f"/sessions/{sid}/prompt", json={"text": "a dog"}).status_code == 200
        r = c.post(f"/sessions/{sid}/prompt", json={"previous_mask": True})
        assert_error(r, 400, "mask_not_supported", "predict_inst")
        r = c.post(f"/sessions/{sid}/everything", json={})
        assert_error(r, 400, "not_supported", "not supported for SAM 3")
        r = c.post(f"/sessions/{sid}/prompt", json={"box": [50, 50, 40, 60]})
        assert_error(r, 400, "invalid_prompt", "x1 > x0")
        # and the session still answers
        assert c.post(f"/sessions/{sid}/prompt", json={"text": "a dog"}).status_code == 200


def test_sessions_and_prompts_do_not_mix(model, images):
    """Two sessions, prompts interleaved: each answer is the processor's on that image alone,
    and a box given once does not linger into the next text-only request."""
    a, b, box = images["a"], images["b"], [10.0, 10.0, 60.0, 50.0]
    thr = sam3_threshold(model, a, "a dog")
    with client_for(model, thr) as c:
        sa, sb = upload(c, a), upload(c, b)
        for sid, img, text, bx in [
            (sa, a, "a dog", box),
            (sb, b, "a dog", None),
            (sa, a, "a dog", None),
            (sb, b, "a bird", box),
            (sa, a, "a bird", None),
            (sb, b, "a dog", None),
        ]:
            body = {"text": text} if bx is None else {"text": text, "box": bx}
            want = sam3_reference(
                model, img, text, None if bx is None else cxcywh(bx, img), threshold=thr
            )
            assert_answer(c.post(f"/sessions/{sid}/prompt", json=body), *want)


def test_serve_command_line_for_sam3(capsys):
    from paddle_sam.cli import build_parser, main

    args = build_parser().parse_args(
        ["serve", "--model-type", "sam3", "--checkpoint", "x.pt", "--confidence-threshold", "0.3"]
    )
    assert args.model_type == "sam3" and args.confidence_threshold == 0.3 and args.bpe is None
    assert main(["serve", "--model-type", "sam3", "--port", "0", "--checkpoint", "no.pt"]) != 0
    assert "no.pt" in capsys.readouterr().err
    assert main(["serve", "--bpe", "vocab.txt.gz", "--port", "0", "--checkpoint", "x"]) != 0
    assert "apply to --model-type sam3 only" in capsys.readouterr().err


def test_clicks_go_to_predict_inst(images):
    """A model with the interactive predictor answers clicks (and a click + previous mask)
    with predict_inst's candidates on the same image state; text still finds instances."""
    from paddle_sam.predict.sam3.processor import Sam3Processor

    model = tiny_sam3_model(seed=1, interactive=True)
    img = images["b"]
    proc = Sam3Processor(model, resolution=112)
    state = proc.set_image(img)
    pts, lbl = np.array([[40.0, 60.0], [80.0, 20.0]]), np.array([1, 0])
    want_m, want_s, want_low = model.predict_inst(state, point_coords=pts, point_labels=lbl)
    best = int(np.argmax(want_s))
    refined = model.predict_inst(
        state,
        point_coords=pts[:1],
        point_labels=lbl[:1],
        mask_input=want_low[best : best + 1],
        multimask_output=False,
    )
    with client_for(model, 0.0) as c:
        assert c.get("/health").json()["model"]["takes_points"] is True
        sid = upload(c, img)
        r = c.post(
            f"/sessions/{sid}/prompt",
            json={"points": pts.tolist(), "labels": [1, 0], "multimask": True},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["instances"] is False and len(body["masks"]) == 3 == len(want_s)
        np.testing.assert_allclose([m["score"] for m in body["masks"]], want_s, rtol=1e-6)
        for m, want in zip(body["masks"], want_m, strict=True):
            np.testing.assert_array_equal(decode_mask_png(base64.b64decode(m["png"])), want > 0.5)
        r = c.post(
            f"/sessions/{sid}/prompt",
            json={"points": [pts[0].tolist()], "previous_mask": True, "multimask": False},
        )
        assert r.status_code == 200, r.text
        (got,) = r.json()["masks"]
        np.testing.assert_allclose(got["score"], refined[1][0], rtol=1e-6)
        np.testing.assert_array_equal(
            decode_mask_png(base64.b64decode(got["png"])), refined[0][0] > 0.5
        )
        r = c.post(f"/sessions/{sid}/prompt", json={"text": "a dog"})
        assert r.status_code == 200 and r.json()["instances"] is True
