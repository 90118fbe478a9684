"""SAM 3 video tracker on the CPU: paddle_sam's ``Sam3TrackerVideoPredictor`` against the
official sam3 tracker (``build_tracker(with_backbone=True)``), same full-size random weights,
on a generated 640 x 480 video.

    python benchmarks/bench_sam3_tracker.py [--frames 6] [--objects 2] [--threads N] [--rounds 1]
        [--csv benchmarks/results/sam3_tracker_<timestamp>.csv]

A ``prepare`` worker writes the video (JPEG frames ``0.jpg``, ``1.jpg``, ..., quality 95, the
folder both trackers open: upstream reads MP4 only through decord) and one set of weights:
random values in the released ``sam3.pt`` layout (all 1465 ``detector.*`` / ``tracker.*``
keys, drawn as tests/models/test_full_size_sam3_tracker.py draws them), converted once by
``convert_checkpoint``. Each framework then runs in its own fresh process (``--worker
paddle|torch``), so that peak RSS is per framework; with ``--rounds`` > 1 they are interleaved
and the median per figure is reported. Both load the weights as a user would: paddle
``load_sam3_tracker(.pdparams)``; torch ``build_tracker`` then ``load_state_dict(strict=True)``
of the released file read whole with ``torch.load`` (as upstream's builder reads ``sam3.pt``),
its ``tracker.*`` keys and the detector's vision backbone.

In each worker (torch under ``torch.inference_mode()`` and the CPU patches of
``tests/helpers/sam3_ref.py``):

1. Clicks: one positive click per object on frame 0 (the first backbone pass: warm-up).
2. Propagation with the backbone: ``propagate_in_video`` from frame 0 forward over all frames.
   Frame 0 (the clicked frame, already computed) and frame 1 (the first frame tracked from
   memory: first memory attention, one-time costs) are excluded; the figure is the mean time
   per frame over frames 2..N-1, measured between successive yields of the generator (the
   benchmark's own handling of the outputs is not counted). The split into backbone
   (``forward_image``, with ``conv_s0`` / ``conv_s1``), memory attention
   (``_prepare_memory_conditioned_features``), SAM decoder (``_forward_sam_heads``) and memory
   encoder (``_encode_new_memory``) times those methods of the tracker instance over the same
   frames; "other" is the rest (frame decoding, the features expanded to the objects and
   flattened, mask resizing to the video, bookkeeping).
   Paddle decodes each JPEG when the frame is first needed (counted in "other"); upstream
   decodes them all in ``init_state`` (not counted).
3. Propagation from cached features: the backbone outputs of every frame, kept as the
   tracker computed them in step 2, are given to a fresh state as ``cached_features`` (no
   video), the same clicks made and the same propagation run: the mean per frame over frames
   2..N-1 is memory attention + SAM decoder + memory encoder + the rest of "other"; the row
   "memory attention + decoder" adds only those two parts.

Peak RSS is ``getrusage(RUSAGE_SELF).ru_maxrss`` of each worker (weights file read whole,
model, activations, the cached features of every frame). The output check compares the object
scores and mask areas of both frameworks on every frame (same weights: they must agree).

This is a measurement, not a test: it has no thresholds and exits 0 whatever the ratios. The
machine description, CSV number format and child-process plumbing are bench_sam_v1's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.* (torch side, weights)

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime as dt  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import bench_sam_v1 as v1  # noqa: E402  (keeps the environment as it was: v1._BASE_ENV)
import numpy as np  # noqa: E402

IMPLS = ("paddle", "torch")
HW = (480, 640)
# relative (x, y) clicks on frame 0: the red square, the blue disc, the green bar, then the
# ground (the first two are the full-size test's)
CLICKS = ((0.2, 0.35), (0.7, 0.6), (0.81, 0.11), (0.45, 0.85), (0.1, 0.8), (0.5, 0.1))
PARTS = {
    "backbone": "forward_image",
    "memory_attention": "_prepare_memory_conditioned_features",
    "decoder": "_forward_sam_heads",
    "memory_encoder": "_encode_new_memory",
}
Metric = v1.Metric
METRICS = (
    Metric("import_s", "import framework + package (s)", digits=2),
    Metric("load_s", "model load: build + weights file (s)", digits=2),
    Metric("click_s", "clicks on frame 0, first backbone pass (s)", digits=2),
    Metric("first_tracked_s", "frame 1, first tracked (warm-up) (s)", digits=2),
    Metric("frame_s", "propagated frame incl. backbone (s/frame)", digits=2),
    Metric("part_backbone_s", "  backbone (s/frame)", digits=2),
    Metric("part_memory_attention_s", "  memory attention (s/frame)", digits=3),
    Metric("part_decoder_s", "  SAM decoder (s/frame)", digits=3),
    Metric("part_memory_encoder_s", "  memory encoder (s/frame)", digits=3),
    Metric("part_other_s", "  other (s/frame)", digits=3),
    Metric("cached_frame_s", "propagated frame, cached features (s/frame)", digits=3),
    Metric("cached_attn_decoder_s", "  memory attention + decoder (s/frame)", digits=3),
    Metric("rss_after_load_mb", "RSS after model load (MB)", digits=0),
    Metric("peak_rss_mb", "peak RSS (MB)", digits=0),
)


# --------------------------------------------------------------------------------- machine


cpu_flags = v1.cpu_flags  # the CPU features that matter, read at run time


# --------------------------------------------------------------------------------- workers


class PartTimers:
    """Cumulative wall time of some methods of one tracker instance (wrapped in place)."""

    def __init__(self, tracker: Any, names: dict[str, str]) -> None:
        self.total = dict.fromkeys(names, 0.0)
        for part, method in names.items():
            setattr(tracker, method, self._timed(part, getattr(tracker, method)))

    def _timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[part] += time.perf_counter() - t0

        return call

    def snapshot(self) -> dict[str, float]:
        return dict(self.total)


def keep_features(tracker: Any, store: dict) -> None:
    """Keep every frame's backbone output as the tracker caches it (both trackers keep only
    the latest frame's in ``inference_state["cached_features"]``)."""
    get = tracker._get_image_feature

    def get_and_keep(inference_state: dict, frame_idx: int, batch_size: int):
        out = get(inference_state, frame_idx, batch_size)
        store.update(inference_state["cached_features"])
        return out

    tracker._get_image_feature = get_and_keep


