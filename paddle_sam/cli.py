"""``paddle-sam``: convert, segment, everything, align, export, serve.

Run ``paddle-sam COMMAND --help`` for each command's options. Errors in what the user gave
(files, prompts, arguments) print one line naming the problem and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, ImportError, KeyError)


def _floats(text: str, n: tuple[int, ...], what: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what} must be numbers separated by commas: {text!r}"
        ) from None
    if len(vals) not in n:
        raise argparse.ArgumentTypeError(
            f"{what} needs {' or '.join(map(str, n))} values: {text!r}"
        )
    return vals


def _point(text: str) -> list[float]:
    vals = _floats(text, (2, 3), "--point X,Y[,LABEL]")
    if len(vals) == 3 and vals[2] not in (0.0, 1.0):
        raise argparse.ArgumentTypeError(
            f"point label must be 1 (foreground) or 0 (background): {text!r}"
        )
    return vals if len(vals) == 3 else vals + [1.0]


def _box(text: str) -> list[float]:
    vals = _floats(text, (4,), "--box X0,Y0,X1,Y1")
    if vals[2] < vals[0] or vals[3] < vals[1]:
        raise argparse.ArgumentTypeError(f"box needs x0 <= x1 and y0 <= y1: {text!r}")
    return vals


def _check_prompts(
    points: list[list[float]], box: list[float] | list[list[float]] | None, image: np.ndarray
) -> None:
    """Prompts must lie inside the image; checked before the (slow) model is loaded.
    ``box``: one box, several, or None."""
    h, w = image.shape[:2]
    boxes = [] if box is None or len(box) == 0 else [box] if np.ndim(box) == 1 else list(box)
    corners = [("--box corner", xy) for b in boxes for xy in (b[:2], b[2:])]
    for name, xy in [("--point", p[:2]) for p in points] + corners:
        if not (0 <= xy[0] <= w and 0 <= xy[1] <= h):
            raise ValueError(
                f"{name} ({xy[0]:g}, {xy[1]:g}) lies outside the image (width {w}, height {h})"
            )


def _prepare_out(out: Path, names: list[str], overwrite: bool) -> None:
    """Refuse to replace existing outputs; the folder itself is made when writing."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output {out} exists and is not a folder")
    clash = [n for n in names if (out / n).exists()]
    if clash and not overwrite:
        raise FileExistsError(
            f"{out} already has {', '.join(clash)}; pass --overwrite to replace them"
        )


DEFAULT_MODEL = Path(__file__).parent / "assets" / "sam_tiny_synthetic.pdparams"


def _load_model(args):
    """The model of --checkpoint, or the bundled default synthetic model (with a notice)."""
    from .build.sam_v1 import load_sam

    if args.checkpoint is None:
        if args.model_type not in (None, "vit_tiny_synthetic"):
            raise ValueError(
                f"--model-type {args.model_type} needs --checkpoint FILE (converted official "
                "weights: 'paddle-sam convert'); only the default synthetic model is bundled"
            )
        print(
            f"note: no --checkpoint given, using the default synthetic model "
            f"({DEFAULT_MODEL.name}, a small SAM trained on generated shapes only; real "
            "images need converted official weights: paddle-sam convert)",
            file=sys.stderr,
        )
        return load_sam(DEFAULT_MODEL)
    return load_sam(args.checkpoint, args.model_type)


def cmd_convert(args) -> int:
    from .convert.checkpoint import convert_checkpoint

    t = time.perf_counter()
    meta = convert_checkpoint(
        args.src, args.dst, args.model_type, overwrite=args.overwrite, progress=not args.quiet
    )
    print(
        f"converted {args.src} ({meta['model_type']}, {meta['source']['layout']} layout) -> "
        f"{args.dst} in {time.perf_counter() - t:.1f}s; sidecar {args.dst}.json"
    )
    return 0


