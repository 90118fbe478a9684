"""``paddle-sam track``: follow objects through a video with SAM 2 or SAM 3.

Two modes, same outputs (per-object mask PNGs, a YouTube-VIS style results.json, an overlay
MP4):

- clicks and boxes (SAM 2's video predictor, or SAM 3's tracker), and with SAM 2 also masks:
  prompts in the video's pixels on any frame; ``--obj-id N`` sets the object of the
  ``--point`` / ``--box`` / ``--mask`` / ``--correct`` options that follow it (object 1
  before any ``--obj-id``). Every prompt is added before tracking starts; with SAM 2,
  ``--correct`` clicks are added after it, on frames already tracked, and the objects are
  tracked again from the earliest corrected frame (upstream's correction workflow);
- a concept (``--text "a person"``, SAM 3's dense video model): every instance of the concept
  on every frame, each with its own id, found on the prompt frame and then on each frame as
  instances enter; ``--box`` options are then exemplar boxes of the concept on the prompt
  frame (``--start-frame``, or the boxes' frame).

Objects are propagated forward from ``--start-frame`` (default: the first prompted frame),
backward with ``--reverse``, or both ways with ``--both-directions``.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import (
    add_precision_arg,
    check_precision,
    parse_floats,
    positive,
    prepare_out,
    source_of,
)

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


def _parse_frame_mask(text: str) -> list:
    frame, sep, path = text.partition(",")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"--mask needs FRAME,PNG: {text!r}")
    if not frame.strip().isdigit():
        raise argparse.ArgumentTypeError(f"--mask: FRAME must be a frame index: {text!r}")
    return [float(frame), path]


def _option(kind: str, vals: list) -> str:
    return f"--{kind} " + ",".join(v if isinstance(v, str) else f"{v:g}" for v in vals)


def _group(prompts: list, num_frames: int, height: int, width: int, relative: bool = True) -> dict:
    """``{(obj_id, frame): {"points": [[x, y]...], "labels": [...], "box": [...] | None,
    "mask": PATH | None}}``, coordinates checked against the video, made relative to its size
    (``relative``) or kept in pixels. ``--point`` and ``--correct`` give points."""
    groups: dict[tuple[int, int], dict[str, Any]] = {}
    sx, sy = (1.0 / width, 1.0 / height) if relative else (1.0, 1.0)
    for kind, obj_id, vals in prompts:
        frame = int(vals[0])
        option = _option(kind, vals)
        if frame >= num_frames:
            raise ValueError(
                f"{option}: frame {frame} out of range: the video has {num_frames} frames "
                f"(0-{num_frames - 1})"
            )
        g = groups.setdefault(
            (obj_id, frame), {"points": [], "labels": [], "box": None, "mask": None}
        )
        if kind == "mask":
            if g["mask"] is not None:
                raise ValueError(f"{option}: object {obj_id} already has a mask on frame {frame}")
            g["mask"] = vals[1]
            continue
        xs, ys = vals[1::2][: 2 if kind == "box" else 1], vals[2::2][: 2 if kind == "box" else 1]
        if any(not 0 <= x <= width for x in xs) or any(not 0 <= y <= height for y in ys):
            raise ValueError(f"{option}: outside the {width}x{height} video")
        if kind in ("point", "correct"):
            g["points"].append([vals[1] * sx, vals[2] * sy])
            g["labels"].append(int(vals[3]))
        elif g["box"] is not None:
            raise ValueError(f"{option}: object {obj_id} already has a box on frame {frame}")
        else:
            g["box"] = [vals[1] * sx, vals[2] * sy, vals[3] * sx, vals[4] * sy]
    for (obj_id, frame), g in groups.items():
        if g["mask"] is not None and (g["points"] or g["box"] is not None):
            raise ValueError(
                f"object {obj_id} has a --mask and clicks or a box on frame {frame}: a mask "
                "prompt replaces the others on its frame; give one or the other"
            )
    return groups


def _prepare_out(out: Path, overwrite: bool) -> None:
    """Refuse to replace a user's files, and a previous run's outputs without --overwrite;
    with it, remove them (the mask PNGs of objects the new run may not have)."""
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


def _checkpoint(args: argparse.Namespace) -> tuple[Any, dict]:
    """The sniffed --checkpoint (:func:`paddle_sam.loading.sniff`) and its sidecar; refused
    before any video is read when it cannot track."""
    from ..loading import resolve, sniff, video_refusal

    check_precision(args)
    if args.exported is not None:
        source = resolve(args.checkpoint, args.exported)  # both given, or no folder: refused
        why = video_refusal(source)
        if why is not None:
            raise ValueError(f"--exported {args.exported}: {why}")
        return source, source.meta
    if args.checkpoint is None:
        if args.text is not None:
            raise ValueError(
                "--text needs SAM 3's video model: pass --checkpoint sam3.pt (or a .pdparams "
                "converted from the released sam3.pt with its tracker); the bundled SAM 3 has "
                "no tracker"
            )
        # clicks, boxes and masks: the bundled SAM 2 video model (with a notice)
        source = source_of(args, "sam2")
        return source, source.meta
    source = sniff(args.checkpoint, "sam3")
    if source.family == "sam_v1":
        raise ValueError(
            f"{source.path} is a SAM v1 model; tracking needs a SAM 2 or SAM 3 checkpoint"
        )
    if source.layout == "pdparams" and source.lacks("video"):
        raise ValueError(
            f"{source.path} was converted without the tracker (tracker.* of sam3.pt); convert "
            "the full released sam3.pt"
        )
    return source, source.meta


def _directions(
    args: argparse.Namespace, start: int, num_frames: int, reverse_skips_start: bool = False
) -> tuple[list, int]:
    """``([reverse flags], frames to visit)`` of the requested propagation. The tracker
    visits the start frame in both directions; the dense video model's backward pass starts
    one frame before it (``reverse_skips_start``)."""
    directions = [False, True] if args.both_directions else [args.reverse]
    todo = 0
    for reverse in directions:
        if reverse and reverse_skips_start:
            span = start if args.max_frames is None else min(start, args.max_frames)
        else:
            span = (start if reverse else num_frames - 1 - start) + 1
            span = span if args.max_frames is None else min(span, args.max_frames + 1)
        todo += span
    return directions, todo


def _writer(args: argparse.Namespace, out: Path, frames: Any, category: str = "object"):
    from ..predict.outputs import claim
    from ..predict.track_outputs import TrackWriter

    skipped = {"overlay.mp4": args.no_video, "masks": args.no_pngs}
    claim(out, [n for n in OUTPUTS if not skipped.get(n)], "track")
    return TrackWriter(
        out,
        frames.height,
        frames.width,
        len(frames),
        fps=frames.fps,
        source=str(args.video),
        write_pngs=not args.no_pngs,
        write_video=not args.no_video,
        frame_rgb=frames.rgb,
        category=category,
    )


def _check_start(start: int, num_frames: int) -> None:
    if start >= num_frames:
        raise ValueError(
            f"--start-frame {start} out of range: the video has {num_frames} frames "
            f"(0-{num_frames - 1})"
        )


def cmd_track(args: argparse.Namespace) -> int:
    from ..models.sam3.build_sam3 import SAM3_SPEC
    from ..predict.video import open_video

    prompts = getattr(args, "prompts", None) or []
    text = args.text
    if text is not None and not text.strip():
        raise ValueError("--text: the concept is empty")
    if text is None and not prompts:
        raise ValueError(
            "give a concept (--text), or at least one --point FRAME,X,Y[,LABEL] or --box "
            "FRAME,X0,Y0,X1,Y1"
        )
    if text is not None and any(kind == "point" for kind, _, _ in prompts):
        raise ValueError(
            "--point does not combine with --text: refine a concept's objects with clicks in "
            "the web page (paddle-sam serve) or the request API"
        )
    if args.reverse and args.both_directions:
        raise ValueError("--reverse and --both-directions do not combine")
    checkpoint, meta = _checkpoint(args)
    sam2 = checkpoint.family == "sam2"
    if sam2 and text is not None:
        raise ValueError(
            "--text needs SAM 3 (its dense video model); SAM 2 follows objects given by "
            "--point, --box or --mask"
        )
    only_sam2 = sorted({f"--{kind}" for kind, _, _ in prompts if kind in ("mask", "correct")})
    if only_sam2 and not sam2:
        raise ValueError(
            f"{', '.join(only_sam2)} need a SAM 2 checkpoint (sam2.1_hiera_*.pt or a "
            ".pdparams converted from it); SAM 3's tracker takes --point and --box"
        )
    if sam2 and prompts and all(kind == "correct" for kind, _, _ in prompts):
        raise ValueError(
            "--correct refines objects after a first tracking: give each object's --point, "
            "--box or --mask too"
        )
    out = Path(args.output)
    _prepare_out(out, args.overwrite)
    if sam2:
        return _track_sam2(args, checkpoint, prompts, out)

    spec = meta.get("spec") or {}
    image_size = spec.get("image_size", spec.get("img_size", SAM3_SPEC.image_size))
    if text is None:
        frames = open_video(args.video, image_size=image_size)
        return _track_clicks(args, checkpoint, frames, prompts, out)
    from ..predict.video import preprocess_sam3_frame

    frames = open_video(args.video, image_size=image_size, preprocess=preprocess_sam3_frame)
    return _track_concept(args, checkpoint, frames, text.strip(), prompts, out)


def _track_clicks(args, checkpoint: Any, frames: Any, prompts: list, out: Path) -> int:
    groups = _group(prompts, len(frames), frames.height, frames.width)
    start = min(frame for _, frame in groups) if args.start_frame is None else args.start_frame
    _check_start(start, len(frames))

    from ..loading import load_video_predictor

    t0 = time.perf_counter()
    tracker = load_video_predictor(checkpoint, kind="tracker", precision=args.precision)
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
    directions, todo = _directions(args, start, len(frames))
    from tqdm import tqdm

    t0 = time.perf_counter()
    with _writer(args, out, frames) as writer:
        with tqdm(total=todo, desc="track", unit="frame", disable=args.quiet) as bar:
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
    _report(args, out, len(state["obj_ids"]), summary["frames"], t_track, t_load)
    return 0


def _read_mask(path: str, height: int, width: int) -> np.ndarray:
    """A ``--mask`` PNG (any image the decoder reads; inside where brighter than half) of the
    video's size, as bool."""
    from ..predict.io import load_image

    rgb = load_image(path)
    if rgb.shape[:2] != (height, width):
        raise ValueError(
            f"--mask {path}: {rgb.shape[1]}x{rgb.shape[0]} pixels, the video is {width}x{height}"
        )
    return rgb.max(axis=2) > 127


