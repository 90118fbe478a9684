"""The video mode's HTTP API (``/videos``) and its page (``/video``), as ``router`` (an
``APIRouter``) over the app's ``VideoService`` (``app.state.videos``, :mod:`.state`).

Without a video predictor (a SAM v1 model, or SAM 3 without the tracker's weights) every
``/videos`` route answers 400 ``video_not_supported`` with the reason, and the page says it.
With SAM 2 a prompt is one object's clicks and/or box (``text`` is refused with 400
``text_not_supported``).
"""

from __future__ import annotations

import base64
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import cv2
from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.types import Message

from ..predict.sam2.video_requests import NO_TEXT
from .errors import ServiceError
from .guard import BodyTooLarge
from .routes import STATIC_DIR
from .schemas import VIDEO_UPLOAD_SCHEMA, PropagateRequest, VideoPromptRequest, mask_png
from .service import QueueFull
from .sessions import Reservation, SessionStore
from .state import Gates
from .video import _EXTENSIONS, VIDEO_FORMATS, VideoService, VideoSession, sniff_video_format

COPY_CHUNK = 1 << 20

logger = logging.getLogger(__name__)


def _stem(s: VideoSession) -> str:
    """The uploaded file's name without extension, safe in a Content-Disposition header."""
    stem = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in s.name)
    return Path(stem).stem[:80] or "video"


def _check_frame(s: VideoSession, index: int, what: str = "frame_index") -> int:
    if not 0 <= index < s.num_frames:
        raise ServiceError(
            400,
            "invalid_frame",
            f"{what} {index} out of range: the video has {s.num_frames} frames "
            f"(0-{s.num_frames - 1})",
        )
    return index


def _objects_json(s: VideoSession, objects: list, outputs: list[str] | tuple[str, ...]) -> list:
    out = []
    for o in objects:
        item = o.to_json(s.width, s.height)
        if "rle" not in outputs:
            del item["rle"]
        if "png" in outputs:
            item["png"] = base64.b64encode(mask_png(o.mask())).decode("ascii")
        out.append(item)
    return out


def _check_xy(s: VideoSession, x: float, y: float, what: str) -> None:
    if not (0 <= x <= s.width and 0 <= y <= s.height):
        raise ServiceError(
            400,
            "invalid_prompt",
            f"{what} ({x:g}, {y:g}) is outside the {s.width}x{s.height} video",
        )


def _add_prompt_request(
    vs: VideoService, s: VideoSession, req: VideoPromptRequest
) -> dict[str, Any]:
    """The predictor's ``add_prompt`` fields for a checked request (pixels -> [0, 1]); call
    with the session's ``op_lock`` held (a new object's id is chosen here)."""
    if not vs.takes_text:
        return _object_prompt_request(vs, s, req)
    detection = req.text is not None or req.boxes is not None
    if req.points is not None and detection:
        raise ServiceError(
            400,
            "invalid_prompt",
            "points cannot be combined with text or boxes: text and boxes find every instance "
            "of a concept (starting over), points add or refine one object; send one or the "
            "other",
        )
    if req.points is None and not detection:
        raise ServiceError(400, "empty_prompt", "give text, boxes (exemplars) or points")
    if req.obj_id is not None and req.points is None:
        raise ServiceError(400, "invalid_prompt", "obj_id goes with points (the object clicked)")
    w, h = s.width, s.height
    out: dict[str, Any] = {"frame_index": _check_frame(s, req.frame_index)}
    if req.text is not None:
        if not req.text.strip():
            raise ServiceError(400, "invalid_prompt", "the text prompt is blank")
        out["text"] = req.text.strip()
    if req.boxes is not None:
        labels = req.box_labels if req.box_labels is not None else [1] * len(req.boxes)
        if len(labels) != len(req.boxes):
            raise ServiceError(
                400,
                "invalid_prompt",
                f"box_labels has {len(labels)} entries for {len(req.boxes)} boxes",
            )
        boxes = []
        for x0, y0, x1, y1 in req.boxes:
            _check_xy(s, x0, y0, "box corner")
            _check_xy(s, x1, y1, "box corner")
            if not (x1 > x0 and y1 > y0):
                raise ServiceError(
                    400,
                    "invalid_prompt",
                    f"box [{x0:g}, {y0:g}, {x1:g}, {y1:g}] is empty: it needs x1 > x0 and y1 > y0",
                )
            boxes.append([x0 / w, y0 / h, (x1 - x0) / w, (y1 - y0) / h])
        out["bounding_boxes"] = boxes
        out["bounding_box_labels"] = [int(v) for v in labels]
    elif req.box_labels is not None:
        raise ServiceError(400, "invalid_prompt", "box_labels without boxes")
    if req.points is not None:
        labels = req.labels if req.labels is not None else [1] * len(req.points)
        if len(labels) != len(req.points):
            raise ServiceError(
                400,
                "invalid_prompt",
                f"labels has {len(labels)} entries for {len(req.points)} points",
            )
        for x, y in req.points:
            _check_xy(s, x, y, "point")
        out["points"] = [[x / w, y / h] for x, y in req.points]
        out["point_labels"] = [int(v) for v in labels]
        out["obj_id"] = req.obj_id if req.obj_id is not None else vs.next_obj_id(s)
    elif req.labels is not None:
        raise ServiceError(400, "invalid_prompt", "labels without points")
    return out


