"""Serving helpers shared by the service tests: a tiny model, images, a real uvicorn server."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import paddle
from PIL import Image

from paddle_sam.build.sam_v1 import build_sam


def tiny_model(seed: int = 0):
    from tests.helpers.pairs import TINY

    paddle.seed(seed)
    return build_sam(TINY)


def png_bytes(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def decode_mask_png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("L")) > 127


class ThreadedServer:
    """uvicorn on a free loopback port in a background thread (``with`` starts and stops it)."""

    def __init__(self, app) -> None:
        import uvicorn

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def tiny_sam3_model(seed: int = 0, interactive: bool = False):
    """A SAM 3 image model at the tiny test sizes (tests/models/test_sam3_model.py), random weights,
    with the bundled BPE vocabulary."""
    import warnings

    from paddle_sam.build.sam3 import build_sam3_image_model
    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
    from tests.helpers.sam3_ref import tiny_sam3_spec

    spec = tiny_sam3_spec()
    paddle.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the weights are random": on purpose
        return build_sam3_image_model(
            bpe_path=DEFAULT_BPE_PATH, spec=spec, enable_inst_interactivity=interactive
        )


def sam3_reference(model, image, text=None, box_cxcywh=None, threshold=0.0):
    """``Sam3Processor`` directly: (masks K x H x W, scores K), best first."""
    from paddle_sam.predict.sam3.processor import Sam3Processor

    proc = Sam3Processor(model, resolution=112, confidence_threshold=threshold)
    state = proc.set_image(image)
    if text is not None:
        state = proc.set_text_prompt(text, state)
    if box_cxcywh is not None:
        state = proc.add_geometric_prompt(box_cxcywh, True, state)
    scores = state["scores"].numpy()
    order = np.argsort(-scores, kind="stable")
    return state["masks"].numpy()[:, 0][order], scores[order]


def sam3_threshold(model, image, text=None, box_cxcywh=None, keep: int = 3) -> float:
    """A confidence threshold that keeps ``keep`` instances of this prompt (random weights
    score every query alike, so a fixed threshold would keep all or none)."""
    _, scores = sam3_reference(model, image, text, box_cxcywh)
    return float((scores[keep - 1] + scores[keep]) / 2)


def assert_error(r, status: int, code: str, *words: str) -> None:
    """The service's error body: HTTP ``status``, ``error`` code, ``detail`` naming ``words``."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code, body
    for w in words:
        assert w in body["detail"], body
