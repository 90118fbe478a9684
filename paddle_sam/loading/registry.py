"""One place that turns a source into a model or a predictor.

A source (a checkpoint file, an HF folder, a ``paddle-sam export`` folder, or the bundled model
of a family) is sniffed once into a :class:`~paddle_sam.convert.source.Source`; then one
function each gives its model (:func:`load_model`), its image predictor
(:func:`load_image_predictor`) and its video predictor (:func:`load_video_predictor`), or a
:class:`SourceRefused` naming what the source lacks. The CLI, the service, the labeller and the
Label Studio backend all go through here; none of them inspects files or wraps models itself.

Families and export runtimes are entries of two small registries (:data:`FAMILIES`,
:data:`RUNTIMES`): a new family or runtime is one entry here, not edits in every command.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..convert.source import Source, sniff
from ..models.sam2.build_sam import SAM2_SPECS
from ..models.sam_v1.build_sam import SAM_SPECS
from .sam2 import DEFAULT_SAM2_MODEL
from .sam3 import DEFAULT_SAM3_MODEL
from .sam_v1 import DEFAULT_MODEL


class SourceRefused(ValueError):
    """A source that cannot do what was asked (a SAM v1 file for text prompts, a SAM 3 file
    converted without its tracker for video ...): the message names what it lacks."""


@dataclass(frozen=True)
class Family:
    """A model family: its names, its bundled model and how to load each of its parts.

    ``default``: the bundled demo model (None: the family has none, every command then needs
    ``--checkpoint``; ``default_name``, ``default_notice`` and ``recipe`` say where to get
    weights). ``load_model(source, options)`` returns the dynamic model;
    ``image_predictor(model, options)`` wraps one; ``video_predictor(source, options)``
    builds the video predictor (None: the family has no video). ``owns(obj)`` tells whether
    a model object is of this family, for :func:`as_image_predictor`."""

    name: str
    title: str
    model_types: tuple[str, ...]
    default: Path | None
    default_name: str
    default_notice: str
    recipe: str
    load_model: Callable[[Source, dict], Any]
    image_predictor: Callable[[Any, dict], Any]
    owns: Callable[[Any], bool]
    is_predictor: Callable[[Any], bool]
    video_predictor: Callable[[Source, dict], Any] | None = None


# -- SAM v1 ------------------------------------------------------------------------------


def _sam_v1_model(source: Source, options: dict) -> Any:
    from .sam_v1 import load_sam

    return load_sam(source.path, options.get("model_type"))


def _sam_v1_predictor(model: Any, options: dict) -> Any:
    from ..predict.sam_v1.predictor import SamPredictor

    return SamPredictor(model)


def _sam_v1_owns(obj: Any) -> bool:
    from ..models.sam_v1.sam import Sam

    return isinstance(obj, Sam)


def _sam_v1_is_predictor(obj: Any) -> bool:
    from ..predict.sam_v1.predictor import PredictorBase

    return isinstance(obj, PredictorBase)


# -- SAM 3 -------------------------------------------------------------------------------


def _sam3_model(source: Source, options: dict) -> Any:
    from .sam3 import load_sam3

    return load_sam3(
        source.path,
        bpe_path=options.get("bpe"),
        enable_inst_interactivity=options.get("clicks", False),
    )


def _sam3_predictor(model: Any, options: dict) -> Any:
    from ..predict.sam3.predictor import Sam3Predictor

    return Sam3Predictor(model, confidence_threshold=options.get("confidence_threshold", 0.5))


def _sam3_owns(obj: Any) -> bool:
    from ..models.sam3.sam3_image import Sam3Image

    return isinstance(obj, Sam3Image)


def _sam3_is_predictor(obj: Any) -> bool:
    from ..predict.sam3.predictor import Sam3Predictor

    return isinstance(obj, Sam3Predictor)


def _sam3_video(source: Source, options: dict) -> Any:
    from .sam3 import build_sam3_video_predictor, load_sam3_export, load_sam3_tracker

    tracker = options.get("kind", "dense") == "tracker"
    if source.exported:  # the vision backbone on OpenVINO (the only SAM 3 export with video)
        from ..predict.sam3.video_predictor import Sam3VideoPredictor

        precision = options.get("precision", "fp32")
        if tracker:
            return load_sam3_export(source.path, "tracker", precision)
        model = load_sam3_export(source.path, "video", precision, bpe_path=options.get("bpe"))
        return Sam3VideoPredictor(model)
    if tracker:
        return load_sam3_tracker(source.path)
    return build_sam3_video_predictor(checkpoint_path=source.path, bpe_path=options.get("bpe"))


# -- SAM 2 / 2.1 -------------------------------------------------------------------------


def _sam2_model(source: Source, options: dict) -> Any:
    from .sam2 import load_sam2

    return load_sam2(source.path, model_type=_sam2_model_type(options))


def _sam2_export(source: Source, options: dict, video: bool = False) -> Any:
    """The SAM 2 model of an export folder (image encoder on OpenVINO); ``--model-type``, when
    given, must be the size it was exported from."""
    from .sam2 import load_sam2_export

    model_type = _sam2_model_type(options)
    if model_type is not None and source.model_type not in (None, model_type):
        raise SourceRefused(
            f"--model-type {model_type}: {source.path} is an export of {source.model_type}"
        )
    return load_sam2_export(source.path, video=video, precision=options.get("precision", "fp32"))


def _sam2_model_type(options: dict) -> str | None:
    """``--model-type`` where it names a SAM 2 size (the checkpoint's sizes must match)."""
    model_type = options.get("model_type")
    return model_type if model_type in SAM2_SPECS else None


def _sam2_predictor(model: Any, options: dict) -> Any:
    from ..predict.sam2.predictor import Sam2Predictor

    return Sam2Predictor(model)


def _sam2_owns(obj: Any) -> bool:
    from ..models.sam2.sam2_base import SAM2Base
    from ..predict.sam2.predictor import SAM2ImagePredictor

    return isinstance(obj, SAM2Base | SAM2ImagePredictor)


def _sam2_is_predictor(obj: Any) -> bool:
    from ..predict.sam2.predictor import Sam2Predictor

    return isinstance(obj, Sam2Predictor)


def _sam2_video(source: Source, options: dict) -> Any:
    from ..predict.sam2.video_requests import Sam2VideoRequests
    from .sam2 import load_sam2_video_predictor

    if source.exported:
        tracker = _sam2_export(source, options, video=True)
    else:
        tracker = load_sam2_video_predictor(source.path, model_type=_sam2_model_type(options))
    return tracker if options.get("kind", "requests") == "tracker" else Sam2VideoRequests(tracker)


FAMILIES: dict[str, Family] = {
    "sam_v1": Family(
        name="sam_v1",
        title="SAM v1",
        model_types=tuple(sorted(SAM_SPECS)),
        default=DEFAULT_MODEL,
        default_name="synthetic model",
        recipe="make train-default",
        default_notice="a small SAM trained on generated shapes only (held-out generated "
        "scenes: mean IoU 0.61 from one click); real images need official weights: "
        "paddle-sam download vit_b",
        load_model=_sam_v1_model,
        image_predictor=_sam_v1_predictor,
        owns=_sam_v1_owns,
        is_predictor=_sam_v1_is_predictor,
    ),
    "sam3": Family(
        name="sam3",
        title="SAM 3",
        model_types=("sam3",),
        default=DEFAULT_SAM3_MODEL,
        default_name="SAM 3",
        recipe="make train-sam3-default",
        default_notice="a small SAM 3 trained on synthetic concept scenes only: it knows "
        "their 30 phrases, such as 'red star' or 'ring', and nothing else (held-out mask AP50 "
        "0.78 on scenes drawn as in its training, 0.67 in styles it never saw); real images "
        "need the official sam3.pt: paddle-sam download sam3",
        load_model=_sam3_model,
        image_predictor=_sam3_predictor,
        owns=_sam3_owns,
        is_predictor=_sam3_is_predictor,
        video_predictor=_sam3_video,
    ),
    "sam2": Family(
        name="sam2",
        title="SAM 2",
        model_types=tuple(sorted(SAM2_SPECS)),
        default=DEFAULT_SAM2_MODEL,
        default_name="SAM 2 video model",
        recipe="make train-sam2-default",
        default_notice="a small SAM 2.1 trained on generated clips of moving shapes only, and "
        "weak even there (held-out generated clips: mean IoU 0.33 from one click); real videos "
        "need official weights: paddle-sam download sam2.1_hiera_tiny",
        load_model=_sam2_model,
        image_predictor=_sam2_predictor,
        owns=_sam2_owns,
        is_predictor=_sam2_is_predictor,
        video_predictor=_sam2_video,
    ),
}


def family_of_model_type(model_type: str | None) -> str | None:
    """The family a ``--model-type`` names (``vit_b`` -> ``sam_v1``), or None."""
    if model_type is None:
        return None
    for fam in FAMILIES.values():
        if model_type in fam.model_types or model_type == fam.name:
            return fam.name
    return "sam_v1" if model_type == "default" else None


# -- export runtimes ---------------------------------------------------------------------


def _paddle_inference_sam_v1(source: Source, options: dict) -> Any:
    from ..deploy.sam_v1 import StaticSamPredictor

    return StaticSamPredictor(source.path, precision=options.get("precision", "fp32"))


def _onnxruntime_sam_v1(source: Source, options: dict) -> Any:
    """onnxruntime; ``precision`` bf16: the encoder on OpenVINO in bf16; int8: the encoder
    calibrated for OpenVINO where the export has it (``--quantize int8 --calibration``, the
    faster int8 path), else onnxruntime's int8 files (``--quantize int8``)."""
    from ..deploy.onnx import OnnxSamPredictor
    from ..export.onnx import ENCODER_INT8

    precision = options.get("precision", "fp32")
    if precision == "bf16":
        return OnnxSamPredictor(source.path, encoder_runtime="openvino", precision="bf16")
    if precision == "int8" and ENCODER_INT8 in (source.meta.get("programs") or {}):
        return OnnxSamPredictor(source.path, encoder_runtime="openvino", precision="int8")
    return OnnxSamPredictor(source.path, quantized=precision == "int8")


def _paddle_inference_sam3(source: Source, options: dict) -> Any:
    from ..deploy.sam3 import StaticSam3Processor
    from ..predict.sam3.predictor import Sam3Predictor

    processor = StaticSam3Processor(
        source.path,
        confidence_threshold=options.get("confidence_threshold", 0.5),
        bpe_path=options.get("bpe"),
    )
    return Sam3Predictor(processor=processor)


def _openvino_sam3(source: Source, options: dict) -> Any:
    from .sam3 import load_sam3_export

    model = load_sam3_export(
        source.path,
        "image",
        options.get("precision", "fp32"),
        bpe_path=options.get("bpe"),
        interactive=bool(options.get("clicks")) or None,
    )
    return _sam3_predictor(model, options)


def _openvino_sam2(source: Source, options: dict) -> Any:
    return _sam2_predictor(_sam2_export(source, options), options)


#: (family, runtime) -> the predictor over an export folder; ``precision`` beyond fp32 only
#: where listed in :data:`PRECISIONS`
RUNTIMES: dict[tuple[str, str], Callable[[Source, dict], Any]] = {
    ("sam_v1", "paddle-inference"): _paddle_inference_sam_v1,
    ("sam_v1", "onnxruntime"): _onnxruntime_sam_v1,
    ("sam3", "paddle-inference"): _paddle_inference_sam3,
    ("sam3", "openvino"): _openvino_sam3,
    ("sam2", "openvino"): _openvino_sam2,
}
PRECISIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("sam_v1", "paddle-inference"): ("fp32", "bf16"),
    # bf16: the encoder on OpenVINO; int8: the files of --quantize int8
    ("sam_v1", "onnxruntime"): ("fp32", "bf16", "int8"),
    ("sam3", "openvino"): ("fp32", "bf16", "int8"),  # int8: the file of --quantize int8
    ("sam2", "openvino"): ("fp32", "bf16", "int8"),  # int8: the file of --quantize int8
}


