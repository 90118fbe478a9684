"""The segmentation service: API behaviour, errors, session cache, jobs, load, CLI."""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from paddle_sam.predict.sam_v1.predictor import SamPredictor
from paddle_sam.serve import create_app
from tests.helpers.pairs import image as make_image
from tests.helpers.server import (
    ThreadedServer,
    assert_error,
    decode_mask_png,
    png_bytes,
    tiny_model,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(model)) as c:
        yield c


@pytest.fixture(scope="module")
def images():
    return {"a": make_image(120, 160, seed=1), "b": make_image(90, 70, seed=2)}


def upload(client, image: np.ndarray, name: str = "x.png") -> dict:
    r = client.post("/sessions", files={"image": (name, png_bytes(image), "image/png")})
    assert r.status_code == 201, r.text
    return r.json()


def prompt(client, sid: str, **body):
    return client.post(f"/sessions/{sid}/prompt", json=body)


def expected(model, image, **kw):
    p = SamPredictor(model)
    p.set_image(image)
    return p.predict(**kw)


def png_of(item: dict) -> np.ndarray:
    return decode_mask_png(base64.b64decode(item["png"]))


def rle_of(item: dict) -> np.ndarray:
    from pycocotools import mask as mask_utils

    rle = {"size": item["rle"]["size"], "counts": item["rle"]["counts"].encode()}
    return mask_utils.decode(rle).astype(bool)


# -- the API -----------------------------------------------------------------------------


def test_health_and_openapi(client):
    h = client.get("/health").json()
    assert h["status"] == "ok"
    assert h["model"]["type"] == "custom" and h["model"]["takes_text"] is False
    assert h["model"]["spec"]["encoder_embed_dim"] == 64
    assert h["model"]["runtime"] == "dygraph" and "threads" in h
    assert h["limits"]["max_image_pixels"] > 0 and h["sessions"]["budget_bytes"] > 0
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/sessions", "/sessions/{session_id}/prompt", "/sessions/{session_id}/everything"):
        assert p in paths
    assert "multipart/form-data" in paths["/sessions"]["post"]["requestBody"]["content"]


def test_page_and_static_files(client):
    page = client.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    for f in ("app.js", "style.css"):
        assert client.get(f"/static/{f}").status_code == 200
    # offline: nothing is loaded from another host
    for f in ("index.html", "app.js", "style.css"):
        text = (ROOT / "paddle_sam" / "serve" / "static" / f).read_text()
        assert "http://" not in text and "https://" not in text, f


def test_point_prompt_matches_predictor(client, model, images):
    s = upload(client, images["a"])
    assert (s["width"], s["height"]) == (160, 120)
    r = prompt(client, s["session_id"], points=[[50, 60]], multimask=True)
    assert r.status_code == 200, r.text
    body = r.json()
    masks, scores, _ = expected(
        model, images["a"], point_coords=np.array([[50, 60]]), point_labels=np.array([1])
    )
    assert len(body["masks"]) == 3 and body["best"] == int(np.argmax(scores))
    for item, m, sc in zip(body["masks"], masks, scores, strict=True):
        np.testing.assert_array_equal(png_of(item), m)
        np.testing.assert_array_equal(rle_of(item), m)
        assert item["area"] == int(m.sum())
        assert item["score"] == pytest.approx(float(sc), abs=1e-6)
    # the last answer is downloadable
    d = client.get(f"/sessions/{s['session_id']}/masks/1.png")
    assert d.status_code == 200 and d.headers["content-type"] == "image/png"
    np.testing.assert_array_equal(decode_mask_png(d.content), masks[1])
    assert_error(client.get(f"/sessions/{s['session_id']}/masks/3.png"), 404, "no_such_mask")


