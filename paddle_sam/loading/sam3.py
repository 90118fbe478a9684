"""The SAM 3 image model with its weights (upstream: sam3/model_builder.py).

Our builder never downloads anything: pass ``checkpoint_path`` (an official ``sam3.pt``, an
HF transformers checkpoint, or a converted ``.pdparams``), or get random weights.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import paddle

from ..convert import sam3_hf
from ..convert.checkpoint import (
    checked_sidecar_spec,
    read_sam3_tracker_weights,
    read_sam3_weights,
)
from ..convert.core import declared_parameters, load_state_strict, read_sidecar, sidecar_family
from ..convert.source import sniff
from ..models.sam3.build_sam3 import (
    SAM3_SPEC,
    Sam3Spec,
    build_sam3_model,
    build_tracker_model,
    build_video_model,
)
from ..models.sam3.sam3_image import Sam3Image
from ..predict.sam3.predictor import Sam3Predictor
from ..predict.sam3.tokenizer import SimpleTokenizer
from ..predict.sam3.tracker import Sam3TrackerVideoPredictor
from ..predict.sam3.video_predictor import Sam3VideoModel, Sam3VideoPredictor

# the bundled small SAM 3 (configs/sam3_tiny_concepts*.yaml, ``make train-sam3-default``):
# trained on synthetic concept scenes only, it knows their 30 phrases ("red star", "ring", ...)
# and nothing else; 384 px input, no tracker (text and box prompts, no clicks)
DEFAULT_SAM3_MODEL = Path(__file__).resolve().parents[1] / "assets" / "sam3_tiny_concepts.pdparams"


def _no_download(load_from_hf: bool, checkpoint_path: object) -> None:
    if load_from_hf and checkpoint_path is None:
        raise ValueError(
            "paddle-sam never downloads weights: pass checkpoint_path (official sam3.pt or a "
            "converted .pdparams)"
        )


def build_sam3_image_model(
    bpe_path: str | os.PathLike | None = None,
    device: str | None = None,
    eval_mode: bool = True,
    checkpoint_path: str | os.PathLike | None = None,
    load_from_HF: bool = False,  # noqa: N803 - upstream name
    enable_segmentation: bool = True,
    enable_inst_interactivity: bool = False,
    compile: bool = False,
    spec: Sam3Spec = SAM3_SPEC,
) -> Sam3Image:
    """Build the SAM 3 image model; same arguments as upstream's ``build_sam3_image_model``.

    ``checkpoint_path``: the official ``sam3.pt`` (read without torch, converted on the fly) or
    a ``.pdparams`` written by ``paddle-sam convert``; loading is strict. Without it the weights
    are random. ``bpe_path``: the tokenizer's vocabulary (default: the copy shipped with
    paddle-sam). ``device`` (e.g. ``"cpu"``, ``"gpu:0"``) calls ``paddle.set_device`` when
    given. ``load_from_HF`` must stay False: nothing is ever downloaded. ``compile`` is ignored
    (use ``paddle-sam export`` for static graphs).
    """
    _no_download(load_from_HF, checkpoint_path)
    if device is not None:
        paddle.set_device(device)
    with declared_parameters(checkpoint_path is not None):
        model = build_sam3_model(
            spec,
            tokenizer=SimpleTokenizer(bpe_path=bpe_path),
            enable_segmentation=enable_segmentation,
            enable_inst_interactivity=enable_inst_interactivity,
        )
    if checkpoint_path is not None:
        load_sam3_weights(model, checkpoint_path)
    else:
        warnings.warn(
            "build_sam3_image_model: no checkpoint_path, the weights are random", stacklevel=2
        )
    if not eval_mode:
        model.train()
    return model


def load_sam3_weights(model: Sam3Image, path: str | os.PathLike) -> None:
    """Strictly load an official checkpoint or a converted ``.pdparams`` into ``model``."""
    load_state_strict(model, read_sam3_weights(path, model=model))


def build_tracker(
    apply_temporal_disambiguation: bool = False,
    with_backbone: bool = False,
    compile_mode: object = None,
    spec: Sam3Spec = SAM3_SPEC,
) -> Sam3TrackerVideoPredictor:
    """SAM 3's video tracker with random weights and the released settings; upstream's
    ``build_tracker`` arguments (``compile_mode`` is ignored). ``with_backbone`` adds the
    vision backbone (with its SAM 2 neck, no text encoder) that ``init_state(video_path=...)``
    runs on each frame."""
    del compile_mode
    return build_tracker_model(
        spec,
        apply_temporal_disambiguation=apply_temporal_disambiguation,
        with_backbone=with_backbone,
        tracker_cls=Sam3TrackerVideoPredictor,
    )


def sam3_spec(checkpoint: str | os.PathLike, enable_inst_interactivity: bool = True) -> Sam3Spec:
    """The sizes of a SAM 3 checkpoint: its sidecar's (checked against the weights' shapes),
    else the released ones; a SAM v1 file is refused."""
    checkpoint = Path(checkpoint)
    meta = (read_sidecar(checkpoint) if checkpoint.is_file() else None) or {}
    if sidecar_family(meta) == "sam_v1":
        raise ValueError(f"{checkpoint} is a SAM v1 model ({meta.get('model_type')}), not SAM 3")
    if "spec" not in meta:
        return SAM3_SPEC
    return checked_sidecar_spec(
        checkpoint, meta, Sam3Spec, enable_inst_interactivity=enable_inst_interactivity
    )


def _existing(checkpoint: str | os.PathLike) -> Path:
    checkpoint = Path(checkpoint)
    if not (checkpoint.is_file() or sam3_hf.is_hf_source(checkpoint) and checkpoint.exists()):
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    return checkpoint


def load_sam3_tracker(
    checkpoint: str | os.PathLike, apply_temporal_disambiguation: bool = False
) -> Sam3TrackerVideoPredictor:
    """SAM 3's video tracker with its vision backbone, strictly loaded from the released
    ``sam3.pt`` or a ``.pdparams`` converted from it (sizes from the sidecar): the
    ``tracker.*`` weights and the detector's vision backbone, nothing of the text encoder or
    the detector heads."""
    checkpoint = _existing(checkpoint)
    spec = sam3_spec(checkpoint)
    with declared_parameters(True):
        tracker = build_tracker_model(
            spec,
            apply_temporal_disambiguation=apply_temporal_disambiguation,
            with_backbone=True,
            tracker_cls=Sam3TrackerVideoPredictor,
        )
    load_state_strict(tracker, read_sam3_tracker_weights(checkpoint, tracker))
    return tracker


def build_sam3_video_model(
    checkpoint_path: str | os.PathLike | None = None,
    load_from_HF: bool = False,  # noqa: N803 - upstream name
    bpe_path: str | os.PathLike | None = None,
    has_presence_token: bool = True,
    geo_encoder_use_img_cross_attn: bool = True,
    strict_state_dict_loading: bool = True,
    apply_temporal_disambiguation: bool = True,
    device: str | None = None,
    compile: bool = False,
    spec: Sam3Spec | None = None,
) -> Sam3VideoModel:
    """SAM 3's dense video model (upstream ``build_sam3_video_model``, same arguments): the
    detector (image model with its SAM 2 neck) and the tracker (``.detector``, ``.tracker``,
    as sam3's notebooks use them) with the released video settings, in eval mode.

    ``checkpoint_path``: the released ``sam3.pt`` or a converted ``.pdparams`` (strict load of
    both parts; sizes from the sidecar); without it the weights are random. Nothing is ever
    downloaded; ``compile`` is ignored; only the released architecture is built
    (``has_presence_token`` and ``geo_encoder_use_img_cross_attn`` True, strict loading)."""
    del compile
    _no_download(load_from_HF, checkpoint_path)
    if not has_presence_token or not geo_encoder_use_img_cross_attn:
        raise ValueError(
            "only the released architecture is built (has_presence_token=True, "
            "geo_encoder_use_img_cross_attn=True)"
        )
    if not strict_state_dict_loading:
        raise ValueError("weights are always loaded strictly (strict_state_dict_loading=True)")
    if device is not None:
        paddle.set_device(device)
    if spec is None:
        spec = SAM3_SPEC if checkpoint_path is None else sam3_spec(_existing(checkpoint_path))
    with declared_parameters(checkpoint_path is not None):
        detector = build_sam3_model(
            spec, tokenizer=SimpleTokenizer(bpe_path=bpe_path), enable_inst_interactivity=True
        )
        tracker = build_tracker_model(
            spec,
            apply_temporal_disambiguation=apply_temporal_disambiguation,
            tracker_cls=Sam3TrackerVideoPredictor,
        )
    if checkpoint_path is None:
        warnings.warn(
            "build_sam3_video_model: no checkpoint_path, the weights are random", stacklevel=2
        )
    else:
        checkpoint_path = _existing(checkpoint_path)
        load_sam3_weights(detector, checkpoint_path)
        load_state_strict(tracker, read_sam3_tracker_weights(checkpoint_path, tracker))
    return build_video_model(
        detector,
        tracker,
        apply_temporal_disambiguation=apply_temporal_disambiguation,
        model_cls=Sam3VideoModel,
    )


def build_sam3_video_predictor(
    *model_args: object, gpus_to_use: object = None, **model_kwargs: object
) -> Sam3VideoPredictor:
    """Upstream ``build_sam3_video_predictor``: the request-API predictor around
    :func:`build_sam3_video_model` (``checkpoint_path=...`` and its other arguments).
    ``async_loading_frames`` and ``video_loader_type`` go to the predictor. One process:
    ``gpus_to_use`` is accepted and unused (set the device with ``device=``)."""
    del gpus_to_use
    predictor_kwargs = {
        key: model_kwargs.pop(key)
        for key in ("async_loading_frames", "video_loader_type")
        if key in model_kwargs
    }
    model = build_sam3_video_model(*model_args, **model_kwargs)
    return Sam3VideoPredictor(model, **predictor_kwargs)


def load_sam3(
    checkpoint: str | os.PathLike,
    bpe_path: str | os.PathLike | None = None,
    enable_inst_interactivity: bool = False,
) -> Sam3Image:
    """Build and strictly load a SAM 3 image model from a converted ``.pdparams`` or an official
    checkpoint (released ``sam3.pt``, or HF: ``.safetensors``, sharded index, folder), its
    sizes from the sidecar if present (the released sizes otherwise). A sidecar is checked
    against the weights (their shapes, read without the data) before the model is built: a
    wrong or lying one is a one-line :class:`CheckpointFormatError`."""
    checkpoint = _existing(checkpoint)
    spec = sam3_spec(checkpoint, enable_inst_interactivity)
    return build_sam3_image_model(
        bpe_path=bpe_path,
        checkpoint_path=checkpoint,
        enable_inst_interactivity=enable_inst_interactivity,
        spec=spec,
    )


#: what :func:`load_sam3_export` builds
EXPORT_KINDS = ("image", "video", "tracker")


def load_sam3_export(
    export_dir: str | os.PathLike,
    kind: str = "image",
    precision: str = "fp32",
    threads: int | None = None,
    bpe_path: str | os.PathLike | None = None,
    interactive: bool | None = None,
    apply_temporal_disambiguation: bool = True,
):
    """SAM 3 from a ``paddle-sam export --format onnx`` folder: the vision backbone on OpenVINO
    (:class:`~paddle_sam.deploy.sam3.OpenVinoVisionBackbone`; ``precision`` fp32, bf16, or
    int8 for the int8 weights of ``export --quantize int8``, which also runs the text encoder
    on OpenVINO with int8 weights where the export has them; ``threads``), every other weight
    strictly loaded from its ``model.pdparams``.

    ``kind``: ``image`` (:class:`Sam3Image`; ``interactive``: with the click predictor,
    by default when the export has it), ``video`` (the dense video model, as
    :func:`build_sam3_video_model` builds it: wrap it in :class:`Sam3VideoPredictor`) or
    ``tracker`` (:class:`Sam3TrackerVideoPredictor` with its backbone, as
    :func:`load_sam3_tracker`)."""
    from ..convert import sam3 as convert_sam3
    from ..convert.core import CheckpointMismatchError, check_keys, model_shapes, read_pdparams
    from ..deploy.sam3 import (
        OpenVinoTextEncoder,
        OpenVinoVisionBackbone,
        read_sam3_onnx_manifest,
    )
    from ..export.sam3 import TEXT_INT8, TEXT_PREFIX, VISION, VISION_INT8, WEIGHTS

    if kind not in EXPORT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(EXPORT_KINDS)}, got {kind!r}")
    folder = Path(export_dir)
    manifest = read_sam3_onnx_manifest(folder)
    try:
        spec = Sam3Spec.from_dict(manifest["spec"])
        levels = {
            "sam3": list(manifest["levels"]["sam3"]),
            "sam2": list(manifest["levels"]["sam2"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{folder / 'export.json'}: no valid spec and levels ({exc})") from None
    weights = folder / WEIGHTS
    state = read_pdparams(weights)
    has_clicks = bool(levels["sam2"]) and any(
        k.startswith(convert_sam3.INTERACTIVE_PREFIX) for k in state
    )
    has_video = has_clicks and any(k.startswith(tuple(convert_sam3.VIDEO_ONLY)) for k in state)
    if interactive is None:
        interactive = has_clicks
    if (kind == "image" and interactive and not has_clicks) or (kind != "image" and not has_video):
        what = "clicks" if kind == "image" else "video"
        raise ValueError(
            f"{folder} was exported from a SAM 3 without its tracker's weights: no {what}; "
            "export a checkpoint that has them (the released sam3.pt, converted with its tracker)"
        )

    program = VISION
    # int8: the text encoder's int8 file too where the export has one (older exports: fp32)
    text_int8 = None
    if precision == "int8":
        program = VISION_INT8
        if not manifest["programs"].get(VISION_INT8):
            raise ValueError(
                f"precision int8: {folder} has no int8 backbone; export it with "
                "'paddle-sam export --format onnx --quantize int8'"
            )
        if kind != "tracker" and manifest["programs"].get(TEXT_INT8):
            text_int8 = folder / manifest["programs"][TEXT_INT8][0]
            for key in [k for k in state if k.startswith(TEXT_PREFIX)]:
                del state[key]  # the fp32 text weights the int8 file replaces

    def on_openvino(vision_backbone):
        return OpenVinoVisionBackbone(
            folder / manifest["programs"][program][0],
            vision_backbone.position_encoding,
            levels,
            precision=precision,
            threads=threads,
        )

    where = f"{weights}: "
    with declared_parameters(True):
        if kind == "tracker":
            tracker = build_tracker_model(
                spec,
                apply_temporal_disambiguation=apply_temporal_disambiguation,
                with_backbone=True,
                tracker_cls=Sam3TrackerVideoPredictor,
            )
            tracker.backbone.vision_backbone = on_openvino(tracker.backbone.vision_backbone)
        else:
            detector = build_sam3_model(
                spec,
                tokenizer=SimpleTokenizer(bpe_path=bpe_path),
                enable_inst_interactivity=interactive or kind == "video",
            )
            backbone = detector.backbone
            backbone.vision_backbone = on_openvino(backbone.vision_backbone)
            if text_int8 is not None:
                backbone.language_backbone = OpenVinoTextEncoder(
                    text_int8,
                    backbone.language_backbone.tokenizer,
                    context_length=spec.context_length,
                    d_model=spec.d_model,
                    width=spec.text_width,
                    threads=threads,
                )
            if kind == "video":
                tracker = build_tracker_model(
                    spec,
                    apply_temporal_disambiguation=apply_temporal_disambiguation,
                    tracker_cls=Sam3TrackerVideoPredictor,
                )
    if kind != "tracker":
        selected = convert_sam3.select_for_model(state, model_shapes(detector), where=where)
        if kind == "image":  # nothing else reads them: each array is freed once copied in
            state.clear()
        load_state_strict(detector, selected)
        if kind == "image":
            return detector
    try:
        tracker_state = convert_sam3.tracker_state(state)
    except CheckpointMismatchError as exc:
        raise CheckpointMismatchError(f"{where}{exc}") from None
    check_keys(model_shapes(tracker), tracker_state, where=where)
    load_state_strict(tracker, tracker_state, where=where)
    if kind == "tracker":
        return tracker
    return build_video_model(
        detector,
        tracker,
        apply_temporal_disambiguation=apply_temporal_disambiguation,
        model_cls=Sam3VideoModel,
    )


def load_sam3_predictor(
    checkpoint: str | os.PathLike,
    bpe_path: str | os.PathLike | None = None,
    confidence_threshold: float = 0.5,
    interactive: bool | None = None,
) -> Sam3Predictor:
    """The SAM 3 image model from ``sam3.pt`` or a converted ``.pdparams`` (sizes from its
    sidecar) as a ``Sam3Predictor``. ``interactive``: build the interactive predictor for
    clicks; by default unless the file was converted without the tracker's weights."""
    if interactive is None:
        interactive = "clicks" in sniff(checkpoint, "sam3").parts
    model = load_sam3(checkpoint, bpe_path=bpe_path, enable_inst_interactivity=interactive)
    return Sam3Predictor(model, confidence_threshold=confidence_threshold)


__all__ = [
    "DEFAULT_SAM3_MODEL",
    "build_sam3_image_model",
    "build_sam3_video_model",
    "build_sam3_video_predictor",
    "build_tracker",
    "load_sam3",
    "load_sam3_predictor",
    "load_sam3_tracker",
    "load_sam3_weights",
    "sam3_spec",
]
