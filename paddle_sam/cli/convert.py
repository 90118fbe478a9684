"""``paddle-sam convert`` and ``paddle-sam random-checkpoint``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..models.sam2.build_sam import SAM2_SPECS
from ..models.sam_v1.build_sam import SAM_SPECS
from ..predict.outputs import check_targets, claim
from .common import check_out_file, check_out_folder, parse_seed


def cmd_convert(args: argparse.Namespace) -> int:
    from ..convert.checkpoint import convert_checkpoint
    from ..convert.core import sidecar_path

    dst = Path(args.dst)
    if dst.is_dir():
        raise IsADirectoryError(f"output {dst} is a folder; give a .pdparams file name")
    check_out_folder(dst.parent, f"output {dst}: folder")
    names = [dst.name, sidecar_path(dst).name]
    check_targets(dst.parent, names, replace=True)  # a user's file; paddle-sam's: convert's
    t = time.perf_counter()
    meta = convert_checkpoint(
        args.src, args.dst, args.model_type, overwrite=args.overwrite, progress=not args.quiet
    )
    claim(dst.parent, names, "convert")  # written atomically: complete, or not at all
    print(
        f"converted {args.src} ({meta['model_type']}, {meta['source']['layout']} layout) -> "
        f"{args.dst} in {time.perf_counter() - t:.1f}s; sidecar {args.dst}.json"
    )
    return 0


def cmd_random_checkpoint(args: argparse.Namespace) -> int:
    from safetensors.numpy import save_file

    from ..convert.sam_v1 import random_official_state_dict

    dst = Path(args.output)
    if dst.suffix != ".safetensors":
        raise ValueError(f"output must end in .safetensors: {dst}")
    check_out_file(dst, args.overwrite)
    claim(dst.parent, [dst.name], "random-checkpoint")
    save_file(random_official_state_dict(SAM_SPECS[args.model_type], args.seed), str(dst))
    print(f"random {args.model_type} weights (official layout, NOT a trained model) -> {dst}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``convert`` and ``random-checkpoint``."""
    types = sorted(SAM_SPECS)
    c = sub.add_parser(
        "convert", help="convert an official SAM checkpoint to .pdparams (no torch needed)"
    )
    c.add_argument(
        "src", help="official .pth (zip or legacy) or .safetensors (official or HF layout)"
    )
    c.add_argument("dst", help="output .pdparams (a .json sidecar is written next to it)")
    c.add_argument(
        "--model-type",
        choices=[*types, *SAM2_SPECS, "sam3"],
        default=None,
        help="default: detected from the weights",
    )
    c.add_argument("--overwrite", action="store_true", help="replace an existing output")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    c.set_defaults(func=cmd_convert)

    r = sub.add_parser(
        "random-checkpoint",
        help="random weights in the official layout "
        "(.safetensors) for demos and tests; NOT a trained model",
    )
    r.add_argument("--model-type", choices=types, default="vit_b")
    r.add_argument("--seed", type=parse_seed, default=0)
    r.add_argument("-o", "--output", required=True)
    r.add_argument("--overwrite", action="store_true")
    r.set_defaults(func=cmd_random_checkpoint)
