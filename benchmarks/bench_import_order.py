"""What the CPU settings give, by how paddle_sam is brought into the process: the import alone,
the import plus ``paddle_sam.tune_process()`` (what ``paddle-sam`` does), Paddle imported
first, Paddle's own defaults (``PADDLE_SAM_NO_CPU_TUNING=1``), and the import plus each of
``tune_process``'s two settings alone.

    python benchmarks/bench_import_order.py [--rounds 2] [--repeats 2] [--configs A,B,...]
        [--no-sam] [--out benchmarks/results]

Each configuration runs in its own fresh process (``--worker CONFIG``), interleaved for
``--rounds`` rounds; the table shows the median per configuration. A worker measures a
2048^3 float32 matmul (GFLOP/s, best of 10 after one warm-up) and SAM v1 ViT-B ``set_image``
on a 768 x 1024 image (random weights; the first call, then the median of ``--repeats``
more; also their CPU time, user and system, less disturbed by a busy host than the wall
time, and their minor page faults), with the settings it ended up with (MKL threads, MKL's
code path, Paddle's ``FLAGS_use_stride_kernel``, glibc tuning) and its RSS: peak, and after
the predictor is deleted and garbage collected (what the process keeps between calls).

This is a measurement, not a test: it has no thresholds and exits 0 whatever it finds.
"""

from __future__ import annotations

import os

# Paddle sets OMP_NUM_THREADS=1 in os.environ when imported; every worker starts from the
# environment this script was started with.
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
import time  # noqa: E402
from pathlib import Path  # noqa: E402

CONFIGS = {
    "import": "import paddle_sam",
    "import+tune_process": "import paddle_sam; paddle_sam.tune_process()",
    "paddle first": "import paddle; import paddle_sam",
    "paddle defaults": "PADDLE_SAM_NO_CPU_TUNING=1; import paddle_sam",
    # tune_process's two settings one at a time: which of them the time comes from
    "import+stride off": "import paddle_sam; FLAGS_use_stride_kernel off",
    "import+mallopt": "import paddle_sam; _runtime.keep_freed_memory()",
}
RESULT_PREFIX = "BENCH_RESULT "
METRICS = (
    ("gflops", "matmul 2048^3 (GFLOP/s)", 1),
    ("set_image_first_s", "set_image, first call (s)", 2),
    ("set_image_s", "set_image (s)", 2),
    ("set_image_cpu_s", "set_image CPU time (s)", 2),
    ("set_image_faults_k", "set_image page faults (k)", 0),
    ("peak_rss_mb", "peak RSS (MB)", 0),
    ("rss_after_mb", "RSS after, predictor freed (MB)", 0),
)
SETTINGS = ("threads", "mkl_code_path", "stride_kernel", "tuned")


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def worker(config: str, repeats: int, sam: bool) -> dict:
    if config == "paddle first":
        import paddle

        import paddle_sam
    else:
        import paddle_sam

        if config == "import+tune_process":
            paddle_sam.tune_process()
        elif config == "import+stride off":
            import paddle

            paddle.set_flags({"FLAGS_use_stride_kernel": False})
        elif config == "import+mallopt":
            paddle_sam._runtime.keep_freed_memory()
    import gc

    import numpy as np
    import paddle

    from paddle_sam._runtime import applied_settings, get_num_threads, mkl_code_path

    paddle.set_device("cpu")
    a = paddle.randn([2048, 2048])
    b = paddle.randn([2048, 2048])
    float(paddle.matmul(a, b)[0, 0])
    best = float("inf")
    for _ in range(10):
        t = time.perf_counter()
        float(paddle.matmul(a, b)[0, 0])
        best = min(best, time.perf_counter() - t)
    del a, b

    times = cpu = faults = [float("nan")] * 2
    if sam:
        model = paddle_sam.sam_model_registry["vit_b"]()
        predictor = paddle_sam.SamPredictor(model)
        image = np.random.default_rng(0).integers(0, 256, (768, 1024, 3), dtype=np.uint8)
        times, cpu, faults = [], [], []
        with paddle.no_grad():
            for _ in range(1 + repeats):
                r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                predictor.set_image(image)
                predictor.get_image_embedding().numpy()
                times.append(time.perf_counter() - t)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
                faults.append(r1.ru_minflt - r0.ru_minflt)
        del predictor, model
        gc.collect()
    flags = paddle.get_flags(["FLAGS_use_stride_kernel"])
    return {
        "config": config,
        "gflops": 2 * 2048**3 / best / 1e9,
        "set_image_first_s": times[0],
        "set_image_s": statistics.median(times[1:]),
        "set_image_cpu_s": statistics.median(cpu[1:]),
        "set_image_faults_k": statistics.median(faults[1:]) / 1000,
        "peak_rss_mb": rss_mb("VmHWM"),
        "rss_after_mb": rss_mb("VmRSS"),
        "threads": get_num_threads(),
        "mkl_code_path": mkl_code_path(),
        "stride_kernel": flags["FLAGS_use_stride_kernel"],
        "tuned": "mallopt" in applied_settings(),
        "paddle": paddle.__version__,
    }


