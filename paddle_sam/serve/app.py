"""The interactive segmentation service: FastAPI app over one predictor and a session cache.

Each uploaded image becomes a session whose embedding is computed once. Prompts (points,
a box, the previous answer's mask, text for models that take it) are decoded against the
session's cached embedding by restoring it into the shared predictor. Paddle is not
thread-safe, so every model call runs under one lock; PNG and RLE encoding run outside it.

``create_app(model_or_predictor)`` builds the app in-process (tests use a tiny model);
``paddle-sam serve`` runs it with uvicorn.
"""

from __future__ import annotations

import base64
import io
import math
import re
import struct
import threading
import time
import warnings
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import paddle
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._runtime import cpu_count, get_num_threads, set_num_threads
from .._version import __version__
from ..models.sam_v1.build_sam import SAM_SPECS
from ..models.sam_v1.sam import Sam
from ..predict.io import ImageTooLargeError, coco_rle, decode_image
from ..predict.sam_v1.predictor import PredictorBase, SamPredictor
from .config import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_UPLOAD_MB,
    DEFAULT_MEMORY_BUDGET_MB,
    DEFAULT_SESSION_TTL_S,
)
from .sessions import Answer, Session, SessionError, SessionStore, nbytes

STATIC_DIR = Path(__file__).parent / "static"
MAX_JSON_BYTES = 1 << 20
UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def _error(status: int, code: str, detail: str, extra: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail, **(extra or {})}, status_code=status)


# -- the model behind a lock ------------------------------------------------------------


class ModelService:
    """One predictor shared by all sessions; its per-image state is swapped per call.

    The predictor's state after ``set_image`` is the attributes named by its
    ``session_state_keys`` (default: ``features``, ``original_size``, ``input_size``), which
    a session keeps and restores before each prompt. A predictor with ``takes_text = True``
    (SAM 3) receives a prompt's text as ``predict(..., text=...)``; ``takes_points = False``
    tells clients it refuses points, and ``returns_instances = True`` that an answer is a set
    of instances (all shown) rather than candidate masks of one object (one shown).
    """

    STATE_KEYS = ("features", "original_size", "input_size")

    def __init__(
        self, predictor: PredictorBase, model_type: str | None = None, threads: int | None = None
    ) -> None:
        self.predictor = predictor
        self.lock = threading.Lock()
        # OpenMP's thread count is per calling thread, and requests run on worker threads
        # that would otherwise compute on one core: apply the creator's count in each of them
        self.threads = threads or get_num_threads() or cpu_count()
        self._configured = threading.local()
        self.state_keys = tuple(getattr(predictor, "session_state_keys", self.STATE_KEYS))
        self.takes_text = bool(getattr(predictor, "takes_text", False))
        self.takes_points = bool(getattr(predictor, "takes_points", True))
        self.returns_instances = bool(getattr(predictor, "returns_instances", False))
        self.model: Sam | None = getattr(predictor, "model", None)
        self.model_type, self.spec = self._describe(model_type)
        self.last_embed_seconds: float | None = None
        # upload id -> [encoder blocks done, blocks in all]; the latest uploads only
        self.embed_progress: OrderedDict[str, list[int]] = OrderedDict()

    def _describe(self, model_type: str | None) -> tuple[str, dict | None]:
        manifest = getattr(self.predictor, "manifest", None)
        spec = getattr(self.model, "spec", None)
        own = getattr(self.predictor, "model_type", None)
        if spec is not None and own is not None:
            return model_type or own, spec.to_dict()
        if spec is not None:
            found = next((k for k, v in SAM_SPECS.items() if v == spec), None)
            return model_type or found or "custom", spec.to_dict()
        if manifest is not None:
            return model_type or manifest.get("model_type") or "custom", manifest.get("spec")
        return model_type or own or type(self.predictor).__name__, None

    @property
    def runtime(self) -> str:
        return "paddle-inference" if hasattr(self.predictor, "manifest") else "dygraph"

    @property
    def supports_everything(self) -> bool:
        return isinstance(self.predictor, SamPredictor)

    @property
    def everything_refusal(self) -> str:
        return getattr(
            self.predictor,
            "everything_refusal",
            f"'everything' mode needs the dynamic model; this server runs {self.runtime}",
        )

    def _use_threads(self) -> None:
        if not getattr(self._configured, "done", False):
            set_num_threads(self.threads)
            self._configured.done = True

    def _track(self, upload_id: str | None) -> list[int]:
        blocks = getattr(getattr(self.model, "image_encoder", None), "blocks", None)
        # one step per encoder block, and a last one when the embedding is ready
        progress = [0, len(blocks) + 1 if blocks is not None else 0]
        if upload_id is not None:
            self.embed_progress[upload_id] = progress
            while len(self.embed_progress) > 256:
                self.embed_progress.popitem(last=False)
        return progress

    def embed(
        self, image: np.ndarray, upload_id: str | None = None
    ) -> tuple[dict[str, Any], float]:
        """Embed an image; with ``upload_id``, count encoder blocks done for progress polls."""
        progress = self._track(upload_id)
        with self.lock:
            self._use_threads()
            hooks = []
            if upload_id is not None and progress[1]:

                def block_done(layer, inputs, output) -> None:
                    progress[0] += 1

                hooks = [
                    b.register_forward_post_hook(block_done)
                    for b in self.model.image_encoder.blocks
                ]
            t = time.perf_counter()
            try:
                self.predictor.set_image(image)
            finally:
                for h in hooks:
                    h.remove()
            seconds = time.perf_counter() - t
            state = {k: getattr(self.predictor, k) for k in self.state_keys}
        progress[0] = progress[1]
        self.last_embed_seconds = seconds
        return state, seconds

    def predict(self, state: dict[str, Any], **kwargs) -> tuple[np.ndarray, ...]:
        with self.lock:
            self._use_threads()
            for k, v in state.items():
                setattr(self.predictor, k, v)
            self.predictor.is_image_set = True
            return self.predictor.predict(**kwargs)

    def yield_lock(self) -> None:
        """Let waiting requests run between the batches of a long job holding the lock."""
        self.lock.release()
        time.sleep(0.002)
        self.lock.acquire()


