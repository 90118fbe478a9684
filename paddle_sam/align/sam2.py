"""Per-module alignment of our SAM 2 / 2.1 against the official code (``sam2==1.1.0``).

Both models get the same image through their image predictors (Hiera trunk block by block,
FPN neck, then the prompt encoder and mask decoder on each click case), then the same still
video through ``track_step``: a click on frame 0, tracking on the next frames from the memory
bank (memory encoder, memory attention layer by layer, object-pointer projection, and the SAM
heads again). Every module is scored as in :mod:`.common`.

The reference is upstream's own ``build_sam2`` with its released config; a size that is not a
released one is that config with hydra overrides made from the :class:`Sam2Spec`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..models.sam2.build_sam import SAM2_CONFIGS, SAM2_SPECS, Sam2Spec
from .common import (
    Alignment,
    AlignReport,
    click_cases,
    default_image,
    load_official,
    numpy_state_dict,
    perturb_torch_,
    run_click_cases,
    submodule,
    to_numpy,
)

# compared modules in execution order ("*": each block / layer); names are upstream's and ours
MODULES = (
    "image_encoder.trunk.patch_embed",
    "image_encoder.trunk.blocks.*",
    "image_encoder.trunk",
    "image_encoder.neck",
    "sam_prompt_encoder",
    "sam_mask_decoder",
    "obj_ptr_proj",
    "memory_encoder",
    "memory_attention.layers.*",
    "memory_attention",
)
# outputs of each tracked frame compared after its module rows
TRACK_OUTPUTS = (
    "pred_masks",
    "pred_masks_high_res",
    "obj_ptr",
    "object_score_logits",
    "maskmem_features",
)


def import_sam2() -> tuple[Any, Any]:
    """``(torch, sam2)`` or an ImportError that says how to install them."""
    try:
        import sam2
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the official SAM 2 reference is not installed; it is a test-only extra: "
            "SAM2_BUILD_CUDA=0 pip install --no-build-isolation 'paddle-sam[torch]' "
            "(torch==2.14.1, sam2==1.1.0, hydra-core)"
        ) from exc
    return torch, sam2


def official_config(spec: Sam2Spec) -> tuple[str, list[str]]:
    """Upstream's config file and hydra overrides that build ``spec``: a released size's own
    config as it is; any other size on SAM 2.1 tiny's config with every size overridden."""
    for name, released in SAM2_SPECS.items():
        if released == spec:
            return SAM2_CONFIGS[name], []
    side = spec.image_size // 16
    trunk = "++model.image_encoder.trunk."
    layer = "++model.memory_attention.layer."

    def seq(values: Any) -> str:
        return "[" + ",".join(str(v) for v in values) + "]"

    flags = (
        "no_obj_embed_spatial",
        "add_tpos_enc_to_obj_ptrs",
        "proj_tpos_enc_in_obj_ptrs",
        "use_signed_tpos_enc_to_obj_ptrs",
    )
    return SAM2_CONFIGS["sam2.1_hiera_tiny"], [
        f"++model.image_size={spec.image_size}",
        f"{trunk}embed_dim={spec.encoder_embed_dim}",
        f"{trunk}num_heads={spec.encoder_num_heads}",
        f"{trunk}stages={seq(spec.encoder_stages)}",
        f"{trunk}global_att_blocks={seq(spec.encoder_global_attn_indexes)}",
        f"{trunk}window_spec={seq(spec.encoder_window_spec)}",
        f"{trunk}window_pos_embed_bkg_spatial_size={seq(spec.encoder_window_pos_embed_size)}",
        f"{trunk}q_pool={spec.encoder_q_pool}",
        f"++model.image_encoder.neck.backbone_channel_list={seq(spec.channel_list)}",
        f"++model.num_maskmem={spec.num_maskmem}",
        f"++model.memory_attention.num_layers={spec.memory_attention_layers}",
        f"{layer}dim_feedforward={spec.memory_attention_dim_feedforward}",
        f"{layer}self_attention.feat_sizes=[{side},{side}]",
        f"{layer}cross_attention.feat_sizes=[{side},{side}]",
        f"{layer}cross_attention.kv_in_dim={spec.mem_dim}",
        f"++model.memory_encoder.out_dim={spec.mem_dim}",
        *(f"++model.{f}={str(getattr(spec, f)).lower()}" for f in flags),
    ]