def _object_prompt_request(
    vs: VideoService, s: VideoSession, req: VideoPromptRequest
) -> dict[str, Any]:
    """SAM 2's ``add_prompt`` fields: one object's clicks and/or box (no text, no exemplars);
    a new object unless ``obj_id`` names one."""
    if req.text is not None:
        raise ServiceError(400, "text_not_supported", NO_TEXT)
    if req.points is None and req.boxes is None:
        raise ServiceError(400, "empty_prompt", "give points and/or a box for the object")
    w, h = s.width, s.height
    out: dict[str, Any] = {"frame_index": _check_frame(s, req.frame_index)}
    if req.boxes is not None:
        if len(req.boxes) != 1 or (req.box_labels is not None and list(req.box_labels) != [1]):
            raise ServiceError(
                400,
                "invalid_prompt",
                "SAM 2 takes one box per object, the object's own (no negative box)",
            )
        x0, y0, x1, y1 = req.boxes[0]
        _check_xy(s, x0, y0, "box corner")
        _check_xy(s, x1, y1, "box corner")
        if not (x1 > x0 and y1 > y0):
            raise ServiceError(
                400,
                "invalid_prompt",
                f"box [{x0:g}, {y0:g}, {x1:g}, {y1:g}] is empty: it needs x1 > x0 and y1 > y0",
            )
        out["bounding_boxes"] = [[x0 / w, y0 / h, (x1 - x0) / w, (y1 - y0) / h]]
    if req.points is not None:
        labels = req.labels if req.labels is not None else [1] * len(req.points)
        if len(labels) != len(req.points):
            raise ServiceError(
                400,
                "invalid_prompt",
                f"labels has {len(labels)} entries for {len(req.points)} points",
            )
        for x, y in req.points:
            _check_xy(s, x, y, "point")
        out["points"] = [[x / w, y / h] for x, y in req.points]
        out["point_labels"] = [int(v) for v in labels]
    elif req.labels is not None:
        raise ServiceError(400, "invalid_prompt", "labels without points")
    out["obj_id"] = req.obj_id if req.obj_id is not None else vs.next_obj_id(s)
    return out


def _refused(s: VideoSession, code: str, exc: ValueError) -> ServiceError:
    """The predictor's refusal of a request, or 410 when the session went meanwhile (evicted
    or expired while the request waited for the model)."""
    if s.closed:
        return ServiceError(
            410,
            "session_expired",
            f"session {s.id} was dropped while this request waited (memory budget or idle "
            "time); upload the video again for a new session",
        )
    return ServiceError(400, code, str(exc))


def _busy(s: VideoSession) -> None:
    job = s.active_job
    if job is not None:
        raise ServiceError(
            409,
            "propagation_running",
            f"propagation {job.id} is {job.status} on this video: wait for it or cancel it "
            f"(DELETE /videos/{s.id}/propagate/{job.id}) before changing the prompts",
        )


