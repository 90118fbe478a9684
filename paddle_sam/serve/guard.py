"""The service's front door: one pure ASGI middleware that checks every request before the
app sees it, so that the service can be exposed on a LAN.

In this order, each refusal answered with the service's error JSON
``{"error": code, "detail": message}``:

1. ``Host`` must name this server: the address the connection reached, ``localhost``,
   ``127.0.0.1``, ``[::1]`` or an ``allowed_hosts`` entry. Any other name is a web page
   that rebound its own DNS name to this address (DNS rebinding): 403 ``forbidden_host``.
2. A request sent by another web page (an ``Origin`` other than this server's own, or a
   browser's ``Sec-Fetch-Site`` naming another site for anything but a navigation to it):
   403 ``cross_origin``.
3. With a token, every route but the pages (``GET /``, ``GET /video``) and ``/static/``
   needs ``Authorization: Bearer TOKEN``, compared in constant time: else 401
   ``unauthorized``. With ``basic_auth`` (the Label Studio backend: Label Studio sends a user
   and password), every route needs ``Authorization: Basic ...`` with them.
4. An upload must be ``multipart/form-data``, or ``image/*`` for an image (``POST
   /sessions``) and ``video/*`` for a video (``POST /videos``): else 415
   ``unsupported_media_type`` (a page's cross-origin ``text/plain`` form cannot post one).
5. A body may not pass its route's limit (image uploads: ``max_upload``; video uploads:
   ``max_video_upload``; any other route: ``MAX_JSON_BYTES``). A ``Content-Length`` above it
   is 413 before a byte is read; the
   bytes of any body (``Transfer-Encoding: chunked`` included) are counted as they arrive
   and the request is answered 413 as soon as they pass it. The app never receives more
   than the limit, so neither the JSON parser nor the multipart parser (and its temporary
   files) nor the raw upload buffer can grow past it. After a 413 uvicorn reads and drops
   whatever the client still sends.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import MAX_JSON_BYTES
from .errors import error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# RFC 6750's b64token: what fits in "Authorization: Bearer ..." without quoting
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
UPLOAD_TYPES = "multipart/form-data (a file field named 'image') or the raw bytes as image/*"
VIDEO_UPLOAD_TYPES = "multipart/form-data (a file field named 'video') or the raw bytes as video/*"
PAGES = ("/", "/video")  # served without the token: they read it from the address


def check_token(token: str | None) -> str | None:
    """``token`` if it can be sent as ``Authorization: Bearer TOKEN``; ValueError if not."""
    if token is None:
        return None
    if not TOKEN_PATTERN.fullmatch(token):
        raise ValueError(
            "the token must be letters, digits and '-._~+/' (then '=' padding), without "
            "spaces: it is sent as 'Authorization: Bearer TOKEN'"
        )
    return token


def host_name(value: str) -> str:
    """The name part of a ``Host`` value: ``'Example.COM:80'`` -> ``'example.com'``,
    ``'[::1]:8000'`` -> ``'::1'``."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        value = value.partition(":")[0]
    return value.rstrip(".")


def _host_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    """(name, port) of ``netloc``, the port defaulting to the scheme's; None if malformed."""
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    default = {"http": 80, "https": 443}.get(scheme)
    return parts.hostname.rstrip("."), port if port is not None else (default or 0)


def same_origin(origin: str, host: str) -> bool:
    """Whether an ``Origin`` header names the server this ``Host`` header reached.

    Name and port are compared (the port defaulting to the origin's scheme's), not the scheme:
    behind a TLS proxy the page's origin is https while the proxy speaks http to us.
    """
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or parts.path not in ("", "/"):
        return False  # "null" (a sandboxed frame, a file:// page) and anything unusual
    theirs = _host_port(parts.netloc, parts.scheme)
    ours = _host_port(host, parts.scheme)
    return theirs is not None and theirs == ours


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class BodyTooLarge(Exception):
    """Raised into the app by ``receive`` once a body passes its limit (already answered)."""


