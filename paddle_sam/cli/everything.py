"""``paddle-sam everything``: automatic mask generation over a point grid (SAM v1, SAM 2)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..predict.outputs import claim
from .common import (
    add_model_args,
    add_precision_arg,
    bounded,
    check_one_source,
    check_precision,
    exported_predictor,
    family,
    load_model,
    prepare_out,
    read_image,
    source_of,
    write_masks,
)

# sane bounds: a 128 x 128 grid is 16k prompts per crop (upstream's default is 32); 4096
# prompts at once already hold gigabytes of low-res masks; 4 crop layers are 341 crops
MAX_POINTS_PER_SIDE = 128
MAX_POINTS_PER_BATCH = 4096
MAX_CROP_N_LAYERS = 4
MAX_REGION_AREA = 100_000_000  # the image pixel limit (predict.io.MAX_IMAGE_PIXELS)
OUTPUTS = ["overlay.png", "annotations.json", "masks"]


def cmd_everything(args: argparse.Namespace) -> int:
    from ..predict.io import coco_annotation, coco_document, overlay
    from ..predict.sam_v1.automatic_mask_generator import (
        SamAutomaticMaskGenerator,
        explain_empty,
    )

    check_one_source(args)
    check_precision(args)
    kind = family(args)  # an export folder's too
    if args.exported is not None and kind != "sam2":
        model = exported_predictor(args.exported, precision=args.precision)
        if not hasattr(model, "predict_point_grid"):
            raise ValueError(
                f"--exported {args.exported}: 'everything' runs on a Paddle Inference export "
                "of SAM v1 (paddle-sam export --format pir), not on this one"
            )
    image = read_image(args.image, args.command)
    out = Path(args.output)
    prepare_out(out, OUTPUTS, args.overwrite)
    options, note = generator_options(args, kind)
    if kind == "sam2":
        from ..loading import load_image_predictor
        from ..predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

        # the predictor's model: a checkpoint's, or an export's (image encoder on OpenVINO)
        source = source_of(args, "sam2")
        predictor = load_image_predictor(
            source, model_type=args.model_type, precision=args.precision
        )
        model = predictor.model
        generator: Any = SAM2AutomaticMaskGenerator(
            model, output_mode="binary_mask", progress=not args.quiet, **options
        )
    else:
        if args.exported is None:
            model = load_model(args)
        generator = SamAutomaticMaskGenerator(
            model, output_mode="binary_mask", progress=not args.quiet, **options
        )
    records = [r for r in generator.generate(image) if r["area"] > 0]  # COCO holds no empty
    claim(out, OUTPUTS, "everything")
    write_masks(out, [r["segmentation"] for r in records])
    annotations = [
        coco_annotation(
            r["segmentation"],
            category_id=1,
            score=r["predicted_iou"],
            predicted_iou=r["predicted_iou"],
            stability_score=r["stability_score"],
            point_coords=r["point_coords"],
            crop_box=r["crop_box"],
        )
        for r in records
    ]
    overlay(image, [r["segmentation"] for r in records]).save(out / "overlay.png")
    doc = coco_document(
        str(args.image),
        image.shape[0],
        image.shape[1],
        annotations,
        [{"id": 1, "name": "object", "supercategory": "object"}],
        info={"description": "paddle-sam everything", "generator": options},
    )
    (out / "annotations.json").write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    print(f"{len(records)} masks -> {out}/masks/, overlay.png, annotations.json (COCO)")
    if note:
        print(note, file=sys.stderr)
    if not records:
        print(f"no mask kept: {explain_empty(generator)}", file=sys.stderr)
    return 0


def generator_options(
    args: argparse.Namespace, kind: str = "sam_v1"
) -> tuple[dict[str, Any], str | None]:
    """The generator's options: those given, else the defaults for the command's model of
    family ``kind`` (SAM 2's own; lower for the bundled demo model, whose masks are softer),
    and a note saying so (None when the defaults are upstream's), for the command to print
    with its result."""
    from ..loading import BUNDLED_GENERATOR, generator_defaults_for, is_bundled

    source = source_of(args, kind, notice=False)  # a checkpoint or an export folder
    defaults = generator_defaults_for(source)
    options = {k: defaults[k] if getattr(args, k) is None else getattr(args, k) for k in defaults}
    lowered = [k for k in BUNDLED_GENERATOR if getattr(args, k) is None]
    note = None
    if source is not None and is_bundled(source) and lowered:
        shown = " ".join(f"--{k.replace('_', '-')} {options[k]}" for k in lowered)
        note = (
            f"note: filters for the bundled model, whose masks are softer: {shown} (SAM's "
            "defaults suit official weights)"
        )
    return options, note


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def add_generator_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The automatic mask generator's options (upstream's names), for ``everything`` and
    ``label --everything``; the defaults are the generator's own."""
    from ..loading import BUNDLED_GENERATOR
    from ..predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator
    from ..predict.sam_v1.automatic_mask_generator import generator_defaults

    defaults = generator_defaults()
    sam2 = generator_defaults(SAM2AutomaticMaskGenerator)
    parser.add_argument(
        "--points-per-side",
        type=bounded(int, 1, MAX_POINTS_PER_SIDE),
        default=None,
        help=f"grid of N x N prompt points, 1 to {MAX_POINTS_PER_SIDE} (default: "
        f"{defaults['points_per_side']}; {BUNDLED_GENERATOR['points_per_side']} with the "
        "bundled model)",
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
        default=None,
        help="keep masks whose predicted IoU is above this, in [0, 1] (default: "
        f"{defaults['pred_iou_thresh']}, SAM 2: {sam2['pred_iou_thresh']}; "
        f"{BUNDLED_GENERATOR['pred_iou_thresh']} with the bundled model)",
    )
    parser.add_argument(
        "--stability-score-thresh",
        type=bounded(float, 0.0, 1.0),
        default=None,
        help="keep masks at least this stable, in [0, 1] (default: "
        f"{defaults['stability_score_thresh']}; {BUNDLED_GENERATOR['stability_score_thresh']} "
        "with the bundled model)",
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
        f"{MAX_REGION_AREA} (SAM 2: of the low-res masks, as upstream; default: %(default)s)",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``everything``."""
    e = sub.add_parser(
        "everything", help="automatic mask generation over a point grid (SAM v1, SAM 2)"
    )
    e.add_argument("image")
    e.add_argument("-o", "--output", required=True, help="output folder")
    e.add_argument("--overwrite", action="store_true")
    add_generator_args(e)
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    # sam3: answered with what to run instead
    add_model_args(e, families=("sam_v1", "sam2", "sam3"))
    e.add_argument(
        "--exported",
        default=None,
        metavar="DIR",
        help="run on a 'paddle-sam export' folder (Paddle Inference) instead of --checkpoint",
    )
    add_precision_arg(e)
    e.set_defaults(func=cmd_everything)
