"""The service's video mode: SAM 3's video predictor (or SAM 2's, behind the same request API:
``Sam2VideoRequests``) behind the model lock, one session per uploaded video in the shared
session cache, propagation as a background job.

A video session holds the uploaded file (in the service's temporary folder), a frame reader
for its RGB frames (:func:`paddle_sam.predict.video.open_video`, a few decoded frames kept),
the predictor's session (SAM 3's inference state: frame features, tracker memories, cached
outputs) and the latest result of every frame (COCO RLE per object, with id, score and box).
All of it counts against the service's memory budget: the inference state is measured after
every model call (every array and tensor it holds, :func:`deep_nbytes`), the results and the
frame cache by their bytes, the file by its size on disk. An upload is checked and decoded
(once, to count its frames; every limit on the frames themselves) outside the model lock;
the predictor's session gets the frames opened. A session that passes the whole budget by
itself is dropped, not the others; a propagation stops before it would.

Requests follow ``Sam3VideoPredictor.handle_request`` (upstream sam3 0.1.4): a text or
exemplar-box prompt starts over (every object is replaced by the detections on that frame);
points add an object (a new id) or refine one (an existing id), on any frame; propagation
yields every frame of the requested range and is stopped between frames to cancel it. The
server's coordinates are pixels of the video; the predictor's are normalised to [0, 1].
"""

from __future__ import annotations

import logging
import operator
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..predict.io import coco_rle, decode_coco_rle
from ..predict.video import (
    VideoError,
    VideoFrames,
    VideoTooLarge,
    open_video,
    preprocess_sam3_frame,
)
from .errors import ServiceError
from .service import JobCancelled, JobQueue, ModelService
from .sessions import Reservation, SessionError, SessionStore, SessionTooLarge

logger = logging.getLogger(__name__)

# -- the upload: container by its first bytes, then OpenCV --------------------------------

