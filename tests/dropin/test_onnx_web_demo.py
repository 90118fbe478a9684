"""The exported SAM v1 decoder in onnxruntime-web, in headless Chromium, fed as the official
web demo feeds it, against ``SamPredictor`` on the same image and prompts.

A tiny random SAM is exported with ``export_onnx`` (all masks, and single mask). Our predictor
embeds a generated image; the image, the embedding (.npy), the decoder and onnxruntime-web's
files are served from 127.0.0.1 by a thread of the test, and the page
(``tests/dropin/onnx_web/``) does what the demo does: reads the image's size, builds float32
feeds (clicks times the scale to the model's long side, a padding point (0, 0) labelled -1, a
zero ``mask_input``, ``has_mask_input`` 0, ``orig_im_size`` [h, w]), runs the decoder on the
WebAssembly backend and draws the first output thresholded at 0. Its masks must agree with the
predictor's on >= 99.9 % of the pixels and its scores within 1e-4, for one click, two clicks
(one negative) and a box (fed as its corners labelled 2 and 3, as the notebook feeds it).

onnxruntime-web comes from the npm registry: ``make onnxruntime-web`` (a prerequisite of
``make test``) installs it under ``.cache/onnxruntime-web``. The test skips without it (and
without npm) locally, and fails in CI where npm is there but the package is not.
"""

from __future__ import annotations

import json
import shutil
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("paddle2onnx")

from paddle_sam import SamPredictor  # noqa: E402
from paddle_sam.export.onnx import export_onnx  # noqa: E402
from tests.dropin.test_onnx_recipe import (  # noqa: E402
    MIN_AGREEMENT,
    SCORE_ATOL,
    web_demo_feeds,
)
from tests.helpers.ci import missing  # noqa: E402
from tests.helpers.pairs import image as make_image  # noqa: E402
from tests.helpers.server import tiny_model  # noqa: E402
from tests.serve.test_e2e_browser import (  # noqa: E402, F401 - the fixture is used by name
    browser_page,
)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
PAGE = Path(__file__).resolve().parent / "onnx_web"
ORT_WEB = ROOT / ".cache" / "onnxruntime-web" / "node_modules" / "onnxruntime-web"

# The demo scales clicks by long_side / max(h, w); SamPredictor by the rounded resized size
# over the original (ResizeLongestSide). These sizes (long side 320 for the tiny model's 256)
# make both scales exactly 0.8, so the two get the very same points.
SIZES = {False: (200, 320), True: (320, 240)}  # landscape for all masks, portrait for one


def _ort_web_dist() -> Path:
    """onnxruntime-web's dist folder, or a skip (a failure in CI when npm is there)."""
    dist = ORT_WEB / "dist"
    if (dist / "ort.wasm.min.js").is_file():
        return dist
    if shutil.which("npm") is None:
        pytest.skip("npm not installed, so no onnxruntime-web (sudo apt-get install -y npm)")
    missing(f"onnxruntime-web not installed at {ORT_WEB} (make onnxruntime-web; make test does)")


class _Handler(SimpleHTTPRequestHandler):
    """Static files from a few folders by address prefix; anything else is a 404."""

    extensions_map = {
        **SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
        ".onnx": "application/octet-stream",
        ".npy": "application/octet-stream",
    }

    def __init__(self, *args, roots: dict[str, Path], **kwargs) -> None:
        self.roots = roots
        super().__init__(*args, **kwargs)

    def translate_path(self, path: str) -> str:
        path = unquote(urlsplit(path).path)
        for prefix, root in self.roots.items():
            if path.startswith(prefix):
                root = root.resolve()
                target = (root / path[len(prefix) :]).resolve()
                if target == root or root in target.parents:
                    return str(target)
        return str(Path(self.roots["/"]) / "missing")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base's name
        pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 64  # the browser opens several connections at once


class StaticServer:
    """A threaded HTTP server on a free loopback port (``with`` starts and stops it)."""

    def __init__(self, roots: dict[str, Path]) -> None:
        self.httpd = _Server(("127.0.0.1", 0), partial(_Handler, roots=roots))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> StaticServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=15)


def _expected(predictor, prompt: dict, single: bool, points_fed: int):
    """The predictor's masks and scores as the decoder returns them: all four (the
    single-mask output, then the three multimask outputs), or the one the official rule picks
    (at most two points fed: the best of the three; more: the single-mask output)."""
    one = predictor.predict(**prompt, multimask_output=False)
    three = predictor.predict(**prompt, multimask_output=True)
    masks = np.concatenate([one[0], three[0]])
    scores = np.concatenate([one[1], three[1]])
    if not single:
        return masks, scores
    k = 1 + int(np.argmax(three[1])) if points_fed <= 2 else 0
    return masks[k : k + 1], scores[k : k + 1]


def _page_masks(result: dict) -> np.ndarray:
    """The page's first output, thresholded at 0, as booleans (planes x h x w)."""
    bits = np.frombuffer(result["bits"].encode(), dtype=np.uint8) == ord("1")
    return bits.reshape(result["dims"][1:])


