"""Video tracking results out: per-object mask PNGs, a YouTube-VIS style results.json and an
overlay MP4."""

from __future__ import annotations

import colorsys
import json
import math
import operator
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import cv2
import numpy as np

from .io import coco_bbox, coco_rle, save_mask_png

#: frames per second of the overlay video when the source's rate is unknown
DEFAULT_FPS = 10.0

# one tracked object on one frame: (COCO RLE, bbox xywh or None, area, score)
_Entry = tuple[dict, list[int] | None, int, float]


class TrackWriter:
    """Writes the masks of a video tracking run to ``out_dir`` as they come, frame by frame.

    - ``masks/<obj_id>/<frame_idx:05d>.png``: 0/255 masks, written by :meth:`add`;
    - ``results.json``: YouTube-VIS style annotations, one per object id in the order the
      writer first sees it, with a COCO RLE, box, area and score per frame (``null`` for frames
      not tracked), written by :meth:`close`;
    - ``overlay.mp4``: the tracked frames in increasing index order, objects coloured, outlined
      and labelled with id and score, rendered by :meth:`close` from the stored RLEs and
      ``frame_rgb(i)`` (black frames without it). Odd sizes are padded to even with black
      (the MPEG-4 encoder needs even sizes).

    Only the RLEs stay in memory, never frames. Adding a frame again replaces the entries of
    the objects it names on that frame (re-propagation after a correction); the other objects'
    entries on that frame stay. Nothing is deleted; ``out_dir`` is created if missing.
    Used as a context manager, it closes on normal exit; on an exception it releases the video
    writer, leaves the files written so far and writes no results.json.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        height: int,
        width: int,
        num_frames: int,
        fps: float | None = None,
        source: str = "",
        write_pngs: bool = True,
        write_video: bool = True,
        frame_rgb: Callable[[int], np.ndarray] | None = None,
        category: str = "object",
        file_names: Sequence[str] | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ValueError(f"output folder {self.out_dir} exists and is not a folder")
        self.height = _positive_int(height, "height")
        self.width = _positive_int(width, "width")
        self.num_frames = _positive_int(num_frames, "num_frames")
        if fps is not None and not (math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps must be a positive number, got {fps}")
        if file_names is not None:
            file_names = [str(name) for name in file_names]
            if len(file_names) != self.num_frames:
                raise ValueError(
                    f"{len(file_names)} file names for a video of {self.num_frames} frames"
                )
        self.fps = None if fps is None else float(fps)
        self.source = str(source)
        self.write_pngs = write_pngs
        self.write_video = write_video
        self.frame_rgb = frame_rgb
        self.category = category
        self.file_names = file_names
        self._frames: dict[int, dict[int, _Entry]] = {}
        self._objects: list[int] = []  # in order of first appearance
        self._summary: dict | None = None
        self._writer: cv2.VideoWriter | None = None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if write_video:  # fail before a long tracking run, not after it
            self._writer = self._open_video()

    @property
    def results_path(self) -> Path:
        return self.out_dir / "results.json"

    @property
    def video_path(self) -> Path:
        return self.out_dir / "overlay.mp4"

    def mask_path(self, obj_id: int, frame_idx: int) -> Path:
        return self.out_dir / "masks" / str(obj_id) / f"{frame_idx:05d}.png"

    def add(
        self,
        frame_idx: int,
        obj_ids: Sequence[int],
        masks: np.ndarray,
        scores: np.ndarray | Sequence[float],
    ) -> None:
        """Record frame ``frame_idx``: ``masks`` N x H x W (bool, or logits / values with > 0 as
        foreground), ``scores`` the N objects' presence probabilities in [0, 1]."""
        if self._summary is not None:
            raise RuntimeError("TrackWriter is closed")
        try:
            frame_idx = operator.index(frame_idx)
        except TypeError:
            raise ValueError(f"frame index must be an integer, got {frame_idx!r}") from None
        if not 0 <= frame_idx < self.num_frames:
            raise ValueError(
                f"frame index {frame_idx} out of range [0, {self.num_frames}) of the video"
            )
        masks = np.asarray(masks)
        if masks.ndim != 3 or masks.shape[1:] != (self.height, self.width):
            raise ValueError(
                f"frame {frame_idx}: masks of shape {masks.shape}, expected "
                f"(N, {self.height}, {self.width})"
            )
        n = masks.shape[0]
        try:
            ids = [operator.index(i) for i in obj_ids]
        except TypeError:
            raise ValueError(f"frame {frame_idx}: object ids must be integers") from None
        scores = np.asarray(scores, dtype=np.float64).reshape(-1)
        if len(ids) != n or len(scores) != n:
            raise ValueError(
                f"frame {frame_idx}: {n} masks, {len(ids)} object ids and {len(scores)} scores "
                "(must be equal)"
            )
        if len(set(ids)) != n:
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"frame {frame_idx}: duplicate object ids {dup}")
        bad = ~np.isfinite(scores) | (scores < 0) | (scores > 1)
        if bad.any():
            raise ValueError(
                f"frame {frame_idx}: scores must be probabilities in [0, 1], got "
                f"{scores[bad].tolist()}"
            )
        fg = masks if masks.dtype == bool else masks > 0
        entries = self._frames.setdefault(frame_idx, {})
        for obj_id, mask, score in zip(ids, fg, scores, strict=True):
            if obj_id not in self._objects:
                self._objects.append(obj_id)
            area = int(mask.sum())
            entries[obj_id] = (
                coco_rle(mask),
                coco_bbox(mask) if area else None,
                area,
                float(score),
            )
            if self.write_pngs:
                path = self.mask_path(obj_id, frame_idx)
                path.parent.mkdir(parents=True, exist_ok=True)
                save_mask_png(mask, path)

    def close(self) -> dict:
        """Render the overlay video, write results.json and return a summary: ``{"frames": n
        frames added, "objects": [{"obj_id", "frames", "score"}...], "files": {...}}``. Calling
        it again returns the same summary."""
        if self._summary is not None:
            return self._summary
        if self._writer is not None:
            try:
                self._render_video(self._writer)
            finally:
                self._release()
        results = self.results()
        with open(self.results_path, "w", encoding="utf-8") as f:
            json.dump(results, f)
        objects = [
            {
                "obj_id": ann["obj_id"],
                "frames": sum(1 for a in ann["areas"] if a),
                "score": ann["score"],
            }
            for ann in results["annotations"]
        ]
        self._summary = {
            "frames": len(self._frames),
            "objects": objects,
            "files": {
                "results": str(self.results_path),
                "video": str(self.video_path) if self.write_video else None,
                "masks": str(self.out_dir / "masks") if self.write_pngs else None,
            },
        }
        return self._summary

    def results(self) -> dict:
        """The results.json content (YouTube-VIS style) for the frames added so far."""
        annotations = []
        for k, obj_id in enumerate(self._objects, start=1):
            per_frame = [self._frames.get(i, {}).get(obj_id) for i in range(self.num_frames)]
            scores = [e[3] for e in per_frame if e is not None]
            annotations.append(
                {
                    "id": k,
                    "video_id": 1,
                    "category_id": 1,
                    "obj_id": obj_id,
                    "iscrowd": 0,
                    "segmentations": [None if e is None else e[0] for e in per_frame],
                    "bboxes": [None if e is None else e[1] for e in per_frame],
                    "areas": [None if e is None else e[2] for e in per_frame],
                    "scores": [None if e is None else e[3] for e in per_frame],
                    "score": float(np.mean(scores)) if scores else None,
                }
            )
        return {
            "info": {"source": self.source, "fps": self.fps, "description": "paddle-sam track"},
            "videos": [
                {
                    "id": 1,
                    "width": self.width,
                    "height": self.height,
                    "length": self.num_frames,
                    "file_names": self.file_names,
                }
            ],
            "categories": [{"id": 1, "name": self.category}],
            "annotations": annotations,
        }

    def __enter__(self) -> TrackWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._release()

    def _open_video(self) -> cv2.VideoWriter:
        size = (self.width + self.width % 2, self.height + self.height % 2)
        fps = self.fps or DEFAULT_FPS
        writer = cv2.VideoWriter(str(self.video_path), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
        if not writer.isOpened():
            writer.release()
            raise RuntimeError(
                f"could not open an MP4 (mp4v) video writer for {self.video_path} "
                f"({size[0]}x{size[1]} at {fps} fps); pass write_video=False to skip the video"
            )
        return writer

    def _release(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None

    def _render_video(self, writer: cv2.VideoWriter) -> None:
        h, w = self.height, self.width
        for i in sorted(self._frames):
            if self.frame_rgb is None:
                frame = np.zeros((h, w, 3), np.uint8)
            else:
                frame = _as_rgb(self.frame_rgb(i), i, h, w)
            frame = draw_objects(frame, self._frames[i])
            if frame.shape[:2] != (h + h % 2, w + w % 2):
                frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)))
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))


