"""The interactive segmentation service: FastAPI app over one predictor and a session cache.

Each uploaded image becomes a session whose embedding is computed once. Prompts (points,
a box, the previous answer's mask, text for models that take it) are decoded against the
session's cached embedding by restoring it into the shared predictor. Paddle is not
thread-safe, so every model call runs under one lock; PNG and RLE encoding run outside it.

``create_app(model_or_predictor)`` builds the app in-process (tests use a tiny model);
``paddle-sam serve`` runs it with uvicorn. The parts: ``guard`` (host, origin, token, content
type and body size checks before the app), ``schemas`` (request bodies, mask PNGs),
``service`` (the model behind its lock, "everything" jobs), ``routes`` (the HTTP API).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from .._version import __version__
from ..models.sam_v1.sam import Sam
from ..predict.base import InteractivePredictor
from ..predict.sam_v1.predictor import PredictorBase, SamPredictor
from .config import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_QUEUED_JOBS,
    DEFAULT_MAX_UPLOAD_MB,
    DEFAULT_MEMORY_BUDGET_MB,
    DEFAULT_SESSION_TTL_S,
    MAX_JSON_BYTES,
)
from .guard import RequestGuard, check_token
from .routes import add_error_handlers, add_routes
from .service import JobQueue, ModelService, cancel_jobs
from .sessions import SessionStore


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
) -> FastAPI:
    """The service and its web page for a SAM model (wrapped in a SamPredictor), a SAM 3
    image model (wrapped in a ``Sam3Predictor``) or a predictor.

    ``threads``: CPU threads per model call (default: the calling thread's current setting).
    ``token``: every API route then needs ``Authorization: Bearer TOKEN`` (the page and its
    static files load without it). ``allowed_hosts``: ``Host`` names answered besides the
    address reached, ``localhost``, ``127.0.0.1`` and ``[::1]`` (``"*"``: any).
    ``max_queued_jobs``: "everything" jobs waiting or running at once (429 beyond).
    """
    check_token(token)
    from ..models.sam3.sam3_image import Sam3Image
    from ..predict.sam3.predictor import Sam3Predictor

    predictor: InteractivePredictor
    if isinstance(model_or_predictor, Sam):
        predictor = SamPredictor(model_or_predictor)
    elif isinstance(model_or_predictor, Sam3Image):
        predictor = Sam3Predictor(model_or_predictor)
    elif isinstance(model_or_predictor, PredictorBase | Sam3Predictor):
        predictor = model_or_predictor
    else:
        raise TypeError(
            f"create_app needs a SAM model or a predictor, got {type(model_or_predictor).__name__}"
        )
    service = ModelService(predictor, model_type, threads)
    store = SessionStore(int(memory_budget_mb * 2**20), session_ttl_s, on_drop=cancel_jobs)
    jobs = JobQueue(max_queued_jobs)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        for s in store.sessions():
            cancel_jobs(s)
        jobs.shutdown()

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
    app.state.jobs = jobs
    max_upload = int(max_upload_mb * 2**20)
    app.add_middleware(
        RequestGuard,
        token=token,
        allowed_hosts=allowed_hosts,
        max_upload=max_upload,
        max_json=MAX_JSON_BYTES,
    )
    add_error_handlers(app)
    add_routes(
        app,
        service,
        store,
        jobs,
        max_image_pixels=max_image_pixels,
        max_upload=max_upload,
    )
    return app


__all__ = ["create_app"]