def _canvas_mask(page) -> np.ndarray:
    d = page.evaluate(
        """() => {
          const c = document.getElementById('mask');
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let bits = '';
          for (let i = 3; i < d.length; i += 4) bits += d[i] > 0 ? '1' : '0';
          return {w: c.width, h: c.height, bits};
        }"""
    )
    bits = np.frombuffer(d["bits"].encode(), dtype=np.uint8) == ord("1")
    return bits.reshape(d["h"], d["w"])


@pytest.mark.parametrize("single", [False, True], ids=["all-masks", "single-mask"])
def test_decoder_fed_as_the_web_demo(browser_page, tmp_path, single):  # noqa: F811 - the fixture
    dist = _ort_web_dist()
    page, errors = browser_page
    h, w = SIZES[single]
    model = tiny_model(seed=3)
    export_onnx(model, tmp_path / "onnx", return_single_mask=single)
    img = make_image(h, w, seed=8)
    predictor = SamPredictor(model)
    predictor.set_image(img)

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(tmp_path / "onnx" / "prompt_decoder.onnx", data / "decoder.onnx")
    Image.fromarray(img).save(data / "image.png")
    embedding = predictor.get_image_embedding().numpy().astype(np.float32)
    np.save(data / "embedding.npy", embedding)
    config = {
        "model": "/data/decoder.onnx",
        "image": "/data/image.png",
        "embedding": "/data/embedding.npy",
        "longSide": model.image_encoder.img_size,
        "maskSize": 4 * model.prompt_encoder.image_embedding_size[0],
    }
    (data / "config.json").write_text(json.dumps(config))

    requests: list[str] = []
    failed: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("response", lambda r: r.status < 400 or failed.append(f"{r.status} {r.url}"))
    roots = {"/ort/": dist, "/data/": data, "/": PAGE}
    with StaticServer(roots) as server:
        page.goto(f"{server.url}/index.html")
        page.evaluate("window.demoReady")  # raises with the page's error if set-up failed
        assert page.locator("#status").inner_text() == "ready"

        prompts = {
            "one click": ([(int(0.45 * w), int(0.55 * h), 1)], None),
            "two clicks, one negative": (
                [(int(0.45 * w), int(0.55 * h), 1), (int(0.8 * w), int(0.25 * h), 0)],
                None,
            ),
            "box": ([], [int(0.15 * w), int(0.2 * h), int(0.7 * w), int(0.85 * h)]),
        }
        figures, score_diff = [], 0.0
        for what, (clicks, box) in prompts.items():
            result = page.evaluate(
                "([clicks, box]) => window.segment("
                "clicks.map(([x, y, t]) => ({x, y, clickType: t})), box)",
                [clicks, box],
            )
            assert result["outputNames"] == ["masks", "iou_predictions", "low_res_masks"]
            feeds = result["feeds"]
            assert {k: v["type"] for k, v in feeds.items()} == dict.fromkeys(feeds, "float32")
            if box is None:  # the page's feeds are the ones the recipe test describes
                want = web_demo_feeds(predictor, clicks)
                for name in ("point_coords", "point_labels", "orig_im_size", "has_mask_input"):
                    np.testing.assert_allclose(
                        np.asarray(feeds[name]["data"]).reshape(want[name].shape),
                        want[name],
                        rtol=1e-6,
                        err_msg=f"{what}: {name}",
                    )
                assert feeds["mask_input"]["dims"] == list(want["mask_input"].shape)
                assert not any(feeds["mask_input"]["data"])
            else:
                assert feeds["point_labels"]["data"] == [2.0, 3.0]  # corners, no padding
                scale = config["longSide"] / max(h, w)
                np.testing.assert_allclose(feeds["point_coords"]["data"], np.array(box) * scale)
            coords = np.array([c[:2] for c in clicks]).reshape(-1, 2)
            prompt = (
                {"box": np.array(box)}
                if box is not None
                else {"point_coords": coords, "point_labels": np.array([c[2] for c in clicks])}
            )
            points_fed = len(clicks) + (2 if box is not None else 1)
            want_masks, want_scores = _expected(predictor, prompt, single, points_fed)

            got = _page_masks(result)
            assert got.shape == want_masks.shape, what
            for i, (g, e) in enumerate(zip(got, want_masks, strict=True)):
                assert 0 < e.sum() < e.size, f"{what}: the test needs non-trivial masks"
                agreement = float((g == e).mean())
                assert agreement >= MIN_AGREEMENT, (what, i, agreement)
                figures.append(agreement)
            np.testing.assert_allclose(
                result["scores"], want_scores, atol=SCORE_ATOL, rtol=0, err_msg=what
            )
            score_diff = max(score_diff, float(np.abs(result["scores"] - want_scores).max()))
            # the page shows the first output's first mask
            np.testing.assert_array_equal(_canvas_mask(page), got[0])
    print(
        f"\nonnxruntime-web {'single mask' if single else 'all masks'}: mask agreement min "
        f"{min(figures):.6f} over {len(figures)} masks, score difference max {score_diff:.2e}"
    )
    assert requests and all(u.startswith(server.url + "/") for u in requests), requests
    assert any(u.endswith(".wasm") for u in requests), "onnxruntime-web's wasm not loaded here"
    assert failed == []
    # onnxruntime logs, as warnings on the console's error stream, each initializer that
    # paddle2onnx left unused (native onnxruntime logs the same); anything else is an error
    unused = "CleanUnusedInitializersAndNodeArgs"
    assert [e for e in errors if unused not in e] == []
