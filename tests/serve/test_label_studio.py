"""The Label Studio ML backend (``paddle-sam serve --label-studio``).

In-process: the labelling config and click context parsing, the protocol's routes, errors, basic
authentication. Against a real Label Studio (the pinned release in ``.venv-label-studio``, which
``make test`` installs; started here on 127.0.0.1 with a throwaway data dir, stopped after): a
project created through its API, the backend connected, an image task imported, predictions
obtained through Label Studio itself (interactive clicks, SAM 3 text and pre-labelling), and the
brush results decoded by Label Studio's own RLE decoder equal to the masks our predictors return.
Without that venv the server tests skip, and fail in CI.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from paddle_sam.predict.io import label_studio_rle
from paddle_sam.predict.sam_v1.predictor import SamPredictor
from paddle_sam.serve import create_label_studio_app
from paddle_sam.serve.label_studio import parse_context, parse_label_config, parse_tracks
from tests.helpers.ci import missing
from tests.helpers.server import (
    ThreadedServer,
    assert_error,
    png_bytes,
    sam3_threshold,
    tiny_model,
    tiny_sam3_model,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "paddle_sam" / "assets" / "sam_tiny_synthetic.pdparams"
LS_BIN = ROOT / ".venv-label-studio" / "bin"
LS_TOKEN = "0123456789abcdef0123456789abcdef01234567"

# Label Studio's default SSRF block list (USE_DEFAULT_BANNED_SUBNETS) without 127.0.0.0/8
BANNED_BUT_LOOPBACK = [
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "233.252.0.0/24", "240.0.0.0/4",
    "255.255.255.255/32", "::/128", "::1/128", "::ffff:0:0/96", "::ffff:0:0:0/96",
    "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/32", "2001:20::/28",
    "2001:db8::/32", "2002::/16", "fc00::/7", "fe80::/10", "ff00::/8",
]  # fmt: skip

CONFIG = """<View>
  <Image name="image" value="$image"/>
  <BrushLabels name="tag" toName="image">
    <Label value="star" background="#ff0000"/>
    <Label value="ring" background="#0000ff"/>
  </BrushLabels>
  <KeyPointLabels name="kp" toName="image" smart="true">
    <Label value="star" smart="true"/>
  </KeyPointLabels>
  <RectangleLabels name="box" toName="image" smart="true">
    <Label value="ring" smart="true"/>
  </RectangleLabels>
  <TextArea name="prompt" toName="image" editable="true" rows="1"/>
