"""Serving helpers shared by the service tests: a tiny model, images, a real uvicorn server."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import numpy as np
import paddle
from PIL import Image

from paddle_sam.loading.sam_v1 import build_sam


def tiny_model(seed: int = 0):
    from tests.helpers.specs import TINY

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

    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
    from tests.helpers.specs import tiny_sam3_spec

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


#: the video model's settings for random weights (balanced, see tiny_sam3_video_model): every
#: detection scores about alike, so the thresholds go to 0; without the temporal heuristics
#: (hot-start, reconditioning) a short video keeps its objects
VIDEO_SETTINGS = dict(
    score_threshold_detection=0.0,
    new_det_thresh=0.0,
    det_nms_thresh=0.5,
    hotstart_delay=0,
    hotstart_unmatch_thresh=0,
    hotstart_dup_thresh=0,
)


def tiny_sam3_video_model(seed: int = 0, balance: bool = True, **settings):
    """SAM 3's dense video model at the tiny test sizes (the tracker's heads at their released
    widths: d_model 256, 8 heads, 2048 wide), random weights, the bundled BPE vocabulary;
    ``settings`` override the model's (thresholds lowered for random weights, hot-start off
    for short videos).

    ``balance``: random weights give every detector query nearly the same mask and tracker
    masks that cover the whole frame or nothing, which would leave the tests nothing to
    tell apart. Balanced (:func:`balance_video_model_` on a generated 4-frame video), the
    detector finds several objects of various sizes and a click gives a mask of part of the
    frame, so that wrong masks, ids or frames show."""
    import tempfile
    import warnings

    from paddle_sam.loading.sam3 import build_sam3_video_model
    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
    from tests.helpers.specs import tiny_sam3_tracker_spec
    from tests.helpers.video import scene, write_frames

    spec = tiny_sam3_tracker_spec()
    paddle.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the weights are random": on purpose
        model = build_sam3_video_model(bpe_path=DEFAULT_BPE_PATH, spec=spec)
    for name, value in settings.items():
        if not hasattr(model, name):
            raise AttributeError(f"the video model has no setting {name!r}")
        setattr(model, name, value)
    if balance:
        with tempfile.TemporaryDirectory() as tmp:
            balance_video_model_(model, write_frames(scene(4, 60, 80), Path(tmp) / "v"))
    return model


def balance_video_model_(model, video, text: str = "a shape", obj_bias: float = 6.0) -> None:
    """Weights of a random video model changed in place so that its masks differ and cover
    part of a frame (as tests/helpers/sam3_video.py balances the reference detector):

    - the detector's mask head: the biases of its last layers remove the means of their
      inputs over the frames of ``video`` (pixel and query embeddings share a large common
      component, which makes every query's mask alike);
    - the tracker's mask decoder: the object-score head says "present" (bias ``obj_bias``),
      and the hypernetworks' outputs are made orthogonal to the mean upscaled embedding, so
      that mask logits are centred on 0 over the frame instead of one sign everywhere."""
    from paddle_sam.predict.sam3.video_predictor import Sam3VideoPredictor

    pred = Sam3VideoPredictor(model)
    sid = pred.handle_request({"type": "start_session", "resource_path": str(video)})["session_id"]
    num_frames = len(list(Path(video).iterdir()))
    seg = model.detector.segmentation_head
    head, embed = seg.instance_seg_head, seg.mask_predictor.mask_embed.layers[-1]
    pixels, queries = [], []
    hooks = [
        head.register_forward_pre_hook(lambda layer, i: pixels.append(i[0].numpy())),
        embed.register_forward_post_hook(lambda layer, i, o: queries.append(o.numpy())),
    ]
    for t in range(num_frames):
        pred.handle_request(
            {"type": "add_prompt", "session_id": sid, "frame_index": t, "text": text}
        )
    for hook in hooks:
        hook.remove()
    pixel_mean = np.stack([x.mean((0, 2, 3)) for x in pixels]).mean(0)
    query_mean = np.concatenate([x.reshape(-1, x.shape[-1]) for x in queries]).mean(0)
    head.bias.set_value(-(head.weight.numpy()[:, :, 0, 0] @ pixel_mean).astype("float32"))
    embed.bias.set_value((embed.bias.numpy() - query_mean).astype("float32"))

    decoder = model.tracker.sam_mask_decoder
    bias = decoder.pred_obj_score_head.layers[-1].bias
    bias.set_value(np.full(bias.shape, obj_bias, "float32"))
    upscaled = []
    hook = decoder.output_upscaling[4].register_forward_post_hook(
        lambda layer, i, o: upscaled.append(o.numpy())
    )
    pred.handle_request({"type": "reset_session", "session_id": sid})
    for t in range(num_frames):
        point = {"points": [[0.3, 0.5]], "point_labels": [1], "obj_id": 1}
        pred.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": t, **point})
    hook.remove()
    mean = np.concatenate([u.transpose(0, 2, 3, 1).reshape(-1, u.shape[1]) for u in upscaled])
    mean = mean.mean(0)
    unit = mean / (mean @ mean)
    for mlp in decoder.output_hypernetworks_mlps:
        last = mlp.layers[-1]  # y = x W + b, W: in x out; y . mean = 0 for every x
        w, b = last.weight.numpy(), last.bias.numpy()
        last.weight.set_value((w - np.outer(w @ mean, unit)).astype("float32"))
        last.bias.set_value((b - (b @ mean) * unit).astype("float32"))
    pred.handle_request({"type": "close_session", "session_id": sid})
