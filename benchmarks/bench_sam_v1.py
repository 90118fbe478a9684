"""SAM v1 on the CPU: paddle_sam (dygraph and static) against the official PyTorch
segment-anything, same weights.

    python benchmarks/bench_sam_v1.py --model-type vit_b [--repeats 3] [--prompts 20]
        [--rounds 2] [--threads N] [--impl paddle,static,torch] [--out benchmarks/results]

The parent process writes one set of random weights (the official torch model's random init,
saved as a ``.pth``, converted to ``.pdparams`` with paddle_sam's converter and exported to
PIR programs with ``export_sam``), then runs each implementation in its own subprocess
(``--worker paddle|static|torch``): ``paddle`` is ``SamPredictor`` (dygraph; ``paddle_modules``
the same with ``fast_decoder = False``, upstream's decoder modules per prompt), ``static`` is
``StaticSamPredictor`` (Paddle Inference), ``torch`` is segment-anything's ``SamPredictor``.
They are interleaved for ``--rounds`` rounds; the median per implementation is reported, with
warm-up calls excluded. Each worker prints one JSON line.

This is a measurement, not a test: it has no thresholds and exits 0 whatever the ratios.
See benchmarks/README.md for what each number means.
"""

from __future__ import annotations

import os

# Paddle sets OMP_NUM_THREADS=1 in os.environ when imported; keep the user's environment as it
# was so every worker starts from it (and gets its framework's defaults) whatever ran here.
_BASE_ENV = dict(os.environ)

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from importlib import metadata  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

IMPLS = ("paddle", "paddle_modules", "static", "torch")
RATIOS = ("paddle", "paddle_modules", "static")  # each over torch
IMAGE_HW = (768, 1024)
RESULT_PREFIX = "BENCH_RESULT "
SEED = 0


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    scale: float = 1.0  # worker value (seconds / MB) -> displayed unit
    digits: int = 3


METRICS = (
    Metric("import_s", "import framework + package (s)", digits=2),
    Metric("load_s", "model load: build + weights (s)", digits=2),
    Metric("set_image_first_s", "set_image, first call (s)", digits=2),
    Metric("set_image_s", "set_image 768x1024 (s)", digits=2),
    Metric("predict_point_ms", "predict, 1 point, 3 masks (ms)", scale=1e3, digits=1),
    Metric("predict_box_ms", "predict, 1 box, 1 mask (ms)", scale=1e3, digits=1),
    Metric("peak_rss_mb", "peak RSS (MB)", digits=0),
)
_WORKER_KEYS = {
    "predict_point_ms": "predict_point_s",
    "predict_box_ms": "predict_box_s",
}


# --------------------------------------------------------------------------------- inputs