</View>"""


def scene(h: int = 96, w: int = 160) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 256], axis=-1).astype(np.uint8)
    img[20:60, 30:90] = (250, 40, 40)
    img[50:80, 100:140] = (30, 30, 220)
    return img


def keypoint(x: float, y: float, label: str = "star", positive: bool = True) -> dict:
    return {
        "type": "keypointlabels",
        "from_name": "kp",
        "to_name": "image",
        "original_width": 160,
        "original_height": 96,
        "is_positive": positive,
        "value": {"x": x, "y": y, "width": 0.5, "keypointlabels": [label]},
    }


def rectangle(x: float, y: float, w: float, h: float, label: str = "ring") -> dict:
    return {
        "type": "rectanglelabels",
        "from_name": "box",
        "to_name": "image",
        "value": {"x": x, "y": y, "width": w, "height": h, "rectanglelabels": [label]},
    }


def textarea(text: str) -> dict:
    value = {"text": [text]}
    return {"type": "textarea", "from_name": "prompt", "to_name": "image", "value": value}


def data_url(image: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


# -- in-process ------------------------------------------------------------------------------


def test_label_config_parsing():
    c = parse_label_config(CONFIG)
    assert (c.image, c.image_key, c.brush, c.labels) == ("image", "image", "tag", ["star", "ring"])
    assert c.label_for(" Star ") == "star" and c.label_for("car") is None
    with pytest.raises(ValueError, match="no <BrushLabels>"):
        parse_label_config('<View><Image name="i" value="$img"/></View>')
    with pytest.raises(ValueError, match="no <Image>"):
        parse_label_config("<View><Text name='t' value='$text'/></View>")
    with pytest.raises(ValueError, match="not valid XML"):
        parse_label_config("<View><Image")


def test_context_in_pixels():
    p = parse_context(
        {"result": [keypoint(25, 50), keypoint(50, 25, positive=False), rectangle(10, 20, 30, 40)]},
        160,
        96,
    )
    assert p.points == [[40.0, 48.0], [80.0, 24.0]]
    assert p.point_labels == [1, 0]
    assert p.box == pytest.approx([16.0, 19.2, 64.0, 57.6])
    assert p.label == "ring" and p.text is None
    assert parse_context({"result": [textarea(" red star ")]}, 10, 10).text == "red star"
    with pytest.raises(ValueError, match=r"result\[0\]\.value\.x must be a number"):
        parse_context({"result": [keypoint("a", 3)]}, 10, 10)


def test_label_studio_rle_runs():
    """Structure of the packed stream (its decoding is checked by Label Studio's own decoder
    in the server tests): 32-bit count of RGBA bytes, word size 8, widths 3/4/8/16."""
    mask = np.zeros((300, 300), dtype=bool)
    rle = label_studio_rle(mask)
    bits = "".join(f"{b:08b}" for b in rle)
    assert int(bits[:32], 2) == 300 * 300 * 4
    assert int(bits[32:37], 2) + 1 == 8
    assert [int(bits[37 + 4 * i : 41 + 4 * i], 2) + 1 for i in range(4)] == [3, 4, 8, 16]
    # 360000 zero bytes: 5 full runs of 65536 and one of 32320, each 1+2+16+8 bits
    assert len(bits) == -(-(53 + 6 * 27) // 8) * 8
    with pytest.raises(ValueError, match="empty"):
        label_studio_rle(np.zeros((0, 4), dtype=bool))


@pytest.fixture(scope="module")
def sam_v1():
    return tiny_model(0)


def test_predict_clicks_in_process(sam_v1):
    """/predict with a data: URL task: the brush mask is the predictor's best mask; the task's
    embedding is computed once for several requests."""
    image = scene()
    client = TestClient(create_label_studio_app(sam_v1))
    assert client.get("/health").json()["status"] == "UP"
    r = client.post("/setup", json={"project": "3.1700000000", "schema": CONFIG})
    assert r.status_code == 200 and r.json()["model_version"].startswith("paddle-sam-")
    task = {"id": 7, "data": {"image": data_url(image)}}
    ctx = {"result": [keypoint(25, 50)]}
    body = {"tasks": [task], "project": "3.1700000000", "params": {"context": ctx}}
    out = client.post("/predict", json=body).json()["results"]
    pred = SamPredictor(sam_v1)
    pred.set_image(image)
    masks, scores, _ = pred.predict(np.array([[40.0, 48.0]]), np.array([1]), multimask_output=True)
    (region,) = out[0]["result"]
    assert region["value"]["brushlabels"] == ["star"]
    assert region["value"]["rle"] == label_studio_rle(masks[int(np.argmax(scores))])
    assert region["score"] == pytest.approx(float(scores.max()), abs=1e-6)
    backend = client.app.state.backend
    session = backend.store.sessions()[0]
    ctx["result"].append(rectangle(10, 20, 40, 50))
    out2 = client.post("/predict", json=body).json()["results"]
    assert out2[0]["result"][0]["value"]["brushlabels"] == ["ring"]
    assert backend.store.sessions() == [session]  # embedded once
    # no context: SAM v1 has nothing to answer
    body["params"] = {}
    assert client.post("/predict", json=body).json() == {"results": []}
    assert client.post("/webhook", json={"action": "ANNOTATION_CREATED"}).json()["status"] == "ok"


def test_errors_in_process(sam_v1):
    client = TestClient(create_label_studio_app(sam_v1))
    assert_error(
        client.post("/setup", json={"project": "1.1", "schema": "<View/>"}),
        400,
        "invalid_label_config",
        "<Image>",
    )
    task = {"id": 1, "data": {"picture": "x"}}
    body = {"tasks": [task], "label_config": CONFIG}
    assert_error(client.post("/predict", json=body), 400, "invalid_task", "data.image")
    body["tasks"] = [{"id": 1, "data": {"image": "/data/upload/1/a.png"}}]
    assert_error(client.post("/predict", json=body), 400, "no_label_studio_url", "/setup")
    body["tasks"] = [{"id": 1, "data": {"image": "s3://bucket/a.png"}}]
    assert_error(client.post("/predict", json=body), 400, "unsupported_image_url", "s3")
    body["tasks"] = [{"id": 1, "data": {"image": "data:image/png;base64," + "QUJD"}}]
    assert_error(client.post("/predict", json=body), 400, "invalid_image", "not a readable")
    body["tasks"] = [{"id": 2, "data": {"image": data_url(scene())}}]
    body["params"] = {"context": {"result": [textarea("star")]}}
    assert_error(client.post("/predict", json=body), 400, "text_not_supported", "SAM 3")
    body["params"] = {"context": {"result": [keypoint(None, 3)]}}
    assert_error(client.post("/predict", json=body), 400, "invalid_context", "value.x")
    assert_error(
        client.post("/predict", content=b"{", headers={"content-type": "application/json"}),
        400,
        "invalid_json",
        "not JSON",
    )
    assert_error(client.post("/predict", json={"tasks": 3}), 400, "invalid_request", "tasks")


def test_basic_auth(sam_v1):
    client = TestClient(create_label_studio_app(sam_v1, basic_auth=("ls", "s3cret")))
    r = client.get("/health")
    assert_error(r, 401, "unauthorized", "basic")
    assert r.headers["www-authenticate"].startswith("Basic")
    assert client.get("/health", auth=("ls", "wrong")).status_code == 401
    assert client.get("/health", auth=("ls", "s3cret")).json()["status"] == "UP"


def test_cli_refusals(capsys):
    from paddle_sam.cli import main

    assert main(["serve", "--label-studio", "--token", "abc"]) == 2
    assert "--label-studio takes no --token" in capsys.readouterr().err
    env = os.environ.pop("PADDLE_SAM_BASIC_AUTH_PASS", None)
    try:
        assert main(["serve", "--label-studio", "--basic-auth-user", "ls"]) == 2
        assert "PADDLE_SAM_BASIC_AUTH_PASS" in capsys.readouterr().err
    finally:
        if env is not None:
            os.environ["PADDLE_SAM_BASIC_AUTH_PASS"] = env
    assert main(["serve", "--label-studio-url", "http://x"]) == 2
    assert "apply to --label-studio only" in capsys.readouterr().err


# -- against a real Label Studio --------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabelStudio:
    """A Label Studio server on 127.0.0.1 with a throwaway data dir, and its REST API."""

    def __init__(self, data_dir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir),
            # the backend runs on loopback, which Label Studio's SSRF guard refuses (for the ML
            # backend and the webhook it adds at its /webhook): lift the guard for loopback
            # only, everything else it refuses stays refused (docs/serve.md)
            "USE_DEFAULT_BANNED_SUBNETS": "false",
            "USER_ADDITIONAL_BANNED_SUBNETS": ",".join(BANNED_BUT_LOOPBACK),
            "SENTRY_DSN": "",
            "FRONTEND_SENTRY_DSN": "",
        }
        cmd = [
            str(LS_BIN / "label-studio"),
            "start",
            "--no-browser",
            "--internal-host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--data-dir",
            str(data_dir),
            "--username",
            "test@example.com",
            "--password",
            "paddle-sam-test",
            "--user-token",
            LS_TOKEN,
            "--enable-legacy-api-token",
        ]
        self.log = open(data_dir / "label-studio.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait(self, timeout: float = 400.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"label-studio exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(2)
        raise RuntimeError(f"label-studio did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

    def api(self, method: str, path: str, body=None, files=None) -> object:
        headers = {"Authorization": f"Token {LS_TOKEN}"}
        data = None
        if files is not None:
            boundary = "paddlesamboundary"
            name, content = files
            data = (
                (
                    f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                    f'filename="{name}"\r\nContent-Type: image/png\r\n\r\n'
                ).encode()
                + content
                + f"\r\n--{boundary}--\r\n".encode()
            )
            headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path}: {exc.code} {exc.read()[:2000]!r}") from None


@pytest.fixture(scope="module")
def label_studio(tmp_path_factory):
    if not (LS_BIN / "label-studio").is_file():
        missing(f"Label Studio not installed at {LS_BIN} (make label-studio; make test does)")
    data = tmp_path_factory.mktemp("label-studio")
    ls = LabelStudio(data)
    try:
        ls.wait()
        yield ls
    finally:
        ls.stop()
        shutil.rmtree(data, ignore_errors=True)


def ls_decode(results: list[dict]) -> list[np.ndarray]:
    """Brush results decoded by Label Studio's own decoder (label_studio_sdk, in its venv)."""
    script = (
        "import json, sys, numpy as np\n"
        "from label_studio_sdk.converter.brush import decode_rle\n"
        "out = []\n"
        "for r in json.load(sys.stdin):\n"
        "    h, w = r['original_height'], r['original_width']\n"
        "    a = decode_rle(r['value']['rle']).reshape(h, w, 4)\n"
        "    assert all((a[..., c] == a[..., 3]).all() for c in range(3))\n"
        "    out.append((a[..., 3] > 127).astype(int).ravel().tolist())\n"
        "json.dump(out, sys.stdout)\n"
    )
    run = subprocess.run(
        [str(LS_BIN / "python"), "-c", script],
        input=json.dumps(results),
        capture_output=True,
        text=True,
        check=True,
    )
    return [
        np.asarray(flat, dtype=bool).reshape(r["original_height"], r["original_width"])
        for flat, r in zip(json.loads(run.stdout), results, strict=True)
    ]


