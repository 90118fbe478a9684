"""Image files in, mask files out: loading with clear errors, mask PNGs and overlays."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, ImageDraw, ImageOps, UnidentifiedImageError

# well above any camera image, well below what would exhaust memory on a small machine
MAX_IMAGE_PIXELS = 100_000_000

#: the image formats decoded (Pillow's names; phones' multi-picture JPEGs open as JPEG).
#: Nothing else reaches a decoder: EPS / PostScript would run Ghostscript, PDF, PSD, ICO and
#: the rest are refused by name.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF")
#: file name endings of those formats, for listing a folder's images
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


class ImageTooLargeError(ValueError):
    """An image whose pixel count is above the allowed limit (decompression bombs included)."""


def load_image(
    path: str | os.PathLike, max_pixels: int | None = None, *, orient: bool = True
) -> np.ndarray:
    """Read an image file as H x W x 3 uint8 RGB, honouring EXIF orientation (unless
    ``orient`` is false: dataset annotations are drawn on the stored pixels).

    Only the formats of :data:`IMAGE_FORMATS` are read. Grayscale, palette and CMYK images
    are converted to RGB; RGBA loses its alpha channel (a warning says so); 16-bit images,
    grayscale or colour, are scaled to 8 bits (a warning says so). Images over ``max_pixels``
    (default: :data:`MAX_IMAGE_PIXELS`, read at call time) are refused.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    return decode_image(path, str(path), max_pixels, orient=orient)


@contextlib.contextmanager
def _checked_image(
    source: str | os.PathLike | BinaryIO, name: str, max_pixels: int | None
) -> Iterator[Image.Image]:
    """The one way an image file is opened: Pillow's opener restricted to
    :data:`IMAGE_FORMATS`, the pixel count checked from the header before any pixel is
    decoded. Errors from the block (decoding a damaged file) are mapped like those of the
    opening: :class:`ImageTooLargeError` or ``ValueError``, each starting with ``name``."""
    if max_pixels is None:
        max_pixels = MAX_IMAGE_PIXELS
    start = _position(source)
    try:
        with warnings.catch_warnings():
            # our own limit below is the one that applies, not PIL's lower warning threshold
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source, formats=IMAGE_FORMATS) as im:
                if im.width * im.height > max_pixels:
                    raise ImageTooLargeError(
                        f"{name}: {im.width}x{im.height} pixels is above the limit of "
                        f"{max_pixels} pixels"
                    )
                yield im
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"{name}: image too large ({exc})") from exc
    except UnidentifiedImageError as exc:
        other = _other_format(source, start)
        if other is not None:
            raise ValueError(
                f"{name}: {other} images are not read (formats read: {', '.join(IMAGE_FORMATS)})"
            ) from None
        raise ValueError(
            f"{name}: not a readable image ({exc}; formats read: {', '.join(IMAGE_FORMATS)})"
        ) from exc
    except OSError as exc:  # truncated or damaged files
        raise ValueError(f"{name}: damaged or truncated image ({exc})") from exc


def image_size(
    source: str | os.PathLike | BinaryIO, name: str = "image", max_pixels: int | None = None
) -> tuple[int, int]:
    """``(width, height)`` of an image file from its header alone (no pixel decoded), with the
    checks of :func:`decode_image`: the format allow-list and ``max_pixels``."""
    with _checked_image(source, name, max_pixels) as im:
        return im.size


def open_image(
    source: str | os.PathLike | BinaryIO,
    name: str = "image",
    max_pixels: int | None = None,
    *,
    orient: bool = True,
) -> Image.Image:
    """The decoded Pillow image of ``source`` (its own mode, pixels loaded), with the checks
    of :func:`decode_image`; EXIF orientation applied if ``orient``. For readers that need
    another conversion than RGB (a dataset's mask PNGs)."""
    with _checked_image(source, name, max_pixels) as im:
        im.load()
        return ImageOps.exif_transpose(im) if orient else im


