"""The service's video mode (``/videos``) over SAM 3's dense video model at the tiny test
size (random weights, thresholds lowered so that a text prompt finds objects).

Every answer is checked against ``Sam3VideoPredictor`` called directly with the same requests
on the same model: the objects of a text prompt and of clicks, every frame of a propagation
(ids, scores, boxes, masks), a click correction re-propagated, a removed object. Also: the
upload's checks and limits (413 naming the flag), progress and cancellation of a
propagation (the session usable after it), the downloads (the JSON's RLEs are the API's masks,
the MP4 decodes to the frames with results), the memory budget shared with image sessions
(eviction, refusal), and the refusals of bad requests.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from fastapi.testclient import TestClient
from pycocotools import mask as mask_utils

from paddle_sam.predict.sam3.video_predictor import Sam3VideoPredictor
from paddle_sam.predict.track_outputs import obj_color
from paddle_sam.serve import create_app
from paddle_sam.serve.video import VideoSession
from tests.helpers.pairs import image as make_image
from tests.helpers.server import (
    VIDEO_SETTINGS,
    assert_error,
    decode_mask_png,
    png_bytes,
    tiny_model,
    tiny_sam3_video_model,
)
from tests.helpers.video import scene, write_mp4

NUM_FRAMES, H, W = 8, 60, 80
TEXT = "a red square"


@pytest.fixture(scope="module")
def model():
    return tiny_sam3_video_model(seed=0, **VIDEO_SETTINGS)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return write_mp4(scene(NUM_FRAMES, H, W), tmp_path_factory.mktemp("video") / "clip.mp4")


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(model)) as c:
        yield c


def upload(c, path: Path, name: str = "clip.mp4") -> dict:
    r = c.post("/videos", files={"video": (name, path.read_bytes(), "video/mp4")})
    assert r.status_code == 201, r.text
    return r.json()


def wait_job(c, sid: str, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = c.get(f"/videos/{sid}/propagate/{job_id}").json()
        if job["status"] not in ("queued", "running"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.02)


def propagate(c, sid: str, **body) -> dict:
    r = c.post(f"/videos/{sid}/propagate", json=body)
    assert r.status_code == 202, r.text
    job = wait_job(c, sid, r.json()["job_id"])
    assert job["status"] == "done", job
    return job


def rle_mask(rle: dict) -> np.ndarray:
    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}).astype(bool)


def assert_objects(objects: list[dict], outputs: dict) -> None:
    """The API's objects of a frame are the predictor's outputs for it (boxes in pixels)."""
    ids = [o["obj_id"] for o in objects]
    assert ids == outputs["out_obj_ids"].tolist()
    np.testing.assert_array_equal(
        [o["score"] for o in objects], outputs["out_probs"].astype(np.float64)
    )
    boxes = outputs["out_boxes_xywh"].astype(np.float64) * [W, H, W, H]
    np.testing.assert_allclose([o["box"] for o in objects], boxes.reshape(-1, 4), rtol=1e-6)
    for o, want in zip(objects, outputs["out_binary_masks"], strict=True):
        got = rle_mask(o["rle"])
        np.testing.assert_array_equal(got, want)
        assert o["area"] == int(want.sum())


def scrub(c, sid: str) -> dict[int, list[dict]]:
    out = {}
    for i in range(NUM_FRAMES):
        r = c.get(f"/videos/{sid}/frames/{i}")
        assert r.status_code == 200, r.text
        out[i] = r.json()["objects"] if r.json()["has_results"] else None
    return out


def reference(model, path: Path) -> tuple[Sam3VideoPredictor, str]:
    ref = Sam3VideoPredictor(model)
    return ref, ref.handle_request({"type": "start_session", "resource_path": str(path)})[
        "session_id"
    ]


def ref_propagate(ref, rsid: str, start: int, direction: str = "both") -> dict[int, dict]:
    stream = ref.handle_stream_request(
        {
            "type": "propagate_in_video",
            "session_id": rsid,
            "propagation_direction": direction,
            "start_frame_index": start,
        }
    )
    return {item["frame_index"]: item["outputs"] for item in stream}


# -- health, page, no video mode ---------------------------------------------------------


def test_health_and_page(client):
    h = client.get("/health").json()
    assert h["model"]["video"] is True and h["video"]["available"] is True
    assert h["video"]["detail"] is None
    assert h["video"]["limits"]["max_video_frames"] == 300
    # the image page runs on the video model's detector, clicks through its tracker's heads
    assert h["model"]["type"] == "sam3" and h["model"]["takes_points"] is True
    page = client.get("/video")
    assert page.status_code == 200 and "/static/video.js" in page.text
    assert "/static/common.js" in page.text
    assert 'id="video-link"' in client.get("/").text
    root = Path(__file__).resolve().parents[2] / "paddle_sam" / "serve" / "static"
    for f in ("video.html", "video.js", "common.js"):
        assert client.get(f"/static/{f}").status_code == 200
        text = (root / f).read_text()
        assert "http://" not in text and "https://" not in text, f
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/videos", "/videos/{session_id}/prompt", "/videos/{session_id}/propagate"):
        assert p in paths
    assert "video/*" in paths["/videos"]["post"]["requestBody"]["content"]


def test_image_clicks_on_the_video_models_detector(client, model):
    """The image page still answers clicks: predict_inst through the tracker's heads."""
    from paddle_sam.predict.sam3.processor import Sam3Processor

    img = make_image(70, 90, seed=2)
    r = client.post("/sessions", files={"image": ("x.png", png_bytes(img), "image/png")})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    r = client.post(f"/sessions/{sid}/prompt", json={"points": [[30, 40]], "multimask": True})
    assert r.status_code == 200, r.text
    state = Sam3Processor(model.detector, resolution=112).set_image(img)
    masks, scores, _ = model.detector.predict_inst(
        state, point_coords=np.array([[30.0, 40.0]]), point_labels=np.array([1])
    )
    got = r.json()["masks"]
    np.testing.assert_allclose([m["score"] for m in got], scores, rtol=1e-6)
    for m, want in zip(got, masks, strict=True):
        np.testing.assert_array_equal(decode_mask_png(base64.b64decode(m["png"])), want > 0.5)