# -- the public functions ----------------------------------------------------------------


def resolve(
    checkpoint: str | os.PathLike | None = None,
    exported: str | os.PathLike | None = None,
    model_type: str | None = None,
    *,
    family: str | None = None,
) -> Source:
    """The source of a command's ``--checkpoint`` / ``--exported`` / ``--model-type``, sniffed:
    the export folder, else the checkpoint, else the bundled model of ``family`` (or of the
    model type's family; SAM v1 by default). Both paths at once are refused."""
    if checkpoint is not None and exported is not None:
        raise ValueError("give either --checkpoint or --exported, not both")
    family = family or family_of_model_type(model_type)
    if exported is not None:
        if not Path(exported).is_dir():
            raise FileNotFoundError(f"export folder not found: {exported}")
        return sniff(exported)
    if checkpoint is not None:
        return sniff(checkpoint, family)
    if model_type in SAM2_SPECS:  # a released size: its weights are needed
        raise ValueError(
            f"--model-type {model_type} needs its weights: pass --checkpoint FILE (paddle-sam "
            f"download {model_type} fetches and converts them); '--model-type sam2' without "
            f"--checkpoint is the bundled video model ({FAMILIES['sam2'].default_notice})"
        )
    return bundled(family or "sam_v1")


def bundled(family: str) -> Source:
    """The bundled demo model of ``family``; a clear error when this install has none."""
    fam = FAMILIES[family]
    if fam.default is None:
        raise ValueError(
            f"no --checkpoint given, and {fam.title} has no bundled model: pass --checkpoint "
            f"FILE (an official .pt, or a .pdparams converted from it; '{fam.recipe}' fetches "
            "and converts one)"
        )
    if not fam.default.is_file():
        raise ValueError(
            f"no --checkpoint given, and this install has no default {fam.title} "
            f"({fam.default.name}: {fam.recipe} trains it); pass --checkpoint FILE (official "
            "weights converted with 'paddle-sam convert')"
        )
    return sniff(fam.default, family)