VIDEO_FORMATS = "MP4, MOV, AVI, MKV or WebM"
# file extension that paddle_sam.predict.video reads for each container
_EXTENSIONS = {"MP4": ".mp4", "MOV": ".mov", "AVI": ".avi", "MKV": ".mkv", "WEBM": ".webm"}
# the atoms an old QuickTime file may start with (no 'ftyp' box)
_QUICKTIME_ATOMS = (b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot")


def sniff_video_format(head: bytes) -> str | None:
    """The container of a video file by its first bytes (at least 64 of them), among those
    read; None for anything else."""
    if len(head) >= 12 and head[4:8] == b"ftyp":
        return "MOV" if head[8:12] == b"qt  " else "MP4"
    if len(head) >= 8 and head[4:8] in _QUICKTIME_ATOMS:
        return "MOV"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "AVI"
    if head[:4] == b"\x1a\x45\xdf\xa3":  # EBML: Matroska or WebM, told by the DocType
        return "WEBM" if b"webm" in head[:64] else "MKV"
    return None


@dataclass(frozen=True)
class VideoLimits:
    """What one uploaded video may be (each refused with 413 naming its limit and flag)."""

    max_upload: int  # bytes of the file
    max_frames: int
    max_seconds: float  # frames / fps, when the container says its frame rate
    max_pixels: int  # width x height of a frame

    def to_json(self) -> dict:
        return {
            "max_video_upload_bytes": self.max_upload,
            "max_video_frames": self.max_frames,
            "max_video_seconds": self.max_seconds,
            "max_video_pixels": self.max_pixels,
        }


def probe_video(path: Path, name: str, limits: VideoLimits, cache_frames: int = 4) -> VideoFrames:
    """Open an uploaded video within ``limits`` (:func:`paddle_sam.predict.video.open_video`:
    every frame checked as it is, not as the container says; image codecs' frames by their
    headers before anything is decoded), stopping at the first frame past a limit. Its
    frames (RGB, ``cache_frames`` kept); a :class:`ServiceError` naming the upload (never the
    server's path) and the flag of the limit passed."""
    try:
        frames = open_video(
            path,
            cache_frames=cache_frames,
            preprocess=preprocess_sam3_frame,
            max_pixels=limits.max_pixels,
            max_frames=limits.max_frames,
        )
    except VideoTooLarge as exc:
        if exc.what == "frames":
            raise ServiceError(
                413,
                "video_too_long",
                f"{name}: more than {limits.max_frames} frames, above the limit of "
                f"{limits.max_frames} frames per video (--max-video-frames)",
            ) from None
        where = "" if exc.frame is None else f"frame {exc.frame}: "
        size = "too many pixels" if exc.size is None else f"{exc.size[0]}x{exc.size[1]} pixels"
        raise ServiceError(
            413,
            "video_too_large",
            f"{name}: {where}{size} per frame is above the limit of {limits.max_pixels} "
            "pixels (--max-video-pixels)",
        ) from None
    except VideoError as exc:
        detail = str(exc).replace(str(path), name)
        raise ServiceError(400, "invalid_video", detail) from None
    count, fps = len(frames), frames.fps
    if fps is not None and count / fps > limits.max_seconds:
        frames.close()
        raise ServiceError(
            413,
            "video_too_long",
            f"{name}: {count / fps:.1f} s ({count} frames at {fps:g} fps), above the limit "
            f"of {limits.max_seconds:g} s per video (--max-video-seconds)",
        )
    return frames


# -- memory -----------------------------------------------------------------------------


def deep_nbytes(root: Any) -> int:
    """Bytes of every NumPy array, Paddle tensor and byte string reachable from ``root``
    through containers and plain objects, each counted once; model layers, modules, classes
    and functions are not followed (the model is shared, not a session's)."""
    import types

    import paddle
    from paddle import nn

    skip = (
        nn.Layer,
        type,
        types.ModuleType,
        types.FunctionType,
        types.BuiltinFunctionType,
        types.MethodType,
        types.GeneratorType,
        threading.Thread,
    )
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        x = stack.pop()
        if x is None or isinstance(x, str | int | float | bool | complex):
            continue
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, np.ndarray):
            base = x.base if isinstance(x.base, np.ndarray) else None
            if base is not None:  # a view: count the array it views, once
                stack.append(base)
            else:
                total += x.nbytes
        elif isinstance(x, paddle.Tensor):
            total += int(x.numel()) * int(x.element_size()) if x._is_initialized() else 0
        elif isinstance(x, bytes | bytearray | memoryview):
            total += len(x)
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list | tuple | set | frozenset):
            stack.extend(x)
        elif isinstance(x, skip):
            continue
        else:
            attrs = getattr(x, "__dict__", None)
            if isinstance(attrs, dict):
                stack.extend(attrs.values())
            for slot in getattr(type(x), "__slots__", ()):
                stack.append(getattr(x, slot, None))
            if hasattr(x, "__iter__") and type(x).__module__ == "collections":
                stack.extend(list(x))  # deque, OrderedDict subclasses handled above
    return total


# -- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectResult:
    """One object on one frame, as the predictor gave it."""

    obj_id: int
    score: float  # out_probs
    box: tuple[float, float, float, float]  # out_boxes_xywh, normalised
    rle: dict  # COCO RLE of out_binary_masks
    area: int

    @property
    def nbytes(self) -> int:
        return len(self.rle["counts"]) + 160  # the string and the record around it

    def mask(self) -> np.ndarray:
        return decode_coco_rle(self.rle)

    def to_json(self, width: int, height: int) -> dict:
        x, y, w, h = self.box
        return {
            "obj_id": self.obj_id,
            "score": self.score,
            "box": [x * width, y * height, w * width, h * height],
            "area": self.area,
            "rle": self.rle,
        }


