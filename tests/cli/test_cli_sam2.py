"""The CLI with SAM 2 (a reduced SAM 2.1 with random weights, written by the test): the family
is read from --checkpoint (a converted .pdparams, or the official .pt); ``segment`` writes the
masks of SAM2ImagePredictor (clicks, a box, a previous answer's logits), ``everything`` those of
SAM2AutomaticMaskGenerator as COCO whose bbox is each mask's box, ``track`` the per-frame masks
of SAM2VideoPredictor on an MP4 written with OpenCV (clicks, a box, a mask, a correction,
backward); one-line errors for what SAM 2 does not do."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddle_sam.convert import checkpoint
from paddle_sam.convert import sam2 as conv
from paddle_sam.loading.sam2 import build_sam2, build_sam2_video_predictor
from paddle_sam.predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator
from paddle_sam.predict.sam2.predictor import SAM2ImagePredictor
from tests.cli.test_cli import assert_bbox_is_the_masks, assert_user_error, everything, run, seg
from tests.helpers.sam2_ref import reduced_checkpoint, reduced_spec
from tests.helpers.video import scene, write_mp4

pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

SPEC = reduced_spec("2.1")
H, W = 96, 128
FRAMES = 4


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli_sam2")


@pytest.fixture(scope="module")
def files(work):
    pytest.importorskip("torch")
    return reduced_checkpoint(work)


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return scene(1, H, W)[0]


@pytest.fixture(scope="module")
def image_png(work, image) -> Path:
    path = work / "image.png"
    Image.fromarray(image).save(path)
    return path


@pytest.fixture(scope="module")
def reference(files, image) -> SAM2ImagePredictor:
    predictor = SAM2ImagePredictor(build_sam2(SPEC, files[1]))
    predictor.set_image(image)
    return predictor


def _png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im) > 127


def test_segment_clicks_box_and_mask_input(files, image_png, reference, work):
    _, ckpt = files
    out = work / "seg_click"
    assert run(seg(image_png, out, ckpt, "--point", "30,25")) == 0
    masks, scores, logits = reference.predict([[30, 25]], [1])
    result = json.loads((out / "result.json").read_text())
    best = int(np.argmax(scores))
    assert result["best"] == best and len(result["scores"]) == 3
    np.testing.assert_allclose(result["scores"], scores, atol=1e-6)
    np.testing.assert_array_equal(_png(out / "mask.png"), masks[best] > 0.5)
    for i in range(3):
        np.testing.assert_array_equal(_png(out / f"mask_{i}.png"), masks[i] > 0.5)
    assert 0 < (masks[best] > 0.5).mean() < 1
    saved = np.load(out / "logits.npy")
    np.testing.assert_allclose(saved, logits[best : best + 1], atol=1e-5)

    # the previous answer refined with a background click, as upstream: mask_input = logits
    again = work / "seg_refine"
    argv = seg(image_png, again, ckpt, "--point", "30,25", "--point", "70,60,0")
    assert run([*argv, "--mask-input", out / "logits.npy"]) == 0
    want, _, _ = reference.predict(
        [[30, 25], [70, 60]], [1, 0], mask_input=saved, multimask_output=False
    )
    np.testing.assert_array_equal(_png(again / "mask.png"), want[0] > 0.5)
    assert json.loads((again / "result.json").read_text())["prompts"]["mask_input"]

    box = work / "seg_box"
    assert run(seg(image_png, box, ckpt, "--box", "10,10,60,50")) == 0
    want, _, _ = reference.predict(box=[10, 10, 60, 50], multimask_output=False)
    np.testing.assert_array_equal(_png(box / "mask.png"), want[0] > 0.5)


def test_segment_with_the_official_file(files, image_png, reference, work, monkeypatch):
    """The official .pt (converted on the fly): its size is detected from the weights, here
    with the reduced size standing in for the released tiny."""
    from paddle_sam.loading import sam2 as loading_sam2

    for module in (conv, checkpoint, loading_sam2):
        monkeypatch.setattr(module, "SAM2_SPECS", {"sam2.1_hiera_tiny": SPEC})
    official, _ = files
    out = work / "seg_official"
    assert run(seg(image_png, out, official, "--point", "30,25", "--single-mask")) == 0
    want, _, _ = reference.predict([[30, 25]], [1], multimask_output=False)
    np.testing.assert_array_equal(_png(out / "mask.png"), want[0] > 0.5)


def test_segment_errors(files, image_png, work, capsys, tmp_path):
    _, ckpt = files
    assert_user_error(
        capsys, seg(image_png, tmp_path / "o", ckpt, "--text", "a dog"), "--text", "SAM 2"
    )
    two = ["--box", "1,1,20,20", "--box", "5,5,30,30"]
    assert_user_error(capsys, seg(image_png, tmp_path / "o", ckpt, *two), "SAM 2 model", "one")
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((1, 256, 256), np.float32))
    assert_user_error(
        capsys,
        seg(image_png, tmp_path / "o", ckpt, "--point", "5,5", "--mask-input", bad),
        "mask_input must be 1 x 64 x 64",
    )
    assert_user_error(
        capsys,
        ["segment", image_png, "-o", tmp_path / "o", "--point", "5,5"]
        + ["--model-type", "sam2.1_hiera_tiny"],
        "sam2.1_hiera_tiny needs its weights",
        "paddle-sam download sam2.1_hiera_tiny",
    )
    assert not (tmp_path / "o").exists()


def test_everything_writes_coco_of_the_generator(files, image_png, image, work, capsys):
    from pycocotools.coco import COCO

    _, ckpt = files
    out = work / "everything"
    options = ["--points-per-side", "4", "--pred-iou-thresh", "0", "--stability-score-thresh", "0"]
    assert run(everything(image_png, out, ckpt, *options)) == 0
    doc = json.loads((out / "annotations.json").read_text())
    want = SAM2AutomaticMaskGenerator(
        build_sam2(SPEC, ckpt), points_per_side=4, pred_iou_thresh=0, stability_score_thresh=0
    ).generate(image)
    want = [r for r in want if r["area"] > 0]
    anns = doc["annotations"]
    assert len(anns) == len(want) >= 1
    for ann, rec in zip(anns, want, strict=True):
        assert_bbox_is_the_masks(ann)
        assert ann["area"] == rec["area"]
        assert abs(ann["predicted_iou"] - rec["predicted_iou"]) < 1e-6
    assert doc["info"]["generator"]["pred_iou_thresh"] == 0
    COCO(str(out / "annotations.json"))  # pycocotools reads it
    # SAM 2's own defaults when none is given (upstream's 0.8, not SAM v1's 0.88)
    out2 = work / "everything_defaults"
    assert run(everything(image_png, out2, ckpt, "--points-per-side", "2")) == 0
    info = json.loads((out2 / "annotations.json").read_text())["info"]["generator"]
    assert info["pred_iou_thresh"] == 0.8 and info["stability_score_thresh"] == 0.95
    capsys.readouterr()


# ---------------------------------------------------------------------------- track


@pytest.fixture(scope="module")
def video(work) -> Path:
    return write_mp4(scene(FRAMES, H, W), work / "clip.mp4", fps=8.0)


def track(video, out, ckpt, *options) -> list:
    return ["track", video, "--checkpoint", ckpt, "-o", out, "--quiet", *options]


def _written(out: Path, obj_ids, frames) -> dict:
    return {
        (o, f): _png(out / "masks" / str(o) / f"{f:05d}.png")
        for o in obj_ids
        for f in frames
        if (out / "masks" / str(o) / f"{f:05d}.png").exists()
    }


def _expected(results: dict, frame_idx, obj_ids, logits) -> None:
    for k, o in enumerate(obj_ids):
        results[(o, frame_idx)] = logits.numpy()[k, 0] > 0


def test_track_clicks_box_and_mask(files, video, work):
    _, ckpt = files
    mask = np.zeros((H, W), np.uint8)
    mask[15:33, 70:95] = 255
    mask_png = work / "object3.png"
    Image.fromarray(mask).save(mask_png)
    out = work / "track"
    argv = track(
        video,
        out,
        ckpt,
        *["--point", "0,20,25", "--point", "0,60,80,0"],
        *["--obj-id", "2", "--box", "1,45,50,80,90"],
        *["--obj-id", "3", "--mask", f"0,{mask_png}"],
    )
    assert run(argv) == 0
    ref = build_sam2_video_predictor(SPEC, ckpt)
    state = ref.init_state(str(video))
    ref.add_new_points_or_box(state, 0, 1, points=[[20, 25], [60, 80]], labels=[1, 0])
    ref.add_new_mask(state, 0, 3, mask > 0)
    ref.add_new_points_or_box(state, 1, 2, box=[45, 50, 80, 90])
    want: dict = {}
    for f, ids, logits in ref.propagate_in_video(state, start_frame_idx=0):
        _expected(want, f, ids, logits)
    got = _written(out, [1, 2, 3], range(FRAMES))
    assert got.keys() == want.keys() and len(want) == 3 * FRAMES
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=str(key))
    assert any(0 < m.mean() < 1 for m in want.values())
    results = json.loads((out / "results.json").read_text())
    assert sorted(a["id"] for a in results["annotations"]) == [1, 2, 3]
    assert (out / "overlay.mp4").stat().st_size > 0


def test_track_correction_and_reverse(files, video, work):
    _, ckpt = files
    out = work / "track_fix"
    argv = track(video, out, ckpt, "--point", "2,20,25", "--correct", "3,40,30,0", "--reverse")
    assert run([*argv, "--no-video"]) == 0
    ref = build_sam2_video_predictor(SPEC, ckpt)
    state = ref.init_state(str(video))
    ref.add_new_points_or_box(state, 2, 1, points=[[20, 25]], labels=[1])
    want: dict = {}
    for f, ids, logits in ref.propagate_in_video(state, start_frame_idx=2, reverse=True):
        _expected(want, f, ids, logits)
    before = dict(want)
    # upstream's correction: a click on a frame, added to the object's clicks there, then
    # tracking again from it (frame 3 was not tracked backward from 2: a new prompt frame)
    ref.add_new_points_or_box(state, 3, 1, points=[[40, 30]], labels=[0], clear_old_points=False)
    for f, ids, logits in ref.propagate_in_video(state, start_frame_idx=3, reverse=True):
        _expected(want, f, ids, logits)
    assert any((before[k] != want[k]).any() for k in before)  # the correction mattered
    got = _written(out, [1], range(FRAMES))
    assert got.keys() == want.keys() == {(1, f) for f in range(FRAMES)}
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=str(key))


def test_track_errors(files, video, work, capsys, tmp_path):
    _, ckpt = files
    out = tmp_path / "o"
    assert_user_error(capsys, track(video, out, ckpt, "--text", "a car"), "--text", "SAM 3")
    assert_user_error(capsys, track(video, out, ckpt, "--correct", "1,5,5"), "--correct", "--point")
    small = tmp_path / "small.png"
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(small)
    assert_user_error(capsys, track(video, out, ckpt, "--mask", f"0,{small}"), "10x10", f"{W}x{H}")
    assert_user_error(
        capsys,
        track(video, out, ckpt, "--point", "0,5,5", "--mask", f"0,{small}"),
        "object 1 has a --mask and clicks",
    )


def test_commands_without_sam2_refuse_it(files, work, capsys, tmp_path):
    """eval takes SAM 2 on generated clips only (tests/train/test_sam2_train.py): a SAM 2
    checkpoint with SAM v1's image sets is a one-line error. (export takes SAM 2:
    tests/export/test_export_sam2.py)"""
    _, ckpt = files
    assert run(["eval", "--checkpoint", ckpt, "--format", "synthetic", "--num-images", "1"]) == 2
    err = capsys.readouterr().err
    assert "paddle-sam eval: error:" in err and "--format clips" in err
    assert "Traceback" not in err
