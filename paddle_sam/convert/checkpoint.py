"""Convert official SAM v1 and SAM 3 checkpoints to ``.pdparams``, and read the weights of a
checkpoint of either kind for a model (the builders in :mod:`paddle_sam.loading` load them).

``convert_checkpoint`` reads ``.pth`` / ``.pt`` (zip or legacy) and ``.safetensors`` files
without torch and without running pickled code, maps every key, transposes Linear weights,
upcasts to float32 and writes a ``.pdparams`` file plus a JSON sidecar (``<dst>.json``: model
type, spec, source sha256 and layout, converter version). Source layouts: SAM v1 official
(segment-anything) and HF transformers (``facebook/sam-vit-*``); SAM 3 released (``sam3.pt``)
and HF transformers (``Sam3Model`` / ``facebook/sam3``: a ``.safetensors`` file, a sharded
``model.safetensors.index.json`` or the model folder; see :mod:`.sam3_hf`); SAM 2 / 2.1
official (``sam2_hiera_*.pt``, ``sam2.1_hiera_*.pt``; see :mod:`.sam2`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from ..models.sam2.build_sam import SAM2_SPECS, Sam2Spec
from ..models.sam3.build_sam3 import SAM3_SPEC, Sam3Spec
from ..models.sam_v1.build_sam import SAM_SPECS, SamSpec
from . import sam2, sam3, sam3_hf, sam_v1
from .core import (
    PADDLE_SUFFIX,
    CheckpointFormatError,
    CheckpointMismatchError,
    check_keys,
    model_shapes,
    pdparams_shapes,
    read_pdparams,
    save_pdparams,
    sha256_file,
    sidecar_meta,
    sidecar_path,
    sidecar_spec,
)
from .source import sniff
from .torch_reader import load_state_dict, load_tensor_shapes


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
    """Convert ``src`` (official/HF SAM v1, official SAM 2 / 2.1 or official/HF SAM 3,
    .pth/.pt or .safetensors; for HF SAM 3 also a sharded ``model.safetensors.index.json`` or
    the model folder) to ``dst`` (.pdparams).

    ``model_type`` (vit_b / vit_l / vit_h / sam2.1_hiera_tiny ... / sam3) is detected from
    the weights when omitted; give ``spec`` (a ``SamSpec``, ``Sam2Spec`` or ``Sam3Spec``)
    instead for a custom size. Refuses to
    overwrite ``dst`` unless ``overwrite``. Returns the sidecar metadata written next to ``dst``.
    """
    src, dst = Path(src), Path(dst)
    source = sniff(src)  # what the file is, read once; FileNotFoundError when missing
    hf_source = sam3_hf.is_hf_source(src)
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
    if source.family is None:  # a legacy pickle: its key names only now
        hf_sam3 = sam3_hf.is_hf_sam3_layout(state)
        looks_sam3 = hf_sam3 or sam3.is_sam3_checkpoint(state)
        looks_sam2 = sam2.is_sam2_checkpoint(state)
    else:
        looks_sam3 = source.family == "sam3"
        looks_sam2 = source.family == "sam2"
        hf_sam3 = looks_sam3 and source.layout == "hf"
    wants_sam2 = model_type in SAM2_SPECS or isinstance(spec, Sam2Spec)
    if wants_sam2 or (looks_sam2 and model_type is None and spec is None):
        if not looks_sam2:
            raise CheckpointMismatchError(
                f"{src}: not a SAM 2 checkpoint (no '{sam2.PATCH_EMBED_KEY}' key)"
            )
        return _convert_sam2(src, dst, state, model_type, spec, progress)
    if looks_sam2:
        raise CheckpointMismatchError(
            f"--model-type {model_type} does not match the checkpoint, which is SAM 2 "
            f"(one of {', '.join(SAM2_SPECS)})"
        )
    wants_sam3 = model_type == "sam3" or (spec is not None and not isinstance(spec, SamSpec))
    if wants_sam3 or (looks_sam3 and model_type is None and spec is None):
        return _convert_sam3(src, dst, state, model_type, spec, progress, hf=hf_sam3)
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
    src: Path,
    dst: Path,
    state: dict,
    model_type: str | None,
    spec: Any,
    progress: bool,
    *,
    hf: bool,
) -> dict:
    """SAM 3 (``detector.*`` / ``tracker.*``, or the HF layout mapped to it first): convert
    every key, check the image model's part (and, when the file has ``tracker.*`` keys, the
    tracker's SAM heads of ``predict_inst``) strictly against the model of ``spec`` (the
    released sizes by default), write it all."""
    if model_type not in (None, "sam3") or not isinstance(spec, Sam3Spec | None):
        raise ValueError(f"model type {model_type!r} and spec {spec!r} do not describe SAM 3")
    spec = SAM3_SPEC if spec is None else spec
    layout, dropped = "official", {}
    if hf:
        layout = "hf"
        for reason in sam3_hf.dropped_keys(state).values():
            dropped[reason] = dropped.get(reason, 0) + 1
        state = sam3_hf.hf_to_released(state)
    # emptied as it is converted: the checkpoint is held once, not twice
    converted = sam3.convert_state_dict(state, consume=True)
    interactive = any(k.startswith(sam3.INTERACTIVE_PREFIX) for k in converted)
    if interactive:  # the tracker's SAM heads too (predict_inst)
        sam3.select_for_model(
            converted, sam3.expected_layout(spec, enable_inst_interactivity=True), where=f"{src}: "
        )
    else:
        sam3.select_for_model(converted, sam3.expected_layout(spec), where=f"{src}: ")
    video = any(k.startswith(tuple(sam3.VIDEO_ONLY)) for k in converted)
    if video:  # the whole video tracker (memory encoder, memory attention, pointers)
        try:
            tracker = sam3.tracker_layout(spec)
        except ValueError as exc:
            raise CheckpointMismatchError(
                f"{src}: holds video tracker weights, but {exc}"
            ) from None
        check_keys(tracker, sam3.tracker_state(converted), where=f"{src}: tracker: ")
    source = {"file": src.name, **_source_hashes(src, progress), "layout": layout}
    if layout == "hf":
        source["dropped"] = dropped  # {reason: number of HF keys}
        source["filled"] = sam3_hf.FILLED
    meta = sidecar_meta("sam3", "sam3", spec, source, interactive=interactive)
    save_pdparams(converted, dst, meta)
    return meta


def _convert_sam2(
    src: Path, dst: Path, state: dict, model_type: str | None, spec: Any, progress: bool
) -> dict:
    """SAM 2 / 2.1: the size detected from the weights (or ``model_type`` / ``spec``, checked
    against them), every key converted strictly, written with its sidecar."""
    if spec is None:
        detected = sam2.detect_model_type({k: tuple(np.shape(v)) for k, v in state.items()})
        if model_type not in (None, detected):
            raise CheckpointMismatchError(
                f"--model-type {model_type} does not match {src}, which looks like {detected}"
            )
        model_type, spec = detected, SAM2_SPECS[detected]
    elif model_type is not None and SAM2_SPECS.get(model_type) != spec:
        raise ValueError(
            f"model type {model_type} contradicts the given spec; pass one or the other"
        )
    model_type = model_type or "custom"
    converted = sam2.convert_state_dict(state, spec, consume=True, where=f"{src}: ")
    source = {"file": src.name, "sha256": sha256_file(src, progress), "layout": "official"}
    meta = sidecar_meta("sam2", model_type, spec, source)
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


def read_sam2_weights(path: str | os.PathLike, spec: Sam2Spec) -> dict[str, np.ndarray]:
    """Paddle-layout float32 weights for ``spec`` from a ``.pdparams`` or an official SAM 2
    file (converted in memory, without torch, with the same strict checks)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix != PADDLE_SUFFIX:
        state = load_state_dict(path)
        return sam2.convert_state_dict(state, spec, consume=True, where=f"{path}: ")
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
        state = sam3.convert_state_dict(raw, consume=True)
    if model is not None:
        state = sam3.select_for_model(state, model_shapes(model), where=f"{path}: ")
    return state


