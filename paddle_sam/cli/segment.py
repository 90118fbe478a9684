"""``paddle-sam segment``: SAM v1, SAM 2 (and SAM 3 clicks) segment one object from points, a
box and/or a previous answer's logits (--mask-input); SAM 3 finds every instance of a concept
from --text and/or exemplar boxes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..loading.sam_v1 import DEFAULT_MODEL
from ..predict.outputs import claim, remove_owned
from .common import (
    add_model_args,
    add_precision_arg,
    check_one_source,
    check_precision,
    check_prompts,
    exported_predictor,
    family,
    image_predictor,
    parse_box,
    parse_confidence_threshold,
    parse_point,
    prepare_out,
    read_image,
    sam3_checkpoint,
    source_of,
    write_masks,
)

SAM3_OUTPUTS = ["overlay.png", "annotations.json", "masks"]  # segment --text's files
#: the best mask's low-resolution logits (``1 x h x w`` float32), which --mask-input reads back
LOGITS = "logits.npy"

NO_SAM3_CHECKPOINT = (
    "no --checkpoint given: clicks with SAM 3 need its tracker's heads, which the bundled "
    "small SAM 3 does not have; convert the official sam3.pt with 'paddle-sam convert' and "
    "pass --checkpoint FILE"
)


def cmd_segment(args: argparse.Namespace) -> int:
    from ..predict.io import overlay, save_mask_png

    if args.checkpoint is not None and not Path(args.checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint not found: {args.checkpoint}")
    check_precision(args)
    kind = family(args)
    if kind == "sam3" and not args.point:
        return _segment_sam3(args)
    if kind == "sam3":  # clicks: the interactive predictor (predict_inst)
        _check_sam3_clicks(args)
    elif args.text is not None:
        raise ValueError(
            "--text needs a SAM 3 model (--model-type sam3 and a SAM 3 checkpoint); SAM v1 "
            "and SAM 2 models take --point and --box"
        )
    for flag, given in (
        ("--negative-box", args.negative_box),
        ("--confidence-threshold", args.confidence_threshold is not None),
        ("--bpe", args.bpe and kind != "sam3"),
    ):
        if given:
            raise ValueError(f"{flag} is for SAM 3 models (with --text / --box)")
    if len(args.box) > 1:
        what = {"sam_v1": "SAM v1 model", "sam2": "SAM 2 model"}.get(
            kind, "SAM 3 model with --point"
        )
        raise ValueError(f"a {what} takes one --box, got {len(args.box)}")
    args.box = args.box[0] if args.box else None
    if not args.point and args.box is None and args.mask_input is None:
        raise ValueError(
            "give at least one --point X,Y[,LABEL], a --box X0,Y0,X1,Y1 or a --mask-input"
        )
    mask_input = _mask_input(args.mask_input)
    image = read_image(args.image, args.command)
    check_prompts(args.point, args.box, image)
    out = Path(args.output)
    multimask = args.multimask
    if multimask is None:  # upstream's advice: several masks for one ambiguous point
        multimask = len(args.point) == 1 and args.box is None and mask_input is None
    names = ["mask.png", "overlay.png", "result.json", LOGITS]
    if multimask:
        names += [f"mask_{i}.png" for i in range(3)]
    prepare_out(out, names, args.overwrite)

    if kind == "sam3":
        predictor = image_predictor(args, "sam3", bpe=args.bpe, clicks=True)
    elif args.exported is not None:  # SAM v1 or SAM 2
        check_one_source(args)
        predictor = exported_predictor(args.exported, precision=args.precision)
    else:
        predictor = image_predictor(args, kind)
    if multimask and getattr(predictor, "return_single_mask", False):
        if args.multimask:
            raise ValueError(
                "--multimask: this ONNX export returns one mask (exported with "
                "--return-single-mask); drop --multimask or export without that flag"
            )
        multimask = False
        print("note: this ONNX export returns one mask per prompt", file=sys.stderr)
    coords = np.array([p[:2] for p in args.point]) if args.point else None
    labels = np.array([int(p[2]) for p in args.point]) if args.point else None
    box = np.array(args.box) if args.box is not None else None
    t = time.perf_counter()
    predictor.set_image(image)
    t_embed = time.perf_counter() - t
    t = time.perf_counter()
    masks, scores, logits = predictor.predict(
        coords, labels, box, mask_input=mask_input, multimask_output=multimask
    )
    t_decode = time.perf_counter() - t
    best = int(np.argmax(scores))
    claim(out, names, "segment")
    if args.overwrite and not multimask:  # an overwritten multimask run's masks would linger
        remove_owned(out, [f"mask_{i}.png" for i in range(3)])
    save_mask_png(masks[best], out / "mask.png")
    np.save(out / LOGITS, np.asarray(logits[best : best + 1], dtype=np.float32))
    if multimask:
        for i, m in enumerate(masks):
            save_mask_png(m, out / f"mask_{i}.png")
    overlay(
        image, [masks[best]], points=coords, labels=labels, boxes=None if box is None else box[None]
    ).save(out / "overlay.png")
    result = {
        "image": str(args.image),
        "checkpoint": str(args.exported or args.checkpoint or DEFAULT_MODEL.name),
        "prompts": {
            "points": args.point or [],
            "box": args.box,
            **({"mask_input": str(args.mask_input)} if args.mask_input is not None else {}),
        },
        "multimask_output": multimask,
        "scores": [float(s) for s in scores],
        "best": best,
        "mask_area": int(masks[best].sum()),
        "seconds": {"image_embedding": round(t_embed, 3), "decoder": round(t_decode, 4)},
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"mask (score {scores[best]:.3f}, {result['mask_area']} px) -> {out}/mask.png, "
        f"overlay.png, result.json, {LOGITS}"
    )
    return 0


def _mask_input(path: str | None) -> np.ndarray | None:
    """--mask-input: a previous answer's low-res logits (``logits.npy`` of an earlier run, or
    any ``.npy`` of ``1 x h x w`` / ``h x w`` floats); the predictor checks their size."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise FileNotFoundError(f"--mask-input not found: {path}")
    try:
        logits = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--mask-input {path}: not a NumPy .npy array ({exc})") from None
    if logits.ndim == 2:
        logits = logits[None]
    if logits.ndim != 3 or logits.shape[0] != 1 or not np.issubdtype(logits.dtype, np.floating):
        raise ValueError(
            f"--mask-input {path}: expected 1 x h x w float logits ({LOGITS} of an earlier "
            f"run), got {logits.dtype} {tuple(logits.shape)}"
        )
    if not np.isfinite(logits).all():
        raise ValueError(f"--mask-input {path}: holds NaN or infinite values")
    return logits.astype(np.float32)