def obj_color(obj_id: int) -> tuple[int, int, int]:
    """A fixed, saturated RGB colour for an object id (hues spread by the golden ratio), the
    same in every frame and every run; far from any grey, so it shows on any frame."""
    hue = (0.6 + obj_id * 0.618033988749895) % 1.0
    return tuple(round(255 * c) for c in colorsys.hsv_to_rgb(hue, 0.85, 1.0))


def draw_objects(frame: np.ndarray, entries: dict[int, _Entry], alpha: float = 0.5) -> np.ndarray:
    """H x W x 3 uint8 RGB frame with each object's mask blended in its colour, outlined, and
    labelled ``<obj_id> <score>`` at the top-left of its box."""
    from .io import decode_coco_rle

    out = frame.astype(np.float64)
    decoded = []
    for obj_id, (rle, box, _, score) in entries.items():
        if box is None:  # empty mask: nothing to draw
            continue
        m = decode_coco_rle(rle)
        color = np.array(obj_color(obj_id), np.float64)
        out[m] = (1 - alpha) * out[m] + alpha * color
        decoded.append((obj_id, m, box, score))
    img = np.ascontiguousarray(np.clip(np.round(out), 0, 255).astype(np.uint8))
    scale = max(0.35, min(frame.shape[:2]) / 800)
    thick = max(1, round(scale * 2))
    for obj_id, m, box, score in decoded:
        color = obj_color(obj_id)
        contours, _ = cv2.findContours(
            m.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE
        )
        cv2.drawContours(img, contours, -1, color, thick)
        text = f"{obj_id} {score:.2f}"
        (_, th), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)
        org = (int(box[0]), max(int(box[1]) - 3, th + 1))
        for c, t in (((0, 0, 0), thick + 2), (color, thick)):  # dark edge, then the colour
            cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, c, t, cv2.LINE_AA)
    return img


def _as_rgb(image: np.ndarray, i: int, h: int, w: int) -> np.ndarray:
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    if arr.shape != (h, w, 3):
        raise ValueError(f"frame_rgb({i}) returned shape {arr.shape}, expected ({h}, {w}, 3)")
    if arr.dtype != np.uint8:
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    return arr


def _positive_int(value: int, name: str) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value
