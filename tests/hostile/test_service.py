"""Hostile requests against a real ``paddle-sam serve`` (uvicorn on 127.0.0.1, the tiny model).

``HOSTILE`` is one table of single requests, each written byte by byte to a raw socket, and
the answer each must get: bodies over their limit in every encoding (chunked JSON, chunked raw
and chunked multipart uploads, sent slowly while /health is polled from another thread, the
server's RSS and its temporary files measured all along), a Content-Length over the limit,
formats that are not decoded (EPS never reaches Ghostscript), an image no model input can
hold, a full "everything" queue, and the token, Host, Origin and content type checks. Adding
a case is a line. Then every API route of the OpenAPI schema, without the token and with it;
the guard's parsing; and the command line's token, host list and warning.
"""

from __future__ import annotations

import gc
import io
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import psutil
import pytest
from PIL import Image

from paddle_sam.serve import create_app
from paddle_sam.serve.config import MAX_JSON_BYTES
from tests.helpers.pairs import image as make_image
from tests.helpers.server import ThreadedServer, png_bytes, tiny_model

TOKEN = "hostile-test-token_0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UPLOAD_MB = 4
UPLOAD_LIMIT = UPLOAD_MB * 2**20
MiB = 2**20
PIECE = 64 * 1024  # a slow body: one piece of this size every PAUSE seconds
PAUSE = 0.004
HEALTH_LATENCY_S = 0.5
# what the kernel's socket buffers may hold between the client's send and the server's read
IN_FLIGHT = 4 * MiB
# RSS beyond the body bytes the server may hold (at most the limit): protocol buffers, and the
# client's own pieces, as it runs in the same process (measured: 0.1-0.5 MiB)
RSS_OVERHEAD = 2 * MiB


# -- bodies ----------------------------------------------------------------------------------


def pieces(
    prefix: bytes, total: int, filler: bytes = b"\x00", suffix: bytes = b""
) -> Callable[[], Iterator[bytes]]:
    """A body of ``total`` bytes: ``prefix``, ``filler`` repeated, ``suffix``; in pieces of
    PIECE bytes."""

    def gen() -> Iterator[bytes]:
        yield prefix
        left = total - len(prefix) - len(suffix)
        block = filler * (PIECE // len(filler))
        while left > 0:
            yield block[: min(PIECE, left)]
            left -= PIECE
        if suffix:
            yield suffix

    return gen


def json_body(total: int) -> Callable[[], Iterator[bytes]]:
    return pieces(b'{"points": [', total, b"[1, 1], ")


BOUNDARY = "hostile-boundary-7f3a"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"


def multipart_head(filename: str = "big.png", ctype: str = "image/png") -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; '
        f'filename="{filename}"\r\nContent-Type: {ctype}\r\n\r\n'
    ).encode()


MULTIPART_END = f"\r\n--{BOUNDARY}--\r\n".encode()


def multipart(data: bytes, filename: str, ctype: str) -> bytes:
    return multipart_head(filename, ctype) + data + MULTIPART_END


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EPS = (
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"
    b"newpath 0 0 moveto 10 10 lineto stroke\nshowpage\n%%EOF\n"
)


def _png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


SLIVER = _png(100_000, 1)  # 100000 x 1 pixels: resized to any model input, 0 pixels high


# -- the table ---------------------------------------------------------------------------------


@dataclass
class Case:
    """One request and the answer it must get.

    ``body``: bytes, a function giving the body in pieces (sent slowly, with the server
    watched: /health latency, RSS, temporary files), or None (nothing sent after the head).
    ``chunked``: sent with ``Transfer-Encoding: chunked`` instead of a Content-Length.
    ``path``: ``{sid}`` becomes a live session's id. ``context``: what the server must be
    doing meanwhile (a name in CONTEXTS). ``min_temp``: temporary bytes the request must be
    seen to write (a control that the measurement sees them).
    """

    name: str
    method: str
    path: str
    status: int
    error: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | Callable[[], Iterator[bytes]] | None = b""
    chunked: bool = False
    auth: bool = True
    context: str | None = None
    min_temp: int = 0