def _track_sam2(args, checkpoint: Any, prompts: list, out: Path) -> int:
    """Objects given by clicks, boxes and masks through the video with SAM 2's video
    predictor (upstream's API); then ``--correct`` clicks on tracked frames and the objects
    tracked again from the earliest of them."""
    from tqdm import tqdm

    from ..loading import load_video_predictor
    from ..predict.sam2.video_requests import object_probs
    from ..predict.video import open_video

    initial = [p for p in prompts if p[0] != "correct"]
    corrections = [p for p in prompts if p[0] == "correct"]
    t0 = time.perf_counter()
    tracker = load_video_predictor(checkpoint, kind="tracker", precision=args.precision)
    t_load = time.perf_counter() - t0
    frames = open_video(args.video, image_size=tracker.image_size)
    h, w = frames.height, frames.width
    groups = _group(initial, len(frames), h, w, relative=False)
    fixes = _group(corrections, len(frames), h, w, relative=False)
    masks = {key: _read_mask(g["mask"], h, w) for key, g in groups.items() if g["mask"]}
    start = min(frame for _, frame in groups) if args.start_frame is None else args.start_frame
    _check_start(start, len(frames))
    state = tracker.init_state(frames)
    for (obj_id, frame), g in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if g["mask"] is not None:
            tracker.add_new_mask(state, frame, obj_id, masks[(obj_id, frame)])
        else:
            tracker.add_new_points_or_box(
                state,
                frame,
                obj_id,
                points=g["points"] or None,
                labels=g["labels"] or None,
                box=g["box"],
            )
    directions, todo = _directions(args, start, len(frames))
    again = min((frame for _, frame in fixes), default=None)
    if again is not None:
        todo += _directions(args, again, len(frames))[1]

    def propagate(bar: Any, writer: Any, first: int) -> None:
        for reverse in directions:
            for frame_idx, obj_ids, logits in tracker.propagate_in_video(
                state,
                start_frame_idx=first,
                max_frame_num_to_track=args.max_frames,
                reverse=reverse,
            ):
                probs = object_probs(state, frame_idx)
                writer.add(frame_idx, list(obj_ids), logits.numpy()[:, 0] > 0.0, probs)
                bar.update(1)

    t0 = time.perf_counter()
    with _writer(args, out, frames) as writer:
        with tqdm(total=todo, desc="track", unit="frame", disable=args.quiet) as bar:
            propagate(bar, writer, start)
            if again is not None:
                for (obj_id, frame), g in sorted(fixes.items(), key=lambda kv: kv[0][::-1]):
                    tracker.add_new_points_or_box(
                        state,
                        frame,
                        obj_id,
                        points=g["points"],
                        labels=g["labels"],
                        clear_old_points=False,
                    )
                propagate(bar, writer, again)
        t_track = time.perf_counter() - t0
        summary = writer.close()
    _report(args, out, len(state["obj_ids"]), summary["frames"], t_track, t_load)
    return 0