def decode_image(
    source: str | os.PathLike | BinaryIO,
    name: str = "image",
    max_pixels: int | None = None,
    *,
    orient: bool = True,
) -> np.ndarray:
    """:func:`load_image` for a path or an open binary file (e.g. an upload in memory).

    ``name`` starts every error and warning message. Raises :class:`ImageTooLargeError` over
    ``max_pixels`` and ``ValueError`` for anything that is not a readable image, a format
    outside :data:`IMAGE_FORMATS` included (named when Pillow knows it).
    """
    with _checked_image(source, name, max_pixels) as im:
        wide = _16bit_colour(im)  # the tiles say so before loading, not after
        im.load()
        if orient:
            im = ImageOps.exif_transpose(im)
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(im).astype(np.float64)
        top = 65535.0 if arr.max(initial=0) > 255 or im.mode.startswith("I;16") else 255.0
        depth = "16-bit" if im.mode.startswith("I;16") else "integer"
        warnings.warn(f"{name}: {depth} grayscale ({im.mode}) image scaled to 8 bits", stacklevel=2)
        arr = np.clip(np.round(arr * 255.0 / top), 0, 255).astype(np.uint8)
        return np.repeat(arr[..., None], 3, axis=2)
    if wide:  # Pillow has already kept the high byte of each sample
        warnings.warn(f"{name}: 16-bit {im.mode} image scaled to 8 bits", stacklevel=2)
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        warnings.warn(f"{name}: alpha channel dropped", stacklevel=2)
    if im.mode == "F":
        raise ValueError(f"{name}: floating-point images are not supported; save it as 8-bit")
    return np.asarray(im.convert("RGB"))


class OutsideRootError(ValueError):
    """A dataset's file name that is not a file inside its image folder."""


def resolve_under(root: str | os.PathLike, file_name: str) -> Path:
    """``root / file_name`` for a file name read from a dataset (a COCO ``file_name``), once it
    is known to stay inside ``root``; else :class:`OutsideRootError`.

    Refused: absolute names, any ``..`` component, and names that lead out of ``root`` through
    a symlink inside it (symlinks are resolved; ``root`` itself may be a symlink). The decision
    is made from the name and the links inside ``root`` only, and the message is the same
    whether or not a file exists at the place the name points to, so a dataset file cannot be
    used to probe the disk."""
    root = Path(root)
    refused = OutsideRootError(
        f"file_name {file_name!r} is not a file name inside the image folder {root} "
        "(absolute names, '..' and symlinks leading out of it are refused)"
    )
    if not isinstance(file_name, str) or "\x00" in file_name:
        raise refused
    parts = PurePosixPath(file_name).parts
    if not parts or PurePosixPath(file_name).is_absolute() or ".." in parts:
        raise refused
    top = Path(os.path.realpath(root))
    # realpath without strict: no error for a missing file, and nothing beyond lstat per
    # component; a loop or an unreadable link ends up outside ``top`` or raises
    try:
        real = Path(os.path.realpath(root / file_name))
    except (OSError, ValueError, RuntimeError):
        raise refused from None
    if real == top or not real.is_relative_to(top):
        raise refused
    return root / file_name


def _16bit_colour(im: Image.Image) -> bool:
    """A 16-bit colour image (48-bit RGB, 64-bit RGBA, 16-bit LA), which Pillow opens as an
    8-bit mode: its tiles' raw mode (``RGB;16B``, ``RGBA;16N``...) still says 16 bits."""
    if im.mode.startswith("I"):
        return False
    for tile in im.tile:
        args = tile[3]
        raw = args[0] if isinstance(args, tuple) and args else args
        if isinstance(raw, str) and ";16" in raw:
            return True
    return False


# formats Pillow recognises by a distinctive signature, named when refused (formats without
# one, such as TGA, or with a short one that other files can match, are left unnamed)
_NAMED_FORMATS = ("AVIF", "BLP", "DDS", "FITS", "ICNS", "ICO", "JPEG2000", "PSD", "QOI")


def _position(source: str | os.PathLike | BinaryIO) -> int | None:
    if isinstance(source, str | os.PathLike):
        return None
    try:
        return source.tell()
    except (OSError, AttributeError, ValueError):
        return None