JSON = {"Content-Type": "application/json"}
PNG = {"Content-Type": "image/png"}
FORM = {"Content-Type": MULTIPART}
UP = "/sessions"
PROMPT = "/sessions/{sid}/prompt"
EVERYTHING = "/sessions/{sid}/everything"
J, T = 20 * MiB, 32 * MiB  # hostile JSON and upload bodies: far above their limits
C = Case

HOSTILE = [
    # bodies over the limit, in every encoding, sent slowly
    C("chunked JSON, 20 MiB", "POST", PROMPT, 413, "body_too_large", JSON, json_body(J), True),
    C("chunked raw upload, 32 MiB", "POST", UP, 413, "upload_too_large", PNG,
      pieces(PNG_MAGIC, T), True),
    C("chunked multipart upload, 32 MiB", "POST", UP, 413, "upload_too_large", FORM,
      pieces(multipart_head() + PNG_MAGIC, T), True),
    C("JSON with a Content-Length, 20 MiB", "POST", PROMPT, 413, "body_too_large", JSON,
      json_body(J)),
    C("multipart with a Content-Length, 32 MiB", "POST", UP, 413, "upload_too_large", FORM,
      pieces(multipart_head() + PNG_MAGIC, T)),
    # a Content-Length over the limit: refused before a byte of the body is sent
    C("Content-Length 1 GiB upload, no body", "POST", UP, 413, "upload_too_large",
      {**PNG, "Content-Length": str(2**30)}, None),
    C("Content-Length 20 MiB JSON, no body", "POST", PROMPT, 413, "body_too_large",
      {**JSON, "Content-Length": str(J)}, None),
    # control: multipart junk under the limit is read (and spooled to disk), then refused
    C("multipart junk under the limit", "POST", UP, 400, "invalid_image", FORM,
      pieces(multipart_head(), UPLOAD_LIMIT - PIECE, b"junk", MULTIPART_END), True,
      min_temp=2 * MiB),
    # formats and sizes
    C("EPS upload (multipart)", "POST", UP, 400, "invalid_image", FORM,
      multipart(EPS, "x.eps", "application/postscript")),
    C("EPS upload (raw, image/x-eps)", "POST", UP, 400, "invalid_image",
      {"Content-Type": "image/x-eps"}, EPS),
    C("EPS upload (raw, application/postscript)", "POST", UP, 415, "unsupported_media_type",
      {"Content-Type": "application/postscript"}, EPS),
    C("100000 x 1 image", "POST", UP, 400, "invalid_image", PNG, SLIVER),
    C("text/plain upload (a cross-site form's)", "POST", UP, 415, "unsupported_media_type",
      {"Content-Type": "text/plain"}, png_bytes(make_image(20, 20, seed=1))),
    C("upload without a content type", "POST", UP, 415, "unsupported_media_type", {},
      png_bytes(make_image(20, 20, seed=1))),
    # the "everything" queue
    C("everything, queue full", "POST", EVERYTHING, 429, "queue_full", JSON,
      b'{"points_per_side": 2}', context="queue_full"),
    # who may ask
    C("no token", "GET", "/health", 401, "unauthorized", auth=False),
    C("wrong token", "GET", "/health", 401, "unauthorized",
      {"Authorization": "Bearer not-the-token"}, auth=False),
    C("token in another scheme", "GET", "/health", 401, "unauthorized",
      {"Authorization": f"Basic {TOKEN}"}, auth=False),
    C("no token, upload", "POST", UP, 401, "unauthorized", PNG,
      png_bytes(make_image(20, 20, seed=1)), auth=False),
    C("bad Host (DNS rebinding)", "GET", "/health", 403, "forbidden_host",
      {"Host": "evil.example:8000"}),
    C("bad Host, the page", "GET", "/", 403, "forbidden_host", {"Host": "evil.example"}),
    C("foreign Origin", "POST", PROMPT, 403, "cross_origin",
      {**JSON, "Origin": "http://evil.example"}, b'{"points": [[1, 1]]}'),
    C("foreign Origin, same host, other port", "GET", "/health", 403, "cross_origin",
      {"Origin": "http://127.0.0.1:1"}),
    C("Origin null (a sandboxed frame)", "DELETE", "/sessions/{sid}", 403, "cross_origin",
      {"Origin": "null"}),
    C("Sec-Fetch-Site cross-site (an <img> of another page)", "GET", "/sessions/{sid}", 403,
      "cross_origin", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}),
]  # fmt: skip


