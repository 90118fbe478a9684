"""One SAM 3 fine-tuning step at full size on the CPU (vision backbone and text encoder frozen):
seconds per step with its forward / backward split, trainable parameters and peak memory.

    python benchmarks/bench_sam3_train_step.py [--weights X.pdparams] [--workdir DIR]
        [--steps 2] [--queries 2] [--no-masks] [--no-dropout] [--threads N]

Weights: ``--weights`` (a converted full-size ``.pdparams``), else the ``"paddle"`` entry of
``DIR/weights.json`` (as ``bench_sam3.py --workdir DIR`` writes it), else full-size random
weights in the released layout written into DIR (``bench_sam3.write_weights`` for paddle only:
``random_released_state_dict`` + ``convert_state_dict`` + ``save_pdparams``; 3.4 GB) and listed
there. The batch: one synthetic concept scene (``write_concept_dataset``, 1008 x 1008, written
into DIR/concepts on first use) through ``ConceptDataset`` with the training transforms and
masks (random resize and padding into the 1008 x 1008 canvas), ``--queries`` of its find
queries (half positive phrases with their targets, the rest negative phrases), batched by
``collate_concepts`` as upstream's collator: the image once, every query pointing at it.

One worker process (``--worker step``) builds the model with ``load_sam3`` (interactive parts
off), ``model.train()``, ``freeze(model, "vision_backbone", "text_encoder")`` (a wholly frozen
part runs without recording its graph), the roboflow_v100 criterion with its mask loss
(``build_roboflow_v100_loss(with_masks=True)``) and ``paddle.optimizer.AdamW`` over
``trainable_parameters`` (lr 8e-5, weight decay 0.1: the SAM 3 run config's defaults), then
runs ``train_step(..., max_grad_norm=0.1)`` ``--steps`` times. Step 1 includes the first-call
costs (AdamW's moments are created there). The split comes from timing wrappers around the
functions ``train_step`` calls (``forward_train`` and within it ``backbone_features``,
``compute_matching``, the criterion, ``clip_grad_norm_``, ``optimizer.step``); the backward
pass is the rest of the step. Dygraph on
the CPU runs synchronously, so the parts add up to the step. Peak RSS is ``ru_maxrss`` (never
falls; Paddle keeps freed memory in its heap, ``paddle_sam/_runtime.py``), RSS the current one.

Memory: the worker makes itself the kernel's first OOM victim (``oom_score_adj`` 1000) and
stops itself, reporting what it has, when the machine's available memory falls below
``--min-free-mb``; a ``MemoryError`` is reported the same way. Every query is one batch row of
the fusion encoder, whose self-attention weights over the 72 x 72 image tokens are kept for the
backward pass: measured here for one such attention (8 heads, 5184 tokens, float32, gradients
on) 2.4 GB kept per layer and query with the encoder's attention dropout, 1.6 GB with dropout
off. With 6 encoder layers that is about 29 GB for the default 2 queries and 10 GB for
``--queries 1 --no-dropout`` (``disable_dropout``), on top of the 3.9 GB of the loaded model
(that run peaked here at 13.6 GB in step 1 and 16-17 GB in step 2).

On a GPU (not run here; this script pins the CPU and reports host RSS only): call
``paddle.set_device("gpu")`` before ``load_sam3`` (``build_sam3_image_model`` also takes
``device="gpu:0"``) and read ``paddle.device.cuda.max_memory_allocated()`` for the device's
peak. Paddle's fused CPU attention kernel and the row threads are CPU inference paths
(``models/sam3/model_misc.py``); with gradients on any device the attention is matmul + softmax
in row blocks, every block kept for the backward pass. ``train_step`` itself has no autocast: it
runs in the parameters' dtype (float32). In a run config, ``train.amp: true`` makes
``TrainerBase.train_step`` (``paddle_sam/train/base.py``) run each micro-batch under
``paddle.amp.auto_cast(dtype="float16")`` with a ``paddle.amp.GradScaler`` on a GPU (on the CPU
it is switched off with a warning); there is no bf16 switch for training. ``train.batch_size``
is images per micro-batch and process (each with all its queries; ``data.max_negatives`` caps
the negative phrases per image), ``train.grad_accum`` micro-batches per optimizer step.

This is a measurement, not a test: no thresholds, exit 0 whatever the figures.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import bench_sam_v1 as v1  # noqa: E402  (keeps the environment as it was: v1._BASE_ENV)

LR = 8e-5  # Sam3OptimConfig.lr (the transformer and heads)
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 0.1  # upstream's roboflow_v100 config
SCENE_SIDE = 1008
# the parts of a step, in train_step's order; "backward_s" is the rest of the step
PARTS = (
    ("forward_s", "training forward (s)"),
    ("matching_s", "one-to-one matching (s)"),
    ("criterion_s", "criterion incl. one-to-many matching (s)"),
    ("backward_s", "backward (rest of the step) (s)"),
    ("clip_s", "gradient clipping (s)"),
    ("optimizer_s", "AdamW step (s)"),
)
# inside the forward (not a part of its own)
BACKBONE = ("backbone_s", "  of which frozen backbone + text encoder (s)")
LABELS = dict((*PARTS, BACKBONE))


# --------------------------------------------------------------------------------- worker


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB


def _available_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _report(res: dict) -> None:
    text = json.dumps({"error": "could not serialise the result"})
    for _ in range(5):  # the main thread may be adding to it
        try:
            text = json.dumps(res)
            break
        except RuntimeError:
            time.sleep(0.01)
    print(v1.RESULT_PREFIX + text, flush=True)


def _memory_guard(res: dict, floor_mb: float) -> None:
    """A thread that follows the machine's available memory and, below ``floor_mb``, reports
    ``res`` and ends the process before the kernel's OOM killer picks one (maybe not ours)."""
    try:  # and if it does pick, this process first
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:
        pass

    def watch() -> None:
        while True:
            avail = _available_mb()
            if avail is None:
                return
            res["min_available_mb"] = min(res.get("min_available_mb", avail), avail)
            if avail < floor_mb:
                res["error"] = (
                    f"stopped during {_where(res)}: the machine's available memory fell to "
                    f"{avail:.0f} MB (below --min-free-mb {floor_mb:.0f}); process RSS "
                    f"{_rss_mb():.0f} MB"
                )
                res["peak_rss_mb"] = _peak_rss_mb()
                _report(res)
                os._exit(0)
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()