class RequestGuard:
    """The checks above, as a pure ASGI middleware (``app.add_middleware(RequestGuard, ...)``).

    ``token``: None for no authentication. ``allowed_hosts``: more ``Host`` names to answer
    to (``"*"``: any, e.g. behind a reverse proxy that checks them). ``max_upload``: bytes of
    an image upload; ``max_video_upload``: of a video upload (default ``max_upload``);
    ``max_json``: bytes of any other request body.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None = None,
        allowed_hosts: list[str] | tuple[str, ...] | None = None,
        max_upload: int,
        max_video_upload: int | None = None,
        max_json: int = MAX_JSON_BYTES,
        basic_auth: tuple[str, str] | None = None,
        pages: tuple[str, ...] = PAGES,
    ) -> None:
        self.app = app
        if token is not None and basic_auth is not None:
            raise ValueError("give a token or basic_auth, not both")
        self._token = _digest(check_token(token).encode()) if token is not None else None
        self._basic = None
        if basic_auth is not None:
            user, password = basic_auth
            if not user or ":" in user or not password:
                raise ValueError(
                    "basic_auth needs a user name without ':' and a non-empty password"
                )
            self._basic = _digest(f"{user}:{password}".encode())
        self.pages = pages
        names = {host_name(h) for h in allowed_hosts or ()}
        self.any_host = "*" in names
        self.allowed_hosts = LOOPBACK_NAMES | (names - {"*"})
        self.max_upload, self.max_json = max_upload, max_json
        self.max_video_upload = max_upload if max_video_upload is None else max_video_upload

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path = scope["path"].rstrip("/")
        post = scope["method"] == "POST"
        upload = "image" if post and path == "/sessions" else None
        if post and path == "/videos":
            upload = "video"
        limit = {"image": self.max_upload, "video": self.max_video_upload}.get(
            upload, self.max_json
        )
        refusal = self._refusal(scope, headers, upload)
        length = headers.get("content-length", "").strip()
        if refusal is None and length.isdigit() and int(length) > limit:
            refusal = self._too_large(upload, limit, f"a body of {int(length)} bytes")
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self._limited(scope, receive, send, limit, upload)

    # -- the checks --

    def _refusal(self, scope: Scope, headers: Headers, upload: str | None) -> JSONResponse | None:
        host = headers.get("host")
        if host is None:
            return error_response(403, "forbidden_host", "the request has no Host header")
        name = host_name(host)
        server = scope.get("server")
        reached = host_name(str(server[0])) if server else None
        if not (self.any_host or name in self.allowed_hosts or name == reached):
            return error_response(
                403,
                "forbidden_host",
                f"Host {host!r} is not a name of this server (refused against DNS "
                "rebinding): use its address, or start it with --allow-host "
                f"{name or 'NAME'}",
            )
        origin = headers.get("origin")
        if origin is not None and not same_origin(origin, host):
            return error_response(
                403, "cross_origin", f"requests from another web page ({origin}) are refused"
            )
        site = headers.get("sec-fetch-site")
        if site in ("cross-site", "same-site") and headers.get("sec-fetch-mode") != "navigate":
            return error_response(
                403,
                "cross_origin",
                f"requests from another web page (Sec-Fetch-Site: {site}) are refused",
            )
        public = scope["method"] in ("GET", "HEAD") and (
            scope["path"] in self.pages or scope["path"].startswith("/static/")
        )
        if self._basic is not None and not self._basic_authorized(headers):
            return error_response(
                401,
                "unauthorized",
                "this server needs its user name and password (HTTP basic authentication)",
                headers={"WWW-Authenticate": 'Basic realm="paddle-sam"'},
            )
        if self._token is not None and not public and not self._authorized(headers):
            return error_response(
                401,
                "unauthorized",
                "this server needs its token: send 'Authorization: Bearer TOKEN' (the web "
                "page reads it from the address the server printed, ending in #token=...)",
                headers={"WWW-Authenticate": 'Bearer realm="paddle-sam"'},
            )
        if upload is not None:
            ctype = headers.get("content-type", "").partition(";")[0].strip().lower()
            if ctype != "multipart/form-data" and not ctype.startswith(f"{upload}/"):
                types = UPLOAD_TYPES if upload == "image" else VIDEO_UPLOAD_TYPES
                return error_response(
                    415,
                    "unsupported_media_type",
                    f"an upload is {types}, not {ctype or 'a body without a type'!r}",
                )
        return None

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, credentials = headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or self._token is None:
            return False
        # digests of equal length: the comparison's time says nothing about the token
        return hmac.compare_digest(_digest(credentials.strip().encode("latin-1")), self._token)

    def _basic_authorized(self, headers: Headers) -> bool:
        scheme, _, credentials = headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "basic" or self._basic is None:
            return False
        try:
            pair = base64.b64decode(credentials.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(_digest(pair), self._basic)

    def _too_large(self, upload: str | None, limit: int, what: str) -> JSONResponse:
        if upload is not None:
            flag = "--max-upload-mb" if upload == "image" else "--max-video-upload-mb"
            return error_response(
                413,
                "upload_too_large",
                f"{upload} upload of {what} is above the limit of {limit} bytes ({flag})",
            )
        return error_response(
            413, "body_too_large", f"request body of {what} is above the limit of {limit} bytes"
        )

    # -- the body, counted as it arrives --

    async def _limited(
        self, scope: Scope, receive: Receive, send: Send, limit: int, upload: str | None
    ) -> None:
        seen = 0
        refused = started = False

        async def limited_receive() -> Message:
            nonlocal seen, refused, started
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # answer now, before the app sees a byte past the limit; the app's own
                    # answer to the exception below is dropped
                    refused = True
                    if not started:
                        started = True
                        response = self._too_large(upload, limit, f"more than {limit} bytes")
                        await response(scope, receive, send)
                    raise BodyTooLarge(f"request body above {limit} bytes")
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise


__all__ = ["BodyTooLarge", "RequestGuard", "check_token", "host_name", "same_origin"]
