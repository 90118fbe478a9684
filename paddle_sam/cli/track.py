"""``paddle-sam track``: follow clicked or boxed objects through a video with SAM 3's tracker.

Prompts are given in the video's pixels on any frame; ``--obj-id N`` sets the object of the
``--point`` / ``--box`` options that follow it (object 1 before any ``--obj-id``). Every prompt
is added before tracking starts (the tracker takes no new objects after that), then the
objects are propagated forward from ``--start-frame`` (default: the first prompted frame),
backward with ``--reverse``, or both ways with ``--both-directions``.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import parse_floats, positive, prepare_out

OUTPUTS = ("results.json", "overlay.mp4", "masks")


def _parse_frame_point(text: str) -> list[float]:
    vals = parse_floats(text, (3, 4), "--point FRAME,X,Y[,LABEL]")
    if vals[0] != int(vals[0]) or vals[0] < 0:
        raise argparse.ArgumentTypeError(f"--point: FRAME must be a frame index: {text!r}")
    if len(vals) == 4 and vals[3] not in (0, 1):
        raise argparse.ArgumentTypeError(
            f"--point: LABEL must be 1 (object) or 0 (background): {text!r}"
        )
    return vals if len(vals) == 4 else [*vals, 1.0]


def _parse_frame_box(text: str) -> list[float]:
    vals = parse_floats(text, (5,), "--box FRAME,X0,Y0,X1,Y1")
    if vals[0] != int(vals[0]) or vals[0] < 0:
        raise argparse.ArgumentTypeError(f"--box: FRAME must be a frame index: {text!r}")
    if vals[3] < vals[1] or vals[4] < vals[2]:
        raise argparse.ArgumentTypeError(f"--box: needs X0 <= X1 and Y0 <= Y1: {text!r}")
    return vals


class _Prompt(argparse.Action):
    """Appends ``(kind, obj_id, values)`` to ``prompts``, with the object of the last
    ``--obj-id`` (1 before any)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        prompts = getattr(namespace, "prompts", None) or []
        prompts.append((self.dest, getattr(namespace, "obj_id", 1), values))
        namespace.prompts = prompts


def _group(prompts: list, num_frames: int, height: int, width: int) -> dict:
    """``{(obj_id, frame): {"points": [[x, y]...], "labels": [...], "box": [...] | None}}``,
    coordinates checked against the video and made relative to its size."""
    groups: dict[tuple[int, int], dict[str, Any]] = {}
    for kind, obj_id, vals in prompts:
        frame = int(vals[0])
        option = f"--{kind} {','.join(f'{v:g}' for v in vals)}"
        if frame >= num_frames:
            raise ValueError(
                f"{option}: frame {frame} out of range: the video has {num_frames} frames "
                f"(0-{num_frames - 1})"
            )
        xs, ys = vals[1::2][: 2 if kind == "box" else 1], vals[2::2][: 2 if kind == "box" else 1]
        if any(not 0 <= x <= width for x in xs) or any(not 0 <= y <= height for y in ys):
            raise ValueError(f"{option}: outside the {width}x{height} video")
        g = groups.setdefault((obj_id, frame), {"points": [], "labels": [], "box": None})
        if kind == "point":
            g["points"].append([vals[1] / width, vals[2] / height])
            g["labels"].append(int(vals[3]))
        elif g["box"] is not None:
            raise ValueError(f"{option}: object {obj_id} already has a box on frame {frame}")
        else:
            g["box"] = [vals[1] / width, vals[2] / height, vals[3] / width, vals[4] / height]
    return groups


def _prepare_out(out: Path, overwrite: bool) -> None:
    """Refuse to replace a previous run's outputs without --overwrite; with it, remove them
    (the mask PNGs of objects the new run may not have)."""
    prepare_out(out, list(OUTPUTS), overwrite)
    masks = out / "masks"
    if overwrite and masks.is_dir():
        for obj in masks.iterdir():
            if obj.is_dir() and obj.name.lstrip("-").isdigit():
                for png in obj.glob("[0-9][0-9][0-9][0-9][0-9].png"):
                    png.unlink()
                if not any(obj.iterdir()):
                    obj.rmdir()
        if not any(masks.iterdir()):
            shutil.rmtree(masks)


