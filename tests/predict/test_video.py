"""predict.video: frames of real video files, folders and lists, decoded on demand; the
official tracker's preprocessing bit for bit; every bad input a one-line VideoError."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from paddle_sam.predict.io import MAX_IMAGE_PIXELS
from paddle_sam.predict.video import (
    FRAME_EXTENSIONS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    VIDEO_EXTENSIONS,
    FrameIndexError,
    VideoError,
    VideoFrames,
    open_video,
    preprocess_frame,
)

# container -> the OpenCV writer's codec used to make it
CODECS = {".mp4": "mp4v", ".mov": "mp4v", ".avi": "MJPG", ".mkv": "MJPG", ".webm": "VP80"}


def _frames(n: int, width: int = 64, height: int = 48) -> list[np.ndarray]:
    """``n`` RGB frames: a background changing colour, a green and a blue square moving."""
    out = []
    for k in range(n):
        f = np.empty((height, width, 3), np.uint8)
        f[:] = ((30 + 23 * k) % 256, 60, (200 - 11 * k) % 256)
        side = max(2, min(width, height) // 4)
        x = (5 * k) % (width - side)
        f[:side, x : x + side] = (0, 230, 0)
        y = (3 * k) % (height - side)
        f[y : y + side, width - side :] = (20, 20, 240)
        out.append(f)
    return out


def _write_video(path: Path, frames: list[np.ndarray], fps: float = 12.0) -> bool:
    """Write RGB frames with ``cv2.VideoWriter``; False when this OpenCV cannot write it."""
    height, width = frames[0].shape[:2]
    fourcc = cv2.VideoWriter_fourcc(*CODECS[path.suffix.lower()])
    writer = cv2.VideoWriter(str(path), fourcc, fps, (width, height))
    if not writer.isOpened():
        return False
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()
    return path.is_file() and path.stat().st_size > 0


def _decode_all(path: Path) -> list[np.ndarray]:
    """The frames as a plain sequential ``cv2.VideoCapture`` reads them, RGB."""
    cap = cv2.VideoCapture(str(path))
    out = []
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        out.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    cap.release()
    return out


def _video(tmp_path: Path, ext: str, n: int, width: int = 64, height: int = 48) -> Path:
    path = tmp_path / f"clip{ext}"
    if not _write_video(path, _frames(n, width, height)):
        if ext == ".webm":
            pytest.skip("this OpenCV build cannot write VP8 into .webm")
        raise AssertionError(f"OpenCV could not write {CODECS[ext]} into {ext}")
    return path


def _official(rgb: np.ndarray, size: int) -> np.ndarray:
    """The official tracker's recipe (its frame loader's resize and scaling, then the
    normalisation of its JPEG-folder loader), in torch."""
    torch = pytest.importorskip("torch")
    img = torch.from_numpy(np.array(Image.fromarray(rgb).resize((size, size))) / 255.0)
    img = img.permute(2, 0, 1).to(torch.float32)
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32)[:, None, None]
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32)[:, None, None]
    return ((img - mean) / std).numpy()


# ---------------------------------------------------------------------------------------------
# video files


@pytest.mark.parametrize("ext", VIDEO_EXTENSIONS)
def test_video_file_frames_match_sequential_decoding(ext, tmp_path):
    written = _frames(10)
    path = _video(tmp_path, ext, 10)
    reference = _decode_all(path)
    assert len(reference) == 10

    video = open_video(path, image_size=32, cache_frames=4)
    assert len(video) == 10 and (video.height, video.width) == (48, 64)
    assert video.fps == pytest.approx(12.0) and video.source == str(path)
    assert video.image_size == 32
    orders = {
        "forward": list(range(10)),
        "reverse": list(range(9, -1, -1)),
        "random": [int(i) for i in np.random.default_rng(1).integers(0, 10, 30)],
    }
    for name, order in orders.items():
        video.close()  # each order from a fresh capture and an empty cache
        for i in order:
            rgb = video.rgb(i)
            assert rgb.dtype == np.uint8 and rgb.shape == (48, 64, 3)
            assert np.array_equal(rgb, reference[i]), (name, i)
            assert video.cached_count() <= 4
    # RGB, not BGR: close to what was written (lossy codecs)
    for i in range(10):
        diff = np.abs(video.rgb(i).astype(int) - written[i].astype(int)).mean()
        assert diff < 12, (i, diff)
    x = video[3]
    assert x.dtype == np.float32 and x.shape == (3, 32, 32)
    assert np.array_equal(x, preprocess_frame(reference[3], 32))
    video.close()


def test_seeking_is_exact_across_keyframes(tmp_path):
    """mp4v puts a keyframe every few frames: seeks land between them."""
    path = _video(tmp_path, ".mp4", 60)
    reference = _decode_all(path)
    assert len(reference) == 60
    with open_video(path, image_size=16, cache_frames=3) as video:
        assert len(video) == 60
        for i in [59, 0, 31, 30, 29, 45, 7, 58, 1, 33, 12, 12, 50, 49, 48]:
            assert np.array_equal(video.rgb(i), reference[i]), i
        for i in range(59, -1, -1):
            assert np.array_equal(video.rgb(i), reference[i]), i
        for i in range(0, 60, 7):  # forward skips, within and beyond the cache
            assert np.array_equal(video.rgb(i), reference[i]), i


def test_cache_is_bounded_on_a_long_video(tmp_path):
    path = _video(tmp_path, ".avi", 200, width=32, height=24)
    video = open_video(path, image_size=8, cache_frames=8)
    assert len(video) == 200 and video.cache_frames == 8
    for i in range(200):
        video.rgb(i)
        assert video.cached_count() <= 8
    assert video.cached_count() == 8
    for i in range(199, -1, -1):
        video.rgb(i)
        assert video.cached_count() <= 8
    # each cached frame is read-only: a caller cannot corrupt the cache
    with pytest.raises(ValueError):
        video.rgb(0)[0, 0, 0] = 1
    video.close()
    assert video.cached_count() == 0
    assert np.array_equal(video.rgb(5), _decode_all(path)[5])  # reopens after close


def test_iteration_and_repr(tmp_path):
    path = _video(tmp_path, ".avi", 6)
    video = open_video(str(path), image_size=16, cache_frames=2)
    items = list(video)
    assert len(items) == 6 and all(x.shape == (3, 16, 16) for x in items)
    assert isinstance(video, VideoFrames)
    assert "6 frames" in repr(video) and "64x48" in repr(video)
    del video  # __del__ releases the capture


# ---------------------------------------------------------------------------------------------
# the official recipe


@pytest.mark.parametrize(
    ("height", "width", "size"), [(48, 64, 32), (37, 53, 100), (64, 64, 64), (20, 90, 17)]
)
def test_preprocess_is_bitwise_the_official_recipe(height, width, size):
    rgb = np.random.default_rng(height).integers(0, 256, (height, width, 3), dtype=np.uint8)
    ours = preprocess_frame(rgb, size)
    assert ours.dtype == np.float32 and ours.shape == (3, size, size)
    assert ours.flags.c_contiguous
    assert np.array_equal(ours, _official(rgb, size))
    # a non-contiguous view of the same pixels gives the same values
    wide = np.zeros((height, width * 2, 3), np.uint8)
    wide[:, ::2] = rgb
    assert np.array_equal(preprocess_frame(wide[:, ::2], size), ours)


def test_folder_matches_the_official_loader(tmp_path):
    pytest.importorskip("torch")
    sam2_utils = pytest.importorskip("sam3.model.utils.sam2_utils")
    import torch

    rng = np.random.default_rng(5)
    for k in range(12):  # 10.jpg, 11.jpg sort after 9.jpg
        noise = rng.integers(0, 40, (37, 53, 3), dtype=np.uint8)
        frame = _frames(12, 53, 37)[k] // 2 + noise
        Image.fromarray(frame).save(tmp_path / f"{k}.jpg", quality=90)
    images, video_height, video_width = sam2_utils.load_video_frames_from_jpg_images(
        str(tmp_path), 64, offload_video_to_cpu=True, compute_device=torch.device("cpu")
    )
    video = open_video(tmp_path, image_size=64, cache_frames=4)
    assert (video.height, video.width) == (video_height, video_width) == (37, 53)
    assert len(video) == images.shape[0] == 12 and video.fps is None
    for k in range(12):
        assert np.array_equal(video[k], images[k].numpy()), k


# ---------------------------------------------------------------------------------------------
# frame folders


def _solid(color: tuple[int, int, int], width: int = 32, height: int = 24) -> Image.Image:
    return Image.new("RGB", (width, height), color)


def test_folder_sorted_by_integer_stem(tmp_path):
    colors = {0: (250, 0, 0), 2: (0, 250, 0), 10: (0, 0, 250)}
    for k, color in colors.items():
        _solid(color).save(tmp_path / f"{k}.jpg", quality=95)
    (tmp_path / "notes.txt").write_text("not a frame")
    video = open_video(tmp_path, image_size=8)
    assert len(video) == 3 and video.source == str(tmp_path)
    for i, color in enumerate(colors.values()):  # 0, 2, 10: not "0", "10", "2"
        assert np.abs(video.rgb(i).mean(axis=(0, 1)) - color).max() < 4, i


def test_folder_lexicographic_when_a_stem_is_not_an_integer(tmp_path):
    names = ["frame2.png", "b.png", "frame10.png", "a.png", "3.png"]
    for k, name in enumerate(names):
        _solid((10 * k, 20, 30)).save(tmp_path / name)
    video = open_video(tmp_path, image_size=8)
    expected = sorted(names)  # 3, a, b, frame10, frame2
    for i, name in enumerate(expected):
        assert video.rgb(i)[0, 0, 0] == 10 * names.index(name), name


def test_folder_png_frames_are_exact(tmp_path):
    frames = _frames(5, 40, 30)
    for k, frame in enumerate(frames):
        ext = ".PNG" if k == 3 else ".png"  # extensions in any case
        Image.fromarray(frame).save(tmp_path / f"{k:05d}{ext}")
    (tmp_path / "sub.png").mkdir()  # a folder is not a frame
    video = open_video(tmp_path, image_size=24, cache_frames=2)
    assert len(video) == 5 and (video.height, video.width) == (30, 40) and video.fps is None
    for i in [4, 0, 3, 1, 2, 4]:
        assert np.array_equal(video.rgb(i), frames[i])
        assert np.array_equal(video[i], _official(frames[i], 24))
        assert video.cached_count() <= 2


@pytest.mark.parametrize("ext", FRAME_EXTENSIONS)
def test_folder_every_frame_extension(ext, tmp_path):
    frame = _frames(1, 16, 12)[0]
    Image.fromarray(frame).save(tmp_path / f"0{ext}")
    video = open_video(tmp_path, image_size=8)
    assert len(video) == 1 and (video.height, video.width) == (12, 16)
    if ext in (".png", ".bmp", ".tif", ".tiff"):
        assert np.array_equal(video.rgb(0), frame)


def test_folder_mismatched_size_names_the_file(tmp_path):
    _solid((1, 2, 3)).save(tmp_path / "0.png")
    _solid((1, 2, 3)).save(tmp_path / "1.png")
    _solid((1, 2, 3), width=40).save(tmp_path / "2.png")
    with pytest.raises(VideoError, match=r"2\.png: frame is 40x24.*0\.png\) is 32x24"):
        open_video(tmp_path)


def test_folder_non_image_named_jpg(tmp_path):
    _solid((1, 2, 3)).save(tmp_path / "0.jpg")
    (tmp_path / "1.jpg").write_bytes(b"this is not a JPEG at all" * 10)
    with pytest.raises(VideoError, match=r"1\.jpg: not a readable image"):
        open_video(tmp_path)


def test_folder_truncated_frame_fails_when_read(tmp_path):
    _solid((1, 2, 3)).save(tmp_path / "0.png")
    noise = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "1.jpg", quality=95)
    data = (tmp_path / "1.jpg").read_bytes()
    (tmp_path / "1.jpg").write_bytes(data[: len(data) * 3 // 4])  # the headers stay whole
    video = open_video(tmp_path)  # headers are fine
    assert video.rgb(0)[0, 0].tolist() == [1, 2, 3]
    with pytest.raises(VideoError, match=r"1\.jpg: frame 1: damaged or truncated"):
        video.rgb(1)


def test_empty_folder(tmp_path):
    with pytest.raises(VideoError, match="no frames in the folder"):
        open_video(tmp_path)
    (tmp_path / "readme.txt").write_text("only text")
    with pytest.raises(VideoError, match=r"no frames in the folder \(extensions read: \.jpg"):
        open_video(tmp_path)


def _png_header(width: int, height: int) -> bytes:
    """A PNG claiming ``width x height`` in its header, with (almost) no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("side", [10_001, 20_000])  # under and over PIL's own bomb limit
