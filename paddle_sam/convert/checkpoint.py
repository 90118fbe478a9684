"""Convert official SAM v1 and SAM 3 checkpoints to ``.pdparams``, and read the weights of a
checkpoint of either kind for a model (the builders in :mod:`paddle_sam.build` load them).

``convert_checkpoint`` reads ``.pth`` / ``.pt`` (zip or legacy) and ``.safetensors`` files
without torch and without running pickled code, maps every key, transposes Linear weights,
upcasts to float32 and writes a ``.pdparams`` file plus a JSON sidecar (``<dst>.json``: model
type, spec, source sha256 and layout, converter version). Source layouts: SAM v1 official
(segment-anything) and HF transformers (``facebook/sam-vit-*``); SAM 3 released (``sam3.pt``)
and HF transformers (``Sam3Model`` / ``facebook/sam3``: a ``.safetensors`` file, a sharded
``model.safetensors.index.json`` or the model folder; see :mod:`.sam3_hf`).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from ..models.sam3.build_sam3 import SAM3_SPEC, Sam3Spec
from ..models.sam_v1.build_sam import SAM_SPECS, SamSpec
from . import sam3, sam3_hf, sam_v1
from .core import (
    PADDLE_SUFFIX,
    CheckpointMismatchError,
    model_shapes,
    read_pdparams,
    read_sidecar,
    save_pdparams,
    sha256_file,
    sidecar_meta,
    sidecar_path,
)
from .torch_reader import load_state_dict


def resolve_spec(model_type: str | None, state_dict: dict | None = None) -> tuple[str, SamSpec]:
    """The (name, spec) to use: the given type, checked against the weights if any."""
    detected = None
    if state_dict is not None:
        official = state_dict
        if sam_v1.is_hf_layout(set(state_dict)):
            official = sam_v1.hf_to_official(state_dict)
        try:
            detected = sam_v1.detect_model_type(official)
        except CheckpointMismatchError:
            if model_type is None:
                raise
    if model_type is None:
        model_type = detected
    if model_type == "default":
        model_type = "vit_h"
    if model_type not in SAM_SPECS:
        raise ValueError(f"unknown model type {model_type!r}; choose from {sorted(SAM_SPECS)}")
    if detected is not None and detected != model_type:
        raise CheckpointMismatchError(
            f"--model-type {model_type} does not match the checkpoint, which looks like {detected}"
        )
    return model_type, SAM_SPECS[model_type]


def convert_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    model_type: str | None = None,
    *,
    spec: Any = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Convert ``src`` (official/HF SAM v1 or official/HF SAM 3, .pth/.pt or .safetensors; for
    HF SAM 3 also a sharded ``model.safetensors.index.json`` or the model folder) to ``dst``
    (.pdparams).

    ``model_type`` (vit_b / vit_l / vit_h / sam3) is detected from the weights when omitted;
    give ``spec`` (a ``SamSpec`` or ``Sam3Spec``) instead for a custom size. Refuses to
    overwrite ``dst`` unless ``overwrite``. Returns the sidecar metadata written next to ``dst``.
    """
    src, dst = Path(src), Path(dst)
    hf_source = sam3_hf.is_hf_source(src)
    if not (src.is_file() or hf_source and src.exists()):
        raise FileNotFoundError(f"checkpoint not found: {src}")
    if dst.suffix != PADDLE_SUFFIX:
        raise ValueError(f"output must end in {PADDLE_SUFFIX}: {dst}")
    if dst.resolve() == src.resolve():
        raise ValueError(f"output {dst} is the input file; choose another name")
    side = sidecar_path(dst)
    if not overwrite:
        for p in (dst, side):
            if p.exists():
                raise FileExistsError(
                    f"{p} exists; pass overwrite=True (--overwrite) to replace it"
                )
    if hf_source:
        state = sam3_hf.load_hf_state_dict(src, progress=progress)
        if not sam3_hf.is_hf_sam3_layout(state):
            raise CheckpointMismatchError(
                f"{src} is not an HF SAM 3 checkpoint (no 'vision_encoder.backbone.*' keys); "
                "folders and sharded indexes are read for HF SAM 3 only"
            )
    else:
        state = load_state_dict(src, progress=progress)
    looks_sam3 = sam3.is_sam3_checkpoint(state) or sam3_hf.is_hf_sam3_layout(state)
    wants_sam3 = model_type == "sam3" or (spec is not None and not isinstance(spec, SamSpec))
    if wants_sam3 or (looks_sam3 and model_type is None and spec is None):
        return _convert_sam3(src, dst, state, model_type, spec, progress)
    if looks_sam3:
        raise CheckpointMismatchError(
            f"--model-type {model_type} does not match the checkpoint, which looks like sam3"
        )
    layout = "hf" if sam_v1.is_hf_layout(set(state)) else "official"
    if spec is None:
        model_type, spec = resolve_spec(model_type, state)
    else:
        known = "vit_h" if model_type == "default" else model_type
        if known in SAM_SPECS and SAM_SPECS[known] != spec:
            raise ValueError(
                f"model type {model_type} contradicts the given spec; pass one or the other"
            )
        model_type = model_type or "custom"
    converted = sam_v1.convert_state_dict(state, spec)
    del state
    source = {"file": src.name, "sha256": sha256_file(src, progress), "layout": layout}
    meta = sidecar_meta("sam_v1", model_type, spec, source)
    save_pdparams(converted, dst, meta)
    return meta


