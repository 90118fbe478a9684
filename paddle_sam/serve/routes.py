"""The service's HTTP API: the error handlers and the routes, over a ``ModelService`` and a
``SessionStore``.

Every error is JSON ``{"error": code, "detail": message}`` with its HTTP status. Requests
reach the routes through ``guard.RequestGuard`` (host, origin, token, content type, body
size), which answers the refused ones with the same JSON.
"""

from __future__ import annotations

import base64
import io
import re
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..predict.io import ImageTooLargeError, coco_rle, decode_image
from .config import MAX_JSON_BYTES
from .guard import BodyTooLarge
from .schemas import UPLOAD_SCHEMA, EverythingRequest, PromptRequest, mask_png
from .service import JobQueue, ModelService, QueueFull, cancel_jobs, start_everything
from .sessions import Answer, Session, SessionError, SessionStore

STATIC_DIR = Path(__file__).parent / "static"
UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")

# the formats decoded (README, "Serve"), by their first bytes; nothing else reaches PIL, so
# no PostScript reaches Ghostscript and no rarely used decoder sees what a client sends
IMAGE_SIGNATURES = {
    "PNG": (b"\x89PNG\r\n\x1a\n",),
    "JPEG": (b"\xff\xd8\xff",),
    "GIF": (b"GIF87a", b"GIF89a"),
    "BMP": (b"BM",),
    "TIFF": (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"),  # classic and BigTIFF
}
IMAGE_FORMATS = "PNG, JPEG, WebP, BMP, TIFF or GIF"


def sniff_image_format(data: bytes) -> str | None:
    """The format of an image file by its first bytes, among those decoded; None if another."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    for name, signatures in IMAGE_SIGNATURES.items():
        if data.startswith(signatures):
            return name
    return None


class ApiError(Exception):
    """An error answered as ``{"error": code, "detail": detail}`` with HTTP ``status``."""

    def __init__(
        self, status: int, code: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def decode_image_bytes(data: bytes, name: str, max_pixels: int) -> np.ndarray:
    """An uploaded or downloaded image file as ``H x W x 3`` uint8: only the formats of
    :data:`IMAGE_SIGNATURES` (by their first bytes), within ``max_pixels``; else the
    :class:`ApiError` a client gets (400 ``invalid_image``, 413 ``image_too_large``)."""
    if sniff_image_format(data) is None:
        raise ApiError(
            400,
            "invalid_image",
            f"{name}: not a readable image: the formats read are {IMAGE_FORMATS}",
        )
    try:
        return decode_image(io.BytesIO(data), name, max_pixels)
    except ImageTooLargeError as exc:
        raise ApiError(413, "image_too_large", str(exc)) from None
    except ValueError as exc:
        raise ApiError(400, "invalid_image", str(exc)) from None


def _error(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def _message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(v) for v in e.get("loc", ()) if v != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def add_error_handlers(app: FastAPI) -> None:
    """Answer every error with the error JSON."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _error(exc.status, exc.code, exc.detail, exc.headers)

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


def add_routes(
    app: FastAPI,
    service: ModelService,
    store: SessionStore,
    jobs: JobQueue,
    *,
    max_image_pixels: int,
    max_upload: int,
    videos: Any = None,
    video_limits: Any = None,
    video_refusal: str | None = None,
) -> None:
    """The page, health, sessions, prompts, mask downloads and "everything" jobs. ``videos``
    (a ``VideoService`` or None), ``video_limits`` and ``video_refusal`` are reported by
    ``/health``; the video routes are ``video_routes``'."""

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
                "video": videos is not None,
            },
            "threads": service.threads,
            "sessions": store.stats(),
            "limits": {
                "max_image_pixels": max_image_pixels,
                "max_upload_bytes": max_upload,
                "max_json_bytes": MAX_JSON_BYTES,
                "max_queued_jobs": jobs.max_jobs,
                "memory_budget_bytes": store.budget_bytes,
            },
            "last_embed_seconds": service.last_embed_seconds,
            "video": {
                "available": videos is not None,
                "detail": None if videos is not None else video_refusal,
                "limits": video_limits.to_json() if video_limits is not None else None,
                "last_open_seconds": videos.last_start_seconds if videos is not None else None,
            },
        }

    # -- sessions --

    # decoded images waiting for the model hold memory outside the cache: bound them; and
    # warnings.catch_warnings is process-wide, so one upload is decoded at a time
    pending_uploads = threading.BoundedSemaphore(2)
    decoding = threading.Lock()

    def _decode(data: bytes, name: str) -> tuple[np.ndarray, list[str]]:
        with decoding, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            image = decode_image_bytes(data, name, max_image_pixels)
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
            try:
                state, seconds = service.embed(image, upload_id)
            except ValueError as exc:  # an image the model cannot take (1 x 100000 pixels)
                raise ApiError(400, "invalid_image", f"{name}: {exc}") from None
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
        # the guard has checked the content type and keeps the body within max_upload
        ctype = request.headers.get("content-type", "").lower()
        name = "upload"
        if ctype.startswith("multipart/form-data"):
            try:
                form = await request.form(max_files=1, max_fields=4)
            except BodyTooLarge:
                raise
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
        if req.previous_mask and not service.takes_mask_input:
            raise ApiError(400, "mask_not_supported", service.mask_refusal)
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
            "instances": service.answers_instances(req.text, bool(req.points), req.previous_mask),
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
        try:
            job = start_everything(service, store, jobs, s, req.model_dump())
        except QueueFull as exc:
            raise ApiError(429, "queue_full", str(exc), headers={"Retry-After": "5"}) from None
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


__all__ = [
    "MAX_JSON_BYTES",
    "ApiError",
    "add_error_handlers",
    "add_routes",
    "decode_image_bytes",
    "sniff_image_format",
]