def _numpy(x: Any) -> np.ndarray:
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def frame_objects(outputs: dict) -> list[ObjectResult]:
    """A frame's objects from the predictor's ``outputs`` (``out_obj_ids``, ``out_probs``,
    ``out_boxes_xywh``, ``out_binary_masks``), masks run-length encoded."""
    ids = _numpy(outputs["out_obj_ids"]).reshape(-1)
    probs = _numpy(outputs["out_probs"]).astype(np.float64).reshape(-1)
    boxes = _numpy(outputs["out_boxes_xywh"]).astype(np.float64).reshape(-1, 4)
    masks = _numpy(outputs["out_binary_masks"])
    masks = masks if masks.dtype == bool else masks > 0
    return [
        ObjectResult(
            int(ids[k]),
            float(probs[k]),
            tuple(float(v) for v in boxes[k]),
            coco_rle(masks[k]),
            int(masks[k].sum()),
        )
        for k in range(len(ids))
    ]


# -- sessions and jobs ------------------------------------------------------------------


@dataclass
class PropagationJob:
    """A propagation: its range, progress in frames, and how it ended."""

    id: str
    direction: str
    start_frame: int
    max_frames: int | None
    total: int
    status: str = "queued"  # queued, running, done, failed, cancelled
    done: int = 0
    last_frame: int | None = None
    error: str | None = None
    seconds: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")

    def to_json(self) -> dict:
        return {
            "job_id": self.id,
            "status": self.status,
            "direction": self.direction,
            "start_frame_index": self.start_frame,
            "max_frames": self.max_frames,
            "done": self.done,
            "total": self.total,
            "progress": round(self.done / self.total, 4) if self.total else 1.0,
            "last_frame_index": self.last_frame,
            "cancel_requested": self.cancel.is_set(),
            "error": self.error,
            "seconds": self.seconds,
        }


class VideoSession:
    """One uploaded video: its file, frames, the predictor's session and every frame's latest
    result. ``lock`` guards the results and the frame reader (not thread-safe)."""

    noun: ClassVar[str] = "video"
    contents: ClassVar[str] = "tracking state, decoded frames, results and the file"

    def __init__(
        self, id: str, predictor_id: str, folder: Path, path: Path, name: str, frames: Any
    ) -> None:
        self.id = id
        self.predictor_id = predictor_id  # the predictor's session id
        self.folder = folder
        self.path = path
        self.name = name
        self.frames = frames  # VideoFrames: RGB frames for the page and the overlay video
        self.num_frames = len(frames)
        self.width, self.height, self.fps = frames.width, frames.height, frames.fps
        self.file_bytes = path.stat().st_size
        self.created = self.last_used = time.monotonic()
        self.jobs: dict[str, PropagationJob] = {}
        self.lock = threading.RLock()
        # serialises the requests that change the session (prompt, remove, reset, starting a
        # propagation): each one's model call and its bookkeeping together
        self.op_lock = threading.Lock()
        self.results: dict[int, list[ObjectResult]] = {}
        self.results_bytes = 0  # kept with ``results`` (the store reads it from any thread)
        self.objects: set[int] = set()  # the ids in the latest results and prompts
        self.max_obj_id = 0  # ids are never reused, as upstream
        self.text: str | None = None
        self.prompted_frames: set[int] = set()  # frames prompted since the last start-over
        self.changed: set[int] = set()  # objects added or refined since the last propagation
        self.propagated = False
        self.version = 0  # of the results: bumped on every change (cached downloads)
        self.state_bytes = 0  # the predictor's inference state, measured under the model lock
        self.closed = False
        self._overlay: tuple[int, Path] | None = None
        self.render_lock = threading.Lock()

    @property
    def duration(self) -> float | None:
        return self.num_frames / self.fps if self.fps else None

    @property
    def nbytes(self) -> int:
        frames = self.frames.cached_count() * self.width * self.height * 3
        return self.state_bytes + self.results_bytes + frames + self.file_bytes

    @property
    def active_job(self) -> PropagationJob | None:
        return next((j for j in list(self.jobs.values()) if j.active), None)

    def rgb(self, index: int) -> np.ndarray:
        with self.lock:
            return self.frames.rgb(index)

    def _put(self, frame: int, objects: list[ObjectResult]) -> None:
        old = self.results.get(frame)
        self.results_bytes += sum(o.nbytes for o in objects) - sum(o.nbytes for o in old or ())
        self.results[frame] = objects

    def set_frame(self, frame: int, objects: list[ObjectResult]) -> None:
        with self.lock:
            self._put(frame, objects)
            for o in objects:
                self.objects.add(o.obj_id)
                self.max_obj_id = max(self.max_obj_id, o.obj_id)
            self.version += 1

    def start_over(self) -> None:
        with self.lock:
            self.results.clear()
            self.results_bytes = 0
            self.objects.clear()
            self.changed.clear()
            self.prompted_frames.clear()
            self.text = None
            self.propagated = False
            self.version += 1

    def drop_object(self, obj_id: int) -> None:
        """An object removed: gone from every frame's results at once. The others keep their
        masks of the last propagation until the next one, which may give them the pixels the
        removed object held (the predictor keeps objects from overlapping)."""
        with self.lock:
            for frame, objs in list(self.results.items()):
                self._put(frame, [o for o in objs if o.obj_id != obj_id])
            self.objects.discard(obj_id)
            self.changed.discard(obj_id)
            self.propagated = False
            self.version += 1

    def overlay_path(self) -> Path | None:
        """The rendered overlay video, if it is of the current results."""
        if self._overlay is not None and self._overlay[0] == self.version:
            return self._overlay[1]
        return None

    def to_json(self) -> dict:
        with self.lock:
            job = self.active_job
            return {
                "session_id": self.id,
                "name": self.name,
                "width": self.width,
                "height": self.height,
                "num_frames": self.num_frames,
                "fps": self.fps,
                "duration_seconds": self.duration,
                "bytes": self.nbytes,
                "text": self.text,
                "objects": sorted(self.objects),
                "frames_with_results": len(self.results),
                "needs_propagation": bool(self.changed) or not self.propagated,
                "changed_objects": sorted(self.changed),
                "propagation": job.to_json() if job is not None else None,
            }


