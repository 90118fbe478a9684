"""The page's exports: an image's labelled objects (a class name and a COCO RLE mask each, as the
page holds them) as a COCO file or as YOLO segmentation labels.

pycocotools encodes the COCO masks (:func:`paddle_sam.predict.io.coco_annotation`: RLE, area,
the mask's own box) and OpenCV traces the YOLO polygons. A client's RLE is parsed and checked
here before any decoding: pycocotools' decoder trusts its run lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from ..predict.io import coco_annotation, coco_document


class ExportError(ValueError):
    """An object the export cannot hold; the message names it."""


def rle_counts(counts: str) -> list[int]:
    """The run lengths of a compressed COCO RLE string (pycocotools' 6-bit character code:
    five bits a character, the sixth says another follows, runs after the second stored as
    differences to the run two before). ValueError for a malformed string."""
    runs: list[int] = []
    p, n = 0, len(counts)
    while p < n:
        x = shift = 0
        while True:
            if p >= n:
                raise ValueError("the counts string ends inside a number")
            c = ord(counts[p]) - 48
            if not 0 <= c < 64:
                raise ValueError(f"character {counts[p]!r} at {p} is not an RLE character")
            p += 1
            x |= (c & 0x1F) << shift
            shift += 5
            if not c & 0x20:
                if c & 0x10:  # the sign bit of the last character
                    x -= 1 << shift
                break
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
    return runs


def decode_rle(rle: dict, height: int, width: int) -> np.ndarray:
    """``height x width`` bool mask of a client's COCO RLE (``{"size": [h, w], "counts":
    str}``), its size and run lengths checked first. ValueError saying what is wrong."""
    size = [int(v) for v in rle["size"]]
    if size != [height, width]:
        raise ValueError(f"its size is {size}, the image's is [{height}, {width}]")
    runs = rle_counts(rle["counts"])
    if any(r < 0 for r in runs):
        raise ValueError("a run length is negative")
    if sum(runs) != height * width:
        raise ValueError(f"its runs cover {sum(runs)} pixels, the image has {height * width}")
    values = np.arange(len(runs)) % 2 == 1  # runs alternate, starting with 0s
    flat = np.repeat(values, runs)
    return flat.reshape(width, height).T  # column-major, as COCO stores it


def class_list(names: Sequence[str], classes: Sequence[str] | None) -> list[str]:
    """The class names in id order: ``classes`` (every name must be in it), or ``names`` in
    order of first appearance."""
    if classes is None:
        return list(dict.fromkeys(names))
    if len(set(classes)) != len(classes):
        raise ExportError("classes lists a name twice")
    missing = [n for n in dict.fromkeys(names) if n not in classes]
    if missing:
        raise ExportError(f"classes lacks {', '.join(repr(n) for n in missing)}")
    return list(classes)


def coco_export(
    file_name: str,
    height: int,
    width: int,
    objects: Sequence[tuple[str, np.ndarray]],
    classes: Sequence[str],
) -> dict:
    """A COCO file of one image: an annotation per ``(class name, mask)``, in order (RLE,
    area, the mask's own bbox, ``category_id``: the name's position in ``classes`` + 1);
    ``categories``: all of ``classes``, so that ids agree across images."""
    annotations = []
    for i, (name, mask) in enumerate(objects, 1):
        ann = coco_annotation(mask, category_id=classes.index(name) + 1)
        if ann is None:
            raise ExportError(f"object {i} ({name!r}) has an empty mask")
        annotations.append(ann)
    categories = [{"id": k, "name": n, "supercategory": ""} for k, n in enumerate(classes, 1)]
    info = {"description": "labelled on the paddle-sam serve page"}
    return coco_document(file_name, height, width, annotations, categories, info)


def mask_polygon(mask: np.ndarray) -> np.ndarray:
    """One polygon (``N x 2`` pixel x, y) around a non-empty mask: its outer contours
    (OpenCV, through the pixel centres), the largest first, each further part joined to it
    by a zero-width bridge between their closest points (YOLO holds one polygon per object;
    holes are not kept). A mask too thin for a polygon (a line, a pixel) gets its box."""
    contours, _ = cv2.findContours(
        mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE
    )
    parts = sorted((c.reshape(-1, 2) for c in contours), key=lambda c: -cv2.contourArea(c))
    main = parts[0]
    detours: dict[int, list[np.ndarray]] = {}
    for part in parts[1:]:
        d = ((main[:, None, :] - part[None, :, :]) ** 2).sum(-1)
        i, j = np.unravel_index(np.argmin(d), d.shape)
        detours.setdefault(int(i), []).append(np.roll(part, -int(j), axis=0))
    points: list[np.ndarray] = []
    for i, p in enumerate(main):
        points.append(p)
        for part in detours.get(i, []):
            points.extend(part)
            points.extend([part[0], p])  # back across the bridge
    polygon = np.asarray(points, dtype=np.float64)
    if len(np.unique(polygon, axis=0)) < 3 or cv2.contourArea(polygon.astype(np.float32)) == 0:
        ys, xs = np.nonzero(mask)
        x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1  # pixel edges
        polygon = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)
    return polygon


def yolo_export(
    height: int, width: int, objects: Sequence[tuple[str, np.ndarray]], classes: Sequence[str]
) -> str:
    """YOLO segmentation labels: a line per ``(class name, mask)``, in order: the class id
    (the name's position in ``classes``) then the polygon's x y pairs divided by the image's
    width and height."""
    lines = []
    for i, (name, mask) in enumerate(objects, 1):
        if not mask.any():
            raise ExportError(f"object {i} ({name!r}) has an empty mask")
        xy = mask_polygon(mask) / np.array([width, height], dtype=np.float64)
        coords = " ".join(f"{v:.6f}" for v in np.clip(xy, 0.0, 1.0).reshape(-1))
        lines.append(f"{classes.index(name)} {coords}")
    return "".join(line + "\n" for line in lines)


__all__ = [
    "ExportError",
    "class_list",
    "coco_export",
    "decode_rle",
    "mask_polygon",
    "rle_counts",
    "yolo_export",
]