def test_folder_frame_over_the_pixel_limit(side, tmp_path):
    (tmp_path / "0.png").write_bytes(_png_header(side, 10_000))
    with pytest.raises(VideoError, match=r"0\.png: .*too large|0\.png: .*above the limit"):
        open_video(tmp_path)


# ---------------------------------------------------------------------------------------------
# lists of frames


def test_list_of_arrays_is_kept_as_given():
    frames = _frames(4, 20, 10)
    video = open_video(frames, image_size=16)
    assert len(video) == 4 and (video.height, video.width) == (10, 20) and video.fps is None
    assert video.source == "a list of 4 frames"
    for i in range(4):
        rgb = video.rgb(i)
        assert np.shares_memory(rgb, frames[i]) and np.array_equal(rgb, frames[i])
        assert not rgb.flags.writeable
        assert np.array_equal(video[i], _official(frames[i], 16))
    assert frames[0].flags.writeable  # the caller's arrays are untouched
    assert video.cached_count() == 0


def test_list_of_pil_images_and_tuples():
    frames = _frames(3, 20, 10)
    pils = [Image.fromarray(frames[0]), Image.fromarray(frames[1]).convert("L")]
    video = open_video(tuple(pils), image_size=8)
    assert len(video) == 2 and (video.height, video.width) == (10, 20)
    assert np.array_equal(video.rgb(0), frames[0])
    gray = video.rgb(1)
    assert gray.shape == (10, 20, 3) and np.array_equal(gray[..., 0], gray[..., 2])


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (np.zeros((10, 20, 3), np.float32), r"frame 1: .*shape \(10, 20, 3\) dtype float32"),
        (np.zeros((10, 20), np.uint8), r"frame 1: .*shape \(10, 20\) dtype uint8"),
        (np.zeros((10, 20, 4), np.uint8), r"frame 1: .*shape \(10, 20, 4\)"),
        ("not a frame", r"frame 1: expected .* got str"),
    ],
)
def test_list_with_a_bad_frame(frame, match):
    with pytest.raises(VideoError, match=match):
        open_video([np.zeros((10, 20, 3), np.uint8), frame])


