"""predict.track_outputs: mask PNGs, YouTube-VIS results.json and overlay MP4 of a track."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from paddle_sam.predict.track_outputs import TrackWriter

H, W, T = 48, 64, 6


def _frame(i: int) -> np.ndarray:
    """A flat grey frame, a little brighter each frame."""
    return np.full((H, W, 3), 60 + 10 * i, np.uint8)


def _mask_a(i: int) -> np.ndarray:
    m = np.zeros((H, W), bool)
    if i < 4:  # object 3 leaves the scene on frames 4-5
        m[8:28, 4 + 2 * i : 24 + 2 * i] = True
    return m


def _mask_b(i: int) -> np.ndarray:
    m = np.zeros((H, W), bool)
    m[30:44, 36 + i : 60] = True
    return m


def _decode(rle: dict) -> np.ndarray:
    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}).astype(bool)


@pytest.fixture(scope="module")
def track(tmp_path_factory):
    out = tmp_path_factory.mktemp("track") / "out"  # created by the writer
    with TrackWriter(
        out, H, W, T, fps=12.0, source="clip.mp4", frame_rgb=_frame, category="thing"
    ) as writer:
        for i in reversed(range(T)):  # backward propagation order
            ids, masks, scores = [3], [_mask_a(i)], [0.9 if i < 4 else 0.05]
            if i >= 2:  # object 7 only from frame 2
                ids.append(7)
                masks.append(_mask_b(i))
                scores.append(0.8)
            if i == 1:  # a wrong first pass on frame 1, replaced below
                writer.add(i, [3], np.ones((1, H, W), np.float32), [0.1])
            writer.add(i, ids, np.stack(masks), np.array(scores))
    return out, writer.close()


def test_pngs(track):
    out, _ = track
    for i in range(T):
        for obj_id, fn in ((3, _mask_a), (7, _mask_b)):
            path = out / "masks" / str(obj_id) / f"{i:05d}.png"
            if obj_id == 7 and i < 2:
                assert not path.exists()
                continue
            with Image.open(path) as im:
                assert im.mode == "L" and im.size == (W, H)
                arr = np.asarray(im)
            assert set(np.unique(arr)) <= {0, 255}
            np.testing.assert_array_equal(arr == 255, fn(i))


def test_results_json(track):
    out, summary = track
    res = json.loads((out / "results.json").read_text())
    assert res["info"] == {"source": "clip.mp4", "fps": 12.0, "description": "paddle-sam track"}
    assert res["videos"] == [{"id": 1, "width": W, "height": H, "length": T, "file_names": None}]
    assert res["categories"] == [{"id": 1, "name": "thing"}]
    anns = res["annotations"]
    # in order of first appearance: frame 5 (added first) holds both, 3 before 7
    assert [(a["id"], a["obj_id"]) for a in anns] == [(1, 3), (2, 7)]
    for a, fn in zip(anns, (_mask_a, _mask_b), strict=True):
        assert a["video_id"] == 1 and a["category_id"] == 1 and a["iscrowd"] == 0
        for key in ("segmentations", "bboxes", "areas", "scores"):
            assert len(a[key]) == T
        for i in range(T):
            rle = a["segmentations"][i]
            if a["obj_id"] == 7 and i < 2:
                assert rle is None and a["bboxes"][i] is None
                assert a["areas"][i] is None and a["scores"][i] is None
                continue
            assert isinstance(rle["counts"], str) and rle["size"] == [H, W]
            np.testing.assert_array_equal(_decode(rle), fn(i))
            assert a["areas"][i] == int(fn(i).sum())
            if a["areas"][i] == 0:
                assert a["bboxes"][i] is None
            else:
                coco = mask_utils.toBbox({"size": rle["size"], "counts": rle["counts"].encode()})
                assert a["bboxes"][i] == coco.tolist()
    a3, a7 = anns
    assert a3["areas"][4:] == [0, 0] and a3["bboxes"][4:] == [None, None]
    assert a3["scores"] == pytest.approx([0.9] * 4 + [0.05] * 2)  # frame 1: the second add
    assert a3["score"] == pytest.approx((0.9 * 4 + 0.05 * 2) / 6)
    assert a7["scores"] == [None, None] + [pytest.approx(0.8)] * 4
    assert a7["score"] == pytest.approx(0.8)
    assert summary["frames"] == T
    assert [(o["obj_id"], o["frames"]) for o in summary["objects"]] == [(3, 4), (7, 4)]
    assert summary["files"]["results"] == str(out / "results.json")
    assert summary["files"]["video"] == str(out / "overlay.mp4")


def test_overlay_video(track):
    out, _ = track
    cap = cv2.VideoCapture(str(out / "overlay.mp4"))
    assert cap.isOpened()
    assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(12.0)
    frames = []
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    cap.release()
    assert len(frames) == T
    for i, rgb in enumerate(frames):
        assert rgb.shape == (H, W, 3)
        grey = _frame(i).astype(int)
        # well inside each object: coloured; far from both: the frame itself (lossy codec)
        inside = [(20, 14 + 2 * i)] if i < 4 else []
        if i >= 2:
            inside.append((40, 54))
        for y, x in inside:
            assert np.abs(rgb[y, x].astype(int) - grey[y, x]).max() > 15, (i, y, x)
        assert np.abs(rgb[2, W - 3].astype(int) - grey[2, W - 3]).max() < 15


def test_black_frames_odd_size_no_pngs(tmp_path):
    with TrackWriter(tmp_path, 15, 21, 3, write_pngs=False) as writer:
        m = np.zeros((1, 15, 21), np.float32)
        m[0, 3:9, 4:12] = 2.5  # logits: > 0 is foreground
        writer.add(1, [0], m, [1.0])
    summary = writer.close()
    assert summary["files"]["masks"] is None and not (tmp_path / "masks").exists()
    res = json.loads((tmp_path / "results.json").read_text())
    (ann,) = res["annotations"]
    assert res["info"]["fps"] is None
    assert ann["segmentations"][0] is None and ann["segmentations"][2] is None
    assert ann["bboxes"][1] == [4, 3, 8, 6] and ann["areas"][1] == 48
    cap = cv2.VideoCapture(str(tmp_path / "overlay.mp4"))
    assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(10.0)
    ok, bgr = cap.read()
    assert ok and bgr.shape[:2] == (16, 22)  # padded to even for the encoder
    assert bgr[6, 8].max() > 30 and bgr[13, 1].max() < 20  # coloured object on black
    assert not cap.read()[0]


def test_no_video(tmp_path):
    writer = TrackWriter(tmp_path, H, W, T, write_video=False)
    writer.add(0, [1], np.ones((1, H, W), bool), [0.5])
    summary = writer.close()
    assert summary["files"]["video"] is None and not (tmp_path / "overlay.mp4").exists()
    assert writer.close() is summary
    with pytest.raises(RuntimeError, match="closed"):
        writer.add(1, [1], np.ones((1, H, W), bool), [0.5])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((T, [1], np.zeros((1, H, W), bool), [0.5]), "frame index 6 out of range"),
        ((-1, [1], np.zeros((1, H, W), bool), [0.5]), "frame index -1 out of range"),
        ((0, [1], np.zeros((1, W, H), bool), [0.5]), r"masks of shape \(1, 64, 48\)"),
        ((0, [1], np.zeros((H, W), bool), [0.5]), "masks of shape"),
        ((0, [1, 2], np.zeros((1, H, W), bool), [0.5]), "1 masks, 2 object ids and 1 scores"),
        ((0, [1], np.zeros((1, H, W), bool), [0.5, 0.6]), "1 masks, 1 object ids and 2 scores"),
        ((0, [4, 4], np.zeros((2, H, W), bool), [0.5, 0.6]), r"duplicate object ids \[4\]"),
        ((0, [1], np.zeros((1, H, W), bool), [1.5]), r"probabilities in \[0, 1\]"),
        ((0, ["a"], np.zeros((1, H, W), bool), [0.5]), "object ids must be integers"),
    ],
)
def test_bad_add(tmp_path, args, match):
    writer = TrackWriter(tmp_path, H, W, T, write_video=False)
    with pytest.raises(ValueError, match=match):
        writer.add(*args)


def test_bad_construction(tmp_path):
    afile = tmp_path / "results"
    afile.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a folder"):
        TrackWriter(afile, H, W, T)
    with pytest.raises(ValueError, match="num_frames must be at least 1"):
        TrackWriter(tmp_path / "o", H, W, 0)
    with pytest.raises(ValueError, match="fps must be a positive number"):
        TrackWriter(tmp_path / "o", H, W, T, fps=0)
    with pytest.raises(ValueError, match="3 file names for a video of 6 frames"):
        TrackWriter(tmp_path / "o", H, W, T, file_names=["a", "b", "c"])


def test_bad_frame_rgb(tmp_path):
    writer = TrackWriter(tmp_path, H, W, T, frame_rgb=lambda i: np.zeros((W, H, 3), np.uint8))
    writer.add(0, [1], np.ones((1, H, W), bool), [0.5])
    with pytest.raises(ValueError, match=r"frame_rgb\(0\) returned shape"):
        writer.close()
    assert not (tmp_path / "results.json").exists()


def test_exception_in_block_writes_no_results(tmp_path):
    with pytest.raises(KeyError), TrackWriter(tmp_path, H, W, T, frame_rgb=_frame) as writer:
        writer.add(0, [1], np.ones((1, H, W), bool), [0.5])
        raise KeyError("interrupted")
    assert (tmp_path / "masks" / "1" / "00000.png").exists()  # partial files stay
    assert not (tmp_path / "results.json").exists()


def test_readd_replaces_only_named_objects(tmp_path):
    names = [f"{i:05d}.jpg" for i in range(T)]
    writer = TrackWriter(tmp_path, H, W, T, write_video=False, file_names=names)
    writer.add(2, [1, 2], np.stack([_mask_a(0), _mask_b(0)]), [0.5, 0.6])
    writer.add(2, [2], _mask_b(3)[None], [0.7])  # a correction of object 2 only
    writer.close()
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["videos"][0]["file_names"] == names
    a1, a2 = res["annotations"]
    np.testing.assert_array_equal(_decode(a1["segmentations"][2]), _mask_a(0))
    np.testing.assert_array_equal(_decode(a2["segmentations"][2]), _mask_b(3))
    assert a1["scores"][2] == 0.5 and a2["scores"][2] == 0.7
    with Image.open(tmp_path / "masks" / "2" / "00002.png") as im:
        np.testing.assert_array_equal(np.asarray(im) == 255, _mask_b(3))