def new_project(
    ls: LabelStudio, backend_url: str, image: np.ndarray, auth: tuple[str, str] | None = None
) -> tuple[int, int, int]:
    """A project with CONFIG, one uploaded image task and the backend connected (with basic
    authentication when ``auth``): (project id, task id, ML backend id)."""
    project = ls.api("POST", "/api/projects", {"title": "paddle-sam test", "label_config": CONFIG})
    pid = project["id"]
    ls.api("POST", f"/api/projects/{pid}/import", files=("scene.png", png_bytes(image)))
    tasks = ls.api("GET", f"/api/tasks?project={pid}")["tasks"]
    (task,) = tasks
    assert task["data"]["image"].startswith("/data/upload/")
    backend = {"url": backend_url, "project": pid, "is_interactive": True, "title": "paddle-sam"}
    if auth is not None:
        backend.update(auth_method="BASIC_AUTH", basic_auth_user=auth[0], basic_auth_pass=auth[1])
    ml = ls.api("POST", "/api/ml", backend)
    assert ml["readable_state"] == "Connected", ml
    return pid, task["id"], ml["id"]


class BackendProcess:
    """``paddle-sam serve --label-studio`` as a user starts it: a process on a free port."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "paddle_sam", "serve", "--label-studio", *args]
        cmd += ["--port", str(self.port), "--log-level", "warning"]
        self.proc = subprocess.Popen(
            cmd,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def __enter__(self) -> BackendProcess:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stdout.read()
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
            except urllib.error.HTTPError:
                return self  # answering (401: it wants its password)
            except OSError:
                time.sleep(0.2)
                continue
            return self
        raise AssertionError("paddle-sam serve --label-studio did not start")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_clicks_through_label_studio(label_studio):
    """The command line's backend (the bundled default model, basic authentication) connected
    to Label Studio: keypoints and a box sent through Label Studio's interactive annotation;
    its own decoder turns our brush results into the masks the predictor returns."""
    from paddle_sam.loading.sam_v1 import load_sam

    image = scene()
    auth = ("label-studio", "paddle-sam-backend-pass")
    args = ["--checkpoint", str(DEFAULT_MODEL), "--basic-auth-user", auth[0]]
    with BackendProcess(args, {"PADDLE_SAM_BASIC_AUTH_PASS": auth[1]}) as backend:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(backend.url + "/health", timeout=10)
        pid, task, ml = new_project(label_studio, backend.url, image, auth)
        ml_info = label_studio.api("GET", f"/api/ml/{ml}")
        assert ml_info["model_version"].startswith("paddle-sam-")
        pred = SamPredictor(load_sam(DEFAULT_MODEL))
        pred.set_image(image)
        cases = [
            ([keypoint(25, 50)], dict(point_coords=[[40.0, 48.0]], point_labels=[1]), True),
            (
                [keypoint(25, 50), keypoint(75, 75, positive=False), rectangle(10, 20, 50, 50)],
                dict(
                    point_coords=[[40.0, 48.0], [120.0, 72.0]],
                    point_labels=[1, 0],
                    box=[16.0, 19.2, 96.0, 67.2],
                ),
                False,
            ),
        ]
        for context, prompt, multimask in cases:
            answer = label_studio.api(
                "POST",
                f"/api/ml/{ml}/interactive-annotating",
                {"task": task, "context": {"result": context}},
            )
            (region,) = answer["data"]["result"]
            assert region["type"] == "brushlabels" and region["from_name"] == "tag"
            assert region["value"]["brushlabels"] == [context[-1]["value"][context[-1]["type"]][0]]
            (got,) = ls_decode([region])
            kwargs = {k: np.asarray(v, dtype=np.float64) for k, v in prompt.items()}
            masks, scores, _ = pred.predict(**kwargs, multimask_output=multimask)
            want = masks[int(np.argmax(scores))]
            assert got.shape == image.shape[:2]
            assert want.any() and (got == want).all()
            assert region["score"] == pytest.approx(float(scores.max()), abs=1e-5)


@pytest.fixture(scope="module")
def sam3_predictor():
    from paddle_sam.predict.sam3.predictor import Sam3Predictor

    model = tiny_sam3_model(0)
    threshold = sam3_threshold(model, scene(), text="star", keep=3)
    return Sam3Predictor(model, confidence_threshold=threshold)


def test_sam3_text_through_label_studio(label_studio, sam3_predictor):
    """SAM 3: Label Studio's "retrieve predictions" pre-labels the task with every brush label
    as a concept, and a TextArea prompt asks for one; each instance is a brush region that Label
    Studio's decoder turns into the mask of our predictor's answer, in its order."""
    image = scene()
    sam3_predictor.set_image(image)
    want = {t: sam3_predictor.ground(t) for t in ("star", "ring")}
    assert len(want["star"].masks) == 3
    with ThreadedServer(create_label_studio_app(sam3_predictor)) as backend:
        pid, task, ml = new_project(label_studio, backend.url, image)
        done = label_studio.api(
            "POST",
            f"/api/dm/actions?id=retrieve_tasks_predictions&project={pid}",
            {"selectedItems": {"all": True, "excluded": []}},
        )
        assert "1 predictions" in done.get("detail", ""), done
        (prediction,) = label_studio.api("GET", f"/api/predictions?task={task}")
        assert prediction["model_version"].startswith("paddle-sam-")
        regions = prediction["result"]
        n_star, n_ring = len(want["star"].masks), len(want["ring"].masks)
        assert [r["value"]["brushlabels"][0] for r in regions] == ["star"] * n_star + [
            "ring"
        ] * n_ring
        got = ls_decode(regions)
        expected = list(want["star"].masks) + list(want["ring"].masks)
        for g, w in zip(got, expected, strict=True):
            assert (g == w).all()
        scores = [r["score"] for r in regions]
        assert scores == pytest.approx(
            list(want["star"].scores) + list(want["ring"].scores), abs=1e-6
        )
        answer = label_studio.api(
            "POST",
            f"/api/ml/{ml}/interactive-annotating",
            {"task": task, "context": {"result": [textarea("Star")]}},
        )
        regions = answer["data"]["result"]
        assert [r["value"]["brushlabels"] for r in regions] == [["star"]] * n_star
        for g, w in zip(ls_decode(regions), want["star"].masks, strict=True):
            assert (g == w).all()


# -- video: SAM 2 tracks a VideoRectangle --------------------------------------------------

VIDEO_CONFIG = """<View>
  <Labels name="videoLabels" toName="video">
    <Label value="square" background="#ff0000"/>
  </Labels>
  <Video name="video" value="$video" framerate="10"/>
  <VideoRectangle name="box" toName="video" smart="true"/>
