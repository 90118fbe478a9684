"""Hostile command lines: each is refused with exit status 2 and exactly one stderr line
naming the problem, before any model is loaded or any work starts.

``CASES`` is one table, a line per case: the command line (split on spaces, then filled in
from the placeholders below) and a regular expression the error line must match. Cases that
name ``{thin}`` (an image too elongated to resize) reach the predictor, the only place that
knows the model's input size: they load a real checkpoint. Every other case runs with every
model loader and every long job (conversion, datasets, evaluation) replaced by one that fails
the test if called.

Placeholders: ``{img}`` a small PNG, ``{eps}`` an EPS file, ``{thin}`` a 1 x 100000 PNG,
``{file}`` a regular file, ``{ro}`` a folder with mode 0o500, ``{tmp}`` an empty folder of the
test, ``{ckpt}`` the bundled default checkpoint, ``{long}`` a 300-byte file name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from paddle_sam import cli
from paddle_sam.loading.sam_v1 import DEFAULT_MODEL

SEG = "segment {img} --point 5,5 --checkpoint {ckpt}"
ALL = "everything {img} --quiet --checkpoint {ckpt} -o {tmp}/out"
FILE_ABOVE = r"output \S+: \S+ is a file, not a folder"
FOLDER_IS_FILE = r"folder \S+ exists and is not a folder"
RANGE01 = r"must be a number in \[0, 1\], got "

CASES: list[tuple[str, str]] = [
    # -- output folders: a file, a path under a file, not writable, a name too long
    (f"{SEG} -o {{file}}", r"output \S+ exists and is not a folder"),
    (f"{SEG} -o {{file}}/out", FILE_ABOVE),
    (f"{SEG} -o {{file}}/a/b/c", FILE_ABOVE),
    (f"{SEG} -o {{ro}}/out", r"output \S+: \S+ is not writable"),
    (f"{SEG} -o {{ro}}", r"output \S+: \S+ is not writable"),
    (f"{SEG} -o {{tmp}}/{{long}}", r"the name x+\.\.\. is longer than 255 bytes"),
    ("everything {img} --quiet -o {file}/out", FILE_ABOVE),
    ("export --checkpoint {ckpt} -o {file}/exp", FILE_ABOVE),
    ("export --checkpoint {ckpt} -o {ro}/exp", r"is not writable"),
    ("convert {img} {file}/x.pdparams --quiet", FOLDER_IS_FILE),
    ("convert {img} {ro}/x.pdparams --quiet", r"is not writable"),
    ("convert {img} {tmp} --quiet", r"output \S+ is a folder; give a .pdparams file name"),
    ("eval --format synthetic --num-images 1 --json {file}/r.json", FOLDER_IS_FILE),
    ("eval --format synthetic --num-images 1 --json {ro}/r.json", r"is not writable"),
    ("eval --format synthetic --num-images 1 --json {tmp}", r"\S+ is a folder, not a file"),
    ("synth {file}/ds", FILE_ABOVE),
    ("synth {ro}/ds", r"is not writable"),
    ("random-checkpoint -o {file}/r.safetensors", FOLDER_IS_FILE),
    # -- floats: NaN, infinities, out of range (the option and the range named)
    (f"{ALL} --pred-iou-thresh nan", r"argument --pred-iou-thresh: " + RANGE01 + "nan"),
    (f"{ALL} --pred-iou-thresh inf", r"argument --pred-iou-thresh: " + RANGE01 + "inf"),
    (f"{ALL} --pred-iou-thresh 1.5", r"argument --pred-iou-thresh: " + RANGE01 + "1.5"),
    (f"{ALL} --stability-score-thresh -0.1", r"argument --stability-score-thresh: " + RANGE01),
    (f"{ALL} --stability-score-thresh NaN", r"argument --stability-score-thresh: " + RANGE01),
    (f"{ALL} --box-nms-thresh 2", r"argument --box-nms-thresh: " + RANGE01 + "2"),
    (f"{ALL} --box-nms-thresh=-inf", r"argument --box-nms-thresh: " + RANGE01 + "-inf"),
    (f"{ALL} --pred-iou-thresh x", r"argument --pred-iou-thresh: expected a number, got 'x'"),
    (f"{SEG} -o {{tmp}}/o --confidence-threshold nan", r"--confidence-threshold: .*\[0, 1\)"),
    (f"{SEG} -o {{tmp}}/o --confidence-threshold 1", r"--confidence-threshold: .*\[0, 1\)"),
    (f"{SEG} -o {{tmp}}/o --point nan,3", r"argument --point: .* must be finite numbers"),
    (f"{SEG} -o {{tmp}}/o --box 0,0,inf,inf", r"argument --box: .* must be finite numbers"),
    # -- sizes: zero, negative, huge
    (f"{ALL} --points-per-side 0", r"--points-per-side: must be an integer in \[1, 128\]"),
    (f"{ALL} --points-per-side 100000", r"--points-per-side: must be an integer in \[1, 128\]"),
    (f"{ALL} --points-per-batch 0", r"--points-per-batch: must be an integer in \[1, 4096\]"),
    (f"{ALL} --points-per-batch 99999999", r"--points-per-batch: .* in \[1, 4096\]"),
    (f"{ALL} --crop-n-layers -1", r"--crop-n-layers: must be an integer in \[0, 4\]"),
    (f"{ALL} --crop-n-layers 9", r"--crop-n-layers: must be an integer in \[0, 4\]"),
    (f"{ALL} --min-mask-region-area -5", r"--min-mask-region-area: .* in \[0, 100000000\]"),
    (f"{ALL} --min-mask-region-area 10000000000", r"--min-mask-region-area: .* in \[0, "),
    (f"{ALL} --points-per-side 1.5", r"--points-per-side: expected a number, got '1.5'"),
    ("--threads 0 " + SEG + " -o {tmp}/o", r"--threads must be an integer in \[1, 1024\], got 0"),
    ("--threads 100000 " + SEG + " -o {tmp}/o", r"--threads must be an integer in \[1, 1024\]"),
    ("train missing.yaml --nproc 0", r"argument --nproc: must be an integer in \[1, 128\]"),
    ("train missing.yaml --nproc 100000", r"argument --nproc: must be an integer in \[1, 128\]"),
    ("synth {tmp}/ds --num-images 0", r"--num-images: must be an integer in \[1, 1000000\]"),
    ("synth {tmp}/ds --num-images 1000000000", r"--num-images: .* in \[1, 1000000\]"),
    ("synth {tmp}/ds --size 0x0", r"argument --size: each side must lie in \[32, 8192\]"),
    ("synth {tmp}/ds --size 100000x480", r"argument --size: each side must lie in \[32, 8192\]"),
    ("synth {tmp}/ds --size big", r"argument --size: expected WIDTHxHEIGHT"),
    ("synth {tmp}/ds --seed -1", r"argument --seed: must be an integer in \[0, 4294967295\]"),
    ("eval --format synthetic --num-images 0", r"--num-images: must be an integer in \[1, "),
    ("random-checkpoint --seed -3 -o {tmp}/r.safetensors", r"argument --seed: .*got -3"),
    # -- inputs: formats never decoded, an image too elongated for the model
    (f"{SEG} -o {{tmp}}/o".replace("{img}", "{eps}"), r"EPS/PostScript images are not read"),
    (ALL.replace("{img}", "{eps}"), r"\.eps: EPS/PostScript images are not read \(formats"),
    ("segment {thin} --point 0,0 --checkpoint {ckpt} -o {tmp}/o", r"1 x 100000 .*elongated"),
    ("everything {thin} --quiet --checkpoint {ckpt} -o {tmp}/o", r"1 x 100000 .*elongated"),
]


def run(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        return exc.code if isinstance(exc.code, int) else 1


def _refuse(what: str):
    def fail(*args, **kwargs):
        raise AssertionError(f"{what} was called: the check must come before it")

    return fail


@pytest.fixture
def no_work(monkeypatch):
    """Every model loader and long job fails the test if called."""
    import paddle_sam.loading as loading
    from paddle_sam.convert import checkpoint
    from paddle_sam.loading import registry, sam3, sam_v1
    from paddle_sam.train import synthetic
    from paddle_sam.train.sam_v1 import data

    for module in (cli.common, cli.everything, cli.export, cli.train):
        monkeypatch.setattr(module, "load_model", _refuse("load_model"))
    for module in (cli.common, cli.segment, cli.train):
        monkeypatch.setattr(module, "image_predictor", _refuse("image_predictor"))
    monkeypatch.setattr(cli.segment, "exported_predictor", _refuse("exported_predictor"))
    for module in (loading, registry):
        for name in ("load_model", "load_image_predictor", "load_video_predictor"):
            monkeypatch.setattr(module, name, _refuse(name))
    monkeypatch.setattr(sam_v1, "load_sam", _refuse("load_sam"))
    for name in ("load_sam3", "load_sam3_predictor"):
        monkeypatch.setattr(sam3, name, _refuse(name))
    monkeypatch.setattr(checkpoint, "convert_checkpoint", _refuse("convert_checkpoint"))
    monkeypatch.setattr(synthetic, "write_dataset", _refuse("write_dataset"))
    monkeypatch.setattr(data, "open_dataset", _refuse("open_dataset"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile_inputs")
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    Image.fromarray(img).save(d / "img.png")
    Image.fromarray(img).save(d / "img.eps")  # PostScript: Pillow writes it without Ghostscript
    Image.fromarray(np.full((1, 100_000, 3), 128, np.uint8)).save(d / "thin.png")
    (d / "a_file").write_text("not a folder\n")
    return {
        "img": d / "img.png",
        "eps": d / "img.eps",
        "thin": d / "thin.png",
        "file": d / "a_file",
    }


@pytest.fixture
def read_only_dir(tmp_path):
    ro = tmp_path / "read_only"
    ro.mkdir()
    ro.chmod(0o500)
    yield ro
    ro.chmod(0o700)


def _root_can_write(folder: Path) -> bool:
    """chmod does not stop root (CAP_DAC_OVERRIDE): a probe write tells."""
    probe = folder / ".probe"
    try:
        probe.write_bytes(b"")
    except OSError:
        return False
    probe.unlink()
    return True


@pytest.mark.parametrize(("line", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hostile_command_line(line, expected, inputs, read_only_dir, tmp_path, request, capsys):
    if "{ro}" in line and _root_can_write(read_only_dir):
        pytest.skip(
            "this user (root) can write into a mode 0o500 folder, so there is nothing to refuse; "
            "the path-under-a-file cases check the output folders for every user"
        )
    if "{thin}" not in line:
        request.getfixturevalue("no_work")
    (tmp_path / "work").mkdir()
    values = {
        **{k: str(v) for k, v in inputs.items()},
        "ro": str(read_only_dir),
        "tmp": str(tmp_path / "work"),
        "ckpt": str(DEFAULT_MODEL),
        "long": "x" * 300,
    }
    argv = [part.format(**values) for part in line.split()]
    command = next(a for a in argv if not a.startswith("-") and not a.isdigit())

    code = run(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"paddle-sam {command}: error: "), lines[0]
    assert re.search(expected, lines[0]), (expected, lines[0])
    assert "Traceback" not in err and out == ""
    # nothing was written: the test's folder is as empty as it was
    assert list((tmp_path / "work").iterdir()) == []
    assert [p.name for p in read_only_dir.iterdir()] == []


@pytest.mark.parametrize("line", [line for line, _ in CASES if "{ro}" in line])
def test_unwritable_folder_as_another_user(line, inputs, read_only_dir, tmp_path, capsys, no_work):
    """The {ro} cases whatever user runs the tests: os.access answers as it would for a user
    without write permission on the 0o500 folder (root's answer is always yes)."""
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path) == read_only_dir and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    expected = dict(CASES)[line]
    values = {**{k: str(v) for k, v in inputs.items()}, "ro": str(read_only_dir)}
    values |= {"tmp": str(tmp_path), "ckpt": str(DEFAULT_MODEL)}
    argv = [part.format(**values) for part in line.split()]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "access", access)
        code = run(argv)
    out, err = capsys.readouterr()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(expected, err) and f"{read_only_dir} is not writable" in err, err
    assert [p.name for p in read_only_dir.iterdir()] == []


