"""Hostile requests against a real Label Studio backend (``create_label_studio_app`` under uvicorn
on 127.0.0.1, the tiny model) and what it sends out on their behalf.

Around it, real HTTP servers stand in for the network: ``ls`` (Label Studio, on 127.0.0.1: the
pinned origin; images, redirects, a token refresh, a trickling and an oversized answer) and
``capture`` (a stranger on 127.0.0.2, another loopback address: it serves images and redirects
too, and records everything). Every request either server receives is recorded, and after each
test no token the backend holds has reached ``capture``.

``HOSTILE`` is one table of single requests and the answer each must get (a one-line 4xx, or a
502 for Label Studio's own failure), with the servers that must not have been contacted. Then
the cases of more than one request: /setup cannot move the pinned origin, credentials never
cross a redirect, failed downloads cannot tell ports apart, trickling downloads end at their
deadline while /health answers within a second, and SAM 3's labels per task are bounded. No
case may leave a traceback in the server's log.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
from PIL import Image

from paddle_sam.serve import create_label_studio_app
from paddle_sam.serve.fetch import is_public
from paddle_sam.serve.label_studio import MAX_PREDICTS, MAX_WAITING
from tests.helpers.server import ThreadedServer, assert_error, tiny_model, tiny_sam3_model

LEGACY = "legacy0123456789abcdef0123456789abcdef01"  # a legacy token: no dots
PAT = "eyJhbGciOiJIUzI1NiJ9." + "p" * 30 + "." + "s" * 30  # a personal access token (a JWT)
ACCESS = "eyJhbGciOiJIUzI1NiJ9." + "a" * 30 + "." + "x" * 30  # what the refresh answers
STRANGER = "stranger-token-0123456789"
SECRETS = (LEGACY, PAT, ACCESS)

CONFIG = """<View>
  <Image name="image" value="$image"/>
  <BrushLabels name="tag" toName="image">
    <Label value="star"/><Label value="ring"/><Label value="moon"/>
  </BrushLabels>
  <KeyPointLabels name="kp" toName="image" smart="true"><Label value="star"/></KeyPointLabels>
</View>"""
CLICK = {
    "result": [
        {
            "type": "keypointlabels",
            "value": {"x": 50, "y": 50, "keypointlabels": ["star"]},
            "is_positive": True,
        }
    ]
}


def png(size: int = 48) -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


PNG = png()


# -- the servers around the backend -------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        return " ".join([self.path, *self.headers.values(), self.body.decode("latin-1")])


@dataclass
class Upstream:
    """An HTTP server on ``host`` that records every request. Routes: ``/img.png`` (an image),
    ``/redirect?to=URL`` (302), ``/status/N``, ``/trickle`` (a 1 MB answer, a byte every 50 ms),
    ``/big`` (over the cap, no Content-Length), ``/big-declared`` (a Content-Length over the
    cap), ``POST /api/token/refresh`` (an access token, or ``refresh_status``)."""

    host: str = "127.0.0.1"
    refresh_status: int = 200
    seen: list[Seen] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Upstream:
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _record(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                upstream.seen.append(Seen(self.command, self.path, dict(self.headers), body))

            def _send(self, status: int, body: bytes = b"", **headers: str) -> None:
                self.send_response(status)
                for k, v in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self._record()
                if self.path == "/api/token/refresh" and upstream.refresh_status == 200:
                    self._send(200, json.dumps({"access": ACCESS}).encode())
                else:
                    self._send(upstream.refresh_status, b'{"detail": "Not found."}')

            def do_GET(self) -> None:
                self._record()
                path, _, query = self.path.partition("?")
                args = urllib.parse.parse_qs(query)
                if path.endswith(".png"):
                    self._send(200, PNG, **{"Content-Type": "image/png"})
                elif path == "/redirect":
                    self._send(302, Location=args["to"][0])
                elif path.startswith("/status/"):
                    self._send(int(path.rsplit("/", 1)[1]), b"nope")
                elif path == "/trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    try:
                        while not upstream.stop.wait(0.05):
                            self.wfile.write(b"\x89")
                            self.wfile.flush()
                    except OSError:
                        pass
                elif path == "/big":
                    self.send_response(200)
                    self.end_headers()  # no Content-Length: the body ends when the socket does
                    try:
                        for _ in range(64):
                            self.wfile.write(b"\0" * 65536)
                    except OSError:
                        pass
                    self.close_connection = True
                elif path == "/big-declared":
                    self.send_response(200)
                    self.send_header("Content-Length", str(2**40))
                    self.end_headers()
                else:
                    self._send(404, b"no")

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def secrets_seen(self) -> list[str]:
        return [f"{s.method} {s.path}" for s in self.seen for t in SECRETS if t in s.text()]


@pytest.fixture
def ls() -> Iterator[Upstream]:
    u = Upstream("127.0.0.1").start()
    yield u
    u.close()


@pytest.fixture
def capture() -> Iterator[Upstream]:
    u = Upstream("127.0.0.2").start()
    yield u
    u.close()
    assert u.secrets_seen() == [], "a token reached another address than Label Studio's"


class LogLines(logging.Handler):
    """Every record of the server's loggers (ours and uvicorn's) during a test."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def server_log() -> Iterator[LogLines]:
    """No traceback and no error record in the server's log; each record is one line."""
    handler = LogLines()
    loggers = [logging.getLogger(n) for n in ("paddle_sam.serve", "uvicorn.error")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield handler
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)
    for r in handler.records:
        assert r.exc_info is None and r.levelno < logging.ERROR, handler.format(r)
        assert "\n" not in r.getMessage(), r.getMessage()


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


