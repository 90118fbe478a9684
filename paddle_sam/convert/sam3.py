"""SAM 3 key map: the released ``sam3.pt`` layout -> our Paddle model.

The released file is ``{"model": state_dict}`` (the reader unwraps it) with two prefixes:
``detector.*`` is the image model (our ``Sam3Image``; the prefix is removed) and ``tracker.*``
the SAM 2 style interactive predictor (renamed ``inst_interactive_predictor.model.*``, as
upstream's image builder does). Our parameter names are upstream's, so the map is short:

* ``*.freqs_cis`` (complex64 RoPE tables): dropped, the model recomputes them as real cos/sin;
* ``*.in_proj_weight`` / ``*.in_proj_bias`` of ``torch.nn.MultiheadAttention``: split into
  ``q_proj`` / ``k_proj`` / ``v_proj`` (Paddle ``MultiheadAttention`` keeps them apart);
* 2-D ``*.weight`` of a Linear: transposed (torch ``[out, in]``, Paddle ``[in, out]``);
  embedding tables (:data:`EMBEDDINGS`) and plain parameters keep their layout;
* every float dtype is upcast to float32; any other dtype is an error naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from ..models.sam3.build_sam3 import SAM3_SPEC, build_sam3_model
from .core import (
    CheckpointMismatchError,
    check_keys,
    linear_weights,
    model_shapes,
    random_weight,
)

DETECTOR_PREFIX = "detector."
TRACKER_PREFIX = "tracker."
INTERACTIVE_PREFIX = "inst_interactive_predictor.model."

# Source keys deliberately not converted, by suffix, with the reason.
DROPPED_SUFFIXES = {
    ".freqs_cis": "complex RoPE table, a fixed function of the configuration: recomputed by "
    "the model with real cos/sin",
}

# Modules whose 2-D ``weight`` is an embedding table (nn.Embedding), not a Linear.
EMBEDDINGS = frozenset(
    {
        # detector
        "token_embedding",
        "cls_embed",
        "label_embed",
        "presence_token",
        "query_embed",
        "reference_points",
        # tracker (SAM 2 style prompt encoder and mask decoder)
        "point_embeddings",
        "not_a_point_embed",
        "no_mask_embed",
        "iou_token",
        "mask_tokens",
        "obj_score_token",
    }
)

# Parts of a converted state dict used only with instance interactivity (point/box clicks):
# a model built without it does not hold them, and they are left out when loading.
INTERACTIVE_ONLY = {
    "backbone.vision_backbone.sam2_convs.": "second FPN neck of the interactive predictor",
    INTERACTIVE_PREFIX: "SAM 2 style tracker used by predict_inst",
}

# Parts of the released tracker that only video tracking uses (memory encoder, memory
# attention, object pointers): converted and kept in a .pdparams, but an image model with
# instance interactivity holds only the tracker's SAM heads (``Sam3TrackerHeads``:
# ``sam_prompt_encoder``, ``sam_mask_decoder``, ``no_mem_embed``), so they are left out when
# loading it.
VIDEO_ONLY = {
    INTERACTIVE_PREFIX + name: "video tracking only (not used by predict_inst)"
    for name in (
        "maskmem_backbone.",
        "maskmem_tpos_enc",
        "transformer.",
        "no_mem_pos_enc",
        "no_obj_embed_spatial",
        "no_obj_ptr",
        "obj_ptr_proj.",
        "obj_ptr_tpos_proj.",
        "mask_downsample.",
    )
}

_QKV = ("q_proj", "k_proj", "v_proj")


def is_sam3_checkpoint(keys: Iterable[str]) -> bool:
    """True for the released layout: image-model keys under ``detector.backbone.``."""
    return any(k.startswith(DETECTOR_PREFIX + "backbone.") for k in keys)


def rename(key: str) -> str:
    """Released key -> our key (prefixes only); other keys are returned unchanged."""
    if key.startswith(DETECTOR_PREFIX):
        return key[len(DETECTOR_PREFIX) :]
    if key.startswith(TRACKER_PREFIX):
        return INTERACTIVE_PREFIX + key[len(TRACKER_PREFIX) :]
    return key


def dropped_reason(key: str) -> str | None:
    for suffix, reason in DROPPED_SUFFIXES.items():
        if key.endswith(suffix):
            return reason
    return None


def is_linear_weight(key: str, ndim: int) -> bool:
    """Whether a (renamed, torch-layout) key is a Linear weight to transpose."""
    if ndim != 2 or not key.endswith(".weight"):
        return False
    parts = key.split(".")[:-1]
    while parts and parts[-1].isdigit():  # point_embeddings.0.weight
        parts.pop()
    return not parts or parts[-1] not in EMBEDDINGS


@dataclass(frozen=True)
class Step:
    """One output tensor made from a source tensor: part ``part`` (0/1/2 = q/k/v) of a fused
    in_proj or the whole tensor (None), transposed or not."""

    key: str
    shape: tuple[int, ...]
    part: int | None = None
    transpose: bool = False


def plan_key(src_key: str, shape: tuple[int, ...], dtype: np.dtype | str) -> list[Step] | str:
    """How ``src_key`` converts: its output steps (``[]`` if deliberately dropped), or a
    message saying why it cannot be converted. Works on shapes only, so the whole released
    layout can be checked without its 3.4 GB of data."""
    if dropped_reason(src_key) is not None:
        return []
    if not np.issubdtype(np.dtype(dtype), np.floating):
        return f"{src_key}: dtype {np.dtype(dtype)} is not floating point"
    key, shape = rename(src_key), tuple(int(d) for d in shape)
    for suffix, leaf, ndim in (("in_proj_weight", "weight", 2), ("in_proj_bias", "bias", 1)):
        if key.endswith("." + suffix) or key == suffix:
            if len(shape) != ndim or shape[0] % 3 != 0:
                return f"{src_key}: fused in_proj of shape {list(shape)} does not split in 3"
            prefix = key[: -len(suffix)]
            part_shape = (shape[0] // 3, *shape[1:])
            return [
                Step(f"{prefix}{name}.{leaf}", part_shape[::-1], i, leaf == "weight")
                for i, name in enumerate(_QKV)
            ]
    if is_linear_weight(key, len(shape)):
        return [Step(key, shape[::-1], None, True)]
    return [Step(key, shape)]


def plan(
    layout: Mapping[str, tuple[tuple[int, ...], np.dtype | str]],
) -> dict[str, tuple[str, Step]]:
    """``{target key: (source key, step)}`` for a ``{source key: (shape, dtype)}`` layout.

    Raises :class:`CheckpointMismatchError` listing every key that cannot be converted or
    that collides with another one."""
    out: dict[str, tuple[str, Step]] = {}
    problems: list[str] = []
    for src_key, (shape, dtype) in layout.items():
        steps = plan_key(src_key, shape, dtype)
        if isinstance(steps, str):
            problems.append(steps)
            continue
        for step in steps:
            if step.key in out:
                problems.append(
                    f"{src_key}: maps to {step.key}, as {out[step.key][0]} does already"
                )
            else:
                out[step.key] = (src_key, step)
    if problems:
        raise CheckpointMismatchError(
            "cannot convert the checkpoint:\n    "
            + "\n    ".join(problems[:20])
            + (f"\n    ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        )
    return out


def convert_tensors(
    state: Mapping[str, np.ndarray], consume: bool = False
) -> dict[str, np.ndarray]:
    """Torch layout -> float32 Paddle layout following :func:`plan`: released keys renamed,
    fused q/k/v split, Linear weights transposed, ``freqs_cis`` dropped. Module-relative keys
    of a single upstream module pass through the same rules (used by the parity tests).

    ``consume``: ``state`` (a dict) is emptied as the conversion goes, each source tensor
    dropped once its last converted part is made, so a 3.4 GB checkpoint is never held twice
    (the source and its transposed copy) but once plus one tensor."""
    steps = plan({k: (np.shape(v), np.asarray(v).dtype) for k, v in state.items()})
    last_use = {src_key: key for key, (src_key, _) in steps.items()}
    out: dict[str, np.ndarray] = {}
    for key, (src_key, step) in steps.items():
        value = np.asarray(state[src_key])
        if consume and last_use[src_key] == key:
            del state[src_key]
        if step.part is not None:
            n = value.shape[0] // 3
            value = value[step.part * n : (step.part + 1) * n]
        value = value.astype(np.float32, copy=False)
        out[key] = np.ascontiguousarray(value.T) if step.transpose else value
        del value
    if consume:
        state.clear()  # the keys the plan drops (freqs_cis)
    return out


def select_for_model(
    converted: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple[int, ...]],
    where: str = "",
) -> dict[str, np.ndarray]:
    """The part of a converted state dict that a model with parameter shapes ``expected``
    holds, checked strictly: interactive-only groups (:data:`INTERACTIVE_ONLY`) and the
    tracker's video-only modules (:data:`VIDEO_ONLY`) are left out when the model has none of
    their keys; anything else missing, unexpected or mis-shaped raises
    :class:`CheckpointMismatchError` naming the keys."""
    skip = {
        prefix
        for prefix in (*INTERACTIVE_ONLY, *VIDEO_ONLY)
        if not any(k.startswith(prefix) for k in expected)
    }
    state = {k: v for k, v in converted.items() if not k.startswith(tuple(skip))}
    check_keys(expected, state, where=where)
    return state


VISION_BACKBONE_PREFIX = "backbone.vision_backbone."


def tracker_state(
    converted: Mapping[str, np.ndarray], with_backbone: bool = False
) -> dict[str, np.ndarray]:
    """The video tracker's part of a converted state dict, under the tracker's own names
    (upstream's ``tracker.*`` without the prefix); ``with_backbone`` adds the image model's
    vision backbone (``backbone.vision_backbone.*``, both necks), which the released tracker
    shares with the detector. Raises :class:`CheckpointMismatchError` when the file holds no
    tracker (converted without it)."""
    state = {
        k[len(INTERACTIVE_PREFIX) :]: v
        for k, v in converted.items()
        if k.startswith(INTERACTIVE_PREFIX)
    }
    if not state:
        raise CheckpointMismatchError(
            "the checkpoint holds no video tracker (no 'tracker.*' weights): convert the "
            "released sam3.pt again without leaving the tracker out"
        )
    if with_backbone:
        state.update({k: v for k, v in converted.items() if k.startswith(VISION_BACKBONE_PREFIX)})
    return state


def convert_state_dict(
    state: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple[int, ...]] | None = None,
    consume: bool = False,
) -> dict[str, np.ndarray]:
    """Released layout (any float dtype) -> float32 Paddle state dict.

    Keys other than ``detector.*`` / ``tracker.*`` are refused. With ``expected`` (a model's
    parameter shapes) the result is also checked strictly and reduced to that model
    (:func:`select_for_model`). ``consume``: empty ``state`` as it is converted
    (:func:`convert_tensors`).
    """
    foreign = [k for k in state if not k.startswith((DETECTOR_PREFIX, TRACKER_PREFIX))]
    if foreign:
        raise CheckpointMismatchError(
            f"not a SAM 3 checkpoint layout: {len(foreign)} keys outside 'detector.' and "
            f"'tracker.', e.g. {', '.join(sorted(foreign)[:5])}"
        )
    converted = convert_tensors(state, consume=consume)
    if expected is not None:
        converted = select_for_model(converted, expected)
    return converted


def converted_shapes(
    layout: Mapping[str, tuple[tuple[int, ...], np.dtype | str]],
) -> dict[str, tuple[int, ...]]:
    """``{target key: Paddle shape}`` that a ``{source key: (shape, dtype)}`` layout converts to."""
    return {key: step.shape for key, (_, step) in plan(layout).items()}


def _build_lazy(spec: Any = None, enable_inst_interactivity: bool = False) -> paddle.nn.Layer:
    """The SAM 3 image model of ``spec`` (released sizes by default) under ``LazyGuard``:
    parameters are declared, not initialised."""
    spec = SAM3_SPEC if spec is None else spec
    with paddle.LazyGuard():
        return build_sam3_model(spec, enable_inst_interactivity=enable_inst_interactivity)


def tracker_layout(spec: Any = None) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of the video tracker of ``spec`` (without backbone), declared under
    ``LazyGuard``."""
    from ..models.sam3.build_sam3 import build_tracker_model

    with paddle.LazyGuard():
        return model_shapes(build_tracker_model(SAM3_SPEC if spec is None else spec))


def expected_layout(spec: Any = None, enable_inst_interactivity: bool = False) -> dict:
    """Parameter shapes of the SAM 3 image model of ``spec`` (the released one by default)."""
    return model_shapes(_build_lazy(spec, enable_inst_interactivity))


_QKV_KEY = re.compile(r"^(.*)\.([qkv])_proj\.(weight|bias)$")


def released_layout(
    spec: Any = None, enable_inst_interactivity: bool = False
) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{key: (torch shape, dtype)}`` of the ``detector.*`` part of an official checkpoint
    for ``spec`` (released sizes by default): fused in_proj, ``[out, in]`` Linear weights, the
    second neck (``sam2_convs``) and complex64 ``freqs_cis`` tables, as ``sam3.pt`` holds them.
    With ``enable_inst_interactivity`` also the ``tracker.*`` SAM heads (prompt encoder, mask
    decoder, ``no_mem_embed``; not the video-only modules of :data:`VIDEO_ONLY`).
    Built from our model, so :func:`plan` applied to it must give the model's layout back."""
    return _released_layout(_build_lazy(spec, enable_inst_interactivity))


def _released_layout(model: paddle.nn.Layer) -> dict[str, tuple[tuple[int, ...], str]]:
    linear = linear_weights(model)
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    fused: dict[str, list[int]] = {}
    for key, shape in model_shapes(model).items():
        if key.startswith(INTERACTIVE_PREFIX):  # tracker: q/k/v kept apart upstream too
            tracker_key = TRACKER_PREFIX + key[len(INTERACTIVE_PREFIX) :]
            out[tracker_key] = (shape[::-1] if key in linear else shape, "float32")
            continue
        m = _QKV_KEY.match(key)
        if m:  # Paddle weight [in, out] / bias [out] -> rows of torch's in_proj
            fused.setdefault(f"{m.group(1)}.in_proj_{m.group(3)}", [0, *shape[:-1]])[0] += shape[-1]
            continue
        if key.startswith("backbone.vision_backbone.convs."):
            twin = key.replace(".convs.", ".sam2_convs.", 1)
            out[DETECTOR_PREFIX + twin] = (shape, "float32")
        out[DETECTOR_PREFIX + key] = (shape[::-1] if key in linear else shape, "float32")
    for name, (rows, *rest) in fused.items():
        out[DETECTOR_PREFIX + name] = ((rows, *rest), "float32")
    for key, attn in _rope_layers(model).items():
        rows, dim = attn.rope_cos.shape  # one column per channel: two per complex entry
        out[key] = ((rows, dim // 2), "complex64")
    return out


def _rope_layers(model: paddle.nn.Layer) -> dict[str, paddle.nn.Layer]:
    """``{released freqs_cis key: attention layer}`` for the trunk's RoPE attentions."""
    blocks = model.backbone.vision_backbone.trunk.blocks
    prefix = f"{DETECTOR_PREFIX}backbone.vision_backbone.trunk.blocks"
    return {f"{prefix}.{i}.attn.freqs_cis": b.attn for i, b in enumerate(blocks) if b.attn.use_rope}


def random_released_state_dict(
    spec: Any = None,
    seed: int = 0,
    enable_inst_interactivity: bool = False,
    with_tracker: bool = False,
) -> dict[str, np.ndarray]:
    """Random weights in the official ``sam3.pt`` layout (detector part, and with
    ``enable_inst_interactivity`` the tracker's SAM heads, with ``with_tracker`` the whole
    video tracker; see :func:`released_layout`), for demos and tests that need an "official"
    file without torch. ``freqs_cis`` hold the true RoPE tables; the model built from these
    weights is meaningless.
    """
    if with_tracker:
        from ..models.sam3.build_sam3 import build_tracker_model

        with paddle.LazyGuard():
            tracker = build_tracker_model(SAM3_SPEC if spec is None else spec)
        linear = linear_weights(tracker)
        rng = np.random.default_rng(seed + 1)
        heads = {
            TRACKER_PREFIX + key: random_weight(key, shape[::-1] if key in linear else shape, rng)
            for key, shape in model_shapes(tracker).items()
        }
        return {**random_released_state_dict(spec, seed, enable_inst_interactivity), **heads}
    model = _build_lazy(spec, enable_inst_interactivity)
    rope = _rope_layers(model)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for key, (shape, dtype) in _released_layout(model).items():
        if dtype == "complex64":
            attn = rope[key]
            cos, sin = attn.rope_cos.numpy()[:, ::2], attn.rope_sin.numpy()[:, ::2]
            out[key] = (cos + 1j * sin).astype(np.complex64)
            continue
        out[key] = random_weight(key, shape, rng)
    return out