def cmd_export(args) -> int:
    from .convert.core import read_sidecar

    if _export_family(args) == "sam3":
        return _export_sam3(args)
    if args.fused_attention is not None:
        raise ValueError("--fused-attention applies to SAM 3 exports only")
    if args.format == "onnx":
        from .export.onnx import _paddle2onnx
        from .export.onnx import export_onnx as export

        _paddle2onnx()  # the missing extra is reported before the model is loaded
    else:
        from .export.sam_v1 import export_sam as export
    sam = _load_model(args)
    meta = read_sidecar(args.checkpoint or DEFAULT_MODEL) or {}
    t = time.perf_counter()
    manifest = export(
        sam,
        args.output,
        model_type=args.model_type or meta.get("model_type"),
        source_sha256=(meta.get("source") or {}).get("sha256"),
        overwrite=args.overwrite,
    )
    ext = "onnx" if args.format == "onnx" else "{json,pdiparams}"
    files = ", ".join(f"{name}.{ext}" for name in manifest["programs"])
    print(
        f"exported ({args.format}) -> {args.output}/ ({files}, export.json) "
        f"in {time.perf_counter() - t:.1f}s"
    )
    return 0


def _export_family(args) -> str:
    """``"sam3"`` or ``"sam"``: from --model-type, else from the checkpoint."""
    if args.model_type is not None:
        return "sam3" if args.model_type == "sam3" else "sam"
    if args.checkpoint is not None:
        from .convert.checkpoint import detect_family

        return detect_family(args.checkpoint) or "sam"
    return "sam"


def _export_sam3(args) -> int:
    """``export`` of a SAM 3 checkpoint: backbone, text encoder and prompt decoder."""
    from .build.sam3 import load_sam3
    from .convert.core import read_sidecar
    from .export.sam3 import export_sam3
    from .models.sam3.build_sam3 import Sam3Spec

    if args.format != "pir":
        raise ValueError("SAM 3 exports to PIR programs only (--format pir)")
    if args.checkpoint is None:
        raise ValueError(
            "no --checkpoint given: convert the official sam3.pt with 'paddle-sam convert' "
            "and pass --checkpoint FILE"
        )
    model = load_sam3(args.checkpoint)
    meta = read_sidecar(args.checkpoint) or {}
    t = time.perf_counter()
    export_sam3(
        model,
        args.output,
        source_sha256=(meta.get("source") or {}).get("sha256"),
        overwrite=args.overwrite,
        spec=Sam3Spec.from_dict(meta["spec"]) if "spec" in meta else None,
        fused_attention=args.fused_attention,
    )
    print(
        f"exported (pir) -> {args.output}/ (backbone, text_encoder, prompt_decoder "
        f".{{json,pdiparams}}, export.json) in {time.perf_counter() - t:.1f}s"
    )
    return 0


def _exported_predictor(export_dir: str):
    """The runtime for an export folder: Paddle Inference, or onnxruntime for ONNX."""
    from .deploy.sam_v1 import StaticSamPredictor, peek_format
    from .export.onnx import ONNX_FORMAT

    if peek_format(export_dir) == ONNX_FORMAT:
        from .deploy.onnx import OnnxSamPredictor

        return OnnxSamPredictor(export_dir)
    return StaticSamPredictor(export_dir)  # with its own clear errors for anything else


def _segment_family(args) -> str:
    """``"sam3"`` or ``"sam"``: from --model-type, else from the checkpoint, else (a file that
    cannot tell cheaply) from the prompts: --text means SAM 3."""
    if args.model_type is not None:
        return "sam3" if args.model_type == "sam3" else "sam"
    if args.exported is not None:
        from .deploy.sam_v1 import peek_format
        from .export.sam3 import EXPORT_FORMAT as SAM3_FORMAT

        if not Path(args.exported).is_dir():
            raise FileNotFoundError(f"export folder not found: {args.exported}")
        return "sam3" if peek_format(args.exported) == SAM3_FORMAT else "sam"
    if args.checkpoint is not None:
        from .convert.checkpoint import detect_family

        family = detect_family(args.checkpoint)
        if family is not None:
            return family
    return "sam3" if args.text is not None else "sam"