@pytest.fixture
def backend(model) -> Iterator:
    """``start(model=None, **options)``: a backend under uvicorn on 127.0.0.1, its URL."""
    servers: list[ThreadedServer] = []

    def start(other_model=None, **options) -> str:
        app = create_label_studio_app(other_model if other_model is not None else model, **options)
        servers.append(ThreadedServer(app).__enter__())
        return servers[-1].url

    yield start
    for s in servers:
        s.__exit__(None, None, None)


def predict_body(ref: str, n: int = 1, context: dict | None = CLICK) -> dict:
    return {
        "tasks": [{"id": i + 1, "data": {"image": ref}} for i in range(n)],
        "project": "1.1",
        "label_config": CONFIG,
        "params": {"context": context},
    }


def one_line(r: httpx.Response) -> None:
    assert "\n" not in r.json()["detail"] and "Traceback" not in r.text, r.text


# -- single requests ---------------------------------------------------------------------------

BACKENDS = {
    "pinned": lambda ls: {"label_studio_url": ls.url, "api_key": LEGACY},
    "token refresh 404": lambda ls: {"label_studio_url": ls.url, "api_key": PAT},
    "small": lambda ls: {
        "label_studio_url": ls.url,
        "api_key": LEGACY,
        "max_tasks": 3,
        "max_upload_mb": 1,
    },
}
DEEP = b'{"tasks": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"


@dataclass
class Case:
    """One request and the answer it must get. ``body``: JSON (``{ls}``, ``{capture}``,
    ``{ls_port}`` and ``{capture_port}`` in its strings become the servers' addresses) or
    raw bytes. ``untouched``: the servers that must receive nothing."""

    defect: str
    name: str
    backend: str
    path: str
    body: dict | bytes
    status: int
    error: str
    words: tuple[str, ...] = ()
    untouched: tuple[str, ...] = ("capture",)


