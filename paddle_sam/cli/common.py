"""What the commands share: model options and loading, the model family, prompt parsing and
checks, output folders, the SAM 3 confidence threshold and the runtimes of export folders."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..loading.registry import check_dynamic_precision
from ..models.sam2.build_sam import SAM2_SPECS
from ..models.sam_v1.build_sam import SAM_SPECS
from ..predict.outputs import check_targets

# -- models ------------------------------------------------------------------------------


def add_model_args(parser: argparse.ArgumentParser, families: Sequence[str] = ("sam_v1",)) -> None:
    """--checkpoint and --model-type, whose choices are the model types of ``families``."""
    types = sorted(SAM_SPECS) if "sam_v1" in families else []
    types += ["sam2", *sorted(SAM2_SPECS)] if "sam2" in families else []
    types += ["sam3"] if "sam3" in families else []
    parser.add_argument(
        "--checkpoint", default=None, help="converted .pdparams (or an official file)"
    )
    parser.add_argument(
        "--model-type",
        choices=types,
        default=None,
        help="default: from the checkpoint's sidecar or its weights; without --checkpoint, "
        "a family's name (sam2, sam3) picks its bundled model",
    )


def source_of(args: argparse.Namespace, family: str | None = None, notice: bool = True) -> Any:
    """The sniffed source (:class:`paddle_sam.loading.Source`) of --checkpoint / --exported /
    --model-type, or the bundled model of ``family`` (with a notice on stderr). Where the
    files cannot tell the family, the prompts decide: --text means SAM 3."""
    from ..loading import bundled_notice, resolve

    exported = getattr(args, "exported", None)
    checkpoint = getattr(args, "checkpoint", None)
    model_type = getattr(args, "model_type", None)
    source = resolve(checkpoint, exported, model_type, family=family)
    if source.family is None and family is None:
        guess = "sam3" if getattr(args, "text", None) is not None else "sam_v1"
        source = resolve(checkpoint, exported, model_type, family=guess)
    said = bundled_notice(source) if checkpoint is None and exported is None else None
    if said is not None and notice:
        print(f"note: no --checkpoint given, {said}", file=sys.stderr)
    return source


def load_model(args: argparse.Namespace) -> Any:
    """The SAM v1 model of --checkpoint, or the bundled default synthetic model (with a
    notice)."""
    from ..loading import load_model as load

    return load(sam_v1_source(args), model_type=args.model_type)


def image_predictor(args: argparse.Namespace, family: str, **options: Any) -> Any:
    """The image predictor of the command's --checkpoint (or bundled model) of ``family``
    (:func:`paddle_sam.loading.load_image_predictor`, ``options`` passed on)."""
    from ..loading import load_image_predictor

    if family == "sam_v1":
        return load_image_predictor(sam_v1_source(args), model_type=args.model_type, **options)
    if family == "sam2":
        source = source_of(args, "sam2")
        return load_image_predictor(source, model_type=getattr(args, "model_type", None), **options)
    return load_image_predictor(source_of(args, family), **options)


# what to run instead when a SAM 3 model is given to a SAM v1 command
SAM3_INSTEAD = {
    "everything": "SAM 3 finds every instance of a concept instead: paddle-sam segment IMAGE "
    "--text PHRASE (paddle-sam label DIR --text PHRASE for a folder)",
}


def sam_v1_source(args: argparse.Namespace) -> Any:
    command = getattr(args, "command", None)
    if args.model_type == "sam3":
        raise ValueError(
            f"'{command}' runs SAM v1, not SAM 3; "
            + SAM3_INSTEAD.get(command, "use --model-type vit_b, vit_l or vit_h")
        )
    if args.checkpoint is None and args.model_type not in (None, "vit_tiny_synthetic"):
        raise ValueError(
            f"--model-type {args.model_type} needs --checkpoint FILE (converted official "
            "weights: 'paddle-sam convert'); only the default synthetic model is bundled"
        )
    source = source_of(args, "sam_v1")
    if source.family == "sam3":
        instead = SAM3_INSTEAD.get(command, "give a SAM v1 checkpoint")
        raise ValueError(f"{source.path} is a SAM 3 model and '{command}' runs SAM v1; {instead}")
    if source.family == "sam2":
        raise ValueError(
            f"{source.path} is a SAM 2 model and '{command}' runs SAM v1 (or SAM 3); SAM 2 "
            "runs in segment, everything, track, export, serve and label --everything"
        )
    return source


def sam3_checkpoint(args: argparse.Namespace) -> str | Path:
    """--checkpoint of a SAM 3 command, or the bundled small SAM 3 (with a notice)."""
    if args.checkpoint is not None:
        return args.checkpoint
    return source_of(args, "sam3").path


def family(args: argparse.Namespace) -> str:
    """``"sam_v1"``, ``"sam2"`` or ``"sam3"``: from --model-type, else from what the --exported
    folder or the --checkpoint holds (:func:`paddle_sam.loading.sniff`; a missing file is
    left to the loader's error), else (a file that cannot tell cheaply) from the prompts:
    --text means SAM 3."""
    from ..loading import family_of_model_type, sniff

    model_type = getattr(args, "model_type", None)
    if model_type is not None:
        return family_of_model_type(model_type) or "sam_v1"
    exported = getattr(args, "exported", None)
    if exported is not None:
        if not Path(exported).is_dir():
            raise FileNotFoundError(f"export folder not found: {exported}")
        found = sniff(exported).family
        return found or "sam_v1"
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint is not None and Path(checkpoint).exists():
        found = sniff(checkpoint).family
        if found is not None:
            return found
    return "sam3" if getattr(args, "text", None) is not None else "sam_v1"


def add_precision_arg(parser: argparse.ArgumentParser) -> None:
    """--precision for an export's runtime (--exported)."""
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "int8"),
        default="fp32",
        help="with --exported: bf16 runs SAM v1's programs on oneDNN's bf16 kernels (Paddle "
        "Inference), or the image encoder of a SAM v1 ONNX, SAM 2 or SAM 3 ONNX export in bf16 "
        "on OpenVINO; CPUs with avx512_bf16 or AMX only; int8 runs a SAM v1 ONNX export's int8 "
        "files, or a SAM 2 ONNX export's int8 image encoder or a SAM 3 one's int8 backbone "
        "(exported with --quantize int8); both "
        "approximate (default: %(default)s)",
    )