def _where(res: dict) -> str:
    part, t0 = res.get("part"), res.get("part_t0")
    if part and t0 is not None:
        part += f", {time.perf_counter() - t0:.1f} s into it"
    return f"{res.get('stage')}" + (f" ({part})" if part else "")


class _Timed:
    """Calls ``fn`` and adds its seconds to ``sink[key]``, naming the part in ``res["part"]``
    meanwhile (``after`` once it returns); other attributes are ``fn``'s (the criterion's
    ``matcher``)."""

    def __init__(self, fn: Any, key: str, sink: dict, res: dict, after: str | None) -> None:
        self._fn, self._key, self._sink, self._res, self._after = fn, key, sink, res, after

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._res["part"] = LABELS[self._key].strip().removeprefix("of which ")[:-4]
        t0 = self._res["part_t0"] = time.perf_counter()
        try:
            out = self._fn(*args, **kwargs)
        finally:
            self._sink[self._key] = self._sink.get(self._key, 0.0) + time.perf_counter() - t0
        self._res["part"], self._res["part_t0"] = self._after, time.perf_counter()
        if self._key == "clip_s":
            self._sink["grad_norm"] = float(out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


class _TimedOptimizer:
    def __init__(self, optimizer: Any, sink: dict, res: dict) -> None:
        self._opt, self._sink, self._res = optimizer, sink, res

    def clear_grad(self, *args: Any, **kwargs: Any) -> None:
        self._opt.clear_grad(*args, **kwargs)

    def step(self) -> None:
        self._res["part"] = "AdamW step"
        t0 = self._res["part_t0"] = time.perf_counter()
        self._opt.step()
        self._sink["optimizer_s"] = time.perf_counter() - t0


def make_batch(data_dir: Path, queries: int, masks: bool) -> tuple[dict, dict]:
    """``queries`` find queries of the first concept scene in ``data_dir`` (written there if
    absent), half positive: the collated batch and what it holds."""
    from paddle_sam.train.sam3.data import ConceptDataset, collate_concepts
    from paddle_sam.train.synthetic import write_concept_dataset

    if not (data_dir / "annotations.json").is_file():
        side = [[SCENE_SIDE, SCENE_SIDE]]
        write_concept_dataset(data_dir, 1, seed=v1.SEED, sizes=side, overwrite=True)
    ds = ConceptDataset(data_dir, with_masks=masks, train=True, seed=v1.SEED)
    samples = [ds[q] for q in ds.queries(0)]
    pos = [s for s in samples if len(s.boxes)]
    neg = [s for s in samples if not len(s.boxes)]
    n_pos = min(len(pos), (queries + 1) // 2)
    n_neg = min(len(neg), queries - n_pos)
    n_pos = min(len(pos), queries - n_neg)  # too few negatives: more positives
    chosen = pos[:n_pos] + neg[:n_neg]
    batch = collate_concepts(chosen)
    info = {
        "image_shape": list(batch["images"].shape),
        "texts": batch["texts"],
        "positives": n_pos,
        "negatives": n_neg,
        "targets": int(sum(len(s.boxes) for s in chosen)),
        "resized": chosen[0].resized,
        "masks": masks,
    }
    return batch, info


def _millions(params: Any) -> float:
    return sum(int(p.numel()) for p in params) / 1e6


def run_worker(args: argparse.Namespace) -> dict:
    res: dict[str, Any] = {"stage": "import", "steps": []}
    _memory_guard(res, args.min_free_mb)
    t0 = time.perf_counter()
    import paddle_sam  # first: it applies its CPU defaults before paddle loads

    paddle_sam.tune_process()  # the settings the CLI runs with

    res["import_s"] = time.perf_counter() - t0
    import paddle

    from paddle_sam._runtime import get_num_threads
    from paddle_sam.loading.sam3 import load_sam3
    from paddle_sam.train.sam3 import step as S
    from paddle_sam.train.sam3.loss_fns import CORE_LOSS_KEY
    from paddle_sam.train.sam3.sam3_loss import build_roboflow_v100_loss

    paddle.set_device("cpu")
    if args.threads:
        paddle_sam.set_num_threads(args.threads)
    res["threads"] = get_num_threads()
    res["paddle"] = paddle.__version__
    try:
        res["stage"] = "data"
        t0 = time.perf_counter()
        batch, res["batch"] = make_batch(Path(args.data), args.queries, args.masks)
        res["data_s"] = time.perf_counter() - t0

        res["stage"] = "model load"
        t0 = time.perf_counter()
        model = load_sam3(args.checkpoint)
        model.train()
        res["load_s"] = time.perf_counter() - t0
        res["peak_rss_load_mb"], res["rss_load_mb"] = _peak_rss_mb(), _rss_mb()
        every = list(model.parameters())
        res["params_total_m"] = _millions(every)
        S.freeze(model, "vision_backbone", "text_encoder")
        if args.no_dropout:
            S.disable_dropout(model)
        named = list(model.named_parameters())
        for part in ("vision_backbone", "text_encoder"):
            prefix = S.MODEL_PARTS[part]
            res[f"params_{part}_m"] = _millions(p for n, p in named if n.startswith(prefix))
        trainable = S.trainable_parameters(model)
        res["params_trainable_m"] = _millions(trainable)
        res["trainable_tensors"] = len(trainable)

        criterion = build_roboflow_v100_loss(with_masks=args.masks)
        optimizer = paddle.optimizer.AdamW(
            learning_rate=LR, parameters=trainable, weight_decay=WEIGHT_DECAY
        )
        sink: dict[str, float] = {}
        res["unfinished_step"] = sink  # the parts done so far, if the step is stopped
        # train_step looks these up in its module at call time: time them there
        for name, key in (
            ("forward_train", "forward_s"),
            ("backbone_features", "backbone_s"),
            ("compute_matching", "matching_s"),
            ("clip_grad_norm_", "clip_s"),
        ):
            after = "training forward" if key == "backbone_s" else None
            setattr(S, name, _Timed(getattr(S, name), key, sink, res, after))
        timed_criterion = _Timed(criterion, "criterion_s", sink, res, "backward")
        timed_optimizer = _TimedOptimizer(optimizer, sink, res)
        for i in range(1, args.steps + 1):
            res["stage"], res["part"], res["part_t0"] = f"step {i}", None, None
            sink.clear()
            t0 = time.perf_counter()
            try:
                losses = S.train_step(
                    model, batch, timed_criterion, timed_optimizer, max_grad_norm=MAX_GRAD_NORM
                )
            except FloatingPointError as exc:
                res["loss_finite"] = False
                res["error"] = f"step {i}: {exc}"
                break
            total = time.perf_counter() - t0
            res["part"] = None
            res["loss_finite"] = res.get("loss_finite", True)
            parts = {k: sink.get(k, 0.0) for k, _ in PARTS if k != "backward_s"}
            rest = total - sum(parts.values())
            res["steps"].append(
                {
                    "total_s": total,
                    **parts,
                    "backward_s": rest,
                    "backbone_s": sink.get("backbone_s"),
                    "loss": losses.get(CORE_LOSS_KEY),
                    "loss_terms": len(losses),
                    "grad_norm": sink.get("grad_norm"),
                    "peak_rss_mb": _peak_rss_mb(),
                    "rss_mb": _rss_mb(),
                }
            )
        res["stage"] = "done"
        del res["unfinished_step"]
    except MemoryError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        res["error"] = f"MemoryError during {_where(res)}: {first}"
    res["peak_rss_mb"] = _peak_rss_mb()
    return res


def prepare_weights(work: Path) -> dict:
    """``--worker prepare``: full-size random weights in the released layout, converted."""
    import bench_sam3

    return {k: str(v) for k, v in bench_sam3.write_weights(("paddle",), work).items()}


# --------------------------------------------------------------------------------- parent


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.{digits}f}"


def one_off_rows(r: dict) -> list[tuple[str, str, Any, int]]:
    """(key, label, value, digits) of the figures measured once."""
    total, trainable = r.get("params_total_m"), r.get("params_trainable_m")
    adam = None if trainable is None else 2 * trainable * 1e6 * 4 / 2**20
    share = None if not (total and trainable is not None) else 100 * trainable / total
    vision, text = r.get("params_vision_backbone_m"), r.get("params_text_encoder_m")
    return [
        ("import_s", "import paddle_sam (s)", r.get("import_s"), 2),
        ("data_s", "batch: read the scene, transforms, collate (s)", r.get("data_s"), 2),
        ("load_s", "model load: build + weights, load_sam3 (s)", r.get("load_s"), 2),
        ("params_total_m", "parameters, all (M)", total, 1),
        ("params_vision_backbone_m", "  frozen: vision backbone (M)", vision, 1),
        ("params_text_encoder_m", "  frozen: text encoder (M)", text, 1),
        ("params_trainable_m", "  trainable (M)", trainable, 1),
        ("trainable_pct", "  trainable share (%)", share, 1),
        ("adamw_moments_mb", "AdamW moments, 2 x trainable float32 (MB)", adam, 0),
        ("peak_rss_load_mb", "peak RSS after load (MB)", r.get("peak_rss_load_mb"), 0),
        ("rss_load_mb", "RSS after load (MB)", r.get("rss_load_mb"), 0),
        ("peak_rss_mb", "peak RSS, whole run (MB)", r.get("peak_rss_mb"), 0),
        (
            "min_available_mb",
            "machine's lowest available memory (MB)",
            r.get("min_available_mb"),
            0,
        ),
        ("loss_finite", "loss finite in every finished step", r.get("loss_finite"), 0),
    ]


STEP_ROWS = (
    ("total_s", "step total (s)", 2),
    *((k, label, 2) for k, label in PARTS[:1] + (BACKBONE,) + PARTS[1:]),
    ("loss", "core loss", 4),
    ("grad_norm", "gradient norm before clipping", 4),
    ("peak_rss_mb", "peak RSS after the step (MB)", 0),
    ("rss_mb", "RSS after the step (MB)", 0),
)


def machine_info(args: argparse.Namespace, r: dict, started: dt.datetime, weights: str):
    b = r.get("batch") or {}
    avail = _available_mb()
    size_mb = Path(weights).stat().st_size / 2**20 if Path(weights).is_file() else 0
    batch = (
        f"images {'x'.join(map(str, b['image_shape']))} (scene {SCENE_SIDE} x {SCENE_SIDE}, "
        f"resized to {b['resized']} and padded), {b['positives']} positive + {b['negatives']} "
        f"negative queries {b['texts']}, {b['targets']} targets, masks "
        f"{'on' if b['masks'] else 'off'}"
        if b
        else "-"
    )
    return [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", v1._cpu_model()),
        ("cpu flags", v1.cpu_flags()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        ("threads", f"{r.get('threads')}" + (" (--threads)" if args.threads else " (default)")),
        ("ram", f"{v1._ram_gib()}, {avail / 1024:.1f} GiB available at the end" if avail else "-"),
        ("python / paddlepaddle", f"{platform.python_version()} / {v1._version('paddlepaddle')}"),
        ("weights", f"{weights} ({size_mb:.0f} MB)"),
        ("batch", batch),
        (
            "step",
            f"train_step, frozen vision backbone + text encoder, roboflow_v100 criterion, AdamW "
            f"lr {LR:g} wd {WEIGHT_DECAY:g}, grad clip {MAX_GRAD_NORM:g}, dropout "
            f"{'off' if args.no_dropout else 'on'}, {args.steps} steps, float32",
        ),
    ]


def _failure(exc: RuntimeError) -> str:
    m = re.search(r"exit (-?\d+)", str(exc))
    code = int(m.group(1)) if m else None
    if code is not None and code < 0:
        return (
            f"the worker was killed by signal {-code}"
            + (" (SIGKILL: most likely the kernel's OOM killer)" if code == -9 else "")
            + f": {exc}"
        )
    return f"the worker failed: {exc}"


def parent_main(args: argparse.Namespace) -> None:
    started = dt.datetime.now().astimezone()
    with tempfile.TemporaryDirectory(prefix="bench_sam3_step_") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        if args.weights:
            weights = str(Path(args.weights).resolve())
            if not Path(weights).is_file():
                raise SystemExit(f"--weights: no such file: {weights}")
        else:
            listed = v1.prepared_weights(work, [], __file__)
            if "paddle" not in listed:
                raise SystemExit(f'{work / "weights.json"} lists no "paddle" file: {listed}')
            weights = listed["paddle"]
        argv = ["--worker", "step", "--checkpoint", weights, "--data", str(work / "concepts")]
        argv += ["--steps", str(args.steps), "--queries", str(args.queries)]
        argv += ["--min-free-mb", str(args.min_free_mb)]
        argv += [] if args.masks else ["--no-masks"]
        argv += ["--no-dropout"] if args.no_dropout else []
        argv += ["--threads", str(args.threads)] if args.threads else []
        try:
            r = v1.run_child(argv, "train step", __file__)
        except RuntimeError as exc:
            r = {"error": _failure(exc)}
    info = machine_info(args, r, started, weights)
    rows1 = [[label, _f(v, d)] for _, label, v, d in one_off_rows(r)]
    steps = r.get("steps", [])
    header2 = ["per step", *(f"step {i}" for i in range(1, len(steps) + 1))]
    rows2 = [[label, *(_f(s.get(k), d) for s in steps)] for k, label, d in STEP_ROWS]
    lines = []
    if r.get("error"):
        lines.append(f"FAILED: {r['error']}")
    if r.get("unfinished_step"):
        done = ", ".join(
            f"{label.strip().removeprefix('of which ')[:-4]} {r['unfinished_step'][k]:.1f} s"
            for k, label in LABELS.items()
            if k in r["unfinished_step"]
        )
        lines.append(f"the unfinished step's finished parts: {done}")
    if any(w in r.get("error", "") for w in ("memory", "Memory", "SIGKILL")):
        options = [
            o
            for o, used in (
                ("--queries 1", args.queries == 1),
                ("--no-dropout", args.no_dropout),
            )
            if not used
        ]
        lines.append(
            f"needs less memory: {', '.join(options) or 'a machine with more'}; "
            "see the script's docstring"
        )
    print()
    print("\n".join(f"{k:>22}: {v}" for k, v in info))
    print()
    print(v1.format_table(rows1, markdown=False, header=["what", "value"]))
    if steps:
        print()
        print(v1.format_table(rows2, markdown=False, header=header2))
    if lines:
        print("\n" + "\n".join(lines))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"sam3_train_step_{started.strftime('%Y%m%d-%H%M%S')}"
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "label", "step", "value"])
        for key, label, v, _ in one_off_rows(r):
            w.writerow([key, label.strip(), "", v1._csv_num(None if v is None else float(v))])
        for key, label, _ in STEP_ROWS:
            for i, s in enumerate(steps, 1):
                v = s.get(key)
                w.writerow([key, label, i, v1._csv_num(None if v is None else float(v))])
        if r.get("error"):
            w.writerow(["error", r["error"], "", ""])
    md = [f"# SAM 3 train step: {stem}", "", *(f"- **{k}**: {v}" for k, v in info), ""]
    md += [v1.format_table(rows1, markdown=True, header=["what", "value"])]
    if steps:
        md += ["", v1.format_table(rows2, markdown=True, header=header2)]
    md += ["", *(f"- {n}" for n in lines)] if lines else []
    (out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print(f"\nwrote {out / stem}.csv and .md")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", help="a converted full-size SAM 3 .pdparams (default: DIR's)")
    p.add_argument(
        "--workdir",
        help="keeps the written weights (weights.json) and the concept scene for later runs",
    )
    p.add_argument("--steps", type=v1.positive, default=2, help="training steps (default 2)")
    p.add_argument(
        "--queries", type=v1.positive, default=2, help="find queries of the image (default 2)"
    )
    p.add_argument(
        "--masks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mask targets and the mask loss (default on)",
    )
    p.add_argument("--no-dropout", action="store_true", help="dropout off (disable_dropout)")
    p.add_argument("--threads", type=v1.positive, default=None, help="CPU threads")
    p.add_argument(
        "--min-free-mb",
        type=float,
        default=1500.0,
        help="stop the worker when the machine's available memory falls below this",
    )
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--worker", choices=("step", "prepare"), help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "prepare":
        _report(prepare_weights(Path(args.checkpoint)))
    elif args.worker:
        _report(run_worker(args))
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
