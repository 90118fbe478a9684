"""A Label Studio ML backend: paddle-sam answering Label Studio's ``/health``, ``/setup``,
``/predict`` and ``/webhook`` with brush masks.

What it answers (the project's labelling config names the tags):

- **Clicks** (interactive pre-annotation, "Auto-Annotation" in the labelling page): the
  ``KeyPointLabels`` points (``is_positive`` false: a negative point) and the last
  ``RectangleLabels`` box of the request's context become one prompt; SAM v1 (or SAM 3's
  ``predict_inst``) answers with one mask, labelled with the clicked label.
- **Text** (SAM 3): a ``TextArea`` in the context is a concept; every instance comes back, each
  its own brush region, labelled with the ``BrushLabels`` label of the same name (else the text).
- **Pre-labelling** (no context: "Retrieve predictions", or a task opened with predictions on):
  with SAM 3 every ``BrushLabels`` label is prompted as a concept; SAM v1 has no prompt to answer
  and returns no prediction.
- **Video tracking** (SAM 2; a config with ``<Video>`` and ``<VideoRectangle>``): the context's
  ``videorectangle`` regions are objects, each keyframe of their ``sequence`` (frames numbered
  from 1 at the config's ``framerate``, boxes in percent) a box prompt on its frame; SAM 2
  tracks them forward from the last keyframe for at most ``max_track_frames`` frames, and each
  region comes back with its keyframes followed by a box per tracked frame (the box of its
  mask; ``enabled: false`` where the object is lost). SAM 3 refuses: its video model takes a
  box as an exemplar of a concept, not as one object's box.

Answers are ``brushlabels`` results in Label Studio's RLE (:func:`label_studio_rle`) on the
config's first ``BrushLabels`` tag. Images are downloaded through one :class:`~.fetch.Fetcher`
(Label Studio's origin pinned, its token sent only there and never across a redirect, private
addresses refused unless allowed, a total deadline and a byte cap), decoded within the
service's pixel limit, and embedded once per task: the embeddings live in the service's session
cache (its memory budget, least recently used first out).

Label Studio's origin is ``label_studio_url`` when given (required with ``api_key``: the key is
sent only there; the address ``/setup`` sends is then ignored), else the ``hostname`` of the
first ``/setup`` with one: a later ``/setup`` naming another is refused (409). The token
``/setup`` sends is kept only with the address it came with.

Work is bounded: ``max_tasks`` tasks per ``/predict``, ``max_labels`` brush labels prompted per
task (SAM 3 pre-labelling), ``MAX_PREDICTS`` requests working at once (each on a worker thread;
``/health`` runs on the event loop, so it answers while they work) and ``MAX_WAITING`` more
waiting (503 beyond); videos: the service's video limits (bytes, frames, seconds, pixels),
``max_track_frames`` frames tracked per request, ``MAX_TRACKS`` regions and ``MAX_KEYFRAMES``
keyframes each.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from .._version import __version__
from ..predict.io import label_studio_rle
from .config import (
    DEFAULT_DOWNLOAD_TIMEOUT_S,
    DEFAULT_MAX_LABELS_PER_TASK,
    DEFAULT_MAX_TASKS_PER_REQUEST,
    DEFAULT_MAX_TRACK_FRAMES,
)
from .errors import ServiceError
from .fetch import Fetcher, UpstreamError, origin_of
from .routes import decode_image_bytes
from .service import ModelService, QueueFull
from .sessions import Session, SessionError, SessionStore
from .video import VideoService, VideoSession, sniff_video_format

MAX_CLICK_PROMPTS = 64  # points in one request's context
MAX_PREDICTS = 4  # /predict requests working at once (downloads, embeddings, prompts)
MAX_WAITING = 16  # more may wait for their turn; 503 beyond
ACCESS_TOKEN_S = 240.0  # how long an access token from a personal access token is reused
MAX_TRACKS = 16  # videorectangle regions tracked in one request
MAX_KEYFRAMES = 64  # keyframes of one region sent as prompts
LS_FRAMERATE = 24.0  # Label Studio's <Video> frame rate when the config names none


# -- the labelling config ------------------------------------------------------------------


@dataclass
class LabelConfig:
    """What the backend reads of a project's labelling config (the XML)."""

    image: str  # the Image (or Video) tag's name (results' "to_name")
    image_key: str  # the task data key of its value ("$image" -> "image")
    brush: str  # the BrushLabels (or VideoRectangle) tag's name (results' "from_name")
    labels: list[str] = field(default_factory=list)  # its Label values
    video: bool = False  # a <Video> with a <VideoRectangle>: boxes tracked
    framerate: float = LS_FRAMERATE  # the <Video>'s: how Label Studio numbers frames
    framerate_key: str | None = None  # frameRate="$fps": each task's data names it

    def label_for(self, name: str | None) -> str | None:
        """The brush label named like ``name`` (case and spaces aside); None if none is."""
        if name is None:
            return None
        key = " ".join(name.split()).casefold()
        return next((v for v in self.labels if " ".join(v.split()).casefold() == key), None)


