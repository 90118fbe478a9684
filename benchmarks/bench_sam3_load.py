"""SAM 3 start-up on the CPU: loading the image model (paddle_sam from a converted
``.pdparams`` and from the released ``.pt``, the official sam3 from its ``.pt``) and converting
the ``.pt`` with ``paddle-sam convert``, each in its own process: seconds and peak RSS.

    python benchmarks/bench_sam3_load.py --workdir DIR [--rounds 2] [--impl ...]

``DIR/weights.json`` lists the files (``{"paddle": "x.pdparams", "torch": "x.pt"}``, as
``bench_sam3.py --workdir DIR`` writes it, or by hand for the released ``sam3.pt``); without it
``bench_sam3.py``'s prepare step writes full-size random weights there first (about 10 min).
Loading is ``build_sam3_image_model(checkpoint_path=...)`` on both sides (the model built and
the weights set, no prediction); the official side runs under sam3's CPU patches of the test
helpers, as in ``bench_sam3.py``. ``convert`` writes a ``.pdparams`` into DIR and removes it.

This is a measurement, not a test: no thresholds, exit 0 whatever the ratios.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import bench_sam_v1 as v1  # noqa: E402  (keeps the environment as it was: v1._BASE_ENV)

IMPLS = ("paddle_pdparams", "paddle_pt", "torch", "convert")
LABELS = {
    "paddle_pdparams": "paddle_sam, converted .pdparams",
    "paddle_pt": "paddle_sam, released .pt",
    "torch": "official sam3, .pt",
    "convert": "paddle-sam convert .pt -> .pdparams",
}


def run_worker(args: argparse.Namespace) -> dict:
    weights = json.loads((Path(args.workdir) / "weights.json").read_text())
    t0 = time.perf_counter()
    if args.worker == "torch":
        import torch
        from sam3 import model_builder

        from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
        from tests.helpers.sam3_ref import cpu_patches

        import_s = time.perf_counter() - t0
        with cpu_patches(), torch.inference_mode():
            t0 = time.perf_counter()
            model_builder.build_sam3_image_model(
                bpe_path=str(DEFAULT_BPE_PATH),
                device="cpu",
                checkpoint_path=weights["torch"],
                load_from_HF=False,
            )
            seconds = time.perf_counter() - t0
    else:
        import paddle_sam

        paddle_sam.tune_process()  # the settings the CLI runs with

        import_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        if args.worker == "convert":
            from paddle_sam.convert.checkpoint import convert_checkpoint

            dst = Path(args.workdir) / "bench_convert.pdparams"
            try:
                convert_checkpoint(weights["torch"], dst, "sam3", overwrite=True, progress=False)
                seconds = time.perf_counter() - t0
            finally:
                dst.unlink(missing_ok=True)
                Path(str(dst) + ".json").unlink(missing_ok=True)
        else:
            source = weights["paddle" if args.worker == "paddle_pdparams" else "torch"]
            paddle_sam.build_sam3_image_model(checkpoint_path=source)
            seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "import_s": import_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def parent_main(args: argparse.Namespace) -> None:
    started = dt.datetime.now().astimezone()
    work = Path(args.workdir)
    script = Path(__file__).resolve().parent / "bench_sam3.py"
    weights = v1.prepared_weights(work, ["--impl", "paddle,torch"], str(script))
    runs: dict[str, list[dict]] = {i: [] for i in args.impl}
    for r in range(1, args.rounds + 1):
        for impl in args.impl:
            argv = ["--worker", impl, "--workdir", str(work)]
            load = os.getloadavg()[0]
            res = v1.run_child(argv, f"round {r}/{args.rounds} {impl}", __file__)
            runs[impl].append({**res, "load_avg_1min_before": load})
    med = {
        i: {k: statistics.median(x[k] for x in rs) for k in ("seconds", "peak_rss_mb")}
        for i, rs in runs.items()
    }
    size_mb = Path(weights["torch"]).stat().st_size / 2**20
    info = [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", v1._cpu_model()),
        ("cpu flags", v1.cpu_flags()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        (
            "paddlepaddle / torch / sam3",
            " / ".join(map(v1._version, ("paddlepaddle", "torch", "sam3"))),
        ),
        ("files", f"{weights['torch']} ({size_mb:.0f} MB), {weights['paddle']}"),
        ("rounds", f"{args.rounds} (median)"),
    ]
    header = ["what", "seconds", "peak RSS (MB)", "seconds / torch", "RSS / torch"]
    rows = []
    for impl in args.impl:
        m = med[impl]
        ratio_s = ratio_m = "-"
        if "torch" in med and impl != "torch":
            ratio_s = f"{m['seconds'] / med['torch']['seconds']:.2f}"
            ratio_m = f"{m['peak_rss_mb'] / med['torch']['peak_rss_mb']:.2f}"
        rows.append(
            [LABELS[impl], f"{m['seconds']:.2f}", f"{m['peak_rss_mb']:.0f}", ratio_s, ratio_m]
        )
    notes = [
        f"{impl} round {n}: {x['seconds']:.2f} s, peak RSS {x['peak_rss_mb']:.0f} MB (import "
        f"{x['import_s']:.2f} s; 1-min load before {x['load_avg_1min_before']:.2f})"
        for impl, rs in runs.items()
        for n, x in enumerate(rs, 1)
    ]
    notes.insert(0, "ratio < 1: paddle_sam is faster / smaller; peak RSS is the whole process's")
    stem = f"sam3_load_{started.strftime('%Y%m%d-%H%M%S')}"
    csv_rows = [["impl", "seconds", "peak_rss_mb"]]
    csv_rows += [
        [impl, f"{med[impl]['seconds']:.4g}", f"{med[impl]['peak_rss_mb']:.0f}"]
        for impl in args.impl
    ]
    v1.report(Path(args.out), stem, "SAM 3 load", info, (header, rows), notes, csv_rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="folder with weights.json (or to prepare)")
    p.add_argument("--rounds", type=v1.positive, default=1)
    p.add_argument(
        "--impl",
        type=lambda t: tuple(x for x in t.split(",") if x in IMPLS) or IMPLS,
        default=IMPLS,
        help=f"comma list of {', '.join(IMPLS)} (default: all)",
    )
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(v1.RESULT_PREFIX + json.dumps(run_worker(args)), flush=True)
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
