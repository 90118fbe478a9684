"""The video page in real headless Chromium (Playwright) against a real uvicorn server, with
SAM 3's dense video model at the tiny test size (random weights, thresholds lowered).

End to end as a user: open the page at the address ``paddle-sam serve`` prints (with its
token), upload a video through the file picker, step to a frame and type a concept, propagate
(the progress shown), scrub with the buttons, the keyboard and the slider, correct an object
with a click and propagate again, download the results JSON and the overlay MP4. At every
step the overlay drawn on the canvas is checked pixel for pixel against the API's masks of
that frame (each object in its colour, the MP4's), and the frame drawn against the video's
frame. Saves screenshots under test-artifacts/. Needs Debian's chromium at /usr/bin/chromium;
skips locally without it, fails in CI (as tests/serve/test_e2e_browser.py).
"""

from __future__ import annotations

import base64
import json

import cv2
import httpx
import numpy as np
from pycocotools import mask as mask_utils

from paddle_sam.predict.track_outputs import obj_color
from paddle_sam.serve import create_app
from tests.helpers.server import VIDEO_SETTINGS, ThreadedServer, tiny_sam3_video_model
from tests.helpers.video import scene, write_mp4
from tests.serve.test_e2e_browser import (  # noqa: F401 - the fixture is used by name
    ARTIFACTS,
    AUTH,
    TOKEN,
    browser_page,
    pytestmark,
)
from tests.serve.test_serve_video import TEXT

NUM_FRAMES, H, W = 8, 90, 120

CANVAS_JS = """(id) => {
  const c = document.getElementById(id);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let s = '';
  for (let i = 0; i < d.length; i += 8192) s += String.fromCharCode(...d.subarray(i, i + 8192));
  return {w: c.width, h: c.height, rgba: btoa(s), frame: c.dataset.frame,
          version: Number(c.dataset.version), objects: c.dataset.objects};
}"""


def canvas(page, canvas_id: str) -> tuple[np.ndarray, dict]:
    d = page.evaluate(CANVAS_JS, canvas_id)
    rgba = np.frombuffer(base64.b64decode(d["rgba"]), np.uint8).reshape(d["h"], d["w"], 4)
    return rgba, d


def api_frame(url: str, sid: str, i: int) -> list[dict]:
    r = httpx.get(f"{url}/videos/{sid}/frames/{i}", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["objects"]


def decode(rle: dict) -> np.ndarray:
    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}) > 0


def check_overlay(page, url: str, sid: str, i: int) -> list[dict]:
    """The overlay shows frame ``i``'s objects as the API gives them: every object's mask in
    its colour (higher ids drawn over lower ones), nothing elsewhere; the frame under it is
    the video's frame ``i``."""
    objects = api_frame(url, sid, i)
    rgba, d = canvas(page, "overlay-canvas")
    assert d["frame"] == str(i)
    assert json.loads(d["objects"]) == sorted(o["obj_id"] for o in objects)
    label = np.full((H, W), -1)
    for o in sorted(objects, key=lambda o: o["obj_id"]):
        label[decode(o["rle"])] = o["obj_id"]
    np.testing.assert_array_equal(rgba[..., 3] > 0, label >= 0)
    for o in objects:
        where = label == o["obj_id"]
        if where.any():
            err = np.abs(rgba[where][:, :3].astype(int) - np.asarray(obj_color(o["obj_id"])))
            assert err.max() <= 3, (o["obj_id"], err.max())
    image, d = canvas(page, "image-canvas")
    assert d["frame"] == str(i)
    frames = scene(NUM_FRAMES, H, W)
    errs = [np.abs(image[..., :3].astype(int) - f.astype(int)).mean() for f in frames]
    assert int(np.argmin(errs)) == i and errs[i] < 8, errs
    return objects


def wait_overlay(page, frame: int, after_version: int) -> None:
    page.wait_for_function(
        "([f, v]) => { const c = document.getElementById('overlay-canvas');"
        " return c.dataset.frame === String(f) && Number(c.dataset.version) > v; }",
        arg=[frame, after_version],
        timeout=60_000,
    )


def version(page) -> int:
    return int(page.locator("#overlay-canvas").get_attribute("data-version"))


def wait_status(page, pattern: str) -> None:
    page.wait_for_function(
        f"new RegExp({pattern!r}).test(document.getElementById('status').textContent)",
        timeout=120_000,
    )


def click_at(page, x: float, y: float, button: str = "left") -> None:
    """A click on video pixel (x, y), through the canvas's display scale."""
    box = page.locator("#prompt-canvas").bounding_box()
    page.mouse.click(
        box["x"] + x / W * box["width"], box["y"] + y / H * box["height"], button=button
    )