# -- the server and what is measured around each request ----------------------------------------


@pytest.fixture(scope="module")
def spool(tmp_path_factory) -> Iterator[Path]:
    """The temporary folder of this process (multipart spools included) during these tests."""
    import tempfile

    d = tmp_path_factory.mktemp("spool")
    old = tempfile.tempdir
    tempfile.tempdir = str(d)
    try:
        yield d
    finally:
        tempfile.tempdir = old


@pytest.fixture(scope="module")
def server(spool) -> Iterator[ThreadedServer]:
    app = create_app(tiny_model(), token=TOKEN, max_upload_mb=UPLOAD_MB, max_queued_jobs=1)
    with ThreadedServer(app) as s:
        yield s


@pytest.fixture(scope="module")
def sid(server) -> str:
    r = httpx.post(
        f"{server.url}/sessions",
        files={"image": ("a.png", png_bytes(make_image(60, 80, seed=3)), "image/png")},
        headers=AUTH,
    )
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    # one request of each kind first: what is loaded or allocated once is not counted below
    r = httpx.post(
        f"{server.url}/sessions",
        content=png_bytes(make_image(30, 40, seed=4)),
        headers={**AUTH, "Content-Type": "image/png"},
    )
    assert r.status_code == 201, r.text
    r = httpx.post(f"{server.url}/sessions/{sid}/prompt", json={"points": [[5, 5]]}, headers=AUTH)
    assert r.status_code == 200, r.text
    return sid


@pytest.fixture(scope="module")
def eps_opened() -> Iterator[list[str]]:
    """Records every EPS the process opens (Ghostscript runs behind EpsImageFile)."""
    from PIL import EpsImagePlugin

    opened: list[str] = []
    real = EpsImagePlugin.EpsImageFile._open

    def spy(self):
        opened.append("EpsImageFile._open")
        return real(self)

    EpsImagePlugin.EpsImageFile._open = spy
    try:
        yield opened
    finally:
        EpsImagePlugin.EpsImageFile._open = real


def temp_bytes(d: Path) -> int:
    """Bytes of the files in ``d``, and of the files open in this process that were created
    there and already unlinked (a spool rolled over to disk is an unnamed temporary file)."""
    seen, total = set(), 0
    for p in d.iterdir():
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        seen.add(st.st_ino)
        total += st.st_size
    prefix = str(d)
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if not target.startswith(prefix):
                continue
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total