def _task_key(tag: str, name: str, value: str) -> str:
    if not value.startswith("$") or len(value) < 2:
        raise ValueError(
            f"the <{tag} name={name!r}> tag's value must name a task field "
            f"('${tag.lower()}'), got {value!r}"
        )
    return value[1:]


def _video_config(root: ET.Element) -> LabelConfig | None:
    """A ``Video`` with a ``VideoRectangle`` on it (and the ``Labels`` on it), if any."""
    videos = {el.get("name"): el for el in root.iter() if el.tag == "Video" and el.get("name")}
    rects = [el for el in root.iter() if el.tag == "VideoRectangle" and el.get("toName") in videos]
    if not rects:
        return None
    video = videos[rects[0].get("toName")]
    name = video.get("name")
    rate = video.get("frameRate") or video.get("framerate") or str(LS_FRAMERATE)
    key = rate[1:] if rate.startswith("$") and len(rate) > 1 else None
    framerate = LS_FRAMERATE if key else _framerate(rate, f"the <Video name={name!r}> tag's")
    labels = [
        el.get("value")
        for tag in root.iter()
        if tag.tag == "Labels" and tag.get("toName") == name
        for el in tag.iter("Label")
        if el.get("value")
    ]
    return LabelConfig(
        image=name,
        image_key=_task_key("Video", name, video.get("value", "")),
        brush=rects[0].get("name"),
        labels=labels,
        video=True,
        framerate=framerate,
        framerate_key=key,
    )


def _framerate(value: Any, what: str) -> float:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} frameRate is not a number: {value!r}") from None
    if not np.isfinite(rate) or rate <= 0:
        raise ValueError(f"{what} frameRate must be positive, got {value!r}")
    return rate


def parse_label_config(xml: str | None) -> LabelConfig:
    """The ``Image`` and ``BrushLabels`` tags of a labelling config (or its ``Video`` and
    ``VideoRectangle``); ValueError naming what is missing."""
    if xml is not None and not isinstance(xml, str):
        raise ValueError(
            f"the labelling config must be its XML as a string, got {type(xml).__name__}"
        )
    if not xml or not xml.strip():
        raise ValueError("the project has no labelling config")
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise ValueError(f"the labelling config is not valid XML: {exc}") from None
    images = {
        el.get("name"): el.get("value", "")
        for el in root.iter()
        if el.tag == "Image" and el.get("name")
    }
    brushes = [el for el in root.iter() if el.tag == "BrushLabels" and el.get("toName") in images]
    if not brushes:
        video = _video_config(root)
        if video is not None:
            return video
    if not images:
        raise ValueError(
            "the labelling config has no <Image> tag: paddle-sam segments images (and tracks "
            "a <VideoRectangle> on a <Video>)"
        )
    if not brushes:
        raise ValueError(
            "the labelling config has no <BrushLabels> tag on its image: paddle-sam answers "
            'with brush masks (add e.g. <BrushLabels name="tag" toName="image"><Label '
            'value="car"/></BrushLabels>)'
        )
    brush = brushes[0]
    image = brush.get("toName")
    key = _task_key("Image", image, images[image])
    labels = [el.get("value") for el in brush.iter("Label") if el.get("value")]
    return LabelConfig(image=image, image_key=key, brush=brush.get("name"), labels=labels)


# -- the prompt in a request's context -----------------------------------------------------


@dataclass
class Prompt:
    """The prompt of one interactive request, in image pixels."""

    points: list[list[float]] = field(default_factory=list)
    point_labels: list[int] = field(default_factory=list)
    box: list[float] | None = None
    text: str | None = None
    label: str | None = None  # the label chosen with the click

    @property
    def empty(self) -> bool:
        return not self.points and self.box is None and not self.text


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise ValueError(f"context: {what} must be a number, got {value!r}")
    return float(value)


