"""``paddle-sam download``: the real command in a child process against a local HTTP server on
127.0.0.1 serving small files (never the internet): a verified download and its conversion,
checksum mismatch, an interrupted transfer resumed (in the same run and by running the command
again), redirects (the token never follows one to another host), a 403 for a gated file.

The official table's files are hundreds of MB, so the runs that must succeed add an entry of
their own to ``WEIGHTS`` (a small file with its sha256) in the child before calling the CLI's
``main``; the runs that must fail use the official entries with ``--url`` pointing here."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from paddle_sam.convert.sam_v1 import random_official_state_dict
from paddle_sam.loading.weights import WEIGHTS
from paddle_sam.models.sam_v1.build_sam import SAM_SPECS

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_secret_token_for_tests"

# the child: add the test's entry (if any), then the real CLI
LAUNCHER = """
import json, sys
from paddle_sam.loading import weights
entry = json.loads(sys.argv[1])
if entry:
    weights.WEIGHTS[entry["name"]] = weights.Weights(**entry)
from paddle_sam.cli import main
sys.exit(main(sys.argv[2:]))
"""


class Server:
    """Routes: path -> (status, headers, body); ``cut`` paths send half their body on a
    request without Range and then close; every request's path and headers are recorded."""

    def __init__(self):
        self.routes: dict[str, tuple[int, dict, bytes]] = {}
        self.cut: set[str] = set()
        self.always_cut: set[str] = set()
        self.seen: list[tuple[str, dict]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.seen.append((self.path, dict(self.headers)))
                if self.path not in server.routes:
                    self.send_error(404)
                    return
                status, headers, body = server.routes[self.path]
                start = 0
                rng = self.headers.get("Range")
                if rng and status == 200:
                    start = int(rng.split("=")[1].split("-")[0])
                    status = 206
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                rest = body[start:]
                self.send_header("Content-Length", str(len(rest)))
                self.end_headers()
                cut = self.path in server.always_cut or (self.path in server.cut and not rng)
                self.wfile.write(rest[: len(rest) // 2] if cut else rest)
                if cut:
                    self.wfile.flush()
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> bytes:
    """A real official-layout SAM checkpoint of the small synthetic size (safetensors)."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.safetensors"
    save_file(random_official_state_dict(SAM_SPECS["vit_tiny_synthetic"], seed=3), str(path))
    return path.read_bytes()


def entry(url: str, body: bytes, **extra) -> dict:
    return dict(
        name="tiny_test",
        family="sam_v1",
        model_type="vit_tiny_synthetic",
        file="sam_tiny_test.safetensors",
        url=url,
        sha256=hashlib.sha256(body).hexdigest(),
        checksum_from="the test",
        **extra,
    )


def run(
    argv: list[str],
    cwd: Path,
    add: dict | None = None,
    env: dict | None = None,
    launcher: str = LAUNCHER,
):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    full_env.pop("HF_TOKEN", None) if "HF_TOKEN" not in (env or {}) else None
    full_env["HF_HOME"] = str(cwd / "hf-home")  # no login file of the machine's user
    proc = subprocess.run(
        [sys.executable, "-c", launcher, json_arg(add), "download", *argv],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


def json_arg(add: dict | None) -> str:
    import json

    return json.dumps(add or {})


def one_line_error(code: int, stderr: str) -> str:
    """Exit 2 and one error line (besides progress and retry notes), no traceback."""
    notes = ("%|", "; resuming from")  # the progress bar and the retries' notes
    lines = [
        line for line in stderr.splitlines() if line.strip() and not any(n in line for n in notes)
    ]
    assert code == 2, stderr
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_list_names_every_official_checkpoint(tmp_path):
    code, out, err = run([], tmp_path)
    assert code == 0, err
    for w in WEIGHTS.values():
        assert w.name in out and w.url in out
    assert len({w.sha256 for w in WEIGHTS.values()}) == len(WEIGHTS)
    assert all(len(w.sha256) == 64 for w in WEIGHTS.values())


def test_unknown_name_lists_the_names(tmp_path):
    line = one_line_error(*run(["sam_vit_q"], tmp_path)[::2])
    assert "unknown checkpoint 'sam_vit_q'" in line and "vit_b" in line and "sam3" in line


def test_downloads_verifies_and_converts(server, tiny_file, tmp_path):
    server.routes["/tiny"] = (200, {}, tiny_file)
    code, out, err = run(
        ["tiny_test", "-o", "models"], tmp_path, entry(server.url("/tiny"), tiny_file)
    )
    assert code == 0, err
    original = tmp_path / "models" / "sam_tiny_test.safetensors"
    assert original.read_bytes() == tiny_file
    converted = tmp_path / "models" / "sam_tiny_test.pdparams"
    assert converted.exists() and (tmp_path / "models" / "sam_tiny_test.pdparams.json").exists()
    assert "sha256 verified" in out and f"--checkpoint {converted.relative_to(tmp_path)}" in out
    assert not list((tmp_path / "models").glob("*.part"))

    # a second run: the converted model is not replaced, the verified original not fetched again
    seen = len(server.seen)
    code, out, err = run(
        ["tiny_test", "-o", "models"], tmp_path, entry(server.url("/tiny"), tiny_file)
    )
    assert code == 2 and "exists; pass --overwrite" in err  # the .pdparams is not replaced
    code, out, err = run(
        ["tiny_test", "-o", "models", "--no-convert"],
        tmp_path,
        entry(server.url("/tiny"), tiny_file),
    )
    assert code == 0 and "already here and verified" in out, err
    assert len(server.seen) == seen  # nothing downloaded again


def test_checksum_mismatch_deletes_the_file(server, tmp_path):
    server.routes["/sam_vit_b_01ec64.pth"] = (200, {}, b"not the official weights" * 1000)
    code, out, err = run(
        ["vit_b", "--url", server.url("/sam_vit_b_01ec64.pth"), "--no-convert"], tmp_path
    )
    line = one_line_error(code, err)
    assert "has sha256" in line and "not the official ec2df627" in line and "deleted" in line
    assert not (tmp_path / "sam_vit_b_01ec64.pth").exists()
    assert not (tmp_path / "sam_vit_b_01ec64.pth.part").exists()


def test_interrupted_transfer_resumes_in_the_same_run(server, tiny_file, tmp_path):
    server.routes["/tiny"] = (200, {}, tiny_file)
    server.cut.add("/tiny")  # the first response stops half-way
    code, out, err = run(
        ["tiny_test", "--no-convert"], tmp_path, entry(server.url("/tiny"), tiny_file)
    )
    assert code == 0, err
    assert "resuming from" in err
    ranges = [h.get("Range") for p, h in server.seen if p == "/tiny"]
    assert ranges[0] is None and ranges[1] == f"bytes={len(tiny_file) // 2}-", ranges
    assert (tmp_path / "sam_tiny_test.safetensors").read_bytes() == tiny_file


def test_interrupted_transfer_resumes_on_the_next_run(server, tiny_file, tmp_path):
    server.routes["/tiny"] = (200, {}, tiny_file)
    server.always_cut.add("/tiny")
    add = entry(server.url("/tiny"), tiny_file)
    line = one_line_error(*run(["tiny_test", "--no-convert"], tmp_path, add)[::2])
    assert "interrupted" in line and "run the same command again to resume" in line
    part = tmp_path / "sam_tiny_test.safetensors.part"
    kept = part.stat().st_size
    assert 0 < kept < len(tiny_file) and tiny_file.startswith(part.read_bytes())
    assert not (tmp_path / "sam_tiny_test.safetensors").exists()

    server.always_cut.clear()
    server.seen.clear()
    code, out, err = run(["tiny_test", "--no-convert"], tmp_path, add)
    assert code == 0, err
    assert server.seen[0][1].get("Range") == f"bytes={kept}-"
    assert (tmp_path / "sam_tiny_test.safetensors").read_bytes() == tiny_file
    assert not part.exists()


def test_redirects_are_followed_and_the_token_stays_home(server, tiny_file, tmp_path):
    """The entry's token host is ``localhost``; its URL redirects twice, the second time to
    127.0.0.1 (another host, as the hub redirects to its storage): the token reaches the first
    host only."""
    server.routes["/tiny"] = (200, {}, tiny_file)
    server.routes["/a"] = (302, {"Location": "/b"}, b"")
    server.routes["/b"] = (307, {"Location": server.url("/tiny")}, b"")
    add = entry(server.url("/a", host="localhost"), tiny_file, token_host="localhost")
    code, out, err = run(["tiny_test", "--no-convert", "--token", TOKEN], tmp_path, add)
    assert code == 0, err
    auth = {p: h.get("Authorization") for p, h in server.seen}
    assert auth == {"/a": f"Bearer {TOKEN}", "/b": f"Bearer {TOKEN}", "/tiny": None}, auth
    assert (tmp_path / "sam_tiny_test.safetensors").read_bytes() == tiny_file


def test_redirect_loop_is_refused(server, tmp_path):
    server.routes["/loop"] = (302, {"Location": "/loop"}, b"")
    line = one_line_error(*run(["vit_b", "--url", server.url("/loop")], tmp_path)[::2])
    assert "more than 5 redirects" in line


def test_gated_403_explains_access_and_the_mirror(server, tmp_path):
    server.routes["/facebook/sam3/sam3.pt"] = (403, {}, b"Access to model is restricted")
    line = one_line_error(
        *run(["sam3", "--url", server.url("/facebook/sam3/sam3.pt")], tmp_path)[::2]
    )
    assert "(403)" in line and "https://huggingface.co/facebook/sam3 is gated" in line
    assert "--token" in line and "paddle-sam download sam3 --mirror" in line


def test_existing_different_file_is_not_replaced(server, tmp_path):
    mine = tmp_path / "sam_vit_b_01ec64.pth"
    mine.write_bytes(b"my own file")
    line = one_line_error(*run(["vit_b", "--url", server.url("/x"), "--no-convert"], tmp_path)[::2])
    assert "exists and is not the official file" in line and "--overwrite" in line
    assert mine.read_bytes() == b"my own file"
    assert server.seen == []


def test_unreachable_host_is_one_line(tmp_path):
    line = one_line_error(*run(["vit_b", "--url", "http://127.0.0.1:9/x"], tmp_path)[::2])
    assert "cannot reach 127.0.0.1:9" in line


# the child for SAM 2: the reduced SAM 2.1 of the tests stands in for the released tiny
SAM2_LAUNCHER = (
    """
from paddle_sam.convert import checkpoint, sam2
from tests.helpers.sam2_ref import reduced_spec
checkpoint.SAM2_SPECS = sam2.SAM2_SPECS = {"sam2.1_hiera_tiny": reduced_spec("2.1")}
"""
    + LAUNCHER
)


def test_sam2_is_downloaded_and_converted(server, tmp_path):
    """``paddle-sam download sam2.1_hiera_tiny``: verified, then converted in the same step
    (the size detected from the weights), ready for the loading layer."""
    pytest.importorskip("torch")
    from paddle_sam.loading import load_image_predictor, sniff
    from tests.helpers.sam2_ref import reduced_checkpoint

    official, _ = reduced_checkpoint(tmp_path, name="sam2.1_hiera_tiny")
    body = official.read_bytes()
    server.routes["/sam2"] = (200, {}, body)
    add = {
        **entry(server.url("/sam2"), body),
        "name": "sam2.1_hiera_tiny",
        "family": "sam2",
        "model_type": "sam2.1_hiera_tiny",
        "file": "sam2.1_hiera_tiny.pt",
    }
    code, out, err = run(
        ["sam2.1_hiera_tiny", "-o", "models"], tmp_path, add, launcher=SAM2_LAUNCHER
    )
    assert code == 0, err
    converted = tmp_path / "models" / "sam2.1_hiera_tiny.pdparams"
    assert "sha256 verified" in out and f"converted -> models/{converted.name}" in out
    assert "sam2.1_hiera_tiny" in out and "reads no" not in out
    source = sniff(converted)
    assert source.family == "sam2" and source.model_type == "sam2.1_hiera_tiny"
    predictor = load_image_predictor(source)
    predictor.set_image(np.zeros((32, 48, 3), np.uint8))
    masks, _, _ = predictor.predict([[10, 10]], [1])
    assert masks.shape == (3, 32, 48)
