"""``paddle-sam align``: per-module comparison against the official PyTorch code of each family
(segment-anything, sam2, sam3), on an official checkpoint or on random weights of a named size."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..models.sam2.build_sam import SAM2_SPECS
from ..models.sam_v1.build_sam import SAM_SPECS
from .common import check_bounded, read_image

MODEL_TYPES = [*sorted(SAM_SPECS), *SAM2_SPECS, "sam3"]
_TITLES = {"sam_v1": "SAM v1", "sam2": "SAM 2", "sam3": "SAM 3"}


def _family_of(model_type: str) -> str:
    if model_type in SAM_SPECS:
        return "sam_v1"
    return "sam2" if model_type in SAM2_SPECS else "sam3"


def _check_args(args: argparse.Namespace) -> None:
    check_bounded("--frames", args.frames, 0, 16)
    if args.torch_checkpoint is None:
        if args.checkpoint is not None:
            raise ValueError(
                "--checkpoint needs --torch-checkpoint: the official file it was converted "
                "from, which the reference loads"
            )
        if args.model_type is None:
            raise ValueError(
                "give --torch-checkpoint FILE (official weights), or --model-type NAME to "
                "compare random weights of that size"
            )
    for option, path in (
        ("--torch-checkpoint", args.torch_checkpoint),
        ("--checkpoint", args.checkpoint),
    ):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{option} not found: {path}")


def _official_source(args: argparse.Namespace) -> Any:
    """The sniffed --torch-checkpoint: an official file of a family this command knows."""
    from ..loading import sniff

    hint = None if args.model_type is None else _family_of(args.model_type)
    source = sniff(args.torch_checkpoint, hint)
    if source.family is None:
        raise ValueError(
            f"{args.torch_checkpoint}: cannot tell which model family this is; pass --model-type"
        )
    if source.layout != "official":
        raise ValueError(
            f"{args.torch_checkpoint} is {source.describe()}: the reference loads the official "
            "code's own checkpoints (.pth / .pt); convert other layouts with 'paddle-sam "
            "convert' and compare the official file they come from"
        )
    if hint is not None and hint != source.family:
        raise ValueError(
            f"--model-type {args.model_type} is {_TITLES[hint]}, but {args.torch_checkpoint} "
            f"is {source.describe()}"
        )
    if args.checkpoint is not None:
        ours = sniff(args.checkpoint, source.family)
        if ours.family not in (None, source.family):
            raise ValueError(
                f"--checkpoint {args.checkpoint} is {ours.describe()}, but --torch-checkpoint "
                f"is {source.describe()}"
            )
    return source


def _from_checkpoints(args: argparse.Namespace) -> tuple[str, tuple, dict]:
    """``(family, models for its align function, report meta)`` of the official file and
    ours (--checkpoint, or the official file converted in memory by our loaders)."""
    source = _official_source(args)
    ours_path = args.checkpoint or args.torch_checkpoint
    meta = {"weights": Path(args.torch_checkpoint).name, "ours": Path(ours_path).name}
    if source.family == "sam_v1":
        from ..align.reference import build_reference_sam
        from ..loading.sam_v1 import load_sam

        ours = load_sam(ours_path, args.model_type)
        return "sam_v1", (build_reference_sam(ours.spec, args.torch_checkpoint), ours), meta
    if source.family == "sam2":
        from ..align.sam2 import build_reference_sam2
        from ..loading.sam2 import load_sam2

        ours = load_sam2(ours_path)
        return "sam2", (build_reference_sam2(ours.spec, args.torch_checkpoint), ours), meta
    from ..align.sam3 import build_reference_sam3, cpu_patches
    from ..convert.checkpoint import read_sam3_tracker_weights
    from ..convert.core import load_state_strict
    from ..loading import sniff
    from ..loading.sam3 import load_sam3
    from ..models.sam3.build_sam3 import build_tracker_model

    parts = source.parts & sniff(ours_path, "sam3").parts
    ours = load_sam3(ours_path, enable_inst_interactivity="clicks" in parts)
    tracker = None
    if "video" in parts and args.frames:
        tracker = build_tracker_model(ours.spec)
        load_state_strict(tracker, read_sam3_tracker_weights(ours_path, tracker))
    with cpu_patches():
        ref = build_reference_sam3(ours.spec, "clicks" in parts, args.torch_checkpoint)
    return "sam3", (ref, ours, tracker), meta


def _random(args: argparse.Namespace) -> tuple[str, tuple, dict]:
    """``(family, models, report meta)``: the official model of --model-type's size with
    random weights (from --seed), and ours with the same weights through our converter."""
    family = _family_of(args.model_type)
    meta = {"weights": f"random (seed {args.seed})"}
    if family == "sam_v1":
        from ..align.sam_v1 import random_pair

        return family, random_pair(SAM_SPECS[args.model_type], args.seed), meta
    if family == "sam2":
        from ..align.sam2 import random_pair as random_sam2

        return family, random_sam2(SAM2_SPECS[args.model_type], args.seed), meta
    from ..align.sam3 import random_pair as random_sam3

    return family, random_sam3(seed=args.seed), meta


@contextlib.contextmanager
def _quiet_references(verbose: bool) -> Iterator[None]:
    """The official packages' own chatter kept out (``--verbose`` keeps it): sam2 logs each
    embedding at INFO on the root logger; torch warns that ``torch.jit.script`` (which sam2
    uses) is deprecated and that CUDA autocast (which sam3's tracker sets up) is off."""
    if verbose:
        yield
        return
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"torch\.")
            yield
    finally:
        root.setLevel(level)


