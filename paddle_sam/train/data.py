"""What the dataset readers of both families share: :class:`SkipLog` (bad entries are skipped,
never fatal, and counted with a few named examples), the image and mask readers (the package's
one decoder: its format allow-list and pixel limit) and the COCO segmentation decoder
(polygons, RLE or uncompressed RLE)."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..predict.io import decode_coco_rle, load_image, open_image


@dataclass
class SkipLog:
    """Counts of skipped items by reason, with a few named examples of each."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, where: str) -> None:
        self.counts[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < 3:
            ex.append(where)
            warnings.warn(f"skipped ({reason}): {where}", stacklevel=3)

    def summary(self) -> str:
        if not self.counts:
            return "no data skipped"
        parts = [
            f"{n} x {reason} (e.g. {self.examples[reason][0]})"
            for reason, n in sorted(self.counts.items())
        ]
        return f"skipped {sum(self.counts.values())} items: " + "; ".join(parts)


def read_rgb(path: Path) -> np.ndarray:
    """A dataset image as H x W x 3 uint8 RGB through :func:`~paddle_sam.predict.io.load_image`:
    only its formats (no EPS reaching Ghostscript), at most ``MAX_IMAGE_PIXELS`` (checked
    from the header, before decoding); raises ``ValueError`` / ``FileNotFoundError`` naming
    the file. The stored pixels, as the annotations see them: no EXIF rotation. Its notes
    (alpha dropped, 16-bit scaled) are not repeated for every image of a dataset."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return load_image(path, orient=False)


def unreadable(path: Path, exc: Exception) -> str:
    """A skip note for a file the readers refused: the reader's message, which names the file,
    or Pillow's own (some damaged files raise other errors than ``OSError``) after the path."""
    text = str(exc)
    return text if str(path) in text else f"{path}: {text}"


def read_mask(path: Path) -> np.ndarray:
    """A dataset's instance mask PNG as H x W bool (> 0 inside, after conversion to 8-bit
    grayscale), read like :func:`read_rgb`."""
    im = open_image(path, str(path), orient=False)
    return np.asarray(im.convert("L")) > 0


def decode_segmentation(seg, h: int, w: int, where: str, skips: SkipLog) -> np.ndarray | None:
    """A COCO segmentation (polygons, RLE or uncompressed RLE) -> H x W bool, or None."""
    from pycocotools import mask as mask_utils

    if isinstance(seg, list):
        polys = [p for p in seg if isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0]
        if not polys:
            skips.add("empty annotation", where)
            return None
        for p in polys:
            xy = np.asarray(p, dtype=np.float64).reshape(-1, 2)
            if (xy < -1).any() or (xy[:, 0] > w + 1).any() or (xy[:, 1] > h + 1).any():
                skips.add("polygon outside the image", f"{where} (image {w}x{h})")
                return None
        rle = mask_utils.merge(mask_utils.frPyObjects(polys, h, w))
    elif isinstance(seg, dict) and "counts" in seg and "size" in seg:
        if [int(v) for v in seg["size"]] != [h, w]:
            skips.add("mask size differs from the image", f"{where}: {seg['size']} vs {[h, w]}")
            return None
        rle = dict(seg)
        if isinstance(rle["counts"], list):
            rle = mask_utils.frPyObjects(rle, h, w)
        elif isinstance(rle["counts"], str):
            rle["counts"] = rle["counts"].encode("ascii")
    else:
        skips.add("empty annotation", where)
        return None
    mask = decode_coco_rle(rle)
    if not mask.any():
        skips.add("empty annotation", where)
        return None
    return mask