def test_list_mismatched_sizes():
    frames = [np.zeros((10, 20, 3), np.uint8)] * 2 + [np.zeros((12, 20, 3), np.uint8)]
    with pytest.raises(VideoError, match=r"frame 2 is 20x12, but frame 0 is 20x10"):
        open_video(frames)


def test_list_frame_over_the_pixel_limit():
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    huge = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (side, side, 3))  # no memory
    with pytest.raises(VideoError, match=r"frame 0: .* above the limit"):
        open_video([huge])


def test_empty_list():
    with pytest.raises(VideoError, match="empty"):
        open_video([])


# ---------------------------------------------------------------------------------------------
# bad paths and files, indices, sizes


def test_missing_path(tmp_path):
    with pytest.raises(VideoError, match=r"nope\.mp4: no such video file or folder"):
        open_video(tmp_path / "nope.mp4")


def test_unsupported_extension(tmp_path):
    path = tmp_path / "clip.txt"
    path.write_text("hello")
    with pytest.raises(VideoError, match=r"clip\.txt: neither .* \(video extensions read: \.mp4"):
        open_video(path)


def test_corrupt_video(tmp_path):
    path = tmp_path / "clip.mp4"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(VideoError, match=r"clip\.mp4: corrupt or unreadable video"):
        open_video(path)


