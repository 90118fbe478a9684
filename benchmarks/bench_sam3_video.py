"""SAM 3 dense video inference (a text prompt, every instance tracked) on the CPU:
paddle_sam's ``Sam3VideoPredictor`` against the official sam3 predictor, same full-size random
weights, on a generated 640 x 480 video, through the request API on both sides.

    python benchmarks/bench_sam3_video.py [--frames 6] [--threads N] [--rounds 1]
        [--csv benchmarks/results/sam3_video_<timestamp>.csv] [--workdir DIR]

A ``prepare`` worker writes the video (JPEG frames of tests/models/test_full_size_sam3_video.py's
scene: shapes entering and leaving) and the weights (drawn as that test draws them, in the
released ``sam3.pt`` layout, converted once by ``convert_checkpoint``), and measures with ours
the detection scores of frame 0 to set the thresholds: as in the test, random weights score
about 0.2-0.3 everywhere, so the detection and new-track thresholds are set between the 3rd and
4th best scores (3 tracked objects), with the test's settings (NMS off, association at IoU 0.5,
no temporal heuristics: hot-start would remove the overlapping tracks as duplicates). Each
framework then runs in its own fresh process (``--worker paddle|torch``) with the same
settings; with ``--rounds`` > 1 they are interleaved and the median per figure is reported.
Preparing takes about 15 minutes on 2 cores: with ``--workdir DIR`` the inputs are written to
DIR (about 7 GB) and kept, and a later run with the same DIR and ``--frames`` reuses them.

In each worker (torch under the CPU patches of tests/helpers/sam3_video.py):

1. Load: build + weights (paddle ``build_sam3_video_predictor(.pdparams)``; torch
   ``build_sam3_video_model(checkpoint_path=.pt)``, which reads the released file whole).
2. ``start_session`` on the JPEG folder and ``add_prompt`` (the text) on frame 0: the first
   backbone pass and detection.
3. ``propagate_in_video`` forward over every frame: the figure is the total time divided by
   the frames processed (outputs come in bunches with hot-start, so the time between yields
   is not per frame). The split times methods of the model instance over the propagation:
   vision backbone (``detector.backbone.forward_image``), detector (the rest of
   ``run_backbone_and_detection``), tracker propagation (``run_tracker_propagation``),
   planning with memory encoding (``run_tracker_update_planning_phase``), new tracks and
   outputs (``run_tracker_update_execution_phase`` + ``build_outputs``); "other" is the rest
   (frame decoding, post-processing, hot-start bookkeeping).

Peak RSS is ``getrusage(RUSAGE_SELF).ru_maxrss`` of each worker. The output check compares
object ids, probabilities and masks of both frameworks on every frame.

This is a measurement, not a test: it has no thresholds and exits 0 whatever the ratios.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.* (weights, patches)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime as dt  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

import bench_sam3_tracker as trk  # noqa: E402
import bench_sam_v1 as v1  # noqa: E402
import numpy as np  # noqa: E402

IMPLS = ("paddle", "torch")
TEXT = "a shape"
Metric = v1.Metric
METRICS = (
    Metric("import_s", "import framework + package (s)", digits=2),
    Metric("load_s", "model load: build + weights file (s)", digits=2),
    Metric("prompt_s", "text prompt on frame 0, first backbone pass (s)", digits=2),
    Metric("frame_s", "propagated frame, all included (s/frame)", digits=2),
    Metric("part_backbone_s", "  vision backbone (s/frame)", digits=2),
    Metric("part_detector_s", "  detector heads + NMS (s/frame)", digits=3),
    Metric("part_tracker_s", "  tracker propagation (s/frame)", digits=3),
    Metric("part_planning_s", "  matching, heuristics, memory encoding (s/frame)", digits=3),
    Metric("part_execution_s", "  new tracks, outputs (s/frame)", digits=3),
    Metric("part_other_s", "  other (s/frame)", digits=3),
    Metric("objects", "objects tracked", digits=0),
    Metric("rss_after_load_mb", "RSS after model load (MB)", digits=0),
    Metric("peak_rss_mb", "peak RSS (MB)", digits=0),
)


# --------------------------------------------------------------------------------- workers


def _settings(threshold: float) -> dict[str, Any]:
    from tests.models.test_full_size_sam3_video import SETTINGS

    return {**SETTINGS, "score_threshold_detection": threshold, "new_det_thresh": threshold}


def time_video(predictor: Any, model: Any, video: str, patches: Any) -> dict:
    """The same requests on both predictors; the parts timed on ``model``."""
    timers = trk.PartTimers(
        model,
        {
            "detection": "run_backbone_and_detection",
            "tracker": "run_tracker_propagation",
            "planning": "run_tracker_update_planning_phase",
            "execution": "run_tracker_update_execution_phase",
            "outputs": "build_outputs",
        },
    )
    backbone = trk.PartTimers(model.detector.backbone, {"backbone": "forward_image"})
    with patches():
        sid = predictor.handle_request({"type": "start_session", "resource_path": video})[
            "session_id"
        ]
        t0 = time.perf_counter()
        predictor.handle_request(
            {"type": "add_prompt", "session_id": sid, "frame_index": 0, "text": TEXT}
        )
        prompt_s = time.perf_counter() - t0
        before, before_backbone = timers.snapshot(), backbone.snapshot()
        ids, probs, masks = [], [], []
        t0 = time.perf_counter()
        for item in predictor.handle_stream_request(
            {"type": "propagate_in_video", "session_id": sid, "propagation_direction": "forward"}
        ):
            o = item["outputs"]
            ids.append([int(i) for i in o["out_obj_ids"]])
            probs.append([float(p) for p in o["out_probs"]])
            masks.append(np.packbits(np.asarray(o["out_binary_masks"]), axis=-1))
        total = time.perf_counter() - t0
    n = len(ids)
    after, after_backbone = timers.snapshot(), backbone.snapshot()
    part = {k: (after[k] - before[k]) / n for k in after}
    out = {
        "prompt_s": prompt_s,
        "frame_s": total / n,
        "part_backbone_s": (after_backbone["backbone"] - before_backbone["backbone"]) / n,
        "part_tracker_s": part["tracker"],
        "part_planning_s": part["planning"],
        "part_execution_s": part["execution"] + part["outputs"],
    }
    out["part_detector_s"] = part["detection"] - out["part_backbone_s"]
    out["part_other_s"] = out["frame_s"] - sum(
        out[k]
        for k in (
            "part_backbone_s",
            "part_detector_s",
            "part_tracker_s",
            "part_planning_s",
            "part_execution_s",
        )
    )
    out["objects"] = len({i for frame in ids for i in frame})
    out["frames"] = n
    out["ids"] = ids
    out["probs"] = probs
    out["masks"] = [m.tolist() for m in masks]
    return out


def run_paddle_worker(args) -> dict:
    t0 = time.perf_counter()
    import paddle_sam  # first: it applies its CPU defaults before paddle loads

    paddle_sam.tune_process()  # the settings the CLI runs with

    import_s = time.perf_counter() - t0
    import paddle

    from paddle_sam._runtime import get_num_threads
    from paddle_sam.loading.sam3 import build_sam3_video_predictor

    paddle.set_device("cpu")
    if args.threads:
        paddle_sam.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if args.exported:  # the export's backbone on OpenVINO, the rest from its weights
        from paddle_sam.loading.sam3 import load_sam3_export
        from paddle_sam.predict.sam3.video_predictor import Sam3VideoPredictor

        model = load_sam3_export(args.exported, "video", precision=args.precision)
        predictor = Sam3VideoPredictor(model)
    else:
        predictor = build_sam3_video_predictor(checkpoint_path=args.checkpoint)
    gc.collect()
    load_s = time.perf_counter() - t0
    rss_after_load = trk.rss_mb()
    for key, value in _settings(args.threshold).items():
        setattr(predictor.model, key, value)
    result = time_video(predictor, predictor.model, args.video, contextlib.nullcontext)
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
    from sam3.model.sam3_video_predictor import Sam3VideoPredictor

    import_s = time.perf_counter() - t0
    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
    from tests.helpers.sam3_ref import tracker_cpu_patches
    from tests.helpers.sam3_video import reference_patches

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with tracker_cpu_patches(), torch.no_grad():
        model = model_builder.build_sam3_video_model(
            checkpoint_path=args.checkpoint,
            load_from_HF=False,
            bpe_path=str(DEFAULT_BPE_PATH),
            device="cpu",
        ).eval()
    gc.collect()
    load_s = time.perf_counter() - t0
    rss_after_load = trk.rss_mb()
    for key, value in _settings(args.threshold).items():
        setattr(model, key, value)
    model.init_state = functools.partial(model.init_state, offload_video_to_cpu=True)
    predictor = Sam3VideoPredictor.__new__(Sam3VideoPredictor)
    predictor.model = model
    predictor.async_loading_frames = False
    predictor.video_loader_type = "cv2"
    predictor._get_session_stats = lambda: ""
    predictor._get_torch_and_gpu_properties = lambda: ""
    result = time_video(predictor, model, args.video, reference_patches)
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


def prepare(tmp: Path, frames: int) -> dict[str, Any]:
    """The video folder, the weights (``.pt`` and its conversion) and the threshold."""
    import paddle

    from paddle_sam.convert.checkpoint import convert_checkpoint
    from paddle_sam.loading.sam3 import build_sam3_video_predictor
    from tests.conftest import find_reference_dir
    from tests.helpers.video import write_frames
    from tests.models.test_full_size_sam3_tracker import release_memory
    from tests.models.test_full_size_sam3_video import (
        detection_scores,
        scene,
        select_thresholds,
        write_random_checkpoint,
    )

    reference_dir = find_reference_dir()
    video = write_frames(scene(frames), tmp / "video")
    pt, pdparams = tmp / "sam3_random.pt", tmp / "sam3_random.pdparams"
    write_random_checkpoint(pt, reference_dir)
    release_memory()
    convert_checkpoint(pt, pdparams, progress=False)
    release_memory()
    paddle.set_device("cpu")
    predictor = build_sam3_video_predictor(checkpoint_path=str(pdparams))
    for key, value in _settings(0.0).items():
        setattr(predictor.model, key, value)
    scores = detection_scores(predictor, str(video))
    return {
        "video": str(video),
        "torch": str(pt),
        "paddle": str(pdparams),
        "threshold": select_thresholds(scores),
    }


# --------------------------------------------------------------------------------- parent


def collect(args, inputs: dict[str, Any]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {impl: [] for impl in IMPLS}
    for r in range(1, args.rounds + 1):
        for impl in IMPLS:
            argv = ["--worker", impl, "--checkpoint", inputs[impl], "--video", inputs["video"]]
            argv += ["--threshold", repr(inputs["threshold"])]
            argv += trk.export_argv(args, impl)
            if args.threads:
                argv += ["--threads", str(args.threads)]
            load_before = os.getloadavg()[0]
            result = v1.run_child(argv, f"round {r}/{args.rounds} {impl}", script=__file__)
            runs[impl].append({**result, "load_avg_1min_before": load_before})
    return runs


def output_check(runs: dict[str, list[dict]]) -> str:
    p, t = runs["paddle"][0], runs["torch"][0]
    if p["ids"] != t["ids"]:
        return f"output check: object ids DIFFER (paddle {p['ids']}, torch {t['ids']})"
    pairs = zip(p["probs"], t["probs"], strict=True)
    dp = max((abs(a - b) for fp, ft in pairs for a, b in zip(fp, ft, strict=True)), default=0.0)
    worst = 1.0
    for mp, mt in zip(p["masks"], t["masks"], strict=True):
        a, b = (
            np.unpackbits(np.array(mp, np.uint8), axis=-1),
            np.unpackbits(np.array(mt, np.uint8), axis=-1),
        )
        for i in range(a.shape[0]):
            worst = min(worst, float((a[i] == b[i]).mean()))
    return (
        f"output check paddle vs torch (every frame and object): same object ids "
        f"({p['objects']} objects), max |probability difference| {dp:.2e}, masks equal on at "
        f"least {worst:.6%} of the pixels"
    )


def notes(runs: dict[str, list[dict]], threshold: float) -> list[str]:
    out = [output_check(runs), f"detection and new-track threshold (prepare): {threshold:.5f}"]
    for impl, rs in runs.items():
        for i, r in enumerate(rs, 1):
            out.append(
                f"{impl} round {i}: load {r['load_s']:.1f} s, prompt {r['prompt_s']:.1f} s, "
                f"{r['frames']} frames propagated at {r['frame_s']:.2f} s/frame, objects per "
                f"frame {[len(f) for f in r['ids']]}, peak RSS {r['peak_rss_mb']:.0f} MB "
                f"(1-min load average before: {r['load_avg_1min_before']:.2f})"
            )
    return out


def prepared_inputs(args, folder: str) -> dict[str, Any]:
    """The prepare worker's inputs in ``folder``: those recorded there for the same number
    of frames, or newly written (and recorded)."""
    record = Path(folder) / "inputs.json"
    if record.is_file():
        inputs = json.loads(record.read_text())
        if inputs.get("frames") == args.frames and all(
            Path(inputs[k]).exists() for k in ("video", *IMPLS)
        ):
            print(f"reusing the inputs prepared in {folder}", file=sys.stderr, flush=True)
            return inputs
    print(f"writing the video and full-size weights to {folder}", file=sys.stderr, flush=True)
    prepare_argv = ["--worker", "prepare", "--checkpoint", folder, "--frames", str(args.frames)]
    inputs = v1.run_child(prepare_argv, "video + weights + threshold", script=__file__)
    inputs["frames"] = args.frames
    record.write_text(json.dumps(inputs, indent=1))
    return inputs


def parent_main(args) -> None:
    started, load_at_start = dt.datetime.now().astimezone(), os.getloadavg()
    with contextlib.ExitStack() as stack:
        folder = args.workdir
        if folder is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_sam3_video_"))
        else:
            Path(folder).mkdir(parents=True, exist_ok=True)
        inputs = prepared_inputs(args, folder)
        runs = collect(args, inputs)
    summary = trk.summarise(runs, METRICS)
    settings = (
        f"SAM 3 dense video model, full size, random weights; video 640x480, {args.frames} "
        "frames (JPEG), text prompt on frame 0, forward propagation over every frame, rounds "
        f"{args.rounds} (median of rounds)"
    )
    info = trk.machine_info(args, runs, started, load_at_start, settings=settings)
    rows = trk.table_rows(summary, METRICS)
    lines = notes(runs, inputs["threshold"])
    print()
    print("\n".join(f"{k:>22}: {v}" for k, v in info))
    print()
    print(v1.format_table(rows, False, header=trk.HEADER))
    print("\nratio < 1: paddle_sam is faster / smaller")
    print("\n".join(lines))
    csv_path = Path(
        args.csv or Path(__file__).parent / "results" / f"sam3_video_{started:%Y%m%d-%H%M%S}.csv"
    )
    md_path = trk.write_outputs(
        csv_path, summary, info, rows, lines, METRICS, "SAM 3 dense video CPU benchmark"
    )
    print(f"\nwrote {csv_path}\nwrote {md_path}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=trk.at_least(3), default=6, help="video length")
    p.add_argument("--threads", type=v1.positive, default=None, help="CPU threads for each")
    p.add_argument("--rounds", type=v1.positive, default=1, help="interleaved runs per framework")
    p.add_argument("--csv", default=None, help="CSV path (a .md is written next to it)")
    p.add_argument(
        "--workdir", default=None, help="keep the prepared video and weights here, and reuse them"
    )
    trk.add_export_arguments(p)
    p.add_argument("--worker", choices=(*IMPLS, "prepare"), help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--video", help=argparse.SUPPRESS)
    p.add_argument("--threshold", type=float, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
