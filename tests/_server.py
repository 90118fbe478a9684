"""Serving helpers shared by the service tests: a tiny model, images, a real uvicorn server."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import paddle
from PIL import Image

from paddle_sam.models.build_sam import build_sam


def tiny_model(seed: int = 0):
    from _pairs import TINY

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