</View>"""

VIDEO_FRAMES, VIDEO_H, VIDEO_W = 8, 90, 120


def video_region(keyframes: list[tuple[int, list[float]]], region_id: str = "sq1") -> dict:
    """A ``videorectangle`` region as Label Studio's editor sends it: keyframes (frame from
    1, box in percent), the label chosen."""
    sequence = [
        {"frame": f, "enabled": True, "rotation": 0, "x": x, "y": y, "width": w, "height": h,
         "time": (f - 1) / 10}
        for f, (x, y, w, h) in keyframes
    ]  # fmt: skip
    return {
        "id": region_id,
        "type": "videorectangle",
        "from_name": "box",
        "to_name": "video",
        "origin": "manual",
        "value": {"sequence": sequence, "labels": ["square"], "framesCount": 8, "duration": 0.8},
    }


def test_video_config_and_tracks():
    c = parse_label_config(VIDEO_CONFIG)
    assert (c.video, c.image, c.image_key, c.brush, c.labels, c.framerate) == (
        True, "video", "video", "box", ["square"], 10.0
    )  # fmt: skip
    assert parse_label_config(VIDEO_CONFIG.replace(' framerate="10"', "")).framerate == 24.0
    with pytest.raises(ValueError, match="frameRate is not a number"):
        parse_label_config(VIDEO_CONFIG.replace('"10"', '"fast"'))
    camel = parse_label_config(VIDEO_CONFIG.replace('framerate="10"', 'frameRate="$fps"'))
    assert (camel.framerate_key, camel.framerate) == ("fps", 24.0)  # each task's data.fps
    with pytest.raises(ValueError, match="no <Image>"):
        parse_label_config('<View><Video name="v" value="$v"/></View>')
    region = video_region([(1, [10, 20, 30, 40]), (4, [20, 20, 30, 40])])
    region["value"]["sequence"].append({"frame": 6, "enabled": False, "x": 1, "y": 1,
                                        "width": 1, "height": 1})  # fmt: skip
    (track,) = parse_tracks({"result": [region, keypoint(1, 2)]})
    assert track.keyframes == [(1, [10, 20, 30, 40]), (4, [20, 20, 30, 40])]
    bad = video_region([(0, [10, 20, 30, 40])])
    with pytest.raises(ValueError, match=r"sequence\[0\]\.frame must be a frame number from 1"):
        parse_tracks({"result": [bad]})
    with pytest.raises(ValueError, match="empty box"):
        parse_tracks({"result": [video_region([(2, [10, 20, 0, 40])])]})
    many = [video_region([(1, [1, 1, 2, 2])], f"r{i}") for i in range(17)]
    with pytest.raises(ValueError, match="17 video regions to track, at most 16"):
        parse_tracks({"result": many})


@pytest.fixture(scope="module")
def sam2_ckpt(tmp_path_factory) -> Path:
    """A reduced SAM 2.1 (random weights, tests/helpers/sam2_ref.py), converted."""
    pytest.importorskip("torch")  # written as the official .pt first
    from tests.helpers.sam2_ref import reduced_checkpoint

    return reduced_checkpoint(tmp_path_factory.mktemp("ls_sam2"))[1]


@pytest.fixture(scope="module")
def sam2_video(sam2_ckpt):
    from paddle_sam.loading.sam2 import build_sam2_video_predictor
    from tests.helpers.sam2_ref import reduced_spec

    return build_sam2_video_predictor(reduced_spec("2.1"), sam2_ckpt)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    from tests.helpers.video import scene, write_mp4

    folder = tmp_path_factory.mktemp("ls_clip")
    return write_mp4(scene(VIDEO_FRAMES, VIDEO_H, VIDEO_W), folder / "shapes.mp4", fps=10.0)


# the red square on frame 0 (tests/helpers/video.py): x 12-39, y 22-49 of 120 x 90
SQUARE_PX = [12.0, 22.5, 39.0, 49.5]
SQUARE_PCT = [100 * 12 / 120, 100 * 22.5 / 90, 100 * 27 / 120, 100 * 27 / 90]


def reference_track(sam2_video, clip: Path, box_px, start: int, frames: int) -> dict[int, list]:
    """SAM2VideoPredictor itself: the box on frame ``start``, tracked forward ``frames``
    frames; each frame's mask box in percent (None where the mask is empty)."""
    state = sam2_video.init_state(str(clip))
    sam2_video.add_new_points_or_box(state, start, 1, box=np.asarray(box_px))
    out = {}
    for f, _, logits in sam2_video.propagate_in_video(
        state, start_frame_idx=start, max_frame_num_to_track=frames
    ):
        m = logits.numpy()[0, 0] > 0
        if not m.any():
            out[f] = None
            continue
        ys, xs = np.nonzero(m)
        h, w = m.shape
        out[f] = [
            100 * xs.min() / w,
            100 * ys.min() / h,
            100 * (xs.max() + 1 - xs.min()) / w,
            100 * (ys.max() + 1 - ys.min()) / h,
        ]
    return out