def test_no_video_mode_without_the_tracker(clip):
    with TestClient(create_app(tiny_model())) as c:
        h = c.get("/health").json()
        assert h["model"]["video"] is False and h["video"]["available"] is False
        assert "SAM 3 with its tracker" in h["video"]["detail"]
        r = c.post("/videos", files={"video": ("clip.mp4", clip.read_bytes(), "video/mp4")})
        assert_error(r, 400, "video_not_supported", "sam3.pt")
        assert_error(c.get("/videos/abc"), 400, "video_not_supported")
        assert c.get("/video").status_code == 200  # the page, which says why
    refusal = "this server's checkpoint has no tracker weights"
    with TestClient(create_app(tiny_model(), video_refusal=refusal)) as c:
        assert c.get("/health").json()["video"]["detail"] == refusal
        assert_error(c.post("/videos/x/propagate", json={}), 400, "video_not_supported", refusal)


# -- uploads and their limits -------------------------------------------------------------


def test_upload_checks_and_limits(model, clip, tmp_path):
    app = create_app(
        model,
        max_video_frames=6,
        max_video_seconds=3.0,
        max_video_pixels=100 * 80,
        max_video_upload_mb=0.05,
    )
    workdir = app.state.videos.workdir
    short = write_mp4(scene(5, H, W), tmp_path / "short.mp4")
    with TestClient(app) as c:

        def post(data: bytes, name: str = "v.mp4", ctype: str = "video/mp4"):
            return c.post("/videos", files={"video": (name, data, ctype)})

        r = post(png_bytes(make_image(20, 20, seed=1)), "x.png")
        assert_error(r, 400, "invalid_video", "x.png", "not a video", "MP4, MOV, AVI")
        r = post(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 500, "broken.mp4")
        assert_error(r, 400, "invalid_video", "broken.mp4", "OpenCV cannot open it")
        assert_error(post(b"", "empty.mp4"), 400, "invalid_upload", "empty upload")
        r = post(clip.read_bytes(), "long.mp4")  # 8 frames
        assert_error(r, 413, "video_too_long", "long.mp4", "6 frames", "--max-video-frames")
        slow = write_mp4(scene(5, H, W), tmp_path / "slow.mp4", fps=1.0)  # 5 s
        r = post(slow.read_bytes(), "slow.mp4")
        assert_error(r, 413, "video_too_long", "5.0 s", "3 s", "--max-video-seconds")
        big = write_mp4(scene(3, 90, 120), tmp_path / "big.mp4")
        r = post(big.read_bytes(), "big.mp4")
        assert_error(r, 413, "video_too_large", "120x90", "8000 pixels", "--max-video-pixels")
        r = post(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 60_000, "huge.mp4")
        assert_error(r, 413, "upload_too_large", "video upload", "--max-video-upload-mb")
        r = c.post("/videos", content=b"hello", headers={"Content-Type": "text/plain"})
        assert_error(r, 415, "unsupported_media_type", "video/*")
        r = c.post("/videos", files={"image": ("v.mp4", short.read_bytes(), "video/mp4")})
        assert_error(r, 400, "invalid_upload", "'video'")
        assert list(workdir.iterdir()) == []  # nothing left behind by the refusals
        # the raw bytes are an upload too
        r = c.post("/videos", content=short.read_bytes(), headers={"Content-Type": "video/mp4"})
        assert r.status_code == 201, r.text
        info = r.json()
        assert (info["width"], info["height"], info["num_frames"]) == (W, H, 5)
        assert info["fps"] == pytest.approx(10.0) and info["duration_seconds"] == 0.5
        assert info["objects"] == [] and info["frames_with_results"] == 0
        assert len(list(workdir.iterdir())) == 1
        # frames as JPEG: frame 3 is frame 3
        jpg = c.get(f"/videos/{info['session_id']}/frames/3.jpg")
        assert jpg.status_code == 200 and jpg.headers["content-type"] == "image/jpeg"
        got = cv2.imdecode(np.frombuffer(jpg.content, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
        frames = scene(5, H, W)
        errs = [np.abs(got.astype(int) - f.astype(int)).mean() for f in frames]
        assert int(np.argmin(errs)) == 3 and errs[3] < 8, errs
        assert c.delete(f"/videos/{info['session_id']}").status_code == 200
        assert list(workdir.iterdir()) == []  # the file went with the session


# -- prompts, propagation and scrubbing against the predictor ------------------------------


def test_text_clicks_propagate_scrub_and_downloads(client, model, clip):
    """The whole flow, each answer equal to the predictor's own for the same requests."""
    ref, rsid = reference(model, clip)
    sid = upload(client, clip)["session_id"]

    # a concept on frame 2
    r = client.post(f"/videos/{sid}/prompt", json={"frame_index": 2, "text": TEXT})
    assert r.status_code == 200, r.text
    want = ref.handle_request(
        {"type": "add_prompt", "session_id": rsid, "frame_index": 2, "text": TEXT}
    )["outputs"]
    assert len(want["out_obj_ids"]) >= 2, "the test needs several detected objects"
    assert_objects(r.json()["objects"], want)
    assert r.json()["needs_propagation"] is True

    # propagation both ways from the first prompted frame: every frame as the predictor's
    job = propagate(client, sid)
    assert job["total"] == NUM_FRAMES and job["done"] == NUM_FRAMES and job["progress"] == 1.0
    frames = ref_propagate(ref, rsid, start=2)
    assert sorted(frames) == list(range(NUM_FRAMES))
    shown = scrub(client, sid)
    for i in range(NUM_FRAMES):
        assert_objects(shown[i], frames[i])
    partial = [o for i in shown for o in shown[i] if 0 < o["area"] < W * H]
    assert len(partial) >= NUM_FRAMES, "the test needs objects tracked on the frames"
    info = client.get(f"/videos/{sid}").json()
    assert info["needs_propagation"] is False and info["frames_with_results"] == NUM_FRAMES

    # a new object by clicks (a positive and a negative point) on frame 5; a new id
    ids = sorted({o["obj_id"] for i in shown for o in shown[i]})
    pts, labels = [[20.0, 24.0], [60.0, 10.0]], [1, 0]
    r = client.post(
        f"/videos/{sid}/prompt", json={"frame_index": 5, "points": pts, "labels": labels}
    )
    assert r.status_code == 200, r.text
    new_id = r.json()["obj_id"]
    assert new_id > max(ids)  # a new id (never one of the hidden objects' either)
    want = ref.handle_request(
        {
            "type": "add_prompt",
            "session_id": rsid,
            "frame_index": 5,
            "points": [[x / W, y / H] for x, y in pts],
            "point_labels": labels,
            "obj_id": new_id,
        }
    )["outputs"]
    assert_objects(r.json()["objects"], want)
    clicked = next(o for o in r.json()["objects"] if o["obj_id"] == new_id)
    assert 0 < clicked["area"] < W * H, "the test needs a non-trivial clicked mask"
    info = client.get(f"/videos/{sid}").json()
    assert info["changed_objects"] == [new_id] and info["needs_propagation"] is True
    propagate(client, sid)  # the tracker for the new object, merged with the others
    frames = ref_propagate(ref, rsid, start=2)
    shown = scrub(client, sid)
    for i in range(NUM_FRAMES):
        assert_objects(shown[i], frames[i])
    assert sum(new_id in [o["obj_id"] for o in shown[i]] for i in shown) > 1

    # a correction: a click refines one detected object on frame 6; re-propagation
    target = next(o for o in shown[6] if o["obj_id"] != new_id)["obj_id"]
    before = rle_mask(next(o for o in shown[6] if o["obj_id"] == target)["rle"])
    r = client.post(
        f"/videos/{sid}/prompt",
        json={"frame_index": 6, "points": [[50.0, 30.0]], "obj_id": target},
    )
    assert r.status_code == 200, r.text
    want = ref.handle_request(
        {
            "type": "add_prompt",
            "session_id": rsid,
            "frame_index": 6,
            "points": [[50.0 / W, 30.0 / H]],
            "point_labels": [1],
            "obj_id": target,
        }
    )["outputs"]
    assert_objects(r.json()["objects"], want)
    after = rle_mask(next(o for o in r.json()["objects"] if o["obj_id"] == target)["rle"])
    assert (after != before).any(), "the correction changed the object's mask"
    assert client.get(f"/videos/{sid}").json()["changed_objects"] == [target]
    propagate(client, sid)
    frames = ref_propagate(ref, rsid, start=2)
    shown = scrub(client, sid)
    for i in range(NUM_FRAMES):
        assert_objects(shown[i], frames[i])
    assert client.get(f"/videos/{sid}").json()["needs_propagation"] is False

    # PNG masks of a frame, one per object
    obj = shown[4][0]
    png = client.get(f"/videos/{sid}/frames/4/masks/{obj['obj_id']}.png")
    assert png.status_code == 200
    np.testing.assert_array_equal(decode_mask_png(png.content), rle_mask(obj["rle"]))
    r = client.get(f"/videos/{sid}/frames/4", params={"outputs": "png"})
    assert "rle" not in r.json()["objects"][0]
    np.testing.assert_array_equal(
        decode_mask_png(base64.b64decode(r.json()["objects"][0]["png"])), rle_mask(obj["rle"])
    )

    # downloads: the JSON's RLEs are the API's masks; the MP4 has every frame, objects drawn
    r = client.get(f"/videos/{sid}/results.json")
    assert (
        r.status_code == 200 and 'filename="clip_results.json"' in r.headers["content-disposition"]
    )
    res = r.json()
    assert res["videos"][0]["length"] == NUM_FRAMES and res["videos"][0]["width"] == W
    anns = {a["obj_id"]: a for a in res["annotations"]}
    for i in range(NUM_FRAMES):
        on_frame = {o["obj_id"]: o for o in shown[i]}
        for obj_id, a in anns.items():
            if obj_id in on_frame:
                np.testing.assert_array_equal(
                    rle_mask(a["segmentations"][i]), rle_mask(on_frame[obj_id]["rle"])
                )
                assert a["scores"][i] == pytest.approx(on_frame[obj_id]["score"])
            else:
                assert a["segmentations"][i] is None
    mp4 = client.get(f"/videos/{sid}/overlay.mp4")
    assert mp4.status_code == 200 and mp4.headers["content-type"] == "video/mp4"
    path = clip.parent / "overlay_download.mp4"
    path.write_bytes(mp4.content)
    cap = cv2.VideoCapture(str(path))
    decoded = []
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        decoded.append(bgr[:, :, ::-1])
    cap.release()
    assert len(decoded) == NUM_FRAMES and decoded[0].shape == (H, W, 3)
    # the objects' colours are blended in where their masks are (away from the outlines)
    original = scene(NUM_FRAMES, H, W)
    obj = max(shown[3], key=lambda o: o["area"])
    inside = cv2.erode(rle_mask(obj["rle"]).astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    assert inside.sum() > 20
    tint = np.asarray(obj_color(obj["obj_id"]), float)
    before = np.abs(original[3][inside] - tint).mean()
    after = np.abs(decoded[3][inside].astype(float) - tint).mean()
    assert after < before - 20, (before, after)

    # removal: the object leaves every frame at once, the others as they were; the next
    # propagation (a fetch: nothing to track) gives them the pixels it held, as upstream's
    r = client.delete(f"/videos/{sid}/objects/{new_id}")
    assert r.status_code == 200 and new_id not in r.json()["objects"]
    ref.handle_request({"type": "remove_object", "session_id": rsid, "obj_id": new_id})
    kept = scrub(client, sid)
    for i in range(NUM_FRAMES):
        assert kept[i] == [o for o in shown[i] if o["obj_id"] != new_id]
    assert client.get(f"/videos/{sid}").json()["needs_propagation"] is True
    propagate(client, sid)
    frames = ref_propagate(ref, rsid, start=2)
    shown = scrub(client, sid)
    for i in range(NUM_FRAMES):
        assert_objects(shown[i], frames[i])
    assert any(shown[i] != kept[i] for i in range(NUM_FRAMES))  # the held pixels went back
    res = client.get(f"/videos/{sid}/results.json").json()
    assert new_id not in [a["obj_id"] for a in res["annotations"]]

    # reset: no objects, no results
    r = client.post(f"/videos/{sid}/reset")
    assert r.status_code == 200 and r.json()["objects"] == []
    assert client.get(f"/videos/{sid}/frames/3").json()["has_results"] is False
    assert_error(client.get(f"/videos/{sid}/overlay.mp4"), 409, "no_results")
    client.delete(f"/videos/{sid}")
    ref.handle_request({"type": "close_session", "session_id": rsid})


def test_progress_cancel_and_the_session_after(model, tmp_path):
    """Progress in frames while it runs; a cancel stops it after the frame in progress; the
    frames done keep their results; prompts and a new propagation work afterwards."""
    n = 10
    path = write_mp4(scene(n, H, W), tmp_path / "longer.mp4")
    app = create_app(model)
    lock = app.state.service.lock  # held by the test: the propagation waits between frames
    # after its 4th frame the propagation pauses outside the model lock until the test holds
    # it (however fast the frames are, the test then finds the job running at frame 4)
    store = app.state.videos.store
    paused, resume = threading.Event(), threading.Event()

    def refresh(session):
        evicted = type(store).refresh(store, session)
        if any(j.done == 4 for j in session.jobs.values()) and not paused.is_set():
            paused.set()
            resume.wait(60)
        return evicted

    store.refresh = refresh
    with TestClient(app) as c:
        sid = upload(c, path)["session_id"]
        assert c.post(f"/videos/{sid}/prompt", json={"frame_index": 0, "text": TEXT}).is_success
        r = c.post(f"/videos/{sid}/propagate", json={"direction": "forward"})
        assert r.status_code == 202 and r.json()["total"] == n
        job_id = r.json()["job_id"]
        assert paused.wait(60)
        lock.acquire()
        resume.set()
        try:
            job = c.get(f"/videos/{sid}/propagate/{job_id}").json()
            assert job["status"] == "running" and job["done"] == 4
            assert job["progress"] == pytest.approx(job["done"] / n, abs=1e-4)
            assert job["last_frame_index"] == job["done"] - 1
            # the session is busy: its prompts wait for the propagation
            r = c.post(f"/videos/{sid}/prompt", json={"frame_index": 1, "text": TEXT})
            assert_error(r, 409, "propagation_running", job_id, "cancel")
            assert_error(c.post(f"/videos/{sid}/propagate", json={}), 409, "propagation_running")
            assert_error(c.delete(f"/videos/{sid}/objects/1"), 409, "propagation_running")
            # frames done are there to scrub while it runs
            assert c.get(f"/videos/{sid}/frames/1").json()["has_results"] is True
            r = c.delete(f"/videos/{sid}/propagate/{job_id}")
            assert r.status_code == 200 and r.json()["cancel_requested"] is True
            done_at_cancel = job["done"]
        finally:
            lock.release()
        job = wait_job(c, sid, job_id)
        assert job["status"] == "cancelled"
        # the frame it may have been waiting for (it checks for a cancel before it waits for
        # the lock), then it stopped
        assert done_at_cancel <= job["done"] <= done_at_cancel + 1
        last = job["last_frame_index"]
        assert c.get(f"/videos/{sid}/frames/{last}").json()["has_results"] is True
        assert c.get(f"/videos/{sid}/frames/{n - 1}").json()["has_results"] is False
        # usable: a click answers, a new text prompt starts over and propagates to the end
        r = c.post(f"/videos/{sid}/prompt", json={"frame_index": 3, "points": [[30, 30]]})
        assert r.status_code == 200, r.text
        assert c.post(f"/videos/{sid}/prompt", json={"frame_index": 0, "text": TEXT}).is_success
        job = propagate(c, sid, direction="forward")
        assert job["done"] == n
        assert all(c.get(f"/videos/{sid}/frames/{i}").json()["has_results"] for i in range(n))


def test_a_deleted_session_stops_its_propagation(model, clip):
    app = create_app(model)
    predictor = app.state.videos.predictor
    with TestClient(app) as c:
        sid = upload(c, clip)["session_id"]
        assert c.post(f"/videos/{sid}/prompt", json={"frame_index": 0, "text": TEXT}).is_success
        with app.state.service.lock:  # the propagation waits for it before its first frame
            job_id = c.post(f"/videos/{sid}/propagate", json={}).json()["job_id"]
            job = app.state.store.get(sid, VideoSession).jobs[job_id]
            # the delete waits for the model lock to close the predictor's session: from a
            # thread, while this one holds the lock
            deleting = threading.Thread(target=lambda: c.delete(f"/videos/{sid}"))
            deleting.start()
            deadline = time.monotonic() + 10
            while not job.cancel.is_set():
                assert time.monotonic() < deadline
                time.sleep(0.01)
        deleting.join(30)
        deadline = time.monotonic() + 30
        while job.status in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert job.status == "cancelled" and job.done <= 1
        assert predictor.session_ids() == []
        assert_error(c.get(f"/videos/{sid}"), 404, "session_not_found")


# -- memory budget -------------------------------------------------------------------------


def test_video_sessions_count_against_the_memory_budget(model, clip, caplog):
    caplog.set_level(logging.INFO, logger="paddle_sam.serve")
    app = create_app(model)
    store, predictor = app.state.store, app.state.videos.predictor
    with TestClient(app) as c:
        a = upload(c, clip)
        before = c.get("/health").json()["sessions"]["bytes"]
        assert before == a["bytes"] > clip.stat().st_size  # the file, frames, the state
        assert c.post(
            f"/videos/{a['session_id']}/prompt", json={"frame_index": 0, "text": TEXT}
        ).is_success
        propagate(c, a["session_id"])
        grown = c.get(f"/videos/{a['session_id']}").json()["bytes"]
        assert grown > before  # features, tracker memories and results of every frame
        assert c.get("/health").json()["sessions"]["bytes"] == grown
        # a budget with room for one such session: the next upload evicts the first
        store.budget_bytes = grown + 1000
        b = upload(c, clip)
        r = c.get(f"/videos/{a['session_id']}")
        assert_error(r, 410, "session_expired", "evicted", "upload the video again")
        # closed by a thread of its own: the predictor's session, then the session's folder
        workdir = app.state.videos.workdir
        deadline = time.monotonic() + 10
        while len(predictor.session_ids()) != 1 or len(list(workdir.iterdir())) != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # an image session evicts the video session the same way (one budget)
        img = png_bytes(make_image(60, 60, seed=1))
        store.budget_bytes = 2**30
        r = c.post("/sessions", files={"image": ("x.png", img, "image/png")})
        image_bytes = c.get(f"/sessions/{r.json()['session_id']}").json()["bytes"]
        c.delete(f"/sessions/{r.json()['session_id']}")
        store.budget_bytes = b["bytes"] + image_bytes - 1
        r = c.post("/sessions", files={"image": ("x.png", img, "image/png")})
        assert r.status_code == 201
        assert_error(c.get(f"/videos/{b['session_id']}"), 410, "session_expired")
        # a video larger than the whole budget is refused, and nothing is kept of it
        store.budget_bytes = 1000
        r = c.post("/videos", files={"video": ("clip.mp4", clip.read_bytes(), "video/mp4")})
        assert_error(r, 413, "session_too_large", "--memory-budget-mb", "video")
        deadline = time.monotonic() + 10
        while predictor.session_ids() or list(workdir.iterdir()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # a propagation stops before its session passes the budget (others evicted to make
        # room, as for any session that grows): the session keeps the frames done
        store.budget_bytes = 2**30
        d = upload(c, clip)["session_id"]
        r = c.post(f"/videos/{d}/prompt", json={"frame_index": 0, "text": TEXT})
        assert r.status_code == 200
        # room for a few frames' features and memories (about 150 kB a frame here)
        store.budget_bytes = c.get(f"/videos/{d}").json()["bytes"] + 700_000
        r = c.post(f"/videos/{d}/propagate", json={"direction": "forward"})
        job = wait_job(c, d, r.json()["job_id"])
        assert job["status"] == "failed" and 1 <= job["done"] < NUM_FRAMES - 1, job
        assert "above the server's memory budget" in job["error"]
        assert "--memory-budget-mb" in job["error"] and "frames done are kept" in job["error"]
        assert "\n" not in job["error"] and "Traceback" not in job["error"]
        # the log has the stop in one line (no traceback), and the evictions
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
        assert "Traceback" not in caplog.text
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(job["job_id"] in m and "stopped after" in m for m in warned), warned
        messages = [r.getMessage() for r in caplog.records]
        assert f"video session {a['session_id']} was evicted" in " ".join(messages)
        stats = c.get("/health").json()["sessions"]
        assert stats["bytes"] == c.get(f"/videos/{d}").json()["bytes"] <= store.budget_bytes
        assert c.get(f"/videos/{d}/frames/0").json()["has_results"] is True


# -- bad requests ----------------------------------------------------------------------------


def test_bad_requests_name_the_problem(client, clip):
    sid = upload(client, clip)["session_id"]

    def prompt(**body):
        return client.post(f"/videos/{sid}/prompt", json=body)

    assert_error(prompt(frame_index=8, text=TEXT), 400, "invalid_frame", "0-7")
    assert_error(prompt(frame_index=0), 400, "empty_prompt")
    assert_error(prompt(frame_index=0, text=TEXT, points=[[1, 1]]), 400, "invalid_prompt", "text")
    assert_error(prompt(frame_index=0, text="  "), 400, "invalid_prompt", "blank")
    assert_error(prompt(frame_index=0, text=TEXT, obj_id=3), 400, "invalid_prompt", "obj_id")
    r = prompt(frame_index=0, points=[[1, 1], [2, 2]], labels=[1])
    assert_error(r, 400, "invalid_prompt", "1 entries for 2 points")
    assert_error(prompt(frame_index=0, points=[[81, 5]]), 400, "invalid_prompt", "outside")
    r = prompt(frame_index=0, boxes=[[30, 30, 10, 40]])
    assert_error(r, 400, "invalid_prompt", "x1 > x0")
    assert_error(prompt(frame_index=0, text=TEXT, bogus=1), 422, "invalid_request", "bogus")
    assert_error(prompt(frame_index=-1, text=TEXT), 422, "invalid_request", "frame_index")
    assert_error(client.post(f"/videos/{sid}/propagate", json={}), 409, "nothing_to_propagate")
    r = client.post(f"/videos/{sid}/propagate", json={"direction": "sideways"})
    assert_error(r, 422, "invalid_request", "direction")
    assert prompt(frame_index=1, text=TEXT).status_code == 200
    r = client.post(f"/videos/{sid}/propagate", json={"start_frame_index": 9})
    assert_error(r, 400, "invalid_frame", "start_frame_index 9")
    assert_error(client.delete(f"/videos/{sid}/objects/999"), 404, "object_not_found", "999")
    assert_error(client.get(f"/videos/{sid}/frames/8.jpg"), 400, "invalid_frame")
    assert_error(client.get(f"/videos/{sid}/frames/3/masks/999.png"), 404, "no_such_mask")
    r = client.get(f"/videos/{sid}/frames/1", params={"outputs": "gif"})
    assert_error(r, 400, "invalid_request", "gif")
    assert_error(client.get(f"/videos/{sid}/propagate/nope"), 404, "job_not_found")
    assert_error(client.get("/videos/nope"), 404, "session_not_found", "video")
    # a video's id is not an image session's, nor the other way round
    assert_error(
        client.post(f"/sessions/{sid}/prompt", json={"points": [[1, 1]]}), 404, "session_not_found"
    )
    r = client.post("/sessions", files={"image": ("x.png", png_bytes(make_image(20, 20)))})
    assert_error(client.get(f"/videos/{r.json()['session_id']}"), 404, "session_not_found")
    # and the session still answers
    assert prompt(frame_index=2, text=TEXT).status_code == 200
    assert client.delete(f"/videos/{sid}").status_code == 200
    assert_error(client.get(f"/videos/{sid}"), 404, "session_not_found")


# -- the command line ------------------------------------------------------------------------


def test_serve_command_line_video_mode(monkeypatch, tmp_path, capsys):
    """A SAM 3 checkpoint with the tracker gets the video mode (one model: its detector
    answers the image page); one converted without it, an HF layout or --no-video do not,
    and the page is told why; the video limits reach the app."""
    import json

    import uvicorn

    import paddle_sam.loading as loading
    import paddle_sam.loading.registry as registry
    import paddle_sam.serve
    from paddle_sam.cli import main

    built: dict = {}
    video_model = object()

    def fake_create_app(model, **kwargs):
        built.clear()
        built.update(kwargs, model=model)
        return "app"

    class FakePredictor:
        def __init__(self, model, confidence_threshold):
            self.model, self.threshold = model, confidence_threshold

    def fake_video(source, **kw):
        return video_model, {"checkpoint_path": str(source.path), **kw}

    monkeypatch.setattr(paddle_sam.serve, "create_app", fake_create_app, raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: None)
    monkeypatch.setattr(registry, "load_video_predictor", fake_video)
    monkeypatch.setattr(loading, "load_image_predictor", lambda source, **kw: ("image only", kw))
    monkeypatch.setattr(
        loading, "image_predictor_of_video", lambda v, t: FakePredictor(("detector of", v), t)
    )
    ckpt = tmp_path / "sam3.pt"
    ckpt.write_bytes(b"weights")
    base = ["serve", "--model-type", "sam3", "--port", "0", "--checkpoint", str(ckpt)]

    assert main([*base, "--max-video-frames", "50", "--max-video-seconds", "7.5"]) == 0
    expected = {"checkpoint_path": str(ckpt), "bpe": None, "precision": "fp32"}
    assert built["video"] == (video_model, expected)
    assert built["model"].model == ("detector of", built["video"])
    assert built["video_refusal"] is None
    assert built["max_video_frames"] == 50 and built["max_video_seconds"] == 7.5
    assert built["max_video_pixels"] == 1920 * 1080 and built["max_video_upload_mb"] == 200

    assert main([*base, "--no-video"]) == 0
    assert built["video"] is None and built["model"][0] == "image only"
    assert "--no-video" in built["video_refusal"]

    converted = tmp_path / "sam3_no_tracker.pdparams"
    converted.write_bytes(b"weights")
    sidecar = {"model_type": "sam3", "interactive": False}
    Path(f"{converted}.json").write_text(json.dumps(sidecar))
    assert main([*base[:-1], str(converted)]) == 0
    assert built["video"] is None and "without the tracker" in built["video_refusal"]

    hf = tmp_path / "model.safetensors"
    hf.write_bytes(b"weights")
    assert main([*base[:-1], str(hf)]) == 0
    assert built["video"] is None and "HF transformers layout" in built["video_refusal"]
    # a tracker part with the heads only (what clicks on images need): images only, and why
    from paddle_sam.convert.core import CheckpointMismatchError

    def no_memory(source, **kw):
        raise CheckpointMismatchError("missing keys: maskmem_backbone.mask_downsampler...")

    monkeypatch.setattr(registry, "load_video_predictor", no_memory)
    assert main(base) == 0
    assert built["video"] is None and built["model"][0] == "image only"
    assert "maskmem_backbone" in built["video_refusal"]
    assert "note: no video mode" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--max-video-frames", "0", "--port", "0"])
    assert "--max-video-frames" in capsys.readouterr().err