def timed_propagation(
    outputs: Iterator[tuple], timers: PartTimers, to_numpy: Callable[[Any], np.ndarray]
) -> dict:
    """Consume ``propagate_in_video``: per-frame wall time between yields, the part timers
    after each frame, object scores and mask areas."""
    frames, seconds, parts, scores, areas = [], [], [], [], []
    t0 = time.perf_counter()
    for frame_idx, _, _, masks, obj_scores in outputs:
        seconds.append(time.perf_counter() - t0)
        parts.append(timers.snapshot())
        frames.append(int(frame_idx))
        scores.append(to_numpy(obj_scores)[:, 0].tolist())
        areas.append((to_numpy(masks) > 0).mean(axis=(1, 2, 3)).tolist())
        t0 = time.perf_counter()
    return {"frames": frames, "seconds": seconds, "parts": parts, "scores": scores, "areas": areas}


def per_frame(run: dict) -> dict[str, float]:
    """Means per frame over frames 2..N-1: the total and each part (from the timers)."""
    n = len(run["frames"]) - 2
    out = {"frame_s": sum(run["seconds"][2:]) / n}
    first, last = run["parts"][1], run["parts"][-1]
    for part in PARTS:
        out[f"part_{part}_s"] = (last[part] - first[part]) / n
    out["part_other_s"] = out["frame_s"] - sum(out[f"part_{p}_s"] for p in PARTS)
    return out