def _other_format(source: str | os.PathLike | BinaryIO, start: int | None) -> str | None:
    """The name of a format we do not read (EPS, PDF, PSD...), from its first bytes only:
    no decoder of it runs. ``start``: where an open file's image began."""
    try:
        if isinstance(source, str | os.PathLike):
            with open(source, "rb") as f:
                prefix = f.read(64)
        elif start is None:
            return None
        else:
            source.seek(start)
            prefix = source.read(64)
            source.seek(start)
    except (OSError, ValueError):
        return None
    if prefix[:4] in (b"%!PS", b"\xc5\xd0\xd3\xc6"):
        return "EPS/PostScript"
    if prefix[:5] == b"%PDF-":
        return "PDF"
    Image.init()
    for fmt in _NAMED_FORMATS:
        accept = Image.OPEN.get(fmt, (None, None))[1]
        try:
            if accept is not None and accept(prefix):
                return fmt
        except Exception:  # a plugin's own test on too short a prefix
            continue
    return None


def save_mask_png(mask: np.ndarray, path: str | os.PathLike) -> None:
    """H x W bool mask -> 8-bit PNG (255 inside, 0 outside)."""
    Image.fromarray(np.asarray(mask, dtype=bool).astype(np.uint8) * 255).save(path)


def coco_rle(mask: np.ndarray) -> dict:
    """COCO run-length encoding of an ``H x W`` mask (pycocotools), JSON-ready: ``{"size":
    [H, W], "counts": str}``."""
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def coco_bbox(mask: np.ndarray) -> list[int]:
    """Tight COCO ``[x, y, w, h]`` box of a non-empty ``H x W`` mask, in whole pixels (as
    pycocotools' ``toBbox``)."""
    ys = np.flatnonzero(mask.any(axis=1))
    xs = np.flatnonzero(mask.any(axis=0))
    return [int(xs[0]), int(ys[0]), int(xs[-1] - xs[0] + 1), int(ys[-1] - ys[0] + 1)]


def coco_annotation(mask: np.ndarray, **fields: Any) -> dict | None:
    """A COCO annotation of an ``H x W`` mask: its RLE, area and bbox (the mask's own box, as
    COCO defines it: a detector's box goes in ``fields`` under another key), ``iscrowd`` 0,
    then ``fields``. None for an empty mask, which COCO cannot hold."""
    area = int(np.count_nonzero(mask))
    if not area:
        return None
    return {
        "segmentation": coco_rle(mask),
        "area": area,
        "bbox": coco_bbox(mask),
        "iscrowd": 0,
        **fields,
    }


def coco_document(
    file_name: str,
    height: int,
    width: int,
    annotations: list[dict],
    categories: list[dict],
    info: dict | None = None,
) -> dict:
    """A COCO file of one image (id 1): ``annotations`` (from :func:`coco_annotation`) get
    ``id`` 1, 2, ... and ``image_id`` 1; ``info`` holds how they were made."""
    return {
        "info": info or {},
        "images": [{"id": 1, "file_name": file_name, "height": int(height), "width": int(width)}],
        "annotations": [{"id": i, "image_id": 1, **a} for i, a in enumerate(annotations, 1)],
        "categories": categories,
    }


def decode_coco_rle(rle: dict) -> np.ndarray:
    """``H x W`` bool mask of a COCO RLE (``counts`` bytes or the JSON string of
    :func:`coco_rle`). pycocotools' decoder under NumPy 2 warns on every call (its ``__array__``
    lacks the ``copy`` keyword): that warning is silenced here, no other."""
    from pycocotools import mask as mask_utils

    if isinstance(rle.get("counts"), str):
        rle = {**rle, "counts": rle["counts"].encode("ascii")}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
        return mask_utils.decode(rle).astype(bool)


# Label Studio's brush format packs (flag, size index, run length - 1, value) fields; a run
# of equal values gets one field with the smallest of these length widths that holds it
_LS_RUN_BITS = (3, 4, 8, 16)