C = Case
P = "/predict"
NOBODY = ("ls", "capture")
HOSTILE = [
    # 5: no download from loopback, private, link-local or reserved addresses
    C("5", "another loopback address", "pinned", P, predict_body("http://{capture}/img.png"),
      403, "address_not_allowed", ("127.0.0.2", "--allow-private-urls")),
    C("5", "Label Studio's host, another port", "pinned", P,
      predict_body("http://127.0.0.1:{capture_port}/img.png"), 403, "address_not_allowed"),
    C("5", "a name resolving to loopback", "pinned", P,
      predict_body("http://localhost:{capture_port}/img.png"), 403, "address_not_allowed",
      ("127.0.0.1",)),
    C("5", "link-local (cloud metadata)", "pinned", P,
      predict_body("http://169.254.169.254/latest/meta-data/"), 403, "address_not_allowed"),
    C("5", "private 10/8", "pinned", P, predict_body("http://10.0.0.1/a.png"), 403,
      "address_not_allowed"),
    C("5", "IPv6 loopback", "pinned", P, predict_body("http://[::1]:{capture_port}/a.png"), 403,
      "address_not_allowed"),
    C("5", "IPv4-mapped IPv6 loopback", "pinned", P,
      predict_body("http://[::ffff:127.0.0.2]:{capture_port}/img.png"), 403,
      "address_not_allowed"),
    C("5", "0.0.0.0 (this host)", "pinned", P, predict_body("http://0.0.0.0:{ls_port}/img.png"),
      403, "address_not_allowed", untouched=NOBODY),
    C("5", "decimal IPv4 of 127.0.0.2", "pinned", P,
      predict_body("http://2130706434:{capture_port}/img.png"), 403, "address_not_allowed"),
    C("5", "Label Studio redirecting to a private address", "pinned", P,
      predict_body("/redirect?to=http://{capture}/img.png"), 403, "address_not_allowed"),
    # 14: clear 4xx for what used to be a 500 with a traceback
    C("14", "CR LF in a task URL", "pinned", P,
      predict_body("http://{ls}/img.png\r\nX-Injected: 1"), 400, "invalid_image_url",
      ("control character",), NOBODY),
    C("14", "CR LF in a Label Studio path", "pinned", P,
      predict_body("/img.png\r\nHost: {capture}"), 400, "invalid_image_url",
      ("control character",), NOBODY),
    C("14", "user and password in a task URL", "pinned", P,
      predict_body("http://user:pw@{capture}/img.png"), 400, "invalid_image_url", ("user name",),
      NOBODY),
    C("14", "schema not a string", "pinned", "/setup", {"project": "1.1", "schema": 5}, 400,
      "invalid_label_config", ("string", "int")),
    C("14", "label_config not a string", "pinned", P,
      {**predict_body("/img.png"), "label_config": {"a": 1}}, 400, "invalid_label_config",
      ("string",), NOBODY),
    C("14", "hostname not a string", "pinned", "/setup", {"schema": CONFIG, "hostname": ["x"]},
      400, "invalid_request", ("hostname",)),
    C("14", "/setup hostname not http(s)", "pinned", "/setup",
      {"schema": CONFIG, "hostname": "file:///etc"}, 200, ""),  # ignored: the URL is pinned
    C("14", "200000-deep JSON, /predict", "pinned", P, DEEP, 400, "invalid_json", ("nested",),
      NOBODY),
    C("14", "200000-deep JSON, /setup", "pinned", "/setup", DEEP, 400, "invalid_json",
      ("nested",), NOBODY),
    C("14", "token refresh answered 404", "token refresh 404", P, predict_body("/img.png"), 502,
      "label_studio_error", ("personal access token", "HTTP 404")),
    # 7: bounded work per request
    C("7", "more tasks than --max-tasks-per-request", "small", P, predict_body("/img.png", 4),
      400, "too_many_tasks", ("4 tasks", "at most 3"), NOBODY),
    # 6: the byte cap
    C("6", "an answer over the byte cap, no Content-Length", "small", P, predict_body("/big"),
      413, "image_too_large", ("1048576 bytes",)),
    C("6", "a Content-Length over the byte cap", "small", P, predict_body("/big-declared"), 413,
      "image_too_large"),
]  # fmt: skip


