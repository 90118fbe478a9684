"""The service with SAM 2 (a reduced SAM 2.1 with random weights, written by the test), built by
``paddle-sam serve --checkpoint X.pdparams`` (uvicorn's run captured, the app itself real) and
driven through its HTTP API: the image page's clicks and a refinement from the previous mask
equal SAM2ImagePredictor's, 'everything' equals SAM2AutomaticMaskGenerator's, and the video
page's click and propagation equal SAM2VideoPredictor's on an MP4 written with OpenCV (one
model serves both pages). The Label Studio backend answers a click with the same mask; the
labeller labels a folder with SAM 2's automatic masks and refuses text."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pycocotools import mask as mask_utils

from paddle_sam.cli import main
from paddle_sam.loading.sam2 import build_sam2, build_sam2_video_predictor
from paddle_sam.predict.io import label_studio_rle
from paddle_sam.predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator
from paddle_sam.predict.sam2.predictor import SAM2ImagePredictor
from paddle_sam.serve import create_label_studio_app
from tests.helpers.sam2_ref import reduced_checkpoint, reduced_spec
from tests.helpers.server import assert_error, png_bytes
from tests.helpers.video import scene, write_mp4

pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

SPEC = reduced_spec("2.1")
H, W, FRAMES = 96, 128, 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    return reduced_checkpoint(tmp_path_factory.mktemp("serve_sam2"))[1]


@pytest.fixture(scope="module")
def app(ckpt):
    """What ``paddle-sam serve --checkpoint ckpt`` runs."""
    import uvicorn

    started: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(uvicorn, "run", lambda app, **kwargs: started.update(app=app, **kwargs))
        assert main(["serve", "--checkpoint", str(ckpt), "--port", "0"]) == 0
    return started["app"]


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return scene(1, H, W)[0]


@pytest.fixture(scope="module")
def reference(ckpt, image) -> SAM2ImagePredictor:
    predictor = SAM2ImagePredictor(build_sam2(SPEC, ckpt))
    predictor.set_image(image)
    return predictor


def rle_mask(rle: dict) -> np.ndarray:
    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}).astype(bool)


def test_health(client):
    model = client.get("/health").json()["model"]
    assert model["takes_text"] is False and model["takes_points"] is True
    assert model["everything"] is True and model["video"] is True
    assert model["spec"]["encoder_embed_dim"] == 32


def test_click_and_refinement(client, image, reference):
    r = client.post("/sessions", files={"image": ("x.png", png_bytes(image), "image/png")})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    click = {"points": [[30, 25]], "multimask": True, "outputs": ["rle"]}
    r = client.post(f"/sessions/{sid}/prompt", json=click)
    assert r.status_code == 200, r.text
    body = r.json()
    masks, scores, logits = reference.predict([[30, 25]], [1])
    assert body["best"] == int(np.argmax(scores)) and body["instances"] is False
    for item, want, score in zip(body["masks"], masks, scores, strict=True):
        np.testing.assert_array_equal(rle_mask(item["rle"]), want > 0.5)
        assert item["score"] == pytest.approx(float(score), abs=1e-6)
    assert 0 < (masks[body["best"]] > 0.5).mean() < 1
    # the previous answer's best mask refined with a background click
    refine = {"points": [[30, 25], [70, 60]], "labels": [1, 0], "previous_mask": True}
    r = client.post(f"/sessions/{sid}/prompt", json={**refine, "multimask": False})
    assert r.status_code == 200, r.text
    best = int(np.argmax(scores))
    want, _, _ = reference.predict(
        [[30, 25], [70, 60]], [1, 0], mask_input=logits[best : best + 1], multimask_output=False
    )
    np.testing.assert_array_equal(rle_mask(r.json()["masks"][0]["rle"]), want[0] > 0.5)
    r = client.post(f"/sessions/{sid}/prompt", json={"text": "a dog"})
    assert_error(r, 400, "text_not_supported")


def test_everything(client, image, ckpt):
    r = client.post("/sessions", files={"image": ("x.png", png_bytes(image), "image/png")})
    sid = r.json()["session_id"]
    options = {"points_per_side": 4, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}
    r = client.post(f"/sessions/{sid}/everything", json=options)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 120
    while (job := client.get(f"/sessions/{sid}/everything/{r.json()['job_id']}").json())[
        "status"
    ] in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert job["status"] == "done", job
    want = SAM2AutomaticMaskGenerator(build_sam2(SPEC, ckpt), **options).generate(image)
    assert len(job["masks"]) == len(want) >= 1
    for got, rec in zip(job["masks"], want, strict=True):
        np.testing.assert_array_equal(rle_mask(got["segmentation"]), rec["segmentation"])
        assert got["predicted_iou"] == pytest.approx(rec["predicted_iou"], abs=1e-6)


def test_video_click_and_propagation(client, ckpt, tmp_path):
    clip = write_mp4(scene(FRAMES, H, W), tmp_path / "clip.mp4", fps=8.0)
    r = client.post("/videos", files={"video": ("clip.mp4", clip.read_bytes(), "video/mp4")})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    ref = build_sam2_video_predictor(SPEC, ckpt)
    state = ref.init_state(str(clip))

    r = client.post(f"/videos/{sid}/prompt", json={"frame_index": 0, "points": [[30, 25]]})
    assert r.status_code == 200, r.text
    body = r.json()
    obj_id = body["obj_id"]
    _, _, logits = ref.add_new_points_or_box(state, 0, obj_id, points=[[30, 25]], labels=[1])
    (obj,) = body["objects"]
    want = logits.numpy()[0, 0] > 0
    np.testing.assert_array_equal(rle_mask(obj["rle"]), want)
    assert 0 < want.mean() < 1 and 0 < obj["score"] <= 1

    r = client.post(f"/videos/{sid}/propagate", json={"direction": "forward"})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 120
    while (job := client.get(f"/videos/{sid}/propagate/{r.json()['job_id']}").json())["status"] in (
        "queued",
        "running",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert job["status"] == "done" and job["done"] == job["total"] == FRAMES, job
    for f, ids, logits in ref.propagate_in_video(state, start_frame_idx=0):
        frame = client.get(f"/videos/{sid}/frames/{f}").json()
        assert [o["obj_id"] for o in frame["objects"]] == list(ids)
        np.testing.assert_array_equal(
            rle_mask(frame["objects"][0]["rle"]), logits.numpy()[0, 0] > 0
        )
    # SAM 2 takes no text; a box is one object's
    r = client.post(f"/videos/{sid}/prompt", json={"frame_index": 1, "text": "a car"})
    assert_error(r, 400, "text_not_supported", "SAM 2")
    r = client.post(f"/videos/{sid}/prompt", json={"frame_index": 1, "boxes": [[5, 5, 40, 40]]})
    assert r.status_code == 200, r.text
    assert sorted(o["obj_id"] for o in r.json()["objects"]) == [obj_id, obj_id + 1]
    two = {"frame_index": 1, "boxes": [[5, 5, 40, 40], [50, 50, 60, 60]]}
    assert_error(client.post(f"/videos/{sid}/prompt", json=two), 400, "invalid_prompt", "one box")


def test_label_studio_click(ckpt, image, reference):
    from tests.serve.test_label_studio import CONFIG, data_url, keypoint

    app = create_label_studio_app(build_sam2(SPEC, ckpt))
    client = TestClient(app)
    assert client.post("/setup", json={"project": "1.1", "schema": CONFIG}).status_code == 200
    ctx = {"result": [{**keypoint(25, 50), "original_width": W, "original_height": H}]}
    task = {"id": 1, "data": {"image": data_url(image)}}
    body = {"tasks": [task], "project": "1.1", "params": {"context": ctx}}
    r = client.post("/predict", json=body)
    assert r.status_code == 200, r.text
    (region,) = r.json()["results"][0]["result"]
    masks, scores, _ = reference.predict([[0.25 * W, 0.5 * H]], [1])
    best = int(np.argmax(scores))
    assert region["value"]["rle"] == label_studio_rle(masks[best] > 0.5)


def test_label_everything_and_text_refused(ckpt, image, tmp_path, capsys):
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(image).save(folder / "a.png")
    out = tmp_path / "labels"
    argv = ["label", str(folder), "-o", str(out), "--checkpoint", str(ckpt), "--quiet"]
    options = ["--points-per-side", "4", "--pred-iou-thresh", "0", "--stability-score-thresh", "0"]
    assert main([*argv, "--everything", *options, "--num-workers", "1"]) == 0, capsys.readouterr()
    doc = json.loads((out / "annotations.json").read_text())
    want = SAM2AutomaticMaskGenerator(
        build_sam2(SPEC, ckpt), points_per_side=4, pred_iou_thresh=0, stability_score_thresh=0
    ).generate(image)
    assert len(doc["annotations"]) == len([r for r in want if r["area"] > 0]) >= 1
    assert main([*argv[:-1], "--text", "a car", "--overwrite"]) == 2
    assert "need SAM 3" in capsys.readouterr().err