def is_bundled(source: Source) -> bool:
    """True for a family's bundled demo model."""
    return any(fam.default is not None and source.path == fam.default for fam in FAMILIES.values())


def bundled_notice(source: Source) -> str | None:
    """What a command prints when it runs a bundled demo model, or None for any other."""
    for fam in FAMILIES.values():
        if fam.default is not None and source.path == fam.default:
            return (
                f"using the default {fam.default_name} ({fam.default.name}, {fam.default_notice})"
            )
    return None


# SAM's generator defaults (32 points a side, predicted IoU 0.88, stability 0.95) suit official
# weights; the bundled SAM v1's masks are softer and would all be filtered out: these keep them
BUNDLED_GENERATOR: dict[str, Any] = {
    "points_per_side": 16,
    "pred_iou_thresh": 0.5,
    "stability_score_thresh": 0.6,
}


def generator_defaults_for(source: Source | None) -> dict[str, Any]:
    """The automatic mask generator's defaults for ``source``: upstream's (SAM 2's for a SAM 2
    source), or :data:`BUNDLED_GENERATOR`'s values for the bundled SAM v1."""
    from ..predict.sam_v1.automatic_mask_generator import generator_defaults

    if source is not None and source.family == "sam2":
        from ..predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

        return generator_defaults(SAM2AutomaticMaskGenerator)
    defaults = generator_defaults()
    if source is not None and source.path == FAMILIES["sam_v1"].default:
        defaults.update(BUNDLED_GENERATOR)
    return defaults