def _interactive(predictor: Any, text: str | None, has_points: bool, has_mask: bool) -> bool:
    """Whether a model that answers with instances (SAM 3) answers this request with one
    object's candidate masks instead (its interactive path)."""
    decide = getattr(predictor, "is_interactive", None)
    return bool(decide(text, has_points, has_mask)) if decide is not None else False


# -- "everything": automatic mask generation as a background job -------------------------


class JobCancelled(Exception):
    pass


@dataclass
class EverythingJob:
    id: str
    total: int
    status: str = "queued"  # queued, running, done, failed, cancelled
    done: int = 0
    error: str | None = None
    result: list[dict] | None = None
    seconds: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def nbytes(self) -> int:
        if not self.result:
            return 0
        return sum(len(r["segmentation"]["counts"]) + 200 for r in self.result)

    def to_json(self, with_result: bool) -> dict:
        out = {
            "job_id": self.id,
            "status": self.status,
            "done": self.done,
            "total": self.total,
            "progress": round(self.done / self.total, 4) if self.total else 1.0,
            "error": self.error,
            "seconds": self.seconds,
        }
        if with_result and self.result is not None:
            out["masks"] = self.result
        return out


def _everything_generator(service: ModelService, session: Session, job: EverythingJob, **kw):
    """A mask generator that reuses the session's embedding and reports progress per batch."""
    from ..predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    class SessionPredictor(SamPredictor):
        def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
            if tuple(image.shape[:2]) == tuple(session.state["original_size"]):
                for k, v in session.state.items():  # the whole image: its embedding is cached
                    setattr(self, k, v)
                with paddle.no_grad():
                    self.dense_pe = self.model.prompt_encoder.get_dense_pe()
                self.is_image_set = True
            else:  # a crop (crop_n_layers > 0) needs its own embedding
                super().set_image(image, image_format)

    class SessionGenerator(SamAutomaticMaskGenerator):
        def _process_batch(self, *args, **kwargs):
            if job.cancel.is_set():
                raise JobCancelled()
            service.yield_lock()
            out = super()._process_batch(*args, **kwargs)
            job.done += 1
            return out

    gen = SessionGenerator(service.model, output_mode="coco_rle", **kw)
    gen.predictor = SessionPredictor(service.model)
    return gen


