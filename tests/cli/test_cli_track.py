"""``paddle-sam track``: a generated MP4 and clicks / boxes for two objects give per-object mask
PNGs, a YouTube-VIS style results.json (RLEs that decode to the video's size) and an overlay MP4
that decodes back; the masks equal the tracker API's for the same prompts; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from paddle_sam.convert import sam3 as conv
from paddle_sam.convert.checkpoint import convert_checkpoint
from paddle_sam.loading.sam3 import load_sam3_tracker
from tests.cli.test_cli import assert_bbox_is_the_masks, assert_user_error, run
from tests.helpers.specs import tiny_sam3_tracker_spec
from tests.helpers.video import scene, write_frames, write_mp4

pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

# the tracker keeps the released widths (d_model 256, FFN 2048) on a tiny ViT
SPEC = tiny_sam3_tracker_spec()
FRAMES, H, W = 6, 60, 80


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli_track")


@pytest.fixture(scope="module")
def ckpt(work) -> Path:
    """Random weights in the released layout, the whole tracker included, converted."""
    torch = pytest.importorskip("torch")
    state = conv.random_released_state_dict(SPEC, seed=3, with_tracker=True)
    src = work / "sam3_tiny_video.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, src)
    dst = work / "sam3_tiny_video.pdparams"
    convert_checkpoint(src, dst, spec=SPEC, progress=False)
    return dst


@pytest.fixture(scope="module")
def video(work) -> Path:
    return write_mp4(scene(FRAMES, H, W), work / "clip.mp4", fps=12.0)


PROMPTS = ["--point", "0,20,25", "--point", "0,5,5,0", "--obj-id", "2", "--box", "2,45,30,70,55"]


def track(video, out, ckpt, *options) -> list:
    return ["track", video, "--checkpoint", ckpt, "-o", out, "--quiet", *options]


def test_track_writes_json_pngs_and_video(tmp_path, video, ckpt, capsys):
    out = tmp_path / "out"
    assert run(track(video, out, ckpt, *PROMPTS)) == 0
    assert "tracked 2 object(s) over 6 frame(s)" in capsys.readouterr().out
    from pycocotools import mask as mask_utils

    res = json.loads((out / "results.json").read_text())
    assert res["videos"][0]["length"] == FRAMES
    assert (res["videos"][0]["width"], res["videos"][0]["height"]) == (W, H)
    anns = {a["obj_id"]: a for a in res["annotations"]}
    assert sorted(anns) == [1, 2]

    # the API with the same prompts (pixels made relative to the video's size)
    tracker = load_sam3_tracker(ckpt)
    state = tracker.init_state(video_path=str(video))
    tracker.add_new_points_or_box(state, 0, 1, [[20 / W, 25 / H], [5 / W, 5 / H]], [1, 0])
    tracker.add_new_points_or_box(state, 2, 2, box=[45 / W, 30 / H, 70 / W, 55 / H])
    expected = {f: m.numpy()[:, 0] > 0 for f, _, _, m, _ in tracker.propagate_in_video(
        state, start_frame_idx=0, propagate_preflight=True)}  # fmt: skip
    assert sorted(expected) == list(range(FRAMES))
    for obj_id, ann in anns.items():
        assert len(ann["segmentations"]) == FRAMES
        for f, rle in enumerate(ann["segmentations"]):
            m = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()})
            assert m.shape == (H, W)
            np.testing.assert_array_equal(m.astype(bool), expected[f][obj_id - 1])
            png = np.array(Image.open(out / "masks" / str(obj_id) / f"{f:05d}.png"))
            np.testing.assert_array_equal(png > 0, expected[f][obj_id - 1])
            assert 0.0 <= ann["scores"][f] <= 1.0
            box = ann["bboxes"][f]  # the mask's own box (YouTube-VIS's, as COCO's)
            if m.any():
                assert_bbox_is_the_masks({"segmentation": rle, "bbox": box})
            else:
                assert box is None

    cap = cv2.VideoCapture(str(out / "overlay.mp4"))
    n = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        assert frame.shape == (H, W, 3)
        n += 1
    assert n == FRAMES
    assert abs(cap.get(cv2.CAP_PROP_FPS) - 12.0) < 0.01
    cap.release()


def test_track_range_options(tmp_path, video, ckpt):
    """--start-frame / --max-frames / --reverse / --both-directions choose the frames."""

    def tracked(*options) -> list[int]:
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        assert run(track(video, out, ckpt, "--point", "3,30,30", "--no-video", *options)) == 0
        ann = json.loads((out / "results.json").read_text())["annotations"][0]
        return [f for f, s in enumerate(ann["segmentations"]) if s is not None]

    assert tracked() == [3, 4, 5]
    assert tracked("--max-frames", "1") == [3, 4]
    assert tracked("--reverse") == [0, 1, 2, 3]
    assert tracked("--both-directions") == list(range(FRAMES))
    assert tracked("--start-frame", "1", "--max-frames", "2") == [1, 2, 3]
    out = tmp_path / "nopng"
    assert run(track(video, out, ckpt, "--point", "0,30,30", "--no-pngs", "--no-video")) == 0
    assert sorted(p.name for p in out.iterdir()) == [".paddle-sam.json", "results.json"]
    assert json.loads((out / ".paddle-sam.json").read_text())["files"] == {"results.json": "track"}


def test_track_overwrite(tmp_path, video, ckpt, capsys):
    out = tmp_path / "out"
    assert run(track(video, out, ckpt, *PROMPTS)) == 0
    assert_user_error(capsys, track(video, out, ckpt, *PROMPTS), "--overwrite", "results.json")
    assert run(track(video, out, ckpt, "--point", "0,20,25", "--overwrite")) == 0
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["1"]  # object 2's PNGs gone


def test_track_errors(tmp_path, video, ckpt, capsys, work):
    out = tmp_path / "out"
    cases = [
        (track(video, out, ckpt), "--point"),
        (track(video, out, ckpt, "--point", "9,20,25"), "frame 9 out of range", "6 frames"),
        (track(video, out, ckpt, "--point", "0,200,25"), "outside the 80x60 video"),
        (track(video, out, ckpt, "--point", "0,20"), "--point"),
        (track(video, out, ckpt, "--point", "0.5,20,25"), "frame index"),
        (track(video, out, ckpt, "--point", "0,20,25,3"), "LABEL"),
        (track(video, out, ckpt, "--box", "0,50,30,40,55"), "X0 <= X1"),
        (track(video, out, ckpt, "--box", "0,1,1,9,9", "--box", "0,2,2,9,9"), "already has a box"),
        (track(video, out, ckpt, "--point", "0,1,1", "--obj-id", "0"), "--obj-id"),
        (track(video, out, ckpt, "--point", "0,1,1", "--start-frame", "6"), "--start-frame 6"),
        (track(video, out, ckpt, "--point", "0,1,1", "--max-frames", "-1"), "--max-frames"),
        (track(video, out, ckpt, "--point", "0,1,1", "--reverse", "--both-directions"), "combine"),
        (track(video, out, tmp_path / "none.pdparams", "--point", "0,1,1"), "not found"),
        (track(tmp_path / "none.mp4", out, ckpt, "--point", "0,1,1"), "none.mp4"),
        # without --checkpoint clicks go to the bundled SAM 2 (tests/train/test_default_sam2.py)
        (["track", video, "-o", out, "--text", "a dog"], "--text needs SAM 3's video model"),
    ]
    bad_video = tmp_path / "bad.mp4"
    bad_video.write_bytes(b"\x00not a video" * 50)
    cases.append((track(bad_video, out, ckpt, "--point", "0,1,1"), "bad.mp4"))
    for argv, *needles in cases:
        assert_user_error(capsys, argv, *needles)
    assert not out.exists()


def test_track_refuses_image_only_checkpoint(tmp_path, video, capsys):
    torch = pytest.importorskip("torch")
    state = conv.random_released_state_dict(SPEC, seed=4)
    src = tmp_path / "image_only.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, src)
    dst = tmp_path / "image_only.pdparams"
    convert_checkpoint(src, dst, spec=SPEC, progress=False)
    argv = track(video, tmp_path / "out", dst, "--point", "0,1,1")
    assert_user_error(capsys, argv, "without the tracker")


# ---------------------------------------------------------------- concepts (--text)

TEXT = "a red square"
# random weights score below the released thresholds: every detection is kept in these tests,
# and overlapping ones are kept apart
LOW = {
    "score_threshold_detection": 0.0,
    "new_det_thresh": 0.0,
    "det_nms_thresh": 0.5,
    "assoc_iou_thresh": 0.5,
}


@pytest.fixture
def low_thresholds(monkeypatch, work):
    """The video model as the CLI and the API build it, with the thresholds at 0 and its
    random weights balanced (tests/helpers/server.py: masks that differ and cover part of a
    frame), so that several instances are found and tracked."""
    from paddle_sam.loading import sam3 as build
    from paddle_sam.models.sam3.build_sam3 import VIDEO_SETTINGS
    from tests.helpers.server import balance_video_model_

    for key, value in LOW.items():
        monkeypatch.setitem(VIDEO_SETTINGS[True], key, value)
    frames = work / "balance_frames"
    if not frames.is_dir():
        write_frames(scene(FRAMES, H, W), frames)
    build_predictor = build.build_sam3_video_predictor

    def balanced(*args, **kwargs):
        predictor = build_predictor(*args, **kwargs)
        balance_video_model_(predictor.model, frames)
        return predictor

    monkeypatch.setattr(build, "build_sam3_video_predictor", balanced)


def api_outputs(ckpt, video, requests: list[dict], stream: dict) -> dict[int, dict]:
    """The request API on the same checkpoint and video: ``{frame: outputs}``."""
    from paddle_sam.loading.sam3 import build_sam3_video_predictor

    predictor = build_sam3_video_predictor(checkpoint_path=ckpt)
    sid = predictor.handle_request({"type": "start_session", "resource_path": str(video)})[
        "session_id"
    ]
    for req in requests:
        predictor.handle_request({**req, "session_id": sid})
    return {
        item["frame_index"]: item["outputs"]
        for item in predictor.handle_stream_request({**stream, "session_id": sid})
    }


def decoded(out: Path) -> dict[int, dict[int, np.ndarray]]:
    """``{obj_id: {frame: mask}}`` of a results.json."""
    from pycocotools import mask as mask_utils

    res = json.loads((out / "results.json").read_text())
    masks: dict[int, dict[int, np.ndarray]] = {}
    for ann in res["annotations"]:
        for f, rle in enumerate(ann["segmentations"]):
            if rle is not None:
                m = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()})
                masks.setdefault(ann["obj_id"], {})[f] = m.astype(bool)
    return masks


def test_track_text_equals_the_api(tmp_path, video, ckpt, capsys, low_thresholds):
    """--text: every instance through the video, the request API's masks and ids on every
    frame, category named after the concept, the overlay decodes back."""
    out = tmp_path / "out"
    assert run(track(video, out, ckpt, "--text", TEXT)) == 0
    expected = api_outputs(
        ckpt,
        video,
        [{"type": "add_prompt", "frame_index": 0, "text": TEXT}],
        {"type": "propagate_in_video", "propagation_direction": "forward", "start_frame_index": 0},
    )
    assert sorted(expected) == list(range(FRAMES))
    ids = sorted({int(i) for o in expected.values() for i in o["out_obj_ids"]})
    assert len(ids) >= 2  # several instances with the thresholds at 0
    assert f"tracked {len(ids)} object(s) over {FRAMES} frame(s)" in capsys.readouterr().out
    got = decoded(out)
    assert sorted(got) == ids
    for f, o in expected.items():
        for obj_id, mask in zip(o["out_obj_ids"], o["out_binary_masks"], strict=True):
            np.testing.assert_array_equal(got[int(obj_id)][f], mask)
            png = np.array(Image.open(out / "masks" / str(obj_id) / f"{f:05d}.png"))
            np.testing.assert_array_equal(png > 0, mask)
        shown = {obj_id for obj_id in got if f in got[obj_id]}
        assert shown == {int(i) for i in o["out_obj_ids"]}, f"frame {f}"
    res = json.loads((out / "results.json").read_text())
    assert [c["name"] for c in res["categories"]] == [TEXT]
    cap = cv2.VideoCapture(str(out / "overlay.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == FRAMES
    cap.release()


def test_track_text_with_exemplar_box_and_directions(tmp_path, video, ckpt, low_thresholds):
    """--text with an exemplar --box on frame 3, both directions: the API's outputs for the
    same prompt (the box as normalised xywh) on every frame."""
    out = tmp_path / "out"
    argv = track(video, out, ckpt, "--text", TEXT, "--box", "3,20,10,50,40", "--both-directions")
    assert run([*argv, "--no-video", "--no-pngs"]) == 0
    box = [20 / W, 10 / H, 30 / W, 30 / H]
    expected = api_outputs(
        ckpt,
        video,
        [
            {
                "type": "add_prompt",
                "frame_index": 3,
                "text": TEXT,
                "bounding_boxes": [box],
                "bounding_box_labels": [1],
            }
        ],
        {"type": "propagate_in_video", "propagation_direction": "both", "start_frame_index": 3},
    )
    assert sorted(expected) == list(range(FRAMES))
    got = decoded(out)
    for f, o in expected.items():
        for obj_id, mask in zip(o["out_obj_ids"], o["out_binary_masks"], strict=True):
            np.testing.assert_array_equal(got[int(obj_id)][f], mask)


def test_track_text_errors(tmp_path, video, ckpt, capsys):
    out = tmp_path / "out"
    cases = [
        (track(video, out, ckpt, "--text", " "), "concept is empty"),
        (track(video, out, ckpt, "--text", "x", "--point", "0,1,1"), "--point does not combine"),
        (
            track(video, out, ckpt, "--text", "x", "--box", "0,1,1,9,9", "--box", "2,1,1,9,9"),
            "one frame",
        ),
        (track(video, out, ckpt, "--text", "x", "--box", "0,1,1,90,9"), "outside the 80x60"),
        (track(video, out, ckpt, "--text", "x", "--box", "7,1,1,9,9"), "frame 7 out of range"),
        (track(video, out, ckpt, "--text", "x", "--start-frame", "6"), "--start-frame 6"),
    ]
    for argv, *needles in cases:
        assert_user_error(capsys, argv, *needles)
    assert not out.exists()
