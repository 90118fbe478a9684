"""``paddle-sam label --engine ray`` on a real local Ray cluster started here: a head node and a
second node joining it on 127.0.0.1, one CPU each, stopped afterwards. The file equals the
local engine's; an actor killed mid-job is restarted by Ray, its shard retried, nothing lost or
written twice."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("ray.data")
psutil = pytest.importorskip("psutil")

from paddle_sam.label import LabelSpec, label  # noqa: E402

OPTIONS = dict(points_per_side=4, pred_iou_thresh=0.0, stability_score_thresh=0.0)
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RAY, *args], capture_output=True, text=True, timeout=300)


# a throwaway cluster on the loopback address: no token authentication between its nodes
# (Ray 2.60 turns it on for `ray start --head` and the joining node lacks the token)
AUTH = "RAY_AUTH_MODE"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``ray start --head`` plus a second node with its own CPU, both on 127.0.0.1."""
    if not Path(RAY).exists():
        pytest.skip("the ray command is not installed next to this Python")
    port = _free_port()
    saved = os.environ.get(AUTH)
    os.environ[AUTH] = "disabled"  # for the ray commands, this driver and its workers
    common = ["--num-cpus=1", "--disable-usage-stats"]
    head = _ray(
        "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
        "--include-dashboard=false", *common,
    )  # fmt: skip
    assert head.returncode == 0, head.stdout + head.stderr
    try:
        node = _ray("start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", *common)
        assert node.returncode == 0, node.stdout + node.stderr
        yield f"127.0.0.1:{port}"
    finally:
        _ray("stop", "--force")
        if saved is None:
            os.environ.pop(AUTH, None)
        else:
            os.environ[AUTH] = saved


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ray_src")
    rng = np.random.default_rng(1)
    for i in range(6):
        img = (rng.random((40 + 4 * i, 60, 3)) * 50).astype(np.uint8)
        img[8:30, 5 + 2 * i : 40] = rng.integers(120, 255, 3)
        Image.fromarray(img).save(root / f"img{i}.png")
    (root / "broken.png").write_bytes(b"nope")
    return root


def _same(a: dict, b: dict) -> None:
    """The same COCO file up to float rounding of the scores (threads may differ)."""
    assert a["images"] == b["images"] and a["categories"] == b["categories"]
    assert len(a["annotations"]) == len(b["annotations"]) > 0
    for x, y in zip(a["annotations"], b["annotations"], strict=True):
        assert {k: v for k, v in x.items() if k not in ("score", "predicted_iou")} == {
            k: v for k, v in y.items() if k not in ("score", "predicted_iou")
        }
        assert x["score"] == pytest.approx(y["score"], abs=1e-5)


def test_ray_engine_on_two_nodes(cluster, images, tmp_path):
    import ray

    spec = LabelSpec(mode="everything", everything=OPTIONS)
    local = label(images, tmp_path / "local", spec, shard_size=2, num_workers=1)
    ray.init(address=cluster, log_to_driver=False)
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        assert len(nodes) == 2 and all(n["Resources"].get("CPU") == 1.0 for n in nodes)
        report = label(images, tmp_path / "ray", spec, engine="ray", num_workers=2, shard_size=2)
    finally:
        ray.shutdown()
    assert (report["labelled"], report["skipped"]) == (6, 1)
    assert (local["labelled"], local["skipped"]) == (6, 1)
    _same(
        json.loads((tmp_path / "ray" / "annotations.json").read_text()),
        json.loads((tmp_path / "local" / "annotations.json").read_text()),
    )


def _actor_pids() -> list[int]:
    pids = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "ShardLabeler" in cmd and "MapWorker" in cmd:
            pids.append(p.pid)
    return pids


def test_killed_actor_is_retried(cluster, images, tmp_path):
    """SIGKILL one labelling actor once the first shard is written: the job still completes,
    and its file equals an undisturbed run's (no shard lost or counted twice)."""
    spec = LabelSpec(mode="everything", everything=OPTIONS)
    src = tmp_path / "src"
    shutil.copytree(images, src)
    for i in range(6, 14):  # more shards, so the kill lands mid-job
        shutil.copy(images / f"img{i % 6}.png", src / f"img{i}.png")
    ref = label(src, tmp_path / "ref", spec, shard_size=1, num_workers=1)
    out = tmp_path / "killed"
    result: dict = {}

    def run() -> None:
        try:
            result["report"] = label(
                src, out, spec, engine="ray", num_workers=2, shard_size=1, ray_address=cluster
            )
        except BaseException as exc:  # reported below
            result["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    killed = None
    deadline = time.monotonic() + 300
    while worker.is_alive() and time.monotonic() < deadline:
        if list((out / "shards").glob("shard-*.json")) and _actor_pids():
            killed = _actor_pids()[0]
            os.kill(killed, signal.SIGKILL)
            break
        time.sleep(0.05)
    worker.join(timeout=600)
    assert not worker.is_alive(), "the Ray job did not finish"
    assert "error" not in result, result.get("error")
    if killed is None:
        pytest.skip("the job finished before an actor could be killed")
    assert not psutil.pid_exists(killed) or psutil.Process(killed).status() == "zombie"
    assert result["report"]["labelled"] == ref["labelled"] == 14
    _same(
        json.loads((out / "annotations.json").read_text()),
        json.loads((tmp_path / "ref" / "annotations.json").read_text()),
    )
