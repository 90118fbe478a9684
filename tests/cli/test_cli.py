"""The ``paddle-sam`` command line: convert, segment, everything, random-checkpoint, and the
one-line errors (exit status 2, no traceback) for everything a user can get wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddle_sam import cli
from paddle_sam.convert.checkpoint import convert_checkpoint
from paddle_sam.convert.core import CheckpointFormatError, read_sidecar, sidecar_path
from paddle_sam.convert.sam_v1 import random_official_state_dict
from paddle_sam.predict import io as sam_io
from tests.helpers.specs import TINY

# pycocotools 2.0.x's decode trips a numpy 2 deprecation inside the library; not ours to fix.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

H, W = 60, 90  # the test image; prompts below lie inside it
COMMANDS = {
    "convert",
    "segment",
    "everything",
    "track",
    "align",
    "random-checkpoint",
    "export",
    "serve",
    "train",
    "eval",
    "synth",
    "label",
    "download",
}


def run(argv: list[str]) -> int:
    """``cli.main`` in-process; argparse's own errors (SystemExit) become the exit code."""
    try:
        return cli.main([str(a) for a in argv])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def seg(image, out, ckpt, *options) -> list:
    return ["segment", image, "--checkpoint", ckpt, "-o", out, *options]


def everything(image, out, ckpt, *options) -> list:
    return ["everything", image, "--checkpoint", ckpt, "-o", out, "--quiet", *options]