def make_image(hw: tuple[int, int] = IMAGE_HW) -> np.ndarray:
    """A fixed H x W x 3 uint8 RGB image: smooth gradients, a few discs and mild noise."""
    h, w = hw
    rng = np.random.default_rng(SEED)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([xx / w, yy / h, 0.5 + 0.5 * np.sin(xx / 37.0) * np.cos(yy / 53.0)], axis=-1)
    for _ in range(8):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(40, 160)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 1, 3)
    img += rng.normal(0, 0.02, img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def make_points(n: int, hw: tuple[int, int] = IMAGE_HW) -> np.ndarray:
    """``n`` different (x, y) pixel points inside the image: n x 2 float32."""
    h, w = hw
    rng = np.random.default_rng(SEED + 1)
    return np.stack([rng.uniform(0, w - 1, n), rng.uniform(0, h - 1, n)], axis=1).astype(np.float32)


def make_boxes(n: int, hw: tuple[int, int] = IMAGE_HW) -> np.ndarray:
    """``n`` different boxes (x0, y0, x1, y1) inside the image: n x 4 float32."""
    h, w = hw
    rng = np.random.default_rng(SEED + 2)
    x0, y0 = rng.uniform(0, w * 0.6, n), rng.uniform(0, h * 0.6, n)
    bw, bh = rng.uniform(0.1, 0.4, n) * w, rng.uniform(0.1, 0.4, n) * h
    return np.stack([x0, y0, x0 + bw, y0 + bh], axis=1).astype(np.float32)


# --------------------------------------------------------------------------------- workers


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_predictor(
    predictor: Any, embedding: Callable[[], np.ndarray], args: argparse.Namespace
) -> dict:
    """Time set_image and predict on the fixed inputs; the same calls for both frameworks."""
    image = make_image()
    points = make_points(args.prompts + 1)
    boxes = make_boxes(args.prompts + 1)
    label = np.array([1], dtype=np.int64)

    def set_image() -> None:
        predictor.set_image(image)
        embedding()  # materialise the result (a no-op wait on the CPU, a sync elsewhere)

    first = _timed(set_image)
    set_times = [_timed(set_image) for _ in range(args.repeats)]
    iou_first = predictor.predict(point_coords=points[1:2], point_labels=label)[1]

    def point(i: int) -> float:
        return _timed(lambda: predictor.predict(points[i : i + 1], label, multimask_output=True))

    def box(i: int) -> float:
        return _timed(lambda: predictor.predict(box=boxes[i], multimask_output=False))

    point(0)  # warm-up calls, excluded
    box(0)
    point_times = [point(i) for i in range(1, args.prompts + 1)]
    box_times = [box(i) for i in range(1, args.prompts + 1)]
    emb = embedding()
    return {
        "set_image_first_s": first,
        "set_image_s": statistics.median(set_times),
        "set_image_all_s": set_times,
        "predict_point_s": statistics.median(point_times),
        "predict_box_s": statistics.median(box_times),
        "iou_first_point": [float(v) for v in np.asarray(iou_first).ravel()],
        "embedding_mean_abs": float(np.abs(emb).mean()),
    }


def run_paddle_worker(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    import paddle_sam  # first: it applies its CPU defaults before paddle loads

    paddle_sam.tune_process()  # the settings the CLI runs with

    import_s = time.perf_counter() - t0
    import paddle  # already loaded by paddle_sam

    from paddle_sam._runtime import get_num_threads

    paddle.set_device("cpu")
    if args.threads:
        paddle_sam.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = paddle_sam.sam_model_registry[args.model_type](checkpoint=args.checkpoint)
    load_s = time.perf_counter() - t0
    predictor = paddle_sam.SamPredictor(model)
    predictor.fast_decoder = args.worker == "paddle"  # paddle_modules: upstream's module path
    with paddle.no_grad():
        result = time_predictor(predictor, lambda: predictor.get_image_embedding().numpy(), args)
    return {
        "impl": args.worker,
        "version": paddle.__version__,
        "threads": get_num_threads(),
        "import_s": import_s,
        "load_s": load_s,
        **result,
    }


def run_static_worker(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    import paddle_sam

    paddle_sam.tune_process()  # the settings the CLI runs with
    from paddle_sam.deploy import StaticSamPredictor

    import_s = time.perf_counter() - t0
    import paddle

    t0 = time.perf_counter()
    predictor = StaticSamPredictor(args.checkpoint, threads=args.threads)
    load_s = time.perf_counter() - t0
    result = time_predictor(predictor, predictor.get_image_embedding, args)
    return {
        "impl": "static",
        "version": paddle.__version__,
        "threads": args.threads or paddle_sam._runtime.cpu_count(),
        "onednn": predictor.options["onednn"],
        "import_s": import_s,
        "load_s": load_s,
        **result,
    }


def run_torch_worker(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    import segment_anything
    import torch

    import_s = time.perf_counter() - t0
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = segment_anything.sam_model_registry[args.model_type](checkpoint=args.checkpoint)
    load_s = time.perf_counter() - t0
    predictor = segment_anything.SamPredictor(model)
    with torch.inference_mode():
        result = time_predictor(predictor, lambda: predictor.get_image_embedding().numpy(), args)
    return {
        "impl": "torch",
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "import_s": import_s,
        "load_s": load_s,
        **result,
    }


def worker_main(args: argparse.Namespace) -> None:
    run = {"paddle": run_paddle_worker, "paddle_modules": run_paddle_worker}
    run.update(static=run_static_worker, torch=run_torch_worker)
    run = run[args.worker]
    result = run(args)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------- weights


def write_weights(model_type: str, impls: Sequence[str], tmp: Path) -> dict[str, Path]:
    """One set of random weights, as the file each implementation loads: {impl: path}."""
    from paddle_sam.convert.checkpoint import convert_checkpoint
    from paddle_sam.convert.core import save_pdparams
    from paddle_sam.convert.sam_v1 import convert_state_dict, random_official_state_dict
    from paddle_sam.models.sam_v1.build_sam import SAM_SPECS

    spec = SAM_SPECS[model_type]
    pdparams = tmp / f"sam_{model_type}.pdparams"
    paths: dict[str, Path] = {}
    if "torch" not in impls:  # no torch needed: random weights in the official layout
        state = convert_state_dict(random_official_state_dict(spec, seed=SEED), spec)
        save_pdparams(state, pdparams, {"model_type": model_type, "spec": spec.to_dict()})
    else:
        import segment_anything
        import torch

        torch.manual_seed(SEED)
        pth = tmp / f"sam_{model_type}.pth"
        torch.save(segment_anything.sam_model_registry[model_type]().state_dict(), pth)
        paths["torch"] = pth
        convert_checkpoint(pth, pdparams, model_type, progress=False)
    for impl in ("paddle", "paddle_modules"):
        if impl in impls:
            paths[impl] = pdparams
    if "static" in impls:
        from paddle_sam.export.sam_v1 import export_sam
        from paddle_sam.loading.sam_v1 import load_sam

        export_sam(load_sam(pdparams, model_type), tmp / "exported", model_type=model_type)
        paths["static"] = tmp / "exported"
    return paths


def prepare_main(args: argparse.Namespace) -> None:
    paths = write_weights(args.model_type, args.impl, Path(args.checkpoint))
    print(RESULT_PREFIX + json.dumps({k: str(v) for k, v in paths.items()}), flush=True)


# --------------------------------------------------------------------------------- parent


def run_child(argv: list[str], label: str, script: str = __file__) -> dict:
    """Run ``script`` (default: this one) with ``argv`` in a fresh interpreter, from the
    environment this process started with; return its JSON result line."""
    cmd = [sys.executable, os.path.abspath(script), *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_BASE_ENV, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise RuntimeError(f"{label} failed (exit {proc.returncode}): {' '.join(cmd)}")
    print(f"  {label}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def prepared_weights(work: Path, prepare_argv: list[str], script: str = __file__) -> dict:
    """``{impl: path}`` of the weights a ``--worker prepare`` run of ``script`` writes into
    ``work`` (``prepare_argv``: its other arguments), listed in ``work/weights.json``: reused
    when that file exists (an earlier run, or written by hand), else prepared and listed."""
    listed = work / "weights.json"
    if listed.is_file():
        print(f"reusing the weights listed in {listed}", file=sys.stderr, flush=True)
        return json.loads(listed.read_text())
    work.mkdir(parents=True, exist_ok=True)
    print(f"writing the weights to {work}", file=sys.stderr, flush=True)
    argv = ["--worker", "prepare", "--checkpoint", str(work), *prepare_argv]
    weights = run_child(argv, "weights", script)
    listed.write_text(json.dumps({k: str(v) for k, v in weights.items()}))
    return weights


def worker_argv(args: argparse.Namespace, impl: str, checkpoint: Path) -> list[str]:
    argv = ["--worker", impl, "--checkpoint", str(checkpoint), "--model-type", args.model_type]
    argv += ["--repeats", str(args.repeats), "--prompts", str(args.prompts)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    return argv


def collect(args: argparse.Namespace, weights: dict[str, Path]) -> dict[str, list[dict]]:
    """Interleave the workers: paddle, torch, paddle, torch ... for ``args.rounds`` rounds."""
    runs: dict[str, list[dict]] = {impl: [] for impl in args.impl}
    for r in range(1, args.rounds + 1):
        for impl in args.impl:
            label = f"round {r}/{args.rounds} {impl}"
            load_before = os.getloadavg()[0]
            result = run_child(worker_argv(args, impl, weights[impl]), label)
            runs[impl].append({**result, "load_avg_1min_before": load_before})
    return runs


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Median over rounds of every metric, in display units: {metric key: {impl: value}}."""
    out: dict[str, dict[str, float]] = {}
    for m in METRICS:
        src = _WORKER_KEYS.get(m.key, m.key)
        out[m.key] = {
            impl: statistics.median(r[src] for r in rs) * m.scale for impl, rs in runs.items() if rs
        }
    return out


def ratio(values: dict[str, float], impl: str) -> float | None:
    if impl in values and "torch" in values and values["torch"] > 0:
        return values[impl] / values["torch"]
    return None


def table_rows(summary: dict[str, dict[str, float]]) -> list[list[str]]:
    rows = []
    for m in METRICS:
        vals = summary[m.key]
        rs = [ratio(vals, impl) for impl in RATIOS]
        rows.append(
            [m.label]
            + [f"{vals[i]:.{m.digits}f}" if i in vals else "-" for i in IMPLS]
            + ["-" if r is None else f"{r:.2f}" for r in rs]
        )
    return rows


TABLE_HEADER = ["metric", "paddle dygraph", "dygraph, module decoder", "paddle static", "torch"] + [
    f"{'dygraph' if i == 'paddle' else i}/torch" for i in RATIOS
]


def format_table(rows: list[list[str]], markdown: bool, header: list[str] = TABLE_HEADER) -> str:
    """The rows under ``header``, as markdown or as aligned plain text."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x[i])) for x in [header, *rows]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        cells = zip(row, widths, strict=True)
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells))

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    """The CPU features that matter for these kernels, detected at run time."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return "unknown"
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")
    return " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in wanted)


def _ram_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info(
    args: argparse.Namespace, runs: dict[str, list[dict]], started: dt.datetime
) -> list[tuple[str, str]]:
    threads = ", ".join(f"{impl} {rs[0].get('threads')}" for impl, rs in runs.items() if rs) + (
        " (--threads)" if args.threads else " (each framework's default)"
    )
    return [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", _cpu_model()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        ("ram", _ram_gib()),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("python", platform.python_version()),
        ("paddlepaddle", _version("paddlepaddle")),
        ("paddle-sam", _version("paddle-sam")),
        ("torch", _version("torch")),
        ("segment-anything", _version("segment-anything")),
        (
            "static runtime",
            "Paddle Inference, CPU, oneDNN: "
            + str((runs.get("static") or [{}])[0].get("onednn", "-")),
        ),
        ("threads", threads),
        (
            "settings",
            f"{args.model_type}, image {IMAGE_HW[0]}x{IMAGE_HW[1]}, repeats {args.repeats}, "
            f"prompts {args.prompts}, rounds {args.rounds} (median of rounds)",
        ),
    ]


def agreement(runs: dict[str, list[dict]]) -> str:
    """How close the two outputs are: a sanity check that both did the same work."""
    if not runs.get("torch"):
        return "output check: needs torch"
    t = runs["torch"][0]
    parts = []
    for impl in RATIOS:
        if runs.get(impl):
            p = runs[impl][0]
            diou = np.abs(np.array(p["iou_first_point"]) - np.array(t["iou_first_point"])).max()
            parts.append(
                f"max |IoU {impl} - torch| = {diou:.2e}, mean |embedding| "
                f"{p['embedding_mean_abs']:.6f} vs {t['embedding_mean_abs']:.6f}"
            )
    return "output check (same weights): " + "; ".join(parts)


def raw_lines(runs: dict[str, list[dict]]) -> list[str]:
    lines = []
    for impl, rs in runs.items():
        for i, r in enumerate(rs, 1):
            lines.append(
                f"{impl} round {i}: load {r['load_s']:.2f} s, set_image "
                f"{' / '.join(f'{v:.2f}' for v in r['set_image_all_s'])} s, point "
                f"{r['predict_point_s'] * 1e3:.1f} ms, box {r['predict_box_s'] * 1e3:.1f} ms, "
                f"peak RSS {r['peak_rss_mb']:.0f} MB (1-min load average before: "
                f"{r['load_avg_1min_before']:.2f})"
            )
    return lines


def _csv_num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def write_outputs(
    out_dir: Path,
    stem: str,
    summary: dict,
    info: list[tuple[str, str]],
    rows: list[list[str]],
    notes: list[str],
) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.md"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "label", *IMPLS, *(f"ratio_{i}_over_torch" for i in RATIOS)])
        for m in METRICS:
            vals = summary[m.key]
            w.writerow(
                [m.key, m.label]
                + [_csv_num(vals.get(i)) for i in IMPLS]
                + [_csv_num(ratio(vals, i)) for i in RATIOS]
            )
    md = [f"# SAM v1 CPU benchmark: {stem}", ""]
    md += [f"- **{k}**: {v}" for k, v in info]
    md += [
        "",
        format_table(rows, markdown=True),
        "",
        "Ratio < 1: paddle_sam is faster / smaller. dygraph = `SamPredictor`, static = "
        "`StaticSamPredictor` on Paddle Inference (export of the same weights).",
        "",
    ]
    md += [f"- {n}" for n in notes]
    md_path.write_text("\n".join(md) + "\n")
    return csv_path, md_path


def report(
    out_dir: Path,
    stem: str,
    title: str,
    info: list[tuple[str, str]],
    table: tuple[list[str], list[list[str]]],
    notes: list[str],
    csv_rows: list[list[str]],
) -> None:
    """Print a run's machine lines, table and notes; write them as ``stem.md`` and the
    ``csv_rows`` (header first) as ``stem.csv`` in ``out_dir``."""
    header, rows = table
    width = max(len(k) for k, _ in info)
    print()
    print("\n".join(f"{k:>{width}}: {v}" for k, v in info))
    print()
    print(format_table(rows, markdown=False, header=header))
    print("\n".join(notes))
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"{stem}.csv", "w", newline="") as f:
        csv.writer(f).writerows(csv_rows)
    md = [f"# {title}: {stem}", "", *(f"- **{k}**: {v}" for k, v in info), ""]
    md += [format_table(rows, markdown=True, header=header), "", *(f"- {n}" for n in notes)]
    (out_dir / f"{stem}.md").write_text("\n".join(md) + "\n")
    print(f"\nwrote {out_dir / stem}.csv and .md")


def parent_main(args: argparse.Namespace) -> None:
    started = dt.datetime.now().astimezone()
    with tempfile.TemporaryDirectory(prefix="bench_sam_v1_") as tmp:
        print(f"writing {args.model_type} weights to {tmp}", file=sys.stderr, flush=True)
        prepare = ["--worker", "prepare", "--checkpoint", tmp, "--model-type", args.model_type]
        weights = {
            k: Path(v)
            for k, v in run_child(prepare + ["--impl", ",".join(args.impl)], "weights").items()
        }
        runs = collect(args, weights)
    summary = summarise(runs)
    info = machine_info(args, runs, started)
    rows = table_rows(summary)
    notes = [agreement(runs), *raw_lines(runs)]
    print()
    print("\n".join(f"{k:>22}: {v}" for k, v in info))
    print()
    print(format_table(rows, markdown=False))
    print("\nratio < 1: paddle_sam is faster / smaller (dygraph: SamPredictor; static:")
    print("StaticSamPredictor on Paddle Inference, exported from the same weights)")
    print("\n".join(notes))
    stem = f"sam_v1_{args.model_type}_{started.strftime('%Y%m%d-%H%M%S')}"
    csv_path, md_path = write_outputs(Path(args.out), stem, summary, info, rows, notes)
    print(f"\nwrote {csv_path}\nwrote {md_path}")


# --------------------------------------------------------------------------------- cli


def parse_impls(text: str) -> tuple[str, ...]:
    impls = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [i for i in impls if i not in IMPLS]
    if bad or not impls:
        raise argparse.ArgumentTypeError(
            f"--impl takes a comma list of {', '.join(IMPLS)}; got {text!r}"
        )
    return impls


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-type", default="vit_b", choices=("vit_b", "vit_l", "vit_h"))
    p.add_argument("--repeats", type=positive, default=3, help="timed set_image calls per worker")
    p.add_argument(
        "--prompts", type=positive, default=20, help="timed predict calls per prompt kind"
    )
    p.add_argument(
        "--rounds", type=positive, default=2, help="interleaved worker runs per implementation"
    )
    p.add_argument(
        "--threads",
        type=positive,
        default=None,
        help="CPU threads for both (default: each one's own)",
    )
    p.add_argument(
        "--impl",
        type=parse_impls,
        default=IMPLS,
        help="comma list: paddle,paddle_modules,static,torch",
    )
    p.add_argument(
        "--out",
        default=str(Path(__file__).parent / "results"),
        help="folder for the CSV and markdown",
    )
    p.add_argument("--worker", choices=(*IMPLS, "prepare"), help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker == "prepare":
        prepare_main(args)
    elif args.worker:
        worker_main(args)
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
