"""Memory of SAM 3 video tracking as the video gets longer: process RSS and the bytes held by
the tracker's state after each propagated frame, at the released sizes (1008 px, 72 x 72
memories), on a generated 720p MP4 read through ``paddle_sam.predict.video``.

The tracker keeps, as upstream, every tracked frame's outputs (a bfloat16 memory and the
288 x 288 mask logits per object) so that clicks on any frame can correct it; frames
themselves are decoded on demand (a small LRU cache). So memory is a fixed part (weights,
frame cache, activations of one frame) plus a linear part per frame and object; this script
measures both and extrapolates to a minute of video.

``--features random`` (default) feeds random backbone features of the right shapes instead of
running the 1008 px ViT on each frame: the backbone's activations are freed after each frame
and do not change the growth, and the run takes minutes instead of an hour. ``--features
backbone`` runs the real backbone (random weights).

    python benchmarks/bench_sam3_tracker_memory.py --frames 16 --objects 2
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def state_bytes(state: dict) -> int:
    """Bytes of the distinct tensors held in the tracker's outputs (per-object entries are
    views of the consolidated ones and share their memory)."""
    seen: dict[int, int] = {}

    def walk(x) -> None:
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)
        elif hasattr(x, "data_ptr") and hasattr(x, "numel"):
            size = int(x.numel()) * x.element_size()
            ptr = x.data_ptr()
            seen[ptr] = max(seen.get(ptr, 0), size)

    walk(state["output_dict"])
    walk(state["output_dict_per_obj"])
    return sum(seen.values())


def write_video(path: Path, frames: int, h: int, w: int, fps: float) -> None:
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    yy, xx = np.mgrid[:h, :w]
    for t in range(frames):
        img = np.stack([(xx + 7 * t) % 256, (yy + 3 * t) % 256, (xx + yy) % 256], -1)
        img = img.astype(np.uint8)
        img[200:400, 100 + 20 * t : 300 + 20 * t] = (30, 30, 220)
        writer.write(img)
    writer.release()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=16, help="frames to track (default 16)")
    p.add_argument("--objects", type=int, default=2, help="objects clicked on frame 0")
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--fps", type=float, default=30.0, help="for the per-minute figure")
    p.add_argument("--features", choices=("random", "backbone"), default="random")
    p.add_argument("--csv", default="benchmarks/results/sam3_tracker_memory.csv")
    args = p.parse_args(argv)

    import paddle

    from paddle_sam.loading.sam3 import build_tracker

    rss_start = rss_mb()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tracker = build_tracker(with_backbone=args.features == "backbone")
    rss_model = rss_mb()
    side = tracker.image_size // tracker.backbone_stride
    rng = np.random.default_rng(0)

    def random_features(frame_idx: int) -> dict:
        sizes = (4 * side, 2 * side, side)
        raw = {
            key: [paddle.to_tensor(rng.standard_normal((1, 256, s, s), np.float32)) for s in sizes]
            for key in ("backbone_fpn", "vision_pos_enc")
        }
        return tracker.prepare_backbone_out(raw)

    with tempfile.TemporaryDirectory() as tmp:
        video = Path(tmp) / "clip.mp4"
        write_video(video, args.frames, args.height, args.width, args.fps)
        state = tracker.init_state(
            video_path=str(video),
            image_feature_fn=random_features if args.features == "random" else None,
        )
        for k in range(args.objects):
            x = (0.2 + 0.6 * k / max(args.objects - 1, 1), 0.4)
            tracker.add_new_points_or_box(state, 0, k + 1, [x], [1])
        rows = []
        t0 = time.perf_counter()
        for frame_idx, *_ in tracker.propagate_in_video(
            state, 0, None, False, propagate_preflight=True
        ):
            rows.append(
                {
                    "frame": frame_idx,
                    "rss_mb": round(rss_mb(), 1),
                    "state_mb": round(state_bytes(state) / 2**20, 2),
                    "frames_cached": state["images"].cached_count(),
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )
    # linear growth from the second half of the run (the first frames warm caches up)
    half = rows[len(rows) // 2 :]
    n = half[-1]["frame"] - half[0]["frame"]
    rss_per_frame = (half[-1]["rss_mb"] - half[0]["rss_mb"]) / max(n, 1)
    state_per_frame = (half[-1]["state_mb"] - half[0]["state_mb"]) / max(n, 1)
    per_minute = 60 * args.fps
    fixed = rows[-1]["rss_mb"] - rows[-1]["state_mb"]
    from bench_sam3_tracker import cpu_flags
    from bench_sam_v1 import _cpu_model

    name, flags = _cpu_model(), cpu_flags()
    print(
        f"CPU: {name} ({os.cpu_count()} logical CPUs; flags: {flags}); paddle {paddle.__version__}"
    )
    print(
        f"video {args.width}x{args.height}, {args.frames} frames tracked, {args.objects} objects, "
        f"features: {args.features}"
    )
    print("| frame | RSS MB | state MB | frames cached | s |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            "| "
            + " | ".join(
                str(r[k]) for k in ("frame", "rss_mb", "state_mb", "frames_cached", "seconds")
            )
            + " |"
        )
    print(
        f"\nRSS before the model {rss_start:.0f} MB, after building it {rss_model:.0f} MB, "
        f"peak {peak_rss_mb():.0f} MB"
    )
    print(
        f"state per frame: {state_per_frame:.3f} MB for {args.objects} objects "
        f"({state_per_frame / args.objects:.3f} MB per object); RSS growth per frame "
        f"{rss_per_frame:.3f} MB"
    )
    print(
        f"one minute at {args.fps:g} fps ({per_minute:.0f} frames): about "
        f"{fixed:.0f} MB + {per_minute * state_per_frame:.0f} MB of state = "
        f"{fixed + per_minute * state_per_frame:.0f} MB for {args.objects} objects"
    )
    out = Path(args.csv)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