def _run_everything(service: ModelService, store: SessionStore, session, job, gen) -> None:
    if job.cancel.is_set():
        job.status = "cancelled"
        return
    job.status = "running"
    t = time.perf_counter()
    try:
        with service.lock:
            service._use_threads()
            records = gen.generate(session.image)
        job.result = [
            {
                "segmentation": r["segmentation"],
                "area": int(r["area"]),
                "bbox": [float(v) for v in r["bbox"]],
                "predicted_iou": float(r["predicted_iou"]),
                "stability_score": float(r["stability_score"]),
                "point_coords": [[float(v) for v in p] for p in r["point_coords"]],
            }
            for r in records
        ]
        job.status = "done"
    except JobCancelled:
        job.status = "cancelled"
    except Exception as exc:  # reported to the client through the progress endpoint
        job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        job.seconds = round(time.perf_counter() - t, 3)
        store.refresh(session)


# -- request bodies ----------------------------------------------------------------------


class PromptRequest(BaseModel):
    """Prompts for one prediction; coordinates are pixels of the uploaded image."""

    model_config = ConfigDict(extra="forbid")

    points: list[tuple[float, float]] = Field(
        default_factory=list, max_length=256, description="[[x, y], ...] in pixels"
    )
    labels: list[Literal[0, 1]] | None = Field(
        default=None, description="one per point: 1 positive, 0 negative (default: all 1)"
    )
    box: tuple[float, float, float, float] | None = Field(
        default=None, description="x0, y0, x1, y1 in pixels"
    )
    previous_mask: bool = Field(
        default=False, description="refine with the low-res logits of this session's last answer"
    )
    previous_index: int | None = Field(
        default=None, description="which mask of the last answer (default: its best)"
    )
    text: str | None = Field(default=None, max_length=1000, description="SAM 3 models only")
    multimask: bool = Field(default=False, description="3 masks instead of 1")
    outputs: list[Literal["png", "rle"]] = Field(
        default_factory=lambda: ["png", "rle"], description="mask encodings to return"
    )


class EverythingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    points_per_side: int = Field(default=32, ge=1, le=64)
    points_per_batch: int = Field(default=64, ge=1, le=256)
    pred_iou_thresh: float = Field(default=0.88, ge=0.0, le=1.0)
    stability_score_thresh: float = Field(default=0.95, ge=0.0, le=1.0)
    box_nms_thresh: float = Field(default=0.7, ge=0.0, le=1.0)
    crop_n_layers: int = Field(default=0, ge=0, le=2)
    min_mask_region_area: int = Field(default=0, ge=0)


UPLOAD_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"image": {"type": "string", "format": "binary"}},
                    "required": ["image"],
                }
            },
            "image/*": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


# -- helpers -----------------------------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def mask_png(mask: np.ndarray) -> bytes:
    """H x W bool -> 1-bit grayscale PNG (reads back as 0/255 in mode L).

    Written directly (bit-packed rows, no filter, zlib level 1): about 3x faster than PIL's
    encoder for a 1024 x 768 mask, and it is on every click's path.
    """
    h, w = mask.shape
    rows = np.zeros((h, (w + 7) // 8 + 1), np.uint8)  # column 0: filter type 0 (none)
    rows[:, 1:] = np.packbits(mask, axis=1)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)),
            _png_chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)),
            _png_chunk(b"IEND", b""),
        ]
    )


def _message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(v) for v in e.get("loc", ()) if v != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


# -- the app -----------------------------------------------------------------------------