def build_reference_sam2(spec: Sam2Spec, checkpoint: str | None = None):
    """Upstream's ``SAM2Base`` of ``spec`` (built by upstream's ``build_sam2``) on the CPU, in
    eval mode: random weights, or the official ``checkpoint`` loaded strictly
    (:func:`~.common.load_official`)."""
    import_sam2()
    from sam2.build_sam import build_sam2

    config, overrides = official_config(spec)
    ref = build_sam2(config, None, device="cpu", hydra_overrides_extra=overrides)
    if checkpoint is not None:
        load_official(ref, checkpoint)
    return ref.eval()


def randomise_(ref, seed: int = 0, scale: float = 0.05, obj_bias: float = 6.0):
    """Weights for a random-weights alignment: every tensor perturbed (none stays at a trivial
    0 or 1), and the object-score head's bias at ``obj_bias`` so that the tracker's
    object-present decisions are clear of 0 on both sides. Returns ``ref``."""
    torch, _ = import_sam2()
    perturb_torch_(ref, seed, scale)
    with torch.no_grad():
        ref.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.fill_(obj_bias)
    return ref.eval()


def converted_model(ref, spec: Sam2Spec):
    """Our SAM 2 of ``spec`` with ``ref``'s weights, through our converter."""
    from ..convert.core import load_state_strict
    from ..convert.sam2 import convert_state_dict
    from ..models.sam2.build_sam import build_sam2_model

    ours = build_sam2_model(spec)
    load_state_strict(ours, convert_state_dict(numpy_state_dict(ref), spec))
    return ours


def random_pair(spec: Sam2Spec, seed: int = 0) -> tuple[Any, Any]:
    """(upstream model, ours) of ``spec`` with the same random weights (:func:`randomise_`)."""
    torch, _ = import_sam2()
    torch.manual_seed(seed)
    ref = randomise_(build_reference_sam2(spec), seed)
    return ref, converted_model(ref, spec)


def _official_predictor(model):
    """Upstream's ``SAM2ImagePredictor``, its feature sizes set from the model's image size
    (upstream writes 1024 px's)."""
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    predictor = SAM2ImagePredictor(model)
    side = model.image_size // 16
    predictor._bb_feat_sizes = [(4 * side, 4 * side), (2 * side, 2 * side), (side, side)]
    return predictor


def module_pairs(ref, ours, names: tuple[str, ...] = MODULES) -> list[tuple[str, Any, Any]]:
    """``(name, upstream module, ours)`` for ``names``, ``*`` expanded to our blocks."""
    counts = {
        "image_encoder.trunk.blocks.*": len(ours.image_encoder.trunk.blocks),
        "memory_attention.layers.*": len(ours.memory_attention.layers),
    }
    out = []
    for n in names:
        expanded = [f"{n[:-2]}.{i}" for i in range(counts[n])] if n.endswith(".*") else [n]
        out += [(m, submodule(ref, m), submodule(ours, m)) for m in expanded]
    return out


