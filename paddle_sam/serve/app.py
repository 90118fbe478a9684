"""The interactive segmentation service: FastAPI app over one predictor and a session cache.

Each uploaded image becomes a session whose embedding is computed once. Prompts (points,
a box, the previous answer's mask, text for models that take it) are decoded against the
session's cached embedding by restoring it into the shared predictor. Paddle is not
thread-safe, so every model call runs under one lock; PNG and RLE encoding run outside it.

With a SAM 3 or SAM 2 video predictor (``video=``), the video mode: ``/videos`` sessions in the same
cache and budget, propagation jobs on the same queue, the page at ``/video``.

``create_app(model_or_predictor)`` builds the app in-process (tests use a tiny model);
``paddle-sam serve`` runs it with uvicorn. The parts: ``guard`` (host, origin, token, content
type and body size checks before the app), ``schemas`` (request bodies, mask PNGs),
``service`` (the model behind its lock, "everything" jobs), ``routes`` (the HTTP API, an
``APIRouter``), ``video`` and ``video_routes`` (the video mode), ``errors`` (the error type and
handlers), ``state`` (what the routes take from ``app.state``).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from .._version import __version__
from ..loading import (
    as_image_predictor,
    as_video_predictor,
    image_predictor_of_video,
    is_video_model,
)
from . import routes, video_routes
from .config import (
    DEFAULT_DOWNLOAD_TIMEOUT_S,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_LABELS_PER_TASK,
    DEFAULT_MAX_QUEUED_JOBS,
    DEFAULT_MAX_TASKS_PER_REQUEST,
    DEFAULT_MAX_TRACK_FRAMES,
    DEFAULT_MAX_UPLOAD_MB,
    DEFAULT_MAX_VIDEO_FRAMES,
    DEFAULT_MAX_VIDEO_PIXELS,
    DEFAULT_MAX_VIDEO_SECONDS,
    DEFAULT_MAX_VIDEO_UPLOAD_MB,
    DEFAULT_MEMORY_BUDGET_MB,
    DEFAULT_SESSION_TTL_S,
    MAX_JSON_BYTES,
)
from .errors import add_error_handlers
from .guard import RequestGuard, check_token
from .service import JobQueue, ModelService, cancel_jobs
from .sessions import SessionStore
from .state import Gates, Limits
from .video import VideoLimits, VideoService

NO_VIDEO_MODEL = (
    "this server has no video mode: it needs SAM 2, or SAM 3 with its tracker; start it with "
    "'paddle-sam serve --checkpoint sam2.1_hiera_tiny.pt' or 'paddle-sam serve --model-type "
    "sam3 --checkpoint sam3.pt' (the released files, or .pdparams converted from them)"
)


def _image_and_video(model_or_predictor: Any, video: Any) -> tuple[Any, Any]:
    """A video model given alone: its image part (SAM 3's detector with the tracker's heads
    for clicks; SAM 2's model) answers image requests, the same weights the video mode uses."""
    if is_video_model(model_or_predictor) and video is None:
        video = as_video_predictor(model_or_predictor)
        model_or_predictor = image_predictor_of_video(video)
    return model_or_predictor, video


def _release_videos(videos: VideoService | None, store: SessionStore) -> None:
    """At shutdown: every video session's predictor session closed, its file removed."""
    if videos is not None:
        for s in store.sessions():
            if hasattr(s, "predictor_id"):
                videos.release(s)
        videos.shutdown()


def create_app(
    model_or_predictor: Any,
    *,
    model_type: str | None = None,
    memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    session_ttl_s: float | None = DEFAULT_SESSION_TTL_S,
    threads: int | None = None,
    token: str | None = None,
    allowed_hosts: list[str] | tuple[str, ...] | None = None,
    max_queued_jobs: int = DEFAULT_MAX_QUEUED_JOBS,
    video: Any = None,
    video_refusal: str | None = None,
    max_video_upload_mb: float = DEFAULT_MAX_VIDEO_UPLOAD_MB,
    max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES,
    max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS,
    max_video_pixels: int = DEFAULT_MAX_VIDEO_PIXELS,
    source: Any = None,
) -> FastAPI:
    """The service and its web page for a SAM model (wrapped in a SamPredictor), a SAM 2
    model (wrapped in a ``Sam2Predictor``), a SAM 3 image model (wrapped in a
    ``Sam3Predictor``) or a predictor.

    ``threads``: CPU threads per model call (default: the calling thread's current setting).
    ``token``: every API route then needs ``Authorization: Bearer TOKEN`` (the page and its
    static files load without it). ``allowed_hosts``: ``Host`` names answered besides the
    address reached, ``localhost``, ``127.0.0.1`` and ``[::1]`` (``"*"``: any).
    ``max_queued_jobs``: "everything" jobs and propagations waiting or running at once (429
    beyond).

    ``video``: SAM 3's video predictor (``Sam3VideoPredictor``) or video model, or SAM 2's
    (``SAM2VideoPredictor``, or ``Sam2VideoRequests`` around it), for the video mode
    (``/videos``, the page at ``/video``); ``model_or_predictor`` may be it alone (its image
    part then serves the image page: one copy of the weights). Without it those routes
    answer 400
    ``video_not_supported`` with ``video_refusal`` (a default naming what is needed). Its
    limits: ``max_video_upload_mb`` (the file), ``max_video_frames``, ``max_video_seconds``,
    ``max_video_pixels`` (per frame). Video sessions share ``memory_budget_mb`` with images.

    ``source``: the model's source (``paddle_sam.loading.resolve``), when known: ``/health``
    then names the bundled demo model and its vocabulary, and "everything" takes the
    generator's defaults for it (lowered for the bundled SAM v1).
    """
    check_token(token)
    model_or_predictor, video = _image_and_video(model_or_predictor, video)

    predictor = as_image_predictor(model_or_predictor, "create_app")
    service = ModelService(predictor, model_type, threads, source)
    videos: VideoService | None = None

    def on_drop(session: Any) -> None:
        cancel_jobs(session)
        if videos is not None and hasattr(session, "predictor_id"):
            videos.release(session)  # closes the predictor's session, removes the file

    store = SessionStore(int(memory_budget_mb * 2**20), session_ttl_s, on_drop=on_drop)
    jobs = JobQueue(max_queued_jobs)
    max_video_upload = int(max_video_upload_mb * 2**20)
    limits = VideoLimits(max_video_upload, max_video_frames, max_video_seconds, max_video_pixels)
    video = as_video_predictor(video)
    if video is not None:
        videos = VideoService(service, video, store, jobs, limits)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        for s in store.sessions():
            cancel_jobs(s)
        jobs.shutdown()
        _release_videos(videos, store)

    app = FastAPI(
        title="paddle-sam",
        version=__version__,
        description="Interactive Segment Anything: upload an image once, prompt it many times.",
        docs_url=None,  # the Swagger page loads its assets from a CDN; the schema is enough
        redoc_url=None,
        lifespan=lifespan,
    )
    max_upload = int(max_upload_mb * 2**20)
    app.state.service = service
    app.state.store = store
    app.state.jobs = jobs
    app.state.videos = videos
    app.state.limits = Limits(max_image_pixels, max_upload, limits, video_refusal or NO_VIDEO_MODEL)
    app.state.gates = Gates()
    app.add_middleware(
        RequestGuard,
        token=token,
        allowed_hosts=allowed_hosts,
        max_upload=max_upload,
        max_video_upload=max_video_upload,
        max_json=MAX_JSON_BYTES,
    )
    add_error_handlers(app)
    app.include_router(routes.router)
    app.mount("/static", StaticFiles(directory=routes.STATIC_DIR), name="static")
    app.include_router(video_routes.router)
    return app


def create_label_studio_app(
    model_or_predictor: Any,
    *,
    model_type: str | None = None,
    memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    session_ttl_s: float | None = DEFAULT_SESSION_TTL_S,
    threads: int | None = None,
    basic_auth: tuple[str, str] | None = None,
    allowed_hosts: list[str] | tuple[str, ...] | None = None,
    label_studio_url: str | None = None,
    api_key: str | None = None,
    allow_private_urls: bool = False,
    download_timeout_s: float = DEFAULT_DOWNLOAD_TIMEOUT_S,
    max_tasks: int = DEFAULT_MAX_TASKS_PER_REQUEST,
    max_labels: int = DEFAULT_MAX_LABELS_PER_TASK,
    video: Any = None,
    video_refusal: str | None = None,
    max_video_upload_mb: float = DEFAULT_MAX_VIDEO_UPLOAD_MB,
    max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES,
    max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS,
    max_video_pixels: int = DEFAULT_MAX_VIDEO_PIXELS,
    max_track_frames: int = DEFAULT_MAX_TRACK_FRAMES,
) -> FastAPI:
    """paddle-sam as a Label Studio ML backend (``label_studio``): ``/health``, ``/setup``,
    ``/predict``, ``/webhook`` over a SAM model, a SAM 3 image model or a predictor.

    Task embeddings share ``memory_budget_mb`` (least recently used out) and expire after
    ``session_ttl_s``; downloaded images may have ``max_upload_mb`` bytes and
    ``max_image_pixels`` pixels. ``basic_auth``: (user, password) that Label Studio sends
    (its ML backend setting "Basic Authentication"). ``label_studio_url`` / ``api_key``:
    where and with which token to download task images, instead of what ``/setup`` says
    (``api_key`` needs ``label_studio_url``). ``allow_private_urls``: also download from
    loopback, private and link-local addresses; ``download_timeout_s``: the most one image may
    take. ``max_tasks``: tasks per ``/predict``; ``max_labels``: brush labels SAM 3 prompts per
    task when pre-labelling (400 beyond either).

    ``video``: SAM 2's video predictor (or the video model alone, as for :func:`create_app`):
    ``VideoRectangle`` keyframes of a video task are then tracked, at most
    ``max_track_frames`` frames past the last keyframe per request; the video limits are
    :func:`create_app`'s. Without it video tasks are refused with ``video_refusal``.
    """
    from .label_studio import LabelStudioBackend, router

    model_or_predictor, video = _image_and_video(model_or_predictor, video)
    service = ModelService(
        as_image_predictor(model_or_predictor, "create_label_studio_app"), model_type, threads
    )
    videos: VideoService | None = None

    def on_drop(session: Any) -> None:
        if videos is not None and hasattr(session, "predictor_id"):
            videos.release(session)  # closes the predictor's session, removes the file

    store = SessionStore(int(memory_budget_mb * 2**20), session_ttl_s, on_drop=on_drop)
    video = as_video_predictor(video)
    if video is not None:
        limits = VideoLimits(
            int(max_video_upload_mb * 2**20), max_video_frames, max_video_seconds, max_video_pixels
        )
        videos = VideoService(service, video, store, JobQueue(DEFAULT_MAX_QUEUED_JOBS), limits)
    max_upload = int(max_upload_mb * 2**20)
    backend = LabelStudioBackend(
        service,
        store,
        max_image_pixels=max_image_pixels,
        max_download=max_upload,
        label_studio_url=label_studio_url,
        api_key=api_key,
        allow_private_urls=allow_private_urls,
        download_timeout_s=download_timeout_s,
        max_tasks=max_tasks,
        max_labels=max_labels,
        videos=videos,
        video_refusal=video_refusal,
        max_track_frames=max_track_frames,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        _release_videos(videos, store)

    app = FastAPI(
        title="paddle-sam (Label Studio ML backend)",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.backend = backend
    # Label Studio sends a task list (and a labelling config) per request: JSON only
    app.add_middleware(
        RequestGuard,
        basic_auth=basic_auth,
        allowed_hosts=allowed_hosts,
        max_upload=max_upload,
        max_json=4 * MAX_JSON_BYTES,
        pages=(),
    )
    add_error_handlers(app)
    app.include_router(router)
    return app


__all__ = ["create_app", "create_label_studio_app"]