def time_tracker(tracker: Any, api: dict[str, Callable[..., Any]], args) -> dict:
    """The same calls on both trackers (``api``: the few that differ)."""
    timers = PartTimers(tracker, PARTS)
    features: dict = {}
    keep_features(tracker, features)
    clicks = CLICKS[: args.objects]

    state = api["init_video"](args.video)
    t0 = time.perf_counter()
    for obj_id, xy in enumerate(clicks, 1):
        api["click"](state, obj_id, xy)
    click_s = time.perf_counter() - t0
    video = timed_propagation(api["propagate"](state), timers, api["to_numpy"])
    num_frames = len(video["frames"])
    del state
    gc.collect()

    state = api["init_cached"](HW[0], HW[1], num_frames, dict(features))
    for obj_id, xy in enumerate(clicks, 1):
        api["click"](state, obj_id, xy)
    cached = timed_propagation(api["propagate"](state), timers, api["to_numpy"])
    cached_parts = per_frame(cached)
    return {
        "click_s": click_s,
        "first_tracked_s": video["seconds"][1],
        **per_frame(video),
        "cached_frame_s": cached_parts["frame_s"],
        "cached_attn_decoder_s": cached_parts["part_memory_attention_s"]
        + cached_parts["part_decoder_s"],
        "cached_backbone_s": cached_parts["part_backbone_s"],  # 0: nothing recomputed
        "seconds_per_frame": video["seconds"],
        "cached_seconds_per_frame": cached["seconds"],
        "frames": video["frames"],
        "scores": video["scores"],
        "areas": video["areas"],
        "cached_scores": cached["scores"],
    }


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def run_paddle_worker(args) -> dict:
    t0 = time.perf_counter()
    import paddle_sam  # first: it applies its CPU defaults before paddle loads

    paddle_sam.tune_process()  # the settings the CLI runs with

    import_s = time.perf_counter() - t0
    import paddle

    from paddle_sam._runtime import get_num_threads
    from paddle_sam.loading.sam3 import load_sam3_tracker

    paddle.set_device("cpu")
    if args.threads:
        paddle_sam.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if args.exported:  # the export's backbone on OpenVINO, the rest from its weights
        from paddle_sam.loading.sam3 import load_sam3_export

        tracker = load_sam3_export(args.exported, "tracker", precision=args.precision)
    else:
        tracker = load_sam3_tracker(args.checkpoint)
    gc.collect()
    load_s = time.perf_counter() - t0
    rss_after_load = rss_mb()

    def propagate(state: dict) -> Iterator[tuple]:
        return tracker.propagate_in_video(
            state, start_frame_idx=0, max_frame_num_to_track=None, propagate_preflight=True
        )

    api = {
        "init_video": lambda video: tracker.init_state(video_path=video),
        "init_cached": lambda h, w, n, feats: tracker.init_state(
            video_height=h, video_width=w, num_frames=n, cached_features=feats
        ),
        "click": lambda state, obj_id, xy: tracker.add_new_points_or_box(
            state, 0, obj_id, points=[list(xy)], labels=[1]
        ),
        "propagate": propagate,
        "to_numpy": lambda t: t.numpy(),
    }
    with paddle.no_grad():
        result = time_tracker(tracker, api, args)
    return {
        "impl": "paddle",
        "version": paddle.__version__,
        "threads": args.threads or get_num_threads(),
        "import_s": import_s,
        "load_s": load_s,
        "rss_after_load_mb": rss_after_load,
        **result,
    }


def run_torch_worker(args) -> dict:
    t0 = time.perf_counter()
    import torch
    from sam3 import model_builder

    import_s = time.perf_counter() - t0
    from tests.helpers.sam3_ref import (
        tracker_cpu_patches,  # sam3 0.1.4's CUDA-only spots (docs/design.md section 1)
    )
    from tests.models.test_full_size_sam3_tracker import official_state

    if args.threads:
        torch.set_num_threads(args.threads)
    with tracker_cpu_patches(), torch.inference_mode():
        t0 = time.perf_counter()
        tracker = model_builder.build_tracker(
            apply_temporal_disambiguation=False, with_backbone=True
        ).eval()
        released = torch.load(args.checkpoint, map_location="cpu", weights_only=True)["model"]
        tracker.load_state_dict(official_state(released), strict=True)
        del released
        gc.collect()
        load_s = time.perf_counter() - t0
        rss_after_load = rss_mb()

        api = {
            "init_video": lambda video: tracker.init_state(
                video_path=video, offload_video_to_cpu=True, offload_state_to_cpu=True
            ),
            "init_cached": lambda h, w, n, feats: tracker.init_state(
                video_height=h,
                video_width=w,
                num_frames=n,
                cached_features=feats,
                offload_video_to_cpu=True,
                offload_state_to_cpu=True,
            ),
            "click": lambda state, obj_id, xy: tracker.add_new_points_or_box(
                state, 0, obj_id, points=torch.tensor([xy]), labels=torch.tensor([1])
            ),
            "propagate": lambda state: tracker.propagate_in_video(
                state, 0, None, False, tqdm_disable=True, propagate_preflight=True
            ),
            "to_numpy": lambda t: t.float().numpy(),
        }
        result = time_tracker(tracker, api, args)
    return {
        "impl": "torch",
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "import_s": import_s,
        "load_s": load_s,
        "rss_after_load_mb": rss_after_load,
        **result,
    }


