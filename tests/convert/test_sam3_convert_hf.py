"""SAM 3 conversion from the HF transformers layout (paddle_sam.convert.sam3_hf), checked
against transformers itself (test-only): the state dict of its ``Sam3Model`` built at our
reduced size, HF's own original -> HF conversion steps when its script can be imported, and
refusals that name the key."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from paddle_sam import cli
from paddle_sam.convert import sam3 as conv
from paddle_sam.convert import sam3_hf
from paddle_sam.convert.checkpoint import convert_checkpoint, detect_family, read_sam3_weights
from paddle_sam.convert.core import CheckpointFormatError, CheckpointMismatchError, read_sidecar
from paddle_sam.loading.sam3 import build_sam3_image_model
from tests.helpers.specs import one_layer_sam3_spec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

POINTS = tuple(
    f"geometry_encoder.{n}."
    for n in ("points_direct_project", "points_pool_project", "points_pos_enc_project")
)
POS_EMBED = "backbone.vision_backbone.trunk.pos_embed"
TINY = one_layer_sam3_spec()


def hf_config(spec=TINY):
    """transformers' ``Sam3Config`` for a :class:`Sam3Spec`."""
    from transformers import Sam3Config
    from transformers.models.sam3.configuration_sam3 import Sam3VisionConfig, Sam3ViTConfig

    vit = Sam3ViTConfig(
        hidden_size=spec.encoder_embed_dim,
        intermediate_size=int(spec.encoder_embed_dim * spec.mlp_ratio),
        num_hidden_layers=spec.encoder_depth,
        num_attention_heads=spec.encoder_num_heads,
        image_size=spec.image_size,
        patch_size=spec.vit_patch_size,
        window_size=spec.window_size,
        global_attn_indexes=list(spec.encoder_global_attn_indexes),
        pretrain_image_size=spec.pretrain_image_size,
    )
    side = spec.image_size // spec.vit_patch_size
    vision = Sam3VisionConfig(
        backbone_config=vit,
        fpn_hidden_size=spec.d_model,
        scale_factors=list(spec.scale_factors),
        backbone_feature_sizes=[[side * 4] * 2, [side * 2] * 2, [side] * 2],
    )
    text = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.text_width,
        intermediate_size=4 * spec.text_width,
        projection_dim=512,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        max_position_embeddings=spec.context_length,
        hidden_act="gelu",
    )
    common = dict(hidden_size=spec.d_model, num_attention_heads=spec.num_heads)
    ffn = dict(common, intermediate_size=spec.dim_feedforward)
    return Sam3Config(
        vision_config=vision,
        text_config=text,
        geometry_encoder_config=dict(ffn, num_layers=spec.geometry_layers),
        detr_encoder_config=dict(ffn, num_layers=spec.encoder_layers),
        detr_decoder_config=dict(ffn, num_layers=spec.decoder_layers, num_queries=spec.num_queries),
        mask_decoder_config=dict(common, num_upsampling_stages=spec.upsampling_stages),
    )


@pytest.fixture(scope="module")
def hf_state() -> dict[str, np.ndarray]:
    """The state dict of transformers' ``Sam3Model`` at the TINY size, every tensor random."""
    from transformers import Sam3Model

    torch.manual_seed(0)
    model = Sam3Model(hf_config())
    gen = torch.Generator().manual_seed(1)
    return {k: torch.randn(v.shape, generator=gen).numpy() for k, v in model.state_dict().items()}


def save_hf(state: dict[str, np.ndarray], path: Path, prefix: str = "") -> Path:
    safetensors_torch.save_file(
        {prefix + k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()},
        str(path),
        metadata={"format": "pt"},
    )
    return path


def test_hf_model_layout_maps_onto_ours(hf_state):
    """Every key of HF's Sam3Model maps (no rule left over, none unused), and the result is
    exactly the released layout of our model minus the freqs_cis tables (which HF recomputes,
    as we do) and the second neck (a Sam3Model has none)."""
    got = sam3_hf.hf_to_released(hf_state)
    want = {
        k: s
        for k, (s, _) in conv.released_layout(TINY).items()
        if not k.endswith(".freqs_cis") and ".sam2_convs." not in k
    }
    assert set(got) == set(want)
    assert {k: v.shape for k, v in got.items()} == want
    steps = conv.plan({k: (v.shape, v.dtype) for k, v in got.items()})
    assert not any(k.startswith(conv.INTERACTIVE_PREFIX) for k in steps)


