"""SAM v1 key map: official segment-anything and HF transformers layouts -> our Paddle model.

Our parameter names are upstream's, so the official layout maps one to one; the only change
is the Linear weight layout (torch ``[out, in]``, Paddle ``[in, out]``). The HF layout
(``facebook/sam-vit-*``) is renamed to the official names first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import paddle

from ..models.sam_v1.build_sam import SAM_SPECS, SamSpec, build_sam_model
from .core import (
    CheckpointMismatchError,
    check_keys,
    linear_weights,
    model_shapes,
    random_weight,
)

# Keys an official checkpoint may carry that the model does not need, with the reason.
DROPPED_KEYS = {
    # non-persistent buffers in upstream; some re-saved checkpoints include them
    "pixel_mean": "normalisation constants are fixed by the model spec",
    "pixel_std": "normalisation constants are fixed by the model spec",
}

# HF ties the random Fourier matrix to two names; both map to ours.
_HF_PE_KEYS = (
    "shared_image_embedding.positional_embedding",
    "prompt_encoder.shared_embedding.positional_embedding",
)
_PE_KEY = "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"

# (pattern, replacement) applied in order to HF key names.
_HF_RULES: list[tuple[str, str]] = [
    (r"^vision_encoder\.", "image_encoder."),
    (r"^image_encoder\.layers\.", "image_encoder.blocks."),
    (r"^image_encoder\.patch_embed\.projection\.", "image_encoder.patch_embed.proj."),
    (r"^image_encoder\.neck\.conv1\.", "image_encoder.neck.0."),
    (r"^image_encoder\.neck\.layer_norm1\.", "image_encoder.neck.1."),
    (r"^image_encoder\.neck\.conv2\.", "image_encoder.neck.2."),
    (r"^image_encoder\.neck\.layer_norm2\.", "image_encoder.neck.3."),
    (r"^prompt_encoder\.mask_embed\.conv1\.", "prompt_encoder.mask_downscaling.0."),
    (r"^prompt_encoder\.mask_embed\.layer_norm1\.", "prompt_encoder.mask_downscaling.1."),
    (r"^prompt_encoder\.mask_embed\.conv2\.", "prompt_encoder.mask_downscaling.3."),
    (r"^prompt_encoder\.mask_embed\.layer_norm2\.", "prompt_encoder.mask_downscaling.4."),
    (r"^prompt_encoder\.mask_embed\.conv3\.", "prompt_encoder.mask_downscaling.6."),
    (r"^prompt_encoder\.point_embed\.", "prompt_encoder.point_embeddings."),
    (r"^mask_decoder\.upscale_conv1\.", "mask_decoder.output_upscaling.0."),
    (r"^mask_decoder\.upscale_layer_norm\.", "mask_decoder.output_upscaling.1."),
    (r"^mask_decoder\.upscale_conv2\.", "mask_decoder.output_upscaling.3."),
    # 3-layer MLPs: proj_in / layers.0 / proj_out -> layers.0 / 1 / 2
    (r"\.layers\.0\.(weight|bias)$", r".layers.1.\1"),
    (r"\.proj_in\.", ".layers.0."),
    (r"\.proj_out\.", ".layers.2."),
    (r"\.layer_norm_final_attn\.", ".norm_final_attn."),
    (r"\.layer_norm(\d)\.", r".norm\1."),
]


def is_hf_layout(keys: set[str]) -> bool:
    return any(k.startswith("vision_encoder.") for k in keys)


def hf_to_official(state_dict: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rename an HF transformers SamModel state dict to segment-anything's key names."""
    out: dict[str, np.ndarray] = {}
    pe = [k for k in _HF_PE_KEYS if k in state_dict]
    if pe:
        if len(pe) == 2 and not np.array_equal(state_dict[pe[0]], state_dict[pe[1]]):
            raise CheckpointMismatchError(f"{pe[0]} and {pe[1]} differ; they must be tied")
        out[_PE_KEY] = state_dict[pe[0]]
    for key, value in state_dict.items():
        if key in _HF_PE_KEYS:
            continue
        new = key
        for pattern, repl in _HF_RULES:
            if pattern.startswith(r"\.layers\.0") and not _is_mlp_key(new):
                continue
            new = re.sub(pattern, repl, new)
        out[new] = value
    return out


def _is_mlp_key(key: str) -> bool:
    return ".output_hypernetworks_mlps." in key or ".iou_prediction_head." in key


def detect_model_type(state_dict: Mapping[str, np.ndarray]) -> str:
    """vit_b / vit_l / vit_h from the embedding width and depth of an official-layout dict."""
    key = "image_encoder.patch_embed.proj.weight"
    if key not in state_dict:
        keys = sorted(state_dict)
        shown = ", ".join(repr(k) for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
        raise CheckpointMismatchError(
            f"not a checkpoint of a SAM family this version reads: no SAM v1 key "
            f"('{key}', official or HF layout) and no SAM 3 key ('detector.*', "
            f"'vision_encoder.*'); it holds {len(keys)} tensor(s): {shown}"
        )
    width = int(state_dict[key].shape[0])
    depth = len({k.split(".")[2] for k in state_dict if k.startswith("image_encoder.blocks.")})
    for name, spec in SAM_SPECS.items():
        if spec.encoder_embed_dim == width and spec.encoder_depth == depth:
            return name
    raise CheckpointMismatchError(
        f"no known SAM v1 size ({', '.join(sorted(SAM_SPECS))}) has embed dim {width} and "
        f"depth {depth}; for a non-standard size pass a custom SamSpec from Python "
        "(convert_checkpoint(src, dst, spec=SamSpec(...)) or build_sam(spec, checkpoint))"
    )


def expected_layout(spec: SamSpec) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Paddle parameter shapes of a model of ``spec`` and the names of its Linear weights.

    Built under ``paddle.LazyGuard`` so no memory is spent on random initialisation.
    """
    with paddle.LazyGuard():
        model = build_sam_model(spec)
    return model_shapes(model), linear_weights(model)


def convert_state_dict(
    state_dict: Mapping[str, np.ndarray], spec: SamSpec
) -> dict[str, np.ndarray]:
    """Official or HF layout (torch shapes, any float dtype) -> float32 Paddle state dict.

    Strict: every model key must be present with the right shape, and every checkpoint key
    must be used (or be in :data:`DROPPED_KEYS`); otherwise :class:`CheckpointMismatchError`
    lists all the problems at once.
    """
    src = dict(state_dict)
    if is_hf_layout(set(src)):
        src = hf_to_official(src)
    shapes, linear = expected_layout(spec)
    torch_shapes = {k: s[::-1] if k in linear else s for k, s in shapes.items()}
    wrong = [
        f"{k}: dtype {np.asarray(v).dtype} is not floating point"
        for k, v in src.items()
        if k in shapes and not np.issubdtype(np.asarray(v).dtype, np.floating)
    ]
    check_keys(torch_shapes, src, ignore=DROPPED_KEYS, wrong=wrong)
    out: dict[str, np.ndarray] = {}
    for key in shapes:
        value = np.asarray(src[key]).astype(np.float32, copy=False)
        out[key] = np.ascontiguousarray(value.T) if key in linear else value
    return out


def random_official_state_dict(spec: SamSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights for ``spec`` in the official layout (torch shapes, float32).

    For demos and tests that need an "official" file without torch; the masks such a
    model predicts are meaningless.
    """
    rng = np.random.default_rng(seed)
    shapes, linear = expected_layout(spec)
    return {
        key: random_weight(key, shape[::-1] if key in linear else shape, rng)
        for key, shape in shapes.items()
    }