def test_video_page_end_to_end(browser_page, tmp_path):  # noqa: F811 - the fixture
    page, errors = browser_page
    path = write_mp4(scene(NUM_FRAMES, H, W), tmp_path / "clip.mp4")
    model = tiny_sam3_video_model(seed=0, **VIDEO_SETTINGS)
    with ThreadedServer(create_app(model, token=TOKEN)) as server:
        url = server.url
        page.goto(f"{url}/video#token={TOKEN}")
        page.wait_for_function(
            "document.getElementById('model-info').textContent.startsWith('model sam3')"
        )
        assert "token" not in page.url
        # every status the page shows, to check the propagation's progress afterwards
        page.evaluate(
            """() => { window.statuses = [];
              new MutationObserver(() => window.statuses.push(
                document.getElementById('status').textContent)).observe(
                document.getElementById('status'), {childList: true, characterData: true,
                subtree: true}); }"""
        )
        page.set_input_files("#file-input", str(path))
        wait_status(page, "^Ready: 120×90, 8 frames")
        sid = page.locator("#stage").get_attribute("data-session")
        assert sid
        check_overlay(page, url, sid, 0)  # nothing yet

        # step to frame 2 and type the concept
        page.click("#next-button")
        v = version(page)
        page.click("#next-button")
        wait_overlay(page, 2, v)
        v = version(page)
        page.fill("#text-input", TEXT)
        page.press("#text-input", "Enter")
        wait_overlay(page, 2, v)
        detected = check_overlay(page, url, sid, 2)
        assert len(detected) >= 2, "the test needs several detected objects"
        chips = page.locator("#objects .object").all()
        assert [int(c.get_attribute("data-obj-id")) for c in chips] == sorted(
            o["obj_id"] for o in detected
        )

        # propagate both ways: progress shown, then every frame scrubbable
        page.click("#propagate-button")
        wait_status(page, "^Propagated over 8 frames")
        statuses = page.evaluate("window.statuses")
        assert any(s.startswith("Propagating… ") and s.endswith("of 8 frames") for s in statuses)
        ARTIFACTS.mkdir(exist_ok=True)
        v = version(page)
        page.keyboard.press("ArrowRight")  # to frame 3
        wait_overlay(page, 3, v)
        check_overlay(page, url, sid, 3)
        page.screenshot(path=str(ARTIFACTS / "e2e_browser_video.png"))
        v = version(page)
        page.evaluate(
            "() => { const s = document.getElementById('frame-slider'); s.value = '6';"
            " s.dispatchEvent(new Event('input')); }"
        )
        wait_overlay(page, 6, v)
        shown = check_overlay(page, url, sid, 6)
        assert shown, "objects tracked to frame 6"
        v = version(page)
        page.click("#prev-button")
        wait_overlay(page, 5, v)
        before = check_overlay(page, url, sid, 5)

        # a correction on frame 5: select an object, click a new point of it; propagate again
        target = before[0]["obj_id"]
        page.locator(f'#objects .object[data-obj-id="{target}"]').click()
        v = version(page)
        click_at(page, 100, 70)
        wait_overlay(page, 5, v)
        after = check_overlay(page, url, sid, 5)
        points = json.loads(page.locator("#prompt-canvas").get_attribute("data-points"))
        assert len(points) == 1 and points[0][0] == target and points[0][3] == 1
        assert abs(points[0][1] - 100) < 1 and abs(points[0][2] - 70) < 1
        mask_before = decode(next(o for o in before if o["obj_id"] == target)["rle"])
        mask_after = decode(next(o for o in after if o["obj_id"] == target)["rle"])
        assert (mask_before != mask_after).any(), "the click changed the object's mask"
        info = httpx.get(f"{url}/videos/{sid}", headers=AUTH).json()
        assert info["changed_objects"] == [target] and info["needs_propagation"] is True
        assert "Propagate" in page.locator("#status").inner_text()
        page.click("#propagate-button")
        wait_status(page, "^Propagated over 8 frames")
        assert httpx.get(f"{url}/videos/{sid}", headers=AUTH).json()["needs_propagation"] is False
        v = version(page)
        page.keyboard.press("ArrowRight")
        wait_overlay(page, 6, v)
        check_overlay(page, url, sid, 6)

        # downloads, saved by the browser: the API's JSON, an MP4 of the 8 frames
        with page.expect_download() as download:
            page.click("#json-button")
        saved = tmp_path / "results.json"
        download.value.save_as(saved)
        assert download.value.suggested_filename == "clip_results.json"
        want = httpx.get(f"{url}/videos/{sid}/results.json", headers=AUTH).json()
        assert json.loads(saved.read_text()) == want
        for i in (2, 6):
            on_frame = {o["obj_id"]: o["rle"] for o in api_frame(url, sid, i)}
            for ann in want["annotations"]:
                if ann["obj_id"] in on_frame:
                    np.testing.assert_array_equal(
                        decode(ann["segmentations"][i]), decode(on_frame[ann["obj_id"]])
                    )
        with page.expect_download() as download:
            page.click("#mp4-button")
        saved = tmp_path / "overlay.mp4"
        download.value.save_as(saved)
        cap = cv2.VideoCapture(str(saved))
        count = 0
        while cap.read()[0]:
            count += 1
        size = (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        cap.release()
        assert count == NUM_FRAMES and size == (W, H)
        page.screenshot(path=str(ARTIFACTS / "e2e_browser_video_corrected.png"))
    assert errors == [], errors
