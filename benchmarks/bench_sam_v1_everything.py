"""Segment everything (the automatic mask generator) on the CPU: paddle_sam (dygraph and the
exported runtime) against the official segment-anything, same weights, same image.

    python benchmarks/bench_sam_v1_everything.py [--model-type vit_b] [--points-per-side 32]
        [--size 768x1024] [--rounds 1] [--impl paddle,static,torch] [--out benchmarks/results]

Weights: the official model's random init (``torch.manual_seed(0)``), with two heads rescaled
so that the generator's filters keep masks as they do with released weights on a photo (with
the raw random init every predicted IoU is about 0 and every stability score 0, so nothing
would pass the default thresholds and the post-processing would not be measured): the IoU
head's last layer maps to about 0.86 +- 0.06 (a third of the masks pass 0.88) and the
hypernetworks' last layers are scaled up so that the mask logits are far from the threshold
(stability scores near 1). Both frameworks load the same file (a ``.pth`` converted to
``.pdparams``, exported for the static column). Each implementation runs in its own process
(interleaved over ``--rounds``) with the generator's defaults (32 x 32 points, 64 per batch,
IoU 0.88, stability 0.95, box NMS 0.7); the time is ``generate(image)``, ``set_image``
included. The masks of every implementation are compared with torch's, record by record, and
again after an untimed run without box NMS on a 16 x 16 grid (``--check-points-per-side``):
these random masks are large blobs, so NMS leaves few of them in the timed run.
``--workdir DIR`` keeps the prepared weights (and the export) for later runs.

This is a measurement, not a test: no thresholds, exit 0 whatever the ratios.
"""

from __future__ import annotations

import os

_BASE_ENV = dict(os.environ)

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sam_v1 as base  # noqa: E402

IMPLS = ("paddle", "static", "torch")
IOU_SCALE, IOU_SHIFT = 3.0, 0.76  # iou' = 3 iou + 0.76: random init 0.03 +- 0.02 -> ~0.86
MASK_SCALE = 1000.0  # hypernetwork output x 1000: logits ~ +-50, far from the threshold


# --------------------------------------------------------------------------------- workers


def make_image(args: argparse.Namespace) -> np.ndarray:
    h, w = (int(v) for v in args.size.split("x"))
    return base.make_image((h, w))


def _records(records: list[dict], path: Path) -> None:
    """Write the generator's records (uncompressed RLE masks) as JSON for the parent."""
    out = []
    for r in records:
        seg = r["segmentation"]
        out.append(
            {
                "counts": [int(c) for c in seg["counts"]],
                "size": [int(v) for v in seg["size"]],
                "predicted_iou": float(r["predicted_iou"]),
                "stability_score": float(r["stability_score"]),
                "point_coords": [[float(v) for v in r["point_coords"][0]]],
                "bbox": [float(v) for v in r["bbox"]],
            }
        )
    path.write_text(json.dumps(out))