@dataclass(frozen=True)
class VideoMode:
    """The video mode as a route sees it: the app's ``VideoService`` (None without one, and
    ``refusal`` says why), the session cache and the app's gates."""

    videos: VideoService | None
    refusal: str
    store: SessionStore
    gates: Gates

    def service(self) -> VideoService:
        """The video service; 400 ``video_not_supported`` without one."""
        if self.videos is None:
            raise ServiceError(400, "video_not_supported", self.refusal)
        return self.videos

    def session(self, session_id: str) -> VideoSession:
        self.service()
        return self.store.get(session_id, VideoSession)


async def _video_mode(request: Request) -> VideoMode:
    state = request.app.state
    return VideoMode(state.videos, state.limits.video_refusal, state.store, state.gates)


Mode = Annotated[VideoMode, Depends(_video_mode)]

router = APIRouter()


@router.get("/video", include_in_schema=False)
def video_page() -> FileResponse:
    return FileResponse(STATIC_DIR / "video.html")


def _start(
    mode: VideoMode, folder: Path, upload: Path, name: str, reservation: Reservation
) -> VideoSession:
    vs = mode.service()
    with open(upload, "rb") as f:
        head = f.read(64)
    if not head:
        raise ServiceError(400, "invalid_upload", "empty upload: send a video file")
    fmt = sniff_video_format(head)
    if fmt is None:
        raise ServiceError(
            400, "invalid_video", f"{name}: not a video: the formats read are {VIDEO_FORMATS}"
        )
    path = upload.with_name("video" + _EXTENSIONS[fmt])
    upload.rename(path)
    with mode.gates.video_starts:
        return vs.start(folder, path, name, reservation)


def _counted(request: Request, reservation: Reservation) -> Request:
    """The request, its body's bytes held in the store's budget as they arrive (beyond
    those its Content-Length reserved): the reservation refuses past the budget."""
    receive = request.receive
    received = 0

    async def counted_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > reservation.bytes:
                reservation.grow(received - reservation.bytes)
        return message

    return Request(request.scope, counted_receive)


async def _read_upload(request: Request, upload: Path) -> str:
    """The body's video into ``upload`` (a multipart field 'video', or the raw bytes); the
    name the client gave it."""
    name = "upload"
    ctype = request.headers.get("content-type", "").lower()
    if ctype.startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=1, max_fields=4)
        except (BodyTooLarge, ClientDisconnect, ServiceError):
            raise
        except Exception as exc:  # starlette's MultiPartException
            raise ServiceError(400, "invalid_upload", f"malformed multipart body: {exc}") from None
        try:
            part = form.get("video")
            if part is None or isinstance(part, str):
                raise ServiceError(
                    400,
                    "invalid_upload",
                    "multipart upload needs a file field named 'video'",
                )
            name = part.filename or name
            with open(upload, "wb") as f:  # the guard kept it within the limit
                await run_in_threadpool(shutil.copyfileobj, part.file, f, COPY_CHUNK)
        finally:
            await form.close()
    else:
        with open(upload, "wb") as f:
            async for chunk in request.stream():
                f.write(chunk)
    return name


@router.post(
    "/videos",
    status_code=201,
    summary="upload a video (multipart field 'video', or the raw bytes); opens a session",
    openapi_extra=VIDEO_UPLOAD_SCHEMA,
)
async def create_video(request: Request, mode: Mode) -> dict:
    vs = mode.service()
    length = request.headers.get("content-length", "").strip()
    # the upload holds its bytes in the memory budget until its session takes their place
    reservation = mode.store.reserve(int(length) if length.isdigit() else 0, "video")
    folder = vs.new_folder()
    upload = folder / "upload"
    try:
        name = await _read_upload(_counted(request, reservation), upload)
        t = time.perf_counter()
        s = await run_in_threadpool(_start, mode, folder, upload, name, reservation)
    except ClientDisconnect:
        size = upload.stat().st_size if upload.exists() else 0
        shutil.rmtree(folder, ignore_errors=True)
        logger.info("video upload abandoned by the client (%d bytes written)", size)
        # one line in the log, no traceback; nobody reads this answer: the client is gone
        raise ServiceError(
            400, "client_disconnected", "the client left during the upload"
        ) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        reservation.release()
    return {
        **s.to_json(),
        "open_seconds": round(time.perf_counter() - t, 4),
    }


