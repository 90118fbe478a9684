"""Both web pages in real headless Chromium (Playwright) with SAM 2: a reduced SAM 2.1 with
random weights (tests/helpers/sam2_ref.py), one video predictor serving the image page and the
video page, as ``paddle-sam serve --checkpoint sam2.1_*.pt`` does.

The image page: what SAM 2 is offered (clicks, boxes, 3 masks, everything, the video page; no
text box, no confidence slider), two objects labelled by clicks and a box with their class
names, each overlay and download pixel for pixel the API's mask, a COCO export read back.
The video page: an MP4 written with OpenCV uploaded, the red square clicked on frame 0,
propagated (the mask follows the square across the frames), a new object by its box, a
correction click with propagation again, the results JSON and the overlay MP4 downloaded. The
overlay is checked pixel for pixel against the API's masks of each frame shown (helpers of
tests/serve/test_e2e_browser_video.py). Needs Debian's chromium (see test_e2e_browser).
"""

from __future__ import annotations

import base64
import json

import cv2
import httpx
import numpy as np
import pytest

from paddle_sam.serve import create_app
from tests.helpers.server import ThreadedServer, decode_mask_png, png_bytes
from tests.helpers.video import scene, write_mp4
from tests.serve.test_e2e_browser import (  # noqa: F401 - browser_page is a fixture
    ARTIFACTS,
    AUTH,
    TOKEN,
    api_mask,
    browser_page,
    click_at,
    open_page,
    overlay_mask,
    wait_version,
)
from tests.serve.test_e2e_browser_video import (
    NUM_FRAMES,
    H,
    W,
    api_frame,
    check_overlay,
    decode,
    version,
    wait_overlay,
    wait_status,
)
from tests.serve.test_e2e_browser_video import click_at as click_video
from tests.serve.test_e2e_page_labelling import download, select

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings(
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
    ),
]

# the scene's shapes (tests/helpers/video.py) at H x W: the red square moves right 5 units a
# frame, the blue disc leaves through the bottom on frames 3-5
SY, SX = H / 60, W / 80


