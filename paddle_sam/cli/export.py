"""``paddle-sam export``: PIR static programs (or ONNX) for SAM v1 and SAM 3."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .common import DEFAULT_MODEL, add_model_args, check_out_folder, family, load_model


def cmd_export(args: argparse.Namespace) -> int:
    from ..convert.core import read_sidecar
    from ..export.sam_v1 import MANIFEST

    check_out_folder(args.output)  # before the (slow) model load
    if (Path(args.output) / MANIFEST).exists() and not args.overwrite:
        raise FileExistsError(
            f"{args.output} already holds an export ({MANIFEST}); pass --overwrite to replace it"
        )
    if family(args) == "sam3":
        return _export_sam3(args)
    if args.fused_attention is not None:
        raise ValueError("--fused-attention applies to SAM 3 exports only")
    if args.format == "onnx":
        from ..export.onnx import _paddle2onnx
        from ..export.onnx import export_onnx as export

        _paddle2onnx()  # the missing extra is reported before the model is loaded
    else:
        from ..export.sam_v1 import export_sam as export
    sam = load_model(args)
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


def _export_sam3(args: argparse.Namespace) -> int:
    """``export`` of a SAM 3 checkpoint: backbone, text encoder and prompt decoder."""
    from ..build.sam3 import load_sam3
    from ..convert.core import read_sidecar
    from ..export.sam3 import export_sam3

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
        fused_attention=args.fused_attention,
    )
    print(
        f"exported (pir) -> {args.output}/ (backbone, text_encoder, prompt_decoder "
        f".{{json,pdiparams}}, export.json) in {time.perf_counter() - t:.1f}s"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``export``."""
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
    add_model_args(x, families=("sam_v1", "sam3"))
    x.set_defaults(func=cmd_export)
