"""Procedural synthetic video clips: textured shapes moving over a textured background,
passing in front of and behind each other, with the exact visible mask of every object on
every frame.

Every clip is a pure function of ``(seed, index)``, as the scenes of :mod:`.synthetic` are.
Each object is a sprite (a shape of :data:`.synthetic.SHAPES` with its own fill) that moves on
a straight line at its own speed, turns back at the frame's edges and keeps its depth, so
objects occlude each other, leave the frame in part, and may be hidden for some frames; the
camera pans slowly over a background larger than the frame. :func:`write_clip` writes a clip
as an MP4 (OpenCV) with its ground truth (COCO RLE per object and frame) in a JSON beside it,
which the bundled example clip, ``make demo`` and the video model's evaluation read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .synthetic import SHAPES, _shape_mask, _smooth_noise, _texture

#: the shapes of a clip: every kind but the thin lines (a 3 px line vanishes in a 256 px frame)
CLIP_SHAPES = tuple(k for k in SHAPES if k != "line")


@dataclass
class Clip:
    frames: np.ndarray  # T x H x W x 3 uint8
    masks: np.ndarray  # T x N x H x W bool: the visible part of each object
    kinds: list[str] = field(default_factory=list)


@dataclass
class _Sprite:
    mask: np.ndarray  # h x w bool
    fill: np.ndarray  # h x w x 3 float32
    pos: np.ndarray  # top-left (x, y), float
    vel: np.ndarray  # pixels per frame (x, y)


def _paste(canvas: np.ndarray, layer: np.ndarray, top_left: tuple[int, int], src: np.ndarray):
    """Where ``src`` (h x w bool) is set, write ``layer`` (h x w [x C]) into ``canvas`` at
    ``top_left`` (x, y), clipped to the canvas; returns the canvas-sized mask written."""
    hh, ww = canvas.shape[:2]
    h, w = src.shape
    x, y = top_left
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, ww), min(y + h, hh)
    full = np.zeros((hh, ww), bool)
    if x0 >= x1 or y0 >= y1:
        return full
    part = src[y0 - y : y1 - y, x0 - x : x1 - x]
    full[y0:y1, x0:x1] = part
    region = canvas[y0:y1, x0:x1]
    region[part] = layer[y0 - y : y1 - y, x0 - x : x1 - x][part]
    return full


def make_clip(
    rng: np.random.Generator,
    width: int = 256,
    height: int = 256,
    num_frames: int = 8,
    num_objects: tuple[int, int] = (2, 5),
    speed: tuple[float, float] = (0.01, 0.05),
    pan: float = 0.01,
) -> Clip:
    """One random clip. ``speed``: the range of each object's speed, as a fraction of the
    frame's shorter side per frame; ``pan``: the camera's largest speed, likewise."""
    ref = min(width, height)
    margin = int(np.ceil(pan * ref * num_frames)) + 1
    bg_h, bg_w = height + 2 * margin, width + 2 * margin
    background = _texture(rng, bg_h, bg_w, strength=rng.uniform(0.2, 0.6))
    background = background * 0.8 + _smooth_noise(rng, bg_h, bg_w, 6)[..., None] * 50.0
    cam = rng.uniform(-pan, pan, 2) * ref
    sprites: list[_Sprite] = []
    kinds: list[str] = []
    for _ in range(int(rng.integers(num_objects[0], num_objects[1] + 1))):
        kind = CLIP_SHAPES[int(rng.integers(len(CLIP_SHAPES)))]
        m = _shape_mask(rng, kind, width, height, ref * rng.uniform(0.15, 0.4))
        if m.sum() < 100:
            continue
        ys, xs = np.nonzero(m)
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        angle = rng.uniform(0, 2 * np.pi)
        v = rng.uniform(*speed) * ref * np.array([np.cos(angle), np.sin(angle)])
        fill = _texture(rng, int(y1 - y0), int(x1 - x0), strength=rng.uniform(0.3, 0.8))
        sprites.append(_Sprite(m[y0:y1, x0:x1], fill, np.array([x0, y0], float), v))
        kinds.append(kind)
    frames = np.zeros((num_frames, height, width, 3), np.uint8)
    masks = np.zeros((num_frames, len(sprites), height, width), bool)
    for t in range(num_frames):
        ox, oy = (margin + cam * t).round().astype(int)
        canvas = background[oy : oy + height, ox : ox + width].astype(np.float32)
        for i, s in enumerate(sprites):  # back to front
            h, w = s.mask.shape
            drawn = _paste(canvas, s.fill, (int(round(s.pos[0])), int(round(s.pos[1]))), s.mask)
            masks[t, :i] &= ~drawn
            masks[t, i] = drawn
            # move, turning back when the sprite's centre leaves the frame
            s.pos += s.vel
            centre = s.pos + [w / 2, h / 2]
            for axis, size in ((0, width), (1, height)):
                if not 0 <= centre[axis] <= size:
                    s.vel[axis] = -s.vel[axis]
                    s.pos[axis] += 2 * s.vel[axis]
        canvas = canvas + rng.normal(0, rng.uniform(0, 4), canvas.shape)
        frames[t] = np.clip(canvas, 0, 255).astype(np.uint8)
    return Clip(frames, masks, kinds)


def clip_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(index), 7])


def synthetic_clip(
    seed: int, index: int, width: int = 256, height: int = 256, num_frames: int = 8
) -> Clip:
    """Clip ``index`` of the synthetic clips of ``seed`` (the same on every machine)."""
    return make_clip(clip_rng(seed, index), width, height, num_frames)


def inside_point(mask: np.ndarray) -> tuple[int, int]:
    """A pixel (x, y) of ``mask`` far from its edge: the maximum of the distance transform."""
    import cv2

    dist = cv2.distanceTransform(mask.astype(np.uint8), cv2.DIST_L2, 5)
    y, x = np.unravel_index(int(np.argmax(dist)), dist.shape)
    return int(x), int(y)


def write_clip(clip: Clip, path: str | Path, fps: float = 12.0, overwrite: bool = False) -> Path:
    """The clip as ``path`` (MP4, OpenCV's mp4v) and its ground truth as ``path`` with
    ``.json``: per object its kind and per frame its visible mask (COCO RLE, None where the
    object is not seen), and a click inside each object on the first frame."""
    import cv2

    from ..predict.io import coco_rle

    path = Path(path)
    meta = path.with_suffix(".json")
    for p in (path, meta):
        if p.exists() and not overwrite:
            raise FileExistsError(f"{p} exists; pass overwrite=True to replace it")
    t, h, w = clip.frames.shape[:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    if not writer.isOpened():
        raise OSError(f"OpenCV cannot write {path}")
    for frame in clip.frames:
        writer.write(np.ascontiguousarray(frame[..., ::-1]))
    writer.release()
    objects = []
    for i, kind in enumerate(clip.kinds):
        first = clip.masks[0, i]
        objects.append(
            {
                "id": i + 1,
                "kind": kind,
                "point": list(inside_point(first)) if first.any() else None,
                "masks": [coco_rle(m) if m.any() else None for m in clip.masks[:, i]],
            }
        )
    doc = {"video": path.name, "frames": t, "width": w, "height": h, "fps": fps}
    meta.write_text(json.dumps({**doc, "objects": objects}) + "\n")
    return path


def read_clip_truth(path: str | Path) -> dict:
    """The ground truth :func:`write_clip` wrote beside ``path`` (the video or its JSON), with
    each object's masks decoded to ``T x H x W`` bool (``masks``)."""
    from ..predict.io import decode_coco_rle

    meta = Path(path).with_suffix(".json")
    doc = json.loads(meta.read_text())
    h, w = doc["height"], doc["width"]
    for obj in doc["objects"]:
        obj["masks"] = np.stack(
            [np.zeros((h, w), bool) if r is None else decode_coco_rle(r) for r in obj["masks"]]
        )
    return doc


def _clip_size(rng: np.random.Generator, sizes: list[list[int]] | None) -> tuple[int, int]:
    if not sizes:
        return 256, 256
    w, h = sizes[int(rng.integers(len(sizes)))]
    return int(w), int(h)


def clip_at(spec_data: Any, index: int) -> Clip:
    """Clip ``index`` of a ``ClipSpec`` (a config's clip set: its seed, frames and sizes)."""
    w, h = _clip_size(np.random.default_rng([spec_data.seed, index, 11]), spec_data.sizes)
    return synthetic_clip(spec_data.seed, index, w, h, spec_data.num_frames)
