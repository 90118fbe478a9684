"""``paddle-sam everything``: automatic mask generation over a point grid (SAM v1)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from .common import add_model_args, load_model, prepare_out, write_masks


def cmd_everything(args: argparse.Namespace) -> int:
    from ..predict.io import coco_rle, load_image, overlay
    from ..predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    image = load_image(args.image)
    out = Path(args.output)
    prepare_out(out, ["overlay.png", "annotations.json", "masks"], args.overwrite)
    generator = SamAutomaticMaskGenerator(
        load_model(args),
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``everything``."""
    e = sub.add_parser("everything", help="automatic mask generation over a point grid")
    e.add_argument("image")
    e.add_argument("-o", "--output", required=True, help="output folder")
    e.add_argument("--overwrite", action="store_true")
    e.add_argument("--points-per-side", type=int, default=32)
    e.add_argument("--points-per-batch", type=int, default=64)
    e.add_argument("--pred-iou-thresh", type=float, default=0.88)
    e.add_argument("--stability-score-thresh", type=float, default=0.95)
    e.add_argument("--box-nms-thresh", type=float, default=0.7)
    e.add_argument("--crop-n-layers", type=int, default=0)
    e.add_argument("--min-mask-region-area", type=int, default=0)
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_args(e)
    e.set_defaults(func=cmd_everything)
