"""Hostile videos and video uploads against the real ``paddle-sam track`` (a subprocess) and a
real ``paddle-sam serve`` (uvicorn on 127.0.0.1, SAM 3's tiny video model).

- A container that lies (issue 37, 8): an MJPG AVI written byte by byte whose header says
  64x48 while its frames are 4000x3000 JPEGs (FFmpeg then reports 64x48 and OpenCV scales
  every frame down to it without a word). ``track`` refuses it (exit 2, one line, nothing
  written, under 1 GB), the service answers 413 naming --max-video-pixels, and a click in
  another session and /health answer within a second meanwhile.
- The memory budget (12): a session that grows past the whole budget by itself is dropped
  with a 413 naming the budget and its flag, the other sessions kept; uploads in flight hold
  their bytes in the budget (by Content-Length, or as bytes arrive): eight at once get 429
  past it, one above the whole budget 413, and the files on disk never pass the budget.
- An upload the client abandons (13): one log line, no traceback, nothing left behind.
"""

from __future__ import annotations

import io
import logging
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from PIL import Image

from paddle_sam.serve import create_app
from tests.helpers.pairs import image as make_image
from tests.helpers.server import (
    ThreadedServer,
    assert_error,
    png_bytes,
    tiny_sam3_video_model,
)
from tests.helpers.video import scene, write_mp4

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
GiB = 2**30
HEALTH_S = 1.0  # the bound on /health and a click while an attack runs
BIG = (4000, 3000)  # the frames' real size: 12 Mpixels, above the default 1920 x 1080


# -- an AVI written byte by byte: its header says what we want -------------------------------


def _chunk(fourcc: bytes, data: bytes) -> bytes:
    return fourcc + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")


def _list(kind: bytes, data: bytes) -> bytes:
    return b"LIST" + struct.pack("<I", len(data) + 4) + kind + data


def jpeg(width: int, height: int, colour=(200, 30, 30)) -> bytes:
    """A flat JPEG: a few kB whatever its size."""
    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buf, format="JPEG", quality=50)
    return buf.getvalue()