# -- the predictor behind the model lock -------------------------------------------------


class VideoService:
    """SAM 3's video predictor (``Sam3VideoPredictor``) for the service: every call under the
    model lock of ``service`` (shared with the image predictor), sessions in ``store``,
    propagations on ``jobs`` (with the "everything" jobs: one model job runs at a time)."""

    def __init__(
        self,
        service: ModelService,
        predictor: Any,
        store: SessionStore,
        jobs: JobQueue,
        limits: VideoLimits,
    ) -> None:
        self.service = service
        self.predictor = predictor
        self.store = store
        self.jobs = jobs
        self.limits = limits
        self.workdir = Path(tempfile.mkdtemp(prefix="paddle-sam-video-"))
        self.last_start_seconds: float | None = None

    @property
    def takes_text(self) -> bool:
        """Whether the predictor takes text and exemplar boxes (SAM 3); SAM 2 takes one
        object's clicks and/or box."""
        return bool(getattr(self.predictor, "takes_text", True))

    # -- predictor calls --

    def call(self, request: dict) -> dict:
        """One request to the predictor under the model lock."""
        with self.service.lock:
            self.service._use_threads()
            return self.predictor.handle_request(request)

    def _state(self, session: VideoSession) -> dict | None:
        """The predictor's inference state of a session (None once the predictor closed it)."""
        if session.predictor_id not in self.predictor.session_ids():
            return None
        return self.predictor.session_state(session.predictor_id)

    def next_obj_id(self, session: VideoSession) -> int:
        """An object id never used in this session: the model's ids include objects it tracks
        but hides (hot-start, suppression), and upstream never reuses one."""
        with self.service.lock:
            used = (
                self.predictor.next_obj_id(session.predictor_id) - 1
                if session.predictor_id in self.predictor.session_ids()
                else -1
            )
        return max(used, session.max_obj_id) + 1

    def _measure_locked(self, session: VideoSession) -> None:
        """Bytes of the session's inference state (call with the model lock held: it is
        walked while nothing changes it)."""
        state = self._state(session)
        session.state_bytes = deep_nbytes(state) if state is not None else 0

    def measure(self, session: VideoSession) -> None:
        with self.service.lock:
            self._measure_locked(session)

    def refresh(self, session: VideoSession) -> None:
        """The store re-measures the session; 413 when it grew past the whole budget by
        itself (the store dropped it, and kept the other sessions)."""
        if session in self.store.refresh(session):
            detail = self.store.dropped_message(session.id) or f"session {session.id} was dropped"
            raise SessionTooLarge(detail)

    # -- sessions --

    def new_folder(self) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="s-", dir=self.workdir))
        return folder

    def start(
        self, folder: Path, path: Path, name: str, reservation: Reservation | None = None
    ) -> VideoSession:
        """A session for the uploaded video file ``path`` (in ``folder``, removed on
        failure). The video is checked and decoded (once, to count its frames) here, outside
        the model lock; the predictor's session gets the frames opened. ``reservation``: the
        upload's bytes in the store, released as the session takes their place."""
        try:
            frames = probe_video(path, name, self.limits)
            # the predictor's own reader of the same frames: nothing decoded again
            model_frames = frames.reopen(
                image_size=self.predictor.model.image_size,
                cache_frames=16,
                preprocess=self.predictor.model.frame_preprocess,
            )
            t = time.perf_counter()
            try:
                sid = self.call({"type": "start_session", "resource_path": model_frames})[
                    "session_id"
                ]
            except (ValueError, RuntimeError) as exc:
                frames.close()
                model_frames.close()
                raise ServiceError(400, "invalid_video", f"{name}: {exc}") from None
            self.last_start_seconds = time.perf_counter() - t
            session = VideoSession(self.store.new_id(), sid, folder, path, name, frames)
            logger.info(
                "video %s opened in %.2f s: %d frames of %dx%d",
                session.id,
                self.last_start_seconds,
                session.num_frames,
                session.width,
                session.height,
            )
            self.measure(session)
            try:
                self.store.add(session, reservation)
            except Exception:
                self.close(session)
                raise
            return session
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def close(self, session: VideoSession) -> None:
        """Free a session: cancel its propagation, close the predictor's session, remove its
        file. Idempotent."""
        with session.lock:
            if session.closed:
                return
            session.closed = True
        for job in list(session.jobs.values()):
            job.cancel.set()
        try:
            self.call({"type": "close_session", "session_id": session.predictor_id})
        finally:
            with session.lock:
                session.frames.close()
                session.results.clear()
                session.results_bytes = 0
            shutil.rmtree(session.folder, ignore_errors=True)

    def release(self, session: VideoSession) -> None:
        """``close`` in a thread of its own: for the store's drop callback, which runs under
        the store's lock and must not wait for the model lock."""
        for job in list(session.jobs.values()):
            job.cancel.set()
        threading.Thread(target=self.close, args=(session,), daemon=True).start()

    def shutdown(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- prompts --

    def prompt(self, session: VideoSession, request: dict) -> tuple[int, list[ObjectResult]]:
        """``add_prompt`` on the session's predictor session; its frame and objects."""
        request = {"type": "add_prompt", "session_id": session.predictor_id, **request}
        out = self.call(request)
        objects = frame_objects(out["outputs"])
        frame = int(out["frame_index"])
        detection = self.takes_text and (
            request.get("text") is not None or request.get("bounding_boxes") is not None
        )
        with session.lock:
            if detection:  # SAM 3 starts over: the detections on this frame are the objects
                session.start_over()
                session.text = request.get("text")
            else:
                obj_id = int(request["obj_id"])
                session.objects.add(obj_id)
                session.max_obj_id = max(session.max_obj_id, obj_id)
                session.changed.add(obj_id)
            session.prompted_frames.add(frame)
            session.set_frame(frame, objects)
        self.measure(session)
        self.refresh(session)
        return frame, objects

    def remove_object(self, session: VideoSession, obj_id: int) -> None:
        self.call({"type": "remove_object", "session_id": session.predictor_id, "obj_id": obj_id})
        session.drop_object(obj_id)
        self.measure(session)
        self.refresh(session)

    def reset(self, session: VideoSession) -> None:
        self.call({"type": "reset_session", "session_id": session.predictor_id})
        session.start_over()
        self.measure(session)
        self.refresh(session)

    # -- propagation --

    def frames_in_range(
        self, session: VideoSession, direction: str, start: int, max_frames: int | None
    ) -> int:
        """How many frames a propagation yields (upstream's processing order: forward from
        ``start`` inclusive, backward from ``start - 1``; ``max_frames`` past the start)."""
        n = session.num_frames
        m = n if max_frames is None else max_frames
        total = 0
        if direction in ("both", "forward"):
            total += min(start + m, n - 1) - start + 1
        if direction in ("both", "backward"):
            total += start - max(start - m, 0)
            # SAM 2 visits the start frame again on its way back
            total += int(getattr(self.predictor, "backward_includes_start", False))
        return total

    def start_propagation(
        self, session: VideoSession, direction: str, start: int | None, max_frames: int | None
    ) -> PropagationJob:
        """Queue a propagation; ``QueueFull`` when the job queue is full, ``ValueError`` for
        what the predictor refuses (checked now, before it is queued). ``start``: default
        the earliest frame prompted since the last start-over (upstream's default counts
        only text and box prompts, and refuses a video prompted by clicks alone)."""
        if start is None:
            start = min(session.prompted_frames)
        request = {
            "type": "propagate_in_video",
            "session_id": session.predictor_id,
            "propagation_direction": direction,
            "start_frame_index": start,
            "max_frame_num_to_track": max_frames,
        }
        # checked now (no model code runs: the frames are computed as the stream is read, under
        # the model lock); the caller holds the session's op_lock, nothing else changes it
        stream = self.predictor.handle_stream_request(request)
        job = PropagationJob(
            self.store.new_id(),
            direction,
            start,
            max_frames,
            self.frames_in_range(session, direction, start, max_frames),
        )
        with session.lock:
            for k in [k for k, j in session.jobs.items() if not j.active]:
                del session.jobs[k]  # keep the latest jobs only
            session.jobs[job.id] = job
        try:
            self.jobs.submit(self._propagate, session, job, stream)
        except Exception:
            session.jobs.pop(job.id, None)
            stream.close()  # never started: nothing of it ran
            raise
        return job

    def _propagate(self, session: VideoSession, job: PropagationJob, stream: Any) -> None:
        """Read the propagation's frames under the model lock, one at a time (requests on
        other sessions run in between), into the session's results; stop when cancelled."""
        lock = self.service.lock
        if job.cancel.is_set() or session.closed:
            job.status = "cancelled"
            stream.close()
            logger.info("propagation %s (video %s) cancelled before it ran", job.id, session.id)
            return
        job.status = "running"
        logger.info(
            "propagation %s (video %s) started: %s from frame %d, %d frames",
            job.id,
            session.id,
            job.direction,
            job.start_frame,
            job.total,
        )
        t = time.perf_counter()
        measured = 0.0  # when the inference state was last measured
        budget = self.store.budget_bytes
        size0 = size = session.nbytes
        per_frame = 0.0  # the session's growth per frame so far
        status, error = "done", None
        try:
            while True:
                if job.cancel.is_set():
                    raise JobCancelled()
                with lock:
                    self.service._use_threads()
                    try:
                        item = next(stream)
                    except StopIteration:
                        break
                    # the frame's results and the progress count change with the frame, under
                    # the model lock: whoever holds it sees every frame read so far counted
                    objects = frame_objects(item["outputs"])
                    frame = int(item["frame_index"])
                    session.set_frame(frame, objects)
                    job.done += 1
                    job.last_frame = frame
                    # the inference state grows with every frame (features, memories):
                    # measured while nothing changes it, a few times a second, and on every
                    # frame once the session nears the budget
                    near = size + 4 * per_frame > budget
                    if near or time.perf_counter() - measured > 0.5:
                        self._measure_locked(session)
                        measured = time.perf_counter()
                    size = session.nbytes
                    per_frame = max(size - size0, 0) / job.done
                self.refresh(session)  # past the budget by itself: dropped (413)
                if job.done < job.total and size + 2 * per_frame > budget:
                    # stopped while the session still fits, the frames done kept
                    raise SessionTooLarge(
                        f"stopped after frame {frame} ({job.done} of {job.total} frames): the "
                        f"session holds {size / 2**20:.1f} MiB and the next frames would take "
                        f"it above the server's memory budget of {budget / 2**20:.1f} MiB "
                        "(--memory-budget-mb); the frames done are kept: propagate fewer frames "
                        "at a time (max_frames) or start the server with a larger budget"
                    )
            with session.lock:
                session.propagated = True
                session.changed.clear()
        except JobCancelled:
            status = "cancelled"
        except SessionError as exc:  # the budget: one line for the client and the log
            logger.warning(
                "propagation %s (video %s) stopped after %d of %d frames: %s",
                job.id,
                session.id,
                job.done,
                job.total,
                exc.detail,
            )
            status, error = "failed", exc.detail
        except Exception as exc:  # the client reads one line through the progress endpoint
            logger.exception(
                "propagation %s (video %s) failed after %d of %d frames",
                job.id,
                session.id,
                job.done,
                job.total,
            )
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            try:
                with lock:  # closing it runs the model's clean-up
                    stream.close()
                    if not session.closed:
                        self._measure_locked(session)
                self.store.refresh(session)
            finally:
                # the outcome last: a client that sees it finds the session settled
                job.seconds = round(time.perf_counter() - t, 3)
                if status != "failed":
                    logger.info(
                        "propagation %s %s in %.2f s: %d of %d frames",
                        job.id,
                        status,
                        job.seconds,
                        job.done,
                        job.total,
                    )
                job.error = error
                job.status = status

    # -- downloads --

    def _writer(self, session: VideoSession, out: Path, video: bool) -> Any:
        from ..predict.track_outputs import TrackWriter

        with session.lock:
            frames = sorted(session.results.items())
        writer = TrackWriter(
            out,
            session.height,
            session.width,
            session.num_frames,
            fps=session.fps,
            source=session.name,
            write_pngs=False,
            write_video=video,
            frame_rgb=session.rgb,
        )
        empty = np.zeros((0, session.height, session.width), bool)
        for frame, objs in frames:
            masks = np.stack([o.mask() for o in objs]) if objs else empty
            writer.add(frame, [o.obj_id for o in objs], masks, [o.score for o in objs])
        return writer

    def results_json(self, session: VideoSession) -> dict:
        """The YouTube-VIS style results of ``paddle-sam track`` for the frames with results."""
        out = Path(tempfile.mkdtemp(prefix="results-", dir=session.folder))
        try:
            return self._writer(session, out, video=False).results()
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def overlay_video(self, session: VideoSession) -> Path:
        """The overlay MP4 of the frames with results (rendered once per version of them)."""
        with session.render_lock:
            path = session.overlay_path()
            if path is not None:
                return path
            version = session.version
            out = Path(tempfile.mkdtemp(prefix="overlay-", dir=session.folder))
            writer = self._writer(session, out, video=True)
            writer.close()
            old = session._overlay
            session._overlay = (version, writer.video_path)
            if old is not None:
                shutil.rmtree(old[1].parent, ignore_errors=True)
            return writer.video_path


def check_index(value: int, n: int, what: str = "frame_index") -> int:
    value = operator.index(value)
    if not 0 <= value < n:
        raise IndexError(f"{what} {value} out of range: the video has {n} frames (0-{n - 1})")
    return value


__all__ = [
    "VIDEO_FORMATS",
    "ObjectResult",
    "PropagationJob",
    "VideoLimits",
    "VideoService",
    "VideoSession",
    "deep_nbytes",
    "frame_objects",
    "probe_video",
    "sniff_video_format",
]