def check_precision(args: argparse.Namespace) -> None:
    """--precision bf16 / int8 is for an export's runtime (--exported), checked before any
    loading."""
    if getattr(args, "exported", None) is None:
        check_dynamic_precision(getattr(args, "precision", "fp32"))


def exported_predictor(
    export_dir: str | Path,
    confidence_threshold: float = 0.5,
    bpe: str | None = None,
    precision: str = "fp32",
) -> Any:
    """The runtime of an export folder (:func:`paddle_sam.loading.load_image_predictor`):
    SAM v1 on Paddle Inference or onnxruntime, SAM 3 a ``Sam3Predictor`` over the exported
    programs (text and boxes)."""
    from ..loading import load_image_predictor, resolve

    return load_image_predictor(
        resolve(exported=export_dir),
        confidence_threshold=confidence_threshold,
        bpe=bpe,
        precision=precision,
    )


def check_one_source(args: argparse.Namespace) -> None:
    """--checkpoint and --exported exclude each other."""
    if args.exported is not None and args.checkpoint is not None:
        raise ValueError("give either --checkpoint or --exported, not both")


# -- prompts -----------------------------------------------------------------------------


def parse_floats(text: str, n: tuple[int, ...], what: str) -> list[float]:
    """``"1,2.5,3"`` -> floats, ``len`` one of ``n``; ``what`` names the option in errors."""
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what} must be numbers separated by commas: {text!r}"
        ) from None
    if not all(math.isfinite(v) for v in vals):
        raise argparse.ArgumentTypeError(f"{what} must be finite numbers: {text!r}")
    if len(vals) not in n:
        raise argparse.ArgumentTypeError(
            f"{what} needs {' or '.join(map(str, n))} values: {text!r}"
        )
    return vals