def _fill(obj, names: dict[str, str]):
    if isinstance(obj, str):
        return obj.format(**names)
    if isinstance(obj, dict):
        return {k: _fill(v, names) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, names) for v in obj]
    return obj


@pytest.mark.parametrize("case", HOSTILE, ids=[f"{c.defect}-{c.name}" for c in HOSTILE])
def test_hostile(case: Case, backend, ls: Upstream, capture: Upstream) -> None:
    if case.backend == "token refresh 404":
        ls.refresh_status = 404
    url = backend(**BACKENDS[case.backend](ls))
    names = {
        "ls": f"127.0.0.1:{ls.port}",
        "capture": f"127.0.0.2:{capture.port}",
        "ls_port": str(ls.port),
        "capture_port": str(capture.port),
    }
    if isinstance(case.body, bytes):
        headers = {"Content-Type": "application/json"}
        r = httpx.post(url + case.path, content=case.body, headers=headers, timeout=30)
    else:
        r = httpx.post(url + case.path, json=_fill(case.body, names), timeout=30)
    if case.status == 200:
        assert r.status_code == 200, r.text
    else:
        assert_error(r, case.status, case.error, *case.words)
        one_line(r)
    for name in case.untouched:
        server = {"ls": ls, "capture": capture}[name]
        assert server.seen == [], f"{name} was contacted: {[s.path for s in server.seen]}"


# -- 1: the origin is pinned -------------------------------------------------------------------


def test_setup_cannot_move_the_pinned_origin(backend, ls: Upstream, capture: Upstream) -> None:
    # with --label-studio-url and the key: the address /setup names is never used
    url = backend(label_studio_url=ls.url, api_key=LEGACY)
    setup = {"project": "1.1", "schema": CONFIG}
    r = httpx.post(
        url + "/setup", json={**setup, "hostname": capture.url, "access_token": STRANGER}
    )
    assert r.status_code == 200, r.text
    r = httpx.post(url + "/predict", json=predict_body("/img.png"), timeout=30)
    assert r.status_code == 200 and r.json()["results"][0]["result"], r.text
    assert [s.headers.get("Authorization") for s in ls.seen] == [f"Token {LEGACY}"]
    assert capture.seen == []

    # without them: the first /setup pins Label Studio's origin, with the token it sent;
    # another origin is refused and never used, with a token or without
    ls.seen.clear()
    url = backend()
    r = httpx.post(url + "/setup", json={**setup, "hostname": "file:///etc/passwd"})
    assert_error(r, 400, "invalid_hostname", "only http(s)")
    r = httpx.post(url + "/setup", json={**setup, "hostname": ls.url, "access_token": LEGACY})
    assert r.status_code == 200, r.text
    for token in (STRANGER, None):
        body = {**setup, "hostname": capture.url + "/", "access_token": token}
        r = httpx.post(url + "/setup", json=body)
        assert_error(r, 409, "label_studio_origin_pinned", ls.url, "127.0.0.2")
        one_line(r)
    r = httpx.post(url + "/predict", json=predict_body("/img.png"), timeout=30)
    assert r.status_code == 200, r.text
    assert [s.headers.get("Authorization") for s in ls.seen] == [f"Token {LEGACY}"]
    assert capture.seen == []


def test_api_key_needs_the_label_studio_url(model, monkeypatch, capsys) -> None:
    from paddle_sam.cli import main

    with pytest.raises(ValueError, match="--label-studio-url"):
        create_label_studio_app(model, api_key=LEGACY)
    monkeypatch.delenv("LABEL_STUDIO_URL", raising=False)
    monkeypatch.delenv("LABEL_STUDIO_API_KEY", raising=False)
    assert main(["serve", "--label-studio", "--label-studio-api-key", LEGACY]) == 2
    assert "needs --label-studio-url" in capsys.readouterr().err
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", LEGACY)
    assert main(["serve", "--label-studio"]) == 2
    assert "needs --label-studio-url" in capsys.readouterr().err
    assert main(["serve", "--label-studio", "--label-studio-url", "ftp://ls:21"]) == 2
    assert "--label-studio-url: ftp://ls:21: only http(s)" in capsys.readouterr().err
    assert main(["serve", "--allow-private-urls"]) == 2
    assert "--allow-private-urls apply to --label-studio only" in capsys.readouterr().err