def _check_sam3_clicks(args: argparse.Namespace) -> None:
    """--point with a SAM 3 checkpoint: SAM v1 style clicks through ``predict_inst``, which
    needs the tracker weights (``tracker.*`` of the released sam3.pt)."""

    if args.text is not None:
        raise ValueError(
            "--point and --text do not combine: with SAM 3, --point (and one --box) segments "
            "one object like SAM v1; --text (and --box exemplars) finds every instance"
        )
    if args.exported is not None:
        raise ValueError(
            "--point with SAM 3 needs --checkpoint: a SAM 3 export holds the text / box "
            "grounding programs only, not the interactive heads"
        )
    if args.checkpoint is None:
        raise ValueError(NO_SAM3_CHECKPOINT)
    from ..loading import sniff

    if sniff(args.checkpoint, "sam3").lacks("clicks"):
        raise ValueError(
            f"--point with SAM 3 needs the tracker's prompt encoder and mask decoder "
            f"(tracker.* in the released sam3.pt); {args.checkpoint} was converted from a file "
            "without them. Use --text / --box, or convert the full sam3.pt"
        )


def _segment_sam3(args: argparse.Namespace) -> int:
    """``segment`` with a SAM 3 model: every instance of a concept (text and/or exemplar
    boxes), one mask PNG each, an overlay with boxes and scores, COCO RLE annotations."""
    from ..loading import outside_vocabulary
    from ..predict.io import coco_annotation, coco_document, overlay

    check_one_source(args)
    if args.multimask is not None:
        raise ValueError("--multimask / --single-mask are for clicks (--point), not --text")
    if args.mask_input is not None:
        raise ValueError("--mask-input refines clicks (--point), not --text")
    if args.text is None and not args.box:
        raise ValueError("a SAM 3 model needs --text PHRASE and/or --box X0,Y0,X1,Y1")
    if args.text is not None and not args.text.strip():
        raise ValueError("--text is empty")
    threshold = 0.5 if args.confidence_threshold is None else args.confidence_threshold
    if args.bpe is not None and not Path(args.bpe).is_file():
        raise FileNotFoundError(f"BPE vocabulary not found: {args.bpe}")
    image = read_image(args.image, args.command)
    check_prompts([], args.box + args.negative_box, image)
    out = Path(args.output)
    prepare_out(out, SAM3_OUTPUTS, args.overwrite)

    t = time.perf_counter()
    if args.exported is not None:
        predictor = exported_predictor(args.exported, threshold, args.bpe, args.precision)
    else:
        args.checkpoint = sam3_checkpoint(args)
        note = args.text and outside_vocabulary(source_of(args, "sam3", notice=False), [args.text])
        if note:
            print(f"note: {note}", file=sys.stderr)
        predictor = image_predictor(
            args, "sam3", bpe=args.bpe, confidence_threshold=threshold, clicks=False
        )
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    predictor.set_image(image)
    t_embed = time.perf_counter() - t
    h, w = image.shape[:2]
    t = time.perf_counter()
    labels = [True] * len(args.box) + [False] * len(args.negative_box)
    found = predictor.ground(args.text, args.box + args.negative_box, labels)
    t_heads = time.perf_counter() - t

    kept = [i for i, m in enumerate(found.masks) if m.any()]  # COCO holds no empty mask
    masks, boxes, scores = found.masks[kept], found.boxes[kept], found.scores[kept]
    claim(out, SAM3_OUTPUTS, "segment")
    write_masks(out, masks)
    annotations = [
        coco_annotation(
            mask,
            category_id=1,
            score=float(score),
            detector_box_xyxy=[float(v) for v in box],  # the detector's own box
        )
        for mask, box, score in zip(masks, boxes, scores, strict=True)
    ]
    prompt_boxes = np.asarray(args.box + args.negative_box, dtype=np.float64).reshape(-1, 4)
    overlay(
        image,
        list(masks),
        boxes=np.concatenate([boxes, prompt_boxes]) if len(prompt_boxes) else boxes,
        captions=[f"{s:.2f}" for s in scores]
        + ["+" for _ in args.box]
        + ["-" for _ in args.negative_box],
    ).save(out / "overlay.png")
    info = {
        "description": "paddle-sam segment",
        "checkpoint": str(args.exported or args.checkpoint),
        "model_type": "sam3",
        "prompts": {"text": args.text, "boxes": args.box, "negative_boxes": args.negative_box},
        "confidence_threshold": threshold,
        "seconds": {
            "load": round(t_load, 3),
            "image_embedding": round(t_embed, 3),
            "prompt": round(t_heads, 4),
        },
    }
    name = args.text if args.text is not None else "exemplar"
    doc = coco_document(
        str(args.image),
        h,
        w,
        annotations,
        [{"id": 1, "name": name, "supercategory": "concept"}],
        info=info,
    )
    (out / "annotations.json").write_text(json.dumps(doc, indent=1) + "\n")
    annotations = doc["annotations"]
    what = repr(args.text) if args.text is not None else f"{len(args.box)} exemplar box(es)"
    print(
        f"{len(annotations)} instance(s) of {what} above {threshold:g} -> {out}/masks/, "
        "overlay.png, annotations.json (COCO)"
    )
    if not annotations:
        print(
            f"nothing scored above the confidence threshold {threshold:g}: "
            "lower it with --confidence-threshold",
            file=sys.stderr,
        )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``segment``."""
    s = sub.add_parser(
        "segment",
        help="SAM v1 / SAM 2: one object from points and/or a box; SAM 3: every instance of a "
        "concept from --text and/or exemplar boxes",
    )
    s.add_argument("image")
    s.add_argument(
        "--text",
        default=None,
        metavar="PHRASE",
        help="SAM 3: a noun phrase, e.g. 'a dog'; every instance is segmented",
    )
    s.add_argument(
        "--point",
        type=parse_point,
        action="append",
        default=[],
        metavar="X,Y[,LABEL]",
        help="a prompt point in pixels; LABEL 1 = foreground (default), 0 = background "
        "(SAM v1, SAM 2, or a SAM 3 checkpoint with its tracker: predict_inst)",
    )
    s.add_argument(
        "--box",
        type=parse_box,
        action="append",
        default=[],
        metavar="X0,Y0,X1,Y1",
        help="a box in pixels; SAM v1, SAM 2: the object (one box); SAM 3: an exemplar of "
        "the concept (repeatable)",
    )
    s.add_argument(
        "--mask-input",
        default=None,
        metavar="NPY",
        help=f"a previous answer's low-res logits to refine ({LOGITS} of an earlier run: "
        "upstream's mask_input), with or without new points",
    )
    s.add_argument(
        "--negative-box",
        type=parse_box,
        action="append",
        default=[],
        metavar="X0,Y0,X1,Y1",
        help="SAM 3: a counter-example box (repeatable)",
    )
    s.add_argument(
        "--confidence-threshold",
        type=parse_confidence_threshold,
        default=None,
        help="SAM 3: keep instances scoring above this, in [0, 1) (default 0.5; 0 keeps "
        "every query)",
    )
    s.add_argument(
        "--bpe",
        default=None,
        metavar="PATH",
        help="SAM 3: BPE vocabulary (default: the copy shipped with paddle-sam)",
    )
    mm = s.add_mutually_exclusive_group()
    mm.add_argument(
        "--multimask",
        dest="multimask",
        action="store_true",
        default=None,
        help="predict 3 masks and keep the best (default for a single point)",
    )
    mm.add_argument("--single-mask", dest="multimask", action="store_false")
    s.add_argument("-o", "--output", required=True, help="output folder")
    s.add_argument("--overwrite", action="store_true")
    s.add_argument(
        "--exported",
        default=None,
        metavar="DIR",
        help="run a 'paddle-sam export' folder, SAM v1 or SAM 3 (Paddle Inference on the CPU, "
        "or onnxruntime for --format onnx)",
    )
    add_precision_arg(s)
    add_model_args(s, families=("sam_v1", "sam2", "sam3"))
    s.set_defaults(func=cmd_segment)