def _track_concept(args, checkpoint: Any, frames: Any, text: str, prompts: list, out: Path) -> int:
    """Every instance of ``text`` (and of the exemplar ``--box``es) through the video with
    the dense video model, through its request API."""
    height, width = frames.height, frames.width
    boxes, box_frames = [], set()
    for _, _, vals in prompts:  # only boxes here
        frame, x0, y0, x1, y1 = vals
        option = f"--box {','.join(f'{v:g}' for v in vals)}"
        if frame >= len(frames):
            raise ValueError(
                f"{option}: frame {int(frame)} out of range: the video has {len(frames)} "
                f"frames (0-{len(frames) - 1})"
            )
        if not (0 <= x0 <= x1 <= width and 0 <= y0 <= y1 <= height):
            raise ValueError(f"{option}: outside the {width}x{height} video")
        boxes.append([x0 / width, y0 / height, (x1 - x0) / width, (y1 - y0) / height])
        box_frames.add(int(frame))
    if len(box_frames) > 1:
        raise ValueError(
            f"--box with --text: exemplar boxes are given on one frame (the prompt frame), "
            f"got frames {sorted(box_frames)}"
        )
    prompt_frame = box_frames.pop() if box_frames else (args.start_frame or 0)
    start = prompt_frame if args.start_frame is None else args.start_frame
    _check_start(max(start, prompt_frame), len(frames))

    from ..loading import load_video_predictor

    t0 = time.perf_counter()
    predictor = load_video_predictor(checkpoint, precision=args.precision)
    t_load = time.perf_counter() - t0
    session = predictor.handle_request({"type": "start_session", "resource_path": frames})
    sid = session["session_id"]
    request: dict[str, Any] = {
        "type": "add_prompt",
        "session_id": sid,
        "frame_index": prompt_frame,
        "text": text,
    }
    if boxes:
        request.update(bounding_boxes=boxes, bounding_box_labels=[1] * len(boxes))
    predictor.handle_request(request)

    directions, todo = _directions(args, start, len(frames), reverse_skips_start=True)
    direction = "both" if len(directions) == 2 else ("backward" if directions[0] else "forward")
    from tqdm import tqdm

    t0 = time.perf_counter()
    obj_ids: set[int] = set()
    with _writer(args, out, frames, category=text) as writer:
        with tqdm(total=todo, desc="track", unit="frame", disable=args.quiet) as bar:
            for item in predictor.handle_stream_request(
                {
                    "type": "propagate_in_video",
                    "session_id": sid,
                    "propagation_direction": direction,
                    "start_frame_index": start,
                    "max_frame_num_to_track": args.max_frames,
                }
            ):
                o = item["outputs"]
                ids = [int(i) for i in o["out_obj_ids"]]
                obj_ids.update(ids)
                writer.add(item["frame_index"], ids, o["out_binary_masks"], o["out_probs"])
                bar.update(1)
        t_track = time.perf_counter() - t0
        summary = writer.close()
    predictor.handle_request({"type": "close_session", "session_id": sid})
    _report(args, out, len(obj_ids), summary["frames"], t_track, t_load)
    return 0