def worker_main(args) -> None:
    run = run_torch_worker if args.worker == "torch" else run_paddle_worker
    result = run(args)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB
    print(v1.RESULT_PREFIX + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------- inputs


def prepare(tmp: Path, frames: int) -> dict[str, str]:
    """The video folder and the weights: released-layout ``.pt`` and its conversion."""
    from paddle_sam.convert.checkpoint import convert_checkpoint
    from tests.helpers.video import write_frames
    from tests.models.test_full_size_sam3_tracker import (
        build_official_tracker,
        release_memory,
        scene,
        write_random_checkpoint,
    )

    video = write_frames(scene(frames, HW), tmp / "video")
    pt, pdparams = tmp / "sam3_random.pt", tmp / "sam3_random.pdparams"
    official = build_official_tracker()
    write_random_checkpoint(pt, official, seed=v1.SEED)
    del official
    release_memory()
    convert_checkpoint(pt, pdparams, progress=False)
    return {"video": str(video), "torch": str(pt), "paddle": str(pdparams)}


# --------------------------------------------------------------------------------- parent


def collect(args, inputs: dict[str, str]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {impl: [] for impl in IMPLS}
    for r in range(1, args.rounds + 1):
        for impl in IMPLS:
            argv = ["--worker", impl, "--checkpoint", inputs[impl], "--video", inputs["video"]]
            argv += ["--objects", str(args.objects)]
            argv += export_argv(args, impl)
            if args.threads:
                argv += ["--threads", str(args.threads)]
            load_before = os.getloadavg()[0]
            result = v1.run_child(argv, f"round {r}/{args.rounds} {impl}", script=__file__)
            runs[impl].append({**result, "load_avg_1min_before": load_before})
    return runs


def summarise(
    runs: dict[str, list[dict]], metrics: Sequence[Any] = METRICS
) -> dict[str, dict[str, float]]:
    """The median over rounds of each metric, per framework."""
    return {
        m.key: {
            impl: statistics.median(r[m.key] for r in rs) * m.scale for impl, rs in runs.items()
        }
        for m in metrics
    }


def ratio(values: dict[str, float]) -> float | None:
    if values.get("torch", 0) > 0 and "paddle" in values:
        return values["paddle"] / values["torch"]
    return None


HEADER = ["metric", "paddle_sam", "torch (official sam3)", "paddle/torch"]


def table_rows(
    summary: dict[str, dict[str, float]], metrics: Sequence[Any] = METRICS
) -> list[list[str]]:
    rows = []
    for m in metrics:
        vals, r = summary[m.key], ratio(summary[m.key])
        rows.append(
            [m.label]
            + [f"{vals[i]:.{m.digits}f}" for i in IMPLS]
            + ["-" if r is None else f"{r:.2f}"]
        )
    return rows


def machine_info(
    args,
    runs: dict[str, list[dict]],
    started: dt.datetime,
    load_at_start: Sequence[float],
    settings: str | None = None,
) -> list[tuple[str, str]]:
    threads = ", ".join(f"{impl} {rs[0].get('threads')}" for impl, rs in runs.items()) + (
        " (--threads)" if args.threads else " (each framework's default)"
    )
    return [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", v1._cpu_model()),
        ("cpu flags", cpu_flags()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        ("ram", v1._ram_gib()),
        ("load average at start", " ".join(f"{x:.2f}" for x in load_at_start)),
        ("load average at end", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("python", platform.python_version()),
        ("paddlepaddle", v1._version("paddlepaddle")),
        ("paddle-sam", v1._version("paddle-sam")),
        ("torch", v1._version("torch")),
        ("sam3", v1._version("sam3")),
        ("threads", threads),
        (
            "settings",
            settings
            or f"SAM 3 tracker + vision backbone, full size, random weights; video "
            f"{HW[1]}x{HW[0]}, {args.frames} frames (JPEG), {args.objects} objects clicked on "
            f"frame 0, per-frame means over frames 2..{args.frames - 1}, rounds {args.rounds} "
            "(median of rounds)",
        ),
    ]


def notes(runs: dict[str, list[dict]]) -> list[str]:
    p, t = runs["paddle"][0], runs["torch"][0]
    ds = np.abs(np.array(p["scores"]) - np.array(t["scores"])).max()
    da = np.abs(np.array(p["areas"]) - np.array(t["areas"])).max()
    out = [
        f"output check paddle vs torch (same weights, every frame and object): max |object "
        f"score logit difference| {ds:.2e}, max |mask area difference| {da:.2e} of the frame "
        f"(scores {np.min(t['scores']):.3f}..{np.max(t['scores']):.3f}, mask areas "
        f"{np.min(t['areas']):.3f}..{np.max(t['areas']):.3f})"
    ]
    for impl, rs in runs.items():
        for r in rs:
            dc = np.abs(np.array(r["cached_scores"]) - np.array(r["scores"])).max()
            out.append(
                f"{impl}: cached-feature run vs video run, max |score difference| {dc:.1e}; "
                f"backbone time in the cached run {r['cached_backbone_s']:.3f} s/frame"
            )
    for impl, rs in runs.items():
        for i, r in enumerate(rs, 1):
            out.append(
                f"{impl} round {i}: load {r['load_s']:.1f} s, clicks {r['click_s']:.1f} s, "
                f"per frame (video) {' / '.join(f'{v:.2f}' for v in r['seconds_per_frame'])} "
                f"s, per frame (cached) "
                f"{' / '.join(f'{v:.2f}' for v in r['cached_seconds_per_frame'])} s, peak RSS "
                f"{r['peak_rss_mb']:.0f} MB (1-min load average before: "
                f"{r['load_avg_1min_before']:.2f})"
            )
    return out


def write_outputs(
    csv_path: Path,
    summary,
    info,
    rows,
    lines,
    metrics: Sequence[Any] = METRICS,
    title: str = "SAM 3 tracker CPU benchmark",
) -> Path:
    """The CSV (one row per metric, the ratio last) and a Markdown report next to it."""
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "label", *IMPLS, "ratio_paddle_over_torch"])
        for m in metrics:
            vals = summary[m.key]
            w.writerow(
                [m.key, m.label.strip()]
                + [v1._csv_num(vals.get(i)) for i in IMPLS]
                + [v1._csv_num(ratio(vals))]
            )
    md_path = csv_path.with_suffix(".md")
    md = [f"# {title}: {csv_path.stem}", ""]
    md += [f"- **{k}**: {v}" for k, v in info]
    md += ["", v1.format_table(rows, True, header=HEADER), ""]
    md += ["Ratio < 1: paddle_sam is faster / smaller.", "", *[f"- {n}" for n in lines]]
    md_path.write_text("\n".join(md) + "\n")
    return md_path


def parent_main(args) -> None:
    started, load_at_start = dt.datetime.now().astimezone(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_sam3_tracker_") as tmp:
        if args.workdir:  # kept, and reused by a later run (weights.json lists the inputs)
            frames = ["--frames", str(args.frames)]
            inputs = v1.prepared_weights(Path(args.workdir), frames, script=__file__)
        else:
            print(f"writing the video and full-size weights to {tmp}", file=sys.stderr)
            argv = ["--worker", "prepare", "--checkpoint", tmp, "--frames", str(args.frames)]
            inputs = v1.run_child(argv, "video + weights", script=__file__)
        runs = collect(args, inputs)
    summary = summarise(runs)
    info = machine_info(args, runs, started, load_at_start)
    rows = table_rows(summary)
    lines = notes(runs)
    print()
    print("\n".join(f"{k:>22}: {v}" for k, v in info))
    print()
    print(v1.format_table(rows, False, header=HEADER))
    print("\nratio < 1: paddle_sam is faster / smaller")
    print("\n".join(lines))
    csv_path = Path(
        args.csv or Path(__file__).parent / "results" / f"sam3_tracker_{started:%Y%m%d-%H%M%S}.csv"
    )
    md_path = write_outputs(csv_path, summary, info, rows, lines)
    print(f"\nwrote {csv_path}\nwrote {md_path}")


def at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    """``--exported DIR --precision P``: the paddle worker on an export's OpenVINO backbone."""
    p.add_argument(
        "--exported",
        default=None,
        help="paddle side: this `export --format onnx` folder of the same weights (made from "
        "the workdir's .pdparams) instead of the .pdparams",
    )
    p.add_argument("--precision", default="fp32", help="with --exported: fp32, bf16 or int8")


def export_argv(args: argparse.Namespace, impl: str) -> list[str]:
    """The worker arguments of :func:`add_export_arguments` (the paddle worker's only)."""
    if impl == "paddle" and args.exported:
        return ["--exported", args.exported, "--precision", args.precision]
    return []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--frames", type=at_least(3), default=6, help="video length (frames 2..N-1 are timed)"
    )
    p.add_argument(
        "--objects", type=at_least(1), default=2, help=f"objects clicked (<= {len(CLICKS)})"
    )
    p.add_argument("--threads", type=v1.positive, default=None, help="CPU threads for each")
    p.add_argument("--rounds", type=v1.positive, default=1, help="interleaved runs per framework")
    p.add_argument("--csv", default=None, help="CSV path (a .md is written next to it)")
    p.add_argument("--workdir", default=None, help="inputs written here and reused")
    add_export_arguments(p)
    p.add_argument("--worker", choices=(*IMPLS, "prepare"), help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--video", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.objects > len(CLICKS):
        raise SystemExit(f"--objects: at most {len(CLICKS)}")
    if args.worker == "prepare":
        inputs = prepare(Path(args.checkpoint), args.frames)
        print(v1.RESULT_PREFIX + json.dumps(inputs), flush=True)
    elif args.worker:
        worker_main(args)
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
