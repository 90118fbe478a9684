"""``paddle-sam label``: label a dataset (SAM v1 or SAM 2 automatic masks, or SAM 3 concepts)
into one COCO JSON, in resumable shards."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import bounded, check_one_source, check_out_folder, family, positive, source_of
from .everything import add_generator_args, generator_options

MAX_WORKERS = 256
MAX_SHARD_SIZE = 100_000


def _prompts(args: argparse.Namespace) -> tuple[str, ...]:
    from ..label.sources import read_lines

    prompts = list(args.text)
    if args.prompts is not None:
        path = Path(args.prompts)
        if not path.is_file():
            raise FileNotFoundError(f"--prompts file not found: {path}")
        prompts += read_lines(path)
    for p in prompts:
        if not p.strip():
            raise ValueError("--text is empty")
    if len(set(prompts)) != len(prompts):
        raise ValueError("a prompt is given twice: each becomes one category")
    return tuple(prompts)


def cmd_label(args: argparse.Namespace) -> int:
    from ..label import LabelSpec, WorkerDied, label
    from ..loading import outside_vocabulary

    prompts = _prompts(args)
    if args.everything == bool(prompts):
        raise ValueError("give either --everything (SAM v1) or --text / --prompts (SAM 3)")
    check_one_source(args)
    check_out_folder(args.output)
    for name in ("checkpoint", "exported"):
        value = getattr(args, name)
        if value is not None and not Path(value).exists():
            raise FileNotFoundError(f"--{name} not found: {value}")
    if args.checkpoint is None and args.exported is None:
        # the bundled model of the mode's family, said so once here (not in every worker)
        args.checkpoint = source_of(args, "sam3" if prompts else "sam_v1").path
    kind = family(args)
    if prompts and kind == "sam2":
        raise ValueError(
            f"--text / --prompts need SAM 3; {args.checkpoint} is SAM 2, which labels with "
            "--everything (automatic masks)"
        )
    if args.engine != "ray" and (
        args.ray_address is not None or args.num_gpus_per_worker or args.cpus_per_worker != 1
    ):
        raise ValueError("--ray-address, --cpus-per-worker, --num-gpus-per-worker: --engine ray")
    if prompts:
        note = outside_vocabulary(source_of(args, "sam3", notice=False), prompts)
        if note:
            print(f"note: {note}", file=sys.stderr)
    everything, note = (
        generator_options(args, "sam2" if kind == "sam2" else "sam_v1")
        if args.everything
        else ({}, None)
    )
    if note:
        print(note, file=sys.stderr)
    spec = LabelSpec(
        mode="everything" if args.everything else "concepts",
        checkpoint=None if args.checkpoint is None else str(Path(args.checkpoint).resolve()),
        exported=None if args.exported is None else str(Path(args.exported).resolve()),
        model_type=args.model_type,
        everything=everything,
        prompts=prompts,
        confidence_threshold=args.confidence_threshold,
        bpe=args.bpe,
    )
    try:
        report = _run(args, spec, label)
    except WorkerDied as exc:  # not the user's doing, but nothing is lost: one line
        print(f"paddle-sam label: error: {exc}", file=sys.stderr)
        return 1
    _summary(report, args.output)
    return 0


def _run(args: argparse.Namespace, spec, label) -> dict:
    return label(
        args.source,
        args.output,
        spec,
        engine=args.engine,
        num_workers=args.num_workers,
        shard_size=args.shard_size,
        resume=args.resume,
        overwrite=args.overwrite,
        image_root=args.image_root,
        max_pixels=args.max_pixels,
        progress=not args.quiet,
        ray_address=args.ray_address,
        cpus_per_worker=args.cpus_per_worker,
        gpus_per_worker=args.num_gpus_per_worker,
    )


def _summary(report: dict, output: str) -> None:
    seconds = report["seconds_this_run"]
    fresh = report["resumed_shards"] == 0 and seconds > 0
    rate = f", {report['labelled'] / seconds:.2f} images/s" if fresh else ""
    resumed = (
        f" ({report['resumed_shards']} of {report['shards']} shards from an earlier run)"
        if report["resumed_shards"]
        else ""
    )
    print(
        f"{report['labelled']} images labelled, {report['skipped']} skipped, "
        f"{report['annotations']} annotations in {seconds:.1f} s{rate}{resumed} -> "
        f"{Path(output) / 'annotations.json'}, report.json"
    )
    for s in report["skipped_images"][:10]:
        print(f"  skipped {s['file_name']}: {s['reason']}")
    if report["skipped"] > 10:
        print(f"  ... and {report['skipped'] - 10} more (report.json lists them all)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``label``."""
    p = sub.add_parser(
        "label",
        help="label a dataset into one COCO JSON (SAM v1 / SAM 2 --everything or SAM 3 --text)",
    )
    p.add_argument(
        "source", help="a folder (recursive), a glob, a .txt list of paths or a COCO .json"
    )
    p.add_argument("-o", "--output", required=True, help="output folder")
    what = p.add_argument_group("what to label")
    what.add_argument("--everything", action="store_true", help="SAM v1 automatic masks")
    what.add_argument(
        "--text", action="append", default=[], help="a SAM 3 concept (repeatable): a category"
    )
    what.add_argument("--prompts", default=None, help="a text file of concepts, one per line")
    model = p.add_argument_group("model")
    model.add_argument("--checkpoint", default=None, help="SAM v1, SAM 2 or SAM 3 weights")
    model.add_argument("--exported", default=None, help="a 'paddle-sam export' folder")
    model.add_argument("--model-type", default=None, help="SAM v1 size without a sidecar")
    model.add_argument("--bpe", default=None, help="SAM 3 BPE vocabulary (default: bundled)")
    model.add_argument(
        "--confidence-threshold",
        type=bounded(float, 0.0, 1.0),
        default=0.5,
        help="SAM 3: keep instances scoring at least this (default: %(default)s)",
    )
    gen = p.add_argument_group("--everything options (the generator's)")
    add_generator_args(gen)
    job = p.add_argument_group("job")
    job.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: worker processes here; ray: Ray Data actors (pip install "
        "'paddle-sam[ray]') (default: %(default)s)",
    )
    job.add_argument(
        "--ray-address",
        default=None,
        help="with --engine ray: 'auto' or HOST:PORT of a running cluster (default: a Ray "
        "started for the job on this machine)",
    )
    job.add_argument(
        "--cpus-per-worker",
        type=bounded(int, 1, 1024),
        default=1,
        help="with --engine ray: CPUs (threads) each actor reserves (default: %(default)s)",
    )
    job.add_argument(
        "--num-gpus-per-worker",
        type=bounded(float, 0.0, 64.0),
        default=0.0,
        help="with --engine ray: GPUs each actor reserves (default: %(default)s)",
    )
    job.add_argument(
        "--num-workers",
        type=bounded(int, 1, MAX_WORKERS),
        default=1,
        help="worker processes, one model each (default: %(default)s)",
    )
    job.add_argument(
        "--shard-size",
        type=bounded(int, 1, MAX_SHARD_SIZE),
        default=16,
        help="images per shard, the unit of work and of --resume (default: %(default)s)",
    )
    job.add_argument("--resume", action="store_true", help="continue the job in OUT")
    job.add_argument(
        "--overwrite",
        action="store_true",
        help="start the job in OUT again (replaces paddle-sam's files there, never others)",
    )
    job.add_argument("--image-root", default=None, help="where a COCO or .txt source's paths start")
    job.add_argument(
        "--max-pixels",
        type=positive(int),
        default=None,
        help="skip (and report) images above this many pixels (default: 100 megapixels)",
    )
    job.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_label)