class Watch:
    """While a request runs: /health polled over fresh connections (its slowest answer), and
    this process's RSS and temporary files sampled (their peaks)."""

    def __init__(self, url: str, spool: Path) -> None:
        self.url, self.spool = url, spool
        self.proc = psutil.Process()
        self.stop = threading.Event()
        self.health: list[float] = []
        self.health_errors: list[str] = []
        self.rss0 = self.rss_peak = 0  # the baseline is taken in __enter__, the threads running
        self.temp_peak = 0

    def _poll_health(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            try:
                status, _, body = raw_get(self.url, "/health")
                if status != 200:
                    self.health_errors.append(f"{status} {body[:200]!r}")
            except OSError as exc:
                self.health_errors.append(repr(exc))
            self.health.append(time.perf_counter() - t)
            self.stop.wait(0.02)

    def _wait_polls(self, n: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.health) < n and time.monotonic() < deadline:
            time.sleep(0.005)

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.rss_peak = max(self.rss_peak, self.proc.memory_info().rss)
            self.temp_peak = max(self.temp_peak, temp_bytes(self.spool))
            self.stop.wait(0.003)

    def __enter__(self) -> Watch:
        self.threads = [threading.Thread(target=f) for f in (self._poll_health, self._sample)]
        for t in self.threads:
            t.start()
        self._wait_polls(1)  # /health answers before the request...
        # the baseline once the watch's own threads run: their stacks and malloc arenas are
        # not the server's memory
        gc.collect()
        self.rss0 = self.rss_peak = self.proc.memory_info().rss
        return self

    def __exit__(self, *exc) -> None:
        self._wait_polls(len(self.health) + 2)  # ...and after it
        self.stop.set()
        for t in self.threads:
            t.join()
        self.rss_after = self.proc.memory_info().rss

    @property
    def rss_growth(self) -> int:
        return self.rss_peak - self.rss0


# -- a raw HTTP client -----------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes sent when the answer arrived
    complete: bool  # whether the whole body had been sent by then

    def json(self) -> dict:
        import json

        return json.loads(self.body)


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise AssertionError(f"connection closed before an answer: {data!r}")
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        more = sock.recv(65536)
        if not more:
            break
        body += more
    return status, headers, body[:length]


def raw_get(url: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """GET over a fresh connection (the health poll: no client library's own allocations)."""
    parts = urlsplit(url)
    head = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n"
    head += f"Authorization: Bearer {TOKEN}\r\n\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(head.encode())
        return _read_answer(sock)


def send_raw(url: str, case: Case, sid: str) -> Answer:
    """``case`` written to a socket as it is, a slow body piece by piece (stopping as soon as
    an answer arrives); its answer."""
    parts = urlsplit(url)
    headers = {"Host": parts.netloc, **(AUTH if case.auth else {}), **case.headers}
    body = case.body
    slow = callable(body)
    if case.chunked:
        headers["Transfer-Encoding"] = "chunked"
    elif "Content-Length" not in headers and body is not None:
        headers["Content-Length"] = str(
            sum(len(p) for p in body()) if slow else len(body)  # type: ignore[arg-type]
        )
    head = f"{case.method} {case.path.format(sid=sid)} HTTP/1.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    sent, complete = 0, True
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(head.encode("latin-1"))
        if body is not None:
            for piece in body() if slow else [body]:  # type: ignore[operator]
                if select.select([sock], [], [], 0)[0]:  # answered: stop sending
                    complete = False
                    break
                frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if case.chunked else piece
                try:
                    sock.sendall(frame)
                except (BrokenPipeError, ConnectionResetError):
                    complete = False
                    break
                sent += len(piece)
                if slow:
                    time.sleep(PAUSE)
            else:
                if case.chunked:
                    sock.sendall(b"0\r\n\r\n")
        else:
            complete = False
        status, answer_headers, answer_body = _read_answer(sock)
    return Answer(status, answer_headers, answer_body, sent, complete)


# -- what the server must be doing during a case ----------------------------------------------


@contextmanager
def queue_full(server: ThreadedServer, sid: str) -> Iterator[None]:
    """One job holds the (one-place) "everything" queue: it waits for the model's lock."""
    service = server.server.config.app.state.service
    with service.lock:
        r = httpx.post(
            f"{server.url}/sessions/{sid}/everything",
            json={"points_per_side": 2, "points_per_batch": 4},
            headers=AUTH,
        )
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        yield
    for _ in range(600):
        j = httpx.get(f"{server.url}/sessions/{sid}/everything/{job}", headers=AUTH).json()
        if j["status"] not in ("queued", "running"):
            break
        time.sleep(0.05)
    assert j["status"] == "done", j
    assert server.server.config.app.state.jobs.pending == 0


CONTEXTS = {"queue_full": queue_full}
FIGURES: dict[str, dict] = {}


@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_hostile_request(case: Case, server, sid, spool, eps_opened):
    context = CONTEXTS[case.context](server, sid) if case.context else nullcontext()
    with context, Watch(server.url, spool) as watch:
        answer = send_raw(server.url, case, sid)
    assert answer.status == case.status, (answer.status, answer.body[:300])
    body = answer.json()
    assert set(body) == {"error", "detail"} and body["error"] == case.error, body
    assert answer.headers["content-type"] == "application/json"
    if case.status == 401:
        assert answer.headers["www-authenticate"].startswith("Bearer")
    if case.status == 429:
        assert "limit is 1" in body["detail"] and answer.headers["retry-after"]
    slow = callable(case.body)
    figures = {
        "sent_MiB": round(answer.sent / MiB, 2),
        "rss_growth_MiB": round(watch.rss_growth / MiB, 2),
        "temp_peak_MiB": round(watch.temp_peak / MiB, 2),
        "health_max_s": round(max(watch.health, default=0.0), 3),
        "health_polls": len(watch.health),
    }
    FIGURES[case.name] = figures
    print(f"\n{case.name}: {answer.status} {body['error']}; {figures}")
    assert watch.health_errors == []
    assert max(watch.health, default=0.0) < HEALTH_LATENCY_S, watch.health
    limit = UPLOAD_LIMIT if case.path == UP else MAX_JSON_BYTES
    if case.status == 413:
        # refused as soon as the body passed its limit, long before its end
        assert not answer.complete
        assert answer.sent <= limit + IN_FLIGHT, figures
        if case.body is None:
            assert answer.sent == 0  # a Content-Length above the limit: nothing read
    if slow:
        # neither memory nor the temporary files grow past the limit, whatever was sent
        assert watch.rss_growth < limit + RSS_OVERHEAD, figures
        assert watch.temp_peak <= limit, figures
        assert watch.temp_peak >= case.min_temp, figures
    assert temp_bytes(spool) == 0  # nothing left behind
    assert eps_opened == []  # no EPS ever reached its decoder (or Ghostscript)


def test_the_server_still_serves(server, sid):
    """After every hostile request: uploads, prompts and /health as before."""
    r = httpx.post(f"{server.url}/sessions/{sid}/prompt", json={"points": [[10, 10]]}, headers=AUTH)
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{server.url}/sessions",
        content=png_bytes(make_image(30, 40, seed=4)),
        headers={**AUTH, "Content-Type": "image/png"},
    )
    assert r.status_code == 201, r.text
    # the chunked encoding itself is accepted within the limit
    case = Case("chunked PNG", "POST", UP, 201, "", PNG, png_bytes(make_image(30, 40, seed=4)))
    case.chunked = True
    assert send_raw(server.url, case, sid).status == 201


# -- the token on every route ------------------------------------------------------------------


def _request_for(method: str, path: str, sid: str) -> dict:
    """A request for one route of the schema: path parameters filled, a plausible body."""
    url = path.format(
        session_id=sid, job_id="no-such-job", index=0, upload_id="dummy-upload-1", obj_id=1
    )
    kw: dict = {"method": method, "url": url}
    if (method, path) == ("POST", "/sessions"):
        kw["files"] = {"image": ("x.png", png_bytes(make_image(20, 24, seed=5)), "image/png")}
    elif path.endswith("/prompt"):
        kw["json"] = {"points": [[1, 1]]}
    elif path.endswith("/everything"):
        kw["json"] = {"points_per_side": 0}  # refused by validation: no job is started
    return kw


def test_every_api_route_needs_the_token(server):
    app = server.server.config.app
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post(
            "/sessions",
            files={"image": ("a.png", png_bytes(make_image(40, 50, seed=6)), "image/png")},
            headers=AUTH,
        )
        own_sid = r.json()["session_id"]
        routes = [
            (method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops
        ]
        assert len(routes) >= 8, routes
        routes.append(("GET", "/openapi.json"))
        # DELETE last: the other routes find the session
        routes.sort(key=lambda r: r[0] == "DELETE")
        seen = {}
        for method, path in routes:
            kw = _request_for(method, path, own_sid)
            refused = http.request(**kw)
            assert refused.status_code == 401, (method, path, refused.text)
            assert refused.json()["error"] == "unauthorized"
            wrong = http.request(**kw, headers={"Authorization": "Bearer x" + TOKEN})
            assert wrong.status_code == 401, (method, path)
            kw = _request_for(method, path, own_sid)  # files are read once
            accepted = http.request(**kw, headers=AUTH)
            assert accepted.status_code not in (401, 403), (method, path, accepted.text)
            assert accepted.status_code < 500, (method, path, accepted.text)
            seen[f"{method} {path}"] = accepted.status_code
        print("\nroutes with the token:", seen)
        assert seen["GET /health"] == 200 and seen["POST /sessions"] == 201
        assert seen["DELETE /sessions/{session_id}"] == 200
        # the page and its files load without it (the page then sends it)
        for path in ("/", "/static/app.js", "/static/style.css"):
            assert http.get(path).status_code == 200, path


def test_page_passes_the_token(server):
    """The pages' scripts send the token with every request they make (static check: the one
    fetch is ``api()``'s in common.js, which both pages load first; the uploads' XHRs set the
    header)."""
    common = httpx.get(f"{server.url}/static/common.js").text
    assert common.count("fetch(") == 1
    assert "return fetch(url, { ...options, headers: auth" in common
    assert "sessionStorage" in common and "#token=" in common
    for page, script in (("/", "app.js"), ("/video", "video.js")):
        html = httpx.get(f"{server.url}{page}").text
        assert html.index("/static/common.js") < html.index(f"/static/{script}")
        js = httpx.get(f"{server.url}/static/{script}").text
        assert "fetch(" not in js and "XMLHttpRequest" in js
        assert 'xhr.setRequestHeader("Authorization"' in js


# -- the guard's parsing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("127.0.0.1:8000", "127.0.0.1"),
        ("LOCALHOST", "localhost"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("Example.COM.:80", "example.com"),
        ("evil.example", "evil.example"),
    ],
)
def test_host_names(value, name):
    from paddle_sam.serve.guard import host_name

    assert host_name(value) == name


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://localhost", "localhost:80", True),
        ("https://sam.example", "sam.example", True),  # behind a TLS proxy
        ("http://127.0.0.1:8001", "127.0.0.1:8000", False),
        ("http://evil.example", "127.0.0.1:8000", False),
        ("null", "127.0.0.1:8000", False),
        ("file://", "127.0.0.1:8000", False),
        ("http://127.0.0.1:8000/x", "127.0.0.1:8000", False),
        ("http://[::1]:8000", "[::1]:8000", True),
    ],
)
def test_same_origin(origin, host, same):
    from paddle_sam.serve.guard import same_origin

    assert same_origin(origin, host) is same