# -- 2: credentials go to the pinned origin only, and never across a redirect ------------------


@pytest.mark.parametrize("token", [LEGACY, PAT], ids=["legacy token", "personal access token"])
def test_credentials_never_cross_redirects(
    token: str, backend, ls: Upstream, capture: Upstream
) -> None:
    # private addresses allowed, so that the download reaches the stranger: the credential
    # rule is what is tested here
    url = backend(label_studio_url=ls.url, api_key=token, allow_private_urls=True)
    sent = f"Token {LEGACY}" if token == LEGACY else f"Bearer {ACCESS}"
    q = urllib.parse.quote
    # Label Studio -> the stranger -> Label Studio again
    ref = "/redirect?to=" + q(f"{capture.url}/redirect?to=" + q(f"{ls.url}/img.png"))
    for i, image in enumerate([ref, f"{capture.url}/direct.png", f"{ls.url}/absolute.png"]):
        body = predict_body(image)
        body["tasks"][0]["id"] = 10 + i
        r = httpx.post(url + "/predict", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["results"][0]["result"], r.text
    gets = [(s.path, s.headers.get("Authorization")) for s in ls.seen if s.method == "GET"]
    assert gets == [
        (ref, sent),  # Label Studio's own path: with the token
        ("/img.png", None),  # back on Label Studio after leaving it: still without
        ("/absolute.png", sent),  # an absolute address on Label Studio's origin: with it
    ]
    assert [s.path for s in capture.seen] == [
        "/redirect?to=" + q(f"{ls.url}/img.png"),
        "/direct.png",
    ]
    assert all("Authorization" not in s.headers for s in capture.seen)
    posts = [(s.path, json.loads(s.body)) for s in ls.seen if s.method == "POST"]
    assert posts == ([("/api/token/refresh", {"refresh": PAT})] if token == PAT else [])


# -- 5: a failed download does not say whether a port is open ---------------------------------


def _listener(host: str, answer: bytes | None) -> tuple[socket.socket, int]:
    """A TCP port that accepts and writes ``answer`` and closes (None: never accepts)."""
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(answer)

    if answer is not None:
        threading.Thread(target=serve, daemon=True).start()
    return sock, sock.getsockname()[1]


def test_failed_downloads_cannot_tell_ports_apart(backend, capture: Upstream) -> None:
    url = backend(allow_private_urls=True, download_timeout_s=1.0)
    closed = socket.socket()
    closed.bind(("127.0.0.2", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    banner, banner_port = _listener("127.0.0.2", b"SSH-2.0-OpenSSH_9.6\r\n")
    silent, silent_port = _listener("127.0.0.2", None)
    try:
        refs = {
            "closed port": f"http://127.0.0.2:{closed_port}/x.png",
            "not HTTP": f"http://127.0.0.2:{banner_port}/x.png",
            "never answers": f"http://127.0.0.2:{silent_port}/x.png",
            "HTTP 404": f"{capture.url}/status/404",
            "HTTP 500": f"{capture.url}/status/500",
            "redirect loop": f"{capture.url}/redirect?to=/redirect?to=/redirect?to=/redirect"
            "?to=/redirect?to=/redirect?to=/redirect?to=/x",
            "no such host": "http://no-such-host.invalid/x.png",
        }
        details = {}
        for i, (what, ref) in enumerate(refs.items()):
            body = predict_body(ref)
            body["tasks"][0]["id"] = i
            r = httpx.post(url + "/predict", json=body, timeout=30)
            assert_error(r, 502, "download_failed", "could not be downloaded")
            one_line(r)
            details[what] = r.json()["detail"].replace(ref, "URL")
        assert len(set(details.values())) == 1, details
    finally:
        banner.close()
        silent.close()


def test_public_addresses() -> None:
    public = ["8.8.8.8", "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808"]
    private = [
        "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1",
        "169.254.169.254", "0.0.0.0", "224.0.0.1", "255.255.255.255", "192.0.2.1", "::1", "::",
        "fe80::1", "fc00::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
        "64:ff9b::7f00:1", "2002:7f00:1::1",
    ]  # fmt: skip
    assert [a for a in public if not is_public(a)] == []
    assert [a for a in private if is_public(a)] == []


# -- 6: a total deadline per download, and /health while downloads trickle --------------------


def test_trickling_downloads_end_and_health_answers(backend, ls: Upstream) -> None:
    deadline = 2.0
    url = backend(label_studio_url=ls.url, api_key=LEGACY, download_timeout_s=deadline)
    t = time.monotonic()
    r = httpx.post(url + "/predict", json=predict_body("/trickle?first"), timeout=60)
    took = time.monotonic() - t
    assert_error(r, 502, "label_studio_unreachable", f"no complete answer within {deadline:g} s")
    assert took < deadline + 3, took  # the trickle would go on for 20000 s

    n = 42  # more than the worker threads (40) and than the requests let in
    bodies = []
    for i in range(n):
        body = predict_body(f"/trickle?{i}")
        body["tasks"][0]["id"] = 100 + i
        bodies.append(body)
    limits = httpx.Limits(max_connections=n + 1)
    with ThreadPoolExecutor(n) as pool, httpx.Client(limits=limits, timeout=120) as client:
        # one client for all: the test's own threads must not starve the server of the GIL
        futures = [pool.submit(client.post, url + "/predict", json=b) for b in bodies]
        deadline_wait = time.monotonic() + 30
        while sum(s.path.startswith("/trickle?") for s in ls.seen) < 1 + MAX_PREDICTS:
            assert time.monotonic() < deadline_wait, "the downloads did not start"
            time.sleep(0.02)
        latencies = []
        while not all(f.done() for f in futures):
            t = time.monotonic()
            h = httpx.get(url + "/health", timeout=10)
            latencies.append(time.monotonic() - t)
            assert h.status_code == 200 and h.json()["status"] == "UP"
            time.sleep(0.2)
        answers = [f.result() for f in futures]
    assert len(latencies) >= 5 and max(latencies) < 1.0, latencies
    statuses = sorted(r.status_code for r in answers)
    busy = [r for r in answers if r.status_code == 503]
    assert set(statuses) <= {502, 503}, statuses
    assert MAX_PREDICTS <= statuses.count(502) and busy, statuses
    assert statuses.count(503) >= n - (MAX_PREDICTS + MAX_WAITING) - MAX_PREDICTS, statuses
    for r in answers:
        assert_error(
            r, r.status_code, "busy" if r.status_code == 503 else "label_studio_unreachable"
        )
        one_line(r)
    assert busy[0].headers["Retry-After"]


# -- 7: SAM 3 prompts at most --max-labels-per-task labels per task ---------------------------


def test_sam3_labels_per_task_are_bounded(backend, ls: Upstream) -> None:
    url = backend(tiny_sam3_model(0), label_studio_url=ls.url, max_labels=2)
    body = predict_body("/img.png", context=None)  # no context: every brush label is prompted
    r = httpx.post(url + "/predict", json=body, timeout=60)
    assert_error(r, 400, "too_many_labels", "3 labels", "at most 2", "--max-labels-per-task")
    one_line(r)
    assert ls.seen == []  # refused before any download
    body["label_config"] = CONFIG.replace('<Label value="moon"/>', "")
    r = httpx.post(url + "/predict", json=body, timeout=120)
    assert r.status_code == 200, r.text
    labels = {region["value"]["brushlabels"][0] for region in r.json()["results"][0]["result"]}
    assert labels <= {"star", "ring"}