def parse_context(context: dict | None, width: int, height: int) -> Prompt:
    """The clicks, box and text of Label Studio's interactive context (coordinates in percent
    of the image, as Label Studio sends them) in pixels of a ``width x height`` image."""
    prompt = Prompt()
    results = (context or {}).get("result") or []
    if not isinstance(results, list):
        raise ValueError("context.result must be a list of regions")
    for i, region in enumerate(results):
        if not isinstance(region, dict) or not isinstance(region.get("value"), dict):
            raise ValueError(f"context.result[{i}] is not a region with a 'value'")
        kind, value = region.get("type"), region["value"]
        chosen = value.get(kind) if isinstance(value.get(kind), list) else None
        if chosen:
            prompt.label = str(chosen[0])
        if kind == "keypointlabels":
            x = _number(value.get("x"), f"result[{i}].value.x") * width / 100
            y = _number(value.get("y"), f"result[{i}].value.y") * height / 100
            prompt.points.append([x, y])
            prompt.point_labels.append(0 if region.get("is_positive") is False else 1)
        elif kind == "rectanglelabels":
            if value.get("rotation"):
                raise ValueError(f"context.result[{i}]: a rotated rectangle cannot be a box prompt")
            x = _number(value.get("x"), f"result[{i}].value.x") * width / 100
            y = _number(value.get("y"), f"result[{i}].value.y") * height / 100
            w = _number(value.get("width"), f"result[{i}].value.width") * width / 100
            h = _number(value.get("height"), f"result[{i}].value.height") * height / 100
            prompt.box = [x, y, x + w, y + h]  # the last rectangle is the box
        elif kind == "textarea":
            texts = value.get("text") or []
            text = " ".join(str(t) for t in texts).strip() if isinstance(texts, list) else ""
            if text:
                prompt.text = text
    if len(prompt.points) > MAX_CLICK_PROMPTS:
        raise ValueError(f"context: {len(prompt.points)} points, at most {MAX_CLICK_PROMPTS}")
    return prompt


@dataclass
class Track:
    """A ``videorectangle`` region of the context: its keyframes (Label Studio's frame
    numbers, from 1; boxes ``x, y, w, h`` in percent), as sent."""

    region: dict
    keyframes: list[tuple[int, list[float]]]


def parse_tracks(context: dict | None) -> list[Track]:
    """The ``videorectangle`` regions of a context and their enabled keyframes."""
    results = (context or {}).get("result") or []
    if not isinstance(results, list):
        raise ValueError("context.result must be a list of regions")
    tracks = []
    for i, region in enumerate(results):
        if not isinstance(region, dict) or region.get("type") != "videorectangle":
            continue
        value = region.get("value")
        sequence = value.get("sequence") if isinstance(value, dict) else None
        if not isinstance(sequence, list):
            raise ValueError(f"context.result[{i}].value.sequence must be a list of keyframes")
        keyframes = []
        for j, key in enumerate(sequence):
            where = f"result[{i}].value.sequence[{j}]"
            if not isinstance(key, dict):
                raise ValueError(f"context: {where} is not a keyframe")
            frame = key.get("frame")
            if isinstance(frame, bool) or not isinstance(frame, int) or frame < 1:
                raise ValueError(f"context: {where}.frame must be a frame number from 1")
            if key.get("enabled") is False:
                continue  # the end of a lifespan: not a box
            if key.get("rotation"):
                raise ValueError(f"context: {where}: a rotated box cannot be a box prompt")
            box = [_number(key.get(k), f"{where}.{k}") for k in ("x", "y", "width", "height")]
            if box[2] <= 0 or box[3] <= 0:
                raise ValueError(f"context: {where} is an empty box (width and height > 0)")
            keyframes.append((frame, box))
        if len(keyframes) > MAX_KEYFRAMES:
            raise ValueError(
                f"context.result[{i}]: {len(keyframes)} keyframes, at most {MAX_KEYFRAMES}"
            )
        if keyframes:
            tracks.append(Track(region, keyframes))
    if len(tracks) > MAX_TRACKS:
        raise ValueError(f"context: {len(tracks)} video regions to track, at most {MAX_TRACKS}")
    return tracks


# -- the backend -------------------------------------------------------------------------


def _region(config: LabelConfig, mask: np.ndarray, label: str, score: float) -> dict[str, Any]:
    h, w = mask.shape
    return {
        "id": uuid.uuid4().hex[:10],
        "from_name": config.brush,
        "to_name": config.image,
        "type": "brushlabels",
        "original_width": int(w),
        "original_height": int(h),
        "image_rotation": 0,
        "value": {"format": "rle", "rle": label_studio_rle(mask), "brushlabels": [label]},
        "score": float(score),
        "readonly": False,
    }


def _is_jwt(token: str) -> bool:
    return token.count(".") == 2 and len(token) > 40