def test_allowed_hosts_and_token_checks():
    from fastapi.testclient import TestClient

    model = tiny_model()
    app = create_app(model, allowed_hosts=["sam.lan"])
    with TestClient(app) as c:
        assert c.get("/health").status_code == 200  # TestClient's own host: the one reached
        assert c.get("/health", headers={"Host": "sam.lan:8000"}).status_code == 200
        assert c.get("/health", headers={"Host": "localhost:8000"}).status_code == 200
        assert c.get("/health", headers={"Host": "other.lan"}).status_code == 403
        # same-origin requests from the page carry its Origin
        r = c.get("/health", headers={"Host": "sam.lan:8000", "Origin": "http://sam.lan:8000"})
        assert r.status_code == 200
    with TestClient(create_app(model, allowed_hosts=["*"])) as c:
        assert c.get("/health", headers={"Host": "anything.example"}).status_code == 200
    for bad in ("", "two words", "tök"):
        with pytest.raises(ValueError, match="token"):
            create_app(model, token=bad)


# -- the command line --------------------------------------------------------------------------


@pytest.fixture
def served(monkeypatch, tmp_path):
    """``paddle-sam serve`` with a tiny checkpoint, up to the app: the app's arguments and
    what uvicorn would run, without running it."""
    import uvicorn

    import paddle_sam.serve
    from paddle_sam.convert.core import save_pdparams

    model = tiny_model()
    ckpt = tmp_path / "tiny.pdparams"
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    save_pdparams(state, ckpt, {"model_type": "tiny", "spec": model.spec.to_dict()})
    built: dict = {"checkpoint": str(ckpt)}

    def fake_create_app(model, **kwargs):
        built.update(kwargs)
        return "app"

    monkeypatch.setattr(paddle_sam.serve, "create_app", fake_create_app, raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: built.update(run=kwargs))
    monkeypatch.delenv("PADDLE_SAM_TOKEN", raising=False)
    return built