def cmd_track(args: argparse.Namespace) -> int:
    from ..convert.core import read_sidecar
    from ..models.sam3.build_sam3 import SAM3_SPEC
    from ..predict.track_outputs import TrackWriter
    from ..predict.video import open_video

    prompts = getattr(args, "prompts", None) or []
    if not prompts:
        raise ValueError("give at least one --point FRAME,X,Y[,LABEL] or --box FRAME,X0,Y0,X1,Y1")
    if args.checkpoint is None:
        raise ValueError(
            "--checkpoint is required: a SAM 3 .pdparams converted from the released sam3.pt "
            "(with its tracker), or sam3.pt itself"
        )
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    meta = read_sidecar(checkpoint) or {}
    if meta.get("model_type", "sam3") != "sam3":
        raise ValueError(f"{checkpoint} is a SAM v1 model; tracking needs a SAM 3 checkpoint")
    if meta.get("interactive") is False:
        raise ValueError(
            f"{checkpoint} was converted without the tracker (tracker.* of sam3.pt); convert "
            "the full released sam3.pt"
        )
    if args.reverse and args.both_directions:
        raise ValueError("--reverse and --both-directions do not combine")
    out = Path(args.output)
    _prepare_out(out, args.overwrite)

    spec = meta.get("spec") or {}
    image_size = spec.get("image_size", spec.get("img_size", SAM3_SPEC.image_size))
    frames = open_video(args.video, image_size=image_size)
    groups = _group(prompts, len(frames), frames.height, frames.width)
    start = min(frame for _, frame in groups) if args.start_frame is None else args.start_frame
    if start >= len(frames):
        raise ValueError(
            f"--start-frame {start} out of range: the video has {len(frames)} frames "
            f"(0-{len(frames) - 1})"
        )

    from ..build.sam3 import load_sam3_tracker

    t0 = time.perf_counter()
    tracker = load_sam3_tracker(checkpoint)
    t_load = time.perf_counter() - t0
    state = tracker.init_state(video_path=frames)
    for (obj_id, frame), g in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        tracker.add_new_points_or_box(
            state,
            frame,
            obj_id,
            points=g["points"] or None,
            labels=g["labels"] or None,
            box=g["box"],
        )
    directions = [True, False] if args.both_directions else [args.reverse]
    todo = 0
    for reverse in directions:
        last = 0 if reverse else len(frames) - 1
        span = abs(last - start) + 1
        todo += span if args.max_frames is None else min(span, args.max_frames + 1)
    writer = TrackWriter(
        out,
        frames.height,
        frames.width,
        len(frames),
        fps=frames.fps,
        source=str(args.video),
        write_pngs=not args.no_pngs,
        write_video=not args.no_video,
        frame_rgb=frames.rgb,
    )
    from tqdm import tqdm

    t0 = time.perf_counter()
    with writer, tqdm(total=todo, desc="track", unit="frame", disable=args.quiet) as bar:
        for i, reverse in enumerate(directions):
            for frame_idx, obj_ids, _, masks, scores in tracker.propagate_in_video(
                state,
                start_frame_idx=start,
                max_frame_num_to_track=args.max_frames,
                reverse=reverse,
                propagate_preflight=i == 0,
            ):
                probs = 1.0 / (1.0 + np.exp(-scores.astype("float32").numpy().reshape(-1)))
                writer.add(frame_idx, list(obj_ids), masks.numpy()[:, 0] > 0, probs)
                bar.update(1)
        t_track = time.perf_counter() - t0
        summary = writer.close()
    n = summary["frames"]
    print(
        f"tracked {len(state['obj_ids'])} object(s) over {n} frame(s) in {t_track:.1f} s "
        f"({t_track / max(n, 1):.2f} s/frame; model loaded in {t_load:.1f} s) -> {out}/"
        "results.json"
        + ("" if args.no_video else ", overlay.mp4")
        + ("" if args.no_pngs else ", masks/")
    )
    return 0


def _frame_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``track``."""
    s = sub.add_parser(
        "track",
        help="SAM 3: follow clicked or boxed objects through a video (masks per frame)",
        description="Follow clicked or boxed objects through a video with SAM 3's tracker: "
        "per-object mask PNGs, a YouTube-VIS style results.json and an overlay MP4.",
    )
    s.add_argument("video", help="a video file (MP4, MOV, AVI, MKV, WEBM) or a folder of frames")
    s.add_argument(
        "--point",
        type=_parse_frame_point,
        action=_Prompt,
        metavar="FRAME,X,Y[,LABEL]",
        help="a click in pixels on frame FRAME; LABEL 1 = object (default), 0 = background",
    )
    s.add_argument(
        "--box",
        type=_parse_frame_box,
        action=_Prompt,
        metavar="FRAME,X0,Y0,X1,Y1",
        help="a box in pixels on frame FRAME (at most one per object and frame)",
    )
    s.add_argument(
        "--obj-id",
        type=positive(int),
        default=1,
        metavar="N",
        help="the object of the --point / --box options that follow (default 1)",
    )
    s.add_argument("--checkpoint", default=None, help="SAM 3 .pdparams (or the released sam3.pt)")
    s.add_argument("-o", "--output", required=True, help="output folder")
    s.add_argument(
        "--start-frame",
        type=_frame_count,
        default=None,
        metavar="N",
        help="first frame to track from (default: the first prompted frame)",
    )
    s.add_argument(
        "--max-frames",
        type=_frame_count,
        default=None,
        metavar="N",
        help="track at most N frames past the start frame (default: to the end)",
    )
    s.add_argument("--reverse", action="store_true", help="track backward in time")
    s.add_argument(
        "--both-directions",
        action="store_true",
        help="track forward, then backward from the start frame",
    )
    s.add_argument("--no-pngs", action="store_true", help="no per-object mask PNGs")
    s.add_argument("--no-video", action="store_true", help="no overlay MP4")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--overwrite", action="store_true", help="replace a previous run's outputs")
    s.set_defaults(func=cmd_track, prompts=None)


__all__ = ["add_parser", "cmd_track"]
