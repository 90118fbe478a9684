"""``paddle-sam export``: PIR static programs (or ONNX) for SAM v1 and SAM 3; SAM 2's image
encoder, memory attention and memory encoder and (``--format onnx``) SAM 3's vision backbone
to ONNX for OpenVINO; (``--format samexporter``) SAM 3's image model as the samexporter
package's three ONNX files."""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

from ..predict.outputs import check_targets, foreign
from .common import (
    add_model_args,
    check_out_folder,
    family,
    load_model,
    positive,
    source_of,
)

DEFAULT_CALIBRATION_IMAGES = 8

# the ONNX-only options: (attribute, flag); set on a PIR export they are refused
ONNX_OPTIONS = (
    ("return_single_mask", "--return-single-mask"),
    ("use_stability_score", "--use-stability-score"),
    ("return_extra_metrics", "--return-extra-metrics"),
    ("gelu_approximate", "--gelu-approximate"),
    ("dynamic_batch", "--dynamic-batch"),
    ("quantize", "--quantize"),
    ("opset", "--opset"),
    ("calibration", "--calibration"),
    ("calibration_images", "--calibration-images"),
)


def _onnx_flags(args: argparse.Namespace, allowed: tuple[str, ...] = ()) -> list[str]:
    """The ONNX-only flags the command line gives, but those of the ``allowed`` attributes."""
    return [
        flag
        for attr, flag in ONNX_OPTIONS
        if attr not in allowed and getattr(args, attr) not in (None, False)
    ]


def _refuse_other_options(
    args: argparse.Namespace, where: str, allowed: tuple[str, ...] = ()
) -> None:
    """A ValueError naming the ONNX-only flags (but ``allowed``) and --fused-attention given
    to an export they are not options of (``where`` says which exports they are for)."""
    given = _onnx_flags(args, allowed)
    if args.fused_attention is not None:
        given.append("--fused-attention")
    if given:
        raise ValueError(f"{', '.join(given)}: {where}")


def _check_onnx_options(args: argparse.Namespace) -> dict:
    """The ONNX export options as ``export_onnx`` keywords; refused with --format pir."""
    given = _onnx_flags(args)
    if args.format != "onnx":
        if given:
            raise ValueError(f"{', '.join(given)}: for --format onnx only")
        return {}
    from ..export.onnx import DEFAULT_OPSET, check_onnx_options

    _check_calibration(args)
    opset = DEFAULT_OPSET if args.opset is None else args.opset
    try:
        check_onnx_options(opset, args.quantize)
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None  # "--opset must be ...", "--quantize must be"
    options = {attr: bool(getattr(args, attr)) for attr, _ in ONNX_OPTIONS[:5]}
    return {**options, "quantize": args.quantize, "opset": opset}


def _check_calibration(args: argparse.Namespace) -> None:
    """--calibration needs --quantize int8; --calibration-images needs --calibration."""
    if args.calibration is not None and not args.quantize:
        raise ValueError("--calibration: the images calibrate --quantize int8; add it")
    if args.calibration_images is not None and args.calibration is None:
        raise ValueError("--calibration-images: how many of --calibration's images; add it")


def calibration_images(args: argparse.Namespace) -> list | None:
    """--calibration's images (at most --calibration-images, spread evenly over the sorted
    list) as H x W x 3 uint8 arrays; None without --calibration."""
    if args.calibration is None:
        return None
    import numpy as np

    from ..label.sources import list_images
    from ..predict.io import load_image

    items = list_images(args.calibration)
    n = min(len(items), args.calibration_images or DEFAULT_CALIBRATION_IMAGES)
    picked = [items[i] for i in np.linspace(0, len(items) - 1, n).round().astype(int)]
    print(f"calibrating int8 on {n} of {len(items)} images from {args.calibration}")
    from .._runtime import int8_activation_note

    if (note := int8_activation_note()) is not None:  # the file may be for another machine
        print(f"note: {note}", file=sys.stderr)
    return [load_image(item.path) for item in picked]


