"""What int8 calibration (``export --quantize int8 --calibration``) costs: wall time and peak
memory of NNCF's post-training quantisation of one exported file, with NNCF's statistics in
graph order (what the export does, ``paddle_sam.export.onnx.statistics_outputs_first``) and
in NNCF's own order (its statistics after the model's outputs), each in its own process.

    python benchmarks/bench_calibration.py --onnx EXPORT/vision_backbone.onnx [--images 4]
        [--orders graph,nncf] [--workdir DIR] [--out benchmarks/results]

``--onnx``: an fp32 file of an export folder, e.g. SAM 3's ``vision_backbone.onnx`` or SAM v1's
``image_encoder.onnx`` (``paddle-sam export --format onnx``). The calibration inputs are
``--images`` arrays of standard normal noise of the file's input shape (seed 0), the same for
every order: memory and time do not depend on their values, and equal inputs let the parent
check that both orders write the same weights (the ``.bin`` files' SHA-256). Peak RSS is the
child's ``ru_maxrss`` (the whole process: the model read, NNCF's copies, OpenVINO's
compilations). The file's input must have a static shape.

This is a measurement, not a test: it has no thresholds and exits 0 whatever it finds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime as dt  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import bench_sam_v1 as v1  # noqa: E402
import numpy as np  # noqa: E402

ORDERS = {
    "graph": "statistics first, in graph order (the export's)",
    "nncf": "NNCF's order (statistics after the model's outputs)",
}


def run_worker(args: argparse.Namespace) -> dict:
    """``--worker ORDER``: calibrate ``--onnx`` into ``--workdir/ORDER``; time, peak, hash."""
    import openvino

    import paddle_sam.export.onnx as export_onnx

    if args.worker == "nncf":
        export_onnx.statistics_outputs_first = contextlib.nullcontext
    source = Path(args.onnx)
    shape = openvino.Core().read_model(str(source)).inputs[0].get_partial_shape()
    if not shape.is_static:
        raise SystemExit(f"{source}: its input shape {shape} is not static")
    rng = np.random.default_rng(0)
    dims = [d.get_length() for d in shape]
    data = [rng.standard_normal(dims).astype(np.float32) for _ in range(args.images)]
    out = Path(args.workdir) / args.worker
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = export_onnx.quantize_int8(source, out / "model.int8.xml", data)
    seconds = time.perf_counter() - t0
    digest = hashlib.sha256((out / "model.int8.bin").read_bytes()).hexdigest()
    return {
        "order": args.worker,
        "seconds": seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,  # KiB
        "bin_sha256": digest,
        "input_shape": dims,
        "nncf": info["nncf"],
        "openvino": info["openvino"],
    }


def parent_main(args: argparse.Namespace) -> None:
    started = dt.datetime.now().astimezone()
    source = Path(args.onnx).resolve()
    if not source.is_file():
        raise SystemExit(f"--onnx {source}: no such file")
    files = (source, source.with_name(source.name + ".data"), source.with_suffix(".bin"))
    weights_mb = sum(p.stat().st_size for p in set(files) if p.is_file()) / 2**20
    with contextlib.ExitStack() as stack:
        work = args.workdir or stack.enter_context(tempfile.TemporaryDirectory())
        runs = {}
        for order in args.orders:
            argv = ["--worker", order, "--onnx", str(source), "--workdir", str(work)]
            argv += ["--images", str(args.images)]
            load = os.getloadavg()[0]
            runs[order] = {**v1.run_child(argv, order, __file__), "load_avg_1min_before": load}
    digests = {r["bin_sha256"] for r in runs.values()}
    same = "yes" if len(digests) == 1 else "no"
    any_run = next(iter(runs.values()))
    info = [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", v1._cpu_model()),
        ("cpu flags", v1.cpu_flags()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        ("memory", v1._ram_gib()),
        ("nncf / openvino", f"{any_run['nncf']} / {any_run['openvino']}"),
        ("file", f"{source} ({weights_mb:.0f} MB), input {any_run['input_shape']}"),
        ("calibration inputs", f"{args.images} (standard normal noise, seed 0)"),
        ("weights files equal across orders", same if len(runs) > 1 else "-"),
    ]
    header = ["statistics", "seconds", "peak RSS (MB)", "peak / file size"]
    rows = [
        [
            ORDERS[o],
            f"{r['seconds']:.0f}",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['peak_rss_mb'] / weights_mb:.1f}",
        ]
        for o, r in runs.items()
    ]
    notes = [
        f"{o}: 1-min load before {r['load_avg_1min_before']:.2f}; "
        f".bin sha256 {r['bin_sha256'][:16]}"
        for o, r in runs.items()
    ]
    stem = f"calibration_{started.strftime('%Y%m%d-%H%M%S')}"
    csv_rows = [["order", "seconds", "peak_rss_mb", "file_mb", "bin_sha256"]]
    csv_rows += [
        [o, f"{r['seconds']:.4g}", f"{r['peak_rss_mb']:.0f}", f"{weights_mb:.0f}", r["bin_sha256"]]
        for o, r in runs.items()
    ]
    v1.report(Path(args.out), stem, "int8 calibration", info, (header, rows), notes, csv_rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--onnx", required=True, help="an fp32 .onnx (or .xml) of an export folder")
    p.add_argument("--images", type=v1.positive, default=4, help="calibration inputs")
    p.add_argument(
        "--orders",
        type=lambda s: [o for o in s.split(",") if o],
        default=list(ORDERS),
        help=f"comma-separated, from {','.join(ORDERS)}",
    )
    p.add_argument("--workdir", help="where the int8 files go (default: a temporary folder)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--worker", choices=tuple(ORDERS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [o for o in args.orders if o not in ORDERS]
    if unknown:
        p.error(f"--orders: unknown {unknown}; choose from {list(ORDERS)}")
    if args.worker:
        print(v1.RESULT_PREFIX + json.dumps(run_worker(args)), flush=True)
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
