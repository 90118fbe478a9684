"""The service's one error type and the handlers that answer every error as JSON.

Every error is ``{"error": code, "detail": message}`` with its HTTP status: a
:class:`ServiceError` raised anywhere in the app (a route, the session cache, the video mode,
the Label Studio backend), FastAPI's request validation (422 ``invalid_request``), Starlette's
404 and 405, and anything unexpected (500 ``internal_error``: one line for the client, the
traceback in the ``paddle_sam.serve`` log). ``guard.RequestGuard`` answers the requests it
refuses with the same JSON.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """An error answered as ``{"error": code, "detail": detail}`` with HTTP ``status`` (and
    ``headers``, e.g. ``Retry-After``). ``detail`` is one line, for the client."""

    def __init__(
        self, status: int, code: str, detail: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def _message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(v) for v in e.get("loc", ()) if v != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
    logger.debug("%s %s: %d %s: %s", request.method, request.url.path, exc.status, exc.code, exc)
    return error_response(exc.status, exc.code, exc.detail, exc.headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(422, "invalid_request", _message(exc))


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")


def add_error_handlers(app: FastAPI) -> None:
    """Answer every error with the error JSON."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)


__all__ = ["ServiceError", "add_error_handlers", "error_response"]