def mjpg_avi(frames: list[bytes], width: int, height: int, fps: int = 10) -> bytes:
    """A RIFF AVI of MJPG frames (each a JPEG file) whose headers (avih, strh, strf) declare
    ``width x height``, whatever the frames are."""
    n = len(frames)
    avih = struct.pack("<14I", 1_000_000 // fps, 0, 0, 0x10, n, 0, 1, 0, width, height, 0, 0, 0, 0)
    strh = (
        b"vids"
        + b"MJPG"
        + struct.pack(
            "<IHHIIIIIIIIhhhh", 0, 0, 0, 0, 1, fps, 0, n, 0, 0xFFFFFFFF, 0, 0, 0, width, height
        )
    )
    strf = struct.pack(
        "<IiiHH4sIiiII", 40, width, height, 1, 24, b"MJPG", width * height * 3, 0, 0, 0, 0
    )
    strl = _list(b"strl", _chunk(b"strh", strh) + _chunk(b"strf", strf))
    hdrl = _list(b"hdrl", _chunk(b"avih", avih) + strl)
    movi, index = b"", b""
    for frame in frames:
        index += b"00dc" + struct.pack("<III", 0x10, 4 + len(movi), len(frame))
        movi += _chunk(b"00dc", frame)
    body = b"AVI " + hdrl + _list(b"movi", movi) + _chunk(b"idx1", index)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def liar(frames: int = 12) -> bytes:
    """Header and frame 0: 64x48; frames 1...: 4000x3000. FFmpeg reads the size of frame 0,
    so OpenCV says 64x48 and decodes every big frame at full size, then scales it down."""
    return mjpg_avi([jpeg(64, 48)] + [jpeg(*BIG)] * (frames - 1), 64, 48)


def liar_throughout(frames: int = 6) -> bytes:
    """Header 64x48, every frame 4000x3000."""
    return mjpg_avi([jpeg(*BIG)] * frames, 64, 48)


def test_the_liar_is_what_it_says():
    """Control: OpenCV, asked as the old code asked it, believes the small size and scales
    the big frames to it (what let the file through, and what the header check now sees)."""
    import tempfile

    import cv2

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "liar.avi"
        path.write_bytes(liar(3))
        cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
        try:
            size = (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
            shapes = []
            while True:
                ok, frame = cap.read()
                if not ok:
                    break
                shapes.append(frame.shape)
        finally:
            cap.release()
    assert size == (64, 48)
    assert shapes == [(48, 64, 3)] * 3  # frames 1 and 2 are 4000x3000 in the file


# -- the command line --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A SAM 3 checkpoint with the tracker (random weights, the released layout, converted),
    as tests/cli/test_cli_track.py makes it."""
    torch = pytest.importorskip("torch")
    from paddle_sam.convert import sam3 as conv
    from paddle_sam.convert.checkpoint import convert_checkpoint
    from tests.helpers.specs import tiny_sam3_tracker_spec

    spec = tiny_sam3_tracker_spec()
    work = tmp_path_factory.mktemp("ckpt")
    state = conv.random_released_state_dict(spec, seed=3, with_tracker=True)
    src = work / "sam3_tiny_video.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, src)
    dst = work / "sam3_tiny_video.pdparams"
    convert_checkpoint(src, dst, spec=spec, progress=False)
    return dst


# a small process that runs the command line and prints its peak RSS: the command's own
# rusage (the RSS a child has at fork, before exec, counts in it: not pytest's then)
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "paddle_sam", *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss * 1024)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_cli(argv: list, tmp: Path) -> tuple[int, str, int]:
    """``python -m paddle_sam ARGV`` in a subprocess: exit status, stderr and its peak RSS
    in bytes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=300,
    )
    return proc.returncode, proc.stderr, int(proc.stdout.strip().splitlines()[-1])


def test_track_refuses_frames_the_header_hides(tmp_path, ckpt):
    video = tmp_path / "liar.avi"
    video.write_bytes(liar())
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file")
    argv = ["track", video, "--checkpoint", ckpt, "-o", out, "--point", "0,10,10", "--quiet"]
    code, err, peak = run_cli(argv, tmp_path)
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("paddle-sam track: error: "), lines
    assert "frame 1 is 4000x3000, but frame 0 is 64x48" in lines[0], lines
    assert "liar.avi" in lines[0]
    assert peak < GiB, peak
    assert sorted(os.listdir(out)) == ["notes.txt"]  # nothing written, nothing replaced
    assert (out / "notes.txt").read_text() == "the user's own file"


# -- the service: what is watched while an attack runs ----------------------------------------


def dir_bytes(d: Path) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


class Watch:
    """While an attack runs: /health polled and, when ``sid`` is given, a click in that
    image session sent, each over its own connection (their slowest answers); this
    process's RSS and the bytes under ``folder`` sampled (their peaks)."""

    def __init__(self, url: str, folder: Path, sid: str | None = None) -> None:
        self.url, self.folder, self.sid = url, folder, sid
        self.stop = threading.Event()
        self.latency: dict[str, list[float]] = {"health": [], "click": []}
        self.errors: list[str] = []
        self.proc = psutil.Process()
        self.rss0 = self.rss_peak = self.proc.memory_info().rss
        self.disk_peak = 0

    def _poll(self, kind: str) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self.stop.is_set():
                t = time.perf_counter()
                if kind == "health":
                    r = c.get("/health")
                else:
                    r = c.post(f"/sessions/{self.sid}/prompt", json={"points": [[20, 20]]})
                self.latency[kind].append(time.perf_counter() - t)
                if r.status_code != 200:
                    self.errors.append(f"{kind}: {r.status_code} {r.text[:200]}")
                self.stop.wait(0.02)

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.rss_peak = max(self.rss_peak, self.proc.memory_info().rss)
            self.disk_peak = max(self.disk_peak, dir_bytes(self.folder))
            self.stop.wait(0.003)

    def _wait(self, n: int) -> None:
        deadline = time.monotonic() + 30
        while any(len(v) < n for k, v in self.latency.items() if k == "health" or self.sid):
            assert time.monotonic() < deadline, self.latency
            time.sleep(0.005)

    def __enter__(self) -> Watch:
        kinds = ["health", "click"] if self.sid else ["health"]
        self.threads = [threading.Thread(target=self._poll, args=(k,)) for k in kinds]
        self.threads.append(threading.Thread(target=self._sample))
        for t in self.threads:
            t.start()
        self._wait(1)
        return self

    def __exit__(self, *exc) -> None:
        self._wait(max(len(v) for v in self.latency.values()) + 1)
        self.stop.set()
        for t in self.threads:
            t.join()

    def assert_responsive(self) -> None:
        assert not self.errors, self.errors
        for kind, times in self.latency.items():
            if times:
                assert max(times) < HEALTH_S, (kind, max(times), len(times))
        assert self.rss_peak - self.rss0 < GiB, self.rss_peak - self.rss0


@pytest.fixture(scope="module")
def model():
    return tiny_sam3_video_model(seed=0)


@pytest.fixture(scope="module")
def server(model) -> Iterator[ThreadedServer]:
    app = create_app(model, max_video_frames=40)
    with ThreadedServer(app) as s:
        s.app = app
        yield s


@pytest.fixture(scope="module")
def clicked(server) -> str:
    """An image session with one click answered (what is allocated once is not counted)."""
    img = png_bytes(make_image(60, 80, seed=3))
    r = httpx.post(f"{server.url}/sessions", files={"image": ("a.png", img, "image/png")})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    r = httpx.post(f"{server.url}/sessions/{sid}/prompt", json={"points": [[20, 20]]})
    assert r.status_code == 200, r.text
    return sid


# -- 8: frames larger than the container says ---------------------------------------------------


@pytest.mark.parametrize(
    "name, data, words",
    [
        ("liar.avi", liar(40), ["frame 1: 4000x3000 pixels"]),
        ("liar_throughout.avi", liar_throughout(), ["4000x3000 pixels"]),
    ],
    ids=["big frames after a small one", "big frames under a small header"],
)
@pytest.mark.parametrize("encoding", ["multipart", "raw"])
def test_service_refuses_frames_the_header_hides(server, clicked, name, data, words, encoding):
    workdir = server.app.state.videos.workdir
    with Watch(server.url, workdir, clicked) as watch:
        t = time.perf_counter()
        if encoding == "multipart":
            files = {"video": (name, data, "video/x-msvideo")}
            r = httpx.post(f"{server.url}/videos", files=files, timeout=120)
        else:
            headers = {"Content-Type": "video/x-msvideo"}
            r = httpx.post(f"{server.url}/videos", content=data, headers=headers, timeout=120)
        seconds = time.perf_counter() - t
    limit = str(1920 * 1080)
    assert_error(r, 413, "video_too_large", *words, limit, "--max-video-pixels")
    if encoding == "multipart":
        assert name in r.json()["detail"]
    assert str(workdir) not in r.json()["detail"]  # the server's paths are not told
    assert seconds < HEALTH_S, seconds  # refused from the frames' headers: nothing decoded
    watch.assert_responsive()
    assert list(workdir.iterdir()) == []
    assert server.app.state.store.reserved_bytes == 0


def test_service_refuses_too_many_frames_before_decoding(server):
    """More frames than --max-video-frames: refused by counting the packets of an image
    codec, none decoded."""
    data = mjpg_avi([jpeg(64, 48)] * 41, 64, 48)
    r = httpx.post(f"{server.url}/videos", files={"video": ("long.avi", data, "video/avi")})
    assert_error(r, 413, "video_too_long", "long.avi", "40 frames", "--max-video-frames")


def test_service_still_opens_an_honest_video(server, tmp_path):
    clip = write_mp4(scene(6, 60, 80), tmp_path / "clip.mp4")
    avi = mjpg_avi([jpeg(80, 60, (10 * k, 50, 50)) for k in range(6)], 80, 60)
    for name, data in (("clip.mp4", clip.read_bytes()), ("clip.avi", avi)):
        r = httpx.post(f"{server.url}/videos", files={"video": (name, data, "video/mp4")})
        assert r.status_code == 201, r.text
        info = r.json()
        assert (info["width"], info["height"], info["num_frames"]) == (80, 60, 6)
        r = httpx.get(f"{server.url}/videos/{info['session_id']}/frames/5.jpg")
        assert r.status_code == 200
        assert httpx.delete(f"{server.url}/videos/{info['session_id']}").status_code == 200


# -- 12: the memory budget ------------------------------------------------------------------------


@pytest.fixture
def small(model, caplog) -> Iterator[ThreadedServer]:
    """A server with a 4 MiB budget."""
    caplog.set_level(logging.INFO, logger="paddle_sam.serve")
    app = create_app(model, memory_budget_mb=4)
    with ThreadedServer(app) as s:
        s.app = app
        yield s


def test_a_session_past_the_budget_by_itself_is_dropped_not_the_others(small, tmp_path):
    clip = write_mp4(scene(6, 60, 80), tmp_path / "clip.mp4")
    url, store = small.url, small.app.state.store

    def upload() -> dict:
        r = httpx.post(f"{url}/videos", files={"video": ("clip.mp4", clip.read_bytes(), "v/mp4")})
        assert r.status_code == 201, r.text
        return r.json()

    kept, grows = upload(), upload()
    # a text prompt computes frame 0's features: the session alone passes 4 MiB
    r = httpx.post(
        f"{url}/videos/{grows['session_id']}/prompt",
        json={"frame_index": 0, "text": "a red square"},
        timeout=120,
    )
    assert_error(r, 413, "session_too_large", "grew to", "4.0 MiB", "--memory-budget-mb")
    r = httpx.get(f"{url}/videos/{grows['session_id']}")
    assert_error(r, 410, "session_expired", "grew to", "--memory-budget-mb")
    assert httpx.get(f"{url}/videos/{kept['session_id']}").status_code == 200  # not evicted
    stats = httpx.get(f"{url}/health").json()["sessions"]
    assert stats["count"] == 1 and stats["evictions"] == 0
    assert stats["bytes"] <= stats["budget_bytes"] == 4 * MiB
    deadline = time.monotonic() + 10  # closed by a thread of its own
    while len(small.app.state.videos.predictor.session_ids()) != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert store.total_bytes == kept["bytes"]


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def _head(url: str, headers: dict[str, str]) -> bytes:
    lines = ["POST /videos HTTP/1.1", f"Host: {urlsplit(url).netloc}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _answer(sock: socket.socket, wait: float = 0.0) -> tuple[int, dict] | None:
    """The status and JSON body if an answer arrived (within ``wait`` seconds), else None."""
    import json

    if not select.select([sock], [], [], wait)[0]:
        return None
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            return None
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        more = sock.recv(65536)
        if not more:
            break
        body += more
    return int(lines[0].split()[1]), json.loads(body[:length])


UPLOAD = 3 * MiB // 2  # eight of them: 12 MiB, three times the budget
AVI_HEAD = b"RIFF\x00\x00\x00\x00AVI LIST"


def test_uploads_in_flight_count_against_the_budget(small):
    """Eight uploads at once, each 1.5 MiB under a 4 MiB budget."""
    url, store = small.url, small.app.state.store
    workdir = small.app.state.videos.workdir
    body = AVI_HEAD + b"\x00" * (UPLOAD - len(AVI_HEAD))
    with Watch(url, workdir) as watch:
        # by Content-Length: reserved before a byte of the body is read
        socks = [_connect(url) for _ in range(8)]
        headers = {"Content-Type": "video/x-msvideo", "Content-Length": str(UPLOAD)}
        for s in socks:
            s.sendall(_head(url, headers))
            time.sleep(0.05)  # in order: the first two are admitted
        answers = [_answer(s, 5.0 if k >= 2 else 0.5) for k, s in enumerate(socks)]
        assert answers[:2] == [None, None]  # waiting for their bodies
        for status, body_json in answers[2:]:
            assert status == 429 and body_json["error"] == "uploads_busy", body_json
            assert "--memory-budget-mb" in body_json["detail"]
        assert store.reserved_bytes == 2 * UPLOAD
        for s in socks[:2]:
            s.sendall(body)
        for s in socks[:2]:  # read, then refused: not a readable video
            status, body_json = _answer(s, 30.0)
            assert (status, body_json["error"]) == (400, "invalid_video"), body_json
        for s in socks:
            s.close()

        # chunked: reserved as the bytes arrive, refused once the budget is held
        socks = [_connect(url) for _ in range(8)]
        headers = {"Content-Type": "video/x-msvideo", "Transfer-Encoding": "chunked"}
        for s in socks:
            s.sendall(_head(url, headers))
        piece = 256 * 1024
        answered: dict[int, tuple[int, dict]] = {}
        for offset in range(0, UPLOAD, piece):
            data = body[offset : offset + piece]
            for k, s in enumerate(socks):
                if k in answered:
                    continue
                got = _answer(s)
                if got is not None:
                    answered[k] = got
                    continue
                try:
                    s.sendall(b"%x\r\n" % len(data) + data + b"\r\n")
                except OSError:  # answered and closed meanwhile
                    answered[k] = _answer(s, 5.0) or (0, {})
            time.sleep(0.05)
            assert dir_bytes(workdir) <= 4 * MiB
        for k, s in enumerate(socks):
            if k not in answered:
                s.sendall(b"0\r\n\r\n")
                answered[k] = _answer(s, 30.0)
            s.close()
    codes = sorted(status for status, _ in answered.values())
    assert codes.count(429) >= 4 and set(codes) <= {400, 429}, answered
    for status, body_json in answered.values():
        if status == 429:
            assert body_json["error"] == "uploads_busy" and "MiB" in body_json["detail"]
    assert watch.disk_peak <= 4 * MiB, watch.disk_peak
    watch.assert_responsive()
    assert store.reserved_bytes == 0 and list(workdir.iterdir()) == []


def test_an_upload_above_the_whole_budget(small):
    url, store = small.url, small.app.state.store
    r = httpx.post(
        f"{url}/videos",
        content=AVI_HEAD + b"\x00" * (5 * MiB),
        headers={"Content-Type": "video/x-msvideo"},
    )
    assert_error(r, 413, "session_too_large", "4.0 MiB", "--memory-budget-mb")

    def chunks() -> Iterator[bytes]:
        yield AVI_HEAD
        for _ in range(20):
            yield b"\x00" * (256 * 1024)

    r = httpx.post(f"{url}/videos", content=chunks(), headers={"Content-Type": "video/avi"})
    assert_error(r, 413, "session_too_large", "--memory-budget-mb")
    assert store.reserved_bytes == 0
    assert list(small.app.state.videos.workdir.iterdir()) == []


# -- 13: an upload the client abandons ---------------------------------------------------------


@pytest.mark.parametrize("encoding", ["raw", "multipart"])
def test_an_abandoned_upload_is_one_log_line(small, caplog, encoding):
    url, store = small.url, small.app.state.store
    caplog.clear()
    boundary = "b0undary"
    if encoding == "raw":
        ctype, prefix = "video/mp4", b""
    else:
        ctype = f"multipart/form-data; boundary={boundary}"
        prefix = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="video"; '
            'filename="v.mp4"\r\nContent-Type: video/mp4\r\n\r\n'
        ).encode()
    for _ in range(3):
        s = _connect(url)
        s.sendall(_head(url, {"Content-Type": ctype, "Content-Length": str(2 * MiB)}))
        s.sendall(prefix + b"\x00\x00\x00\x18ftypisom" + b"\x00" * (256 * 1024))
        time.sleep(0.2)
        s.close()
    deadline = time.monotonic() + 10
    while len([r for r in caplog.records if "abandoned" in r.getMessage()]) < 3:
        assert time.monotonic() < deadline, caplog.text
        time.sleep(0.02)
    time.sleep(0.3)  # anything else it would log
    assert "Traceback" not in caplog.text
    assert all(r.exc_info is None for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    abandoned = [r for r in caplog.records if "abandoned" in r.getMessage()]
    assert len(abandoned) == 3
    assert all("\n" not in r.getMessage() for r in abandoned)
    assert store.reserved_bytes == 0
    assert list(small.app.state.videos.workdir.iterdir()) == []
    assert httpx.get(f"{url}/health").status_code == 200