def _report(args, out: Path, num_objects: int, n: int, t_track: float, t_load: float) -> None:
    print(
        f"tracked {num_objects} object(s) over {n} frame(s) in {t_track:.1f} s "
        f"({t_track / max(n, 1):.2f} s/frame; model loaded in {t_load:.1f} s) -> {out}/"
        "results.json"
        + ("" if args.no_video else ", overlay.mp4")
        + ("" if args.no_pngs else ", masks/")
    )


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
        help="SAM 2 / SAM 3: follow clicked objects, or every instance of a concept (SAM 3), "
        "through a video",
        description="Follow clicked, boxed or (SAM 2) masked objects (SAM 2's video predictor "
        "or SAM 3's tracker), or every instance of a concept (--text, SAM 3's dense video "
        "model), through a video: per-object mask PNGs, a YouTube-VIS style results.json and "
        "an overlay MP4. The model family is read from --checkpoint; without one, clicks, boxes "
        "and masks are tracked by the default small SAM 2.1 (generated shapes only) where the "
        "install has it (make train-sam2-default trains it).",
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
        help="a box in pixels on frame FRAME (at most one per object and frame); with --text "
        "an exemplar box of the concept",
    )
    s.add_argument(
        "--mask",
        type=_parse_frame_mask,
        action=_Prompt,
        metavar="FRAME,PNG",
        help="SAM 2: the object's mask on frame FRAME, an image of the video's size (inside "
        "where brighter than half, e.g. a mask PNG this command wrote)",
    )
    s.add_argument(
        "--correct",
        type=_parse_frame_point,
        action=_Prompt,
        metavar="FRAME,X,Y[,LABEL]",
        help="SAM 2: a correction click added after a first tracking (on a tracked frame, to "
        "the object's clicks there); the objects are then tracked again from the earliest "
        "corrected frame",
    )
    s.add_argument(
        "--text",
        default=None,
        metavar="CONCEPT",
        help='every instance of a concept, e.g. "a person" (SAM 3\'s dense video model); '
        "found on the prompt frame (--start-frame, default 0) and on every frame after",
    )
    s.add_argument(
        "--obj-id",
        type=positive(int),
        default=1,
        metavar="N",
        help="the object of the --point / --box / --mask / --correct options that follow "
        "(default 1)",
    )
    s.add_argument(
        "--checkpoint",
        default=None,
        help="SAM 2 (sam2.1_hiera_*.pt or a .pdparams converted from it) or SAM 3 (.pdparams, "
        "or the released sam3.pt)",
    )
    s.add_argument(
        "--exported",
        default=None,
        metavar="DIR",
        help="an OpenVINO export folder (the openvino extra): SAM 2's ('paddle-sam export'), "
        "its image encoder on OpenVINO, or SAM 3's with its tracker ('paddle-sam export "
        "--format onnx'), its vision backbone on OpenVINO; the rest on the dynamic model",
    )
    add_precision_arg(s)
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