def _convert_sam3(
    src: Path, dst: Path, state: dict, model_type: str | None, spec: Any, progress: bool
) -> dict:
    """SAM 3 (``detector.*`` / ``tracker.*``, or the HF layout mapped to it first): convert
    every key, check the image model's part (and, when the file has ``tracker.*`` keys, the
    tracker's SAM heads of ``predict_inst``) strictly against the model of ``spec`` (the
    released sizes by default), write it all."""
    if model_type not in (None, "sam3") or not isinstance(spec, Sam3Spec | None):
        raise ValueError(f"model type {model_type!r} and spec {spec!r} do not describe SAM 3")
    spec = SAM3_SPEC if spec is None else spec
    layout, dropped = "official", {}
    if sam3_hf.is_hf_sam3_layout(state):
        layout = "hf"
        for reason in sam3_hf.dropped_keys(state).values():
            dropped[reason] = dropped.get(reason, 0) + 1
        state = sam3_hf.hf_to_released(state)
    converted = sam3.convert_state_dict(state)
    del state
    interactive = any(k.startswith(sam3.INTERACTIVE_PREFIX) for k in converted)
    if interactive:  # the tracker's SAM heads too (predict_inst)
        sam3.select_for_model(
            converted, sam3.expected_layout(spec, enable_inst_interactivity=True), where=f"{src}: "
        )
    else:
        sam3.select_for_model(converted, sam3.expected_layout(spec), where=f"{src}: ")
    source = {"file": src.name, **_source_hashes(src, progress), "layout": layout}
    if layout == "hf":
        source["dropped"] = dropped  # {reason: number of HF keys}
        source["filled"] = sam3_hf.FILLED
    meta = sidecar_meta("sam3", "sam3", spec, source, interactive=interactive)
    save_pdparams(converted, dst, meta)
    return meta


def _source_hashes(src: Path, progress: bool) -> dict:
    """``{"sha256": ...}`` of a file; of a folder or sharded index, the index's (or the single
    ``model.safetensors``'s) plus ``"shards": {name: sha256}``."""
    if not sam3_hf.is_hf_source(src):
        return {"sha256": sha256_file(src, progress)}
    main = src
    if src.is_dir():
        main = src / "model.safetensors"
        if not main.is_file():
            main = src / "model.safetensors.index.json"
    out = {"sha256": sha256_file(main, progress)}
    if main.name.endswith(".index.json"):
        shards = sorted(set(json.loads(main.read_text())["weight_map"].values()))
        out["shards"] = {n: sha256_file(main.parent / n, progress) for n in shards}
    return out


def read_sam_v1_weights(path: str | os.PathLike, spec: SamSpec) -> dict[str, np.ndarray]:
    """Paddle-layout float32 weights for ``spec`` from a .pdparams or an official file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix != PADDLE_SUFFIX:
        # an official .pth / .safetensors: convert in memory, with the same strict checks
        return sam_v1.convert_state_dict(load_state_dict(path), spec)
    return read_pdparams(path)


def read_sam3_weights(
    path: str | os.PathLike, model: paddle.nn.Layer | None = None
) -> dict[str, np.ndarray]:
    """Paddle-layout float32 weights from an official SAM 3 checkpoint (the released
    ``sam3.pt`` or an HF transformers ``.safetensors`` file, sharded index or folder: converted
    in memory, without torch) or a ``.pdparams`` written by ``paddle-sam convert``. With
    ``model`` they are checked strictly against it and reduced to the parts it holds
    (:func:`sam3.select_for_model`)."""
    path = Path(path)
    if not (path.is_file() or sam3_hf.is_hf_source(path) and path.exists()):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == PADDLE_SUFFIX:
        state = read_pdparams(path)
    else:
        raw, _ = sam3_hf.read_released(path)
        state = sam3.convert_state_dict(raw)
    if model is not None:
        state = sam3.select_for_model(state, model_shapes(model), where=f"{path}: ")
    return state


def detect_family(checkpoint: str | os.PathLike) -> str | None:
    """``"sam3"``, ``"sam_v1"`` or None (cannot tell cheaply) for a checkpoint file.

    From the sidecar of a converted file; for official files from their key names without
    reading the weights: the pickle of a zip ``.pt`` / ``.pth`` (scanned as bytes, never
    unpickled) or the header of a ``.safetensors``. Legacy (non-zip) pickles and ``.pdparams``
    without a sidecar give None."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    meta = read_sidecar(path)
    if meta is not None and "model_type" in meta:
        return "sam3" if meta["model_type"] == "sam3" else "sam_v1"
    if path.suffix == PADDLE_SUFFIX:
        return None
    needle = sam3.DETECTOR_PREFIX + "backbone."
    hf_needle = b'"vision_encoder.backbone.'  # HF Sam3Model (SAM v1's HF keys lack "backbone")
    hf_video_needle = b'"' + sam3_hf.HF_DETECTOR_PREFIX.encode() + b"vision_encoder.backbone."
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                pickles = [n for n in zf.namelist() if n.endswith("/data.pkl")]
                if len(pickles) != 1:
                    return None
                return "sam3" if needle.encode() in zf.read(pickles[0]) else "sam_v1"
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) == 8:
                n = int.from_bytes(head, "little")
                if 2 <= n <= (100 << 20):
                    header = f.read(n)
                    if header[:1] == b"{":
                        sam3_keys = (needle.encode(), hf_needle, hf_video_needle)
                        return "sam3" if any(n in header for n in sam3_keys) else "sam_v1"
    except (OSError, zipfile.BadZipFile):
        return None
    return None


__all__ = [
    "convert_checkpoint",
    "detect_family",
    "read_sam3_weights",
    "read_sam_v1_weights",
    "resolve_spec",
    "sidecar_path",
]
