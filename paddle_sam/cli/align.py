"""``paddle-sam align``: per-module comparison against the official segment-anything."""

from __future__ import annotations

import argparse

from ..models.sam_v1.build_sam import SAM_SPECS
from .common import read_image


def cmd_align(args: argparse.Namespace) -> int:
    from ..align.reference import import_reference

    torch, segment_anything = import_reference()
    from ..align.sam_v1 import align_sam
    from ..loading.sam_v1 import load_sam

    image = read_image(args.image, args.command) if args.image else None  # before the models
    ref = segment_anything.sam_model_registry[args.model_type](checkpoint=args.torch_checkpoint)
    ref.eval()
    ours = load_sam(args.checkpoint or args.torch_checkpoint, args.model_type)
    report = align_sam(ref, ours, image)
    print(report.to_json() if args.json else report.format_table())
    return 0 if report.passed else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``align``."""
    a = sub.add_parser(
        "align",
        help="per-module comparison against official segment-anything (needs the torch extra)",
    )
    a.add_argument("--model-type", choices=sorted(SAM_SPECS), required=True)
    a.add_argument("--torch-checkpoint", required=True, help="official .pth")
    a.add_argument(
        "--checkpoint",
        default=None,
        help="converted .pdparams to test (default: convert the .pth in memory)",
    )
    a.add_argument("--image", default=None, help="default: a fixed synthetic image")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.set_defaults(func=cmd_align)
