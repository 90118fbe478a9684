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

from collections.abc import Iterable, Mapping

import numpy as np

from .sam_v1 import CheckpointMismatchError, check_keys

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


def convert_tensors(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Torch layout -> Paddle layout, float32: split fused q/k/v, transpose Linear weights,
    drop ``freqs_cis``. Keys are renamed with :func:`rename` first (module-relative keys of a
    single upstream module pass through unchanged). Raises :class:`CheckpointMismatchError`
    listing every tensor that cannot be converted."""
    out: dict[str, np.ndarray] = {}
    problems: list[str] = []
    for src_key, value in state.items():
        if dropped_reason(src_key) is not None:
            continue
        key = rename(src_key)
        value = np.asarray(value)
        if not np.issubdtype(value.dtype, np.floating):
            problems.append(f"{src_key}: dtype {value.dtype} is not floating point")
            continue
        value = value.astype(np.float32, copy=False)
        fused = _split_in_proj(key, value)
        if fused is None:
            problems.append(
                f"{src_key}: fused in_proj of shape {list(value.shape)} does not split in 3"
            )
            continue
        if fused:
            for new_key, part in fused.items():
                _put(out, new_key, part, src_key, problems)
            continue
        if is_linear_weight(key, value.ndim):
            value = np.ascontiguousarray(value.T)
        _put(out, key, value, src_key, problems)
    if problems:
        raise CheckpointMismatchError(
            "cannot convert the checkpoint:\n    "
            + "\n    ".join(problems[:20])
            + (f"\n    ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        )
    return out


def _put(out: dict, key: str, value: np.ndarray, src_key: str, problems: list[str]) -> None:
    if key in out:
        problems.append(f"{src_key}: maps to {key}, which another key already produced")
    else:
        out[key] = value


def _split_in_proj(key: str, value: np.ndarray) -> dict[str, np.ndarray] | None:
    """``{}`` if ``key`` is not a fused projection, the three parts if it is, None if it
    cannot be split."""
    for suffix, leaf, ndim in (("in_proj_weight", "weight", 2), ("in_proj_bias", "bias", 1)):
        if key.endswith("." + suffix) or key == suffix:
            if value.ndim != ndim or value.shape[0] % 3 != 0:
                return None
            prefix = key[: -len(suffix)]
            parts = np.split(value, 3, axis=0)
            if leaf == "weight":
                parts = [np.ascontiguousarray(p.T) for p in parts]
            return {f"{prefix}{name}.{leaf}": p for name, p in zip(_QKV, parts, strict=True)}
    return {}


def select_for_model(
    converted: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple[int, ...]],
    where: str = "",
) -> dict[str, np.ndarray]:
    """The part of a converted state dict that a model with parameter shapes ``expected``
    holds, checked strictly: interactive-only groups (:data:`INTERACTIVE_ONLY`) are left out
    when the model has none of their keys; anything else missing, unexpected or mis-shaped
    raises :class:`CheckpointMismatchError` naming the keys."""
    skip = {
        prefix for prefix in INTERACTIVE_ONLY if not any(k.startswith(prefix) for k in expected)
    }
    state = {k: v for k, v in converted.items() if not k.startswith(tuple(skip))}
    check_keys(expected, state, where=where)
    return state


def convert_state_dict(
    state: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, np.ndarray]:
    """Released layout (any float dtype) -> float32 Paddle state dict.

    Keys other than ``detector.*`` / ``tracker.*`` are refused. With ``expected`` (a model's
    parameter shapes) the result is also checked strictly and reduced to that model
    (:func:`select_for_model`).
    """
    foreign = [k for k in state if not k.startswith((DETECTOR_PREFIX, TRACKER_PREFIX))]
    if foreign:
        raise CheckpointMismatchError(
            f"not a SAM 3 checkpoint layout: {len(foreign)} keys outside 'detector.' and "
            f"'tracker.', e.g. {', '.join(sorted(foreign)[:5])}"
        )
    converted = convert_tensors(state)
    if expected is not None:
        converted = select_for_model(converted, expected)
    return converted