def vocabulary(source: Source | None) -> list[str] | None:
    """The phrases a model was trained on, where its sidecar records them (the bundled SAM 3);
    None for a model that knows open vocabulary (the official weights)."""
    words = (source.meta or {}).get("vocabulary") if source is not None else None
    return list(words) if isinstance(words, list) else None


def outside_vocabulary(source: Source | None, phrases: Sequence[str]) -> str | None:
    """A note naming the phrases ``source`` was not trained on, with its vocabulary; None when
    every phrase is known or the model's vocabulary is open."""
    words = vocabulary(source)
    if not words:
        return None
    unknown = [p for p in phrases if p.strip().lower() not in words]
    if not unknown:
        return None
    return (
        f"{', '.join(repr(p) for p in unknown)} {'is' if len(unknown) == 1 else 'are'} not in "
        f"the vocabulary of {source.path.name} ({len(words)} phrases: {', '.join(words)}); "
        "it will most likely find nothing. Real images need the official sam3.pt "
        "(paddle-sam download sam3)"
    )


def require(source: Source, part: str, why: str) -> None:
    """Refuse (:class:`SourceRefused`) a source that lacks ``part``; ``why`` says what needs
    it (``"--point"``, ``"the video mode"`` ...)."""
    if source.lacks(part):
        raise SourceRefused(f"{why} needs {_NEEDS[part]}; {source.path} is {source.describe()}")