def test_cli_token_hosts_and_warning(served, monkeypatch, capsys):
    from paddle_sam.cli import main

    ckpt = ["--checkpoint", served["checkpoint"], "--port", "0"]
    # loopback, no token: no warning
    assert main(["serve", *ckpt]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err and served["token"] is None
    assert "http://127.0.0.1:0/ " in err
    # another address without a token: the warning says what anyone there can do
    assert main(["serve", *ckpt, "--host", "0.0.0.0", "--allow-host", "sam.lan"]) == 0
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0:0 without a token" in err
    for what in ("upload images", "run the model", "delete any session", "--token"):
        assert what in err
    assert served["allowed_hosts"] == ["sam.lan"] and served["run"]["host"] == "0.0.0.0"
    # the token from the command line or the environment; the page's address carries it
    assert main(["serve", *ckpt, "--token", "abc-123", "--max-queued-jobs", "2"]) == 0
    err = capsys.readouterr().err
    assert served["token"] == "abc-123" and served["max_queued_jobs"] == 2
    assert "http://127.0.0.1:0/#token=abc-123" in err
    monkeypatch.setenv("PADDLE_SAM_TOKEN", "from-env")
    assert main(["serve", *ckpt, "--host", "0.0.0.0"]) == 0
    err = capsys.readouterr().err
    assert served["token"] == "from-env" and "without a token" not in err
    assert "not encrypted" in err
    # a token that cannot be sent in a header: a user error before the model loads
    assert main(["serve", *ckpt, "--token", "has space"]) == 2
    assert "token" in capsys.readouterr().err


def test_bounded_queue_unit():
    from paddle_sam.serve.service import JobQueue, QueueFull

    q = JobQueue(2)
    gate = threading.Event()
    futures = [q.submit(gate.wait), q.submit(gate.wait)]
    assert q.pending == 2
    with pytest.raises(QueueFull, match="limit is 2"):
        q.submit(gate.wait)
    gate.set()
    for f in futures:
        f.result(timeout=10)
    assert q.pending == 0
    q.submit(lambda: None).result(timeout=10)
    q.shutdown()


def test_sniffed_formats():
    from paddle_sam.serve.routes import sniff_image_format

    img = Image.new("RGB", (4, 3))
    for fmt in ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF"):
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        assert sniff_image_format(buf.getvalue()) == fmt
    for other in (EPS, b"%PDF-1.4", b"\x00\x00\x01\x00", b"", b"hello", np.zeros(8).tobytes()):
        assert sniff_image_format(other) is None