def read_sam3_tracker_weights(
    path: str | os.PathLike, model: paddle.nn.Layer
) -> dict[str, np.ndarray]:
    """The SAM 3 video tracker's weights (``tracker.*``, plus the detector's vision backbone
    when ``model`` has a ``backbone``) from the same files as :func:`read_sam3_weights`,
    checked strictly against ``model``."""
    path = Path(path)
    state = read_sam3_weights(path)
    with_backbone = getattr(model, "backbone", None) is not None
    try:
        state = sam3.tracker_state(state, with_backbone=with_backbone)
    except CheckpointMismatchError as exc:
        raise CheckpointMismatchError(f"{path}: {exc}") from None
    check_keys(model_shapes(model), state, where=f"{path}: ")
    return state


def detect_family(checkpoint: str | os.PathLike) -> str | None:
    """``"sam3"``, ``"sam2"``, ``"sam_v1"`` or None (cannot tell cheaply) for a checkpoint file: the
    family :func:`~.source.sniff` finds (a sidecar, or key names read without the weights)."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return sniff(path).family


# ------------------------------------------------------------------- sidecar check
# A sidecar names the model to build for its weights; a wrong one must fail before that model
# is built (a lying sidecar could ask for any size). The floors are lower bounds of a model's
# parameters (and its largest buffers, SAM 3's RoPE tables), its number of weight tensors,
# from the spec alone (tests/hostile/test_checkpoints.py checks them against built models).

#: a sidecar's model may be this much larger than the weights it comes with (the floors are
#: lower bounds, so a true sidecar is far inside)
SIDECAR_SIZE_SLACK = 1.1


def _sam_v1_floor(s: SamSpec) -> tuple[int, int]:
    """Lower bounds of (parameters, weight tensors) of the SAM v1 model of ``s``."""
    d, p = s.encoder_embed_dim, s.vit_patch_size
    hd, g = d // s.encoder_num_heads, s.image_size // p
    hidden, emb = int(d * s.mlp_ratio), s.prompt_embed_dim
    n_glob = len(set(s.encoder_global_attn_indexes))
    windowed = s.encoder_depth - n_glob
    params = (
        s.encoder_depth * (4 * d * d + 2 * d * hidden)
        + 2 * hd * (n_glob * (2 * g - 1) + windowed * (2 * s.window_size - 1))  # rel. positions
        + 3 * p * p * d  # patch embedding
        + g * g * d  # absolute positions
        + d * emb
        + 9 * emb * emb  # neck
        + s.mask_in_chans * emb
        + s.decoder_depth * (4 * emb * emb + 2 * emb * s.decoder_mlp_dim)
        + (s.num_multimask_outputs + 1) * 2 * emb * emb  # hypernetwork MLPs
    )
    if s.iou_head_depth >= 2:
        h = s.iou_head_hidden_dim
        params += emb * h + (s.iou_head_depth - 2) * h * h
    tensors = (
        12 * s.encoder_depth
        + 10 * s.decoder_depth
        + 2 * s.iou_head_depth
        + 6 * (s.num_multimask_outputs + 1)
    )
    return params, tensors


def _sam3_floor(s: Sam3Spec) -> tuple[int, int]:
    """Lower bounds of (parameters plus RoPE table elements, weight tensors) of the SAM 3
    image model of ``s``."""
    d, p = s.encoder_embed_dim, s.vit_patch_size
    hd, g, pt = d // s.encoder_num_heads, s.image_size // p, s.pretrain_image_size // p
    hidden, dm, ff, w = int(d * s.mlp_ratio), s.d_model, s.dim_feedforward, s.text_width
    n_glob = len(set(s.encoder_global_attn_indexes))
    params = (
        s.encoder_depth * (4 * d * d + 2 * d * hidden)
        + 3 * p * p * d
        + (pt * pt + 1) * d
        + len(s.scale_factors) * 9 * dm * dm
        + s.text_layers * 12 * w * w
        + (s.vocab_size + s.context_length) * w
        + s.encoder_layers * (8 * dm * dm + 2 * dm * ff)
        + s.decoder_layers * (12 * dm * dm + 2 * dm * ff)
        + s.geometry_layers * (8 * dm * dm + 2 * dm * ff)
        + s.num_queries * dm
        + s.upsampling_stages * 9 * dm * dm
    )
    rope = 2 * hd * (n_glob * g * g + (s.encoder_depth - n_glob) * s.window_size**2)
    tensors = (
        12 * s.encoder_depth
        + 12 * s.text_layers
        + 20 * s.encoder_layers
        + 26 * s.decoder_layers
        + 20 * s.geometry_layers
        + 2 * len(s.scale_factors)
    )
    return params + rope, tensors


def _sam2_floor(s: Sam2Spec) -> tuple[int, int]:
    """Lower bounds of (parameters, weight tensors) of the SAM 2 model of ``s``: its trunk
    (at least 11 w^2 per block of width w), its memory attention and the decoder's MLPs."""
    widths = [s.encoder_embed_dim * 2**i for i in range(4)]
    trunk = sum(n * 11 * w * w for n, w in zip(s.encoder_stages, widths, strict=True))
    d = s.d_model
    memory = s.memory_attention_layers * (6 * d * d + 2 * d * s.memory_attention_dim_feedforward)
    decoder = 2 * 2 * d * s.sam_mlp_dim
    tensors = 12 * sum(s.encoder_stages) + 26 * s.memory_attention_layers
    return trunk + memory + decoder, tensors