def assert_user_error(capsys, argv: list[str], *needles: str) -> str:
    """Exit status 2, exactly one error line naming the problem, no traceback (argparse's
    own errors too: one line, no usage block)."""
    code = run(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    line = errors[0]
    command = next(str(a) for a in argv if str(a) in COMMANDS)
    assert line.startswith(f"paddle-sam {command}: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def official(work) -> Path:
    from safetensors.numpy import save_file

    path = work / "tiny_official.safetensors"
    save_file(random_official_state_dict(TINY, seed=0), str(path))
    return path


@pytest.fixture(scope="module")
def tiny_ckpt(official, work) -> Path:
    """A converted tiny checkpoint; its sidecar carries the spec, so no --model-type."""
    dst = work / "tiny.pdparams"
    convert_checkpoint(official, dst, spec=TINY, progress=False)
    return dst


def _test_image() -> np.ndarray:
    yy, xx = np.mgrid[0:H, 0:W]
    img = np.zeros((H, W, 3), np.uint8)
    img[..., 0] = (xx * 255 // W).astype(np.uint8)
    img[..., 1] = (yy * 255 // H).astype(np.uint8)
    img[15:45, 20:60] = (250, 240, 30)  # a bright rectangle
    return img


@pytest.fixture(scope="module")
def image_png(work) -> Path:
    path = work / "image.png"
    Image.fromarray(_test_image()).save(path)
    return path


def _read_mask(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.mode == "L"
        return np.asarray(im)


def _check_mask(path: Path, h: int = H, w: int = W) -> np.ndarray:
    m = _read_mask(path)
    assert m.shape == (h, w)
    assert set(np.unique(m).tolist()) <= {0, 255}
    return m


# ---------------------------------------------------------------------------- convert


def test_convert_command_custom_size_needs_spec(official, work, capsys):
    dst = work / "cli_convert.pdparams"
    # official is a custom size: no standard type fits, and the message says what to do
    line = assert_user_error(capsys, ["convert", official, dst, "--quiet"], "SamSpec")
    assert "embed dim 64" in line
    assert not dst.exists()


def test_convert_command_writes_pdparams_and_sidecar(official, work, capsys, monkeypatch):
    from paddle_sam.models.sam_v1.build_sam import SAM_SPECS

    monkeypatch.setitem(SAM_SPECS, "vit_b", TINY)  # the tiny file then "is" a vit_b
    dst = work / "cli_vit_b.pdparams"
    assert run(["convert", official, dst, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "vit_b" in out and str(dst) in out
    assert read_sidecar(dst)["model_type"] == "vit_b"
    # again: refused without --overwrite, file untouched; accepted with it
    before = dst.read_bytes()
    assert_user_error(capsys, ["convert", official, dst, "--quiet"], "exists", "--overwrite")
    assert dst.read_bytes() == before
    assert run(["convert", official, dst, "--quiet", "--overwrite"]) == 0
    # --model-type contradicting the weights
    dst2 = work / "cli_vit_l.pdparams"
    assert_user_error(
        capsys, ["convert", official, dst2, "--model-type", "vit_l", "--quiet"], "vit_l", "vit_b"
    )
    assert not dst2.exists()


def test_convert_command_errors(official, work, capsys, tmp_path):
    assert_user_error(
        capsys, ["convert", tmp_path / "none.pth", tmp_path / "o.pdparams"], "not found", "none.pth"
    )
    assert_user_error(capsys, ["convert", official, tmp_path / "o.pth"], ".pdparams")
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"")
    assert_user_error(capsys, ["convert", bad, tmp_path / "o.pdparams"], "bad.pth", "empty")
    assert_user_error(
        capsys,
        ["convert", official, tmp_path / "o.pdparams", "--model-type", "vit_x"],
        "--model-type",
        "vit_x",
    )
    assert not list(tmp_path.glob("*.pdparams*"))


# ---------------------------------------------------------------------------- segment


def test_segment_point(tiny_ckpt, image_png, work, capsys):
    out = work / "seg_point"
    assert run(seg(image_png, out, tiny_ckpt, "--point", "40,30")) == 0
    assert "mask.png" in capsys.readouterr().out
    mask = _check_mask(out / "mask.png")
    with Image.open(out / "overlay.png") as im:
        assert im.size == (W, H) and im.mode == "RGB"
    result = json.loads((out / "result.json").read_text())
    assert result["multimask_output"] is True  # default for a single point
    assert len(result["scores"]) == 3
    assert result["best"] == int(np.argmax(result["scores"]))
    assert result["prompts"] == {"points": [[40.0, 30.0, 1.0]], "box": None}
    assert result["mask_area"] == int((mask == 255).sum())
    best = _check_mask(out / f"mask_{result['best']}.png")
    np.testing.assert_array_equal(best, mask)


def test_segment_box_and_negative_point(tiny_ckpt, image_png, work):
    out = work / "seg_box"
    assert run(seg(image_png, out, tiny_ckpt, "--box", "20,15,60,45")) == 0
    _check_mask(out / "mask.png")
    result = json.loads((out / "result.json").read_text())
    assert len(result["scores"]) == 1 and result["best"] == 0
    assert result["prompts"] == {"points": [], "box": [20.0, 15.0, 60.0, 45.0]}
    assert not (out / "mask_0.png").exists()

    out = work / "seg_neg"
    assert run(seg(image_png, out, tiny_ckpt, "--point", "10,10,0", "--box", "20,15,60,45")) == 0
    _check_mask(out / "mask.png")
    result = json.loads((out / "result.json").read_text())
    assert result["prompts"]["points"] == [[10.0, 10.0, 0.0]]
    assert result["prompts"]["box"] == [20.0, 15.0, 60.0, 45.0]
    assert len(result["scores"]) == 1


def test_segment_multimask(tiny_ckpt, image_png, work):
    out = work / "seg_multi"
    points = ["--point", "40,30", "--point", "70,50,0"]
    assert run(seg(image_png, out, tiny_ckpt, *points, "--multimask")) == 0
    result = json.loads((out / "result.json").read_text())
    assert len(result["scores"]) == 3
    for i in range(3):
        _check_mask(out / f"mask_{i}.png")
    # the same folder again: refused, then replaced with --overwrite
    before = (out / "mask.png").read_bytes()
    assert run(seg(image_png, out, tiny_ckpt, "--point", "40,30", "--multimask")) == 2
    assert (out / "mask.png").read_bytes() == before
    assert (
        run(seg(image_png, out, tiny_ckpt, "--point", "40,30", "--single-mask", "--overwrite")) == 0
    )
    assert len(json.loads((out / "result.json").read_text())["scores"]) == 1
    # the replaced run's extra masks are gone with it (the record of what paddle-sam wrote stays)
    names = ["logits.npy", "mask.png", "overlay.png", "result.json"]
    assert sorted(p.name for p in out.iterdir()) == [".paddle-sam.json", *names]


# ---------------------------------------------------------------------------- everything


def coco_of(path: Path):
    """The COCO file at ``path`` read by pycocotools (which fails on a malformed one)."""
    import contextlib
    import io

    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(path))


def assert_bbox_is_the_masks(ann: dict) -> None:
    """COCO's bbox is its segmentation's box: pycocotools' toBbox of the RLE, which encloses
    every pixel of the mask."""
    from pycocotools import mask as mask_utils

    rle = {"size": ann["segmentation"]["size"], "counts": ann["segmentation"]["counts"].encode()}
    np.testing.assert_allclose(ann["bbox"], mask_utils.toBbox(rle), err_msg=str(ann["bbox"]))
    m = mask_utils.decode(rle).astype(bool)
    x, y, w, h = ann["bbox"]
    assert m.any() and not m.sum() - m[int(y) : int(y + h), int(x) : int(x + w)].sum()


def test_everything(tiny_ckpt, image_png, work, capsys):
    from pycocotools import mask as mask_utils

    out = work / "everything"
    thresholds = ["--pred-iou-thresh", "0", "--stability-score-thresh", "0"]
    assert run(everything(image_png, out, tiny_ckpt, "--points-per-side", "4", *thresholds)) == 0
    assert "annotations.json" in capsys.readouterr().out
    doc = json.loads((out / "annotations.json").read_text())
    assert [(i["id"], i["height"], i["width"]) for i in doc["images"]] == [(1, H, W)]
    assert doc["categories"] == [{"id": 1, "name": "object", "supercategory": "object"}]
    anns = doc["annotations"]
    assert len(anns) > 0
    coco = coco_of(out / "annotations.json")  # a real COCO file: pycocotools reads it
    pngs = sorted((out / "masks").glob("*.png"))
    assert [p.name for p in pngs] == [f"{i:04d}.png" for i in range(len(anns))]
    for i, ann in enumerate(anns):
        assert (ann["id"], ann["image_id"], ann["category_id"]) == (i + 1, 1, 1)
        rle = ann["segmentation"]
        assert rle["size"] == [H, W]
        decoded = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()})
        np.testing.assert_array_equal(coco.annToMask(ann), decoded)
        written = _check_mask(pngs[i])
        np.testing.assert_array_equal(decoded.astype(bool), written == 255)
        assert ann["area"] == int(decoded.sum())
        assert_bbox_is_the_masks(ann)
        assert len(ann["point_coords"]) == 1
    with Image.open(out / "overlay.png") as im:
        assert im.size == (W, H)
    # existing outputs are protected
    before = (out / "annotations.json").read_bytes()
    again = everything(image_png, out, tiny_ckpt, "--points-per-side", "4")
    assert_user_error(capsys, again, "--overwrite")
    assert (out / "annotations.json").read_bytes() == before
    # --overwrite with default thresholds: no mask file of the old run outlives it
    (out / "masks" / "9999.png").write_bytes(b"stale")
    assert run(everything(image_png, out, tiny_ckpt, "--points-per-side", "2", "--overwrite")) == 0
    n = len(json.loads((out / "annotations.json").read_text())["annotations"])
    assert sorted(p.name for p in (out / "masks").iterdir()) == [f"{i:04d}.png" for i in range(n)]


def test_everything_on_an_export(tiny_ckpt, image_png, work, capsys):
    """``everything --exported DIR`` (Paddle Inference) writes what --checkpoint writes."""
    export_dir = work / "everything_export"
    assert run(["export", "--checkpoint", tiny_ckpt, "-o", export_dir]) == 0
    thresholds = ["--pred-iou-thresh", "0", "--stability-score-thresh", "0"]
    docs = []
    for name, source in (
        ("ckpt", ["--checkpoint", tiny_ckpt]),
        ("pir", ["--exported", export_dir]),
    ):
        out = work / f"everything_{name}"
        argv = ["everything", image_png, *source, "-o", out, "--quiet", "--points-per-side", "4"]
        assert run([*argv, *thresholds]) == 0
        docs.append(json.loads((out / "annotations.json").read_text())["annotations"])
    dynamic, static = docs
    assert len(static) == len(dynamic) > 0
    for a, b in zip(static, dynamic, strict=True):
        assert a["point_coords"] == b["point_coords"]
        assert abs(a["predicted_iou"] - b["predicted_iou"]) < 1e-4
        assert abs(a["area"] - b["area"]) <= 1 + 1e-3 * b["area"]
    capsys.readouterr()
    # both sources, or a folder that is not a SAM v1 Paddle Inference export: one-line errors
    both = ["everything", image_png, "-o", work / "x", "--checkpoint", tiny_ckpt]
    assert_user_error(capsys, [*both, "--exported", export_dir], "--checkpoint or --exported")
    assert_user_error(
        capsys, ["everything", image_png, "-o", work / "x", "--exported", work / "nope"], "nope"
    )
    # --precision bf16: for an export only, and only on CPUs with avx512_bf16 or AMX
    from paddle_sam._runtime import bf16_refusal

    bf16 = ["--precision", "bf16", "--quiet", "--points-per-side", "2"]
    assert_user_error(capsys, [*both, *bf16], "--exported")
    exported = ["everything", image_png, "--exported", export_dir, "-o", work / "everything_bf16"]
    if bf16_refusal() is not None:
        assert_user_error(capsys, [*exported, *bf16], "avx512_bf16 or AMX")
        assert not (work / "everything_bf16").exists()
    else:
        assert run([*exported, *bf16]) == 0


def test_everything_argument_errors(tiny_ckpt, image_png, tmp_path, capsys):
    out = tmp_path / "o"
    assert_user_error(
        capsys,
        everything(image_png, out, tiny_ckpt, "--points-per-side", "0"),
        "--points-per-side",
        "[1, 128]",
    )
    assert_user_error(
        capsys,
        everything(image_png, out, tiny_ckpt, "--points-per-side", "four"),
        "--points-per-side",
    )
    # no --checkpoint: only the bundled default model can be used
    # (tests/train/test_default_model.py)
    assert_user_error(
        capsys, ["everything", image_png, "-o", out, "--model-type", "vit_b"], "--checkpoint"
    )
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- random-checkpoint


def test_random_checkpoint_argument_errors(work, capsys, tmp_path):
    assert_user_error(capsys, ["random-checkpoint", "-o", tmp_path / "r.pth"], ".safetensors")
    existing = tmp_path / "r.safetensors"
    existing.write_bytes(b"keep")
    assert_user_error(capsys, ["random-checkpoint", "-o", existing], "exists", "--overwrite")
    assert existing.read_bytes() == b"keep"
    assert_user_error(
        capsys,
        ["random-checkpoint", "--model-type", "vit_q", "-o", tmp_path / "q.safetensors"],
        "vit_q",
    )
    assert_user_error(
        capsys, ["random-checkpoint", "--seed", "x", "-o", tmp_path / "q.safetensors"], "--seed"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.safetensors"]


def test_random_checkpoint_command_output_converts(work, capsys, monkeypatch):
    """The command's file (vit_b swapped for the tiny size) is accepted by convert."""
    from paddle_sam.models.sam_v1.build_sam import SAM_SPECS

    monkeypatch.setitem(SAM_SPECS, "vit_b", TINY)
    src, dst = work / "random.safetensors", work / "random.pdparams"
    assert run(["random-checkpoint", "--seed", "4", "-o", src]) == 0
    assert "NOT a trained model" in capsys.readouterr().out
    assert run(["convert", src, dst, "--quiet"]) == 0
    assert read_sidecar(dst)["source"]["layout"] == "official"


# ---------------------------------------------------------------------------- user errors


def test_segment_prompt_errors(tiny_ckpt, image_png, tmp_path, capsys, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("prompts must be checked before the model is loaded")

    monkeypatch.setattr(cli.segment, "image_predictor", no_model)
    base = seg(image_png, tmp_path / "o", tiny_ckpt)
    assert_user_error(capsys, base, "--point", "--box")  # no prompt at all
    assert_user_error(capsys, base + ["--point", "1,2,3,4"], "--point", "1,2,3,4")
    assert_user_error(capsys, base + ["--point", "1,x"], "--point", "1,x")
    assert_user_error(capsys, base + ["--point", "10,10,5"], "label", "10,10,5")
    assert_user_error(capsys, base + ["--point", "500,10"], "outside", "500")
    assert_user_error(capsys, base + ["--point", "10,-3"], "outside")
    assert_user_error(capsys, base + ["--box", "50,10,20,40"], "box", "x0")
    assert_user_error(capsys, base + ["--box", "10,10,200,40"], "box", "outside")
    assert_user_error(capsys, base + ["--box", "1,2,3"], "--box", "1,2,3")
    assert_user_error(capsys, base + ["--point", "5,5", "--box", "0,0,10,80"], "box", "outside")
    assert_user_error(capsys, ["--threads", "0"] + base + ["--point", "5,5"], "threads")
    assert not (tmp_path / "o").exists()


def test_segment_file_errors(tiny_ckpt, image_png, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"

    def point(image, ckpt=tiny_ckpt):
        return seg(image, out, ckpt, "--point", "5,5")

    assert_user_error(capsys, point(tmp_path / "missing.png"), "not found", "missing.png")
    text = tmp_path / "x.png"
    text.write_text("not an image\n")
    assert_user_error(capsys, point(text), "x.png", "not a readable image")
    truncated = tmp_path / "trunc.png"
    data = image_png.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    assert_user_error(capsys, point(truncated), "trunc.png", "truncated")
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    assert_user_error(capsys, point(empty), "empty.png")
    monkeypatch.setattr(sam_io, "MAX_IMAGE_PIXELS", 1000)
    assert_user_error(capsys, point(image_png), f"{W}x{H}", "limit", "1000")
    monkeypatch.undo()
    # missing checkpoint / checkpoint errors (only the bundled default model needs none)
    args = ["segment", image_png, "--point", "5,5", "--model-type", "vit_b", "-o", out]
    assert_user_error(capsys, args, "--checkpoint")
    missing = tmp_path / "no.pdparams"
    assert_user_error(capsys, point(image_png, missing), "not found", "no.pdparams")
    bare = tmp_path / "bare.pdparams"
    bare.write_bytes(tiny_ckpt.read_bytes())
    assert not sidecar_path(bare).exists()
    assert_user_error(capsys, point(image_png, bare), "bare.pdparams", "sidecar", "model type")
    broken = tmp_path / "broken.pdparams"
    broken.write_bytes(b"garbage")
    sidecar_path(broken).write_text(sidecar_path(tiny_ckpt).read_text())
    assert_user_error(capsys, point(image_png, broken), "broken.pdparams")
    # nothing was written by any of the failures, not even the folder
    assert not out.exists()


def test_existing_output_untouched(tiny_ckpt, image_png, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "overlay.png").write_bytes(b"old overlay")
    (out / "notes.txt").write_text("mine")
    assert_user_error(
        capsys, seg(image_png, out, tiny_ckpt, "--point", "5,5"), "overlay.png", "--overwrite"
    )
    assert (out / "overlay.png").read_bytes() == b"old overlay"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "overlay.png"]


@pytest.mark.parametrize("value", ["0", "0.5", "0.999", "1", "-0.1", "2", "nan", "x"])
def test_confidence_threshold_range_same_in_segment_and_serve(value, capsys):
    """One validator: both commands take [0, 1) (SAM 3 keeps the instances scoring above it)."""
    ok = value in ("0", "0.5", "0.999")
    for argv in (["segment", "image.png", "-o", "out"], ["serve"]):
        argv = [*argv, "--confidence-threshold", value]
        if ok:
            assert cli.build_parser().parse_args(argv).confidence_threshold == float(value)
            continue
        assert run(argv) == 2
        err = capsys.readouterr().err
        assert f"paddle-sam {argv[0]}: error: argument --confidence-threshold: " in err, err
        assert ("[0, 1)" if value != "x" else "expected a number") in err, err


def _convert_raising(monkeypatch, exc: BaseException) -> None:
    from paddle_sam.convert import checkpoint

    def convert_checkpoint(*args, **kwargs):
        raise exc

    monkeypatch.setattr(checkpoint, "convert_checkpoint", convert_checkpoint)


@pytest.mark.parametrize(
    "exc",
    [
        KeyError("spec"),
        TypeError("unsupported operand"),
        AttributeError("no attribute"),
        ImportError("cannot import name 'x'", name="paddle_sam.convert"),
        ModuleNotFoundError("No module named 'paddle_sam.nothing'", name="paddle_sam.nothing"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_programming_errors_propagate(exc, official, tmp_path, monkeypatch):
    """A bug inside a command is not reported as the user's mistake: it keeps its traceback."""
    _convert_raising(monkeypatch, exc)
    with pytest.raises(type(exc)):
        cli.main(["convert", str(official), str(tmp_path / "o.pdparams"), "--quiet"])


@pytest.mark.parametrize(
    "exc",
    [
        PermissionError("permission denied: out.pdparams"),
        IsADirectoryError("is a folder: out.pdparams"),
        NotADirectoryError("not a folder: out.pdparams"),
        FileExistsError("exists: out.pdparams"),
        ValueError("bad value: out.pdparams"),
        ModuleNotFoundError("No module named 'yaml'", name="yaml"),
        ImportError("needs paddle2onnx: pip install 'paddle-sam[onnx]' (out.pdparams)"),
        CheckpointFormatError("src.pth: damaged"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_user_errors_are_one_line(exc, official, tmp_path, monkeypatch, capsys):
    _convert_raising(monkeypatch, exc)
    line = assert_user_error(capsys, ["convert", official, tmp_path / "o.pdparams"])
    assert line == f"paddle-sam convert: error: {exc}"


def test_damaged_sidecar_spec_is_a_user_error(tiny_ckpt, image_png, tmp_path, capsys):
    """A sidecar whose spec misses a field or holds text for a size names the file."""
    side = json.loads(sidecar_path(tiny_ckpt).read_text())
    for i, (spec, needle) in enumerate(
        [
            (
                {k: v for k, v in side["spec"].items() if k != "encoder_depth"},
                "missing SamSpec fields: ['encoder_depth']",
            ),
            ({**side["spec"], "encoder_depth": "deep"}, "bad SamSpec values"),
        ]
    ):
        ckpt = tmp_path / f"damaged{i}.pdparams"
        ckpt.write_bytes(tiny_ckpt.read_bytes())
        sidecar_path(ckpt).write_text(json.dumps({**side, "spec": spec}))
        argv = seg(image_png, tmp_path / "o", ckpt, "--point", "5,5")
        assert_user_error(capsys, argv, f"sidecar {sidecar_path(ckpt)}: ", needle)
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- image modes


def _segment_ok(ckpt: Path, image: Path, out: Path, point: str = "20,20") -> dict:
    assert run(seg(image, out, ckpt, "--point", point)) == 0
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "I;16"])
def test_image_modes(tiny_ckpt, work, mode, capsys):
    rgb = _test_image()
    if mode == "L":
        im = Image.fromarray(rgb).convert("L")
    elif mode == "P":
        im = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    elif mode == "RGBA":
        im = Image.fromarray(np.dstack([rgb, np.full((H, W), 128, np.uint8)]))
    else:
        im = Image.fromarray(rgb[..., 0].astype(np.uint16) * 257)
    path = work / f"mode_{mode.replace(';', '')}.png"
    im.save(path)
    with Image.open(path) as check:  # the file really is in that mode
        assert check.mode in ({"I;16", "I"} if mode == "I;16" else {mode})
    out = work / f"out_{mode.replace(';', '')}"
    expect = {"RGBA": "alpha channel dropped", "I;16": "image scaled to 8 bits"}.get(mode)
    capsys.readouterr()
    _segment_ok(tiny_ckpt, path, out)
    notes = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    if expect:  # the conversion is said once, on one line
        assert len(notes) == 1, notes
        assert notes[0].startswith(f"paddle-sam segment: warning: {path}: "), notes
        assert expect in notes[0], notes
    else:
        assert notes == []
    _check_mask(out / "mask.png")


def test_pixel_limit_is_ours_not_pils(work, monkeypatch):
    """PIL's decompression-bomb warning threshold does not refuse images under our limit."""
    path = work / "limit.png"
    Image.fromarray(_test_image()).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", (H * W) // 2 + 1)  # warns, no error
    assert sam_io.load_image(path).shape == (H, W, 3)
    with pytest.raises(ValueError, match=f"{W}x{H} pixels is above the limit of 100"):
        sam_io.load_image(path, max_pixels=100)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # PIL's own hard error: still a ValueError
    with pytest.raises(ValueError, match="limit.png.*too large"):
        sam_io.load_image(path)


def test_16bit_scaled_not_clipped(work):
    """A 16-bit image keeps its contrast after scaling (not saturated to white)."""
    ramp = (np.arange(W, dtype=np.uint16) * (65535 // (W - 1)))[None].repeat(H, 0)
    path = work / "ramp16.png"
    Image.fromarray(ramp).save(path)
    with pytest.warns(UserWarning, match="8 bits"):
        arr = sam_io.load_image(path)
    assert arr.shape == (H, W, 3) and arr.dtype == np.uint8
    assert arr[0, 0, 0] == 0 and arr[0, -1, 0] == 255
    assert 100 < arr[0, W // 2, 0] < 160


def test_exif_orientation_rotates(tiny_ckpt, work):
    path = work / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(_test_image()).save(path, exif=exif.tobytes(), quality=95)
    with Image.open(path) as im:
        assert im.size == (W, H)  # stored landscape
    out = work / "out_rotated"
    _segment_ok(tiny_ckpt, path, out, point="30,70")  # y = 70 is only inside the rotated image
    _check_mask(out / "mask.png", h=W, w=H)  # displayed portrait
    with Image.open(out / "overlay.png") as im:
        assert im.size == (H, W)


# ---------------------------------------------------------------------------- entry points


def test_python_dash_m_help():
    proc = subprocess.run(
        [sys.executable, "-m", "paddle_sam", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("convert", "segment", "everything", "align", "random-checkpoint"):
        assert command in proc.stdout


def test_console_script_user_error(tmp_path):
    script = Path(sys.executable).parent / "paddle-sam"
    if not script.exists():
        pytest.skip(f"console script {script} not installed (pip install -e .)")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [str(script), "convert", str(tmp_path / "missing.pth"), str(tmp_path / "out.pdparams")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("paddle-sam convert: error: ") and "missing.pth" in lines[0]