def run_worker(args: argparse.Namespace) -> dict:
    impl = args.worker
    t0 = time.perf_counter()
    if impl == "torch":
        import torch
        from segment_anything import SamAutomaticMaskGenerator, sam_model_registry

        if args.threads:
            torch.set_num_threads(args.threads)
        threads = torch.get_num_threads()
        model = sam_model_registry[args.model_type](checkpoint=args.checkpoint)
        ctx = torch.inference_mode()
    else:
        import contextlib

        import paddle_sam

        paddle_sam.tune_process()  # the settings the CLI runs with
        from paddle_sam import SamAutomaticMaskGenerator, sam_model_registry
        from paddle_sam._runtime import get_num_threads

        if args.threads:
            paddle_sam.set_num_threads(args.threads)
        threads = get_num_threads()
        if impl == "static":
            from paddle_sam.deploy import StaticSamPredictor

            model = StaticSamPredictor(args.checkpoint)
        else:
            model = sam_model_registry[args.model_type](checkpoint=args.checkpoint)
        ctx = contextlib.nullcontext()
    load_s = time.perf_counter() - t0
    image = make_image(args)
    gen = SamAutomaticMaskGenerator(
        model, points_per_side=args.points_per_side, output_mode="uncompressed_rle"
    )
    with ctx:
        t = time.perf_counter()
        records = gen.generate(image)
        generate_s = time.perf_counter() - t
    _records(records, Path(args.records))
    if args.check_points_per_side:
        # untimed: the same generator without box NMS on a smaller grid, so that many masks
        # (not only the few that survive NMS on these blob-like random masks) are compared
        check = SamAutomaticMaskGenerator(
            model,
            points_per_side=args.check_points_per_side,
            box_nms_thresh=1.0,
            output_mode="uncompressed_rle",
        )
        with ctx:
            _records(check.generate(image), Path(args.records + ".check.json"))
    return {
        "threads": threads,
        "load_s": load_s,
        "generate_s": generate_s,
        "masks": len(records),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def write_weights(args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    import segment_anything
    import torch

    from paddle_sam.convert.checkpoint import convert_checkpoint

    torch.manual_seed(base.SEED)
    model = segment_anything.sam_model_registry[args.model_type]()
    md = model.mask_decoder
    with torch.no_grad():
        last = md.iou_prediction_head.layers[-1]
        last.weight.mul_(IOU_SCALE)
        last.bias.mul_(IOU_SCALE).add_(IOU_SHIFT)
        for mlp in md.output_hypernetworks_mlps:
            mlp.layers[-1].weight.mul_(MASK_SCALE)
            mlp.layers[-1].bias.mul_(MASK_SCALE)
    pth = tmp / f"sam_{args.model_type}.pth"
    torch.save(model.state_dict(), pth)
    pdparams = tmp / f"sam_{args.model_type}.pdparams"
    convert_checkpoint(pth, pdparams, args.model_type, progress=False)
    paths = {"torch": str(pth), "paddle": str(pdparams)}
    if "static" in args.impl:
        from paddle_sam.export.sam_v1 import export_sam
        from paddle_sam.loading.sam_v1 import load_sam

        export_sam(
            load_sam(pdparams, args.model_type), tmp / "exported", model_type=args.model_type
        )
        paths["static"] = str(tmp / "exported")
    return paths


# --------------------------------------------------------------------------------- parent


def compare(ours: list[dict], ref: list[dict]) -> dict:
    """Same masks? count, order (the prompt point of each record), pixel agreement, scores."""
    out = {"masks": len(ours), "ref_masks": len(ref)}
    if len(ours) != len(ref):
        return out
    pairs = list(zip(ours, ref, strict=True))
    same_points = all(a["point_coords"] == b["point_coords"] for a, b in pairs)
    from paddle_sam.predict.sam_v1.amg_utils import rle_to_mask

    agree = [float((rle_to_mask(a) == rle_to_mask(b)).mean()) for a, b in pairs]
    identical = sum(a["counts"] == b["counts"] for a, b in pairs)
    diou = max((abs(a["predicted_iou"] - b["predicted_iou"]) for a, b in pairs), default=0)
    dstab = max((abs(a["stability_score"] - b["stability_score"]) for a, b in pairs), default=0)
    out.update(
        same_order=same_points,
        identical_masks=identical,
        min_pixel_agreement=min(agree, default=1.0),
        max_iou_diff=diou,
        max_stability_diff=dstab,
    )
    return out


def parent_main(args: argparse.Namespace) -> None:
    started = dt.datetime.now().astimezone()
    rows: dict[str, list[dict]] = {impl: [] for impl in args.impl}
    checks: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_everything_") as tmp:
        tmp_path = Path(tmp)
        work = Path(args.workdir) if args.workdir else tmp_path
        weights = base.prepared_weights(work, common_argv(args), __file__)
        for r in range(1, args.rounds + 1):
            for impl in args.impl:
                records = tmp_path / f"{impl}_{r}.json"  # + ".check.json": the check run
                argv = ["--worker", impl, "--checkpoint", weights[impl], "--records", str(records)]
                load = os.getloadavg()[0]
                res = base.run_child(argv + common_argv(args), f"round {r} {impl}", __file__)
                rows[impl].append({**res, "load_avg_1min_before": load})
        if "torch" in args.impl:
            suffixes = [("", "")]
            if args.check_points_per_side:
                suffixes.append((".check.json", f", no NMS, {args.check_points_per_side}^2 points"))
            for suffix, label in suffixes:
                ref = json.loads((tmp_path / f"torch_1.json{suffix}").read_text())
                for impl in args.impl:
                    if impl != "torch":
                        ours = json.loads((tmp_path / f"{impl}_1.json{suffix}").read_text())
                        checks[f"{impl}{label}"] = compare(ours, ref)
    med = {
        impl: {
            k: statistics.median(r[k] for r in rs) for k in ("generate_s", "load_s", "peak_rss_mb")
        }
        for impl, rs in rows.items()
    }
    info = [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", base._cpu_model()),
        ("cpu flags", base.cpu_flags()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        ("threads", ", ".join(f"{i} {rs[0]['threads']}" for i, rs in rows.items())),
        ("paddlepaddle", base._version("paddlepaddle")),
        ("torch", base._version("torch")),
        (
            "settings",
            f"{args.model_type}, image {args.size}, {args.points_per_side}x{args.points_per_side} "
            f"points, generator defaults, rounds {args.rounds} (median)",
        ),
    ]
    header = ["metric", *args.impl] + [f"{i}/torch" for i in args.impl if i != "torch"]
    metrics = [
        ("generate_s", "segment everything: generate(image) (s)", 1),
        ("peak_rss_mb", "peak RSS (MB)", 0),
        ("load_s", "model load (s)", 2),
    ]
    table = []
    for key, label, digits in metrics:
        vals = {i: med[i][key] for i in args.impl}
        row = [label] + [f"{vals[i]:.{digits}f}" for i in args.impl]
        for i in args.impl:
            if i != "torch":
                row.append(f"{vals[i] / vals['torch']:.2f}" if "torch" in vals else "-")
        table.append(row)
    notes = [f"{i} vs torch: {json.dumps(c)}" for i, c in checks.items()]
    for impl, rs in rows.items():
        for n, r in enumerate(rs, 1):
            notes.append(
                f"{impl} round {n}: generate {r['generate_s']:.1f} s, {r['masks']} masks, peak RSS "
                f"{r['peak_rss_mb']:.0f} MB (1-min load before: {r['load_avg_1min_before']:.2f})"
            )
    print()
    print("\n".join(f"{k:>18}: {v}" for k, v in info))
    print()
    print(base.format_table(table, markdown=False, header=header))
    print("\nratio < 1: paddle_sam is faster / smaller (paddle: SamAutomaticMaskGenerator on the")
    print("dygraph model; static: the same generator on StaticSamPredictor, Paddle Inference)")
    print("\n".join(notes))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"sam_v1_everything_{started.strftime('%Y%m%d-%H%M%S')}"
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["metric", *args.impl, *(f"ratio_{i}_over_torch" for i in args.impl if i != "torch")]
        )
        for key, _, _ in metrics:
            vals = [med[i][key] for i in args.impl]
            ratios = [
                med[i][key] / med["torch"][key]
                for i in args.impl
                if i != "torch" and "torch" in med
            ]
            w.writerow([key, *(f"{v:.6g}" for v in vals), *(f"{r:.4g}" for r in ratios)])
    md = [f"# Segment everything: {stem}", "", *(f"- **{k}**: {v}" for k, v in info), ""]
    md += [base.format_table(table, markdown=True, header=header), "", *(f"- {n}" for n in notes)]
    (out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print(f"\nwrote {out / stem}.csv and .md")


# --------------------------------------------------------------------------------- cli


def common_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--model-type", args.model_type, "--points-per-side", str(args.points_per_side)]
    argv += ["--size", args.size, "--impl", ",".join(args.impl)]
    argv += ["--check-points-per-side", str(args.check_points_per_side)]
    return argv + (["--threads", str(args.threads)] if args.threads else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-type", default="vit_b", choices=["vit_b", "vit_l", "vit_h"])
    p.add_argument("--points-per-side", type=int, default=32)
    p.add_argument("--size", default="768x1024", help="image H x W (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--check-points-per-side",
        type=int,
        default=16,
        help="after the timed run, an untimed one without box NMS on this grid whose masks are "
        "compared too (0: none; default: %(default)s)",
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--impl", type=base.parse_impls, default=IMPLS)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument(
        "--workdir",
        default=None,
        help="keep the prepared weights here and reuse them in later runs (same settings)",
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", default=None, help=argparse.SUPPRESS)
    p.add_argument("--records", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "prepare":
        paths = write_weights(args, Path(args.checkpoint))
        print(base.RESULT_PREFIX + json.dumps(paths), flush=True)
    elif args.worker:
        print(base.RESULT_PREFIX + json.dumps(run_worker(args)), flush=True)
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
