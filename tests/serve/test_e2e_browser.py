"""The web page in real headless Chromium (Playwright) against a real uvicorn server.

Uploads an image through the file picker, clicks, right-clicks and drags a box, and checks
that the mask drawn on the overlay canvas is, pixel for pixel, the API's mask for the same
prompts. The servers require a token, which the page takes from the address's ``#token=``
as ``paddle-sam serve --token`` prints it. Saves a screenshot under test-artifacts/. Needs
Debian's chromium at /usr/bin/chromium (``make test`` installs it); skips locally without
it, fails in CI.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from paddle_sam.serve import create_app
from tests.helpers.ci import missing
from tests.helpers.pairs import image as make_image
from tests.helpers.server import ThreadedServer, decode_mask_png, png_bytes, tiny_model

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TOKEN = "e2e-test-token_0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# without the background-networking flags Chromium's own connections fail on a closed network
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _require_browser():
    if not CHROMIUM.exists():
        missing(f"{CHROMIUM} not installed (apt-get install -y chromium; make test does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        missing(f"playwright not installed ({exc}; pip install -e '.[test]')")
    return sync_playwright


@pytest.fixture
def browser_page(tmp_path):
    sync_playwright = _require_browser()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh user-data dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 1100, "height": 800},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            yield page, errors
        finally:
            context.close()
            shutil.rmtree(tmp_path / "profile", ignore_errors=True)


OVERLAY_MASK_JS = """() => {
  const c = document.getElementById('overlay-canvas');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let bits = '';
  for (let i = 3; i < d.length; i += 4) bits += d[i] > 0 ? '1' : '0';
  return {w: c.width, h: c.height, bits, version: Number(c.dataset.version),
          score: Number(c.dataset.score), area: Number(c.dataset.area)};
}"""


def overlay_mask(page) -> tuple[np.ndarray, dict]:
    d = page.evaluate(OVERLAY_MASK_JS)
    bits = np.frombuffer(d["bits"].encode(), dtype=np.uint8) == ord("1")
    return bits.reshape(d["h"], d["w"]), d


def api_mask(url: str, sid: str, points, box=None) -> tuple[np.ndarray, float]:
    body = {
        "points": [p[:2] for p in points],
        "labels": [int(p[2]) for p in points],
        "box": box,
        "outputs": ["png"],
    }
    r = httpx.post(f"{url}/sessions/{sid}/prompt", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    m = r.json()["masks"][0]
    return decode_mask_png(base64.b64decode(m["png"])), m["score"]


def click_at(page, fx: float, fy: float, button: str = "left") -> None:
    box = page.locator("#prompt-canvas").bounding_box()
    page.mouse.click(box["x"] + fx * box["width"], box["y"] + fy * box["height"], button=button)


def open_page(page, server: ThreadedServer, model_info: str = "model ") -> None:
    """The page at the address the server prints (``/#token=...``): it loads, reads the
    token, takes it out of the address bar and reaches the API with it."""
    page.goto(f"{server.url}/#token={TOKEN}")
    page.wait_for_function(
        f"document.getElementById('model-info').textContent.startsWith({model_info!r})"
    )
    assert "token" not in page.url


def wait_version(page, v: int) -> None:
    page.wait_for_function(
        f"Number(document.getElementById('overlay-canvas').dataset.version) >= {v}",
        timeout=30_000,
    )


# taller than the page shows it (78% of an 800 px viewport): clicks are mapped through the
# canvas's display scale
H, W = 900, 700


def test_upload_click_overlay_matches_api(browser_page, tmp_path):
    page, errors = browser_page
    img = make_image(H, W, seed=5)
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(img))
    with ThreadedServer(create_app(tiny_model(seed=1), token=TOKEN)) as server:
        # without the token the page loads and says what it needs; the API refuses it
        page.goto(server.url + "/")
        page.wait_for_function(
            "document.getElementById('model-info').textContent === 'token needed'"
        )
        assert "#token=" in page.locator("#status").inner_text()
        assert httpx.get(f"{server.url}/health").status_code == 401
        errors.clear()  # the browser logs the 401
        open_page(page, server)
        assert page.locator("#text-form").is_hidden()  # SAM v1 takes no text

        page.set_input_files("#file-input", str(path))
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('Ready')", timeout=60_000
        )
        sid = page.locator("#stage").get_attribute("data-session")
        assert sid
        shown_height = page.locator("#prompt-canvas").bounding_box()["height"]
        assert shown_height < 0.8 * H  # displayed scaled down

        # left click: a positive point; the overlay shows the API's mask for that point
        click_at(page, 0.35, 0.55)
        wait_version(page, 1)
        points = page.evaluate(
            "JSON.parse(document.getElementById('prompt-canvas').dataset.points)"
        )
        assert len(points) == 1 and points[0][2] == 1
        shown, info = overlay_mask(page)
        assert shown.shape == img.shape[:2]
        want, score = api_mask(server.url, sid, points)
        assert 0 < want.sum() < want.size, "the test needs a non-trivial mask"
        np.testing.assert_array_equal(shown, want)
        assert info["area"] == int(want.sum())
        assert info["score"] == pytest.approx(score, abs=1e-4)
        assert page.locator("#score").inner_text().startswith("score ")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "e2e_browser_click.png"))

        # right click: a negative point
        click_at(page, 0.7, 0.3, button="right")
        wait_version(page, 2)
        points = page.evaluate(
            "JSON.parse(document.getElementById('prompt-canvas').dataset.points)"
        )
        assert [p[2] for p in points] == [1, 0]
        shown, _ = overlay_mask(page)
        np.testing.assert_array_equal(shown, api_mask(server.url, sid, points)[0])

        # drag: a box, together with both points
        b = page.locator("#prompt-canvas").bounding_box()
        page.mouse.move(b["x"] + 0.1 * b["width"], b["y"] + 0.2 * b["height"])
        page.mouse.down()
        page.mouse.move(b["x"] + 0.6 * b["width"], b["y"] + 0.5 * b["height"], steps=5)
        page.mouse.move(b["x"] + 0.8 * b["width"], b["y"] + 0.9 * b["height"], steps=5)
        page.mouse.up()
        wait_version(page, 3)
        box = page.evaluate("JSON.parse(document.getElementById('prompt-canvas').dataset.box)")
        assert box[0] == pytest.approx(0.1 * W, abs=3) and box[3] == pytest.approx(0.9 * H, abs=3)
        shown, _ = overlay_mask(page)
        last = httpx.get(f"{server.url}/sessions/{sid}/masks/0.png", headers=AUTH).content
        np.testing.assert_array_equal(shown, decode_mask_png(last))  # the server's last answer
        np.testing.assert_array_equal(shown, api_mask(server.url, sid, points, box)[0])

        # undo removes the box: back to the two points' mask
        page.click("#undo-button")
        wait_version(page, 4)
        shown, _ = overlay_mask(page)
        np.testing.assert_array_equal(shown, api_mask(server.url, sid, points)[0])

        href = page.locator("#download-link").get_attribute("href")
        assert href.startswith("data:image/png;base64,")
        page.screenshot(path=str(ARTIFACTS / "e2e_browser.png"))

        # "3 masks": one button per candidate; choosing one shows that mask
        page.check("#multimask-toggle")
        wait_version(page, 5)
        assert page.locator("#mask-choices button").count() == 3
        page.locator("#mask-choices button").nth(2).click()
        wait_version(page, 6)
        shown, _ = overlay_mask(page)
        last = httpx.get(f"{server.url}/sessions/{sid}/masks/2.png", headers=AUTH).content
        np.testing.assert_array_equal(shown, decode_mask_png(last))

        # "Segment everything": a background job with a progress bar, then every mask drawn,
        # each an object added to the one labelled above. A random tiny model passes none of
        # the default quality filters: turn them off here (and use fewer points, in 4
        # batches, to keep the test short).
        labelled, _ = overlay_mask(page)
        assert page.locator("#points-per-side").input_value() == "32"  # upstream's defaults
        assert page.locator("#pred-iou").input_value() == "0.88"
        jobs = []

        def no_filters(route):
            body = {**json.loads(route.request.post_data), "pred_iou_thresh": 0.0}
            body.update(stability_score_thresh=0.0, points_per_side=8, points_per_batch=16)
            route.continue_(post_data=json.dumps(body))

        page.route("**/everything", no_filters)
        page.on(
            "response",
            lambda r: jobs.append(r.url) if "/everything/" in r.url else None,
        )
        page.click("#everything-button")
        page.wait_for_function(
            "/^\\d+ masks? in/.test(document.getElementById('status').textContent)",
            timeout=60_000,
        )
        job = httpx.get(jobs[-1], headers=AUTH).json()
        assert job["status"] == "done" and len(job["masks"]) > 0
        assert page.locator("#status").inner_text().startswith(f"{len(job['masks'])} mask")
        union = np.zeros(img.shape[:2], bool)
        for m in job["masks"]:
            rle = {
                "size": m["segmentation"]["size"],
                "counts": m["segmentation"]["counts"].encode(),
            }
            union |= mask_utils.decode(rle).astype(bool)
        shown, _ = overlay_mask(page)
        # the page's RLE decoder draws every mask
        np.testing.assert_array_equal(shown, union | labelled)
        assert page.locator("#object-list li").count() == 1 + len(job["masks"])
        # an object found: its download is its mask, under its name
        page.locator("#object-list li[data-id='2'] .meta").click()
        link = page.locator("#download-link")
        page.wait_for_function(
            "document.getElementById('download-link').download === 'object_2.png'"
        )
        got = decode_mask_png(base64.b64decode(link.get_attribute("href").split(",", 1)[1]))
        rle = job["masks"][0]["segmentation"]
        want = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()})
        np.testing.assert_array_equal(got, want.astype(bool))
        page.screenshot(path=str(ARTIFACTS / "e2e_browser_everything.png"))

        # drag and drop another image: a new session replaces the old one, once the page has
        # asked whether to drop the objects not exported
        dialogs = []

        def accept(dialog):
            dialogs.append(dialog.message)
            dialog.accept()

        page.once("dialog", accept)
        other = make_image(100, 150, seed=6)
        page.evaluate(
            """async (b64) => {
              const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
              const dt = new DataTransfer();
              dt.items.add(new File([bytes], 'dropped.png', {type: 'image/png'}));
              const zone = document.getElementById('drop-zone');
              zone.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true}));
            }""",
            base64.b64encode(png_bytes(other)).decode(),
        )
        page.wait_for_function(
            f"document.getElementById('stage').dataset.session !== {sid!r} && "
            "document.getElementById('status').textContent.startsWith('Ready')",
            timeout=60_000,
        )
        assert page.evaluate("document.getElementById('overlay-canvas').width") == 150
        assert len(dialogs) == 1 and "dropped.png" in dialogs[0], dialogs
        assert page.locator("#object-list li").count() == 1  # a fresh, empty object
        assert overlay_mask(page)[1]["area"] == 0
        # the page freed it
        assert httpx.get(f"{server.url}/sessions/{sid}", headers=AUTH).status_code == 404
        assert errors == []

        # the server evicts the page's session: the next click re-uploads and still answers
        dropped = page.locator("#stage").get_attribute("data-session")
        store = server.server.config.app.state.store
        budget, store.budget_bytes = store.budget_bytes, other.nbytes + 40_000
        try:
            r = httpx.post(
                f"{server.url}/sessions",
                files={"image": ("x.png", png_bytes(other))},
                headers=AUTH,
            )
            assert r.status_code == 201
        finally:
            store.budget_bytes = budget
        assert httpx.get(f"{server.url}/sessions/{dropped}", headers=AUTH).status_code == 410
        version = int(page.locator("#overlay-canvas").get_attribute("data-version"))
        click_at(page, 0.5, 0.5)
        wait_version(page, version + 1)
        fresh = page.locator("#stage").get_attribute("data-session")
        assert fresh != dropped
        points = page.evaluate(
            "JSON.parse(document.getElementById('prompt-canvas').dataset.points)"
        )
        page.uncheck("#multimask-toggle")  # it was left on above: one mask again
        wait_version(page, version + 2)
        shown, _ = overlay_mask(page)
        np.testing.assert_array_equal(shown, api_mask(server.url, fresh, points)[0])
    assert all("status of 410" in e for e in errors), errors  # the browser logs the 410


def test_text_box_for_a_model_that_takes_text(browser_page, tmp_path):
    """The page shows the text box only when /health says the model takes text, and sends it."""
    from paddle_sam.predict.sam_v1.predictor import SamPredictor

    page, errors = browser_page
    seen = []

    class TextPredictor(SamPredictor):
        takes_text = True  # as SAM 3's predictor will declare

        def predict(self, *args, text=None, **kwargs):
            seen.append(text)
            return super().predict(*args, **kwargs)

    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(make_image(120, 160, seed=7)))
    with ThreadedServer(create_app(TextPredictor(tiny_model(seed=2)), token=TOKEN)) as server:
        open_page(page, server)
        assert page.locator("#text-form").is_visible()
        page.set_input_files("#file-input", str(path))
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('Ready')", timeout=60_000
        )
        page.fill("#text-input", "a red disc")
        page.press("#text-input", "Enter")
        wait_version(page, 1)
    assert seen == ["a red disc"]
    assert errors == []


def test_sam3_text_prompt_overlays_every_instance(browser_page, tmp_path):
    """SAM 3: typed text shows every instance found, their union equal to the API's, each an
    object named by the text; a click is refused on the page (no points), a dragged box joins
    the text as an exemplar and replaces the instances found."""
    from paddle_sam.predict.sam3.predictor import Sam3Predictor
    from tests.helpers.server import sam3_threshold, tiny_sam3_model

    page, errors = browser_page
    img = make_image(300, 400, seed=9)
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(img))
    # random weights whose instances cover part of this image (~40%), and differ
    model = tiny_sam3_model(seed=2)
    thr = sam3_threshold(model, img, "a red disc", keep=3)

    def api_union(url, sid, body) -> tuple[np.ndarray, list[float], np.ndarray]:
        r = httpx.post(f"{url}/sessions/{sid}/prompt", json=body, headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
        masks = [decode_mask_png(base64.b64decode(m["png"])) for m in r.json()["masks"]]
        return np.logical_or.reduce(masks), [m["score"] for m in r.json()["masks"]], masks[0]

    app = create_app(Sam3Predictor(model, confidence_threshold=thr), token=TOKEN)
    with ThreadedServer(app) as server:
        open_page(page, server, "model sam3")
        assert page.locator("#text-form").is_visible()
        assert page.locator("#multimask-label").is_hidden()
        assert page.locator("#negative-label").is_hidden()
        page.set_input_files("#file-input", str(path))
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('Ready')", timeout=60_000
        )
        sid = page.locator("#stage").get_attribute("data-session")

        page.fill("#text-input", "a red disc")
        page.press("#text-input", "Enter")
        wait_version(page, 1)
        shown, d = overlay_mask(page)
        union, scores, best = api_union(server.url, sid, {"text": "a red disc"})
        assert len(scores) == 3 and 0 < union.sum() < union.size and (union != best).any()
        assert d["area"] == int(union.sum())
        np.testing.assert_array_equal(shown, union)
        # an object per instance, best first, named by the text, with its score
        rows = page.locator("#object-list li")
        assert rows.count() == 3
        for k, score in enumerate(scores):
            assert rows.nth(k).locator("input.name").input_value() == "a red disc"
            assert rows.nth(k).locator(".meta").inner_text().endswith(f"{score:.3f}")
        assert page.locator("#status").inner_text().startswith("3 instances")
        # the download is the selected object's mask: the best instance, named by its class
        link = page.locator("#download-link")
        got = decode_mask_png(base64.b64decode(link.get_attribute("href").split(",", 1)[1]))
        np.testing.assert_array_equal(got, best)
        assert link.get_attribute("download") == "a_red_disc_1.png"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "e2e_browser_sam3.png"))

        # a click: refused on the page, nothing sent, the overlay stays
        click_at(page, 0.5, 0.5)
        page.wait_for_function(
            "document.getElementById('status').textContent.includes('takes no points')"
        )
        assert (
            page.evaluate("JSON.parse(document.getElementById('prompt-canvas').dataset.points)")
            == []
        )
        np.testing.assert_array_equal(overlay_mask(page)[0], union)

        # drag a box: text + exemplar box
        b = page.locator("#prompt-canvas").bounding_box()
        page.mouse.move(b["x"] + 0.2 * b["width"], b["y"] + 0.2 * b["height"])
        page.mouse.down()
        page.mouse.move(b["x"] + 0.5 * b["width"], b["y"] + 0.6 * b["height"], steps=5)
        page.mouse.up()
        wait_version(page, 2)
        box = page.evaluate("JSON.parse(document.getElementById('prompt-canvas').dataset.box)")
        union, _, _ = api_union(server.url, sid, {"text": "a red disc", "box": box})
        np.testing.assert_array_equal(overlay_mask(page)[0], union)
    assert errors == []


def test_bundled_sam3_text_box_finds_the_star(browser_page):
    """The page with the bundled small SAM 3 (what `paddle-sam serve --model-type sam3` serves
    without a checkpoint), everything local: "star" typed on the example image shows the star,
    IoU >= 0.8 with its ground truth, and nothing else."""
    from paddle_sam.loading.sam3 import DEFAULT_SAM3_MODEL, load_sam3_predictor
    from paddle_sam.train.example import EXAMPLE, concept_check

    if not DEFAULT_SAM3_MODEL.is_file():
        pytest.skip("the default SAM 3 is not built (make train-sam3-default)")
    page, errors = browser_page
    app = create_app(load_sam3_predictor(DEFAULT_SAM3_MODEL), token=TOKEN)
    with ThreadedServer(app) as server:
        open_page(page, server, "model sam3")
        page.set_input_files("#file-input", str(EXAMPLE))
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('Ready')", timeout=60_000
        )
        page.fill("#text-input", "star")
        page.press("#text-input", "Enter")
        wait_version(page, 1)
        shown, _ = overlay_mask(page)
    assert errors == []
    out = ARTIFACTS / "e2e_browser_sam3_default"
    (out / "masks").mkdir(parents=True, exist_ok=True)
    for old in (out / "masks").glob("*.png"):
        old.unlink()
    from paddle_sam.predict.io import save_mask_png

    save_mask_png(shown, out / "masks" / "0.png")
    r = concept_check(out, "star")
    assert r["found"] == r["instances"] == 1, r
