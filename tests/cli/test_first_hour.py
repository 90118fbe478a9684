"""A new user's first commands with the bundled models only: nothing comes back empty without
saying why, a phrase the bundled SAM 3 does not know is named with its vocabulary, and every
COCO row's bbox is its mask's box."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddle_sam.loading import BUNDLED_GENERATOR, sniff, vocabulary
from paddle_sam.loading.sam3 import DEFAULT_SAM3_MODEL
from paddle_sam.train.example import EXAMPLE
from tests.cli.test_cli import assert_bbox_is_the_masks, coco_of, run

pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    """A photo-like image (smooth colour fields, noise, an edge), not a synthetic scene."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:240, 0:320] / 240.0
    img = np.stack([120 + 80 * x, 90 + 60 * y, 140 - 50 * x * y], axis=-1)
    img[100:200, 150:260] = (200, 60, 50)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("photo") / "photo.jpg"
    Image.fromarray(img).save(path, quality=90)
    return path


def test_everything_on_the_bundled_model_keeps_masks_and_says_why(tmp_path, capsys):
    """No flags: the bundled model's filters are used, said so, and masks come back."""
    out = tmp_path / "all"
    assert run(["everything", EXAMPLE, "-o", out, "--quiet"]) == 0
    std = capsys.readouterr()
    assert "no --checkpoint given" in std.err
    shown = [f"--{k.replace('_', '-')} {v}" for k, v in BUNDLED_GENERATOR.items()]
    assert all(s in std.err for s in shown), std.err
    doc = json.loads((out / "annotations.json").read_text())
    assert len(doc["annotations"]) > 10
    assert doc["info"]["generator"]["pred_iou_thresh"] == BUNDLED_GENERATOR["pred_iou_thresh"]
    coco_of(out / "annotations.json")
    for ann in doc["annotations"]:
        assert_bbox_is_the_masks(ann)


def test_everything_says_which_filter_dropped_every_mask(photo, tmp_path, capsys):
    out = tmp_path / "none"
    argv = ["everything", photo, "-o", out, "--quiet", "--pred-iou-thresh", "0.999"]
    assert run(argv) == 0
    err = capsys.readouterr().err
    assert "0 masks" not in err and "no mask kept:" in err
    assert "--pred-iou-thresh 0.999" in err and "lower it" in err
    # a user's own threshold is not replaced by the bundled model's
    assert f"--pred-iou-thresh {BUNDLED_GENERATOR['pred_iou_thresh']}" not in err
    assert json.loads((out / "annotations.json").read_text())["annotations"] == []

    out = tmp_path / "unstable"
    argv = ["everything", photo, "-o", out, "--quiet", "--pred-iou-thresh", "0"]
    assert run([*argv, "--stability-score-thresh", "1.0"]) == 0
    err = capsys.readouterr().err
    assert "no mask kept:" in err and "--stability-score-thresh 1.0" in err


def test_text_outside_the_bundled_vocabulary_is_named(photo, tmp_path, capsys):
    words = vocabulary(sniff(DEFAULT_SAM3_MODEL, "sam3"))
    assert len(words) == 30 and "red star" in words and "ring" in words
    out = tmp_path / "dog"
    assert run(["segment", photo, "--text", "a dog", "-o", out]) == 0
    err = capsys.readouterr().err
    assert "'a dog' is not in the vocabulary of sam3_tiny_concepts.pdparams" in err
    assert "30 phrases" in err and "red star" in err and "paddle-sam download sam3" in err
    # a known phrase: no such note
    assert run(["segment", EXAMPLE, "--text", "star", "-o", tmp_path / "star"]) == 0
    assert "not in the vocabulary" not in capsys.readouterr().err


def test_label_text_names_unknown_phrases_and_writes_enclosing_boxes(photo, tmp_path, capsys):
    data = tmp_path / "photos"
    data.mkdir()
    (data / "a.jpg").write_bytes(photo.read_bytes())
    (data / "b.png").write_bytes(EXAMPLE.read_bytes())
    out = tmp_path / "labels"
    argv = ["label", data, "-o", out, "--text", "star", "--text", "a dog", "--num-workers", "1"]
    assert run([*argv, "--confidence-threshold", "0.05"]) == 0
    std = capsys.readouterr()
    assert "'a dog' is not in the vocabulary" in std.err and "'star'" not in std.err
    assert "from an earlier run" not in std.out  # a fresh job says nothing of resuming
    coco = coco_of(out / "annotations.json")
    anns = coco.dataset["annotations"]
    assert anns, "the example's stars were not found"
    for ann in anns:
        assert_bbox_is_the_masks(ann)
        assert len(ann["detector_box_xyxy"]) == 4


def test_label_everything_writes_enclosing_boxes(tmp_path, capsys):
    data = tmp_path / "imgs"
    data.mkdir()
    (data / "b.png").write_bytes(EXAMPLE.read_bytes())
    out = tmp_path / "labels"
    assert run(["label", data, "-o", out, "--everything", "--num-workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "no --checkpoint given" in err and "--pred-iou-thresh 0.5" in err
    anns = coco_of(out / "annotations.json").dataset["annotations"]
    assert len(anns) > 10
    for ann in anns:
        assert_bbox_is_the_masks(ann)


# ---------------------------------------------------------------- CLI polish

ROOT = Path(__file__).resolve().parents[2]


def child(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m paddle_sam *argv`` in a process of its own (what a user's console shows)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "paddle_sam", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_version(tmp_path):
    import paddle

    from paddle_sam import __version__

    proc = child("--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"paddle-sam {__version__} (PaddlePaddle {paddle.__version__})"


def test_paddle_logs_only_with_verbose(tmp_path):
    """`export` makes Paddle's core log a glog warning and its Python side warn: hidden by
    default, shown with --verbose; our own lines and the result stay either way."""
    quiet = child("export", "-o", "out/", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert "exported (pir) -> out/ (" in quiet.stdout  # no "out//"
    assert "no --checkpoint given" in quiet.stderr
    assert "eager_utils.cc" not in quiet.stderr and "UserWarning" not in quiet.stderr
    loud = child("--verbose", "export", "-o", "out2", cwd=tmp_path)
    assert loud.returncode == 0, loud.stderr
    assert "eager_utils.cc" in loud.stderr or "UserWarning" in loud.stderr, loud.stderr


def test_a_non_sam_checkpoint_names_what_it_holds(tmp_path, capsys):
    from safetensors.numpy import save_file

    save_file(
        {"conv1.weight": np.zeros((4, 3, 3, 3), np.float32), "fc.bias": np.zeros(2, np.float32)},
        str(tmp_path / "resnet.safetensors"),
    )
    argv = ["convert", tmp_path / "resnet.safetensors", tmp_path / "r.pdparams"]
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert "no SAM v1 key" in err and "no SAM 3 key" in err
    assert "2 tensor(s): 'conv1.weight', 'fc.bias'" in err


def test_sam3_given_to_everything_says_what_to_run(tmp_path, capsys):
    for extra in (["--model-type", "sam3"], ["--checkpoint", DEFAULT_SAM3_MODEL]):
        assert run(["everything", EXAMPLE, "-o", tmp_path / "o", *extra]) == 2
        err = capsys.readouterr().err
        assert "paddle-sam segment IMAGE --text PHRASE" in err and "invalid choice" not in err
        assert not (tmp_path / "o").exists()
