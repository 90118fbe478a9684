"""``paddle-sam everything``: automatic mask generation over a point grid (SAM v1)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from .common import (
    add_model_args,
    add_precision_arg,
    bounded,
    check_one_source,
    check_precision,
    exported_predictor,
    load_model,
    prepare_out,
    read_image,
    write_masks,
)

# sane bounds: a 128 x 128 grid is 16k prompts per crop (upstream's default is 32); 4096
# prompts at once already hold gigabytes of low-res masks; 4 crop layers are 341 crops
MAX_POINTS_PER_SIDE = 128
MAX_POINTS_PER_BATCH = 4096
MAX_CROP_N_LAYERS = 4
MAX_REGION_AREA = 100_000_000  # the image pixel limit (predict.io.MAX_IMAGE_PIXELS)


def cmd_everything(args: argparse.Namespace) -> int:
    from ..predict.io import coco_rle, overlay
    from ..predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    check_one_source(args)
    check_precision(args)
    if args.exported is not None:
        model = exported_predictor(args.exported, precision=args.precision)
        if not hasattr(model, "predict_point_grid"):
            raise ValueError(
                f"--exported {args.exported}: 'everything' runs on a Paddle Inference export "
                "of SAM v1 (paddle-sam export --format pir), not on this one"
            )
    image = read_image(args.image, args.command)
    out = Path(args.output)
    prepare_out(out, ["overlay.png", "annotations.json", "masks"], args.overwrite)
    generator = SamAutomaticMaskGenerator(
        load_model(args) if args.exported is None else model,
        points_per_side=args.points_per_side,
        points_per_batch=args.points_per_batch,
        pred_iou_thresh=args.pred_iou_thresh,
        stability_score_thresh=args.stability_score_thresh,
        box_nms_thresh=args.box_nms_thresh,
        crop_n_layers=args.crop_n_layers,
        min_mask_region_area=args.min_mask_region_area,
        output_mode="binary_mask",
        progress=not args.quiet,
    )
    records = generator.generate(image)
    write_masks(out, [r["segmentation"] for r in records])
    annotations = []
    for i, r in enumerate(records):
        ann = {k: v for k, v in r.items() if k != "segmentation"}
        ann["id"] = i
        ann["segmentation"] = coco_rle(r["segmentation"])
        annotations.append(ann)
    overlay(image, [r["segmentation"] for r in records]).save(out / "overlay.png")
    doc = {
        "image": str(args.image),
        "height": int(image.shape[0]),
        "width": int(image.shape[1]),
        "annotations": annotations,
    }
    (out / "annotations.json").write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    print(f"{len(records)} masks -> {out}/masks/, overlay.png, annotations.json (COCO RLE)")
    return 0


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def add_generator_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The automatic mask generator's options (upstream's names), for ``everything`` and
    ``label --everything``; the defaults are the generator's own."""
    from ..predict.sam_v1.automatic_mask_generator import generator_defaults

    defaults = generator_defaults()
    parser.add_argument(
        "--points-per-side",
        type=bounded(int, 1, MAX_POINTS_PER_SIDE),
        default=defaults["points_per_side"],
        help=f"grid of N x N prompt points, 1 to {MAX_POINTS_PER_SIDE} (default: %(default)s)",
    )
    parser.add_argument(
        "--points-per-batch",
        type=bounded(int, 1, MAX_POINTS_PER_BATCH),
        default=defaults["points_per_batch"],
        help=f"prompts decoded at once, 1 to {MAX_POINTS_PER_BATCH} (default: %(default)s)",
    )
    parser.add_argument(
        "--pred-iou-thresh",
        type=bounded(float, 0.0, 1.0),
        default=defaults["pred_iou_thresh"],
        help="keep masks whose predicted IoU is above this, in [0, 1] (default: %(default)s)",
    )
    parser.add_argument(
        "--stability-score-thresh",
        type=bounded(float, 0.0, 1.0),
        default=defaults["stability_score_thresh"],
        help="keep masks at least this stable, in [0, 1] (default: %(default)s)",
    )
    parser.add_argument(
        "--box-nms-thresh",
        type=bounded(float, 0.0, 1.0),
        default=defaults["box_nms_thresh"],
        help="box IoU above which duplicates are removed, in [0, 1] (default: %(default)s)",
    )
    parser.add_argument(
        "--crop-n-layers",
        type=bounded(int, 0, MAX_CROP_N_LAYERS),
        default=defaults["crop_n_layers"],
        help=f"layers of image crops, 0 to {MAX_CROP_N_LAYERS} (default: %(default)s)",
    )
    parser.add_argument(
        "--min-mask-region-area",
        type=bounded(int, 0, MAX_REGION_AREA),
        default=defaults["min_mask_region_area"],
        help="remove holes and islands under this many pixels, 0 (off) to "
        f"{MAX_REGION_AREA} (default: %(default)s)",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``everything``."""
    e = sub.add_parser("everything", help="automatic mask generation over a point grid")
    e.add_argument("image")
    e.add_argument("-o", "--output", required=True, help="output folder")
    e.add_argument("--overwrite", action="store_true")
    add_generator_args(e)
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_args(e)
    e.add_argument(
        "--exported",
        default=None,
        metavar="DIR",
        help="run on a 'paddle-sam export' folder (Paddle Inference) instead of --checkpoint",
    )
    add_precision_arg(e)
    e.set_defaults(func=cmd_everything)