def model_floor(spec: SamSpec | Sam2Spec | Sam3Spec) -> tuple[int, int]:
    """Lower bounds of (elements, weight tensors) of the model of ``spec``, from the spec alone
    (nothing is built)."""
    if isinstance(spec, SamSpec):
        return _sam_v1_floor(spec)
    if isinstance(spec, Sam2Spec):
        return _sam2_floor(spec)
    return _sam3_floor(spec)


def weight_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]] | None:
    """``{key: shape}`` of a checkpoint file's tensors, without reading their data: a
    ``.pdparams`` from its pickle, an official file from its pickle or safetensors header.
    None for an HF folder or sharded index."""
    path = Path(path)
    if not path.is_file():
        return None
    if path.suffix == PADDLE_SUFFIX:
        return pdparams_shapes(path)
    return load_tensor_shapes(path)


def _layout_mismatch(
    expected: dict[str, tuple[int, ...]], held: dict[str, tuple[int, ...]]
) -> str | None:
    """One line listing how ``held`` shapes differ from ``expected``, or None."""
    wrong = [
        f"{k}: file {list(held[k])}, spec {list(s)}"
        for k, s in expected.items()
        if k in held and tuple(held[k]) != tuple(s)
    ]
    missing = [k for k in expected if k not in held]
    extra = [k for k in held if k not in expected]
    parts = [
        f"{len(items)} {title} ({'; '.join(items[:2])}{'; ...' if len(items) > 2 else ''})"
        for title, items in (("mis-shaped", wrong), ("missing", missing), ("unexpected", extra))
        if items
    ]
    return ", ".join(parts) or None