def cmd_export(args: argparse.Namespace) -> int:
    from ..export.sam_v1 import MANIFEST
    from ..loading import resolve

    check_out_folder(args.output)  # before the (slow) model load; every file is checked
    try:  # again by the export, which knows their names
        check_targets(args.output, [MANIFEST], replace=args.overwrite)
    except FileExistsError as exc:
        if foreign(args.output, [MANIFEST]):
            raise
        raise FileExistsError(
            f"{args.output} already holds an export ({MANIFEST}); pass --overwrite to replace it"
        ) from exc
    fam = family(args)
    if fam == "sam2":
        return _export_sam2(args)
    args.format = args.format or "pir"
    if fam == "sam3":
        return _export_sam3(args)
    if args.format == "samexporter":
        raise ValueError(
            "--format samexporter is SAM 3's (samexporter's SAM 3 layout); SAM v1's --format "
            "onnx already has the official SAM ONNX interface that samexporter's SAM client reads"
        )
    if args.fused_attention is not None:
        raise ValueError("--fused-attention applies to SAM 3 exports only")
    onnx_options = _check_onnx_options(args)
    if args.format == "onnx":
        from ..export.onnx import _int8_tools, _paddle2onnx, _quantizer
        from ..export.onnx import export_onnx as export

        _paddle2onnx()  # a missing extra is reported before the model is loaded
        if args.quantize:
            _quantizer()
        if args.calibration is not None:
            _int8_tools()
        onnx_options["calibration"] = calibration_images(args)
    else:
        from ..export.sam_v1 import export_sam as export
    sam = load_model(args)  # the bundled model with its notice when no --checkpoint
    meta = resolve(args.checkpoint, None, args.model_type, family="sam_v1").meta
    t = time.perf_counter()
    manifest = export(
        sam,
        args.output,
        model_type=args.model_type or meta.get("model_type"),
        source_sha256=(meta.get("source") or {}).get("sha256"),
        overwrite=args.overwrite,
        **onnx_options,
    )
    files = ", ".join(name for names in manifest["programs"].values() for name in names)
    print(
        f"exported ({args.format}) -> {Path(args.output)}/ ({files}, {MANIFEST}) "
        f"in {time.perf_counter() - t:.1f}s"
    )
    return 0


def _export_sam3(args: argparse.Namespace) -> int:
    """``export`` of a SAM 3 checkpoint: PIR programs (backbone, text encoder and prompt
    decoder) or, with ``--format onnx``, the vision backbone to ONNX for OpenVINO with the
    other weights beside it (the tracker's too: clicks and video run on the export)."""
    from ..export.sam3 import export_sam3, export_sam3_onnx
    from ..loading import load_model as load

    if args.format == "samexporter":
        return _export_sam3_samexporter(args)
    if args.format == "onnx":
        where = "for SAM v1 ONNX / SAM 3 PIR exports only"
        _refuse_other_options(
            args, where, allowed=("quantize", "calibration", "calibration_images")
        )
        _check_calibration(args)
        if args.quantize:
            from ..export.onnx import _int8_tools

            _int8_tools()  # a missing extra is named before the model is loaded
        calibration = calibration_images(args)
    else:
        _check_onnx_options(args)
    source = source_of(args, "sam3")
    # ONNX: with the second neck where the checkpoint has the tracker (clicks, video)
    model = load(source, clicks=args.format == "onnx" and "clicks" in source.parts)
    meta = source.meta
    sha = (meta.get("source") or {}).get("sha256")
    t = time.perf_counter()
    if args.format == "onnx":
        from ..convert.checkpoint import read_sam3_weights
        from ..export.sam3 import INT8_FILES, TEXT_INT8_FILES, quantize_sam3_export
        from ..export.sam_v1 import check_outputs

        if args.quantize:  # refused before the export, not after it
            check_outputs(Path(args.output), [*INT8_FILES, *TEXT_INT8_FILES], args.overwrite)
        state = read_sam3_weights(source.path)  # the tracker's weights too
        export_sam3_onnx(
            model, args.output, state=state, source_sha256=sha, overwrite=args.overwrite
        )
        if args.quantize:  # from the files alone: the model's memory is free for NNCF
            del model, state
            gc.collect()
            quantize_sam3_export(args.output, calibration, overwrite=True)
        int8 = (
            " + vision_backbone.int8.xml/.bin, text_encoder.int8.xml/.bin" if args.quantize else ""
        )
        print(
            f"exported (onnx) -> {Path(args.output)}/ (vision_backbone.onnx + .data{int8}, "
            f"model.pdparams, export.json) in {time.perf_counter() - t:.1f}s; run it with "
            f"--exported {Path(args.output)} (the openvino extra)"
            + (" [--precision int8]" if args.quantize else "")
        )
        return 0
    export_sam3(
        model,
        args.output,
        source_sha256=sha,
        overwrite=args.overwrite,
        fused_attention=args.fused_attention,
    )
    print(
        f"exported (pir) -> {Path(args.output)}/ (backbone, text_encoder, prompt_decoder "
        f".{{json,pdiparams}}, export.json) in {time.perf_counter() - t:.1f}s"
    )
    return 0