def test_values_follow_hf_semantics(hf_state):
    """Tensor by tensor: q/k/v re-fused in order, text_projection transposed back, the cls row
    of pos_embed added as zeros, point projections NaN, everything else as is."""
    got = sam3_hf.hf_to_released(hf_state)
    vit = "vision_encoder.backbone.layers.1.attention."
    np.testing.assert_array_equal(
        got["detector.backbone.vision_backbone.trunk.blocks.1.attn.qkv.weight"],
        np.concatenate([hf_state[f"{vit}{p}_proj.weight"] for p in "qkv"]),
    )
    txt = "text_encoder.text_model.encoder.layers.0.self_attn."
    np.testing.assert_array_equal(
        got[
            "detector.backbone.language_backbone.encoder.transformer.resblocks.0.attn.in_proj_bias"
        ],
        np.concatenate([hf_state[f"{txt}{p}_proj.bias"] for p in "qkv"]),
    )
    np.testing.assert_array_equal(
        got["detector.backbone.language_backbone.encoder.text_projection"],
        hf_state["text_encoder.text_projection.weight"].T,
    )
    pos = got["detector." + POS_EMBED]
    assert pos.shape == (1, 17, 32)
    np.testing.assert_array_equal(
        pos[:, 1:], hf_state["vision_encoder.backbone.embeddings.position_embeddings"]
    )
    assert not pos[:, 0].any()
    for prefix in POINTS:
        assert np.isnan(got[f"detector.{prefix}weight"]).all()
    np.testing.assert_array_equal(
        got["detector.backbone.vision_backbone.convs.0.dconv_2x2_1.weight"],
        hf_state["vision_encoder.neck.fpn_layers.0.scale_layers.2.weight"],
    )
    np.testing.assert_array_equal(
        got["detector.backbone.vision_backbone.convs.1.dconv_2x2.bias"],
        hf_state["vision_encoder.neck.fpn_layers.1.scale_layers.0.bias"],
    )
    np.testing.assert_array_equal(
        got["detector.transformer.decoder.bbox_embed.layers.2.weight"],
        hf_state["detr_decoder.box_head.layer3.weight"],
    )


