"""predict.io: only the documented formats are decoded, 16-bit images are noted."""

from __future__ import annotations

import io
import warnings

import cv2
import numpy as np
import pytest
from PIL import EpsImagePlugin, Image

from paddle_sam.predict.io import IMAGE_FORMATS, decode_image, load_image

RGB = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def _notes(fn, *args) -> tuple[np.ndarray, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught]


@pytest.mark.parametrize("ext", ["png", "jpg", "webp", "bmp", "tif", "gif"])
def test_documented_formats_decode(ext, tmp_path):
    path = tmp_path / f"x.{ext}"
    Image.fromarray(RGB).save(path)
    arr, notes = _notes(load_image, path)
    assert arr.shape == RGB.shape and arr.dtype == np.uint8 and notes == []
    with Image.open(path) as im:
        assert im.format in IMAGE_FORMATS


@pytest.fixture
def no_ghostscript(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the EPS plugin must never see the file")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", fail)
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", fail)


def test_eps_refused_by_name(tmp_path, no_ghostscript):
    path = tmp_path / "x.eps"
    Image.fromarray(RGB).save(path)  # writing needs neither the EPS reader nor Ghostscript
    with pytest.raises(ValueError, match=r"x\.eps: EPS/PostScript images are not read"):
        load_image(path)
    # an upload in memory, the image starting after other bytes: named all the same
    data = io.BytesIO(b"header" + path.read_bytes())
    data.seek(6)
    with pytest.raises(ValueError, match=r"^upload: EPS/PostScript images are not read"):
        decode_image(data, "upload")


@pytest.mark.parametrize(
    "data, match",
    [
        (b"%PDF-1.4\n", "PDF images are not read"),
        (b"not an image\n", r"not a readable image .*formats read: PNG, JPEG"),
        (b"", "not a readable image"),
    ],
)
def test_other_files_refused(data, match):
    with pytest.raises(ValueError, match=match):
        decode_image(io.BytesIO(data), "f")


@pytest.mark.parametrize("ext", ["png", "tif"])
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_16bit_images_scaled_with_a_note(ext, channels, tmp_path):
    hi = RGB.astype(np.uint16) * 257  # 8-bit v -> 16-bit v * 257 (high and low byte v)
    arr16 = {1: hi[..., 0], 3: hi[..., ::-1], 4: np.dstack([hi[..., ::-1], hi[..., 0]])}[channels]
    path = tmp_path / f"x{channels}.{ext}"
    assert cv2.imwrite(str(path), np.ascontiguousarray(arr16))  # cv2: BGR(A) order
    arr, notes = _notes(load_image, path)
    assert arr.dtype == np.uint8 and arr.shape == RGB.shape
    expect = RGB[..., :1].repeat(3, 2) if channels == 1 else RGB
    np.testing.assert_array_equal(arr, expect)
    kind = {1: "grayscale (I;16)", 3: "RGB", 4: "RGBA"}[channels]
    assert notes[0] == f"{path}: 16-bit {kind} image scaled to 8 bits", notes
    assert notes[1:] == ([f"{path}: alpha channel dropped"] if channels == 4 else [])
