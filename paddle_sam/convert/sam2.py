"""SAM 2 / 2.1 key map: the official ``sam2_hiera_*.pt`` / ``sam2.1_hiera_*.pt`` layout -> our
Paddle model.

The official file is ``{"model": state_dict}`` (the reader unwraps it) of upstream's
``SAM2Base``. Our parameter names are upstream's, so the map is the identity except for the
layout of Linear weights (torch ``[out, in]``, Paddle ``[in, out]``: transposed); every float
dtype is upcast to float32. Loading is strict: every key of the model present with its shape,
every key of the file used.

The size is read from the weights: the trunk's width and its blocks per stage (a block that
changes the width starts a stage) pick the released size, and SAM 2.1's extra tensors
(``no_obj_embed_spatial``, ``obj_ptr_tpos_proj``) tell 2.1 from 2.0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import paddle

from ..models.sam2.build_sam import SAM2_SPECS, Sam2Spec, build_sam2_model
from .core import (
    CheckpointMismatchError,
    check_keys,
    linear_weights,
    model_shapes,
    random_weight,
)

PATCH_EMBED_KEY = "image_encoder.trunk.patch_embed.proj.weight"
_BLOCKS = "image_encoder.trunk.blocks."
#: keys only SAM 2.1 has
SAM2_1_KEYS = ("no_obj_embed_spatial", "obj_ptr_tpos_proj.weight")
#: what only video tracking uses (memory encoder and attention, pointers, memory embeddings);
#: the image predictor holds them all the same, as upstream's model does
VIDEO_ONLY = (
    "memory_encoder.",
    "memory_attention.",
    "maskmem_tpos_enc",
    "no_mem_pos_enc",
    "no_obj_ptr",
    "no_obj_embed_spatial",
    "obj_ptr_proj.",
    "obj_ptr_tpos_proj.",
    "mask_downsample.",
)


def is_sam2_checkpoint(keys: Iterable[str]) -> bool:
    """True for upstream SAM 2's layout: a Hiera trunk under ``image_encoder.trunk.``."""
    return PATCH_EMBED_KEY in set(keys)


def trunk_stages(shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Blocks per stage of the trunk from its keys: a block with a ``proj`` (its width
    changes) starts a new stage."""
    indexes = sorted(
        {int(k[len(_BLOCKS) :].split(".")[0]) for k in shapes if k.startswith(_BLOCKS)}
    )
    starts = [i for i in indexes if f"{_BLOCKS}{i}.proj.weight" in shapes]
    bounds = [0, *starts, len(indexes)]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))


def detect_model_type(shapes: Mapping[str, tuple[int, ...]]) -> str:
    """The released model (``sam2.1_hiera_tiny`` ...) whose layout these official keys and
    shapes have; a clear error naming what was found otherwise."""
    if PATCH_EMBED_KEY not in shapes:
        raise CheckpointMismatchError(f"not a SAM 2 checkpoint: no '{PATCH_EMBED_KEY}' key")
    width = int(shapes[PATCH_EMBED_KEY][0])
    stages = trunk_stages(shapes)
    v2_1 = all(k in shapes for k in SAM2_1_KEYS)
    for name, spec in SAM2_SPECS.items():
        if (
            spec.encoder_embed_dim == width
            and spec.encoder_stages == stages
            and spec.no_obj_embed_spatial == v2_1
        ):
            return name
    version = "2.1" if v2_1 else "2.0"
    raise CheckpointMismatchError(
        f"no released SAM {version} size has a Hiera trunk of width {width} and stages "
        f"{list(stages)}; for a non-standard size pass a Sam2Spec from Python "
        "(convert_checkpoint(src, dst, spec=Sam2Spec(...)))"
    )


def _build_lazy(spec: Sam2Spec) -> paddle.nn.Layer:
    with paddle.LazyGuard():
        return build_sam2_model(spec)


def expected_layout(spec: Sam2Spec) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Paddle parameter shapes of a model of ``spec`` and the names of its Linear weights
    (the model is declared under ``paddle.LazyGuard``, never filled)."""
    model = _build_lazy(spec)
    return model_shapes(model), linear_weights(model)


def official_layout(spec: Sam2Spec) -> dict[str, tuple[int, ...]]:
    """``{key: torch shape}`` of an official checkpoint of ``spec``."""
    shapes, linear = expected_layout(spec)
    return {k: s[::-1] if k in linear else s for k, s in shapes.items()}


def convert_state_dict(
    state_dict: Mapping[str, np.ndarray],
    spec: Sam2Spec,
    *,
    consume: bool = False,
    where: str = "",
) -> dict[str, np.ndarray]:
    """Official layout (torch shapes, any float dtype) -> float32 Paddle state dict for
    ``spec``. Strict: :class:`CheckpointMismatchError` lists every missing, unexpected or
    mis-shaped key (and any non-float tensor) at once. ``consume``: empty a mutable
    ``state_dict`` as it is converted (the checkpoint is then held once, not twice);
    ``where`` prefixes error messages (the file's name)."""
    shapes, linear = expected_layout(spec)
    torch_shapes = {k: s[::-1] if k in linear else s for k, s in shapes.items()}
    wrong = [
        f"{k}: dtype {np.asarray(v).dtype} is not floating point"
        for k, v in state_dict.items()
        if k in shapes and not np.issubdtype(np.asarray(v).dtype, np.floating)
    ]
    check_keys(torch_shapes, state_dict, wrong=wrong, where=where)
    pop = consume and isinstance(state_dict, dict)
    out: dict[str, np.ndarray] = {}
    for key in shapes:
        value = np.asarray(state_dict.pop(key) if pop else state_dict[key])
        value = value.astype(np.float32, copy=False)
        out[key] = np.ascontiguousarray(value.T) if key in linear else value
    return out


def random_official_state_dict(spec: Sam2Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights for ``spec`` in the official layout (torch shapes, float32), for tests
    and demos that need an "official" file without torch; the masks are meaningless."""
    rng = np.random.default_rng(seed)
    return {key: random_weight(key, shape, rng) for key, shape in official_layout(spec).items()}


__all__ = [
    "PATCH_EMBED_KEY",
    "SAM2_1_KEYS",
    "VIDEO_ONLY",
    "convert_state_dict",
    "detect_model_type",
    "expected_layout",
    "is_sam2_checkpoint",
    "official_layout",
    "random_official_state_dict",
    "trunk_stages",
]
