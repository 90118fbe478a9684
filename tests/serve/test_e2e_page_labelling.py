"""The page as a labelling tool, in real headless Chromium against a real server with the
bundled models (what `paddle-sam serve` runs without a checkpoint): two objects labelled by
clicks with the class names typed, exported as COCO (read back with pycocotools) and YOLO
segmentation labels, each mask downloaded under its name; the demo model's banner; SAM 3's
status, placeholder and confidence slider. Needs Debian's chromium (see test_e2e_browser).
"""

from __future__ import annotations

import base64
import json

import cv2
import numpy as np
import pytest
from PIL import Image

from paddle_sam.loading import bundled, load_image_predictor, vocabulary
from paddle_sam.serve import create_app
from paddle_sam.train.example import EXAMPLE, INSTANCES
from tests.helpers.server import ThreadedServer, decode_mask_png
from tests.serve.test_e2e_browser import (  # noqa: F401 (browser_page: a fixture)
    ARTIFACTS,
    TOKEN,
    api_mask,
    browser_page,
    click_at,
    open_page,
    overlay_mask,
    wait_version,
)

pytestmark = pytest.mark.browser


def interior_point(instances: np.ndarray, k: int) -> tuple[int, int]:
    """The pixel of instance ``k`` farthest from its edge (x, y)."""
    inside = (instances == k).astype(np.uint8)
    d = cv2.distanceTransform(inside, cv2.DIST_L2, 5)
    y, x = np.unravel_index(int(d.argmax()), d.shape)
    return int(x), int(y)


def bundled_app(family: str):
    source = bundled(family)
    if not source.path.is_file():
        pytest.skip(f"the bundled {family} model is not built")
    return create_app(load_image_predictor(source), token=TOKEN, source=source), source


def wait_status(page, prefix: str) -> None:
    page.wait_for_function(
        f"document.getElementById('status').textContent.startsWith({prefix!r})", timeout=60_000
    )


def select(page, object_id: int) -> None:
    page.locator(f"#object-list li[data-id='{object_id}'] .meta").click()
    page.wait_for_function(
        f"document.getElementById('prompt-canvas').dataset.selected === '{object_id}'"
    )


def overlay_rgba(page) -> np.ndarray:
    d = page.evaluate(
        """() => {
          const c = document.getElementById('overlay-canvas');
          const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          return {w: c.width, h: c.height, px: Array.from(px)};
        }"""
    )
    return np.array(d["px"], dtype=np.uint8).reshape(d["h"], d["w"], 4)


def download(page, button: str, tmp_path):
    with page.expect_download() as info:
        page.click(button)
    d = info.value
    path = tmp_path / d.suggested_filename
    d.save_as(path)
    return path


