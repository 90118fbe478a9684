"""SAM v1 models with their weights (upstream: build_sam.py).

``sam_model_registry["vit_b"](checkpoint=...)`` works as upstream, with a converted
``.pdparams`` file (see ``paddle-sam convert``) or an official one. Smaller custom sizes are
declared with :class:`SamSpec` and built with :func:`build_sam`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..convert.checkpoint import checked_sidecar_spec, read_sam_v1_weights, resolve_spec
from ..convert.core import (
    PADDLE_SUFFIX,
    declared_parameters,
    load_state_strict,
    read_sidecar,
    sidecar_family,
    sidecar_path,
)
from ..models.sam_v1.build_sam import SAM_SPECS, SamSpec, build_sam_model
from ..models.sam_v1.sam import Sam

# the bundled default model: a small SAM trained on generated shapes only
# (configs/sam_tiny_synthetic.yaml); 256 px input
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "assets" / "sam_tiny_synthetic.pdparams"


def build_sam(spec: SamSpec, checkpoint: str | os.PathLike | None = None) -> Sam:
    """Build a SAM model of ``spec``; load a converted checkpoint strictly if given."""
    with declared_parameters(checkpoint is not None):
        sam = build_sam_model(spec)
    if checkpoint is not None:
        load_sam_weights(sam, checkpoint)
    return sam


def load_sam_weights(model: Sam, path: str | os.PathLike) -> None:
    """Load weights into ``model`` strictly: every key present, nothing extra, shapes equal."""
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError("model has no .spec; build it with paddle_sam.build_sam(spec)")
    load_state_strict(model, read_sam_v1_weights(path, spec), where=f"{path}: ")


def load_sam(checkpoint: str | os.PathLike, model_type: str | None = None) -> Sam:
    """Build and load a model from a checkpoint, taking its size from the sidecar if present.

    Without a sidecar the size is ``model_type`` or, for official files, detected. A sidecar is
    checked against the weights (their shapes, read without the data) before the model is
    built: a wrong or lying one is a one-line :class:`CheckpointFormatError`.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    meta = read_sidecar(checkpoint)
    if model_type == "sam3" or sidecar_family(meta) == "sam3":
        raise ValueError(
            f"{checkpoint} is a SAM 3 model: load it with "
            "build_sam3_image_model(checkpoint_path=...)"
        )
    if meta is not None and "spec" in meta:
        if model_type not in (None, meta.get("model_type")):
            raise ValueError(
                f"--model-type {model_type} does not match {checkpoint}, converted as "
                f"{meta.get('model_type')}"
            )
        spec = checked_sidecar_spec(checkpoint, meta, SamSpec)
    elif checkpoint.suffix != PADDLE_SUFFIX:
        # an official file: read it once, both to check or detect its size and to load it
        from ..convert.sam_v1 import convert_state_dict
        from ..convert.torch_reader import load_state_dict

        state = load_state_dict(checkpoint)
        _, spec = resolve_spec(model_type, state)
        with declared_parameters(True):
            sam = build_sam_model(spec)
        load_state_strict(sam, convert_state_dict(state, spec), where=f"{checkpoint}: ")
        return sam
    elif model_type is not None:
        _, spec = resolve_spec(model_type)
    else:
        raise ValueError(
            f"{checkpoint} has no sidecar {sidecar_path(checkpoint).name}; pass the model type"
        )
    return build_sam(spec, checkpoint)


def _builder(name: str):
    def build(checkpoint: str | os.PathLike | None = None) -> Sam:
        return build_sam(SAM_SPECS[name], checkpoint)

    build.__name__ = f"build_sam_{name}"
    build.__doc__ = f"Build SAM {name}; ``checkpoint`` is a converted .pdparams file."
    return build


build_sam_vit_h = _builder("vit_h")
build_sam_vit_l = _builder("vit_l")
build_sam_vit_b = _builder("vit_b")

sam_model_registry = {
    "default": build_sam_vit_h,
    "vit_h": build_sam_vit_h,
    "vit_l": build_sam_vit_l,
    "vit_b": build_sam_vit_b,
}

__all__ = [
    "DEFAULT_MODEL",
    "build_sam",
    "build_sam_vit_b",
    "build_sam_vit_h",
    "build_sam_vit_l",
    "load_sam",
    "load_sam_weights",
    "sam_model_registry",
]