def _export_sam3_samexporter(args: argparse.Namespace) -> int:
    """``export --format samexporter``: SAM 3's image model as the three ONNX files that the
    samexporter package's client (``SegmentAnything3ONNX``) runs on ONNX Runtime."""
    from ..export.onnx import _paddle2onnx
    from ..export.sam3 import export_sam3_samexporter
    from ..loading import load_model as load

    _refuse_other_options(args, "not options of --format samexporter")
    _paddle2onnx()  # a missing extra is named before the model is loaded
    model = load(source_of(args, "sam3"))
    t = time.perf_counter()
    files = export_sam3_samexporter(model, args.output, overwrite=args.overwrite)
    names = ", ".join(f.name for f in files.values())
    print(
        f"exported (samexporter) -> {Path(args.output)}/ ({names}) in "
        f"{time.perf_counter() - t:.1f}s; run them with samexporter's client, e.g. python -m "
        f"samexporter.inference --sam_variant sam3 --encoder_model {files['image_encoder']} "
        f"--decoder_model {files['decoder']} --language_encoder_model "
        f"{files['language_encoder']} --image IMAGE --prompt PROMPT.json --text_prompt TEXT"
    )
    return 0


def _export_sam2(args: argparse.Namespace) -> int:
    """``export`` of a SAM 2 checkpoint: the image encoder, memory attention and memory
    encoder to ONNX (for OpenVINO), the other weights beside it."""
    from ..export.sam2 import export_sam2
    from ..loading import load_model as load

    if args.format not in (None, "onnx"):
        raise ValueError(
            "SAM 2 exports its image encoder to ONNX, which OpenVINO runs (--format onnx, the "
            "default for SAM 2)"
        )
    if args.calibration is not None:
        raise ValueError(
            "--calibration: SAM 2's --quantize int8 stores int8 weights only (calibrated int8 "
            "activations measured less accurate and little faster); leave it out"
        )
    _refuse_other_options(args, "for SAM v1 / SAM 3 exports only", allowed=("quantize",))
    if args.quantize:
        from ..export.onnx import _int8_tools

        _int8_tools()  # a missing extra is named before the model is loaded
    source = source_of(args, "sam2")
    model = load(source, model_type=args.model_type)
    meta = source.meta
    t = time.perf_counter()
    export_sam2(
        model,
        args.output,
        model_type=source.model_type or meta.get("model_type"),
        source_sha256=(meta.get("source") or {}).get("sha256"),
        overwrite=args.overwrite,
        quantize=args.quantize,
    )
    int8 = " + image_encoder.int8.xml/.bin" if args.quantize else ""
    print(
        f"exported (onnx) -> {Path(args.output)}/ (image_encoder.onnx{int8}, "
        "memory_attention.onnx, memory_encoder.onnx, model.pdparams, export.json) in "
        f"{time.perf_counter() - t:.1f}s; run it with --exported "
        f"{Path(args.output)} (the openvino extra)"
        + (" [--precision int8]" if args.quantize else "")
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``export``."""
    x = sub.add_parser(
        "export",
        help="export to PIR static programs for Paddle Inference (SAM v1: image encoder and "
        "prompt decoder; SAM 3: backbone, text encoder and prompt decoder), to ONNX (SAM v1, "
        "with the official decoder interface) or, for SAM 2, its image encoder, memory "
        "attention and memory encoder to ONNX for OpenVINO",
    )
    x.add_argument("-o", "--output", required=True, help="output folder")
    x.add_argument(
        "--format",
        choices=["pir", "onnx", "samexporter"],
        default=None,
        help="pir: Paddle Inference programs (the default for SAM v1 and SAM 3); onnx: SAM "
        "v1's image_encoder.onnx and prompt_decoder.onnx via paddle2onnx (the onnx extra), the "
        "decoder with the official SAM ONNX interface; SAM 3's vision_backbone.onnx for "
        "OpenVINO (the rest runs on Paddle); SAM 2's image_encoder.onnx, memory_attention.onnx "
        "and memory_encoder.onnx for OpenVINO (its only format); samexporter: SAM 3's image "
        "model as samexporter's three ONNX files "
        "(sam3_image_encoder.onnx, sam3_language_encoder.onnx, sam3_decoder.onnx) for its ONNX "
        "Runtime client and the tools reading that layout",
    )
    x.add_argument("--overwrite", action="store_true")
    x.add_argument(
        "--fused-attention",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SAM 3: long self-attentions through Paddle's fused CPU kernel (AVX-512 CPUs "
        "only; default: when this machine has it); --no-fused-attention for GPUs",
    )
    onnx = x.add_argument_group("ONNX (--format onnx; the official export script's options)")
    onnx.add_argument(
        "--return-single-mask",
        action="store_true",
        help="the decoder returns one mask, the official rule's pick (the best of the three "
        "for one click or a box alone, the single-mask output for more points), instead of "
        "all four",
    )
    onnx.add_argument(
        "--use-stability-score",
        action="store_true",
        help="scores are the stability scores of the low-res masks (offset 1.0) instead of "
        "the predicted IoU",
    )
    onnx.add_argument(
        "--return-extra-metrics",
        action="store_true",
        help="five decoder outputs: masks, iou_predictions, stability_scores, areas, low_res_masks",
    )
    onnx.add_argument(
        "--gelu-approximate",
        action="store_true",
        help="the decoder's GELUs as tanh approximations, for runtimes with a slow or "
        "missing erf (the image encoder keeps the exact GELU)",
    )
    onnx.add_argument(
        "--opset", type=int, default=None, help="ONNX opset (default 17; at least 11)"
    )
    onnx.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="the image encoder takes a batch of any size (default: 1 x 3 x S x S)",
    )
    onnx.add_argument(
        "--quantize",
        choices=["int8"],
        default=None,
        help="SAM v1: also write image_encoder.quant.onnx and prompt_decoder.quant.onnx, "
        "dynamically quantised by onnxruntime (uint8 weights), as the official script's "
        "--quantize-out; SAM 3: also vision_backbone.int8.xml/.bin and "
        "text_encoder.int8.xml/.bin, the backbone and the text encoder with int8 weights for "
        "OpenVINO (NNCF; the int8 extra), run with --precision int8; with --calibration, the "
        "backbone's activations int8 too (SAM v1: image_encoder.int8.xml/.bin); SAM 2: also "
        "image_encoder.int8.xml/.bin, int8 weights only",
    )
    onnx.add_argument(
        "--calibration",
        default=None,
        metavar="IMAGES",
        help="with --quantize int8: images like those the model will see (a folder, a glob, a "
        ".txt list or a COCO .json, as for label) to calibrate int8 activations on; the image "
        "encoder (SAM v1: image_encoder.int8.xml/.bin) or backbone (SAM 3) then runs with "
        "int8 weights and activations on OpenVINO with --precision int8, the fastest int8 "
        "path measured (the openvino and int8 extras)",
    )
    onnx.add_argument(
        "--calibration-images",
        type=positive(int),
        default=None,
        help=f"how many of --calibration's images to use, spread evenly over them (default "
        f"{DEFAULT_CALIBRATION_IMAGES}; each costs about two image-encoder runs)",
    )
    add_model_args(x, families=("sam_v1", "sam2", "sam3"))
    x.set_defaults(func=cmd_export)