def test_empty_and_zero_frame_videos(tmp_path):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(VideoError, match=r"empty\.mp4: corrupt or unreadable video"):
        open_video(empty)
    for ext in (".avi", ".mp4"):  # a writer opened and released without frames
        path = tmp_path / f"zero{ext}"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*CODECS[ext]), 10, (32, 24))
        writer.release()
        with pytest.raises(VideoError, match=rf"zero\{ext}: (the video has no frames|corrupt)"):
            open_video(path)


def test_upper_case_video_extension(tmp_path):
    path = _video(tmp_path, ".avi", 3)
    upper = path.rename(tmp_path / "CLIP.AVI")
    assert len(open_video(upper)) == 3


def test_frame_index_out_of_range(tmp_path):
    path = _video(tmp_path, ".avi", 8)
    video = open_video(path, image_size=8)
    message = "frame index 12 out of range: the video has 8 frames (0-7)"
    with pytest.raises(FrameIndexError) as info:
        video.rgb(12)
    assert message in str(info.value) and str(path) in str(info.value)
    assert isinstance(info.value, IndexError) and isinstance(info.value, VideoError)
    with pytest.raises(VideoError, match=r"frame index -1 out of range: .* \(0-7\)"):
        video[-1]
    with pytest.raises(VideoError, match=r"frame index 8 out of range"):
        video[8]
    with pytest.raises(VideoError, match="frame indices are integers"):
        video[1.5]
    assert video[np.int64(7)].shape == (3, 8, 8)


@pytest.mark.parametrize("size", [0, -3, 2.5, True])
def test_bad_image_size(size, tmp_path):
    frames = _frames(1, 8, 8)
    with pytest.raises(VideoError, match="image_size must be a positive integer"):
        open_video(frames, image_size=size)
    with pytest.raises(VideoError, match="image_size must be a positive integer"):
        preprocess_frame(frames[0], size)
    with pytest.raises(VideoError, match="cache_frames must be a positive integer"):
        open_video(frames, cache_frames=0)


def test_not_a_source():
    with pytest.raises(VideoError, match="got int"):
        open_video(3)