def test_cli_converts_hf_file_folder_and_index(hf_state, tmp_path, capsys, monkeypatch):
    """``paddle-sam convert model.safetensors`` (auto-detected and --model-type sam3), the
    hub's ``detector_model.*`` layout with tracker keys, a folder and a sharded index; the
    model loads each strictly, and build_sam3_image_model reads the HF file directly."""
    from paddle_sam.convert import checkpoint

    monkeypatch.setattr(checkpoint, "SAM3_SPEC", TINY)
    src = save_hf(hf_state, tmp_path / "model.safetensors")
    assert detect_family(src) == "sam3"
    outs = []
    for i, extra in enumerate(([], ["--model-type", "sam3"])):
        out = tmp_path / f"hf{i}.pdparams"
        assert cli.main(["convert", str(src), str(out), "--quiet", *extra]) == 0, (
            capsys.readouterr()
        )
        assert "hf layout" in capsys.readouterr().out
        outs.append(out)
    side = read_sidecar(outs[0])
    assert side["model_type"] == "sam3" and side["source"]["layout"] == "hf"
    assert side["interactive"] is False and side["source"]["dropped"] == {}
    assert set(side["source"]["filled"]) == {POS_EMBED, *POINTS}

    want = conv.convert_state_dict(sam3_hf.hf_to_released(hf_state))
    model = build_sam3_image_model(spec=TINY, checkpoint_path=outs[0])
    direct = build_sam3_image_model(spec=TINY, checkpoint_path=src)
    loaded, direct_sd = model.state_dict(), direct.state_dict()
    assert set(loaded) == set(want) == set(direct_sd)
    for k, v in want.items():
        np.testing.assert_array_equal(loaded[k].numpy(), v, err_msg=k)
        np.testing.assert_array_equal(direct_sd[k].numpy(), v, err_msg=k)

    # the hub layout (Sam3VideoModel): detector_model.*, tracker_neck.*, tracker_model.*
    hub = {"detector_model." + k: v for k, v in hf_state.items()}
    neck = "vision_encoder.neck.fpn_layers."
    hub.update(
        {
            "tracker_neck.fpn_layers." + k[len(neck) :]: v
            for k, v in hf_state.items()
            if k.startswith(neck)
        }
    )
    hub["tracker_model.mask_decoder.iou_token.weight"] = np.ones((1, 32), np.float32)
    hub_dir = tmp_path / "sam3_hub"
    hub_dir.mkdir()
    names = sorted(hub)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for shard, keys in shards.items():
        save_hf({k: hub[k] for k in keys}, hub_dir / shard)
    index = {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (hub_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    (hub_dir / "config.json").write_text("{}")
    for i, source in enumerate((hub_dir, hub_dir / "model.safetensors.index.json")):
        out = tmp_path / f"hub{i}.pdparams"
        meta = convert_checkpoint(source, out, progress=False)
        assert meta["source"]["layout"] == "hf" and set(meta["source"]["shards"]) == set(shards)
        ((reason, n),) = meta["source"]["dropped"].items()
        assert n == 1 and "tracker" in reason
        got = build_sam3_image_model(spec=TINY, checkpoint_path=out).state_dict()
        for k, v in want.items():
            np.testing.assert_array_equal(got[k].numpy(), v, err_msg=k)
    converted = read_sam3_weights(hub_dir)
    np.testing.assert_array_equal(
        converted["backbone.vision_backbone.sam2_convs.2.conv_3x3.weight"],
        hf_state["vision_encoder.neck.fpn_layers.2.proj2.weight"],
    )
    # no tracker heads from HF: an interactive model is refused, its missing keys named
    with pytest.raises(CheckpointMismatchError, match=r"missing keys:\s+inst_interactive_pred"):
        build_sam3_image_model(spec=TINY, checkpoint_path=hub_dir, enable_inst_interactivity=True)


def test_refusals_name_the_key(hf_state, tmp_path):
    good = dict(hf_state)
    sam3_hf.hf_to_released(good)

    key = "detr_decoder.layers.0.text_cross_attn.k_proj.weight"
    bad = {k: v for k, v in good.items() if k != key}
    with pytest.raises(
        CheckpointMismatchError, match=r"text_cross_attn\.[qv]_proj\.weight: k_proj missing"
    ):
        sam3_hf.hf_to_released(bad)

    key = "mask_decoder.prompt_cross_attn.v_proj.bias"
    bad = dict(good, **{key: good[key][:-1]})
    with pytest.raises(
        CheckpointMismatchError, match=r"prompt_cross_attn\.q_proj\.bias: q/k/v projections differ"
    ):
        sam3_hf.hf_to_released(bad)

    bad = dict(good, **{"detr_decoder.surprise.weight": np.zeros(3, np.float32)})
    with pytest.raises(CheckpointMismatchError, match="detr_decoder.surprise.weight: no rule maps"):
        sam3_hf.hf_to_released(bad)

    # renamed fine but absent from the model: the strict check names the released key
    missing = {k: v for k, v in good.items() if k != "dot_product_scoring.query_proj.bias"}
    path = save_hf(missing, tmp_path / "missing.safetensors")
    with pytest.raises(
        CheckpointMismatchError, match=r"missing keys:\s+dot_prod_scoring.hs_proj.bias"
    ):
        convert_checkpoint(path, tmp_path / "m.pdparams", spec=TINY, progress=False)

    key = "vision_encoder.backbone.layer_norm.weight"
    path = save_hf(dict(good, **{key: np.ones(7, np.float32)}), tmp_path / "shape.safetensors")
    with pytest.raises(CheckpointMismatchError, match=r"trunk.ln_pre.weight: checkpoint \[7\]"):
        convert_checkpoint(path, tmp_path / "s.pdparams", spec=TINY, progress=False)

    key = "detr_decoder.output_layer_norm.bias"
    path = save_hf(dict(good, **{key: np.zeros(32, np.int32)}), tmp_path / "int.safetensors")
    with pytest.raises(CheckpointMismatchError, match=r"decoder.norm.bias: dtype int32"):
        convert_checkpoint(path, tmp_path / "i.pdparams", spec=TINY, progress=False)

    src = save_hf(good, tmp_path / "model.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(CheckpointFormatError, match="truncated.safetensors"):
        convert_checkpoint(truncated, tmp_path / "t.pdparams", spec=TINY, progress=False)

    folder = tmp_path / "empty_folder"
    folder.mkdir()
    with pytest.raises(CheckpointFormatError, match="neither model.safetensors nor"):
        convert_checkpoint(folder, tmp_path / "f.pdparams", spec=TINY, progress=False)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"x.weight": "model-1.safetensors"}}))
    with pytest.raises(CheckpointFormatError, match="shard 'model-1.safetensors' not found"):
        convert_checkpoint(index, tmp_path / "f.pdparams", spec=TINY, progress=False)
    assert not list(tmp_path.glob("*.pdparams"))