def parse_point(text: str) -> list[float]:
    """--point X,Y[,LABEL] -> ``[x, y, label]`` (label 1 unless given)."""
    vals = parse_floats(text, (2, 3), "--point X,Y[,LABEL]")
    if len(vals) == 3 and vals[2] not in (0.0, 1.0):
        raise argparse.ArgumentTypeError(
            f"point label must be 1 (foreground) or 0 (background): {text!r}"
        )
    return vals if len(vals) == 3 else vals + [1.0]


def parse_box(text: str) -> list[float]:
    """--box X0,Y0,X1,Y1 -> ``[x0, y0, x1, y1]``."""
    vals = parse_floats(text, (4,), "--box X0,Y0,X1,Y1")
    if vals[2] < vals[0] or vals[3] < vals[1]:
        raise argparse.ArgumentTypeError(f"box needs x0 <= x1 and y0 <= y1: {text!r}")
    return vals


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _fmt(v: float) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def bounded(
    kind: type[int] | type[float],
    lo: float,
    hi: float,
    *,
    hi_open: bool = False,
    why: str = "",
) -> Callable[[str], int | float]:
    """An argparse type: a finite number of ``kind`` in ``[lo, hi]`` (``[lo, hi)`` with
    ``hi_open``); NaN, infinities and values outside are refused with the range, ``why``
    added in parentheses. argparse puts the option's name in front of the message."""
    what = "an integer" if kind is int else "a number"
    span = f"[{_fmt(lo)}, {_fmt(hi)}{')' if hi_open else ']'}"
    hint = f" ({why})" if why else ""

    def parse(text: str) -> int | float:
        value = _number(text, kind)
        inside = math.isfinite(value) and lo <= value and (value < hi if hi_open else value <= hi)
        if not inside:
            raise argparse.ArgumentTypeError(f"must be {what} in {span}{hint}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid <name> value" fallback
    return parse


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a finite number of ``kind`` above 0."""

    def parse(text: str) -> int | float:
        value = _number(text, kind)
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive and finite, got {text}")
        return value

    return parse


def check_bounded(option: str, value: int | float, lo: float, hi: float) -> None:
    """The ValueError of :func:`bounded` for a value parsed elsewhere (e.g. before the
    command is known); ``option`` names it."""
    if not (math.isfinite(value) and lo <= value <= hi):
        what = "an integer" if isinstance(value, int) else "a number"
        raise ValueError(f"{option} must be {what} in [{_fmt(lo)}, {_fmt(hi)}], got {value}")


#: --confidence-threshold of ``segment`` and ``serve``: SAM 3 keeps the instances scoring
#: above it, so it lies in [0, 1)
parse_confidence_threshold = bounded(
    float, 0.0, 1.0, hi_open=True, why="instances scoring above it are kept"
)

#: seeds of numpy's generators (non-negative, 32 bits is plenty)
parse_seed = bounded(int, 0, 2**32 - 1)


def parse_size(text: str, lo: int = 32, hi: int = 8192) -> list[int]:
    """``WxH`` -> ``[w, h]``, each side in ``[lo, hi]`` pixels."""
    parts = text.lower().split("x")
    try:
        w, h = (int(v) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected WIDTHxHEIGHT in pixels, e.g. 640x480, got {text!r}"
        ) from None
    if not (lo <= w <= hi and lo <= h <= hi):
        raise argparse.ArgumentTypeError(f"each side must lie in [{lo}, {hi}] pixels, got {text}")
    return [w, h]


def check_prompts(
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


# -- inputs ------------------------------------------------------------------------------


def read_image(path: str | os.PathLike, command: str) -> np.ndarray:
    """:func:`paddle_sam.predict.io.load_image`, its notes (16-bit scaled to 8 bits, alpha
    dropped) printed once each on stderr as ``paddle-sam COMMAND: warning: ...``."""
    from ..predict.io import load_image

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = load_image(path)
    seen: set[str] = set()
    for w in caught:
        text = str(w.message)
        if issubclass(w.category, UserWarning) and text not in seen:
            seen.add(text)
            print(f"paddle-sam {command}: warning: {text}", file=sys.stderr)
        elif not issubclass(w.category, UserWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return image


# -- outputs -----------------------------------------------------------------------------


NAME_MAX = 255  # bytes in one file name on Linux, macOS and Windows file systems


def check_out_folder(folder: str | os.PathLike, what: str = "output") -> None:
    """The folder ``folder`` can be made (if missing) and written to; nothing is created.

    Refused with one line each: the folder is a file, a path under a file, a folder (or the
    nearest existing one above a missing folder) this user cannot write to, a name too long.
    A probe file, anonymous where the system allows and removed at once, tests the folder.
    """
    folder = Path(folder)
    for part in folder.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ValueError(
                f"{what} {folder}: the name {part[:24]}... is longer than {NAME_MAX} bytes"
            )
    try:
        _check_out_folder(folder, what)
    except OSError as exc:
        if isinstance(exc, PermissionError | FileExistsError | NotADirectoryError):
            raise
        raise ValueError(f"{what} {folder}: {exc.strerror or exc}") from None


def _check_out_folder(folder: Path, what: str) -> None:
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{what} {folder} exists and is not a folder")
    existing = folder.absolute()
    created = False
    while not existing.is_dir():
        if existing.exists() or existing.is_symlink():  # a file (or a dangling link) above
            raise NotADirectoryError(
                f"{what} {folder}: {existing} is a file, not a folder; choose another path"
            )
        created = True
        if existing.parent == existing:
            break
        existing = existing.parent
    where = f" (the folder would be created in {existing})" if created else ""
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} {folder}: {existing} is not writable{where}")
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".paddle-sam-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PermissionError(
            f"{what} {folder}: cannot write in {existing} ({reason}){where}"
        ) from None


def check_out_file(path: str | os.PathLike, overwrite: bool, what: str = "output") -> None:
    """A file to write: its folder as :func:`check_out_folder`, and the file as
    :func:`check_targets` (a user's file never replaced, paddle-sam's only with
    ``overwrite``); the command claims it (:func:`paddle_sam.predict.outputs.claim`) before
    writing."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a folder, not a file")
    check_out_folder(path.parent, f"{what} {path}: folder")
    check_targets(path.parent, [path.name], replace=overwrite)


def prepare_out(out: Path, names: list[str], overwrite: bool) -> None:
    """A folder to write ``names`` into: one that cannot be made or written to is refused
    (:func:`check_out_folder`), and so is a name that would replace a user's file, or, without
    ``overwrite``, paddle-sam's (:func:`check_targets`). Nothing is written: the command
    claims the names (:func:`paddle_sam.predict.outputs.claim`) when it starts writing."""
    check_out_folder(out)
    check_targets(out, names, replace=overwrite)


def write_masks(out: Path, masks: Iterable[np.ndarray]) -> None:
    """One PNG per mask, ``out/masks/0000.png`` on; masks of an overwritten run are removed."""
    from ..predict.io import save_mask_png

    (out / "masks").mkdir(parents=True, exist_ok=True)
    for stale in (out / "masks").glob("[0-9][0-9][0-9][0-9].png"):
        stale.unlink()
    for i, mask in enumerate(masks):
        save_mask_png(mask, out / "masks" / f"{i:04d}.png")
