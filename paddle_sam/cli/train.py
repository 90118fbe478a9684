"""``paddle-sam train``, ``paddle-sam eval`` and ``paddle-sam synth``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ..train.synthetic import CONCEPT_STYLES
from .common import (
    add_model_args,
    add_precision_arg,
    bounded,
    check_one_source,
    check_out_file,
    check_out_folder,
    check_precision,
    family,
    image_predictor,
    load_model,
    parse_confidence_threshold,
    parse_seed,
    parse_size,
    sam3_checkpoint,
)

MAX_NPROC = 128  # data-parallel processes on one machine
MAX_EVAL_IMAGES = 100_000_000
MAX_SYNTH_IMAGES = 1_000_000


def cmd_train(args: argparse.Namespace) -> int:
    if args.nproc > 1 and "PADDLE_TRAINER_ID" not in os.environ:
        return _launch(args)
    from ..train.families import load_config

    cfg = load_config(args.config, args.set)
    import yaml

    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    trainer = _trainer_class(cfg)(
        cfg,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=not args.quiet,
        config_text=text,
        recipe=args.config,
    )
    result = trainer.run()
    if trainer.rank == 0:
        ev = result["eval"]
        line = ", ".join(f"{k} {ev[k]:.4f}" for k in trainer.eval_fields if k in ev)
        print(
            f"trained {result['steps']} steps -> {result['model']}"
            f"{'; held-out ' + line if line else ''}"
        )
        print(
            f"metrics: {trainer.out}/metrics.csv, curves: {trainer.out}/curves.png; "
            f"{result['skipped']}"
        )
    return 0


def _trainer_class(cfg) -> type:
    family = getattr(cfg, "family", "sam_v1")
    if family == "sam3":
        from ..train.sam3.trainer import Sam3Trainer as Trainer
    elif family == "sam2":
        from ..train.sam2.trainer import Sam2Trainer as Trainer
    else:
        from ..train.sam_v1.trainer import Trainer
    return Trainer


def _launch(args: argparse.Namespace) -> int:
    """Re-run this command under ``python -m paddle.distributed.launch`` (gloo on CPU), each
    process running ``launch_entry.py`` next to this file; the data the run generates is
    written here first (the processes would wait for it at a barrier that times out)."""
    from ..train.families import load_config

    cfg = load_config(args.config, args.set)  # fail fast, before starting processes
    for written in _trainer_class(cfg).prepare_data(cfg):
        print(f"wrote the generated data {written} before starting the processes", flush=True)
    entry = Path(__file__).resolve().parent / "launch_entry.py"
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.nproc)
    cmd = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--nproc_per_node",
        str(args.nproc),
        "--log_dir",
        str(Path(cfg.run.output_dir) / "launch_logs"),
        str(entry),
        "--threads",
        str(threads),
        "train",
        str(args.config),
    ]
    for s in args.set:
        cmd += ["--set", s]
    cmd += [
        f
        for f, on in (
            ("--resume", args.resume),
            ("--overwrite", args.overwrite),
            ("--quiet", args.quiet),
        )
        if on
    ]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    print("launching:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)


def _styles(text: str) -> list[str]:
    styles = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in styles if x not in CONCEPT_STYLES]
    if unknown or not styles:
        raise argparse.ArgumentTypeError(
            f"unknown style(s) {', '.join(unknown) or repr(text)}; choose from "
            f"{', '.join(CONCEPT_STYLES)}"
        )
    return styles


def _eval_sam3(args: argparse.Namespace) -> dict:
    """SAM 3: box and mask AP per concept on a COCO file (--data) or on held-out synthetic
    concept scenes (--format concepts: --num-images of --seed, written to a temporary folder)."""
    import tempfile

    from ..train.sam3.evaluate import AP_CONFIDENCE_THRESHOLD, evaluate_concepts

    args.format = args.format or "coco"
    if args.format not in ("coco", "concepts"):
        raise ValueError("SAM 3 evaluates --format coco (with --data) or concepts")
    if args.format == "coco" and args.data is None:  # before the (slow) model load
        raise ValueError("--format coco needs --data ANNOTATIONS.json (or a Roboflow split)")
    if args.confidence_threshold is None:
        args.confidence_threshold = AP_CONFIDENCE_THRESHOLD
    if args.exported is None:
        args.checkpoint = sam3_checkpoint(args)
    predictor = image_predictor(
        args,
        "sam3",
        confidence_threshold=args.confidence_threshold,
        clicks=False,
        precision=args.precision,
    )
    with tempfile.TemporaryDirectory(prefix="paddle-sam-eval-") as tmp:
        data, images, n = args.data, args.images, args.num_images
        if args.format == "concepts":
            from ..train.synthetic import write_concept_dataset

            write_concept_dataset(
                tmp, args.num_images or 30, args.seed, overwrite=True, styles=args.styles
            )
            data = str(Path(tmp) / "annotations.json")
            images, n = str(Path(tmp) / "images"), None
        else:
            from ..train.sam3.data import ConceptDataset

            data = str(ConceptDataset.find_annotations(Path(data)))
        result = evaluate_concepts(predictor, data, images, n, progress=not args.quiet)
    result["checkpoint"] = str(args.checkpoint or args.exported)
    if args.exported is not None:
        result["exported"] = {"path": str(args.exported), "precision": args.precision}
    result["confidence_threshold"] = args.confidence_threshold
    if args.format == "concepts":
        result["data"] = {
            "format": "concepts",
            "num_images": result["images"],
            "seed": args.seed,
            "styles": args.styles or ["flat"],
        }
    scored = {k: v for k, v in result["per_concept"].items() if v["mask_AP50"] is not None}
    worst = sorted(scored.items(), key=lambda kv: kv[1]["mask_AP50"])[:3]
    absent = len(result["per_concept"]) - len(scored)
    print(
        f"{result['images']} images, {result['concepts']} concepts: mask AP50 "
        f"{result['mask']['AP50']:.4f} (AP {result['mask']['AP']:.4f}), box AP50 "
        f"{result['box']['AP50']:.4f} (AP {result['box']['AP']:.4f}); lowest mask AP50: "
        + ", ".join(f"{k} {v['mask_AP50']:.3f}" for k, v in worst)
        + (f"; {absent} concept(s) without ground truth here: not applicable" if absent else "")
    )
    return result


def cmd_eval(args: argparse.Namespace) -> int:
    from ..train.data import SkipLog
    from ..train.sam_v1.data import open_dataset
    from ..train.sam_v1.evaluate import evaluate

    if args.json:  # before the (long) evaluation, not after it
        check_out_file(args.json, args.overwrite)
    check_one_source(args)
    check_precision(args)
    fam = family(args)  # sniffs the files: once
    if args.exported is not None and fam != "sam3":
        raise ValueError(
            f"--exported {args.exported}: eval runs SAM 3 exports only (text prompts through "
            "the export's runtime); evaluate SAM v1 and SAM 2 on their --checkpoint"
        )
    if fam == "sam3":
        result = _eval_sam3(args)
        if args.json:
            _write_result(Path(args.json), result)
        return 0
    if fam == "sam2":
        result = _eval_sam2(args)
        if args.json:
            _write_result(Path(args.json), result)
        return 0
    if args.format == "clips":
        raise ValueError("--format clips is SAM 2's: give --model-type sam2 (or its --checkpoint)")
    args.format = args.format or "folder"
    if args.confidence_threshold is not None:
        raise ValueError("--confidence-threshold applies to --model-type sam3 only")
    if args.format == "concepts":
        raise ValueError("--format concepts is SAM 3's: give --model-type sam3, --checkpoint")
    skips = SkipLog()
    spec = {"format": args.format, "path": args.data, "images": args.images}
    if args.format == "synthetic":
        spec = {"format": "synthetic", "num_images": args.num_images or 100, "seed": args.seed}
    elif args.data is None:
        raise ValueError(f"a {args.format} dataset needs --data PATH")
    dataset = open_dataset(spec, skips)
    sam = load_model(args)
    result = evaluate(sam, dataset, args.num_images, progress=not args.quiet)
    if not result["images"]:  # every image skipped: no figure, rather than NaN ones
        raise ValueError(f"no usable image to evaluate ({skips.summary()})")
    result["skipped"] = skips.summary()
    result["checkpoint"] = str(args.checkpoint) if args.checkpoint else "default synthetic model"
    print(
        f"{result['instances']} instances in {result['images']} images: mIoU 1 click "
        f"{result['miou_1click']:.4f}, 3 clicks {result['miou_3click']:.4f}, box "
        f"{result['miou_box']:.4f}; {result['skipped']}"
    )
    if args.json:
        _write_result(Path(args.json), result)
    return 0


def _eval_sam2(args: argparse.Namespace) -> dict:
    """SAM 2 on generated clips: every object seen on the first frame clicked once there,
    tracked by the video predictor; mean IoU over objects and frames."""
    from ..loading import load_video_predictor
    from ..train.sam2.config import ClipSpec
    from ..train.sam2.evaluate import evaluate_clips
    from .common import source_of

    fmt = args.format or "clips"
    if fmt != "clips":
        raise ValueError(f"--format {fmt}: SAM 2 is evaluated on generated clips (--format clips)")
    if args.confidence_threshold is not None or args.styles is not None:
        raise ValueError("--confidence-threshold and --styles apply to --model-type sam3 only")
    source = source_of(args, "sam2")
    predictor = load_video_predictor(source, kind="tracker")
    clips = ClipSpec(seed=args.seed, num_frames=args.frames, sizes=[[320, 240]])
    n = args.num_images or 30
    result = evaluate_clips(predictor, clips, n, progress=not args.quiet)
    result.update(clips=n, frames=args.frames, seed=args.seed, checkpoint=str(source.path))
    print(
        f"{result['objects']} objects in {n} clips of {args.frames} frames (seed {args.seed}): "
        f"mean IoU {result['miou']:.4f}"
    )
    return result


def _write_result(path: Path, result: dict) -> None:
    """eval --json's file, recorded as paddle-sam's (checked before the evaluation)."""
    from ..predict.outputs import claim

    claim(path.parent, [path.name], "eval")
    path.write_text(json.dumps(result, indent=2) + "\n")


def cmd_synth(args: argparse.Namespace) -> int:
    from ..train.synthetic import write_dataset

    check_out_folder(args.output)
    out = write_dataset(
        args.output, args.format, args.num_images, args.seed, args.size, overwrite=args.overwrite
    )
    print(f"{args.num_images} synthetic images ({args.format}, seed {args.seed}) -> {out}/")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register train, eval and synth on the ``paddle-sam`` subparsers."""
    t = sub.add_parser("train", help="fine-tune or train a SAM model from a YAML config")
    t.add_argument("config", help="YAML run config (see configs/)")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optim.lr=3e-4 (repeatable)",
    )
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="start again in a non-empty run folder (deletes its previous run)",
    )
    t.add_argument(
        "--nproc",
        type=bounded(int, 1, MAX_NPROC),
        default=1,
        help=f"data-parallel processes via python -m paddle.distributed.launch (1 to {MAX_NPROC})",
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser(
        "eval",
        help="SAM v1: held-out mIoU at 1 click, 3 clicks and with a box; SAM 3: box and mask "
        "AP per concept; SAM 2: mean IoU of objects tracked through generated clips",
    )
    e.add_argument(
        "--data", default=None, help="dataset path (not for --format synthetic / concepts)"
    )
    e.add_argument(
        "--format",
        choices=("coco", "sa1b", "folder", "synthetic", "concepts", "clips"),
        default=None,
        help="default: folder (SAM v1), coco (SAM 3), clips (SAM 2); synthetic: generated SAM "
        "v1 scenes, concepts: generated SAM 3 concept scenes, clips: generated video clips "
        "(320 x 240, --frames each; --num-images clips)",
    )
    e.add_argument(
        "--confidence-threshold",
        type=parse_confidence_threshold,
        default=None,
        help="SAM 3: keep instances scoring above this for AP (default: 0.05, the one training's "
        "evaluations use)",
    )
    e.add_argument("--images", default=None, help="COCO image folder (default: images/)")
    e.add_argument(
        "--num-images",
        type=bounded(int, 1, MAX_EVAL_IMAGES),
        default=None,
        help="evaluate the first N images",
    )
    e.add_argument("--seed", type=parse_seed, default=1000, help="synthetic set seed")
    e.add_argument(
        "--styles",
        type=_styles,
        default=None,
        help="--format concepts: drawing styles, comma-separated, of "
        f"{','.join(CONCEPT_STYLES)} (default: flat, the original)",
    )
    e.add_argument(
        "--frames",
        type=bounded(int, 2, 10_000),
        default=12,
        help="--format clips: frames per clip (default 12)",
    )
    e.add_argument("--json", default=None, help="also write the result to this JSON file")
    e.add_argument("--overwrite", action="store_true")
    e.add_argument("--quiet", action="store_true")
    add_model_args(e, families=("sam_v1", "sam2", "sam3"))
    e.add_argument(
        "--exported",
        default=None,
        metavar="DIR",
        help="SAM 3: evaluate an export (paddle-sam export) on its runtime instead of "
        "--checkpoint, with --precision",
    )
    add_precision_arg(e)
    e.set_defaults(func=cmd_eval)

    s = sub.add_parser("synth", help="write a synthetic segmentation dataset (coco, sa1b, folder)")
    s.add_argument("output", help="output folder")
    s.add_argument("--format", choices=("coco", "sa1b", "folder"), default="folder")
    s.add_argument(
        "--num-images",
        type=bounded(int, 1, MAX_SYNTH_IMAGES),
        default=100,
        help=f"1 to {MAX_SYNTH_IMAGES} (default: %(default)s)",
    )
    s.add_argument("--seed", type=parse_seed, default=1000)
    s.add_argument(
        "--size",
        type=parse_size,
        action="append",
        default=None,
        metavar="WxH",
        help="image size, each side 32 to 8192 pixels, repeatable (default 640x480)",
    )
    s.add_argument("--overwrite", action="store_true")
    s.set_defaults(func=cmd_synth)