def checked_sidecar_spec(
    checkpoint: str | os.PathLike,
    meta: dict,
    spec_cls: type[SamSpec] | type[Sam2Spec] | type[Sam3Spec],
    *,
    enable_inst_interactivity: bool = False,
) -> Any:
    """The spec of ``checkpoint``'s sidecar ``meta``, checked against the weights before any
    model is built: JSON types and sizes (:func:`~.core.sidecar_spec`), the size of the model it
    describes against what the file holds, and for a ``.pdparams`` every weight's key and shape
    (from the pickle; the model is declared under ``paddle.LazyGuard``, never allocated). Each
    problem is a one-line :class:`CheckpointFormatError` naming the sidecar."""
    checkpoint = Path(checkpoint)
    side = sidecar_path(checkpoint)
    spec = sidecar_spec(checkpoint, meta, spec_cls)
    held = weight_shapes(checkpoint)
    if held is None:
        return spec
    elements, tensors = model_floor(spec)
    held_elements = sum(math.prod(s) for s in held.values())
    if elements > SIDECAR_SIZE_SLACK * held_elements:
        raise CheckpointFormatError(
            f"sidecar {side}: its spec describes a model of at least {elements:,} parameters "
            f"({elements * 4 / 2**20:,.1f} MiB as float32), {checkpoint.name} holds "
            f"{held_elements:,}: the sidecar does not belong to these weights"
        )
    if tensors > len(held):
        raise CheckpointFormatError(
            f"sidecar {side}: its spec describes a model of at least {tensors} weight tensors, "
            f"{checkpoint.name} holds {len(held)}: the sidecar does not belong to these weights"
        )
    if checkpoint.suffix != PADDLE_SUFFIX:
        return spec  # official layouts: the converter checks every key strictly
    try:
        if isinstance(spec, SamSpec):
            expected = sam_v1.expected_layout(spec)[0]
        elif isinstance(spec, Sam2Spec):
            expected = sam2.expected_layout(spec)[0]
        else:
            expected = sam3.expected_layout(spec, enable_inst_interactivity)
            skip = tuple(
                prefix
                for prefix in (*sam3.INTERACTIVE_ONLY, *sam3.VIDEO_ONLY)
                if not any(k.startswith(prefix) for k in expected)
            )
            held = {k: v for k, v in held.items() if not k.startswith(skip)}
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise CheckpointFormatError(
            f"sidecar {side}: no model can be built of its spec: {exc}"
        ) from exc
    problems = _layout_mismatch(expected, held)
    if problems:
        raise CheckpointFormatError(
            f"sidecar {side}: its spec does not match the weights in {checkpoint.name}: {problems}"
        )
    return spec


__all__ = [
    "checked_sidecar_spec",
    "convert_checkpoint",
    "detect_family",
    "read_sam2_weights",
    "read_sam3_weights",
    "read_sam_v1_weights",
    "resolve_spec",
    "sidecar_path",
    "weight_shapes",
]
