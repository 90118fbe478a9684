"""SAM 2 / 2.1 models with their weights (upstream: sam2/build_sam.py).

``build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", "sam2.1_hiera_tiny.pt")`` works as upstream,
with the official checkpoint (read without torch, converted on the fly) or a ``.pdparams``
written by ``paddle-sam convert``. The config names one of the released sizes
(:data:`~paddle_sam.models.sam2.build_sam.SAM2_SPECS`; its file name or the checkpoint's name
both do) or is a :class:`Sam2Spec`; nothing reads YAML and nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import paddle

from ..convert.checkpoint import checked_sidecar_spec, read_sam2_weights
from ..convert.core import (
    PADDLE_SUFFIX,
    CheckpointMismatchError,
    declared_parameters,
    load_state_strict,
    read_pdparams,
    read_sidecar,
    sidecar_family,
    sidecar_path,
)
from ..convert.sam2 import detect_model_type
from ..convert.torch_reader import load_tensor_shapes
from ..models.sam2.build_sam import SAM2_CONFIGS, SAM2_SPECS, Sam2Spec, build_sam2_model
from ..models.sam2.sam2_base import SAM2Base
from ..predict.sam2.predictor import SAM2ImagePredictor
from ..predict.sam2.video_predictor import SAM2VideoPredictor

# the bundled small SAM 2.1 (configs/sam2_tiny_clips.yaml, ``make train-sam2-default``): trained
# on generated clips of moving shapes only; 256 px input, clicks, boxes and masks
DEFAULT_SAM2_MODEL = Path(__file__).resolve().parents[1] / "assets" / "sam2_tiny_clips.pdparams"

#: the video predictor's settings with upstream's ``apply_postprocessing``
VIDEO_POSTPROCESSING = {"binarize_mask_from_pts_for_mem_enc": True, "fill_hole_area": 8}


def sam2_spec_of(config: str | os.PathLike | Sam2Spec) -> tuple[str, Sam2Spec]:
    """``(name, spec)`` of a config: a :class:`Sam2Spec` (named ``custom``), a registry name
    (``sam2.1_hiera_tiny``), or an upstream config path or file name
    (``configs/sam2.1/sam2.1_hiera_t.yaml``, ``sam2.1_hiera_t.yaml``)."""
    if isinstance(config, Sam2Spec):
        return "custom", config
    text = str(config)
    if text in SAM2_SPECS:
        return text, SAM2_SPECS[text]
    name = Path(text).name
    for key, path in SAM2_CONFIGS.items():
        if name == Path(path).name or name == key + ".pt":
            return key, SAM2_SPECS[key]
    known = ", ".join(sorted(SAM2_SPECS))
    raise ValueError(
        f"unknown SAM 2 config {text!r}: give a released size ({known}), its upstream config "
        "(configs/sam2.1/sam2.1_hiera_t.yaml ...) or a Sam2Spec"
    )


def build_sam2(
    config_file: str | os.PathLike | Sam2Spec,
    ckpt_path: str | os.PathLike | None = None,
    device: str | None = None,
    mode: str = "eval",
    hydra_overrides_extra: list[str] | tuple[str, ...] = (),
    apply_postprocessing: bool = True,
    model_cls: type[SAM2Base] = SAM2Base,
    **kwargs: Any,
) -> SAM2Base:
    """Build SAM 2 of ``config_file`` (see :func:`sam2_spec_of`), strictly loading
    ``ckpt_path`` (official ``.pt`` or converted ``.pdparams``; its sizes must be the
    config's) when given; random weights otherwise. Upstream's arguments: ``device``
    (``"cuda"`` means Paddle's ``"gpu"``) calls ``paddle.set_device`` when given; ``mode``
    ``"eval"`` or ``"train"``; ``apply_postprocessing`` as upstream (the decoder's dynamic
    multimask fallback); hydra overrides are not supported (pass a :class:`Sam2Spec`).
    ``model_cls`` (a :class:`SAM2Base` subclass) gets ``kwargs``; :class:`SAM2Base` takes
    none."""
    if model_cls is SAM2Base and kwargs:
        raise TypeError(f"build_sam2 got unexpected arguments: {sorted(kwargs)}")
    if hydra_overrides_extra:
        raise ValueError(
            "hydra overrides are not supported: pass a Sam2Spec for other sizes "
            f"(got {list(hydra_overrides_extra)})"
        )
    if mode not in ("eval", "train"):
        raise ValueError(f"mode must be 'eval' or 'train', got {mode!r}")
    if device is not None:
        device = str(device)  # upstream's notebooks pass torch.device("cpu")
        paddle.set_device("gpu" + device[4:] if device.startswith("cuda") else device)
    _, spec = sam2_spec_of(config_file)
    if ckpt_path is not None:
        ckpt_path = Path(ckpt_path)
        found = checkpoint_spec(ckpt_path, detect=False)
        if found is not None and found != spec:
            raise CheckpointMismatchError(
                f"{ckpt_path} holds a SAM 2 of other sizes than {config_file!s}: "
                f"{_spec_difference(spec, found)}"
            )
    with declared_parameters(ckpt_path is not None):
        model = build_sam2_model(
            spec, apply_postprocessing=apply_postprocessing, model_cls=model_cls, **kwargs
        )
    if ckpt_path is not None:
        load_sam2_weights(model, ckpt_path)
    if mode == "train":
        model.train()
    return model


def build_sam2_video_predictor(
    config_file: str | os.PathLike | Sam2Spec,
    ckpt_path: str | os.PathLike | None = None,
    device: str | None = None,
    mode: str = "eval",
    hydra_overrides_extra: list[str] | tuple[str, ...] = (),
    apply_postprocessing: bool = True,
    vos_optimized: bool = False,
    **kwargs: Any,
) -> SAM2VideoPredictor:
    """Upstream's ``build_sam2_video_predictor``: :func:`build_sam2`'s arguments, the model
    a :class:`SAM2VideoPredictor`. ``apply_postprocessing`` (default) also binarises the
    masks of clicked frames before their memory is encoded and fills holes of up to 8 pixels
    in the predictions, as upstream. ``vos_optimized`` (upstream: ``torch.compile``) changes
    nothing here; ``kwargs`` go to the predictor (``non_overlap_masks``, ``fill_hole_area``,
    ``clear_non_cond_mem_around_input``, ``add_all_frames_to_correct_as_cond``)."""
    del vos_optimized
    extra = dict(VIDEO_POSTPROCESSING) if apply_postprocessing else {}
    return build_sam2(
        config_file,
        ckpt_path,
        device=device,
        mode=mode,
        hydra_overrides_extra=hydra_overrides_extra,
        apply_postprocessing=apply_postprocessing,
        model_cls=SAM2VideoPredictor,
        **{**extra, **kwargs},
    )


def _spec_difference(want: Sam2Spec, found: Sam2Spec) -> str:
    a, b = want.to_dict(), found.to_dict()
    diffs = [f"{k} {a[k]} (config) vs {b[k]} (checkpoint)" for k in a if a[k] != b[k]]
    return "; ".join(diffs[:4])


def build_sam2_hf(model_id: str, **kwargs: Any) -> SAM2Base:
    raise ValueError(
        f"paddle-sam never downloads weights ({model_id!r}): pass a local checkpoint to "
        "build_sam2(config_file, ckpt_path)"
    )


def checkpoint_spec(checkpoint: str | os.PathLike, detect: bool = True) -> Sam2Spec | None:
    """The sizes of a SAM 2 checkpoint: a converted file's sidecar (checked against the
    weights' shapes before anything is built), or an official file's detected from its key
    names and shapes (read without the data). ``detect`` False: None for an official file
    of a size that is not a released one (a strict load then checks every key)."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    meta = read_sidecar(checkpoint)
    family = sidecar_family(meta)
    if family not in (None, "sam2"):
        raise ValueError(f"{checkpoint} is a {family} model, not SAM 2")
    if meta is not None and "spec" in meta:
        return checked_sidecar_spec(checkpoint, meta, Sam2Spec)
    if checkpoint.suffix == PADDLE_SUFFIX:
        raise ValueError(
            f"{checkpoint} has no sidecar {sidecar_path(checkpoint).name}: its sizes are "
            "unknown; convert the official file with 'paddle-sam convert'"
        )
    try:
        return SAM2_SPECS[detect_model_type(load_tensor_shapes(checkpoint))]
    except CheckpointMismatchError:
        if detect:
            raise
        return None


def load_sam2_weights(model: SAM2Base, path: str | os.PathLike) -> None:
    """Strictly load an official checkpoint or a converted ``.pdparams`` into ``model``."""
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError("model has no .spec; build it with build_sam2 or build_sam2_model")
    load_state_strict(model, read_sam2_weights(path, spec), where=f"{path}: ")


def _config(checkpoint: str | os.PathLike, model_type: str | None) -> str | Sam2Spec:
    """The config of a checkpoint: the released size ``model_type`` names (the checkpoint's
    sizes are checked against it when it is loaded), else the sizes it holds."""
    if model_type is not None:
        if model_type not in SAM2_SPECS:
            known = ", ".join(sorted(SAM2_SPECS))
            raise ValueError(f"--model-type {model_type} is not a SAM 2 size ({known})")
        return model_type
    spec = checkpoint_spec(checkpoint)
    assert spec is not None
    return spec


def load_sam2(
    checkpoint: str | os.PathLike,
    apply_postprocessing: bool = True,
    model_type: str | None = None,
) -> SAM2Base:
    """SAM 2 of the sizes ``checkpoint`` holds (:func:`checkpoint_spec`; or of the released
    size ``model_type``, which they must be), strictly loaded."""
    config = _config(checkpoint, model_type)
    return build_sam2(config, checkpoint, apply_postprocessing=apply_postprocessing)


def load_sam2_video_predictor(
    checkpoint: str | os.PathLike, model_type: str | None = None, **kwargs: Any
) -> SAM2VideoPredictor:
    """:func:`build_sam2_video_predictor` of the sizes ``checkpoint`` holds (or of the
    released size ``model_type``); ``kwargs`` go to it (upstream's defaults otherwise)."""
    return build_sam2_video_predictor(_config(checkpoint, model_type), checkpoint, **kwargs)


def load_sam2_export(
    export_dir: str | os.PathLike,
    video: bool = False,
    precision: str = "fp32",
    threads: int | None = None,
    **kwargs: Any,
) -> SAM2Base:
    """SAM 2 from a ``paddle-sam export`` folder: the image encoder on OpenVINO
    (:class:`~paddle_sam.deploy.sam2.OpenVinoImageEncoder`; ``precision`` fp32, bf16, or int8
    for the int8 weights of ``export --quantize int8``; ``threads``), every other weight
    strictly loaded from its ``model.pdparams``. ``video``: a :class:`SAM2VideoPredictor`
    with upstream's post-processing (``kwargs`` go to it), its memory attention on OpenVINO
    in fp32 where the export has it (:class:`~paddle_sam.deploy.sam2.OpenVinoMemoryAttention`),
    and its memory encoder likewise (:class:`~paddle_sam.deploy.sam2.OpenVinoMemoryEncoder`),
    else the image model."""
    from ..deploy.openvino import check_precision
    from ..deploy.sam2 import (
        OpenVinoImageEncoder,
        OpenVinoMemoryAttention,
        OpenVinoMemoryEncoder,
        read_sam2_manifest,
    )
    from ..export.onnx import ENCODER_INT8
    from ..export.sam2 import ENCODER, MEMORY_ATTENTION, MEMORY_ENCODER, WEIGHTS

    check_precision(precision)
    folder = Path(export_dir)
    manifest = read_sam2_manifest(folder)
    try:
        spec = Sam2Spec.from_dict(manifest["spec"])
        levels = manifest["levels"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{folder / 'export.json'}: no valid spec and levels ({exc})") from None
    program = ENCODER_INT8 if precision == "int8" else ENCODER
    if not manifest["programs"].get(program):
        raise ValueError(
            f"precision int8: {folder} has no int8 image encoder; export it with "
            "'paddle-sam export --quantize int8'"
        )
    model_cls = SAM2VideoPredictor if video else SAM2Base
    extra = {**VIDEO_POSTPROCESSING, **kwargs} if video else kwargs
    with declared_parameters(True):
        model = build_sam2_model(spec, model_cls=model_cls, **extra)
    model.image_encoder = OpenVinoImageEncoder(
        folder / manifest["programs"][program][0],
        model.image_encoder.neck.position_encoding,
        levels,
        precision=precision,
        threads=threads,
    )
    weights = folder / WEIGHTS
    load_state_strict(model, read_pdparams(weights), where=f"{weights}: ")
    programs = manifest["programs"]
    if video and programs.get(MEMORY_ATTENTION):  # exports before it: dynamic
        model.memory_attention = OpenVinoMemoryAttention(
            folder / programs[MEMORY_ATTENTION][0], threads=threads
        )
    if video and programs.get(MEMORY_ENCODER):  # exports before it: dynamic
        model.memory_encoder = OpenVinoMemoryEncoder(
            folder / programs[MEMORY_ENCODER][0],
            model.memory_encoder.position_encoding,
            threads=threads,
        )
    return model


def load_sam2_predictor(checkpoint: str | os.PathLike, **kwargs: Any) -> SAM2ImagePredictor:
    """:func:`load_sam2` wrapped in a :class:`SAM2ImagePredictor` (``kwargs`` go to it)."""
    return SAM2ImagePredictor(load_sam2(checkpoint), **kwargs)


__all__ = [
    "build_sam2",
    "build_sam2_hf",
    "build_sam2_video_predictor",
    "checkpoint_spec",
    "load_sam2",
    "load_sam2_export",
    "load_sam2_predictor",
    "load_sam2_video_predictor",
    "load_sam2_weights",
    "sam2_spec_of",
]