def _hf_convert_script():
    """transformers' own ``convert_sam3_to_hf`` (original -> HF), if importable: from the
    installed package (transformers does not ship it in its wheel or sdist as of 5.24) or from
    a source checkout's file named by ``SAM3_HF_CONVERT_SCRIPT``."""
    try:
        return importlib.import_module("transformers.models.sam3.convert_sam3_to_hf")
    except ImportError:
        pass
    path = os.environ.get("SAM3_HF_CONVERT_SCRIPT")
    if not path:
        pytest.skip(
            "transformers' convert_sam3_to_hf is not importable; set SAM3_HF_CONVERT_SCRIPT"
        )
    spec = importlib.util.spec_from_file_location("convert_sam3_to_hf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hf_conversion_script_round_trip(tmp_path):
    """A random released-layout state dict taken to the HF layout by transformers' own
    conversion steps (their key map, cls-row strip, q/k/v split, text_projection transpose,
    loaded into their Sam3Model and saved by save_pretrained), then converted by us: every
    tensor equals the direct conversion of the released file, except the ones HF cannot hold
    (FILLED: the unused cls row, the point projections) or that its Sam3Model leaves out (the
    second neck)."""
    hf = _hf_convert_script()
    from transformers import Sam3Model

    released = conv.random_released_state_dict(TINY, seed=7)
    original = {k[len("detector.") :]: torch.from_numpy(v) for k, v in released.items()}
    mapping = hf.convert_old_keys_to_new_keys(list(original))
    new = {}
    for old, value in original.items():  # as convert_sam3_checkpoint does
        key = mapping.get(old, old)
        new[key] = (
            value[:, 1:, :]
            if key == "vision_encoder.backbone.embeddings.position_embeddings"
            else value
        )
    new = hf.split_qkv(new)
    new["text_encoder.text_projection.weight"] = new["text_encoder.text_projection.weight"].T
    model = Sam3Model(hf_config())
    missing, unexpected = model.load_state_dict(new, strict=False)
    assert missing == []
    # what HF's Sam3Model does not hold: RoPE tables, point projections, the second neck
    # (sam2_convs: its Sam3VideoModel keeps that as tracker_neck)
    hf_lacks = (
        "rotary_emb.rope_embeddings",
        "geometry_encoder.points_",
        "backbone.vision_backbone.sam2_convs.",
    )
    assert all(k.endswith(hf_lacks[0]) or k.startswith(hf_lacks[1:]) for k in unexpected)
    model.save_pretrained(tmp_path / "hf")

    ours = read_sam3_weights(tmp_path / "hf")
    want = conv.convert_state_dict(released)
    assert set(ours) == {k for k in want if not k.startswith(hf_lacks[2])}
    for k, v in want.items():
        if k.startswith(hf_lacks[2]):
            continue
        if k.startswith(POINTS):
            assert np.isnan(ours[k]).all(), k
        elif k == POS_EMBED:
            np.testing.assert_array_equal(ours[k][:, 1:], v[:, 1:])
        else:
            np.testing.assert_array_equal(ours[k], v, err_msg=k)


@pytest.mark.parametrize(
    "boxes",
    [((0.45, 0.5, 0.3, 0.4, 1),), ((0.45, 0.5, 0.3, 0.4, 1), (0.7, 0.3, 0.2, 0.2, 0))],
    ids=["text+box", "text+positive+negative"],
)
def test_outputs_match_transformers_model(boxes, tmp_path):
    """End to end on the same weights: transformers' own ``Sam3Model`` and our model built
    straight from its safetensors give the same query logits, boxes, presence and masks for a
    text prompt with boxes. HF's text encoder masks the padding tokens where upstream relies on
    causal attention alone: the valid tokens (a prefix) get the same features either way, and
    the heads mask the padding out.

    Without boxes the two differ by design: transformers 5.24 skips the geometry encoder when
    a prompt has no box, so its prompt lacks the geometry encoder's cls token that the
    official code (and this port, tested against it) always appends; measured here, query
    logits then differ by up to 4e-3 while every backbone level and the valid text features
    agree to 1e-5."""
    import paddle
    from transformers import Sam3Model

    from paddle_sam.models.sam3.sam3_image import FindStage

    torch.manual_seed(0)
    hf = Sam3Model(hf_config()).eval()
    gen = torch.Generator().manual_seed(3)
    state = {}
    for k, v in hf.state_dict().items():  # HF's init, every float tensor perturbed
        if v.is_floating_point():
            v = v + 0.05 * (v.abs().mean() + 0.1) * torch.randn(v.shape, generator=gen)
        state[k] = v
    hf.load_state_dict(state)
    path = save_hf({k: v.numpy() for k, v in state.items()}, tmp_path / "model.safetensors")
    ours = build_sam3_image_model(spec=TINY, checkpoint_path=path)
    ours.eval()

    rng = np.random.default_rng(0)
    pixels = rng.uniform(-1, 1, (1, 3, TINY.image_size, TINY.image_size)).astype(np.float32)
    text = "a red car"
    lang = ours.backbone.language_backbone
    ids = np.asarray(lang.tokenizer([text], context_length=lang.context_length), np.int64)
    valid = ids != 0  # the tokenizer pads with 0 after the end token
    prompt = ours._get_dummy_prompt()
    for *box, label in boxes:
        prompt.append_boxes(paddle.to_tensor(box).reshape([1, 1, 4]), paddle.to_tensor([[label]]))
    with paddle.no_grad():
        backbone_out = ours.backbone.forward_image(paddle.to_tensor(pixels))
        backbone_out.update(ours.backbone.forward_text([text]))
        o = ours.forward_grounding(
            backbone_out=backbone_out,
            find_input=FindStage(img_ids=paddle.to_tensor([0]), text_ids=paddle.to_tensor([0])),
            geometric_prompt=prompt,
        )
    kw = {
        "input_boxes": torch.tensor([[b[:4] for b in boxes]], dtype=torch.float32),
        "input_boxes_labels": torch.tensor([[b[4] for b in boxes]]),
    }
    with torch.no_grad():
        r = hf(
            pixel_values=torch.from_numpy(pixels),
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(valid.astype(np.int64)),
            **kw,
        )
    pairs = {
        "pred_logits": (r.pred_logits, o["pred_logits"].squeeze(-1)),
        "pred_boxes (xyxy)": (r.pred_boxes, o["pred_boxes_xyxy"]),
        "presence": (r.presence_logits.reshape([-1]), o["presence_logit_dec"].reshape([-1])),
        "pred_masks": (r.pred_masks, o["pred_masks"]),
    }
    for name, (a, b) in pairs.items():
        a, b = a.numpy(), b.numpy()
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert np.isfinite(a).all() and (a.size == 1 or a.std() > 1e-3), name  # not constants
        # measured here: at most 1.2e-7 on boxes, 7e-8 on logits, 3.4e-7 on mask logits
        # (outputs of magnitude 0.004-0.76)
        np.testing.assert_allclose(b, a, atol=2e-6, rtol=1e-4, err_msg=name)