def check_tracked(result: dict, want: dict[int, list], keyframes: list[int]) -> None:
    """A returned videorectangle region: the keyframes as sent, then a box per tracked frame
    (Label Studio's frame numbers: index + 1) equal to the reference's."""
    assert result["type"] == "videorectangle" and result["from_name"] == "box"
    assert result["to_name"] == "video" and result["value"]["labels"] == ["square"]
    seq = result["value"]["sequence"]
    assert [k["frame"] for k in seq] == sorted(k["frame"] for k in seq)
    tracked = {k["frame"]: k for k in seq if k["frame"] not in keyframes}
    assert sorted(tracked) == [f + 1 for f in sorted(want) if f + 1 not in keyframes]
    for f, box in want.items():
        if f + 1 in keyframes:
            continue
        k = tracked[f + 1]
        assert k["enabled"] is (box is not None)
        if box is not None:
            got = [k["x"], k["y"], k["width"], k["height"]]
            assert got == pytest.approx(box, abs=1e-4), f  # float32 boxes
            assert k["time"] == pytest.approx(f / 10)


def test_video_tracking_in_process(sam2_video, clip):
    """/predict with a video task (a data: URL): one keyframe box on frame 1 tracked to the
    end by SAM 2; two keyframes and a tracking limit; refusals."""
    from paddle_sam.serve.app import create_label_studio_app as create

    client = TestClient(create(sam2_video, max_track_frames=4))
    assert client.post("/setup", json={"project": "5.1", "schema": VIDEO_CONFIG}).status_code == 200
    url = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    task = {"id": 9, "data": {"video": url}}
    body = {"tasks": [task], "project": "5.1", "params": {}}
    assert client.post("/predict", json=body).json() == {"results": []}  # nothing drawn

    body["params"] = {"context": {"result": [video_region([(1, SQUARE_PCT)])]}}
    r = client.post("/predict", json=body)
    assert r.status_code == 200, r.text
    (answer,) = r.json()["results"]
    (region,) = answer["result"]
    assert region["id"] == "sq1" and region["value"]["sequence"][0]["frame"] == 1
    want = reference_track(sam2_video, clip, SQUARE_PX, 0, 4)
    assert any(b is not None for b in want.values())
    check_tracked(region, want, [1])
    # frames 2-5 tracked: 4 past the keyframe, the limit
    assert max(k["frame"] for k in region["value"]["sequence"]) == 5
    assert 0 < region["score"] <= 1 and answer["model_version"].startswith("paddle-sam-")

    # two keyframes (1 and 5): tracking starts at the last one; the first is also a prompt
    moved = [SQUARE_PCT[0] + 100 * 20 / 120, *SQUARE_PCT[1:]]
    body["params"] = {"context": {"result": [video_region([(1, SQUARE_PCT), (5, moved)])]}}
    (region,) = client.post("/predict", json=body).json()["results"][0]["result"]
    frames = [k["frame"] for k in region["value"]["sequence"]]
    assert frames == [1, 5, 6, 7, 8]
    assert region["value"]["sequence"][1]["x"] == pytest.approx(moved[0])

    # frameRate="$fps": each task's own; frame numbers at 5 fps are every other frame at 10
    schema = VIDEO_CONFIG.replace('framerate="10"', 'frameRate="$fps"')
    client.post("/setup", json={"project": "7.1", "schema": schema})
    slow = {"tasks": [{"id": 9, "data": {"video": url, "fps": 5}}], "project": "7.1"}
    slow["params"] = {"context": {"result": [video_region([(1, SQUARE_PCT), (3, moved)])]}}
    (region,) = client.post("/predict", json=slow).json()["results"][0]["result"]
    sequence = region["value"]["sequence"]
    # keyframe 3 is the file's frame 4; its frames 5, 6, 7 are Label Studio's 3 (the keyframe's
    # own, kept as sent), 4 and 5
    assert [k["frame"] for k in sequence] == [1, 3, 4, 5]
    assert sequence[2]["time"] == pytest.approx(3 / 5)
    slow["tasks"][0]["data"]["fps"] = "fast"
    assert_error(client.post("/predict", json=slow), 400, "invalid_task", "data.fps")

    late = {"context": {"result": [video_region([(12, SQUARE_PCT)])]}}
    r = client.post("/predict", json={**body, "params": late})
    assert_error(r, 400, "invalid_context", "keyframe 12 is past the video's end")
    backend = client.app.state.backend
    assert len(backend.store.sessions()) == 1  # the video opened once for every request

    # a backend without a video model says what it needs
    client = TestClient(create_label_studio_app(tiny_model(0)))
    body["project"] = "6.1"
    client.post("/setup", json={"project": "6.1", "schema": VIDEO_CONFIG})
    body["params"] = {"context": {"result": [video_region([(1, SQUARE_PCT)])]}}
    assert_error(client.post("/predict", json=body), 400, "video_not_supported", "SAM 2")