def cmd_segment(args) -> int:
    from .predict.io import load_image, overlay, save_mask_png
    from .predict.sam_v1.predictor import SamPredictor

    if args.checkpoint is not None and not Path(args.checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint not found: {args.checkpoint}")
    family = _segment_family(args)
    if family == "sam3" and not args.point:
        return _segment_sam3(args)
    if family == "sam3":  # clicks: the interactive predictor (predict_inst)
        _check_sam3_clicks(args)
    elif args.text is not None:
        raise ValueError(
            "--text needs a SAM 3 model (--model-type sam3 and a SAM 3 checkpoint); SAM v1 "
            "models take --point and --box"
        )
    for flag, given in (
        ("--negative-box", args.negative_box),
        ("--confidence-threshold", args.confidence_threshold is not None),
        ("--bpe", args.bpe and family != "sam3"),
    ):
        if given:
            raise ValueError(f"{flag} is for SAM 3 models (with --text / --box)")
    if len(args.box) > 1:
        what = "SAM v1 model" if family == "sam" else "SAM 3 model with --point"
        raise ValueError(f"a {what} takes one --box, got {len(args.box)}")
    args.box = args.box[0] if args.box else None
    if not args.point and args.box is None:
        raise ValueError("give at least one --point X,Y[,LABEL] or a --box X0,Y0,X1,Y1")
    image = load_image(args.image)
    _check_prompts(args.point, args.box, image)
    out = Path(args.output)
    multimask = args.multimask
    if multimask is None:  # upstream's advice: several masks for one ambiguous point
        multimask = len(args.point) == 1 and args.box is None
    names = ["mask.png", "overlay.png", "result.json"]
    if multimask:
        names += [f"mask_{i}.png" for i in range(3)]
    _prepare_out(out, names, args.overwrite)

    if family == "sam3":
        predictor = _Sam3Clicks(args.checkpoint, args.bpe)
    elif args.exported is not None:
        if args.checkpoint is not None:
            raise ValueError("give either --checkpoint or --exported, not both")
        predictor = _exported_predictor(args.exported)
    else:
        predictor = SamPredictor(_load_model(args))
    coords = np.array([p[:2] for p in args.point]) if args.point else None
    labels = np.array([int(p[2]) for p in args.point]) if args.point else None
    box = np.array(args.box) if args.box is not None else None
    t = time.perf_counter()
    predictor.set_image(image)
    t_embed = time.perf_counter() - t
    t = time.perf_counter()
    masks, scores, _ = predictor.predict(coords, labels, box, multimask_output=multimask)
    t_decode = time.perf_counter() - t
    best = int(np.argmax(scores))
    out.mkdir(parents=True, exist_ok=True)
    if args.overwrite and not multimask:  # an overwritten multimask run's masks would linger
        for i in range(3):
            (out / f"mask_{i}.png").unlink(missing_ok=True)
    save_mask_png(masks[best], out / "mask.png")
    if multimask:
        for i, m in enumerate(masks):
            save_mask_png(m, out / f"mask_{i}.png")
    overlay(
        image, [masks[best]], points=coords, labels=labels, boxes=None if box is None else box[None]
    ).save(out / "overlay.png")
    result = {
        "image": str(args.image),
        "checkpoint": str(args.exported or args.checkpoint or DEFAULT_MODEL.name),
        "prompts": {"points": args.point or [], "box": args.box},
        "multimask_output": multimask,
        "scores": [float(s) for s in scores],
        "best": best,
        "mask_area": int(masks[best].sum()),
        "seconds": {"image_embedding": round(t_embed, 3), "decoder": round(t_decode, 4)},
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"mask (score {scores[best]:.3f}, {result['mask_area']} px) -> {out}/mask.png, "
        f"overlay.png, result.json"
    )
    return 0


def _check_sam3_clicks(args) -> None:
    """--point with a SAM 3 checkpoint: SAM v1 style clicks through ``predict_inst``, which
    needs the tracker weights (``tracker.*`` of the released sam3.pt)."""
    from .convert.core import read_sidecar

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
        raise ValueError(
            "no --checkpoint given: convert the official sam3.pt with 'paddle-sam convert' "
            "and pass --checkpoint FILE"
        )
    meta = read_sidecar(args.checkpoint) or {}
    if meta.get("interactive") is False:
        raise ValueError(
            f"--point with SAM 3 needs the tracker's prompt encoder and mask decoder "
            f"(tracker.* in the released sam3.pt); {args.checkpoint} was converted from a file "
            "without them. Use --text / --box, or convert the full sam3.pt"
        )


class _Sam3Clicks:
    """SAM v1 ``predict`` on a SAM 3 model: ``Sam3Processor.set_image`` + ``predict_inst``."""

    def __init__(self, checkpoint: str, bpe: str | None) -> None:
        from .build.sam3 import load_sam3
        from .predict.sam3.processor import Sam3Processor

        self.model = load_sam3(checkpoint, bpe_path=bpe, enable_inst_interactivity=True)
        size = self.model.backbone.vision_backbone.trunk.img_size
        self.processor = Sam3Processor(self.model, resolution=size)
        self.state: dict = {}

    def set_image(self, image: np.ndarray) -> None:
        self.state = self.processor.set_image(image)

    def predict(self, point_coords, point_labels, box, multimask_output: bool):
        masks, scores, low_res = self.model.predict_inst(
            self.state,
            point_coords=point_coords,
            point_labels=point_labels,
            box=box,
            multimask_output=multimask_output,
        )
        return masks > 0.5, scores, low_res


def _xyxy_to_cxcywh_norm(box: list[float], h: int, w: int) -> list[float]:
    x0, y0, x1, y1 = box
    return [(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h]


def _segment_sam3(args) -> int:
    """``segment`` with a SAM 3 model: every instance of a concept (text and/or exemplar
    boxes), one mask PNG each, an overlay with boxes and scores, COCO RLE annotations."""
    from .build.sam3 import load_sam3
    from .predict.io import coco_rle, load_image, overlay, save_mask_png
    from .predict.sam3.processor import Sam3Processor

    if args.exported is not None and args.checkpoint is not None:
        raise ValueError("give either --checkpoint or --exported, not both")
    if args.multimask is not None:
        raise ValueError("--multimask / --single-mask are for clicks (--point), not --text")
    if args.text is None and not args.box:
        raise ValueError("a SAM 3 model needs --text PHRASE and/or --box X0,Y0,X1,Y1")
    if args.text is not None and not args.text.strip():
        raise ValueError("--text is empty")
    threshold = 0.5 if args.confidence_threshold is None else args.confidence_threshold
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"--confidence-threshold must lie in [0, 1], got {threshold:g}")
    if args.bpe is not None and not Path(args.bpe).is_file():
        raise FileNotFoundError(f"BPE vocabulary not found: {args.bpe}")
    if args.checkpoint is None and args.exported is None:
        raise ValueError(
            "no --checkpoint given: convert the official sam3.pt with 'paddle-sam convert' "
            "and pass --checkpoint FILE (or --exported DIR from 'paddle-sam export')"
        )
    image = load_image(args.image)
    _check_prompts([], args.box + args.negative_box, image)
    out = Path(args.output)
    _prepare_out(out, ["overlay.png", "annotations.json", "masks"], args.overwrite)

    t = time.perf_counter()
    if args.exported is not None:
        from .deploy.sam3 import StaticSam3Processor

        processor = StaticSam3Processor(
            args.exported, confidence_threshold=threshold, bpe_path=args.bpe
        )
    else:
        model = load_sam3(args.checkpoint, bpe_path=args.bpe)
        processor = Sam3Processor(
            model,
            resolution=model.backbone.vision_backbone.trunk.img_size,
            confidence_threshold=threshold,
        )
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    state = processor.set_image(image)
    t_embed = time.perf_counter() - t
    h, w = image.shape[:2]
    t = time.perf_counter()
    if args.text is not None:
        state = processor.set_text_prompt(args.text, state)
    for box, label in [(b, True) for b in args.box] + [(b, False) for b in args.negative_box]:
        state = processor.add_geometric_prompt(_xyxy_to_cxcywh_norm(box, h, w), label, state)
    t_heads = time.perf_counter() - t

    scores = state["scores"].numpy()
    order = np.argsort(-scores, kind="stable")  # best first
    masks = state["masks"].numpy()[order, 0]
    boxes = state["boxes"].numpy()[order]
    scores = scores[order]
    (out / "masks").mkdir(parents=True, exist_ok=True)
    for stale in (out / "masks").glob("[0-9][0-9][0-9][0-9].png"):  # from an overwritten run
        stale.unlink()
    annotations = []
    for i, (mask, box, score) in enumerate(zip(masks, boxes, scores, strict=True)):
        save_mask_png(mask, out / "masks" / f"{i:04d}.png")
        x0, y0, x1, y1 = (float(v) for v in box)
        annotations.append(
            {
                "id": i,
                "score": float(score),
                "bbox": [x0, y0, x1 - x0, y1 - y0],  # COCO: x, y, width, height
                "area": int(mask.sum()),
                "segmentation": coco_rle(mask),
            }
        )
    prompt_boxes = np.asarray(args.box + args.negative_box, dtype=np.float64).reshape(-1, 4)
    overlay(
        image,
        list(masks),
        boxes=np.concatenate([boxes, prompt_boxes]) if len(prompt_boxes) else boxes,
        captions=[f"{s:.2f}" for s in scores]
        + ["+" for _ in args.box]
        + ["-" for _ in args.negative_box],
    ).save(out / "overlay.png")
    doc = {
        "image": str(args.image),
        "height": h,
        "width": w,
        "checkpoint": str(args.exported or args.checkpoint),
        "model_type": "sam3",
        "prompts": {
            "text": args.text,
            "boxes": args.box,
            "negative_boxes": args.negative_box,
        },
        "confidence_threshold": threshold,
        "annotations": annotations,
        "seconds": {
            "load": round(t_load, 3),
            "image_embedding": round(t_embed, 3),
            "prompt": round(t_heads, 4),
        },
    }
    (out / "annotations.json").write_text(json.dumps(doc, indent=1) + "\n")
    what = repr(args.text) if args.text is not None else f"{len(args.box)} exemplar box(es)"
    print(
        f"{len(annotations)} instance(s) of {what} above {threshold:g} -> {out}/masks/, "
        "overlay.png, annotations.json (COCO RLE)"
    )
    return 0


def cmd_everything(args) -> int:
    from .predict.io import coco_rle, load_image, overlay, save_mask_png
    from .predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    image = load_image(args.image)
    out = Path(args.output)
    _prepare_out(out, ["overlay.png", "annotations.json", "masks"], args.overwrite)
    generator = SamAutomaticMaskGenerator(
        _load_model(args),
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
    (out / "masks").mkdir(parents=True, exist_ok=True)
    for stale in (out / "masks").glob("[0-9][0-9][0-9][0-9].png"):  # from an overwritten run
        stale.unlink()
    annotations = []
    for i, r in enumerate(records):
        save_mask_png(r["segmentation"], out / "masks" / f"{i:04d}.png")
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


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def cmd_align(args) -> int:
    from .align.reference import import_reference

    torch, segment_anything = import_reference()
    from .align.sam_v1 import align_sam
    from .build.sam_v1 import load_sam
    from .predict.io import load_image

    ref = segment_anything.sam_model_registry[args.model_type](checkpoint=args.torch_checkpoint)
    ref.eval()
    ours = load_sam(args.checkpoint or args.torch_checkpoint, args.model_type)
    image = load_image(args.image) if args.image else None
    report = align_sam(ref, ours, image)
    print(report.to_json() if args.json else report.format_table())
    return 0 if report.passed else 1


def cmd_random_checkpoint(args) -> int:
    from safetensors.numpy import save_file

    from .convert.sam_v1 import random_official_state_dict
    from .models.sam_v1.build_sam import SAM_SPECS

    dst = Path(args.output)
    if dst.exists() and not args.overwrite:
        raise FileExistsError(f"{dst} exists; pass --overwrite to replace it")
    if dst.suffix != ".safetensors":
        raise ValueError(f"output must end in .safetensors: {dst}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file(random_official_state_dict(SAM_SPECS[args.model_type], args.seed), str(dst))
    print(f"random {args.model_type} weights (official layout, NOT a trained model) -> {dst}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .models.sam_v1.build_sam import SAM_SPECS
    from .serve import cli as serve_cli

    types = sorted(SAM_SPECS)
    p = argparse.ArgumentParser(prog="paddle-sam", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available)")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser(
        "convert", help="convert an official SAM checkpoint to .pdparams (no torch needed)"
    )
    c.add_argument(
        "src", help="official .pth (zip or legacy) or .safetensors (official or HF layout)"
    )
    c.add_argument("dst", help="output .pdparams (a .json sidecar is written next to it)")
    c.add_argument(
        "--model-type",
        choices=[*types, "sam3"],
        default=None,
        help="default: detected from the weights",
    )
    c.add_argument("--overwrite", action="store_true", help="replace an existing output")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    c.set_defaults(func=cmd_convert)

    def model_args(q, sam3: bool = False):
        q.add_argument(
            "--checkpoint", default=None, help="converted .pdparams (or an official file)"
        )
        q.add_argument(
            "--model-type",
            choices=[*types, "sam3"] if sam3 else types,
            default=None,
            help="default: from the checkpoint's sidecar or its weights",
        )

    s = sub.add_parser(
        "segment",
        help="SAM v1: one object from points and/or a box; SAM 3: every instance of a "
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
        type=_point,
        action="append",
        default=[],
        metavar="X,Y[,LABEL]",
        help="a prompt point in pixels; LABEL 1 = foreground (default), 0 = background "
        "(SAM v1, or a SAM 3 checkpoint with its tracker: predict_inst)",
    )
    s.add_argument(
        "--box",
        type=_box,
        action="append",
        default=[],
        metavar="X0,Y0,X1,Y1",
        help="a box in pixels; SAM v1: the object (one box); SAM 3: an exemplar of the "
        "concept (repeatable)",
    )
    s.add_argument(
        "--negative-box",
        type=_box,
        action="append",
        default=[],
        metavar="X0,Y0,X1,Y1",
        help="SAM 3: a counter-example box (repeatable)",
    )
    s.add_argument(
        "--confidence-threshold",
        type=float,
        default=None,
        help="SAM 3: keep instances scoring above this (default 0.5; 0 keeps every query)",
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
        "or onnxruntime "
        "for --format onnx)",
    )
    model_args(s, sam3=True)
    s.set_defaults(func=cmd_segment)

    x = sub.add_parser(
        "export",
        help="export to PIR static programs for Paddle Inference (SAM v1: image encoder and "
        "prompt decoder; SAM 3: backbone, text encoder and prompt decoder)",
    )
    x.add_argument("-o", "--output", required=True, help="output folder")
    x.add_argument(
        "--format",
        choices=["pir", "onnx"],
        default="pir",
        help="pir: Paddle Inference programs (default); onnx: via paddle2onnx (the onnx extra)",
    )
    x.add_argument("--overwrite", action="store_true")
    x.add_argument(
        "--fused-attention",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SAM 3: long self-attentions through Paddle's fused CPU kernel (AVX-512 CPUs "
        "only; default: when this machine has it); --no-fused-attention for GPUs",
    )
    model_args(x, sam3=True)
    x.set_defaults(func=cmd_export)

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
    model_args(e)
    e.set_defaults(func=cmd_everything)

    a = sub.add_parser(
        "align",
        help="per-module comparison against official segment-anything (needs the torch extra)",
    )
    a.add_argument("--model-type", choices=types, required=True)
    a.add_argument("--torch-checkpoint", required=True, help="official .pth")
    a.add_argument(
        "--checkpoint",
        default=None,
        help="converted .pdparams to test (default: convert the .pth in memory)",
    )
    a.add_argument("--image", default=None, help="default: a fixed synthetic image")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.set_defaults(func=cmd_align)

    r = sub.add_parser(
        "random-checkpoint",
        help="random weights in the official layout "
        "(.safetensors) for demos and tests; NOT a trained model",
    )
    r.add_argument("--model-type", choices=types, default="vit_b")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("-o", "--output", required=True)
    r.add_argument("--overwrite", action="store_true")
    r.set_defaults(func=cmd_random_checkpoint)

    serve_cli.add_parser(sub, model_args)
    from .train.cli import add_parser as add_train_parsers  # train, eval, synth

    add_train_parsers(sub, model_args)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ._runtime import set_num_threads
    from .convert.core import CheckpointError

    try:
        if args.threads is not None:
            set_num_threads(args.threads)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return args.func(args)
    except (*USER_ERRORS, CheckpointError) as exc:
        msg = str(exc) if not isinstance(exc, KeyError) else f"missing key {exc}"
        print(f"paddle-sam {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
