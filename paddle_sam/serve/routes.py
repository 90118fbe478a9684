"""The service's HTTP API: the page, health, sessions, prompts, mask downloads and
"everything" jobs, as ``router`` (an ``APIRouter``) over what ``create_app`` keeps in
``app.state`` (:mod:`.state`): a ``ModelService``, a ``SessionStore`` and a ``JobQueue``.

Every error is JSON ``{"error": code, "detail": message}`` with its HTTP status
(:mod:`.errors`). Requests reach the routes through ``guard.RequestGuard`` (host, origin,
token, content type, body size), which answers the refused ones with the same JSON. The
video mode's routes are ``video_routes``'; the static files are mounted by ``create_app``.
"""

from __future__ import annotations

import base64
import io
import re
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response

from ..predict.io import ImageTooLargeError, coco_rle, decode_image
from .config import MAX_JSON_BYTES
from .errors import ServiceError
from .guard import BodyTooLarge
from .schemas import UPLOAD_SCHEMA, EverythingRequest, PromptRequest, mask_png
from .service import ModelService, QueueFull, cancel_jobs, start_everything
from .sessions import Answer, Session, SessionStore
from .state import AppGates, AppLimits, Gates, Jobs, Limits, Service, Store, Videos

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


def decode_image_bytes(data: bytes, name: str, max_pixels: int) -> np.ndarray:
    """An uploaded or downloaded image file as ``H x W x 3`` uint8: only the formats of
    :data:`IMAGE_SIGNATURES` (by their first bytes), within ``max_pixels``; else the
    :class:`ServiceError` a client gets (400 ``invalid_image``, 413 ``image_too_large``)."""
    if sniff_image_format(data) is None:
        raise ServiceError(
            400,
            "invalid_image",
            f"{name}: not a readable image: the formats read are {IMAGE_FORMATS}",
        )
    try:
        return decode_image(io.BytesIO(data), name, max_pixels)
    except ImageTooLargeError as exc:
        raise ServiceError(413, "image_too_large", str(exc)) from None
    except ValueError as exc:
        raise ServiceError(400, "invalid_image", str(exc)) from None


router = APIRouter()

# -- page and health --


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html")


@router.get("/health", summary="the model, threads, sessions and limits")
def health(service: Service, store: Store, jobs: Jobs, videos: Videos, limits: AppLimits) -> dict:
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
            "max_image_pixels": limits.max_image_pixels,
            "max_upload_bytes": limits.max_upload,
            "max_json_bytes": MAX_JSON_BYTES,
            "max_queued_jobs": jobs.max_jobs,
            "memory_budget_bytes": store.budget_bytes,
        },
        "last_embed_seconds": service.last_embed_seconds,
        "video": {
            "available": videos is not None,
            "detail": None if videos is not None else limits.video_refusal,
            "limits": limits.video.to_json(),
            "last_open_seconds": videos.last_start_seconds if videos is not None else None,
        },
    }


# -- sessions --


def _decode(gates: Gates, data: bytes, name: str, max_pixels: int) -> tuple[np.ndarray, list[str]]:
    with gates.decoding, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = decode_image_bytes(data, name, max_pixels)
    return image, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def _new_session(
    service: ModelService,
    store: SessionStore,
    limits: Limits,
    gates: Gates,
    data: bytes,
    name: str,
    upload_id: str | None = None,
) -> Session:
    with gates.uploads:
        image, notes = _decode(gates, data, name, limits.max_image_pixels)
        # refuse before the (slow) embedding what could never fit in the cache
        if image.nbytes > store.budget_bytes:
            raise ServiceError(
                413,
                "session_too_large",
                f"{name}: the decoded image alone ({image.nbytes / 2**20:.1f} MiB) exceeds "
                f"the session memory budget ({store.budget_bytes / 2**20:.1f} MiB)",
            )
        try:
            state, seconds = service.embed(image, upload_id)
        except ValueError as exc:  # an image the model cannot take (1 x 100000 pixels)
            raise ServiceError(400, "invalid_image", f"{name}: {exc}") from None
    session = Session(store.new_id(), image, state, seconds, notes=notes)
    store.add(session)
    return session