def test_video_tracking_through_label_studio(label_studio, sam2_video, clip):
    """A real Label Studio with a video project (Video + VideoRectangle): the MP4 imported as a
    task, the backend connected, a keyframe box on frame 1 sent through Label Studio's
    interactive annotation; the answer's region is SAM 2's track (each frame's box that of
    the reference predictor's mask), and Label Studio takes it as a prediction of the task."""
    backend_app = create_label_studio_app(sam2_video, max_track_frames=VIDEO_FRAMES - 1)
    with ThreadedServer(backend_app) as backend:
        project = label_studio.api(
            "POST", "/api/projects", {"title": "paddle-sam video", "label_config": VIDEO_CONFIG}
        )
        pid = project["id"]
        label_studio.api(
            "POST", f"/api/projects/{pid}/import", files=(clip.name, clip.read_bytes())
        )
        (task,) = label_studio.api("GET", f"/api/tasks?project={pid}")["tasks"]
        assert task["data"]["video"].startswith("/data/upload/"), task["data"]
        ml = label_studio.api(
            "POST",
            "/api/ml",
            {"url": backend.url, "project": pid, "is_interactive": True, "title": "paddle-sam"},
        )
        assert ml["readable_state"] == "Connected", ml
        context = {"result": [video_region([(1, SQUARE_PCT)])]}
        answer = label_studio.api(
            "POST",
            f"/api/ml/{ml['id']}/interactive-annotating",
            {"task": task["id"], "context": context},
        )
        assert "errors" not in answer, answer
        (region,) = answer["data"]["result"]
        want = reference_track(sam2_video, clip, SQUARE_PX, 0, VIDEO_FRAMES - 1)
        check_tracked(region, want, [1])
        assert [k["frame"] for k in region["value"]["sequence"]] == list(range(1, 9))
        # Label Studio stores it as the task's prediction, as it came
        label_studio.api(
            "POST",
            "/api/predictions",
            {
                "task": task["id"],
                "result": answer["data"]["result"],
                "score": answer["data"]["score"],
                "model_version": answer["data"]["model_version"],
            },
        )
        (prediction,) = label_studio.api("GET", f"/api/predictions?task={task['id']}")
        assert prediction["result"][0]["value"]["sequence"] == region["value"]["sequence"]


def test_cli_backend_tracks_with_sam2(sam2_ckpt, monkeypatch):
    """``paddle-sam serve --label-studio --checkpoint sam2.1.pdparams``: the backend has SAM 2's
    video predictor, the video limits and --max-track-frames."""
    import uvicorn

    from paddle_sam.cli import main

    started: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: started.update(app=app))
    argv = ["serve", "--label-studio", "--checkpoint", str(sam2_ckpt), "--port", "0"]
    assert main([*argv, "--max-track-frames", "3", "--max-video-frames", "20"]) == 0
    backend = started["app"].state.backend
    assert backend.videos is not None and backend.videos.takes_text is False
    assert backend.max_track_frames == 3 and backend.videos.limits.max_frames == 20
    assert main(["serve", "--max-track-frames", "3", "--port", "0"]) == 2
