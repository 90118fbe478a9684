"""The video page in real headless Chromium with the bundled SAM 2.1 video model, as
``paddle-sam serve --model-type sam2`` serves it offline: the bundled example clip uploaded,
its first object clicked on frame 0, propagated, and every frame's mask (the API's, drawn on
the page pixel for pixel) compared with the clip's ground truth: mean IoU >= 0.7, the figure
`make demo` prints for the same click. Needs Debian's chromium (see test_e2e_browser)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paddle_sam.loading import image_predictor_of_video, load_video_predictor, resolve
from paddle_sam.loading.sam2 import DEFAULT_SAM2_MODEL
from paddle_sam.serve import create_app
from paddle_sam.train.clips import read_clip_truth
from paddle_sam.train.example import EXAMPLE_CLIP
from paddle_sam.train.sam2.evaluate import frame_ious
from tests.helpers.server import ThreadedServer
from tests.serve.test_e2e_browser import (  # noqa: F401 - browser_page is a fixture
    ARTIFACTS,
    TOKEN,
    browser_page,
)
from tests.serve.test_e2e_browser_video import (
    api_frame,
    canvas,
    decode,
    version,
    wait_overlay,
    wait_status,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings(
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
    ),
]


def test_bundled_video_model_tracks_the_example_clip(browser_page):  # noqa: F811 - fixture
    page, errors = browser_page
    truth = read_clip_truth(EXAMPLE_CLIP)
    h, w, n = truth["height"], truth["width"], truth["frames"]
    x, y = truth["objects"][0]["point"]
    gt = truth["objects"][0]["masks"]
    source = resolve(model_type="sam2")  # what serve --model-type sam2 loads
    assert source.path == DEFAULT_SAM2_MODEL
    video = load_video_predictor(source)
    app = create_app(image_predictor_of_video(video), token=TOKEN, video=video, source=source)
    with ThreadedServer(app) as server:
        url = server.url
        page.goto(f"{url}/video#token={TOKEN}")
        page.wait_for_function(
            "document.getElementById('model-info').textContent.startsWith('model sam2')"
        )
        page.set_input_files("#file-input", str(EXAMPLE_CLIP))
        wait_status(page, f"^Ready: {w}×{h}, {n} frames")
        sid = page.locator("#stage").get_attribute("data-session")
        wait_overlay(page, 0, 0)
        v = version(page)
        box = page.locator("#prompt-canvas").bounding_box()
        page.mouse.click(box["x"] + x / w * box["width"], box["y"] + y / h * box["height"])
        wait_overlay(page, 0, v)
        page.click("#propagate-button")
        wait_status(page, f"^Propagated over {n} frames")
        pred = np.zeros_like(gt)
        for i in range(n):
            objects = api_frame(url, sid, i)
            assert [o["obj_id"] for o in objects] in ([1], [])
            if objects:
                pred[i] = decode(objects[0]["rle"])
        ious = frame_ious(pred, gt)
        assert ious.mean() >= 0.7, ious.round(2).tolist()
        # what the page draws is the API's mask: the last frame, reached with the keyboard
        for i in range(1, n):
            v = version(page)
            page.keyboard.press("ArrowRight")
            wait_overlay(page, i, v)
        rgba, d = canvas(page, "overlay-canvas")
        assert d["frame"] == str(n - 1) and json.loads(d["objects"]) == [1]
        np.testing.assert_array_equal(rgba[..., 3] > 0, pred[n - 1])
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "e2e_browser_bundled_video.png"))
    assert errors == [], errors
