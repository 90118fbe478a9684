"""SAM 2.1 on the CPU: paddle_sam's ``SAM2ImagePredictor`` and ``SAM2VideoPredictor`` against
the official sam2 (1.1.0), same random weights, Hiera tiny and base+.

    python benchmarks/bench_sam2.py [--models t,b+] [--repeats 3] [--frames 6] [--rounds 2]
        [--threads N] [--runtime dynamic|openvino|openvino-bf16|openvino-int8]
        [--csv benchmarks/results/sam2_<timestamp>.csv]

``--runtime openvino`` / ``openvino-bf16`` / ``openvino-int8``: paddle-sam's side is ``paddle-sam
export --quantize int8``'s folder of the same converted weights, its image encoder on OpenVINO
(fp32, bf16 where the CPU has avx512_bf16 or AMX, or the int8-weight file), the video
predictor's memory attention and memory encoder on OpenVINO fp32, the rest the dynamic model,
as ``--exported`` runs it.

A ``prepare`` worker writes a generated 640 x 480 video (JPEG frames ``0.jpg``, ``1.jpg``, ...,
quality 95: upstream reads JPEG folders) and, per model, one set of weights: the official model
built by upstream's ``build_sam2`` from its SAM 2.1 config with ``torch.manual_seed(0)``, every
tensor perturbed (``tests/helpers/sam2_ref.py``: no norm left at 1, no bias at 0) and the object
score head's bias raised by 2 (as the video parity test does: the clicked object is tracked, not
"no object"), saved in the official layout (``{"model": state_dict}``) and converted once by
``convert_checkpoint``. Each (model, framework) then runs in its own fresh process (``--worker
paddle|torch``), interleaved: paddle t, torch t, paddle b+, torch b+, for ``--rounds`` rounds;
the median over rounds is reported.

In each worker (torch under ``torch.inference_mode()``; paddle after ``paddle_sam.tune_process()``,
as the ``paddle-sam`` CLI calls it first thing):

1. Image: ``build_sam2(config, checkpoint)`` and ``SAM2ImagePredictor`` on both sides;
   ``set_image`` on a fixed 768 x 1024 image, one first call (warm-up, reported apart), then
   ``--repeats`` timed calls (median). The same calls are split, on both sides, by timing the
   modules in place: the Hiera trunk (of it: every block's attention, and of that the global
   blocks', every block's MLP, and the rest: patch and position embeddings, norms, window
   partitioning, pooling), the FPN neck, and the rest (resize and normalise, ``conv_s0`` /
   ``conv_s1``, the predictor's feature layout); the parts are means over the timed calls.
2. Video: ``build_sam2_video_predictor(config, checkpoint)``, hole filling off on both sides
   (upstream's needs its CUDA extension and is skipped on the CPU). ``init_state`` on the
   folder (upstream decodes and resizes every frame there, paddle_sam when a frame is first
   needed; reported, not part of the per-frame figure), one positive click on frame 0 (one
   object), then ``propagate_in_video`` over all frames. Frame 0 (the clicked frame) and frame
   1 (the first frame tracked from memory: one-time costs) are excluded; the figure is the
   mean wall time per frame over frames 2..N-1 between successive yields of the generator,
   split into backbone (``forward_image``), memory attention
   (``_prepare_memory_conditioned_features``), SAM decoder (``_forward_sam_heads``), memory
   encoder (``_encode_new_memory``) and the rest (frame decoding on the paddle side, mask
   resizing to the video, bookkeeping).

One CPU fact of the official video predictor is handled here only: it stores memories as
bfloat16 and relies on CUDA autocast, so on the CPU its float32 memory attention refuses them;
they are cast to float32 on the way in (``tests/models/test_sam2_video.py`` does the same).

The output check compares the image embeddings, the predicted IoUs of one click and the
tracked masks (area and mean logit per frame) of both frameworks: same weights, they must
agree, else the timings are not comparable. This is a measurement, not a test: it has no
thresholds and exits 0 whatever the ratios. The machine description, CSV number format and
child-process plumbing are bench_sam_v1's; the part timers and summaries bench_sam3_tracker's.
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

import bench_sam3_tracker as tracker_bench  # noqa: E402
import bench_sam_v1 as v1  # noqa: E402  (keeps the environment as it was: v1._BASE_ENV)
import numpy as np  # noqa: E402

IMPLS = tracker_bench.IMPLS  # ("paddle", "torch")
MODELS = {"t": "tiny", "b+": "base+"}  # SAM 2.1 configs/sam2.1/sam2.1_hiera_<key>.yaml
VIDEO_HW = (480, 640)
CLICK = (131.0, 170.0)  # (x, y) pixels on frame 0: the red square of the generated video
VIDEO_PARTS = tracker_bench.PARTS  # the same method names on SAM 2's predictors
Metric = v1.Metric
METRICS = (
    Metric("import_s", "import framework + package (s)", digits=2),
    Metric("load_s", "image model load: build + weights (s)", digits=2),
    Metric("set_image_first_s", "set_image, first call (s)", digits=2),
    Metric("set_image_s", "set_image 768x1024 (s)", digits=3),
    Metric("img_trunk_s", "  Hiera trunk (s)", digits=3),
    Metric("img_attention_s", "    of it: attention, all blocks (s)", digits=3),
    Metric("img_global_attention_s", "      of which global blocks (s)", digits=3),
    Metric("img_mlp_s", "    of it: MLP, all blocks (s)", digits=3),
    Metric("img_trunk_rest_s", "    of it: rest (norms, windows, pooling, embeds) (s)", digits=3),
    Metric("img_neck_s", "  FPN neck (s)", digits=3),
    Metric("img_other_s", "  other: transforms, conv_s0/s1, layout (s)", digits=3),
    Metric("video_load_s", "video model load: build + weights (s)", digits=2),
    Metric("init_state_s", "init_state (excluded from frames) (s)", digits=2),
    Metric("click_s", "click on frame 0 (s)", digits=3),
    Metric("first_tracked_s", "frame 1, first tracked (warm-up) (s)", digits=2),
    Metric("frame_s", "propagated frame (s/frame)", digits=3),
    Metric("part_backbone_s", "  backbone (s/frame)", digits=3),
    Metric("part_memory_attention_s", "  memory attention (s/frame)", digits=3),
    Metric("part_decoder_s", "  SAM decoder (s/frame)", digits=3),
    Metric("part_memory_encoder_s", "  memory encoder (s/frame)", digits=3),
    Metric("part_other_s", "  other (s/frame)", digits=3),
    Metric("peak_rss_mb", "peak RSS, image + video (MB)", digits=0),
)
HEADLINE = ("set_image_s", "frame_s")
_VIDEO_NOTE = (
    "memory attention and memory encoder on OpenVINO fp32, the rest dynamic; the trunk row is "
    "the whole encoder (trunk and neck), its splits 0"
)
RUNTIME_NOTES = {
    "dynamic": "the dynamic model (exact)",
    "openvino": f"paddle-sam export: image encoder on OpenVINO fp32, {_VIDEO_NOTE}",
    "openvino-bf16": f"paddle-sam export: image encoder on OpenVINO bf16 (approximate), "
    f"{_VIDEO_NOTE}",
    "openvino-int8": "paddle-sam export: image encoder on OpenVINO with int8 weights "
    f"(approximate), {_VIDEO_NOTE}",
}


def config(model: str) -> str:
    from tests.helpers.sam2_ref import config_file

    return config_file("2.1", model)


# --------------------------------------------------------------------------------- timers


class ModuleTimers:
    """Cumulative wall time of some modules' ``forward`` (wrapped in place, per instance):
    ``{part: [module, ...]}``. Works for torch modules and Paddle layers alike (both call
    ``self.forward``)."""

    def __init__(self, modules: dict[str, list[Any]]) -> None:
        self.total = dict.fromkeys(modules, 0.0)
        for part, mods in modules.items():
            for mod in mods:
                mod.forward = self._timed(part, mod.forward)

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


def image_encoder_timers(model: Any) -> ModuleTimers:
    enc = model.image_encoder
    if not hasattr(enc, "trunk"):  # an exported encoder (--runtime openvino): one part
        return ModuleTimers(
            {"trunk": [enc], "attention": [], "global_attention": [], "mlp": [], "neck": []}
        )
    return ModuleTimers(
        {
            "trunk": [enc.trunk],
            "attention": [b.attn for b in enc.trunk.blocks],
            "global_attention": [b.attn for b in enc.trunk.blocks if b.window_size == 0],
            "mlp": [b.mlp for b in enc.trunk.blocks],
            "neck": [enc.neck],
        }
    )


# --------------------------------------------------------------------------------- workers


def time_image(predictor: Any, to_numpy: Callable[[Any], np.ndarray], args) -> dict:
    """First ``set_image`` then ``args.repeats`` timed ones, split by the module timers."""
    image = v1.make_image()
    timers = image_encoder_timers(predictor.model)

    def embedding() -> np.ndarray:
        return to_numpy(predictor.get_image_embedding())

    def set_image() -> float:
        t0 = time.perf_counter()
        predictor.set_image(image)
        embedding()  # materialise the result
        return time.perf_counter() - t0

    first = set_image()
    before = timers.snapshot()
    times = [set_image() for _ in range(args.repeats)]
    after = timers.snapshot()
    parts = {p: (after[p] - before[p]) / args.repeats for p in after}
    point = v1.make_points(1)
    _, iou, _ = predictor.predict(point_coords=point, point_labels=np.array([1]))
    emb = embedding()
    return {
        "set_image_first_s": first,
        "set_image_s": statistics.median(times),
        "set_image_all_s": times,
        "img_trunk_s": parts["trunk"],
        "img_attention_s": parts["attention"],
        "img_global_attention_s": parts["global_attention"],
        "img_mlp_s": parts["mlp"],
        "img_trunk_rest_s": parts["trunk"] - parts["attention"] - parts["mlp"],
        "img_neck_s": parts["neck"],
        "img_other_s": statistics.mean(times) - parts["trunk"] - parts["neck"],
        "iou": [float(v) for v in np.asarray(iou).ravel()],
        "embedding_mean_abs": float(np.abs(emb).mean()),
    }


def timed_propagation(
    outputs: Iterator[tuple], timers: Any, to_numpy: Callable[[Any], np.ndarray]
) -> dict:
    """Consume ``propagate_in_video`` (SAM 2's ``(frame_idx, obj_ids, masks)``): wall time
    between yields, the part timers after each frame, mask area and mean logit."""
    frames, seconds, parts, areas, logits = [], [], [], [], []
    t0 = time.perf_counter()
    for frame_idx, _, masks in outputs:
        seconds.append(time.perf_counter() - t0)
        parts.append(timers.snapshot())
        m = to_numpy(masks)
        frames.append(int(frame_idx))
        areas.append(float((m > 0).mean()))
        logits.append(float(m.mean()))
        t0 = time.perf_counter()
    return {"frames": frames, "seconds": seconds, "parts": parts, "areas": areas, "logits": logits}


def time_video(video_predictor: Any, api: dict[str, Callable[..., Any]], args) -> dict:
    timers = tracker_bench.PartTimers(video_predictor, VIDEO_PARTS)
    t0 = time.perf_counter()
    state = video_predictor.init_state(video_path=args.video)
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    api["click"](state)
    click_s = time.perf_counter() - t0
    run = timed_propagation(video_predictor.propagate_in_video(state), timers, api["to_numpy"])
    return {
        "init_state_s": init_s,
        "click_s": click_s,
        "first_tracked_s": run["seconds"][1],
        **tracker_bench.per_frame(run),
        "seconds_per_frame": run["seconds"],
        "frames": run["frames"],
        "areas": run["areas"],
        "logits": run["logits"],
    }


def run_paddle_worker(args) -> dict:
    t0 = time.perf_counter()
    import paddle_sam  # first: it applies its CPU defaults before paddle loads

    paddle_sam.tune_process()  # the settings the CLI runs with
    import_s = time.perf_counter() - t0
    import paddle

    from paddle_sam._runtime import get_num_threads
    from paddle_sam.loading.sam2 import build_sam2, build_sam2_video_predictor, load_sam2_export
    from paddle_sam.predict.sam2.predictor import SAM2ImagePredictor

    paddle.set_device("cpu")
    if args.threads:
        paddle_sam.set_num_threads(args.threads)
    cfg = config(args.model)
    precision = {"openvino-bf16": "bf16", "openvino-int8": "int8"}.get(args.runtime, "fp32")

    def image_model() -> Any:
        if args.runtime == "dynamic":
            return build_sam2(cfg, args.checkpoint)
        return load_sam2_export(args.checkpoint, precision=precision)

    def video_model() -> Any:
        if args.runtime == "dynamic":
            return build_sam2_video_predictor(cfg, args.checkpoint, fill_hole_area=0)
        return load_sam2_export(args.checkpoint, video=True, precision=precision, fill_hole_area=0)

    with paddle.no_grad():
        t0 = time.perf_counter()
        predictor = SAM2ImagePredictor(image_model())
        load_s = time.perf_counter() - t0
        image = time_image(predictor, lambda t: t.numpy(), args)
        del predictor
        gc.collect()

        t0 = time.perf_counter()
        video_predictor = video_model()
        video_load_s = time.perf_counter() - t0
        api = {
            "click": lambda state: video_predictor.add_new_points_or_box(
                state, 0, 1, points=[list(CLICK)], labels=[1]
            ),
            "to_numpy": lambda t: t.numpy(),
        }
        video = time_video(video_predictor, api, args)
    return {
        "impl": "paddle",
        "version": paddle.__version__,
        "threads": get_num_threads(),
        "import_s": import_s,
        "load_s": load_s,
        "video_load_s": video_load_s,
        **image,
        **video,
    }


def float_memory_attention(video_predictor: Any) -> None:
    """Upstream's video predictor on the CPU: its bfloat16 memories cast to float32 on the
    way into its float32 memory attention (on CUDA, autocast does it)."""
    forward = video_predictor.memory_attention.forward

    def call(curr, memory, curr_pos=None, memory_pos=None, num_obj_ptr_tokens=0):
        return forward(curr, memory.float(), curr_pos, memory_pos.float(), num_obj_ptr_tokens)

    video_predictor.memory_attention.forward = call


def run_torch_worker(args) -> dict:
    t0 = time.perf_counter()
    import sam2  # noqa: F401  (initialises hydra on sam2's configs)
    import torch
    from sam2.build_sam import build_sam2, build_sam2_video_predictor
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    import_s = time.perf_counter() - t0
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config(args.model)
    with torch.inference_mode():
        t0 = time.perf_counter()
        predictor = SAM2ImagePredictor(build_sam2(cfg, args.checkpoint, device="cpu"))
        load_s = time.perf_counter() - t0
        image = time_image(predictor, lambda t: t.numpy(), args)
        del predictor
        gc.collect()

        t0 = time.perf_counter()
        video_predictor = build_sam2_video_predictor(cfg, args.checkpoint, device="cpu")
        video_load_s = time.perf_counter() - t0
        video_predictor.fill_hole_area = 0
        float_memory_attention(video_predictor)
        api = {
            "click": lambda state: video_predictor.add_new_points_or_box(
                state, 0, 1, points=np.array([CLICK], np.float32), labels=np.array([1], np.int32)
            ),
            "to_numpy": lambda t: t.float().numpy(),
        }
        video = time_video(video_predictor, api, args)
    return {
        "impl": "torch",
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "import_s": import_s,
        "load_s": load_s,
        "video_load_s": video_load_s,
        **image,
        **video,
    }


def worker_main(args) -> None:
    run = run_torch_worker if args.worker == "torch" else run_paddle_worker
    result = run(args)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB
    print(v1.RESULT_PREFIX + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------- inputs


def prepare(tmp: Path, models: Sequence[str], frames: int, runtime: str) -> dict:
    """The video folder, and per model the official ``.pt`` and its conversion (or, for an
    OpenVINO ``runtime``, the conversion's ``paddle-sam export`` folder)."""
    import torch

    from paddle_sam.convert.checkpoint import convert_checkpoint
    from tests.helpers.sam2_ref import official_model, save_official
    from tests.helpers.video import write_frames
    from tests.models.test_full_size_sam3_tracker import scene

    out: dict[str, Any] = {"video": str(write_frames(scene(frames, VIDEO_HW), tmp / "video"))}
    for model in models:
        official = official_model(config(model), seed=v1.SEED)
        with torch.no_grad():  # clicked objects present: the tracked masks are not empty
            official.sam_mask_decoder.pred_obj_score_head.layers[2].bias.add_(2.0)
        stem = f"sam2.1_hiera_{model}_random"
        pt = save_official(official, tmp / f"{stem}.pt")
        del official
        gc.collect()
        pdparams = tmp / f"{stem}.pdparams"
        convert_checkpoint(pt, pdparams, progress=False)
        out[model] = {"torch": str(pt), "paddle": str(pdparams), "pdparams": str(pdparams)}
        if runtime != "dynamic":
            from paddle_sam.export.sam2 import export_sam2
            from paddle_sam.loading.sam2 import load_sam2

            export_sam2(
                load_sam2(pdparams),
                tmp / f"{stem}_export",
                model_type=f"sam2.1_{model}",
                quantize="int8" if runtime == "openvino-int8" else None,
            )
            out[model]["paddle"] = str(tmp / f"{stem}_export")
    return out


# --------------------------------------------------------------------------------- parent


def collect(args, inputs: dict) -> dict[str, dict[str, list[dict]]]:
    """``{model: {impl: [round results]}}``, every (model, framework) interleaved per round."""
    runs: dict[str, dict[str, list[dict]]] = {m: {i: [] for i in IMPLS} for m in args.models}
    for r in range(1, args.rounds + 1):
        for model in args.models:
            for impl in IMPLS:
                argv = ["--worker", impl, "--model", model, "--video", inputs["video"]]
                argv += ["--checkpoint", inputs[model][impl], "--repeats", str(args.repeats)]
                if args.threads:
                    argv += ["--threads", str(args.threads)]
                if impl == "paddle":
                    argv += ["--runtime", args.runtime]
                load_before = os.getloadavg()[0]
                label = f"round {r}/{args.rounds} {MODELS[model]} {impl}"
                result = v1.run_child(argv, label, script=__file__)
                runs[model][impl].append({**result, "load_avg_1min_before": load_before})
    return runs


HEADER = ["model", "metric", "paddle_sam", "torch (official sam2)", "paddle/torch"]


def machine_info(args, runs, started: dt.datetime, load_at_start) -> list[tuple[str, str]]:
    first = next(iter(runs.values()))
    threads = ", ".join(f"{impl} {rs[0]['threads']}" for impl, rs in first.items()) + (
        " (--threads)" if args.threads else " (each framework's default)"
    )
    return [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", v1._cpu_model()),
        ("cpu flags", v1.cpu_flags()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        ("ram", v1._ram_gib()),
        ("load average at start", " ".join(f"{x:.2f}" for x in load_at_start)),
        ("load average at end", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("python", platform.python_version()),
        ("paddlepaddle", v1._version("paddlepaddle")),
        ("paddle-sam", v1._version("paddle-sam")),
        ("torch", v1._version("torch")),
        ("sam2", v1._version("sam2")),
        ("threads", threads),
        ("paddle settings", "paddle_sam.tune_process() called first, as the paddle-sam CLI does"),
        ("paddle runtime", RUNTIME_NOTES[args.runtime]),
        (
            "settings",
            f"SAM 2.1 {', '.join(f'hiera_{m}' for m in args.models)}, random weights; "
            f"set_image on 768x1024, {args.repeats} timed calls after one warm-up; video "
            f"{VIDEO_HW[1]}x{VIDEO_HW[0]} JPEG, {args.frames} frames, 1 object clicked on frame "
            f"0, per-frame means over frames 2..{args.frames - 1} (init_state excluded); "
            f"rounds {args.rounds} (median of rounds)",
        ),
    ]


def notes(runs: dict[str, dict[str, list[dict]]]) -> list[str]:
    out = []
    for model, by_impl in runs.items():
        p, t = by_impl["paddle"][0], by_impl["torch"][0]
        diou = np.abs(np.array(p["iou"]) - np.array(t["iou"])).max()
        da = np.abs(np.array(p["areas"]) - np.array(t["areas"])).max()
        dl = np.abs(np.array(p["logits"]) - np.array(t["logits"])).max()
        out.append(
            f"output check {MODELS[model]} (same weights): mean |image embedding| "
            f"{p['embedding_mean_abs']:.6f} vs {t['embedding_mean_abs']:.6f}, max |IoU "
            f"difference| {diou:.1e}; video, every frame: max |mask area difference| {da:.1e} "
            f"of the frame (areas {min(t['areas']):.3f}..{max(t['areas']):.3f}), max |mean "
            f"logit difference| {dl:.1e}"
        )
        # the least disturbed round of each side (on a shared machine the other tenants slow
        # some rounds of either side; the table's medians are above)
        fastest = []
        for key, label in (("set_image_s", "set_image"), ("frame_s", "propagated frame")):
            ours, theirs = (min(r[key] for r in by_impl[impl]) for impl in IMPLS)
            fastest.append(f"{label} {ours:.2f} / {theirs:.2f} s ({ours / theirs:.2f})")
        out.append(f"fastest round of each side {MODELS[model]}: {', '.join(fastest)}")
    for model, by_impl in runs.items():
        for impl, rs in by_impl.items():
            for i, r in enumerate(rs, 1):
                out.append(
                    f"{MODELS[model]} {impl} round {i}: set_image "
                    f"{' / '.join(f'{v:.2f}' for v in r['set_image_all_s'])} s (first "
                    f"{r['set_image_first_s']:.2f}), init_state {r['init_state_s']:.2f} s, "
                    f"per frame {' / '.join(f'{v:.2f}' for v in r['seconds_per_frame'])} s, "
                    f"peak RSS {r['peak_rss_mb']:.0f} MB (1-min load average before: "
                    f"{r['load_avg_1min_before']:.2f})"
                )
    return out


def write_outputs(csv_path: Path, summaries: dict, info, rows, lines) -> Path:
    """The CSV (one row per model and metric, the ratio last) and a Markdown report next to
    it."""
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "metric", "label", *IMPLS, "ratio_paddle_over_torch"])
        for model, summary in summaries.items():
            for m in METRICS:
                vals = summary[m.key]
                w.writerow(
                    [f"sam2.1_hiera_{model}", m.key, m.label.strip()]
                    + [v1._csv_num(vals.get(i)) for i in IMPLS]
                    + [v1._csv_num(tracker_bench.ratio(vals))]
                )
    md_path = csv_path.with_suffix(".md")
    md = [f"# SAM 2.1 CPU benchmark: {csv_path.stem}", ""]
    md += [f"- **{k}**: {v}" for k, v in info]
    md += ["", v1.format_table(rows, True, header=HEADER), ""]
    md += ["Ratio < 1: paddle_sam is faster / smaller.", "", *[f"- {n}" for n in lines]]
    md_path.write_text("\n".join(md) + "\n")
    return md_path


def parent_main(args) -> None:
    started, load_at_start = dt.datetime.now().astimezone(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_sam2_") as tmp:
        print(f"writing the video and the weights to {tmp}", file=sys.stderr, flush=True)
        argv = ["--worker", "prepare", "--checkpoint", tmp, "--frames", str(args.frames)]
        argv += ["--runtime", args.runtime]
        argv += ["--models", ",".join(args.models)]
        inputs = v1.run_child(argv, "video + weights", script=__file__)
        runs = collect(args, inputs)
    summaries = {m: tracker_bench.summarise(runs[m], METRICS) for m in args.models}
    rows = [
        [MODELS[m], *row]
        for m in args.models
        for row in tracker_bench.table_rows(summaries[m], METRICS)
    ]
    info = machine_info(args, runs, started, load_at_start)
    lines = notes(runs)
    print()
    print("\n".join(f"{k:>22}: {v}" for k, v in info))
    print()
    print(v1.format_table(rows, False, header=HEADER))
    print("\nratio < 1: paddle_sam is faster / smaller")
    for m in args.models:
        print(
            f"{MODELS[m]}: "
            + ", ".join(
                f"{k} {summaries[m][k]['paddle']:.3f} s vs {summaries[m][k]['torch']:.3f} s "
                f"(ratio {tracker_bench.ratio(summaries[m][k]):.2f})"
                for k in HEADLINE
            )
        )
    print("\n".join(lines))
    csv_path = Path(
        args.csv or Path(__file__).parent / "results" / f"sam2_{started:%Y%m%d-%H%M%S}.csv"
    )
    md_path = write_outputs(csv_path, summaries, info, rows, lines)
    print(f"\nwrote {csv_path}\nwrote {md_path}")


def parse_models(text: str) -> tuple[str, ...]:
    models = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        raise argparse.ArgumentTypeError(
            f"--models takes a comma list of {', '.join(MODELS)}; got {text!r}"
        )
    return models


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=parse_models, default=tuple(MODELS), help="comma list of t, b+")
    p.add_argument("--repeats", type=v1.positive, default=3, help="timed set_image calls")
    p.add_argument(
        "--frames",
        type=tracker_bench.at_least(3),
        default=6,
        help="video length (frames 2..N-1 are timed)",
    )
    p.add_argument("--threads", type=v1.positive, default=None, help="CPU threads for each")
    p.add_argument("--rounds", type=v1.positive, default=2, help="interleaved runs per framework")
    p.add_argument(
        "--runtime",
        choices=tuple(RUNTIME_NOTES),
        default="dynamic",
        help="paddle-sam's side: the dynamic model (default), or its export with the image "
        "encoder on OpenVINO in fp32 or bf16",
    )
    p.add_argument("--csv", default=None, help="CSV path (a .md is written next to it)")
    p.add_argument("--worker", choices=(*IMPLS, "prepare"), help=argparse.SUPPRESS)
    p.add_argument("--model", choices=tuple(MODELS), help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--video", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker == "prepare":
        inputs = prepare(Path(args.checkpoint), args.models, args.frames, args.runtime)
        print(v1.RESULT_PREFIX + json.dumps(inputs), flush=True)
    elif args.worker:
        worker_main(args)
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