def test_box_negative_point_and_previous_mask(client, model, images):
    img = images["a"]
    sid = upload(client, img)["session_id"]
    assert_error(prompt(client, sid, previous_mask=True), 409, "no_previous_mask")
    kw = dict(points=[[80, 50], [30, 30]], labels=[1, 0], box=[20, 10, 140, 110])
    r = prompt(client, sid, **kw, outputs=["rle"])
    assert r.status_code == 200 and "png" not in r.json()["masks"][0]
    p = SamPredictor(model)
    p.set_image(img)
    coords, labels, box = np.array(kw["points"]), np.array(kw["labels"]), np.array(kw["box"])
    m1, _, logits = p.predict(coords, labels, box, multimask_output=False)
    np.testing.assert_array_equal(rle_of(r.json()["masks"][0]), m1[0])

    r = prompt(client, sid, points=[[80, 50]], previous_mask=True, outputs=["png"])
    m2, s2, _ = p.predict(
        np.array([[80, 50]]), np.array([1]), mask_input=logits, multimask_output=False
    )
    np.testing.assert_array_equal(png_of(r.json()["masks"][0]), m2[0])
    assert r.json()["masks"][0]["score"] == pytest.approx(float(s2[0]), abs=1e-6)
    assert_error(
        prompt(client, sid, previous_mask=True, previous_index=2), 400, "invalid_prompt", "range"
    )


def test_sessions_keep_their_own_embedding(client, model, images):
    """Interleaved prompts on two images: each answer comes from its own image."""
    sa, sb = (upload(client, images[k])["session_id"] for k in "ab")
    pts = {"a": [[100, 40]], "b": [[20, 70]]}
    for k, sid in [("a", sa), ("b", sb), ("a", sa), ("b", sb)]:
        r = prompt(client, sid, points=pts[k])
        m, _, _ = expected(
            model,
            images[k],
            point_coords=np.array(pts[k]),
            point_labels=np.array([1]),
            multimask_output=False,
        )
        np.testing.assert_array_equal(png_of(r.json()["masks"][0]), m[0])


def test_embedding_progress(client, images):
    """GET /uploads/{id} while the upload waits for the model, then when it is done."""
    service = client.app.state.service
    uid = "progress-test-1"
    assert client.get(f"/uploads/{uid}").json()["stage"] == "waiting"
    result = {}
    with service.lock:  # the model is busy: the upload waits at the start of its embedding
        t = threading.Thread(
            target=lambda: result.update(
                r=client.post(
                    f"/sessions?upload_id={uid}",
                    files={"image": ("x.png", png_bytes(images["b"]), "image/png")},
                )
            )
        )
        t.start()
        for _ in range(200):
            p = client.get(f"/uploads/{uid}").json()
            if p["stage"] == "embedding":
                break
            time.sleep(0.02)
        assert p == {"upload_id": uid, "stage": "embedding", "done": 0, "total": 4}  # 3 blocks + 1
    t.join()
    assert result["r"].status_code == 201
    assert client.get(f"/uploads/{uid}").json() == {
        "upload_id": uid,
        "stage": "done",
        "done": 4,
        "total": 4,
    }
    bad = client.post(
        "/sessions?upload_id=../x", content=b"x", headers={"content-type": "image/png"}
    )
    assert_error(bad, 400, "invalid_upload_id")


def test_raw_body_upload_and_delete(client, images):
    r = client.post(
        "/sessions", content=png_bytes(images["b"]), headers={"content-type": "image/png"}
    )
    assert r.status_code == 201
    sid = r.json()["session_id"]
    assert client.get(f"/sessions/{sid}").json()["width"] == 70
    assert client.delete(f"/sessions/{sid}").json() == {"deleted": sid}
    assert_error(prompt(client, sid, points=[[1, 1]]), 404, "session_not_found", sid)
    assert_error(client.delete(f"/sessions/{sid}"), 404, "session_not_found")


def test_text_prompt_refused_by_sam_v1(images):
    with TestClient(create_app(tiny_model(), model_type="vit_b")) as c:
        sid = upload(c, images["b"])["session_id"]
        r = c.post(f"/sessions/{sid}/prompt", json={"text": "a dog", "points": [[5, 5]]})
        assert_error(r, 400, "text_not_supported", "this model (vit_b) does not take text prompts")


