"""Dataset labelling throughput on the CPU: ``paddle-sam label`` with the local engine (1 and
2 workers) and the Ray engine on a two-node local cluster, against a plain Python loop over the
official predictor, same weights and images. Two jobs (``--mode``):

- ``everything``: ``label --everything`` (ViT-B, ``--points-per-side``) against a loop over
  segment-anything's ``SamAutomaticMaskGenerator(sam).generate`` with the same options;
  weights: ``bench_sam_v1_everything.py``'s (ViT-B random init with the IoU and mask heads
  rescaled so the filters keep masks), prepared in ``--workdir`` (reused).
- ``concepts``: ``label --text star --text ring`` (full-size SAM 3) against a loop over the
  official sam3 ``Sam3Processor`` (``set_image``, then ``set_text_prompt`` per concept after
  ``reset_all_prompts``; threshold 0.5 on both sides); weights: ``--sam3-weights``, a
  ``weights.json`` listing ``{"paddle": x.pdparams, "torch": x.pt}`` (``bench_sam3.py
  --workdir`` writes one; without it, full-size random weights are written to ``--workdir``).

    python benchmarks/bench_label.py --workdir /tmp/lb [--mode everything] [--images 4]
    python benchmarks/bench_label.py --workdir /tmp/lb --mode concepts \
        --sam3-weights DIR/weights.json

Images: ``--images`` generated 480 x 640 scenes. Every configuration runs in its own process
(the Ray one on a cluster of two nodes started for it on 127.0.0.1, one CPU each, stopped
afterwards); the time is the whole job, model loading and worker start-up included, so
images/s is what a user sees for that many images.

This is a measurement, not a test: no thresholds, exit 0 whatever the figures.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import bench_sam_v1 as v1  # noqa: E402  (keeps the environment as it was: v1._BASE_ENV)
import numpy as np  # noqa: E402

CONFIGS = ("local1", "local2", "ray2", "torch")
LABELS = {
    "local1": "paddle-sam label, local engine, 1 worker",
    "local2": "paddle-sam label, local engine, 2 workers",
    "ray2": "paddle-sam label, Ray engine, 2 nodes x 1 actor",
    "torch": "plain loop over segment-anything's generator",
}
TORCH_LOOPS = {
    "everything": "plain loop over segment-anything's generator",
    "concepts": "plain loop over sam3's Sam3Processor",
}
CONCEPTS = ("star", "ring")


def images_dir(work: Path, n: int) -> Path:
    """The folder of exactly ``n`` generated images (one per count: a job labels a folder)."""
    return work / f"images_{n}"


def sam3_weights(work: Path, given: str | None) -> dict:
    """``{"paddle": ..., "torch": ...}`` of full-size SAM 3: ``given`` (a weights.json), else
    random weights written to ``work`` once (``bench_sam3.write_weights``)."""
    if given is not None:
        return json.loads(Path(given).read_text())
    listing = work / "sam3_weights.json"
    if not listing.is_file():
        import bench_sam3

        paths = bench_sam3.write_weights(("paddle", "torch"), work)
        listing.write_text(json.dumps({k: str(v) for k, v in paths.items()}))
    return json.loads(listing.read_text())


def prepare(work: Path, n: int, args: argparse.Namespace) -> dict:
    if args.mode == "concepts":
        weights = sam3_weights(work, args.sam3_weights)
    else:
        script = Path(__file__).resolve().parent / "bench_sam_v1_everything.py"
        argv = ["--impl", "paddle,torch", "--points-per-side", str(args.points_per_side)]
        weights = v1.prepared_weights(work, argv, str(script))
    images = images_dir(work, n)
    images.mkdir(exist_ok=True)
    from PIL import Image

    for i in range(n):
        path = images / f"img{i:03d}.png"
        if not path.exists():
            img = v1.make_image((480, 640))
            Image.fromarray(np.roll(img, 37 * i, axis=1)).save(path)
    return weights


def run_torch_concepts(weights: dict, images: Path) -> dict:
    import torch
    from PIL import Image
    from sam3 import model_builder
    from sam3.model.sam3_image_processor import Sam3Processor

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
    from tests.helpers.sam3_ref import cpu_patches  # sam3 0.1.4's CUDA-only spots

    t = time.perf_counter()
    found = 0
    with cpu_patches(), torch.inference_mode():
        model = model_builder.build_sam3_image_model(
            bpe_path=str(DEFAULT_BPE_PATH),
            device="cpu",
            checkpoint_path=weights["torch"],
            load_from_HF=False,
        )
        processor = Sam3Processor(model, device="cpu", confidence_threshold=0.5)
        for path in sorted(images.glob("*.png")):
            state = processor.set_image(Image.open(path).convert("RGB"))
            for text in CONCEPTS:
                processor.reset_all_prompts(state)
                state = processor.set_text_prompt(text, state)
                found += len(state["scores"])
    return {"seconds": time.perf_counter() - t, "annotations": found}


def run_torch(args: argparse.Namespace, weights: dict, images: Path) -> dict:
    if args.mode == "concepts":
        return run_torch_concepts(weights, images)
    import torch
    from PIL import Image
    from segment_anything import SamAutomaticMaskGenerator, sam_model_registry

    t = time.perf_counter()
    sam = sam_model_registry["vit_b"](checkpoint=weights["torch"])
    gen = SamAutomaticMaskGenerator(sam, points_per_side=args.points_per_side)
    masks = 0
    with torch.inference_mode():
        for path in sorted(images.glob("*.png")):
            masks += len(gen.generate(np.asarray(Image.open(path).convert("RGB"))))
    return {"seconds": time.perf_counter() - t, "annotations": masks}


def _label_argv(args, weights: dict, images: Path, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "paddle_sam", "label", str(images), "-o", str(out)]
    argv += ["--checkpoint", weights["paddle"], "--overwrite", "--quiet", "--shard-size", "1"]
    if args.mode == "concepts":
        return argv + [x for c in CONCEPTS for x in ("--text", c)]
    return argv + ["--everything", "--points-per-side", str(args.points_per_side)]


def run_label(config: str, args, weights: dict, images: Path, work: Path) -> dict:
    out = work / f"out_{config}"
    argv = _label_argv(args, weights, images, out)
    env = dict(v1._BASE_ENV)
    ray = str(Path(sys.executable).parent / "ray")
    if config == "local2":
        argv += ["--num-workers", "2"]
    if config == "ray2":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env["RAY_AUTH_MODE"] = "disabled"  # a throwaway loopback cluster
        opts = ["--num-cpus=1", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
        head = [ray, "start", "--head", f"--port={port}", "--include-dashboard=false", *opts]
        subprocess.run(head, env=env, check=True, capture_output=True)
        node = [ray, "start", f"--address=127.0.0.1:{port}", *opts]
        subprocess.run(node, env=env, check=True, capture_output=True)
        argv += ["--engine", "ray", "--ray-address", f"127.0.0.1:{port}", "--num-workers", "2"]
    t = time.perf_counter()
    try:
        subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    finally:
        if config == "ray2":
            subprocess.run([ray, "stop", "--force"], env=env, capture_output=True)
    seconds = time.perf_counter() - t
    report = json.loads((out / "report.json").read_text())
    return {"seconds": seconds, "annotations": report["annotations"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--images", type=v1.positive, default=4)
    p.add_argument("--points-per-side", type=v1.positive, default=16)
    p.add_argument("--mode", choices=("everything", "concepts"), default="everything")
    p.add_argument("--sam3-weights", default=None, help="--mode concepts: a weights.json")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    n_img = args.images
    if args.worker == "torch":
        if args.mode == "concepts":
            weights = sam3_weights(work, args.sam3_weights)
        else:
            weights = json.loads((work / "weights.json").read_text())
        res = run_torch(args, weights, images_dir(work, args.images))
        print(v1.RESULT_PREFIX + json.dumps(res), flush=True)
        return 0
    started = dt.datetime.now().astimezone()
    weights = prepare(work, args.images, args)
    results = {}
    for config in [c for c in args.configs.split(",") if c in CONFIGS]:
        load = os.getloadavg()[0]
        if config == "torch":
            argv_t = ["--worker", "torch", "--workdir", str(work), "--mode", args.mode]
            argv_t += ["--points-per-side", str(args.points_per_side), "--images", str(n_img)]
            if args.sam3_weights:
                argv_t += ["--sam3-weights", args.sam3_weights]
            res = v1.run_child(argv_t, "torch loop", __file__)
        else:
            res = run_label(config, args, weights, images_dir(work, args.images), work)
            print(f"  {config}: {res['seconds']:.0f} s", file=sys.stderr, flush=True)
        results[config] = {**res, "load_avg_1min_before": load}
    n = args.images
    header = ["configuration", "seconds", "images/s", "vs torch loop", "masks"]
    rows = []
    for c, r in results.items():
        ratio = "-"
        if "torch" in results and c != "torch":
            ratio = f"{r['seconds'] / results['torch']['seconds']:.2f}"
        rows.append(
            [
                TORCH_LOOPS[args.mode] if c == "torch" else LABELS[c],
                f"{r['seconds']:.1f}",
                f"{n / r['seconds']:.3f}",
                ratio,
                str(r["annotations"]),
            ]
        )
    info = [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", v1._cpu_model()),
        ("cpu flags", v1.cpu_flags()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        (
            "settings",
            f"ViT-B, {n} images 480x640, {args.points_per_side}^2 points, shard size 1"
            if args.mode == "everything"
            else f"SAM 3 full size, {n} images 480x640, concepts {', '.join(CONCEPTS)}, "
            "threshold 0.5, shard size 1",
        ),
    ]
    notes = []
    if "ray2" in results and "local2" in results:
        extra = (results["ray2"]["seconds"] - results["local2"]["seconds"]) / n
        notes.append(f"Ray engine over the local engine (2 workers): {extra:+.1f} s per image")
    print()
    print("\n".join(f"{k:>18}: {v}" for k, v in info))
    print()
    print(v1.format_table(rows, markdown=False, header=header))
    print("\n".join(notes))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"label_{args.mode}_{started.strftime('%Y%m%d-%H%M%S')}"
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "seconds", "images_per_s", "annotations"])
        for c, r in results.items():
            w.writerow([c, f"{r['seconds']:.4g}", f"{n / r['seconds']:.4g}", r["annotations"]])
    md = [f"# Labelling: {stem}", "", *(f"- **{k}**: {v}" for k, v in info), ""]
    md += [v1.format_table(rows, markdown=True, header=header), "", *(f"- {x}" for x in notes)]
    (out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print(f"\nwrote {out / stem}.csv and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