_NEEDS = {
    "image": "an image model",
    "clicks": "a model that takes clicks (SAM v1, SAM 2, or SAM 3 with its tracker's heads: "
    "the released sam3.pt or a .pdparams converted from it)",
    "text": "SAM 3 (--model-type sam3 and a SAM 3 checkpoint)",
    "video": "SAM 2, or SAM 3 with its video tracker (the released sam3.pt, or a .pdparams "
    "converted from it with the tracker)",
}


def _family(source: Source) -> Family:
    if source.family is None:
        raise SourceRefused(
            f"{source.path}: cannot tell which model family this is (no sidecar "
            f"{source.path.name}.json next to it, and no key names readable without loading "
            "it); pass --model-type"
        )
    return FAMILIES[source.family]


def load_model(source: Source, **options: Any) -> Any:
    """The dynamic model of ``source`` (a SAM v1 ``Sam``, a SAM 2 ``SAM2Base`` or a SAM 3
    ``Sam3Image``), weights loaded strictly. ``options``: ``model_type`` (SAM v1; SAM 2: a
    released size, which the checkpoint's must be), ``bpe`` and ``clicks`` (SAM 3: build the
    tracker's heads for clicks)."""
    if source.exported:
        raise SourceRefused(
            f"{source.path} is an export folder ({source.describe()}): it holds programs for a "
            "runtime, not a model; pass the checkpoint it was exported from"
        )
    return _family(source).load_model(source, options)


def load_image_predictor(source: Source, **options: Any) -> Any:
    """The image predictor of ``source``: ``SamPredictor`` / ``Sam2Predictor`` (around
    ``SAM2ImagePredictor``) / ``Sam3Predictor`` over the dynamic model, or the runtime of an
    export folder.

    ``options``: ``model_type``; ``clicks`` (True: refuse a source without them; False: build
    no interactive part; default: as the source allows); ``bpe`` and ``confidence_threshold``
    (SAM 3); ``precision`` (an export's runtime, where :data:`PRECISIONS` lists it)."""
    if options.get("clicks"):
        require(source, "clicks", options.get("clicks_for", "clicks"))
    check_precision(source, options.get("precision", "fp32"))
    if source.exported:
        fam = _family(source)
        return RUNTIMES[(fam.name, source.runtime)](source, options)
    fam = _family(source)
    clicks = options.get("clicks")
    if clicks is None:
        clicks = "clicks" in source.parts
    model = fam.load_model(source, {**options, "clicks": clicks})
    return fam.image_predictor(model, options)