def cmd_align(args: argparse.Namespace) -> int:
    with _quiet_references(args.verbose):
        return _align(args)


def _align(args: argparse.Namespace) -> int:
    _check_args(args)
    image = read_image(args.image, args.command) if args.image else None  # before the models
    if args.torch_checkpoint is not None:
        family, models, meta = _from_checkpoints(args)
    else:
        family, models, meta = _random(args)
    print(
        f"comparing {_TITLES[family]} with the official code ({meta['weights']})", file=sys.stderr
    )
    if family == "sam_v1":
        from ..align.sam_v1 import align_sam

        report = align_sam(*models, image=image)
    elif family == "sam2":
        from ..align.sam2 import align_sam2

        report = align_sam2(*models, image=image, frames=args.frames)
    else:
        from ..align.sam3 import align_sam3

        report = align_sam3(*models, image=image, text=args.text, frames=args.frames)
    report.meta.update(model_type=args.model_type or _spec_name(models[1].spec), **meta)
    print(report.to_json() if args.json else report.format_table())
    return 0 if report.passed else 1


def _spec_name(spec: Any) -> str:
    """The registry name of a released size, else ``custom``."""
    from ..models.sam3.build_sam3 import SAM3_SPEC

    for name, known in (*SAM_SPECS.items(), *SAM2_SPECS.items(), ("sam3", SAM3_SPEC)):
        if known == spec:
            return name
    return "custom"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``align``."""
    a = sub.add_parser(
        "align",
        help="per-module comparison against the official PyTorch code, SAM v1, SAM 2 / 2.1 "
        "and SAM 3 (needs the torch extra)",
        description="Run our model and the official PyTorch one on the same image and prompts "
        "and compare every module's output (cosine, max and mean absolute error); the first "
        "module below cosine 0.99999 is named. Exit status 0: all aligned, 1: a module "
        "diverges. The family is read from the checkpoint.",
    )
    a.add_argument(
        "--torch-checkpoint",
        default=None,
        help="official .pth / .pt (segment-anything, sam2, sam3.pt); without it: random "
        "weights of --model-type's size",
    )
    a.add_argument(
        "--checkpoint",
        default=None,
        help="converted .pdparams to test (default: convert --torch-checkpoint in memory)",
    )
    a.add_argument(
        "--model-type",
        choices=MODEL_TYPES,
        default=None,
        help="the size: read from the checkpoint when given, needed for random weights",
    )
    a.add_argument("--seed", type=int, default=0, help="random weights' seed (default 0)")
    a.add_argument("--image", default=None, help="default: a fixed synthetic image")
    a.add_argument("--text", default="object", help="SAM 3's text prompt (default 'object')")
    a.add_argument(
        "--frames",
        type=int,
        default=3,
        help="SAM 2 / SAM 3 tracker: frames of the still video tracked through the memory "
        "(0: image modules only; default 3)",
    )
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.set_defaults(func=cmd_align)