@router.post(
    "/sessions",
    status_code=201,
    summary="upload an image (multipart field 'image', or the raw bytes); embeds it once",
    openapi_extra=UPLOAD_SCHEMA,
)
async def create_session(
    request: Request,
    service: Service,
    store: Store,
    limits: AppLimits,
    gates: AppGates,
    upload_id: str | None = None,
) -> dict:
    """``upload_id`` (8-64 letters, digits, '-' or '_', chosen by the client) lets it poll
    ``GET /uploads/{upload_id}`` for the embedding's progress while this request runs."""
    if upload_id is not None and not UPLOAD_ID.fullmatch(upload_id):
        raise ServiceError(
            400, "invalid_upload_id", "upload_id must be 8-64 letters, digits, '-' or '_'"
        )
    max_upload = limits.max_upload
    # the guard has checked the content type and keeps the body within max_upload
    ctype = request.headers.get("content-type", "").lower()
    name = "upload"
    if ctype.startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=1, max_fields=4)
        except BodyTooLarge:
            raise
        except Exception as exc:  # starlette raises its own MultiPartException
            raise ServiceError(400, "invalid_upload", f"malformed multipart body: {exc}") from None
        try:
            upload = form.get("image")
            if upload is None or isinstance(upload, str):
                raise ServiceError(
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
        raise ServiceError(
            413, "upload_too_large", f"upload is above the limit of {max_upload} bytes"
        )
    if not data:
        raise ServiceError(400, "invalid_upload", "empty upload: send an image file")
    session = await run_in_threadpool(
        _new_session, service, store, limits, gates, data, name, upload_id
    )
    return {
        "session_id": session.id,
        "width": session.width,
        "height": session.height,
        "embed_seconds": round(session.embed_seconds, 4),
        "notes": session.notes,
    }


@router.get("/uploads/{upload_id}", summary="progress of an upload's embedding")
def upload_progress(upload_id: str, service: Service) -> dict:
    p = service.embed_progress.get(upload_id)
    if p is None:
        # not started yet (still uploading or decoding), or unknown
        return {"upload_id": upload_id, "stage": "waiting", "done": 0, "total": 0}
    done, total = p
    stage = "done" if total and done >= total else "embedding"
    return {"upload_id": upload_id, "stage": stage, "done": done, "total": total}


@router.get("/sessions/{session_id}", summary="a session's size and state")
def get_session(session_id: str, store: Store) -> dict:
    s = store.get(session_id)
    return {
        "session_id": s.id,
        "width": s.width,
        "height": s.height,
        "bytes": s.nbytes,
        "has_answer": s.answer is not None,
        "jobs": {k: j.status for k, j in s.jobs.items()},
    }


@router.delete("/sessions/{session_id}", summary="free a session (cancels its jobs)")
def delete_session(session_id: str, store: Store) -> dict:
    cancel_jobs(store.delete(session_id))
    return {"deleted": session_id}


def _prompt_kwargs(service: ModelService, req: PromptRequest) -> dict[str, Any]:
    """The predictor's arguments for a prompt, but the previous mask (read under the
    session's lock); the refusals that need no session state."""
    if req.text is not None and not service.takes_text:
        raise ServiceError(
            400,
            "text_not_supported",
            f"this model ({service.model_type}) does not take text prompts",
        )
    if not (req.points or req.box or req.previous_mask or req.text):
        raise ServiceError(
            400, "empty_prompt", "give at least one point, a box, previous_mask or text"
        )
    if req.labels is not None and len(req.labels) != len(req.points):
        raise ServiceError(
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
        raise ServiceError(400, "mask_not_supported", service.mask_refusal)
    return kwargs


def _previous_logits(s: Session, index: int | None) -> np.ndarray:
    """The low-res logits of mask ``index`` (default: the best) of the session's last answer,
    as ``mask_input``; call with the session's lock held."""
    last = s.answer
    if last is None:
        raise ServiceError(409, "no_previous_mask", "this session has no previous answer to refine")
    idx = last.best if index is None else index
    if idx is None:
        raise ServiceError(409, "no_previous_mask", "the last answer of this session has no mask")
    if not 0 <= idx < len(last.low_res_logits):
        raise ServiceError(
            400,
            "invalid_prompt",
            f"previous_index {idx} is out of range: the last answer has "
            f"{len(last.low_res_logits)} masks",
        )
    return last.low_res_logits[idx : idx + 1]


@router.post("/sessions/{session_id}/prompt", summary="masks for points, a box, a mask or text")
def prompt(session_id: str, req: PromptRequest, service: Service, store: Store) -> dict:
    s = store.get(session_id)
    kwargs = _prompt_kwargs(service, req)
    with s.lock:
        if req.previous_mask:
            kwargs["mask_input"] = _previous_logits(s, req.previous_index)
        t = time.perf_counter()
        try:
            masks, scores, logits = service.predict(s.state, **kwargs)
        except ValueError as exc:
            raise ServiceError(400, getattr(exc, "code", "invalid_prompt"), str(exc)) from None
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


@router.get(
    "/sessions/{session_id}/masks/{index}.png",
    summary="a mask of the session's last answer as PNG (255 inside)",
    response_class=Response,
)
def mask_file(session_id: str, index: int, store: Store) -> Response:
    s = store.get(session_id)
    last = s.answer
    if last is None:
        raise ServiceError(404, "no_answer", "this session has no answer yet: send a prompt first")
    if not 0 <= index < len(last.pngs):
        raise ServiceError(
            404,
            "no_such_mask",
            f"mask {index} out of range: the last answer has {len(last.pngs)} masks",
        )
    return Response(
        last.pngs[index],
        media_type="image/png",
        headers={"Content-Disposition": f'attachment; filename="mask_{index}.png"'},
    )


@router.post(
    "/sessions/{session_id}/everything",
    status_code=202,
    summary="start automatic mask generation; poll the job for progress",
)
def everything(
    session_id: str, req: EverythingRequest, service: Service, store: Store, jobs: Jobs
) -> dict:
    s = store.get(session_id)
    if not service.supports_everything:
        raise ServiceError(400, "not_supported", service.everything_refusal)
    try:
        options = service.everything_options(req.model_dump(exclude_unset=True), req.model_dump())
        job = start_everything(service, store, jobs, s, options)
    except QueueFull as exc:
        raise ServiceError(429, "queue_full", str(exc), headers={"Retry-After": "5"}) from None
    return job.to_json(with_result=False)


@router.get(
    "/sessions/{session_id}/everything/{job_id}",
    summary="progress of an 'everything' job; its masks (COCO RLE) once done",
)
def everything_status(session_id: str, job_id: str, store: Store) -> dict:
    s = store.get(session_id)
    job = s.jobs.get(job_id)
    if job is None:
        raise ServiceError(404, "job_not_found", f"unknown job {job_id!r} in session {session_id}")
    return job.to_json(with_result=True)


__all__ = [
    "IMAGE_FORMATS",
    "STATIC_DIR",
    "decode_image_bytes",
    "router",
    "sniff_image_format",
]