def check_dynamic_precision(precision: str) -> None:
    """ValueError unless ``precision`` is fp32, the dynamic models' (bf16 and int8 run an
    export)."""
    if precision != "fp32":
        raise ValueError(
            f"--precision {precision} runs an export (--exported DIR from "
            "'paddle-sam export'); the dynamic model computes in fp32"
        )


def check_precision(source: Source, precision: str) -> None:
    """ValueError unless ``source`` runs in ``precision``: the dynamic models in fp32, an
    export in what :data:`PRECISIONS` lists for its family and runtime."""
    if not source.exported:
        check_dynamic_precision(precision)
        return
    allowed = PRECISIONS.get((_family(source).name, source.runtime), ("fp32",))
    if precision not in allowed:
        raise ValueError(
            f"--precision {precision}: {source.path} is {source.describe()}, which runs in "
            f"{', '.join(allowed)} (bf16: SAM v1, SAM 2 and SAM 3 ONNX exports; int8: ONNX "
            "exports made with --quantize int8)"
        )


def video_refusal(source: Source) -> str | None:
    """Why ``source`` has no video mode, or None when it has one."""
    if source.family is not None and FAMILIES[source.family].video_predictor is None:
        return (
            f"{source.path} is {source.describe()}: video needs SAM 2, or SAM 3 with its "
            "video tracker"
        )
    if source.exported and source.runtime != "openvino":
        return (
            f"{source.path} is an export folder of {source.describe()}: video runs on "
            "checkpoints and on the OpenVINO exports ('paddle-sam export --format onnx' of "
            "SAM 3 with its tracker, 'paddle-sam export' of SAM 2)"
        )
    if source.layout == "hf":
        return (
            f"the SAM 3 checkpoint {source.path.name} is in the HF transformers layout, which "
            "has no tracker weights: video needs the released sam3.pt (or a .pdparams "
            "converted from it)"
        )
    if source.lacks("video"):
        return (
            f"the SAM 3 checkpoint {source.path.name} has no tracker weights (converted "
            "without the tracker, or trained as an image model): video needs the full "
            "released sam3.pt converted"
        )
    return None


def video_predictor_or_refusal(source: Source, **options: Any) -> tuple[Any, str | None]:
    """``(video predictor, None)``, or ``(None, why not)`` for a source without the video
    tracker, including one whose tracker part holds only the heads that clicks on images need
    (no memory encoder or memory attention) or sizes the tracker is not built for: such a
    source still serves images."""
    from ..convert.core import CheckpointMismatchError

    why = video_refusal(source)
    if why is not None:
        return None, why
    try:
        return load_video_predictor(source, **options), None
    except CheckpointMismatchError as exc:
        if source.family != "sam3":  # one model for images and video: nothing to serve
            raise
        return None, f"its tracker weights do not make SAM 3's video tracker ({exc})"
    except ValueError as exc:
        if "d_model" not in str(exc):
            raise
        return None, str(exc)


def load_video_predictor(source: Source, **options: Any) -> Any:
    """The video predictor of ``source``, by ``kind``:

    - SAM 3: its dense video predictor (upstream's request API; ``kind="dense"``, the
      default) or its tracker alone (``kind="tracker"``: clicks, boxes and masks through
      upstream's SAM 2 style API); ``bpe``: the tokenizer's vocabulary;
    - SAM 2: upstream's ``SAM2VideoPredictor`` (``kind="tracker"``), or the same behind SAM
      3's request API (any other kind: ``Sam2VideoRequests``, what the service drives);
      ``model_type``: a released size the checkpoint's must be.

    Refused (:class:`SourceRefused`) with :func:`video_refusal`'s reason."""
    why = video_refusal(source)
    if why is not None:
        raise SourceRefused(why)
    check_precision(source, options.get("precision", "fp32"))
    fam = _family(source)
    assert fam.video_predictor is not None
    return fam.video_predictor(source, options)