def run_worker(config: str, repeats: int, sam: bool) -> dict:
    root = Path(__file__).resolve().parents[1]
    env = dict(_BASE_ENV)
    # this checkout's paddle_sam, whatever copy is installed
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    if config == "paddle defaults":
        env["PADDLE_SAM_NO_CPU_TUNING"] = "1"
    out = subprocess.run(
        [sys.executable, __file__, "--worker", config, "--repeats", str(repeats)]
        + ([] if sam else ["--no-sam"]),
        env=env,
        capture_output=True,
        text=True,
        cwd=root,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"worker {config!r} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def cpu_description() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln), ""
    )
    flags_line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "flags:")
    flags = set(flags_line.split(":", 1)[1].split())
    shown = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    present = ", ".join(f for f in shown if f in flags) or "none of " + ", ".join(shown)
    return f"{model or platform.processor()}, {len(os.sched_getaffinity(0))} CPUs ({present})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="set_image calls after the first")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, in order")
    p.add_argument("--no-sam", action="store_true", help="the matmul only (no set_image)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    if args.worker:
        result = worker(args.worker, args.repeats, not args.no_sam)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        p.error(f"unknown configs {unknown}; choose from {sorted(CONFIGS)}")
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            res = run_worker(c, args.repeats, not args.no_sam)
            runs[c].append(res)
            print(
                f"round {r + 1} {c:<20} {res['gflops']:7.1f} GFLOP/s  "
                f"set_image {res['set_image_s']:.2f} s",
                file=sys.stderr,
                flush=True,
            )

    cpu = cpu_description()
    when = dt.datetime.now(dt.UTC)
    rows = []
    for c in configs:
        row = {"config": c, "how": CONFIGS[c]}
        for key, _, _ in METRICS:
            row[key] = statistics.median(r[key] for r in runs[c])
        for key in SETTINGS:
            row[key] = runs[c][-1][key]
        rows.append(row)

    print(f"\n{when:%Y-%m-%d %H:%M} UTC, {cpu}, Paddle {runs[configs[0]][0]['paddle']}")
    print(f"median of {args.rounds} rounds, each configuration in its own process\n")
    header = ["configuration", *(label for _, label, _ in METRICS), *SETTINGS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        cells = [row["config"]]
        cells += [f"{row[k]:.{d}f}" for k, _, d in METRICS]
        cells += [str(row[k]) for k in SETTINGS]
        print("| " + " | ".join(cells) + " |")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"import_order_{when:%Y%m%d_%H%M%S}.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["cpu", "round", *runs[configs[0]][0]])
        w.writeheader()
        for c in configs:
            for i, res in enumerate(runs[c]):
                w.writerow({"cpu": cpu, "round": i + 1, **res})
    print(f"\nper-round results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