class LabelStudioBackend:
    """The backend's state: the service, its embedding cache, and how to reach Label Studio.

    ``label_studio_url`` / ``api_key`` (a legacy token, or a personal access token which is
    exchanged for an access token) replace what Label Studio's ``/setup`` sends, e.g. when Label
    Studio calls itself ``localhost`` but runs in another container; ``api_key`` needs
    ``label_studio_url`` (the key goes only there). ``allow_private_urls``: also download task
    images from loopback, private and link-local addresses (Label Studio's own always is).
    ``download_timeout_s``: the most one image may take; ``max_download``: its bytes.
    ``videos``: SAM 2's video predictor in the service (None: video tasks are refused with
    ``video_refusal``); a video may have the bytes, frames, seconds and pixels of its limits;
    ``max_track_frames``: frames tracked past the last keyframe per request.
    """

    def __init__(
        self,
        service: ModelService,
        store: SessionStore,
        *,
        max_image_pixels: int,
        max_download: int,
        label_studio_url: str | None = None,
        api_key: str | None = None,
        allow_private_urls: bool = False,
        download_timeout_s: float = DEFAULT_DOWNLOAD_TIMEOUT_S,
        max_tasks: int = DEFAULT_MAX_TASKS_PER_REQUEST,
        max_labels: int = DEFAULT_MAX_LABELS_PER_TASK,
        videos: VideoService | None = None,
        video_refusal: str | None = None,
        max_track_frames: int = DEFAULT_MAX_TRACK_FRAMES,
    ) -> None:
        if api_key and not label_studio_url:
            raise ValueError(
                "an API key needs Label Studio's address (--label-studio-url): the key is sent "
                "only there"
            )
        self.service, self.store = service, store
        self.max_image_pixels, self.max_download = max_image_pixels, max_download
        self.max_tasks, self.max_labels = max_tasks, max_labels
        self.fixed_url = label_studio_url.rstrip("/") if label_studio_url else None
        self.fetcher = Fetcher(
            self.fixed_url,
            allow_private=allow_private_urls,
            deadline_s=download_timeout_s,
            max_bytes=max_download,
        )
        self.videos, self.video_refusal = videos, video_refusal
        self.max_track_frames = max_track_frames
        self.video_fetcher = (
            Fetcher(
                self.fixed_url,
                allow_private=allow_private_urls,
                deadline_s=download_timeout_s,
                max_bytes=videos.limits.max_upload,
            )
            if videos is not None
            else None
        )
        self._video_ids: dict[str, str] = {}  # task key -> its video session's id
        self.fixed_key = api_key or None
        self.hostname: str | None = self.fixed_url  # where Label Studio's paths are read
        self.token: str | None = self.fixed_key
        self._access: tuple[str, str, float] | None = None  # (for token, access token, expiry)
        self._token_lock = threading.Lock()
        self.configs: dict[str, str] = {}  # project id -> labelling config, from /setup
        self._embedding: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self.model_version = f"paddle-sam-{__version__}-{service.model_type}"
        self.busy = 0  # /predict requests working or waiting
        self._gates: dict[int, asyncio.Semaphore] = {}  # per event loop (one when served)

    def gate(self) -> asyncio.Semaphore:
        """The semaphore of ``MAX_PREDICTS`` for the running event loop."""
        loop = id(asyncio.get_running_loop())
        return self._gates.setdefault(loop, asyncio.Semaphore(MAX_PREDICTS))

    # -- Label Studio's side --

    def setup(self, payload: dict) -> dict:
        project = str(payload.get("project") or "").split(".", 1)[0]
        schema = payload.get("schema")
        try:
            parse_label_config(schema)  # refuse a config we cannot answer now, not at /predict
        except ValueError as exc:
            raise ServiceError(400, "invalid_label_config", str(exc)) from None
        hostname, token = payload.get("hostname"), payload.get("access_token")
        for key, value in (("hostname", hostname), ("access_token", token)):
            if value is not None and not isinstance(value, str):
                raise ServiceError(
                    400, "invalid_request", f"'{key}' must be a string, got {type(value).__name__}"
                )
        if self.fixed_url is None and hostname:
            self._pin(hostname.rstrip("/"), token or None)
        elif self.fixed_url is not None and self.fixed_key is None and token:
            self.token = token  # sent only to --label-studio-url
        if project:
            self.configs[project] = schema
        return {"model_version": self.model_version}

    def _pin(self, hostname: str, token: str | None) -> None:
        """Label Studio's address from /setup: the first pins the origin; the token comes with
        its address and is replaced only by a /setup from the same origin."""
        try:
            origin = origin_of(hostname)
        except ServiceError as exc:
            raise ServiceError(400, "invalid_hostname", f"/setup's hostname {exc.detail}") from None
        with self._lock:
            if self.fetcher.pinned is not None and origin != self.fetcher.pinned:
                raise ServiceError(
                    409,
                    "label_studio_origin_pinned",
                    f"this backend serves the Label Studio at {self.fetcher.pinned} (the first "
                    f"/setup), not {origin}; restart it to connect another, or pass "
                    "--label-studio-url",
                )
            self.fetcher.pin(hostname)
            if self.video_fetcher is not None:
                self.video_fetcher.pin(hostname)
            self.hostname, self.token = hostname, token

    def _auth_header(self) -> str | None:
        """The ``Authorization`` value for Label Studio (only ever sent to its origin)."""
        token = self.token
        if not token:
            return None
        if not _is_jwt(token):
            return f"Token {token}"
        # a personal access token (a refresh token): exchange it for a short-lived access token
        with self._token_lock:
            if (
                self._access is None
                or self._access[0] != token
                or self._access[2] < time.monotonic()
            ):
                url = f"{self.hostname}/api/token/refresh"
                try:
                    answer = self.fetcher.post_json(url, {"refresh": token})
                except UpstreamError as exc:
                    raise UpstreamError(
                        "Label Studio did not exchange the personal access token for an access "
                        f"token ({exc.detail}); check --label-studio-api-key and "
                        "--label-studio-url",
                        exc.upstream_status,
                    ) from None
                access = answer.get("access")
                if not isinstance(access, str) or not access:
                    raise UpstreamError(
                        f"{url}: the answer has no access token", upstream_status=200
                    )
                self._access = (token, access, time.monotonic() + ACCESS_TOKEN_S)
            return f"Bearer {self._access[1]}"

    def _url(self, ref: str) -> str:
        """The address of a task's image."""
        if ref[:8].lower().startswith(("http://", "https://")):
            return ref
        if ref.startswith("/"):
            if self.hostname is None:
                raise ServiceError(
                    400,
                    "no_label_studio_url",
                    f"the task's image {ref[:200]!r} is a Label Studio path, but Label Studio "
                    "has not called /setup yet and no --label-studio-url was given",
                )
            return self.hostname + ref
        scheme = ref.split(":", 1)[0] if ":" in ref else ""
        raise ServiceError(
            400,
            "unsupported_image_url",
            f"the task's image {ref[:200]!r}: paddle-sam reads images from Label Studio "
            f"(uploads, local files) or http(s) addresses{', not ' + scheme[:20] if scheme else ''}"
            " (cloud storage: let Label Studio serve it with presigned URLs proxied)",
        )

    def download(self, ref: str, fetcher: Fetcher | None = None) -> bytes:
        if ref.startswith("data:"):
            header, _, data = ref.partition(",")
            try:
                return base64.b64decode(data, validate=True) if ";base64" in header else b""
            except binascii.Error:
                raise ServiceError(
                    400, "invalid_image", "the task's data: URL is not base64"
                ) from None
        try:
            return (fetcher or self.fetcher).get(self._url(ref), self._auth_header)
        except UpstreamError as exc:
            if exc.upstream_status in (401, 403):
                exc.detail += (
                    ": check the token (--label-studio-api-key, or the legacy token Label "
                    "Studio sends at /setup)"
                )
            raise

    # -- the model's side --

    def _task_ref(self, task: dict, config: LabelConfig) -> tuple[str, str]:
        """The task's image (or video) address and its cache key."""
        data = task.get("data") if isinstance(task.get("data"), dict) else {}
        ref = data.get(config.image_key)
        if not isinstance(ref, str) or not ref:
            what, tag = ("video", "Video") if config.video else ("image", "Image")
            raise ServiceError(
                400,
                "invalid_task",
                f"task {task.get('id')}: no {what} at data.{config.image_key} (the <{tag}> "
                f"tag's value is ${config.image_key})",
            )
        return ref, f"ls-{task.get('id')}-" + uuid.uuid5(uuid.NAMESPACE_URL, ref).hex

    def _one_at_a_time(self, key: str):
        """The lock of one task's work (embedding, tracking), shared by the requests that
        ask at once."""
        with self._lock:
            return self._embedding.setdefault(key, threading.Lock())

    def _session(self, task: dict, config: LabelConfig) -> Session:
        """The task's image and embedding: from the cache, else downloaded and embedded."""
        ref, key = self._task_ref(task, config)
        lock = self._one_at_a_time(key)
        try:
            with lock:  # one embedding per task, however many requests ask at once
                return self._cached_or_embedded(key, ref)
        finally:
            with self._lock:
                self._embedding.pop(key, None)

    def _cached_or_embedded(self, key: str, ref: str) -> Session:
        try:
            return self.store.get(key)
        except SessionError:
            pass
        name = ref.rsplit("/", 1)[-1][:100] or "image"
        image = decode_image_bytes(self.download(ref), name, self.max_image_pixels)
        try:
            state, seconds = self.service.embed(image)
        except ValueError as exc:
            raise ServiceError(400, "invalid_image", f"{name}: {exc}") from None
        session = Session(key, image, state, seconds)
        self.store.add(session)
        return session

    def _predict(self, session: Session, **kwargs) -> tuple[np.ndarray, np.ndarray]:
        try:
            masks, scores, _ = self.service.predict(session.state, **kwargs)
        except ValueError as exc:
            raise ServiceError(400, getattr(exc, "code", "invalid_prompt"), str(exc)) from None
        return np.asarray(masks), np.asarray(scores, dtype=np.float64)

    def _concept(self, session, config, text: str, label: str) -> list[dict]:
        masks, scores = self._predict(session, text=text)
        return [_region(config, m, label, s) for m, s in zip(masks, scores, strict=True)]

    def predict_task(self, task: dict, config: LabelConfig, context: dict | None) -> dict | None:
        """One task's prediction (``{"result": [...], "score", "model_version"}``); None when
        there is nothing to answer (SAM v1 without clicks)."""
        session = self._session(task, config)
        try:
            prompt = parse_context(context, session.width, session.height)
        except ValueError as exc:
            raise ServiceError(400, "invalid_context", str(exc)) from None
        regions: list[dict] = []
        if prompt.text is not None:
            if not self.service.takes_text:
                raise ServiceError(
                    400,
                    "text_not_supported",
                    f"this model ({self.service.model_type}) does not take text prompts: serve "
                    "a SAM 3 checkpoint for text",
                )
            label = config.label_for(prompt.text) or prompt.text
            regions = self._concept(session, config, prompt.text, label)
        elif not prompt.empty:
            kwargs: dict[str, Any] = {
                # one click is ambiguous: three candidates, the best kept (SAM's advice)
                "multimask_output": len(prompt.points) == 1 and prompt.box is None
            }
            if prompt.points:
                kwargs["point_coords"] = np.asarray(prompt.points, dtype=np.float64)
                kwargs["point_labels"] = np.asarray(prompt.point_labels, dtype=np.int32)
            if prompt.box is not None:
                kwargs["box"] = np.asarray(prompt.box, dtype=np.float64)
            if self.service.returns_instances and not self.service.takes_points:
                raise ServiceError(
                    400,
                    "points_not_supported",
                    "this SAM 3 model has no interactive predictor for clicks (build it with "
                    "the tracker); use a text prompt",
                )
            masks, scores = self._predict(session, **kwargs)
            if len(masks):
                best = int(np.argmax(scores))
                label = (
                    config.label_for(prompt.label)
                    or prompt.label
                    or (config.labels[0] if config.labels else "object")
                )
                regions = [_region(config, masks[best], label, scores[best])]
        elif self.service.takes_text:
            for label in config.labels:
                regions += self._concept(session, config, label, label)
        else:
            return None
        self.store.refresh(session)
        score = float(np.mean([r["score"] for r in regions])) if regions else 0.0
        return {"result": regions, "score": score, "model_version": self.model_version}

    # -- video tracking --

    def _video_session(self, task: dict, config: LabelConfig) -> VideoSession:
        """The task's video session: from the cache, else downloaded, checked against the
        video limits and opened (call with the task's lock held)."""
        ref, key = self._task_ref(task, config)
        videos = self.videos
        sid = self._video_ids.get(key)
        if sid is not None:
            try:
                return self.store.get(sid, VideoSession)
            except SessionError:
                self._video_ids.pop(key, None)  # evicted or expired: opened again
        name = ref.rsplit("/", 1)[-1].split("?", 1)[0][:100] or "video"
        try:
            data = self.download(ref, self.video_fetcher)
        except ServiceError as exc:
            if exc.code == "image_too_large":
                raise ServiceError(
                    413,
                    "video_too_large",
                    f"{name}: {exc.detail} (--max-video-upload-mb)",
                ) from None
            raise
        kind = sniff_video_format(data[:64])
        if kind is None:
            raise ServiceError(
                400,
                "invalid_video",
                f"{name}: not a video file paddle-sam reads (MP4, MOV, AVI, MKV or WebM)",
            )
        folder = videos.new_folder()
        path = folder / f"video.{kind.lower()}"
        path.write_bytes(data)
        session = videos.start(folder, path, name)
        self._video_ids[key] = session.id
        return session

    def _frame_index(self, frame: int, config: LabelConfig, session: VideoSession) -> int:
        """Label Studio's frame number (from 1, at the config's frame rate) as a frame index."""
        i = frame - 1
        if session.fps:
            i = int(round(i * session.fps / config.framerate))
        if not 0 <= i < session.num_frames:
            raise ServiceError(
                400,
                "invalid_context",
                f"keyframe {frame} is past the video's end ({session.num_frames} frames at "
                f"{session.fps or config.framerate:g} fps; the <Video> framerate is "
                f"{config.framerate:g})",
            )
        return i

    def _ls_frame(self, index: int, config: LabelConfig, session: VideoSession) -> int:
        if session.fps:
            return int(round(index * config.framerate / session.fps)) + 1
        return index + 1

    def predict_video_task(
        self, task: dict, config: LabelConfig, tracks: list[Track]
    ) -> dict | None:
        """Each region's keyframes as box prompts, tracked forward by SAM 2 from the last one
        (``max_track_frames`` frames at most); the regions with their tracked boxes."""
        if not tracks:
            return None  # nothing drawn: nothing to track
        _, key = self._task_ref(task, config)
        lock = self._one_at_a_time(key)
        try:
            with lock:  # one request at a time tracks a task's video
                return self._track(task, config, tracks)
        finally:
            with self._lock:
                self._embedding.pop(key, None)

    def _track(self, task: dict, config: LabelConfig, tracks: list[Track]) -> dict:
        videos = self.videos
        if config.framerate_key is not None:  # frameRate="$fps": this task's
            data = task.get("data") if isinstance(task.get("data"), dict) else {}
            what = f"task {task.get('id')}: data.{config.framerate_key}, the <Video>'s"
            try:
                rate = _framerate(data.get(config.framerate_key), what)
            except ValueError as exc:
                raise ServiceError(400, "invalid_task", str(exc)) from None
            config = dataclasses.replace(config, framerate=rate)
        session = self._video_session(task, config)
        with session.op_lock:
            videos.reset(session)
            ids, last = [], []
            for track in tracks:
                obj_id = videos.next_obj_id(session)
                ids.append(obj_id)
                frames = []
                for frame, (x, y, w, h) in track.keyframes:
                    index = self._frame_index(frame, config, session)
                    frames.append(index)
                    box = [x / 100, y / 100, w / 100, h / 100]
                    request = {"frame_index": index, "bounding_boxes": [box], "obj_id": obj_id}
                    try:
                        videos.prompt(session, request)
                    except ValueError as exc:
                        raise ServiceError(400, "invalid_context", str(exc)) from None
                last.append(max(frames))
            start = min(last)
            span = min(self.max_track_frames, session.num_frames - 1 - start)
            results: dict[int, dict] = {}
            if span > 0:
                try:
                    job = videos.start_propagation(session, "forward", start, span)
                except QueueFull as exc:
                    raise ServiceError(
                        503, "busy", str(exc), headers={"Retry-After": "5"}
                    ) from None
                while job.active:
                    time.sleep(0.02)
                if job.status != "done":
                    raise ServiceError(
                        503 if job.status == "cancelled" else 500,
                        "tracking_failed",
                        f"tracking stopped after {job.done} of {job.total} frames: "
                        f"{job.error or job.status}",
                    )
                with session.lock:
                    for index in range(start + 1, start + span + 1):
                        results[index] = {o.obj_id: o for o in session.results.get(index, ())}
        regions, scores = [], []
        for track, obj_id, end in zip(tracks, ids, last, strict=True):
            sequence = [k for k in track.region["value"]["sequence"] if isinstance(k, dict)]
            seen = {k["frame"] for k in sequence}
            lost = False
            probs = []
            # the box an object lost keeps on the frame its lifespan ends: the latest one
            previous = max(
                (k for k in sequence if k.get("enabled") is not False),
                key=lambda k: k["frame"],
            )
            for index in sorted(i for i in results if i > end):
                frame = self._ls_frame(index, config, session)
                found = results[index].get(obj_id)
                if frame in seen:
                    continue
                if found is None or found.area == 0:
                    if not lost and previous is not None:  # its lifespan ends here
                        sequence.append(
                            {
                                **previous,
                                "frame": frame,
                                "enabled": False,
                                "time": (frame - 1) / config.framerate,
                            }
                        )
                        seen.add(frame)
                    lost = True
                    continue
                lost = False
                probs.append(found.score)
                x, y, w, h = found.box
                previous = {
                    "frame": frame,
                    "enabled": True,
                    "rotation": 0,
                    "x": 100 * x,
                    "y": 100 * y,
                    "width": 100 * w,
                    "height": 100 * h,
                    "time": (frame - 1) / config.framerate,
                }
                sequence.append(previous)
                seen.add(frame)
            sequence.sort(key=lambda k: k["frame"])
            value = {**track.region["value"], "sequence": sequence}
            value.setdefault("framesCount", self._ls_frame(session.num_frames - 1, config, session))
            value.setdefault("duration", session.duration or session.num_frames / config.framerate)
            score = float(np.mean(probs)) if probs else 0.0
            scores.append(score)
            regions.append(
                {
                    "id": track.region.get("id") or uuid.uuid4().hex[:10],
                    "from_name": track.region.get("from_name") or config.brush,
                    "to_name": track.region.get("to_name") or config.image,
                    "type": "videorectangle",
                    "origin": "prediction",
                    "value": value,
                    "score": score,
                }
            )
        self.store.refresh(session)
        return {
            "result": regions,
            "score": float(np.mean(scores)) if scores else 0.0,
            "model_version": self.model_version,
        }

    def predict(self, payload: dict) -> dict:
        tasks = payload.get("tasks")
        if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
            raise ServiceError(400, "invalid_request", "'tasks' must be a list of task objects")
        if len(tasks) > self.max_tasks:
            raise ServiceError(
                400,
                "too_many_tasks",
                f"{len(tasks)} tasks in one request, at most {self.max_tasks} (each is "
                "downloaded and embedded): select fewer tasks, or start the backend with a "
                "larger --max-tasks-per-request",
            )
        project = str(payload.get("project") or "").split(".", 1)[0]
        xml = payload.get("label_config") or self.configs.get(project)
        try:
            config = parse_label_config(xml)
        except ValueError as exc:
            raise ServiceError(400, "invalid_label_config", str(exc)) from None
        params = payload.get("params") if isinstance(payload.get("params"), dict) else {}
        context = params.get("context")
        if context is not None and not isinstance(context, dict):
            raise ServiceError(400, "invalid_context", "params.context must be an object")
        if config.video:
            return self._predict_videos(tasks, config, context)
        try:
            prompt = parse_context(context, 1, 1)  # checked before any download
        except ValueError as exc:
            raise ServiceError(400, "invalid_context", str(exc)) from None
        if prompt.empty and self.service.takes_text and len(config.labels) > self.max_labels:
            raise ServiceError(
                400,
                "too_many_labels",
                f"pre-labelling prompts every brush label of the config: {len(config.labels)} "
                f"labels, at most {self.max_labels}; click or type a prompt instead, or start "
                "the backend with a larger --max-labels-per-task",
            )
        results = []
        for task in tasks:
            answer = self.predict_task(task, config, context)
            if answer is not None:
                results.append(answer)
        return {"results": results}

    def _predict_videos(self, tasks: list[dict], config: LabelConfig, context: Any) -> dict:
        try:
            tracks = parse_tracks(context)  # checked before any download
        except ValueError as exc:
            raise ServiceError(400, "invalid_context", str(exc)) from None
        if not tracks:
            return {"results": []}  # no box drawn (pre-labelling): nothing to track
        if self.videos is None:
            raise ServiceError(
                400,
                "video_not_supported",
                self.video_refusal
                or "this backend tracks no video: serve a SAM 2 checkpoint (without --no-video)",
            )
        if self.videos.takes_text:
            raise ServiceError(
                400,
                "video_not_supported",
                "SAM 3's video model takes a box as an example of a concept (every object like "
                "it), not as one object's box to track: serve a SAM 2 checkpoint to track "
                "VideoRectangle regions",
            )
        results = []
        for task in tasks:
            answer = self.predict_video_task(task, config, tracks)
            if answer is not None:
                results.append(answer)
        return {"results": results}