def create_app(
    model_or_predictor: Any,
    *,
    model_type: str | None = None,
    memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    session_ttl_s: float | None = DEFAULT_SESSION_TTL_S,
    threads: int | None = None,
) -> FastAPI:
    """The service and its web page for a SAM model (wrapped in a SamPredictor), a SAM 3
    image model (wrapped in a ``Sam3Predictor``) or a predictor.

    ``threads``: CPU threads per model call (default: the calling thread's current setting).
    """
    from ..models.sam3.sam3_image import Sam3Image
    from ..predict.sam3.predictor import Sam3Predictor

    if isinstance(model_or_predictor, Sam):
        predictor: Any = SamPredictor(model_or_predictor)
    elif isinstance(model_or_predictor, Sam3Image):
        predictor = Sam3Predictor(model_or_predictor)
    elif isinstance(model_or_predictor, PredictorBase | Sam3Predictor):
        predictor = model_or_predictor
    else:
        raise TypeError(
            f"create_app needs a SAM model or a predictor, got {type(model_or_predictor).__name__}"
        )
    service = ModelService(predictor, model_type, threads)

    def cancel_jobs(session: Session) -> None:
        for j in session.jobs.values():
            j.cancel.set()

    store = SessionStore(int(memory_budget_mb * 2**20), session_ttl_s, on_drop=cancel_jobs)
    max_upload = int(max_upload_mb * 2**20)
    jobs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="everything")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        for s in store.sessions():
            cancel_jobs(s)
        jobs.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="paddle-sam",
        version=__version__,
        description="Interactive Segment Anything: upload an image once, prompt it many times.",
        docs_url=None,  # the Swagger page loads its assets from a CDN; the schema is enough
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.store = store

    @app.middleware("http")
    async def _limit_json_bodies(request: Request, call_next):
        # prompts and job options are small; only the upload route takes large bodies
        length = request.headers.get("content-length", "")
        upload = request.url.path.rstrip("/") == "/sessions"
        if not upload and length.isdigit() and int(length) > MAX_JSON_BYTES:
            return _error(
                413,
                "body_too_large",
                f"request body of {length} bytes is above the limit of {MAX_JSON_BYTES} bytes",
            )
        return await call_next(request)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _error(exc.status, exc.code, exc.detail)

    @app.exception_handler(SessionError)
    async def _session_error(request: Request, exc: SessionError):
        return _error(exc.status, exc.code, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return _error(422, "invalid_request", _message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        return _error(500, "internal_error", f"{type(exc).__name__}: {exc}")

    # -- page and health --

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/health", summary="the model, threads, sessions and limits")
    def health() -> dict:
        return {
            "status": "ok",
            "model": {
                "type": service.model_type,
                "spec": service.spec,
                "runtime": service.runtime,
                "takes_text": service.takes_text,
                "takes_points": service.takes_points,
                "returns_instances": service.returns_instances,
                "everything": service.supports_everything,
            },
            "threads": service.threads,
            "sessions": store.stats(),
            "limits": {
                "max_image_pixels": max_image_pixels,
                "max_upload_bytes": max_upload,
                "memory_budget_bytes": store.budget_bytes,
            },
            "last_embed_seconds": service.last_embed_seconds,
        }

    # -- sessions --

    # decoded images waiting for the model hold memory outside the cache: bound them; and
    # warnings.catch_warnings is process-wide, so one upload is decoded at a time
    pending_uploads = threading.BoundedSemaphore(2)
    decoding = threading.Lock()

    def _decode(data: bytes, name: str) -> tuple[np.ndarray, list[str]]:
        with decoding, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                image = decode_image(io.BytesIO(data), name, max_image_pixels)
            except ImageTooLargeError as exc:
                raise ApiError(413, "image_too_large", str(exc)) from None
            except ValueError as exc:
                raise ApiError(400, "invalid_image", str(exc)) from None
        return image, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]

    def _new_session(data: bytes, name: str, upload_id: str | None = None) -> Session:
        with pending_uploads:
            image, notes = _decode(data, name)
            # refuse before the (slow) embedding what could never fit in the cache
            if image.nbytes > store.budget_bytes:
                raise ApiError(
                    413,
                    "session_too_large",
                    f"{name}: the decoded image alone ({image.nbytes / 2**20:.1f} MiB) exceeds "
                    f"the session memory budget ({store.budget_bytes / 2**20:.1f} MiB)",
                )
            state, seconds = service.embed(image, upload_id)
        session = Session(store.new_id(), image, state, seconds, notes=notes)
        store.add(session)
        return session

    @app.post(
        "/sessions",
        status_code=201,
        summary="upload an image (multipart field 'image', or the raw bytes); embeds it once",
        openapi_extra=UPLOAD_SCHEMA,
    )
    async def create_session(request: Request, upload_id: str | None = None) -> dict:
        """``upload_id`` (8-64 letters, digits, '-' or '_', chosen by the client) lets it poll
        ``GET /uploads/{upload_id}`` for the embedding's progress while this request runs."""
        if upload_id is not None and not UPLOAD_ID.fullmatch(upload_id):
            raise ApiError(
                400, "invalid_upload_id", "upload_id must be 8-64 letters, digits, '-' or '_'"
            )
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_upload:
            raise ApiError(
                413,
                "upload_too_large",
                f"upload of {int(length)} bytes is above the limit of {max_upload} bytes",
            )
        ctype = request.headers.get("content-type", "")
        name = "upload"
        if ctype.startswith("multipart/form-data"):
            try:
                form = await request.form(max_files=1, max_fields=4)
            except Exception as exc:  # starlette raises its own MultiPartException
                raise ApiError(400, "invalid_upload", f"malformed multipart body: {exc}") from None
            try:
                upload = form.get("image")
                if upload is None or isinstance(upload, str):
                    raise ApiError(
                        400, "invalid_upload", "multipart upload needs a file field named 'image'"
                    )
                name = upload.filename or name
                data = await upload.read(max_upload + 1)
            finally:
                await form.close()
        else:
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_upload:
                    break
                chunks.append(chunk)
            data = b"".join(chunks)
        if len(data) > max_upload:
            raise ApiError(
                413, "upload_too_large", f"upload is above the limit of {max_upload} bytes"
            )
        if not data:
            raise ApiError(400, "invalid_upload", "empty upload: send an image file")
        session = await run_in_threadpool(_new_session, data, name, upload_id)
        return {
            "session_id": session.id,
            "width": session.width,
            "height": session.height,
            "embed_seconds": round(session.embed_seconds, 4),
            "notes": session.notes,
        }

    @app.get("/uploads/{upload_id}", summary="progress of an upload's embedding")
    def upload_progress(upload_id: str) -> dict:
        p = service.embed_progress.get(upload_id)
        if p is None:
            # not started yet (still uploading or decoding), or unknown
            return {"upload_id": upload_id, "stage": "waiting", "done": 0, "total": 0}
        done, total = p
        stage = "done" if total and done >= total else "embedding"
        return {"upload_id": upload_id, "stage": stage, "done": done, "total": total}

    @app.get("/sessions/{session_id}", summary="a session's size and state")
    def get_session(session_id: str) -> dict:
        s = store.get(session_id)
        return {
            "session_id": s.id,
            "width": s.width,
            "height": s.height,
            "bytes": s.nbytes,
            "has_answer": s.answer is not None,
            "jobs": {k: j.status for k, j in s.jobs.items()},
        }

    @app.delete("/sessions/{session_id}", summary="free a session (cancels its jobs)")
    def delete_session(session_id: str) -> dict:
        cancel_jobs(store.delete(session_id))
        return {"deleted": session_id}

    @app.post("/sessions/{session_id}/prompt", summary="masks for points, a box, a mask or text")
    def prompt(session_id: str, req: PromptRequest) -> dict:
        s = store.get(session_id)
        if req.text is not None and not service.takes_text:
            raise ApiError(
                400,
                "text_not_supported",
                f"this model ({service.model_type}) does not take text prompts",
            )
        if not (req.points or req.box or req.previous_mask or req.text):
            raise ApiError(
                400, "empty_prompt", "give at least one point, a box, previous_mask or text"
            )
        if req.labels is not None and len(req.labels) != len(req.points):
            raise ApiError(
                400,
                "invalid_prompt",
                f"labels has {len(req.labels)} entries for {len(req.points)} points",
            )
        kwargs: dict[str, Any] = {"multimask_output": req.multimask}
        if req.points:
            kwargs["point_coords"] = np.asarray(req.points, dtype=np.float64)
            labels = req.labels if req.labels is not None else [1] * len(req.points)
            kwargs["point_labels"] = np.asarray(labels, dtype=np.int32)
        if req.box is not None:
            kwargs["box"] = np.asarray(req.box, dtype=np.float64)
        if req.text is not None:
            kwargs["text"] = req.text
        if req.previous_mask and not getattr(service.predictor, "takes_mask_input", True):
            raise ApiError(
                400,
                "mask_not_supported",
                getattr(service.predictor, "mask_refusal", "this model cannot refine a mask"),
            )
        with s.lock:
            if req.previous_mask:
                last = s.answer
                if last is None:
                    raise ApiError(
                        409, "no_previous_mask", "this session has no previous answer to refine"
                    )
                idx = last.best if req.previous_index is None else req.previous_index
                if idx is None:
                    raise ApiError(
                        409, "no_previous_mask", "the last answer of this session has no mask"
                    )
                if not 0 <= idx < len(last.low_res_logits):
                    raise ApiError(
                        400,
                        "invalid_prompt",
                        f"previous_index {idx} is out of range: the last answer has "
                        f"{len(last.low_res_logits)} masks",
                    )
                kwargs["mask_input"] = last.low_res_logits[idx : idx + 1]
            t = time.perf_counter()
            try:
                masks, scores, logits = service.predict(s.state, **kwargs)
            except ValueError as exc:
                raise ApiError(400, getattr(exc, "code", "invalid_prompt"), str(exc)) from None
            t_model = time.perf_counter() - t
            pngs = [mask_png(m) for m in masks]
            best = int(np.argmax(scores)) if len(scores) else None
            s.answer = Answer(np.asarray(logits, dtype=np.float32), scores, pngs, best)
        out_masks = []
        for i, m in enumerate(masks):
            item: dict[str, Any] = {"index": i, "score": float(scores[i]), "area": int(m.sum())}
            if "png" in req.outputs:
                item["png"] = base64.b64encode(pngs[i]).decode("ascii")
            if "rle" in req.outputs:
                item["rle"] = coco_rle(m)
            out_masks.append(item)
        store.refresh(s)
        return {
            "session_id": s.id,
            "best": best,
            "instances": service.returns_instances
            and not _interactive(service.predictor, req.text, bool(req.points), req.previous_mask),
            "masks": out_masks,
            "timings_ms": {
                "model": round(t_model * 1e3, 2),
                "total": round((time.perf_counter() - t) * 1e3, 2),
            },
        }

    @app.get(
        "/sessions/{session_id}/masks/{index}.png",
        summary="a mask of the session's last answer as PNG (255 inside)",
        response_class=Response,
    )
    def mask_file(session_id: str, index: int) -> Response:
        s = store.get(session_id)
        last = s.answer
        if last is None:
            raise ApiError(404, "no_answer", "this session has no answer yet: send a prompt first")
        if not 0 <= index < len(last.pngs):
            raise ApiError(
                404,
                "no_such_mask",
                f"mask {index} out of range: the last answer has {len(last.pngs)} masks",
            )
        return Response(
            last.pngs[index],
            media_type="image/png",
            headers={"Content-Disposition": f'attachment; filename="mask_{index}.png"'},
        )

    @app.post(
        "/sessions/{session_id}/everything",
        status_code=202,
        summary="start automatic mask generation; poll the job for progress",
    )
    def everything(session_id: str, req: EverythingRequest) -> dict:
        s = store.get(session_id)
        if not service.supports_everything:
            raise ApiError(400, "not_supported", service.everything_refusal)
        from ..predict.sam_v1.amg_utils import generate_crop_boxes

        job = EverythingJob(store.new_id(), total=0)
        gen = _everything_generator(service, s, job, **req.model_dump())
        _, layers = generate_crop_boxes((s.height, s.width), req.crop_n_layers, 512 / 1500)
        job.total = sum(math.ceil(len(gen.point_grids[i]) / req.points_per_batch) for i in layers)
        s.jobs[job.id] = job
        jobs.submit(_run_everything, service, store, s, job, gen)
        return job.to_json(with_result=False)

    @app.get(
        "/sessions/{session_id}/everything/{job_id}",
        summary="progress of an 'everything' job; its masks (COCO RLE) once done",
    )
    def everything_status(session_id: str, job_id: str) -> dict:
        s = store.get(session_id)
        job = s.jobs.get(job_id)
        if job is None:
            raise ApiError(404, "job_not_found", f"unknown job {job_id!r} in session {session_id}")
        return job.to_json(with_result=True)

    return app


__all__ = ["ApiError", "ModelService", "create_app", "mask_png", "nbytes"]