def square(t: int) -> np.ndarray:
    m = np.zeros((H, W), bool)
    x0 = int((8 + 5 * t) * SX)
    m[int(15 * SY) : int(33 * SY), x0 : x0 + int(18 * SX)] = True
    return m


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``paddle-sam serve`` of a SAM 2.1 checkpoint (reduced, random weights): the video
    predictor serves both pages."""
    pytest.importorskip("torch")  # the checkpoint is written as the official .pt, converted
    from paddle_sam.loading.sam2 import build_sam2_video_predictor
    from tests.helpers.sam2_ref import reduced_checkpoint, reduced_spec

    ckpt = reduced_checkpoint(tmp_path_factory.mktemp("sam2_e2e"))[1]
    video = build_sam2_video_predictor(reduced_spec("2.1"), ckpt)
    with ThreadedServer(create_app(video, token=TOKEN)) as s:
        yield s


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


def show_frame(page, i: int) -> None:
    """Frame ``i`` through the slider, drawn."""
    v = version(page)
    page.evaluate(
        "(i) => { const s = document.getElementById('frame-slider'); s.value = String(i);"
        " s.dispatchEvent(new Event('input')); }",
        i,
    )
    wait_overlay(page, i, v)


def test_sam2_image_page(browser_page, server, tmp_path):  # noqa: F811 - the fixture
    from pycocotools.coco import COCO

    page, errors = browser_page
    img = scene(1, H * 2, W * 2)[0]  # 180 x 240: the square and the disc, twice the size
    path = tmp_path / "shapes.png"
    path.write_bytes(png_bytes(img))
    open_page(page, server, "model sam2")
    # SAM 2 takes clicks and boxes: no text box, no SAM 3 threshold; 3 masks, everything and
    # the video page are offered
    assert page.locator("#text-form").is_hidden()
    assert page.locator("#confidence-label").is_hidden()
    assert page.locator("#negative-label").is_visible()
    assert page.locator("#multimask-label").is_visible()
    assert page.locator("#everything-tools").is_visible()
    assert page.locator("#video-link").is_visible()
    assert page.locator("#points-per-side").input_value() == "32"  # upstream's defaults
    hint = page.locator("#drop-hint-keys").inner_text()
    assert hint.startswith("Click an object") and "type" not in hint, hint

    page.set_input_files("#file-input", str(path))
    page.wait_for_function(
        "document.getElementById('status').textContent.startsWith('Ready')", timeout=60_000
    )
    status = page.locator("#status").inner_text()
    assert "Click an object" in status and "type" not in status, status
    sid = page.locator("#stage").get_attribute("data-session")

    # object 1, "square": a click on it, then a negative click on the ground
    page.fill("#object-list li[data-id='1'] input.name", "square")
    click_at(page, 17 / 80, 24 / 60)
    wait_version(page, 1)
    click_at(page, 0.05, 0.9, button="right")
    wait_version(page, 2)
    points = json.loads(page.locator("#prompt-canvas").get_attribute("data-points"))
    assert [p[2] for p in points] == [1, 0]
    shown, info = overlay_mask(page)
    want, score = api_mask(server.url, sid, points)
    assert 0 < want.sum() < want.size, "the test needs a non-trivial mask"
    np.testing.assert_array_equal(shown, want)
    assert info["score"] == pytest.approx(score, abs=1e-4)
    masks = {"square": want}

    # "3 masks": SAM 2's three candidates, each shown when chosen; back to one
    page.check("#multimask-toggle")
    wait_version(page, 3)
    assert page.locator("#mask-choices button").count() == 3
    page.locator("#mask-choices button").nth(1).click()
    wait_version(page, 4)
    last = httpx.get(f"{server.url}/sessions/{sid}/masks/1.png", headers=AUTH).content
    np.testing.assert_array_equal(overlay_mask(page)[0], decode_mask_png(last))
    page.uncheck("#multimask-toggle")
    wait_version(page, 5)
    np.testing.assert_array_equal(overlay_mask(page)[0], masks["square"])

    # object 2, "disc": "+ New object", its name, a box dragged around it
    page.click("#add-object-button")
    page.fill("#object-list li[data-id='2'] input.name", "disc")
    b = page.locator("#prompt-canvas").bounding_box()
    page.mouse.move(b["x"] + 45 / 80 * b["width"], b["y"] + 30 / 60 * b["height"])
    page.mouse.down()
    page.mouse.move(b["x"] + 65 / 80 * b["width"], b["y"] + 50 / 60 * b["height"], steps=5)
    page.mouse.up()
    wait_version(page, 6)
    box = json.loads(page.locator("#prompt-canvas").get_attribute("data-box"))
    assert box[0] == pytest.approx(45 / 80 * 2 * W, abs=3)
    assert box[3] == pytest.approx(50 / 60 * 2 * H, abs=3)
    assert json.loads(page.locator("#prompt-canvas").get_attribute("data-points")) == []
    masks["disc"], _ = api_mask(server.url, sid, [], box)
    assert masks["disc"].any()
    shown, _ = overlay_mask(page)
    np.testing.assert_array_equal(shown, masks["square"] | masks["disc"])
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e_browser_sam2.png"))

    # each object's download is its mask, under its class name
    for k, name in enumerate(masks, 1):
        select(page, k)
        link = page.locator("#download-link")
        assert link.get_attribute("download") == f"{name}.png"
        got = decode_mask_png(base64.b64decode(link.get_attribute("href").split(",", 1)[1]))
        np.testing.assert_array_equal(got, masks[name])
    # COCO: a category per class name, the masks the page's
    coco = COCO(str(download(page, "#export-coco", tmp_path)))
    cats = {c["id"]: c["name"] for c in coco.loadCats(coco.getCatIds())}
    assert cats == {1: "square", 2: "disc"}
    for a in coco.loadAnns(coco.getAnnIds()):
        np.testing.assert_array_equal(coco.annToMask(a).astype(bool), masks[cats[a["category_id"]]])

    # "Segment everything" with SAM 2's generator (filters off, a 4 x 4 grid: short)
    jobs = []

    def small_grid(route):
        body = {**json.loads(route.request.post_data), "points_per_side": 4}
        body.update(pred_iou_thresh=0.0, stability_score_thresh=0.0)
        route.continue_(post_data=json.dumps(body))

    page.route("**/everything", small_grid)
    page.on("response", lambda r: jobs.append(r.url) if "/everything/" in r.url else None)
    page.click("#everything-button")
    page.wait_for_function(
        "/^\\d+ masks? in/.test(document.getElementById('status').textContent)", timeout=60_000
    )
    job = httpx.get(jobs[-1], headers=AUTH).json()
    assert job["status"] == "done" and len(job["masks"]) > 0
    assert page.locator("#object-list li").count() == 2 + len(job["masks"])

    # the video page, linked: it keeps the token (this tab's) and says SAM 2
    page.once("dialog", lambda d: d.accept())  # objects not exported since 'everything'
    page.click("#video-link")
    page.wait_for_function(
        "document.getElementById('model-info').textContent.startsWith('model sam2')"
    )
    assert page.url == f"{server.url}/video"
    assert errors == [], errors


def test_sam2_video_page(browser_page, server, tmp_path):  # noqa: F811 - the fixture
    page, errors = browser_page
    clip = write_mp4(scene(NUM_FRAMES, H, W), tmp_path / "shapes.mp4")
    url = server.url
    prompts: list[dict] = []
    page.on(
        "request",
        lambda r: (
            prompts.append(json.loads(r.post_data))
            if r.method == "POST" and r.url.endswith("/prompt")
            else None
        ),
    )
    page.goto(f"{url}/video#token={TOKEN}")
    page.wait_for_function(
        "document.getElementById('model-info').textContent.startsWith('model sam2')"
    )
    # SAM 2 takes no concept: no text box, and the page does not ask for one
    assert page.locator("#text-form").is_hidden()
    assert page.locator("#text-sep").is_hidden()
    hint = page.locator("#drop-hint-keys").inner_text()
    assert hint.startswith("Click an object") and "concept" not in hint, hint
    page.set_input_files("#file-input", str(clip))
    wait_status(page, "^Ready: 120×90, 8 frames")
    status = page.locator("#status").inner_text()
    assert status.endswith("Click an object or drag a box around it."), status
    sid = page.locator("#stage").get_attribute("data-session")
    wait_overlay(page, 0, 0)  # frame 0 drawn, nothing on it yet
    assert check_overlay(page, url, sid, 0) == []

    # a click on the red square, frame 0: a new object, its mask on the square
    v = version(page)
    click_video(page, 17 * SX, 24 * SY)
    wait_overlay(page, 0, v)
    (obj,) = check_overlay(page, url, sid, 0)
    target = obj["obj_id"]
    assert iou(decode(obj["rle"]), square(0)) > 0.5
    assert page.locator("#status").inner_text().startswith("new object: 1 object on frame 0")
    assert prompts[-1] == {
        "frame_index": 0,
        "outputs": ["rle"],
        "points": [[pytest.approx(17 * SX, abs=1), pytest.approx(24 * SY, abs=1)]],
        "labels": [1],
    }

    # propagate: the mask follows the square to the right, frame after frame
    page.click("#propagate-button")
    wait_status(page, "^Propagated over \\d+ frames")
    centres = []
    for i in range(1, NUM_FRAMES):
        v = version(page)
        page.keyboard.press("ArrowRight")
        wait_overlay(page, i, v)
        (o,) = check_overlay(page, url, sid, i)
        m = decode(o["rle"])
        assert iou(m, square(i)) > 0.5, (i, iou(m, square(i)))
        centres.append(np.nonzero(m)[1].mean())
    assert np.all(np.diff(centres) > 0), centres
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e_browser_sam2_video.png"))

    # frame 2: "New object", a box dragged around the green bar (SAM 2: one object's box, the
    # square's clicks kept)
    show_frame(page, 2)
    page.click("#new-object-button")
    b = page.locator("#prompt-canvas").bounding_box()
    x0, y0, x1, y1 = 58 * SX, 2 * SY, 78 * SX, 12 * SY
    v = version(page)
    page.mouse.move(b["x"] + x0 / W * b["width"], b["y"] + y0 / H * b["height"])
    page.mouse.down()
    page.mouse.move(b["x"] + x1 / W * b["width"], b["y"] + y1 / H * b["height"], steps=5)
    page.mouse.up()
    wait_overlay(page, 2, v)
    objects = check_overlay(page, url, sid, 2)
    assert sorted(o["obj_id"] for o in objects) == [target, target + 1]
    boxes = json.loads(page.locator("#prompt-canvas").get_attribute("data-boxes"))
    assert len(boxes) == 1 and boxes[0][0] == target + 1
    assert boxes[0][1:] == pytest.approx([x0, y0, x1, y1], abs=1)
    assert "boxes" in prompts[-1] and "points" not in prompts[-1]
    assert "obj_id" not in prompts[-1]  # a new object
    info = httpx.get(f"{url}/videos/{sid}", headers=AUTH).json()
    assert info["objects"] == [target, target + 1] and info["changed_objects"] == [target + 1]
    # a click on it (still selected) refines it: its box goes with the click, as SAM 2 would
    # otherwise forget it
    v = version(page)
    click_video(page, 68 * SX, 7 * SY)
    wait_overlay(page, 2, v)
    check_overlay(page, url, sid, 2)
    assert prompts[-1]["obj_id"] == target + 1 and prompts[-1]["labels"] == [1]
    assert prompts[-1]["boxes"] == [pytest.approx([x0, y0, x1, y1], abs=1)]
    assert len(json.loads(page.locator("#prompt-canvas").get_attribute("data-boxes"))) == 1

    # a correction of the square on frame 5: its chip, a negative click on its right half
    show_frame(page, 5)
    before = {o["obj_id"]: decode(o["rle"]) for o in api_frame(url, sid, 5)}
    page.locator(f'#objects .object[data-obj-id="{target}"]').click()
    v = version(page)
    click_video(page, 47 * SX, 24 * SY, button="right")
    wait_overlay(page, 5, v)
    after = {o["obj_id"]: decode(o["rle"]) for o in check_overlay(page, url, sid, 5)}
    assert list(before) == [target] and target in after  # object 2 is not propagated yet
    assert prompts[-1]["obj_id"] == target and prompts[-1]["labels"] == [0]
    assert prompts[-1]["points"] == [[pytest.approx(47 * SX, abs=1), pytest.approx(24 * SY, abs=1)]]
    points = json.loads(page.locator("#prompt-canvas").get_attribute("data-points"))
    assert len(points) == 1 and points[0][0] == target and points[0][3] == 0
    info = httpx.get(f"{url}/videos/{sid}", headers=AUTH).json()
    assert info["needs_propagation"] is True and target in info["changed_objects"]
    page.click("#propagate-button")
    wait_status(page, "^Propagated over \\d+ frames")
    assert httpx.get(f"{url}/videos/{sid}", headers=AUTH).json()["needs_propagation"] is False
    v = version(page)
    page.keyboard.press("ArrowRight")
    wait_overlay(page, 6, v)
    assert sorted(o["obj_id"] for o in check_overlay(page, url, sid, 6)) == [target, target + 1]

    # downloads: the API's results JSON, an MP4 of the 8 frames
    with page.expect_download() as d:
        page.click("#json-button")
    saved = tmp_path / "results.json"
    d.value.save_as(saved)
    assert d.value.suggested_filename == "shapes_results.json"
    want = httpx.get(f"{url}/videos/{sid}/results.json", headers=AUTH).json()
    assert json.loads(saved.read_text()) == want
    for ann in want["annotations"]:
        on_6 = {o["obj_id"]: o["rle"] for o in api_frame(url, sid, 6)}
        np.testing.assert_array_equal(decode(ann["segmentations"][6]), decode(on_6[ann["obj_id"]]))
    with page.expect_download() as d:
        page.click("#mp4-button")
    saved = tmp_path / "overlay.mp4"
    d.value.save_as(saved)
    cap = cv2.VideoCapture(str(saved))
    count = 0
    while cap.read()[0]:
        count += 1
    cap.release()
    assert count == NUM_FRAMES
    page.screenshot(path=str(ARTIFACTS / "e2e_browser_sam2_video_corrected.png"))
    assert errors == [], errors
