"""What ``create_app`` keeps in ``app.state``, and the FastAPI dependencies through which the
routes take it: ``service`` (the model behind its lock), ``store`` (the session cache),
``jobs`` (the background job queue), ``videos`` (the video mode, or None), ``limits`` and
``gates`` (the app's bounds on concurrent uploads).

A route names what it needs by type, e.g. ``def f(session_id: str, store: Store)``; the
dependencies only read ``request.app.state`` and never refuse a request, so a request is
validated (422) before any route refuses it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from .service import JobQueue, ModelService
from .sessions import SessionStore
from .video import VideoLimits, VideoService


@dataclass(frozen=True)
class Limits:
    """The limits the routes apply and ``/health`` reports."""

    max_image_pixels: int  # of a decoded image
    max_upload: int  # bytes of an image upload
    video: VideoLimits
    video_refusal: str  # why there is no video mode, when there is none


def _semaphore_of_2() -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(2)


@dataclass
class Gates:
    """One app's bounds on work outside the session cache."""

    # decoded images waiting for the model hold memory outside the cache
    uploads: threading.BoundedSemaphore = field(default_factory=_semaphore_of_2)
    # warnings.catch_warnings is process-wide: one upload is decoded at a time
    decoding: threading.Lock = field(default_factory=threading.Lock)
    # videos checked and opened at a time (each decodes the whole file once)
    video_starts: threading.BoundedSemaphore = field(default_factory=_semaphore_of_2)


# async: read on the event loop, not sent to the thread pool for an attribute lookup


async def _service(request: Request) -> ModelService:
    return request.app.state.service


async def _store(request: Request) -> SessionStore:
    return request.app.state.store


async def _jobs(request: Request) -> JobQueue:
    return request.app.state.jobs


async def _videos(request: Request) -> VideoService | None:
    return request.app.state.videos


async def _limits(request: Request) -> Limits:
    return request.app.state.limits


async def _gates(request: Request) -> Gates:
    return request.app.state.gates


Service = Annotated[ModelService, Depends(_service)]
Store = Annotated[SessionStore, Depends(_store)]
Jobs = Annotated[JobQueue, Depends(_jobs)]
Videos = Annotated[VideoService | None, Depends(_videos)]
AppLimits = Annotated[Limits, Depends(_limits)]
AppGates = Annotated[Gates, Depends(_gates)]

__all__ = [
    "AppGates",
    "AppLimits",
    "Gates",
    "Jobs",
    "Limits",
    "Service",
    "Store",
    "Videos",
]