def track_still_video(
    al: Alignment,
    ref,
    ours,
    ref_features: tuple,
    our_features: tuple,
    click: np.ndarray,
    frames: int,
    ref_kwargs: dict | None = None,
) -> None:
    """``track_step`` on both sides over ``frames`` frames of one image's features
    (``(vision_feats, pos_embeds, sizes)`` per side, from ``_prepare_backbone_features``): a
    positive click (``1 x 2``, model input pixels) on frame 0, tracking from the memory bank
    on the others. SAM 2 and SAM 3's tracker share this step; ``ref_kwargs`` go to the
    reference's ``track_step`` only."""
    import paddle
    import torch

    banks: list[dict] = [{"cond_frame_outputs": {}, "non_cond_frame_outputs": {}} for _ in "ab"]
    (rf, rp, rs), (of, op, os_) = ref_features, our_features
    xy = np.asarray(click, np.float32).reshape(1, 1, 2)
    for f in range(frames):
        cond = f == 0
        rpts = opts = None
        if cond:
            rpts = {"point_coords": torch.from_numpy(xy), "point_labels": torch.ones(1, 1).int()}
            opts = {
                "point_coords": paddle.to_tensor(xy),
                "point_labels": paddle.ones([1, 1], "int32"),
            }
        common = dict(frame_idx=f, is_init_cond_frame=cond, num_frames=frames)
        prefix = f"[frame {f}] "
        with al.stage(prefix):
            with torch.no_grad():
                want = ref.track_step(
                    current_vision_feats=rf,
                    current_vision_pos_embeds=rp,
                    feat_sizes=rs,
                    point_inputs=rpts,
                    mask_inputs=None,
                    output_dict=banks[0],
                    **common,
                    **(ref_kwargs or {}),
                )
            with paddle.no_grad():
                got = ours.track_step(
                    current_vision_feats=of,
                    current_vision_pos_embeds=op,
                    feat_sizes=os_,
                    point_inputs=opts,
                    mask_inputs=None,
                    output_dict=banks[1],
                    **common,
                )
        for key in TRACK_OUTPUTS:
            al.output(f"{prefix}{key}", want[key], got[key])
        al.output(
            f"{prefix}maskmem_pos_enc", want["maskmem_pos_enc"][-1], got["maskmem_pos_enc"][-1]
        )
        bank = "cond_frame_outputs" if cond else "non_cond_frame_outputs"
        banks[0][bank][f], banks[1][bank][f] = want, got


def align_sam2(
    ref,
    ours,
    image: np.ndarray | None = None,
    cases: list[tuple[str, dict[str, Any]]] | None = None,
    frames: int = 3,
) -> AlignReport:
    """Compare upstream's SAM 2 (``ref``) and ours module by module on ``image`` (a fixed
    synthetic one by default): the image predictor on each of ``cases``
    (:func:`~.common.click_cases`), then ``frames`` tracking steps (0: none) over the image as
    a still video, clicked on frame 0."""
    import paddle
    import torch

    from ..predict.sam2.predictor import SAM2ImagePredictor

    image = default_image() if image is None else image
    h, w = image.shape[:2]
    cases = click_cases(h, w) if cases is None else cases
    with Alignment(module_pairs(ref, ours)) as al:
        theirs, mine = _official_predictor(ref), SAM2ImagePredictor(ours)
        with al.stage():
            with torch.no_grad():
                theirs.set_image(image)
            mine.set_image(image)
        al.output("image_embedding", theirs.get_image_embedding(), mine.get_image_embedding())
        run_click_cases(al, theirs.predict, mine.predict, cases, theirs.mask_threshold)
        if frames:
            with al.unrecorded():  # the image encoder again, compared on set_image
                with torch.no_grad():
                    x = theirs._transforms(image)[None]
                    _, *ref_features = ref._prepare_backbone_features(ref.forward_image(x))
                with paddle.no_grad():
                    y = mine._transforms(image).unsqueeze(0)
                    _, *our_features = ours._prepare_backbone_features(ours.forward_image(y))
            al.output("[video] image", x, y)
            click = np.array([0.4 * w, 0.45 * h]) / [w, h] * ours.image_size
            track_still_video(al, ref, ours, ref_features, our_features, click, frames)
    al.report.meta.update(family="sam2", image_size=[h, w], frames=frames)
    return al.report


__all__ = [
    "MODULES",
    "align_sam2",
    "build_reference_sam2",
    "converted_model",
    "official_config",
    "random_pair",
    "randomise_",
    "to_numpy",
    "track_still_video",
]