# -- the routes: Label Studio's ML backend protocol, over ``app.state.backend`` -------------


async def _backend(request: Request) -> LabelStudioBackend:
    return request.app.state.backend


Backend = Annotated[LabelStudioBackend, Depends(_backend)]

router = APIRouter()


async def _json(request: Request) -> dict:
    try:
        payload = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise ServiceError(400, "invalid_json", "the request body is not JSON") from None
    except RecursionError:
        raise ServiceError(400, "invalid_json", "the request body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise ServiceError(400, "invalid_json", "the request body must be a JSON object")
    return payload


@router.get("/health", summary="Label Studio's health check")
@router.get("/", include_in_schema=False)
async def health(backend: Backend) -> dict:
    # on the event loop, not a worker thread: it answers while /predict requests work
    return {
        "status": "UP",
        "model_class": "paddle-sam",
        "model_version": backend.model_version,
        "model": {
            "type": backend.service.model_type,
            "runtime": backend.service.runtime,
            "takes_text": backend.service.takes_text,
        },
        "cache": backend.store.stats(),
    }


@router.post("/setup", summary="Label Studio connects a project (its labelling config)")
async def setup(request: Request, backend: Backend) -> dict:
    payload = await _json(request)
    return backend.setup(payload)


@router.post("/predict", summary="predictions for tasks, with the clicks of 'context'")
async def predict(request: Request, backend: Backend) -> dict:
    if backend.busy >= MAX_PREDICTS + MAX_WAITING:
        raise ServiceError(
            503,
            "busy",
            f"{backend.busy} predictions are running or waiting; try again shortly",
            headers={"Retry-After": "5"},
        )
    backend.busy += 1
    try:
        payload = await _json(request)
        async with backend.gate():  # waiting here holds no worker thread
            return await run_in_threadpool(backend.predict, payload)
    finally:
        backend.busy -= 1


@router.post("/webhook", summary="Label Studio's events (annotations); nothing is trained")
async def webhook(request: Request) -> dict:
    payload = await _json(request)
    # annotations are the training data of 'paddle-sam train', not of this server
    return {"status": "ok", "action": payload.get("action"), "result": None}


@router.get("/metrics", include_in_schema=False)
async def metrics() -> dict:
    return {}


__all__ = [
    "LabelConfig",
    "LabelStudioBackend",
    "Prompt",
    "Track",
    "parse_context",
    "parse_tracks",
    "parse_label_config",
    "router",
]