def label_studio_rle(mask: np.ndarray) -> list[int]:
    """Label Studio's brush RLE of an ``H x W`` mask, as its ``value.rle``: the mask as RGBA
    bytes (255 inside in every channel, 0 outside) packed in Label Studio's bit format (32-bit
    value count, word size 8, run-length widths 3, 4, 8 and 16 bits), one field per run of
    equal bytes (runs above 65536 bytes split)."""
    flat = np.asarray(mask, dtype=bool).ravel()
    n = flat.size * 4
    if flat.size == 0:
        raise ValueError("label_studio_rle: the mask is empty (0 pixels)")
    # runs of equal pixels; each pixel is 4 equal bytes
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    starts = np.concatenate(([0], change))
    lengths = np.diff(np.concatenate((starts, [flat.size]))) * 4
    values = np.where(flat[starts], 255, 0)
    # split runs longer than the widest field holds
    pieces = -(-lengths // (1 << _LS_RUN_BITS[-1]))
    values = np.repeat(values, pieces)
    run_id = np.repeat(np.arange(len(lengths)), pieces)
    first = np.concatenate(([0], np.cumsum(pieces)[:-1]))
    offset = np.arange(len(run_id)) - first[run_id]
    lengths = np.minimum(lengths[run_id] - offset * (1 << _LS_RUN_BITS[-1]), 1 << _LS_RUN_BITS[-1])
    widths = np.asarray(_LS_RUN_BITS)
    size_index = np.searchsorted(1 << widths, lengths)  # smallest width with 2**width >= length
    # fields per run: flag 1 bit (always a repeat), size index 2, length - 1, value 8
    field_values = np.stack(
        [np.ones_like(lengths), size_index, lengths - 1, values], axis=1
    ).ravel()
    field_widths = np.stack(
        [
            np.ones_like(lengths),
            np.full_like(lengths, 2),
            widths[size_index],
            np.full_like(lengths, 8),
        ],
        axis=1,
    ).ravel()
    header_values = np.array([n, 7, *(w - 1 for w in _LS_RUN_BITS)], dtype=np.int64)
    header_widths = np.array([32, 5, 4, 4, 4, 4], dtype=np.int64)
    field_values = np.concatenate((header_values, field_values.astype(np.int64)))
    field_widths = np.concatenate((header_widths, field_widths.astype(np.int64)))
    # every field's bits, most significant first
    bit_field = np.repeat(np.arange(len(field_widths)), field_widths)
    field_start = np.concatenate(([0], np.cumsum(field_widths)[:-1]))
    shift = field_widths[bit_field] - 1 - (np.arange(len(bit_field)) - field_start[bit_field])
    bits = ((field_values[bit_field] >> shift) & 1).astype(np.uint8)
    return np.packbits(bits).tolist()


def _palette(n: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(40, 256, size=(max(n, 1), 3)).astype(np.float64)


def overlay(
    image: np.ndarray,
    masks: list[np.ndarray],
    alpha: float = 0.5,
    points: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    boxes: np.ndarray | None = None,
    captions: list[str] | None = None,
) -> Image.Image:
    """Blend coloured masks over the image and draw prompts (green +, red -) and boxes."""
    out = image.astype(np.float64).copy()
    colors = _palette(len(masks)) if len(masks) > 1 else np.array([[30.0, 144.0, 255.0]])
    for mask, color in zip(masks, colors, strict=False):
        m = np.asarray(mask, dtype=bool)
        out[m] = (1 - alpha) * out[m] + alpha * color
    pil = Image.fromarray(np.clip(out, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    r = max(3, round(0.008 * max(image.shape[:2])))
    for i, (x, y) in enumerate(np.asarray(points if points is not None else np.zeros((0, 2)))):
        fg = labels is None or labels[i] == 1
        draw.ellipse(
            [x - r, y - r, x + r, y + r],
            fill=(0, 200, 0) if fg else (220, 0, 0),
            outline=(255, 255, 255),
        )
    for i, b in enumerate(np.asarray(boxes if boxes is not None else np.zeros((0, 4)))):
        draw.rectangle(list(map(float, b)), outline=(0, 255, 0), width=max(2, r // 2))
        if captions and i < len(captions):
            draw.text((float(b[0]) + 3, float(b[1]) + 2), captions[i], fill=(255, 255, 255))
    return pil