def test_cases_are_unique():
    lines = [line for line, _ in CASES]
    assert len(lines) == len(set(lines))


# -------------------------------------------------------------------- 16-bit images: a note


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("rgb", "16-bit RGB image scaled to 8 bits"),
        ("gray", "16-bit grayscale (I;16) image scaled to 8 bits"),
    ],
)
def test_16bit_image_note_printed_once(kind, expected, tmp_path, capsys):
    """README: 16-bit images are converted to 8-bit RGB with a warning; the CLI prints it
    once, on one stderr line, and the command succeeds."""
    h, w = 40, 60
    ramp = (np.arange(w, dtype=np.uint32) * 65535 // (w - 1)).astype(np.uint16)
    arr = np.broadcast_to(ramp, (h, w))
    if kind == "rgb":  # cv2 writes a real 48-bit PNG (Pillow cannot write one)
        arr = np.dstack([arr, arr[:, ::-1], np.full((h, w), 30000, np.uint16)])
    path = tmp_path / f"{kind}16.png"
    assert cv2.imwrite(str(path), np.ascontiguousarray(arr))
    with Image.open(path) as im:  # the file really holds 16-bit samples
        assert im.tile[0][3] in ("RGB;16B", "I;16B") or im.mode.startswith("I;16")

    out = tmp_path / "out"
    argv = ["segment", str(path), "--point", "30,20", "--checkpoint", str(DEFAULT_MODEL)]
    assert run([*argv, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "warning:" in line]
    assert notes == [f"paddle-sam segment: warning: {path}: {expected}"], err
    assert (out / "mask.png").is_file()
