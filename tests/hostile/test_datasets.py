"""Hostile datasets for ``train``, ``eval`` and ``label``, through the real CLI: every dataset
reader goes through the package's one image decoder (``predict.io``: its format allow-list and
its pixel limit, checked from the header before any pixel is decoded), and a COCO
``file_name`` never reaches outside its image folder.

- An EPS file named ``evil.png``: Pillow's plain opener would hand it to Ghostscript. A spy
  ``gs`` first on ``PATH`` writes a marker file if anything runs it; each command runs in a
  fresh process (Pillow remembers whether it found ``gs``).
- A 13000 x 13000 PNG of 1-bit pixels, a few kB on disk (the issue's 13000 x 13000 image cost
  8.6 GB in one training step): above ``MAX_IMAGE_PIXELS`` (100 M) and below Pillow's own
  decompression-bomb error (179 M), so only our limit stops it. The command runs under a
  wrapper process that reports the command's peak memory (``ru_maxrss`` of its children).
- ``file_name`` absolute, with ``..`` or through a symlink out of the image folder: refused
  with the same message whether or not a file exists there.

A dataset holding only the bad image fails the command (exit 2) with a last stderr line
``paddle-sam COMMAND: error: ...`` naming the file and why; ``label`` skips it and lists it
(its documented behaviour for unreadable images).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from paddle_sam import cli
from paddle_sam.predict.io import MAX_IMAGE_PIXELS
from tests.helpers.specs import tiny_sam3_spec, tiny_train_spec

ROOT = Path(__file__).resolve().parents[2]
SIDE = 13_000  # 169 M pixels: over our limit, under Pillow's DecompressionBombError (2 x 89 M)
PEAK_LIMIT_KB = 1024 * 1024  # 1 GB, as ru_maxrss counts on Linux (kB)
SQUARE = [[10, 10, 30, 10, 30, 30, 10, 30]]
EXPECTED = {
    "eps": r"evil\.png: EPS/PostScript images are not read",
    "huge": rf"evil\.png: {SIDE}x{SIDE} pixels is above the limit of {MAX_IMAGE_PIXELS} pixels",
}


# -------------------------------------------------------------------- the hostile files


def write_huge_png(path: Path, side: int = SIDE) -> None:
    """A valid ``side`` x ``side`` 1-bit grayscale PNG of zeros, compressed row by row (never
    held whole in memory: 21 MB of rows become a few kB)."""
    row = b"\x00" + bytes((side + 7) // 8)  # filter byte "none", then the packed bits
    z = zlib.compressobj(9)
    data = b"".join(z.compress(row) for _ in range(side)) + z.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1 bit, grayscale
    body = chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


def write_payload(path: Path, payload: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if payload == "eps":  # Pillow writes EPS without Ghostscript
        Image.fromarray(np.zeros((40, 50, 3), np.uint8)).save(path, format="EPS")
        assert path.read_bytes().startswith(b"%!PS")
    else:
        write_huge_png(path)
        assert path.stat().st_size < 100_000
        with Image.open(path) as im:  # the header says so; nothing decoded here
            assert im.size == (SIDE, SIDE) and im.mode == "1"


def good_png(path: Path, w: int = 50, h: int = 40) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)


# -------------------------------------------------------------------- datasets and commands


def coco_doc(file_name: str, sizes: bool = True) -> dict:
    image = {"id": 1, "file_name": file_name}
    if sizes:
        image |= {"width": 50, "height": 40}
    ann = {"id": 1, "image_id": 1, "category_id": 1, "segmentation": SQUARE}
    ann |= {"bbox": [10, 10, 20, 20], "area": 400, "iscrowd": 0}
    return {"images": [image], "annotations": [ann], "categories": [{"id": 1, "name": "square"}]}


def write_coco(root: Path, file_name: str = "evil.png", sizes: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    path = root / "annotations.json"
    path.write_text(json.dumps(coco_doc(file_name, sizes)))
    return path


def sam_v1_config(tmp: Path, data: dict) -> Path:
    cfg = {
        "model": {"type": "vit_tiny_synthetic", "spec": tiny_train_spec()},
        "data": {"train": data, "masks_per_image": 3, "hflip": False},
        "train": {"steps": 2, "batch_size": 1, "log_every": 1, "checkpoint_every": 2},
        "run": {"output_dir": str(tmp / "run")},
    }
    path = tmp / "sam_v1.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def sam3_config(tmp: Path, ann: Path) -> Path:
    cfg = {
        "family": "sam3",
        "model": {"spec": json.loads(json.dumps(tiny_sam3_spec().to_dict()))},
        "data": {"train": {"format": "coco", "path": str(ann)}, "max_negatives": 2},
        "optim": {"lr": 1e-3, "warmup_steps": 1, "timescale": 2, "cooldown_steps": 1},
        "train": {"steps": 2, "log_every": 1, "checkpoint_every": 2, "seed": 3},
        "run": {"output_dir": str(tmp / "run")},
    }
    path = tmp / "sam3.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def reader_case(reader: str, tmp: Path, payload: str) -> list[str]:
    """Write a dataset whose one image (or mask) is ``evil.png`` holding ``payload``; return
    the command line that reads it."""
    ds = tmp / "ds"
    if reader == "train-coco":
        write_payload(ds / "images" / "evil.png", payload)
        return ["train", str(sam_v1_config(tmp, {"format": "coco", "path": str(write_coco(ds))}))]
    if reader == "train-sa1b":
        write_payload(ds / "evil.png", payload)
        doc = {"image": {"file_name": "evil.png"}, "annotations": [{"segmentation": SQUARE}]}
        (ds / "evil.json").write_text(json.dumps(doc))
        return ["train", str(sam_v1_config(tmp, {"format": "sa1b", "path": str(ds)}))]
    if reader == "train-folder-mask":  # a good image, its one instance mask the bad file
        good_png(ds / "images" / "ok.png")
        write_payload(ds / "masks" / "ok" / "evil.png", payload)
        return ["train", str(sam_v1_config(tmp, {"format": "folder", "path": str(ds)}))]
    if reader == "train-sam3":  # width and height given: read when a sample is drawn
        write_payload(ds / "images" / "evil.png", payload)
        return ["train", str(sam3_config(tmp, write_coco(ds)))]
    if reader == "train-sam3-nosize":  # no width / height: the header is read while parsing
        write_payload(ds / "images" / "evil.png", payload)
        return ["train", str(sam3_config(tmp, write_coco(ds, sizes=False)))]
    if reader == "eval-coco":
        write_payload(ds / "images" / "evil.png", payload)
        return ["eval", "--format", "coco", "--data", str(write_coco(ds))]
    if reader == "eval-sam3":
        write_payload(ds / "images" / "evil.png", payload)
        return ["eval", "--model-type", "sam3", "--format", "coco", "--data", str(write_coco(ds))]
    if reader == "label":
        write_payload(ds / "images" / "evil.png", payload)
        ann = write_coco(ds)
        ann.write_text(json.dumps(coco_doc("images/evil.png")))  # relative to the JSON's folder
        return ["label", str(ann), "--everything", "-o", str(tmp / "labels")]
    raise AssertionError(reader)


READERS = [
    "train-coco",
    "train-sa1b",
    "train-folder-mask",
    "train-sam3",
    "train-sam3-nosize",
    "eval-coco",
    "eval-sam3",
    "label",
]

# runs the command as its child and reports the child's peak resident memory
WRAPPER = """
import json, resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr, "peak_kb": peak}))
"""


def run_cli(argv: list[str], tmp: Path) -> dict:
    """``python -m paddle_sam --threads 1 ARGV --quiet`` in a fresh process, a spy ``gs`` first on
    PATH; its exit code, output and peak memory."""
    spy = tmp / "spy"
    spy.mkdir()
    gs = spy / "gs"
    gs.write_text(f"#!/bin/sh\ntouch '{tmp / 'GHOSTSCRIPT_RAN'}'\nexit 1\n")
    gs.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{spy}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "paddle_sam", "--threads", "1"]
    p = subprocess.run(
        [*cmd, *argv, "--quiet"], capture_output=True, text=True, env=env, cwd=tmp, timeout=600
    )
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    result["gs_ran"] = (tmp / "GHOSTSCRIPT_RAN").exists()
    return result


@pytest.mark.parametrize("payload", ["eps", "huge"])
@pytest.mark.parametrize("reader", READERS)
def test_dataset_image_refused_by_the_decoder(reader, payload, tmp_path):
    argv = reader_case(reader, tmp_path, payload)
    r = run_cli(argv, tmp_path)
    command = argv[0]
    assert not r["gs_ran"], "Ghostscript ran"
    assert "Traceback" not in r["err"], r["err"]
    assert r["peak_kb"] < PEAK_LIMIT_KB, f"peak memory {r['peak_kb'] / 1024:.0f} MB"
    if command == "label":  # label skips unreadable images and lists each with the reason
        assert r["rc"] == 0, r["err"]
        assert "0 images labelled, 1 skipped" in r["out"], r["out"]
        skipped = [line for line in r["out"].splitlines() if "skipped images/evil.png:" in line]
        assert len(skipped) == 1 and re.search(EXPECTED[payload], skipped[0]), r["out"]
        report = json.loads((tmp_path / "labels" / "report.json").read_text())
        assert [s["file_name"] for s in report["skipped_images"]] == ["images/evil.png"]
        return
    assert r["rc"] == 2, (r["rc"], r["err"])
    last = r["err"].splitlines()[-1]
    assert last.startswith(f"paddle-sam {command}: error: "), r["err"]
    assert re.search(EXPECTED[payload], last), last


# -------------------------------------------------------------------- file names out of the root


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = cli.main([*argv, "--quiet"])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def escape_case(kind: str, tmp: Path) -> tuple[str, Path]:
    """(the ``file_name``, the file outside the image folder it points to). The image folder is
    ``tmp/ds/images``; the outside file is ``tmp/outside/secret.png``."""
    outside = tmp / "outside" / "secret.png"
    outside.parent.mkdir(parents=True)
    images = tmp / "ds" / "images"
    images.mkdir(parents=True)
    if kind == "absolute":
        return str(outside), outside
    if kind == "dotdot":
        return "../../outside/secret.png", outside
    if kind == "dotdot-inside":  # down and back up: still refused (no '..' at all)
        good_png(images / "sub" / "ok.png")
        return "sub/../../../outside/secret.png", outside
    if kind == "symlink-dir":  # a folder inside the root that is a symlink out of it
        (images / "link").symlink_to(outside.parent, target_is_directory=True)
        return "link/secret.png", outside
    if kind == "symlink-file":
        (images / "secret.png").symlink_to(outside)
        return "secret.png", outside
    raise AssertionError(kind)


ESCAPES = ["absolute", "dotdot", "dotdot-inside", "symlink-dir", "symlink-file"]


def escape_argv(command: str, tmp: Path, file_name: str) -> list[str]:
    ds = tmp / "ds"
    if command == "label":
        ann = ds / "annotations.json"
        ann.write_text(json.dumps(coco_doc(file_name)))
        root = ["--image-root", str(ds / "images")]
        return ["label", str(ann), *root, "--everything", "-o", str(tmp / "labels")]
    ann = write_coco(ds, file_name)
    if command == "train-coco":  # --overwrite: the first of the two runs made the run folder
        config = sam_v1_config(tmp, {"format": "coco", "path": str(ann)})
        return ["train", str(config), "--overwrite"]
    if command == "train-sam3":
        return ["train", str(sam3_config(tmp, ann)), "--overwrite"]
    if command == "eval-coco":
        return ["eval", "--format", "coco", "--data", str(ann)]
    if command == "eval-sam3":
        return ["eval", "--model-type", "sam3", "--format", "coco", "--data", str(ann)]
    raise AssertionError(command)


@pytest.mark.parametrize("kind", ESCAPES)
@pytest.mark.parametrize("command", ["label", "train-coco", "train-sam3", "eval-coco", "eval-sam3"])
def test_file_name_outside_the_image_folder(command, kind, tmp_path, capsys):
    """Refused with exit 2, the file_name named, and the very same stderr whether the file
    outside exists (a readable image) or not: a dataset cannot probe the disk."""
    file_name, outside = escape_case(kind, tmp_path)
    argv = escape_argv(command, tmp_path, file_name)
    errors = []
    for exists in (True, False):
        if exists:
            good_png(outside)
        else:
            outside.unlink()
        code, err = run(argv, capsys)
        assert code == 2, err
        assert "Traceback" not in err
        errors.append(err)
    assert errors[0] == errors[1]
    last = errors[0].splitlines()[-1]
    assert last.startswith(f"paddle-sam {argv[0]}: error: "), errors[0]
    assert f"file_name {file_name!r} is not a file name inside the image folder" in last, last
    assert not (tmp_path / "labels" / "annotations.json").exists()


def test_symlink_inside_the_image_folder_is_read(tmp_path, capsys):
    """Symlinks that stay inside the image folder are followed, and the folder itself may be a
    symlink: only a way out is refused."""
    real = tmp_path / "real_images"
    good_png(real / "a.png")
    (real / "b.png").symlink_to(real / "a.png")
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "images").symlink_to(real, target_is_directory=True)
    ann = ds / "annotations.json"
    doc = coco_doc("b.png")
    ann.write_text(json.dumps(doc))
    code, err = run(["eval", "--format", "coco", "--data", str(ann)], capsys)
    assert code == 0, err