@router.get("/videos/{session_id}", summary="a video session: size, objects, propagation")
def get_video(session_id: str, mode: Mode) -> dict:
    return mode.session(session_id).to_json()


@router.delete("/videos/{session_id}", summary="free a video session (cancels its propagation)")
def delete_video(session_id: str, mode: Mode) -> dict:
    vs = mode.service()
    s = mode.store.delete(session_id, VideoSession)
    vs.close(s)
    return {"deleted": session_id}


@router.get(
    "/videos/{session_id}/frames/{index}.jpg",
    summary="frame `index` as JPEG",
    response_class=Response,
)
def frame_jpeg(session_id: str, index: int, mode: Mode) -> Response:
    s = mode.session(session_id)
    _check_frame(s, index, "frame")
    rgb = s.rgb(index)
    ok, data = cv2.imencode(".jpg", rgb[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise ServiceError(500, "internal_error", f"frame {index} could not be encoded as JPEG")
    return Response(
        data.tobytes(),
        media_type="image/jpeg",
        headers={"Cache-Control": "private, max-age=3600"},
    )


@router.get(
    "/videos/{session_id}/frames/{index}",
    summary="the objects on frame `index` (ids, scores, boxes, masks): for scrubbing",
)
def frame_results(
    session_id: str,
    index: int,
    mode: Mode,
    outputs: list[str] = Query(default=["rle"]),  # noqa: B008 - FastAPI's idiom
) -> dict:
    s = mode.session(session_id)
    _check_frame(s, index, "frame")
    wanted = [v for part in outputs for v in part.split(",") if v]
    bad = sorted(set(wanted) - {"rle", "png"})
    if bad:
        raise ServiceError(400, "invalid_request", f"outputs are 'rle' and 'png', not {bad}")
    with s.lock:
        objects = s.results.get(index)
        version = s.version
        stale = sorted(s.changed)
    return {
        "session_id": s.id,
        "frame_index": index,
        "has_results": objects is not None,
        "objects": _objects_json(s, objects or [], wanted),
        "changed_objects": stale,
        "version": version,
    }


@router.get(
    "/videos/{session_id}/frames/{index}/masks/{obj_id}.png",
    summary="object `obj_id`'s mask on frame `index` as PNG (255 inside)",
    response_class=Response,
)
def frame_mask(session_id: str, index: int, obj_id: int, mode: Mode) -> Response:
    s = mode.session(session_id)
    _check_frame(s, index, "frame")
    with s.lock:
        objects = s.results.get(index) or []
    found = next((o for o in objects if o.obj_id == obj_id), None)
    if found is None:
        raise ServiceError(
            404, "no_such_mask", f"object {obj_id} has no mask on frame {index} (yet)"
        )
    return Response(
        mask_png(found.mask()),
        media_type="image/png",
        headers={"Content-Disposition": f'attachment; filename="mask_{index:05d}_{obj_id}.png"'},
    )


@router.post(
    "/videos/{session_id}/prompt",
    summary="text, exemplar boxes or an object's clicks on one frame; its objects",
)
def video_prompt(session_id: str, req: VideoPromptRequest, mode: Mode) -> dict:
    vs = mode.service()
    s = mode.session(session_id)
    with s.op_lock:
        _busy(s)
        request = _add_prompt_request(vs, s, req)
        t = time.perf_counter()
        try:
            frame, objects = vs.prompt(s, request)
        except ValueError as exc:
            raise _refused(s, "invalid_prompt", exc) from None
        t_model = time.perf_counter() - t
        body = s.to_json()
    return {
        "session_id": s.id,
        "frame_index": frame,
        "obj_id": request.get("obj_id"),
        "objects": _objects_json(s, objects, req.outputs),
        "needs_propagation": body["needs_propagation"],
        "timings_ms": {"model": round(t_model * 1e3, 2)},
    }


@router.delete(
    "/videos/{session_id}/objects/{obj_id}", summary="stop tracking an object (every frame)"
)
def remove_object(session_id: str, obj_id: int, mode: Mode) -> dict:
    vs = mode.service()
    s = mode.session(session_id)
    with s.op_lock:
        _busy(s)
        if obj_id not in s.objects:
            raise ServiceError(
                404,
                "object_not_found",
                f"no object {obj_id} in this video (objects: {sorted(s.objects)})",
            )
        try:
            vs.remove_object(s, obj_id)
        except ValueError as exc:
            raise _refused(s, "invalid_request", exc) from None
    return {"removed": obj_id, "objects": sorted(s.objects)}


@router.post("/videos/{session_id}/reset", summary="forget every prompt, object and result")
def reset_video(session_id: str, mode: Mode) -> dict:
    vs = mode.service()
    s = mode.session(session_id)
    with s.op_lock:
        _busy(s)
        try:
            vs.reset(s)
        except ValueError as exc:
            raise _refused(s, "invalid_request", exc) from None
    return s.to_json()


@router.post(
    "/videos/{session_id}/propagate",
    status_code=202,
    summary="track the objects through the video; poll the job for progress",
)
def propagate(session_id: str, req: PropagateRequest, mode: Mode) -> dict:
    vs = mode.service()
    s = mode.session(session_id)
    if req.start_frame_index is not None:
        _check_frame(s, req.start_frame_index, "start_frame_index")
    with s.op_lock:
        _busy(s)
        if not s.prompted_frames:
            raise ServiceError(
                409,
                "nothing_to_propagate",
                "nothing to propagate: prompt a frame first (text, a box or a click)",
            )
        try:
            job = vs.start_propagation(s, req.direction, req.start_frame_index, req.max_frames)
        except QueueFull as exc:
            raise ServiceError(429, "queue_full", str(exc), headers={"Retry-After": "5"}) from None
        except ValueError as exc:
            raise _refused(s, "invalid_request", exc) from None
    return job.to_json()


def _job(s: VideoSession, job_id: str):
    job = s.jobs.get(job_id)
    if job is None:
        raise ServiceError(
            404, "job_not_found", f"unknown propagation {job_id!r} in video session {s.id}"
        )
    return job


@router.get("/videos/{session_id}/propagate/{job_id}", summary="a propagation's progress")
def propagation_status(session_id: str, job_id: str, mode: Mode) -> dict:
    return _job(mode.session(session_id), job_id).to_json()


@router.delete(
    "/videos/{session_id}/propagate/{job_id}",
    summary="cancel a propagation (it stops after the frame in progress)",
)
def cancel_propagation(session_id: str, job_id: str, mode: Mode) -> dict:
    job = _job(mode.session(session_id), job_id)
    if job.active:
        job.cancel.set()
    return job.to_json()


@router.get(
    "/videos/{session_id}/results.json",
    summary="YouTube-VIS style results (COCO RLE per object and frame), as paddle-sam track",
)
def results_json(session_id: str, mode: Mode) -> JSONResponse:
    vs = mode.service()
    s = mode.session(session_id)
    stem = _stem(s)
    return JSONResponse(
        vs.results_json(s),
        headers={"Content-Disposition": f'attachment; filename="{stem}_results.json"'},
    )


@router.get(
    "/videos/{session_id}/overlay.mp4",
    summary="the frames with results, objects drawn with their ids and scores (MP4)",
    response_class=FileResponse,
)
def overlay_mp4(session_id: str, mode: Mode) -> FileResponse:
    vs = mode.service()
    s = mode.session(session_id)
    if not s.results:
        raise ServiceError(
            409, "no_results", "no frame has results yet: prompt a frame or propagate first"
        )
    path = vs.overlay_video(s)
    stem = _stem(s)
    return FileResponse(path, media_type="video/mp4", filename=f"{stem}_overlay.mp4")


__all__ = ["VideoMode", "router"]
