"""Generated videos for the tracker's tests: moving shapes on a textured ground, written as
real files (JPEG / PNG frames, MP4 through OpenCV)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def scene(num_frames: int = 8, h: int = 60, w: int = 80) -> list[np.ndarray]:
    """RGB frames: a red square moving right, a blue disc that leaves through the bottom edge
    on frames 3-5 and comes back, a static green bar (sizes scale with ``h`` and ``w``)."""
    yy, xx = np.mgrid[:h, :w]
    sy, sx = h / 60, w / 80
    frames = []
    for t in range(num_frames):
        img = np.stack(
            [40 + 20 * np.sin(xx / (5.0 * sx)), 60 + 20 * np.cos(yy / (4.0 * sy)), 50 + 0 * xx],
            -1,
        ).astype(np.uint8)
        x0 = int((8 + 5 * t) * sx)
        img[int(15 * sy) : int(33 * sy), x0 : x0 + int(18 * sx)] = (220, 30, 30)
        cy = (40 + (25 if 3 <= t <= 5 else 0)) * sy
        img[((yy - cy) / sy) ** 2 + ((xx - 55 * sx) / sx) ** 2 <= 64] = (30, 40, 220)
        img[int(4 * sy) : int(10 * sy), int(60 * sx) : int(76 * sx)] = (30, 200, 60)
        frames.append(img)
    return frames


def textured_ground(h: int, w: int) -> np.ndarray:
    """An ``h x w x 3`` float32 ground of slow colour waves, 40 to 110 in each channel (the
    full-size trackers' videos: shapes drawn on it, then noise)."""
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    return np.stack(
        [
            70 + 30 * np.sin(xx / 23.0) * np.cos(yy / 31.0),
            90 + 25 * np.cos(yy / 17.0),
            60 + 20 * np.sin((xx + yy) / 41.0),
        ],
        -1,
    )


def write_frames(frames: list[np.ndarray], folder: Path, ext: str = ".jpg") -> Path:
    """Frames as ``0.jpg``, ``1.jpg``, ... (JPEG quality 95) or other ``ext`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, frame in enumerate(frames):
        options = {"quality": 95} if ext == ".jpg" else {}
        Image.fromarray(frame).save(folder / f"{i}{ext}", **options)
    return folder


def write_mp4(frames: list[np.ndarray], path: Path, fps: float = 10.0) -> Path:
    """Frames as an MPEG-4 (mp4v) file written by OpenCV."""
    import cv2

    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    for frame in frames:
        writer.write(np.ascontiguousarray(frame[:, :, ::-1]))
    writer.release()
    return path