# -- model objects given directly (library users, tests) ---------------------------------


def as_image_predictor(model_or_predictor: Any, caller: str = "this") -> Any:
    """A model wrapped in its family's image predictor, a predictor as it is; TypeError naming
    ``caller`` for anything else."""
    for fam in FAMILIES.values():
        if fam.is_predictor(model_or_predictor):
            return model_or_predictor
        if fam.owns(model_or_predictor):
            return fam.image_predictor(model_or_predictor, {})
    raise TypeError(
        f"{caller} needs a SAM model or a predictor, got {type(model_or_predictor).__name__}"
    )


def is_video_model(x: Any) -> bool:
    """True for SAM 3's video model or a video predictor around it, and for SAM 2's video
    predictor (upstream's, or behind the request API)."""
    from ..models.sam3.sam3_video_inference import Sam3VideoInferenceWithInstanceInteractivity

    return _is_sam2_video(x) or (
        isinstance(x, Sam3VideoInferenceWithInstanceInteractivity)
        or (
            hasattr(x, "handle_stream_request")
            and isinstance(getattr(x, "model", None), Sam3VideoInferenceWithInstanceInteractivity)
        )
    )


def _is_sam2_video(x: Any) -> bool:
    from ..predict.sam2.video_predictor import SAM2VideoPredictor
    from ..predict.sam2.video_requests import Sam2VideoRequests

    return isinstance(x, SAM2VideoPredictor | Sam2VideoRequests)


def as_video_predictor(video: Any) -> Any:
    """A predictor with the request API (``handle_request`` and ``handle_stream_request``:
    ``Sam3VideoPredictor``, ``Sam2VideoRequests``) as it is; SAM 3's video model or SAM 2's
    ``SAM2VideoPredictor`` wrapped in one; None stays None."""
    if video is None or hasattr(video, "handle_stream_request"):
        return video
    from ..predict.sam2.video_predictor import SAM2VideoPredictor

    if isinstance(video, SAM2VideoPredictor):
        from ..predict.sam2.video_requests import Sam2VideoRequests

        return Sam2VideoRequests(video)
    from ..predict.sam3.video_predictor import Sam3VideoPredictor

    return Sam3VideoPredictor(video)


def image_predictor_of_video(video: Any, confidence_threshold: float = 0.5) -> Any:
    """The image predictor inside a video model (or predictor), able to answer clicks; the
    weights are not copied: one copy serves both pages.

    SAM 2: its model (a ``SAM2Base``) in a ``Sam2Predictor``. SAM 3: its detector, given the
    tracker as ``predict_inst``'s interactive predictor (upstream's image model holds the
    same: a ``SAM3InteractiveImagePredictor`` around a tracker with the same ``tracker.*``
    weights); the video code never reads it."""
    if _is_sam2_video(video):
        from ..predict.sam2.predictor import Sam2Predictor

        return Sam2Predictor(getattr(video, "model", video))
    from ..models.sam3.interactive import SAM3InteractiveImagePredictor
    from ..predict.sam3.predictor import Sam3Predictor

    model = getattr(video, "model", video) if hasattr(video, "handle_request") else video
    detector = model.detector
    if detector.inst_interactive_predictor is None:
        detector.inst_interactive_predictor = SAM3InteractiveImagePredictor(model.tracker)
    return Sam3Predictor(detector, confidence_threshold=confidence_threshold)


__all__ = [
    "FAMILIES",
    "PRECISIONS",
    "RUNTIMES",
    "Family",
    "Source",
    "SourceRefused",
    "as_image_predictor",
    "as_video_predictor",
    "bundled",
    "bundled_notice",
    "family_of_model_type",
    "image_predictor_of_video",
    "is_bundled",
    "is_video_model",
    "load_image_predictor",
    "load_model",
    "load_video_predictor",
    "require",
    "resolve",
    "sniff",
    "video_predictor_or_refusal",
    "video_refusal",
]
