"""SAM 2.1's memory attention alone (the larger half of a tracked frame late in a video):
paddle-sam's, dynamic and exported (``memory_attention.onnx`` on OpenVINO fp32, as the exported
video predictor runs it), against the official sam2's, same weights, same inputs, each in its
own process.

    python benchmarks/bench_memory_attention.py [--memories 1,4,7] [--pointers 16]
        [--repeats 3] [--threads N] [--csv PATH]

The weights are Hiera tiny's (the memory attention is the same size in every SAM 2.1: 4 layers,
256 channels, memories of 64), written by bench_sam2's ``prepare`` (the official model's
random init, converted). The inputs are the current frame's 64 x 64 features and their
position encoding, and ``M`` memories of 4096 tokens plus ``--pointers`` object pointers of 4
tokens each (what a frame attends to with ``M`` memory frames: up to 7 in SAM 2.1), random with
a fixed seed; the outputs of both sides are compared. Median of ``--repeats`` calls after a
warm-up, seconds. A measurement, not a test: no thresholds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import bench_sam2  # noqa: E402
import bench_sam_v1 as v1  # noqa: E402
import numpy as np  # noqa: E402

IMPLS = ("paddle", "openvino", "torch")
SIDE = 64  # the memory attention's grid at 1024 px (stride 16)
SEED = 7


def inputs(memories: int, pointers: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED + memories)
    n = memories * SIDE * SIDE + 4 * pointers
    return {
        "curr": rng.standard_normal((SIDE * SIDE, 1, 256)).astype(np.float32),
        "curr_pos": rng.standard_normal((SIDE * SIDE, 1, 256)).astype(np.float32),
        "memory": rng.standard_normal((n, 1, 64)).astype(np.float32),
        "memory_pos": rng.standard_normal((n, 1, 64)).astype(np.float32),
    }


def timed(call, repeats: int) -> tuple[float, np.ndarray]:
    out = call()  # warm-up
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds), out


def time_counts(attention, to_tensor, to_numpy, args) -> dict[int, tuple[float, np.ndarray]]:
    """``{memories: (median seconds, output)}`` of ``attention`` (either framework's module,
    called the same way) over ``--memories``."""
    results = {}
    for m in (int(c) for c in args.memories.split(",")):
        x = {k: to_tensor(v) for k, v in inputs(m, args.pointers).items()}
        s, out = timed(
            lambda x=x: attention(
                curr=[x["curr"]],
                curr_pos=[x["curr_pos"]],
                memory=x["memory"],
                memory_pos=x["memory_pos"],
                num_obj_ptr_tokens=4 * args.pointers,
            ),
            args.repeats,
        )
        results[m] = (s, to_numpy(out))
    return results


def run_worker(args) -> dict:
    if args.worker in ("paddle", "openvino"):
        import paddle_sam

        paddle_sam.tune_process()
        import paddle

        from paddle_sam.loading.sam2 import build_sam2, load_sam2_export

        if args.threads:
            paddle_sam.set_num_threads(args.threads)
        if args.worker == "openvino":
            attention = load_sam2_export(args.checkpoint, video=True).memory_attention
        else:
            attention = build_sam2(bench_sam2.config("t"), args.checkpoint).memory_attention
        with paddle.no_grad():
            results = time_counts(attention, paddle.to_tensor, lambda t: t.numpy(), args)
        version = paddle.__version__
    else:
        import sam2  # noqa: F401  (initialises hydra on sam2's configs)
        import torch
        from sam2.build_sam import build_sam2

        if args.threads:
            torch.set_num_threads(args.threads)
        model = build_sam2(bench_sam2.config("t"), args.checkpoint, device="cpu")
        with torch.inference_mode():
            results = time_counts(
                model.memory_attention, torch.from_numpy, lambda t: t.numpy(), args
            )
        version = torch.__version__
    outputs = Path(args.outputs)
    for m, (_, out) in results.items():
        np.save(outputs / f"{args.worker}_{m}.npy", out)
    return {
        "impl": args.worker,
        "version": version,
        "seconds": {str(m): s for m, (s, _) in results.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--memories", default="1,4,7", help="comma list of memory-frame counts")
    p.add_argument("--pointers", type=v1.positive, default=16, help="object pointers")
    p.add_argument("--repeats", type=v1.positive, default=3)
    p.add_argument("--threads", type=v1.positive, default=None)
    p.add_argument("--csv", default=None, help="CSV path")
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--outputs", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(v1.RESULT_PREFIX + json.dumps(run_worker(args)), flush=True)
        return 0
    started = dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="bench_memattn_") as tmp:
        prepared = bench_sam2.prepare(Path(tmp), ["t"], 3, "openvino")["t"]
        paths = {"paddle": prepared["pdparams"], "openvino": prepared["paddle"]}
        paths["torch"] = prepared["torch"]
        runs = {}
        for impl in IMPLS:
            cmd = ["--worker", impl, "--checkpoint", paths[impl], "--outputs", tmp]
            cmd += ["--memories", args.memories, "--pointers", str(args.pointers)]
            cmd += ["--repeats", str(args.repeats)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            runs[impl] = v1.run_child(cmd, impl, script=__file__)
        rows = []
        for m in args.memories.split(","):
            a, o, b = (np.load(Path(tmp) / f"{i}_{int(m)}.npy") for i in IMPLS)
            s_p, s_o, s_t = (runs[i]["seconds"][m] for i in IMPLS)
            keys = int(m) * SIDE * SIDE + 4 * args.pointers
            diff_p, diff_o = (float(np.abs(x - b).max()) for x in (a, o))
            rows.append([m, keys, s_p, s_o, s_t, s_p / s_t, s_o / s_t, diff_p, diff_o])
    cpu = f"{v1._cpu_model()} ({v1.cpu_flags()})"
    print(f"\n{started:%Y-%m-%d %H:%M} UTC, {cpu}, 1-min load at end {os.getloadavg()[0]:.2f}")
    print("memories  keys    dynamic s  openvino s  official s  ratios        max abs diff")
    for m, keys, s_p, s_o, s_t, r_p, r_o, d_p, d_o in rows:
        print(
            f"{m:>8}  {keys:>6}  {s_p:9.3f}  {s_o:10.3f}  {s_t:10.3f}  {r_p:4.2f} {r_o:4.2f}"
            f"     {d_p:.1e} {d_o:.1e}"
        )
    if args.csv:
        import csv

        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    *["memories", "keys", "paddle_s", "openvino_s", "torch_s"],
                    *["paddle_ratio", "openvino_ratio", "paddle_max_abs_diff"],
                    "openvino_max_abs_diff",
                ]
            )
            w.writerows(rows)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