def test_text_reaches_a_model_that_takes_text(model, images):
    """The prompt API's text field, as a SAM 3 predictor will receive it."""
    seen = []

    class TextPredictor(SamPredictor):
        takes_text = True

        def predict(self, *args, text=None, **kwargs):
            seen.append(text)
            return super().predict(*args, **kwargs)

    with TestClient(create_app(TextPredictor(model))) as c:
        assert c.get("/health").json()["model"]["takes_text"] is True
        sid = upload(c, images["b"])["session_id"]
        r = c.post(f"/sessions/{sid}/prompt", json={"text": "a dog", "points": [[5, 5]]})
        assert r.status_code == 200 and seen == ["a dog"]


# -- robustness: bad input is a 4xx naming the problem, and the server keeps serving --------


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims huge dimensions but holds almost no data (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


def test_bad_uploads(model, images):
    with TestClient(create_app(model, max_image_pixels=100_000, max_upload_mb=0.5)) as c:

        def post(data: bytes, name="f.png"):
            return c.post("/sessions", files={"image": (name, data, "application/octet-stream")})

        assert_error(post(b"hello, not an image", "notes.txt"), 400, "invalid_image", "notes.txt")
        good = png_bytes(images["a"])
        assert_error(post(good[: len(good) // 2]), 400, "invalid_image", "truncated")
        big = np.zeros((400, 300, 3), np.uint8)  # 120k pixels > 100k
        assert_error(post(png_bytes(big)), 413, "image_too_large", "400", "100000")
        bomb = _png_header_only(100_000, 100_000)
        assert len(bomb) < 200
        assert_error(post(bomb), 413, "image_too_large", "too large")  # refused by PIL itself
        bomb = _png_header_only(20_000, 5_000)  # under PIL's own limit, over ours
        assert_error(post(bomb), 413, "image_too_large", "20000x5000", "100000 pixels")
        noise = np.random.default_rng(0).integers(0, 256, (512, 512, 3), dtype=np.uint8)
        assert_error(post(png_bytes(noise)), 413, "upload_too_large")  # 786 kB > 0.5 MiB
        assert_error(post(b""), 400, "invalid_upload", "empty")
        r = c.post("/sessions", files={"picture": ("x.png", good, "image/png")})
        assert_error(r, 400, "invalid_upload", "'image'")
        # the server is still serving
        assert (
            c.post("/sessions", files={"image": ("ok.png", good, "image/png")}).status_code == 201
        )


def test_bad_prompts(client, images):
    sid = upload(client, images["a"])["session_id"]
    outside = prompt(client, sid, points=[[500, 60]])
    assert_error(outside, 400, "invalid_prompt", "outside the image", "width 160")
    assert_error(prompt(client, sid, box=[10, 10, 5, 50]), 400, "invalid_prompt", "x0 <= x1")
    assert_error(prompt(client, sid, box=[0, 0, 10, 1000]), 400, "invalid_prompt", "outside")
    assert_error(prompt(client, sid), 400, "empty_prompt")
    assert_error(
        prompt(client, sid, points=[[1, 1]], labels=[1, 0]), 400, "invalid_prompt", "labels"
    )
    assert_error(prompt(client, sid, points=[[1, 1]], labels=[3]), 422, "invalid_request", "labels")
    assert_error(prompt(client, sid, points=[[1]]), 422, "invalid_request", "points")
    assert_error(prompt(client, sid, point=[[1, 1]]), 422, "invalid_request", "point")
    r = client.post(
        f"/sessions/{sid}/prompt",
        content=b'{"points": [[1, 1]',
        headers={"content-type": "application/json"},
    )
    assert_error(r, 422, "invalid_request", "JSON")
    assert_error(client.get("/no/such/route"), 404, "not_found")
    huge = b'{"points": [' + b"[1, 1], " * 300_000 + b"[1, 1]]}"
    r = client.post(
        f"/sessions/{sid}/prompt", content=huge, headers={"content-type": "application/json"}
    )
    assert_error(r, 413, "body_too_large", "limit")
    # the session still answers
    assert prompt(client, sid, points=[[10, 10]]).status_code == 200


# -- the session cache -------------------------------------------------------------------


def test_lru_eviction_under_budget(model, images):
    img = images["a"]  # 57.6 kB image + 32 x 16 x 16 float embedding (32 kB)
    one = img.nbytes + 32 * 16 * 16 * 4
    with TestClient(create_app(model, memory_budget_mb=2.5 * one / 2**20)) as c:
        s1, s2 = (upload(c, img)["session_id"] for _ in range(2))
        assert prompt(c, s1, points=[[5, 5]]).status_code == 200  # s1 is now the most recent
        s3 = upload(c, img)["session_id"]  # evicts s2, the least recently used
        assert_error(
            prompt(c, s2, points=[[5, 5]]), 410, "session_expired", "upload the image again"
        )
        for sid in (s1, s3):
            assert prompt(c, sid, points=[[5, 5]]).status_code == 200
        stats = c.get("/health").json()["sessions"]
        assert stats["evictions"] >= 1 and stats["bytes"] <= stats["budget_bytes"]
        assert stats["peak_bytes"] <= stats["budget_bytes"]
    with TestClient(create_app(model, memory_budget_mb=0.05)) as c:
        r = c.post("/sessions", files={"image": ("x.png", png_bytes(img), "image/png")})
        assert_error(r, 413, "session_too_large", "budget")


def test_idle_sessions_expire(model, images):
    with TestClient(create_app(model, session_ttl_s=0.2)) as c:
        sid = upload(c, images["b"])["session_id"]
        time.sleep(0.4)
        assert_error(prompt(c, sid, points=[[5, 5]]), 410, "session_expired", "expired")


# -- everything mode ---------------------------------------------------------------------


def _wait_job(client, sid: str, job_id: str) -> dict:
    for _ in range(600):
        j = client.get(f"/sessions/{sid}/everything/{job_id}").json()
        assert 0 <= j["done"] <= j["total"]
        if j["status"] not in ("queued", "running"):
            return j
        time.sleep(0.05)
    raise AssertionError("job did not finish")


def test_everything_job_matches_generator(client, model, images):
    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    sid = upload(client, images["a"])["session_id"]
    opts = dict(
        points_per_side=6, points_per_batch=8, pred_iou_thresh=0.0, stability_score_thresh=0.0
    )
    r = client.post(f"/sessions/{sid}/everything", json=opts)
    assert r.status_code == 202
    j = r.json()
    assert j["total"] == 5  # 36 points in batches of 8
    # clicks are served while the job runs
    assert prompt(client, sid, points=[[5, 5]]).status_code == 200
    j = _wait_job(client, sid, j["job_id"])
    assert j["status"] == "done" and j["done"] == j["total"] and j["progress"] == 1.0
    ref = SamAutomaticMaskGenerator(model, output_mode="coco_rle", **opts).generate(images["a"])
    assert len(j["masks"]) == len(ref) > 0
    for got, want in zip(j["masks"], ref, strict=True):
        assert got["segmentation"] == want["segmentation"]
        assert got["predicted_iou"] == pytest.approx(want["predicted_iou"], abs=1e-5)
    bad = client.post(f"/sessions/{sid}/everything", json={"points_per_side": 0})
    assert_error(bad, 422, "invalid_request", "points_per_side")
    assert_error(client.get(f"/sessions/{sid}/everything/nope"), 404, "job_not_found")


def test_everything_with_crops_and_cancel_on_delete(client, images):
    sid = upload(client, images["b"])["session_id"]
    r = client.post(
        f"/sessions/{sid}/everything",
        json={
            "points_per_side": 4,
            "crop_n_layers": 1,
            "pred_iou_thresh": 0.0,
            "stability_score_thresh": 0.0,
        },
    )
    j = _wait_job(client, sid, r.json()["job_id"])
    assert j["status"] == "done" and j["total"] == 5  # the image, then 4 crops
    r = client.post(
        f"/sessions/{sid}/everything", json={"points_per_side": 64, "points_per_batch": 1}
    )
    job = r.json()["job_id"]
    app = client.app
    jobobj = app.state.store.get(sid).jobs[job]
    client.delete(f"/sessions/{sid}")
    for _ in range(600):
        if jobobj.status in ("cancelled", "done", "failed"):
            break
        time.sleep(0.05)
    assert jobobj.status == "cancelled" and jobobj.done < jobobj.total


# -- the log: failures with their traceback, the client one line -------------------------


def test_failed_job_logs_its_traceback_and_the_client_gets_one_line(
    model, images, monkeypatch, caplog
):
    from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    def exploding_batch(self, *args, **kwargs):
        raise RuntimeError("the grid exploded")

    monkeypatch.setattr(SamAutomaticMaskGenerator, "_process_batch", exploding_batch)
    caplog.set_level(logging.INFO, logger="paddle_sam.serve")
    with TestClient(create_app(model)) as c:
        sid = upload(c, images["b"])["session_id"]
        r = c.post(f"/sessions/{sid}/everything", json={"points_per_side": 4})
        assert r.status_code == 202, r.text
        j = _wait_job(c, sid, r.json()["job_id"])
    assert j["status"] == "failed"
    assert j["error"] == "RuntimeError: the grid exploded"  # one line, no traceback
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failed) == 1 and failed[0].name == "paddle_sam.serve.service"
    assert j["job_id"] in failed[0].getMessage() and failed[0].exc_info is not None
    text = caplog.text
    assert "Traceback" in text and "exploding_batch" in text and "the grid exploded" in text
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(f"session {sid} created" in m for m in info), info
    assert any(f"job {j['job_id']}" in m and "started" in m for m in info), info


def test_unexpected_error_is_a_one_line_500_with_the_traceback_logged(
    model, images, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="paddle_sam.serve")
    app = create_app(model)

    def broken_predict(state, **kwargs):
        raise KeyError("low_res_masks")

    c = TestClient(app, raise_server_exceptions=False)
    sid = upload(c, images["b"])["session_id"]
    monkeypatch.setattr(app.state.service, "predict", broken_predict)
    r = prompt(c, sid, points=[[5, 5]])
    assert_error(r, 500, "internal_error", "KeyError", "low_res_masks")
    assert "Traceback" not in r.text and "\n" not in r.json()["detail"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].name == "paddle_sam.serve.errors"
    assert f"/sessions/{sid}/prompt" in errors[0].getMessage()
    assert "Traceback" in caplog.text and "broken_predict" in caplog.text
    # a refusal is no failure: nothing at error level
    caplog.clear()
    assert_error(prompt(c, sid), 400, "empty_prompt")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_configure_logging_writes_paddle_sam_records_to_stderr(capsys):
    from paddle_sam.serve.logs import StderrHandler, configure_logging

    logger = logging.getLogger("paddle_sam")
    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    try:
        configure_logging("warning")
        configure_logging("info")  # again: replaces its handler, does not add a second
        assert sum(isinstance(h, StderrHandler) for h in logger.handlers) == 1
        assert logger.propagate is False  # not printed again by the root logger's handler
        log = logging.getLogger("paddle_sam.serve.test")
        log.debug("not shown")
        log.info("session %s created", "abc")
        try:
            raise ValueError("inside")
        except ValueError:
            log.exception("job failed")
        err = capsys.readouterr().err
        assert "INFO paddle_sam.serve.test: session abc created" in err
        assert "ERROR paddle_sam.serve.test: job failed" in err
        assert "Traceback" in err and "ValueError: inside" in err and "not shown" not in err
        with pytest.raises(ValueError, match="log level must be one of"):
            configure_logging("loud")
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


# -- load: 8 clients x 50 clicks over real HTTP ------------------------------------------


def test_load_8_clients_50_clicks(model, images):
    import httpx

    budget_mb = 4.0
    app = create_app(model, memory_budget_mb=budget_mb)
    failures: list[str] = []
    with ThreadedServer(app) as server:

        def client_run(k: int) -> int:
            rng = np.random.default_rng(k)
            img = make_image(100 + 4 * k, 120, seed=10 + k)
            ok = 0
            with httpx.Client(base_url=server.url, timeout=60) as http:
                r = http.post("/sessions", files={"image": ("i.png", png_bytes(img), "image/png")})
                if r.status_code != 201:
                    failures.append(f"upload {r.status_code} {r.text}")
                    return ok
                sid = r.json()["session_id"]
                for _ in range(50):
                    x, y = rng.uniform(0, 120), rng.uniform(0, img.shape[0])
                    r = http.post(
                        f"/sessions/{sid}/prompt", json={"points": [[x, y]], "outputs": ["png"]}
                    )
                    if r.status_code != 200 or not r.json()["masks"][0]["png"]:
                        failures.append(f"prompt {r.status_code} {r.text[:200]}")
                    else:
                        ok += 1
            return ok

        with ThreadPoolExecutor(8) as pool:
            done = list(pool.map(client_run, range(8)))
        health = httpx.get(f"{server.url}/health").json()
    assert failures == [] and done == [50] * 8
    stats = health["sessions"]
    assert stats["count"] == 8 and stats["evictions"] == 0
    assert stats["peak_bytes"] <= stats["budget_bytes"] == int(budget_mb * 2**20)


# -- the command line --------------------------------------------------------------------


def test_serve_cli_errors(tmp_path, capsys):
    from paddle_sam.cli import build_parser, main

    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"  # loopback by default
    # without --checkpoint only the bundled default model can be served (see
    # test_serve_cli_runs_a_checkpoint[default-model]); another model type needs its weights
    assert main(["serve", "--model-type", "vit_b", "--port", "0"]) == 2
    assert "checkpoint" in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2  # the default model, a busy port
        assert "already in use" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--memory-budget-mb", "-1"])


@pytest.mark.parametrize("bundled", [False, True], ids=["checkpoint", "default-model"])
def test_serve_cli_runs_a_checkpoint(tmp_path, images, bundled):
    """``paddle-sam serve`` in its own process: loads a checkpoint (or, without one, the
    bundled default model), binds loopback, serves."""
    import httpx

    from paddle_sam.cli import DEFAULT_MODEL
    from paddle_sam.convert.core import save_pdparams
    from paddle_sam.loading.sam_v1 import load_sam

    if bundled:
        model, ckpt_args = load_sam(DEFAULT_MODEL), []
    else:
        model = tiny_model(seed=3)
        ckpt = tmp_path / "tiny.pdparams"
        state = {k: v.numpy() for k, v in model.state_dict().items()}
        save_pdparams(state, ckpt, {"model_type": "tiny", "spec": model.spec.to_dict()})
        ckpt_args = ["--checkpoint", str(ckpt)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "paddle_sam",
            "serve",
            *ckpt_args,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                health = httpx.get(f"{url}/health", timeout=1).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)
        else:
            raise AssertionError("server did not start")
        assert health["model"]["spec"] == json.loads(json.dumps(model.spec.to_dict()))
        # the page's banner: the bundled demo model only, with the command for real weights
        demo = health["model"]["demo"]
        assert (
            (demo is not None and "paddle-sam download vit_b" in demo) if bundled else demo is None
        )
        r = httpx.post(
            f"{url}/sessions", files={"image": ("a.png", png_bytes(images["b"]), "image/png")}
        )
        sid = r.json()["session_id"]
        r = httpx.post(f"{url}/sessions/{sid}/prompt", json={"points": [[30, 40]]})
        m, _, _ = expected(
            model,
            images["b"],
            point_coords=np.array([[30, 40]]),
            point_labels=np.array([1]),
            multimask_output=False,
        )
        np.testing.assert_array_equal(png_of(r.json()["masks"][0]), m[0])
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_model_calls_are_serialised(model, images):
    """The model lock is held by one thread at a time, whatever the request mix."""
    app = create_app(model)
    service = app.state.service
    inside, overlaps = [0], []
    real = service.predictor.predict

    def traced(**kw):
        inside[0] += 1
        overlaps.append(inside[0])
        time.sleep(0.001)
        try:
            return real(**kw)
        finally:
            inside[0] -= 1

    service.predictor.predict = traced
    with TestClient(app) as c:
        sids = [upload(c, images[k])["session_id"] for k in "ab"]
        threads = [
            threading.Thread(target=lambda s=s: [prompt(c, s, points=[[5, 5]]) for _ in range(10)])
            for s in sids * 2
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(overlaps) == 40 and max(overlaps) == 1


def test_exported_model_is_served(tmp_path, images):
    """``--exported``: a StaticSamPredictor behind the same API; sessions swap its state too."""
    from paddle_sam.deploy import StaticSamPredictor
    from paddle_sam.export.sam_v1 import export_sam

    model = tiny_model(seed=4)
    export_sam(model, tmp_path / "tiny", model_type="tiny")
    with TestClient(create_app(StaticSamPredictor(tmp_path / "tiny"))) as c:
        h = c.get("/health").json()["model"]
        assert h["type"] == "tiny" and h["runtime"] == "paddle-inference" and h["everything"]
        sa, sb = (upload(c, images[k])["session_id"] for k in "ab")
        ref = StaticSamPredictor(tmp_path / "tiny")
        for k, sid, pt in [("a", sa, [90, 30]), ("b", sb, [10, 80]), ("a", sa, [20, 100])]:
            r = prompt(c, sid, points=[pt], multimask=True)
            ref.set_image(images[k])
            masks, _, _ = ref.predict(np.array([pt]), np.array([1]))
            for item, m in zip(r.json()["masks"], masks, strict=True):
                np.testing.assert_array_equal(png_of(item), m)
        # "everything" on the exported runtime, while clicks on the other session swap its
        # state in between the job's batches: the generator's masks on that session's image
        from paddle_sam.predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

        opts = dict(
            points_per_side=4, points_per_batch=3, pred_iou_thresh=0.0, stability_score_thresh=0.0
        )
        r = c.post(f"/sessions/{sa}/everything", json=opts)
        assert r.status_code == 202
        for _ in range(3):
            assert prompt(c, sb, points=[[10, 80]]).status_code == 200
        j = _wait_job(c, sa, r.json()["job_id"])
        assert j["status"] == "done", j
        want = SamAutomaticMaskGenerator(ref, output_mode="coco_rle", **opts).generate(images["a"])
        assert len(j["masks"]) == len(want) > 0
        for got, exp in zip(j["masks"], want, strict=True):
            assert got["segmentation"] == exp["segmentation"]
            assert got["predicted_iou"] == pytest.approx(exp["predicted_iou"], abs=1e-6)


def _predictor(kind: str, tmp_path: Path):
    if kind == "SamPredictor":
        return SamPredictor(tiny_model(seed=4))
    if kind == "StaticSamPredictor":
        from paddle_sam.deploy import StaticSamPredictor
        from paddle_sam.export.sam_v1 import export_sam

        export_sam(tiny_model(seed=4), tmp_path / "tiny", model_type="tiny")
        return StaticSamPredictor(tmp_path / "tiny")
    if kind == "OnnxSamPredictor":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("paddle2onnx")
        from paddle_sam.deploy import OnnxSamPredictor
        from paddle_sam.export.onnx import export_onnx

        export_onnx(tiny_model(seed=4), tmp_path / "tiny", model_type="tiny")
        return OnnxSamPredictor(tmp_path / "tiny")
    from paddle_sam.predict.sam3.predictor import Sam3Predictor
    from tests.helpers.server import tiny_sam3_model

    return Sam3Predictor(tiny_sam3_model(interactive=kind == "Sam3Predictor-interactive"))


@pytest.mark.parametrize(
    "kind",
    [
        "SamPredictor",
        "StaticSamPredictor",
        "OnnxSamPredictor",
        "Sam3Predictor",
        "Sam3Predictor-interactive",
    ],
)
def test_predictors_are_interactive_predictors(kind, tmp_path, images):
    """Every predictor the service takes has the members of ``InteractivePredictor``, of the
    declared types, and holds the attributes it names as its state after ``set_image``."""
    from paddle_sam.predict.base import InteractivePredictor

    p = _predictor(kind, tmp_path)
    assert isinstance(p, InteractivePredictor)
    declared = {n for n in vars(InteractivePredictor) if not n.startswith("_")}
    declared |= set(InteractivePredictor.__annotations__)
    assert declared == {
        "session_state_keys",
        "takes_text",
        "takes_points",
        "takes_mask_input",
        "returns_instances",
        "model_type",
        "is_image_set",
        "everything_refusal",
        "mask_refusal",
        "is_interactive",
        "set_image",
        "predict",
    }
    assert not [n for n in sorted(declared) if not hasattr(p, n)]
    for flag in ("takes_text", "takes_points", "takes_mask_input", "returns_instances"):
        assert type(getattr(p, flag)) is bool, flag
    for name in ("model_type", "everything_refusal", "mask_refusal"):
        assert isinstance(getattr(p, name), str | None), name
    keys = p.session_state_keys
    assert isinstance(keys, tuple) and keys and all(isinstance(k, str) for k in keys)
    for has_points, has_mask in [(True, False), (False, True), (False, False)]:
        assert type(p.is_interactive(None, has_points, has_mask)) is bool
    assert p.is_image_set is False
    p.set_image(images["a"])
    assert p.is_image_set is True and all(getattr(p, k) is not None for k in keys)


@pytest.mark.parametrize("shape", [(1, 1), (5, 13), (7, 16), (33, 9)])
def test_mask_png_round_trip(shape):
    from paddle_sam.serve.schemas import mask_png

    m = np.random.default_rng(sum(shape)).random(shape) < 0.5
    png = mask_png(m)
    np.testing.assert_array_equal(decode_mask_png(png), m)  # decodes with PIL, same size


def test_session_store_unit():
    """Byte accounting, LRU order, tombstones and the drop hook, without a model."""
    from paddle_sam.serve.sessions import (
        Session,
        SessionGone,
        SessionNotFound,
        SessionStore,
        SessionTooLarge,
    )

    dropped = []
    store = SessionStore(3000, on_drop=lambda s: dropped.append(s.id))

    def make(i: int, nbytes: int = 1000) -> Session:
        return Session(f"s{i}", np.zeros(nbytes, np.uint8), {"features": None}, 0.0)

    for i in range(3):
        assert store.add(make(i)) == []
    store.get("s0")  # s1 is now the least recently used
    assert [s.id for s in store.add(make(3))] == ["s1"] and dropped == ["s1"]
    assert store.total_bytes == 3000 and len(store) == 3
    with pytest.raises(SessionGone, match="evicted"):
        store.get("s1")
    with pytest.raises(SessionNotFound):
        store.get("never")
    store.delete("s0")
    assert store.total_bytes == 2000 and dropped == ["s1"]  # a delete is not a drop
    with pytest.raises(SessionNotFound):
        store.get("s0")
    with pytest.raises(SessionTooLarge):
        store.add(make(9, 3001))
    # growth is re-measured: s2 grows, the other session is evicted
    s2 = store.get("s2")
    s2.image = np.zeros(2500, np.uint8)
    assert [s.id for s in store.refresh(s2)] == ["s3"] and store.total_bytes == 2500
    expiring = SessionStore(10_000, ttl_seconds=0.0, on_drop=lambda s: dropped.append(s.id))
    expiring.add(make(5))
    with pytest.raises(SessionGone, match="expired"):
        expiring.get("s5")
    assert dropped[-1] == "s5"
