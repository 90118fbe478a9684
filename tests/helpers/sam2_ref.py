"""The official SAM 2 (``sam2==1.1.0``) as a test reference, on the CPU.

Importing this module imports neither torch nor sam2; the helpers import them when called.
The official code runs on the CPU as it is, with two test-side adjustments:

* ``SAM2ImagePredictor`` hard-codes the feature sizes of 1024 px inputs (``_bb_feat_sizes``);
  for a reduced image size they are set from the model (:func:`official_predictor`);
* models are built by upstream's ``build_sam2`` with hydra overrides of the released config
  (:data:`REDUCED_OVERRIDES`: a Hiera with fewer and narrower blocks at 256 px, one memory
  attention layer) so a test runs in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: a reduced SAM 2.1 tiny: 256 px, Hiera of width 32 with stages 1-1-2-1 (one global block),
#: windows 8-4-6-4 (the third stage's 6 pads its 16 x 16 grid, the fourth's pooled 3 its 8 x 8),
#: a 4 x 4 background position embedding, one memory-attention layer with a 64-wide FFN
REDUCED_OVERRIDES = [
    "++model.image_size=256",
    "++model.image_encoder.trunk.embed_dim=32",
    "++model.image_encoder.trunk.num_heads=1",
    "++model.image_encoder.trunk.stages=[1,1,2,1]",
    "++model.image_encoder.trunk.global_att_blocks=[3]",
    "++model.image_encoder.trunk.window_spec=[8,4,6,4]",
    "++model.image_encoder.trunk.window_pos_embed_bkg_spatial_size=[4,4]",
    "++model.image_encoder.neck.backbone_channel_list=[256,128,64,32]",
    "++model.memory_attention.num_layers=1",
    "++model.memory_attention.layer.dim_feedforward=64",
    "++model.memory_attention.layer.self_attention.feat_sizes=[16,16]",
    "++model.memory_attention.layer.cross_attention.feat_sizes=[16,16]",
]


def reduced_spec(version: str = "2.1") -> Any:
    """Our :class:`Sam2Spec` of :data:`REDUCED_OVERRIDES` on the SAM ``version`` tiny config."""
    from paddle_sam.models.sam2.build_sam import SAM2_SPECS, Sam2Spec

    base = SAM2_SPECS["sam2.1_hiera_tiny" if version == "2.1" else "sam2_hiera_tiny"]
    return Sam2Spec.from_dict(
        {
            **base.to_dict(),
            "encoder_embed_dim": 32,
            "encoder_num_heads": 1,
            "encoder_stages": (1, 1, 2, 1),
            "encoder_global_attn_indexes": (3,),
            "encoder_window_spec": (8, 4, 6, 4),
            "encoder_window_pos_embed_size": (4, 4),
            "image_size": 256,
            "memory_attention_layers": 1,
            "memory_attention_dim_feedforward": 64,
        }
    )


def config_file(version: str = "2.1", size: str = "t") -> str:
    return (
        f"configs/sam2.1/sam2.1_hiera_{size}.yaml"
        if version == "2.1"
        else f"configs/sam2/sam2_hiera_{size}.yaml"
    )


def ensure_hydra() -> None:
    """Hydra initialised on sam2's configs, as ``import sam2`` leaves it (a test that cleared
    it would otherwise break upstream's ``build_sam2`` for the tests after it)."""
    import sam2  # noqa: F401 - initialises hydra on import
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if not GlobalHydra.instance().is_initialized():
        initialize_config_module("sam2", version_base="1.2")


def official_model(
    config: str, overrides: list[str] | None = None, seed: int = 0, scale: float = 0.05
) -> Any:
    """Upstream's model of ``config`` (with hydra ``overrides``) built with a fixed seed on the
    CPU, every weight perturbed (relative noise of ``scale``, so no norm stays at 1 and no
    bias at 0), in eval mode."""
    import torch
    from sam2.build_sam import build_sam2

    ensure_hydra()
    torch.manual_seed(seed)
    model = build_sam2(config, None, device="cpu", hydra_overrides_extra=list(overrides or []))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
                t.add_(scale * noise * (t.abs().mean() + 0.5))
    return model.eval()


def save_official(model: Any, path: Path, dtype: Any = None) -> Path:
    """``torch.save({"model": state_dict})``, as the official checkpoints are written."""
    import torch

    state = model.state_dict()
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    torch.save({"model": state}, path)
    return path


def official_predictor(model: Any, **kwargs: Any) -> Any:
    """Upstream's ``SAM2ImagePredictor`` with its feature sizes set from the model's image
    size (upstream hard-codes 1024 px's)."""
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    predictor = SAM2ImagePredictor(model, **kwargs)
    side = model.image_size // 16
    predictor._bb_feat_sizes = [(4 * side, 4 * side), (2 * side, 2 * side), (side, side)]
    return predictor


def reduced_checkpoint(
    folder: Path, version: str = "2.1", seed: int = 4, name: str = "sam2_reduced"
) -> tuple[Path, Path]:
    """A reduced SAM ``version`` (:func:`reduced_spec`) with random weights, written as an
    official file (``torch.save({"model": ...})``) and converted (``.pdparams`` and its
    sidecar): ``(official, converted)``. The object-score head's bias is raised so that
    tracked objects stay "present" (random weights put the score near 0, where tracking
    decisions flip on noise)."""
    import numpy as np
    import torch

    from paddle_sam.convert import sam2 as conv
    from paddle_sam.convert.checkpoint import convert_checkpoint

    spec = reduced_spec(version)
    state = conv.random_official_state_dict(spec, seed=seed)
    bias = "sam_mask_decoder.pred_obj_score_head.layers.2.bias"
    state[bias] = state[bias] + np.float32(4.0)
    official = Path(folder) / f"{name}.pt"
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    torch.save({"model": tensors}, official)
    converted = Path(folder) / f"{name}.pdparams"
    convert_checkpoint(official, converted, spec=spec, progress=False, overwrite=True)
    return official, converted