def test_label_two_objects_export_coco_and_yolo(browser_page, tmp_path):  # noqa: F811
    from pycocotools.coco import COCO

    page, errors = browser_page
    app, _ = bundled_app("sam_v1")
    instances = np.asarray(Image.open(INSTANCES))
    h, w = instances.shape
    # the example image's rectangle (instance 1) and star (instance 4)
    labels = {"rectangle": interior_point(instances, 1), "star": interior_point(instances, 4)}
    with ThreadedServer(app) as server:
        open_page(page, server)
        # the demo model says what it is and how to get real weights
        banner = page.locator("#demo-banner")
        assert banner.is_visible()
        text = banner.inner_text()
        assert "synthetic" in text and "paddle-sam download vit_b" in text, text
        # "everything" with the bundled model's lowered generator defaults prefilled
        assert page.locator("#everything-tools").is_visible()
        assert page.locator("#points-per-side").input_value() == "16"
        assert page.locator("#pred-iou").input_value() == "0.5"
        assert page.locator("#stability").input_value() == "0.6"
        assert page.locator("#confidence-label").is_hidden()  # SAM v1 has no threshold

        page.set_input_files("#file-input", str(EXAMPLE))
        wait_status(page, "Ready")
        assert "Click an object" in page.locator("#status").inner_text()
        sid = page.locator("#stage").get_attribute("data-session")

        # object 1: its class name typed, then a click; object 2 the same after "New object"
        version = 0
        for k, (name, (x, y)) in enumerate(labels.items(), 1):
            if k > 1:
                page.click("#add-object-button")
            assert page.locator("#object-list li").count() == k
            page.fill(f"#object-list li[data-id='{k}'] input.name", name)
            click_at(page, (x + 0.5) / w, (y + 0.5) / h)
            version += 1
            wait_version(page, version)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "e2e_page_labelling.png"))

        # each object's mask, downloaded under its class name while it is selected, is the
        # API's for the same click
        masks = {}
        for k, name in enumerate(labels, 1):
            select(page, k)
            points = json.loads(page.locator("#prompt-canvas").get_attribute("data-points"))
            assert len(points) == 1
            link = page.locator("#download-link")
            assert link.get_attribute("download") == f"{name}.png"
            got = decode_mask_png(base64.b64decode(link.get_attribute("href").split(",", 1)[1]))
            want, _ = api_mask(server.url, sid, points)
            np.testing.assert_array_equal(got, want)
            assert 0 < got.sum() < got.size
            masks[name] = got
        # both drawn, each in its own colour, edged in a dark line that no background hides
        shown, _ = overlay_mask(page)
        np.testing.assert_array_equal(shown, masks["rectangle"] | masks["star"])
        rgba = overlay_rgba(page)
        inner = [tuple(rgba[y, x]) for x, y in labels.values()]
        assert inner[0][:3] != inner[1][:3] and all(0 < a < 255 for *_, a in inner), inner
        for m in masks.values():
            outside = np.pad(~m, 1, constant_values=True)
            edge = m & (
                outside[:-2, 1:-1] | outside[2:, 1:-1] | outside[1:-1, :-2] | outside[1:-1, 2:]
            )
            assert (rgba[edge][:, :3] == 0).all() and (rgba[edge][:, 3] > 200).all()

        # COCO: read back with pycocotools, a category per class name as typed, the masks
        # the page's, each bbox the mask's own box
        path = download(page, "#export-coco", tmp_path)
        assert path.name == "example.json"
        coco = COCO(str(path))
        assert coco.loadImgs(1)[0] == {"id": 1, "file_name": "example.png", "height": h, "width": w}
        cats = {c["id"]: c["name"] for c in coco.loadCats(coco.getCatIds())}
        assert cats == {1: "rectangle", 2: "star"}
        anns = coco.loadAnns(coco.getAnnIds())
        assert [cats[a["category_id"]] for a in anns] == ["rectangle", "star"]
        for a in anns:
            m = coco.annToMask(a).astype(bool)
            np.testing.assert_array_equal(m, masks[cats[a["category_id"]]])
            ys, xs = np.nonzero(m)
            x0, y0 = int(xs.min()), int(ys.min())
            assert a["bbox"] == [x0, y0, int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1]
            assert a["area"] == int(m.sum()) and a["iscrowd"] == 0
        assert "rectangle" in page.locator("#status").inner_text()

        # YOLO: a line per object, class ids in the same order, the polygon (normalised)
        # drawn back covering the mask
        path = download(page, "#export-yolo", tmp_path)
        assert path.name == "example.txt"
        lines = path.read_text().splitlines()
        assert [int(line.split()[0]) for line in lines] == [0, 1]
        for line, name in zip(lines, labels, strict=True):
            xy = np.array(line.split()[1:], dtype=np.float64).reshape(-1, 2)
            assert len(xy) >= 3 and (xy >= 0).all() and (xy <= 1).all()
            drawn = np.zeros((h, w), np.uint8)
            cv2.fillPoly(drawn, [np.round(xy * [w, h]).astype(np.int32)], 1)
            m = masks[name]
            iou = (m & (drawn > 0)).sum() / (m | (drawn > 0)).sum()
            assert iou > 0.9, (name, iou)
        assert (
            page.locator("#class-list")
            .inner_text()
            .startswith("Class ids (COCO id − 1, YOLO id), kept for this tab: 0 rectangle · 1 star")
        )

        # delete the rectangle: the star keeps its class id in the next export
        page.locator("#object-list li[data-id='1'] .delete").click()
        wait_version(page, version + 1)
        assert page.locator("#object-list li").count() == 1
        np.testing.assert_array_equal(overlay_mask(page)[0], masks["star"])
        lines = download(page, "#export-yolo", tmp_path).read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith("1 ")
        coco = COCO(str(download(page, "#export-coco", tmp_path)))
        assert [a["category_id"] for a in coco.loadAnns(coco.getAnnIds())] == [2]
    assert errors == []


def test_bundled_sam3_status_placeholder_and_threshold(browser_page):  # noqa: F811
    """The bundled SAM 3 takes no clicks: the page does not ask for them, suggests a phrase of
    its vocabulary, names the demo model; the confidence slider reruns the text, and an empty
    answer says the threshold it was under."""
    import httpx

    page, errors = browser_page
    app, source = bundled_app("sam3")
    vocab = vocabulary(source)
    with ThreadedServer(app) as server:
        open_page(page, server, "model sam3")
        text = page.locator("#demo-banner").inner_text()
        assert "paddle-sam download sam3" in text and "red star" in text, text
        placeholder = page.locator("#text-input").get_attribute("placeholder")
        assert any(f"'{p}'" in placeholder for p in vocab) and "dog" not in placeholder
        assert page.locator("#confidence-label").is_visible()
        assert page.locator("#confidence-value").inner_text() == "0.50"
        assert page.locator("#everything-tools").is_hidden()
        assert page.locator("#negative-label").is_hidden()

        page.set_input_files("#file-input", str(EXAMPLE))
        wait_status(page, "Ready")
        status = page.locator("#status").inner_text()
        assert "Click" not in status and "Type what to find" in status, status
        sid = page.locator("#stage").get_attribute("data-session")

        page.fill("#text-input", "star")
        page.press("#text-input", "Enter")
        wait_version(page, 1)
        r = httpx.post(
            f"{server.url}/sessions/{sid}/prompt",
            json={"text": "star"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        scores = [m["score"] for m in r.json()["masks"]]
        assert len(scores) >= 1 and max(scores) < 0.99
        n = len(scores)
        assert page.locator("#status").inner_text().startswith(f"{n} instance")
        assert page.locator("#object-list li").count() == n
        assert page.locator("#object-list li input.name").first.input_value() == "star"

        # the slider above every score: the text runs again and finds nothing, and says so
        page.evaluate(
            """() => {
              const s = document.getElementById('confidence-input');
              s.value = '0.99';
              s.dispatchEvent(new Event('change'));
            }"""
        )
        wait_version(page, 2)
        status = page.locator("#status").inner_text()
        assert status.startswith("Nothing found above the confidence threshold 0.99"), status
        assert page.locator("#object-list li").count() == 1
        assert page.locator("#object-list li .meta").inner_text() == "nothing found"
        assert overlay_mask(page)[1]["area"] == 0
        # a phrase outside the demo model's vocabulary is named as such
        page.fill("#text-input", "a dog")
        page.press("#text-input", "Enter")
        page.wait_for_function(
            "document.getElementById('status').textContent.includes('not a phrase')"
        )
    assert errors == []
