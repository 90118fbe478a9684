"""SAM 2 / 2.1 sizes: the registry against upstream's config files (sam2 1.1.0, read as YAML),
the state-dict layout of each released size against the official model's (built on torch's
meta device: shapes without memory), the converter's size detection on each, and the spec's
own checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from paddle_sam.convert import sam2 as convert_sam2
from paddle_sam.models.sam2.build_sam import SAM2_CONFIGS, SAM2_SPECS, Sam2Spec
from tests.helpers.sam2_ref import ensure_hydra

yaml = pytest.importorskip("yaml")
torch = pytest.importorskip("torch")
sam2_pkg = pytest.importorskip("sam2")


def _config(name: str) -> dict:
    return yaml.safe_load((Path(sam2_pkg.__file__).parent / SAM2_CONFIGS[name]).read_text())


@pytest.mark.parametrize("name", sorted(SAM2_SPECS))
def test_spec_matches_upstream_config(name: str) -> None:
    cfg = _config(name)["model"]
    trunk = cfg["image_encoder"]["trunk"]
    spec = SAM2_SPECS[name]
    # Hiera's own defaults where a config leaves them out
    assert spec.encoder_embed_dim == trunk["embed_dim"]
    assert spec.encoder_num_heads == trunk["num_heads"]
    assert spec.encoder_stages == tuple(trunk.get("stages", (2, 3, 16, 3)))
    assert spec.encoder_global_attn_indexes == tuple(trunk.get("global_att_blocks", (12, 16, 20)))
    assert spec.encoder_window_spec == tuple(trunk.get("window_spec", (8, 4, 14, 7)))
    assert spec.encoder_window_pos_embed_size == tuple(
        trunk.get("window_pos_embed_bkg_spatial_size", (14, 14))
    )
    assert spec.encoder_q_pool == trunk.get("q_pool", 3)
    assert spec.channel_list == cfg["image_encoder"]["neck"]["backbone_channel_list"]
    assert spec.image_size == cfg["image_size"]
    assert spec.num_maskmem == cfg["num_maskmem"]
    assert spec.memory_attention_layers == cfg["memory_attention"]["num_layers"]
    layer = cfg["memory_attention"]["layer"]
    assert spec.memory_attention_dim_feedforward == layer["dim_feedforward"]
    assert spec.mem_dim == cfg["memory_encoder"]["out_dim"] == layer["cross_attention"]["kv_in_dim"]
    for flag in ("no_obj_embed_spatial", "proj_tpos_enc_in_obj_ptrs"):
        assert getattr(spec, flag) == cfg.get(flag, False), flag
    for flag in ("add_tpos_enc_to_obj_ptrs", "use_signed_tpos_enc_to_obj_ptrs"):
        default = flag == "add_tpos_enc_to_obj_ptrs"  # SAM2Base's defaults
        assert getattr(spec, flag) == cfg.get(flag, default), flag
    # what the builder fixes is what every released config says
    assert cfg["image_encoder"]["scalp"] == 1
    assert cfg["image_encoder"]["neck"]["d_model"] == 256
    assert cfg["image_encoder"]["neck"]["fpn_top_down_levels"] == [2, 3]
    assert cfg["image_encoder"]["neck"]["fpn_interp_model"] == "nearest"
    assert cfg["memory_attention"]["layer"]["self_attention"]["feat_sizes"] == [64, 64]
    assert cfg["sigmoid_scale_for_mem_enc"] == 20.0 and cfg["sigmoid_bias_for_mem_enc"] == -10.0
    for flag in (
        "use_mask_input_as_output_without_sam",
        "directly_add_no_mem_embed",
        "use_high_res_features_in_sam",
        "multimask_output_in_sam",
        "iou_prediction_use_sigmoid",
        "use_obj_ptrs_in_encoder",
        "pred_obj_scores",
        "pred_obj_scores_mlp",
        "fixed_no_obj_ptr",
        "multimask_output_for_tracking",
        "use_multimask_token_for_obj_ptr",
        "use_mlp_for_obj_ptr_proj",
    ):
        assert cfg[flag] is True, flag
    assert cfg["multimask_min_pt_num"] == 0 and cfg["multimask_max_pt_num"] == 1


def _official_shapes(name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[int, ...]]:
    """The official model's state-dict shapes, built by upstream's code on the meta device
    (Hiera's drop-path schedule reads ``linspace(...).item()``: that one is made on the CPU)."""
    from hydra import compose
    from hydra.utils import instantiate

    linspace = torch.linspace
    monkeypatch.setattr(torch, "linspace", lambda *a, **k: linspace(*a, **{**k, "device": "cpu"}))
    ensure_hydra()
    cfg = compose(config_name=SAM2_CONFIGS[name])
    with torch.device("meta"):
        model = instantiate(cfg.model, _recursive_=True)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", sorted(SAM2_SPECS))
def test_layout_and_detection(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    official = _official_shapes(name, monkeypatch)
    assert convert_sam2.official_layout(SAM2_SPECS[name]) == official
    assert convert_sam2.detect_model_type(official) == name


def test_detection_refuses_an_unknown_size() -> None:
    spec = dataclasses.replace(SAM2_SPECS["sam2.1_hiera_tiny"], encoder_stages=(1, 2, 5, 2))
    shapes = convert_sam2.official_layout(spec)
    with pytest.raises(ValueError, match=r"width 96 and stages \[1, 2, 5, 2\].*Sam2Spec"):
        convert_sam2.detect_model_type(shapes)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"encoder_stages": (1, 2, 7)}, "4 positive depths"),
        ({"encoder_global_attn_indexes": (5, 99)}, r"\[99\] outside"),
        ({"image_size": 1000}, "multiple of 32"),
        ({"no_obj_embed_spatial": "yes"}, "true or false"),
        ({"add_tpos_enc_to_obj_ptrs": False}, "needs add_tpos_enc_to_obj_ptrs"),
        ({"mem_dim": 48}, "divide the hidden width"),
        ({"encoder_embed_dim": 0}, "must be positive"),
    ],
)
def test_spec_checks(change: dict, message: str) -> None:
    base = SAM2_SPECS["sam2.1_hiera_tiny"].to_dict()
    with pytest.raises(ValueError, match=message):
        Sam2Spec.from_dict({**base, **change})


def test_spec_round_trip() -> None:
    for spec in SAM2_SPECS.values():
        assert Sam2Spec.from_dict(spec.to_dict()) == spec
