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
waiting (503 beyond).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
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
)
from .errors import ServiceError
from .fetch import Fetcher, UpstreamError, origin_of
from .routes import decode_image_bytes
from .service import ModelService
from .sessions import Session, SessionError, SessionStore

MAX_CLICK_PROMPTS = 64  # points in one request's context
MAX_PREDICTS = 4  # /predict requests working at once (downloads, embeddings, prompts)
MAX_WAITING = 16  # more may wait for their turn; 503 beyond
ACCESS_TOKEN_S = 240.0  # how long an access token from a personal access token is reused


# -- the labelling config ------------------------------------------------------------------


@dataclass
class LabelConfig:
    """What the backend reads of a project's labelling config (the XML)."""

    image: str  # the Image tag's name (results' "to_name")
    image_key: str  # the task data key of its value ("$image" -> "image")
    brush: str  # the BrushLabels tag's name (results' "from_name")
    labels: list[str] = field(default_factory=list)  # its Label values

    def label_for(self, name: str | None) -> str | None:
        """The brush label named like ``name`` (case and spaces aside); None if none is."""
        if name is None:
            return None
        key = " ".join(name.split()).casefold()
        return next((v for v in self.labels if " ".join(v.split()).casefold() == key), None)


def parse_label_config(xml: str | None) -> LabelConfig:
    """The ``Image`` and ``BrushLabels`` tags of a labelling config; ValueError naming what is
    missing."""
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
    if not images:
        raise ValueError("the labelling config has no <Image> tag: paddle-sam segments images")
    brushes = [el for el in root.iter() if el.tag == "BrushLabels" and el.get("toName") in images]
    if not brushes:
        raise ValueError(
            "the labelling config has no <BrushLabels> tag on its image: paddle-sam answers "
            'with brush masks (add e.g. <BrushLabels name="tag" toName="image"><Label '
            'value="car"/></BrushLabels>)'
        )
    brush = brushes[0]
    image = brush.get("toName")
    value = images[image]
    if not value.startswith("$") or len(value) < 2:
        raise ValueError(
            f"the <Image name={image!r}> tag's value must name a task field ('$image'), "
            f"got {value!r}"
        )
    labels = [el.get("value") for el in brush.iter("Label") if el.get("value")]
    return LabelConfig(image=image, image_key=value[1:], brush=brush.get("name"), labels=labels)


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

    def download(self, ref: str) -> bytes:
        if ref.startswith("data:"):
            header, _, data = ref.partition(",")
            try:
                return base64.b64decode(data, validate=True) if ";base64" in header else b""
            except binascii.Error:
                raise ServiceError(
                    400, "invalid_image", "the task's data: URL is not base64"
                ) from None
        try:
            return self.fetcher.get(self._url(ref), self._auth_header)
        except UpstreamError as exc:
            if exc.upstream_status in (401, 403):
                exc.detail += (
                    ": check the token (--label-studio-api-key, or the legacy token Label "
                    "Studio sends at /setup)"
                )
            raise

    # -- the model's side --

    def _session(self, task: dict, config: LabelConfig) -> Session:
        """The task's image and embedding: from the cache, else downloaded and embedded."""
        data = task.get("data") if isinstance(task.get("data"), dict) else {}
        ref = data.get(config.image_key)
        if not isinstance(ref, str) or not ref:
            raise ServiceError(
                400,
                "invalid_task",
                f"task {task.get('id')}: no image at data.{config.image_key} (the <Image> "
                f"tag's value is ${config.image_key})",
            )
        key = f"ls-{task.get('id')}-" + uuid.uuid5(uuid.NAMESPACE_URL, ref).hex
        with self._lock:
            lock = self._embedding.setdefault(key, threading.Lock())
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
    "parse_context",
    "parse_label_config",
    "router",
]
