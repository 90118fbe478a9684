"""SAM 3 checkpoint conversion (paddle_sam.convert.sam3): the released key list, the model's
layout, torch-saved files in the released layout (complex64 freqs_cis, bf16/fp16), the CLI,
and refusals that name the offending key."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_sam import cli
from paddle_sam.convert import sam3 as conv
from paddle_sam.convert.checkpoint import convert_checkpoint, read_sam3_weights
from paddle_sam.convert.core import (
    CheckpointFormatError,
    CheckpointMismatchError,
    model_shapes,
    read_sidecar,
)
from paddle_sam.convert.torch_reader import load_state_dict
from paddle_sam.loading.sam3 import build_sam3_image_model
from paddle_sam.loading.sam_v1 import load_sam
from tests.helpers.specs import one_layer_sam3_spec

TINY = one_layer_sam3_spec()


@pytest.fixture(scope="module")
def released(reference_dir) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{key: (shape, dtype)}`` of the released sam3.pt (1465 keys)."""
    lines = (reference_dir / "sam3_checkpoint_keys.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["key", "shape", "dtype"]
    rows = [line.split("\t") for line in lines[1:]]
    return {k: (tuple(ast.literal_eval(s)), d) for k, s, d in rows}


def test_every_released_key_is_mapped_or_dropped(released):
    assert len(released) == 1465
    steps = conv.plan(released)
    sources = {src for src, _ in steps.values()}
    dropped = set(released) - sources
    assert dropped == {k for k in released if k.endswith(".freqs_cis")}
    assert len(dropped) == 32 and {released[k][1] for k in dropped} == {"complex64"}
    assert all(conv.dropped_reason(k) for k in dropped)
    fused = [k for k in released if k.endswith((".in_proj_weight", ".in_proj_bias"))]
    assert len(steps) == len(released) - len(dropped) + 2 * len(fused)
    assert not any(k.startswith(("detector.", "tracker.")) for k in steps)
    n_tracker = sum(k.startswith("tracker.") for k in released)
    assert sum(k.startswith(conv.INTERACTIVE_PREFIX) for k in steps) == n_tracker

    shapes = conv.converted_shapes(released)
    trunk = "backbone.vision_backbone.trunk."
    text = "backbone.language_backbone.encoder."
    assert shapes[trunk + "blocks.0.attn.qkv.weight"] == (1024, 3072)  # Linear: transposed
    assert shapes[trunk + "blocks.0.mlp.fc1.weight"] == (1024, 4736)
    assert shapes[trunk + "pos_embed"] == (1, 577, 1024)
    assert shapes[trunk + "patch_embed.proj.weight"] == (1024, 3, 14, 14)  # conv: as is
    for p in ("q", "k", "v"):
        assert shapes[f"{text}transformer.resblocks.3.attn.{p}_proj.weight"] == (1024, 1024)
        assert shapes[f"{text}transformer.resblocks.3.attn.{p}_proj.bias"] == (1024,)
        assert shapes[f"transformer.decoder.layers.0.ca_text.{p}_proj.weight"] == (256, 256)
    assert shapes[text + "text_projection"] == (1024, 512)  # plain parameter, used as x @ P
    assert shapes[text + "token_embedding.weight"] == (49408, 1024)  # embedding: as is
    assert shapes["transformer.decoder.query_embed.weight"] == (200, 256)
    assert shapes["geometry_encoder.boxes_direct_project.weight"] == (4, 256)
    tracker = conv.INTERACTIVE_PREFIX
    assert shapes[tracker + "maskmem_backbone.fuser.layers.0.pwconv1.weight"] == (256, 1024)
    assert shapes[tracker + "transformer.encoder.layers.0.cross_attn_image.k_proj.weight"] == (
        64,
        256,
    )
    assert shapes[tracker + "sam_prompt_encoder.point_embeddings.2.weight"] == (1, 256)
    assert shapes[tracker + "sam_mask_decoder.mask_tokens.weight"] == (4, 256)


def test_released_layout_matches_the_model(released):
    """The converted image-model part equals our full-size model's layout, key for key and
    shape for shape; Linear weights are exactly the transposed ones; and the released layout
    we derive from our model (for random test files) is the released key list."""
    expected = conv.expected_layout()
    shapes = conv.converted_shapes(released)
    interactive = tuple(conv.INTERACTIVE_ONLY)
    assert {k: v for k, v in shapes.items() if not k.startswith(interactive)} == expected

    with paddle.LazyGuard(), pytest.warns(UserWarning, match="random"):
        model = build_sam3_image_model()
    linear = {f"{n}.weight" for n, m in model.named_sublayers() if isinstance(m, paddle.nn.Linear)}
    transposed = {
        k
        for k, (_, s) in conv.plan(released).items()
        if s.transpose and not k.startswith(interactive)
    }
    assert transposed == linear

    detector = {k: v for k, v in released.items() if k.startswith("detector.")}
    assert conv.released_layout() == detector


def _tiny_official(
    tmp_path: Path, seed: int = 0, dtype=None, extra=None, enable_inst_interactivity=False
) -> Path:
    """A tiny checkpoint in the released layout, written by torch.save: {"model": {...}}."""
    torch = pytest.importorskip("torch")
    state = conv.random_released_state_dict(TINY, seed, enable_inst_interactivity)
    tensors = {k: torch.from_numpy(v) for k, v in state.items()}
    if dtype is not None:
        tensors = {k: v if v.is_complex() else v.to(dtype) for k, v in tensors.items()}
    tensors.update(extra or {})
    path = tmp_path / "sam3_tiny.pt"
    torch.save({"model": tensors, "epoch": 3}, path)
    return path


def test_torch_file_round_trip(tmp_path):
    """torch.save'd released layout -> our reader -> converter: values exact, freqs_cis
    complex64 read and dropped, tracker keys renamed, and the model loads them strictly."""
    torch = pytest.importorskip("torch")
    tracker = {"tracker.sam_mask_decoder.iou_token.weight": torch.randn(1, 32)}
    path = _tiny_official(tmp_path, seed=1, extra=tracker)
    raw = load_state_dict(path)
    assert (
        raw["detector.backbone.vision_backbone.trunk.blocks.0.attn.freqs_cis"].dtype == np.complex64
    )
    want = conv.random_released_state_dict(TINY, 1)
    state = conv.convert_state_dict(raw)
    # the tables we write (and the model recomputes) are upstream's: window 4x4, global 8x8
    vitdet = pytest.importorskip("sam3.model.vitdet")
    for block, (side, scale) in enumerate(((4, 1.0), (8, 0.5))):
        key = f"detector.backbone.vision_backbone.trunk.blocks.{block}.attn.freqs_cis"
        ref = vitdet.compute_axial_cis(dim=16, end_x=side, end_y=side, scale_pos=scale).numpy()
        np.testing.assert_allclose(raw[key], ref, atol=1e-6)

    trunk = "backbone.vision_backbone.trunk.blocks.1.attn."
    np.testing.assert_array_equal(
        state[trunk + "qkv.weight"], want["detector." + trunk + "qkv.weight"].T
    )
    text = "backbone.language_backbone.encoder.transformer.resblocks.0.attn."
    fused_w = want["detector." + text + "in_proj_weight"]
    fused_b = want["detector." + text + "in_proj_bias"]
    for i, p in enumerate("qkv"):
        np.testing.assert_array_equal(
            state[f"{text}{p}_proj.weight"], fused_w[32 * i : 32 * (i + 1)].T
        )
        np.testing.assert_array_equal(state[f"{text}{p}_proj.bias"], fused_b[32 * i : 32 * (i + 1)])
    assert not any(k.endswith("freqs_cis") for k in state)
    assert conv.INTERACTIVE_PREFIX + "sam_mask_decoder.iou_token.weight" in state
    assert all(v.dtype == np.float32 for v in state.values())

    model = build_sam3_image_model(spec=TINY, checkpoint_path=path)
    ours = {k: v.numpy() for k, v in model.state_dict().items()}
    selected = conv.select_for_model(state, model_shapes(model))
    assert set(ours) == set(selected)
    for k, v in selected.items():
        np.testing.assert_array_equal(ours[k], v, err_msg=k)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_half_precision_is_upcast(tmp_path, dtype_name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    path = _tiny_official(tmp_path, seed=2, dtype=dtype)
    state = conv.convert_state_dict(load_state_dict(path))
    want = conv.random_released_state_dict(TINY, 2)
    key = "backbone.vision_backbone.convs.0.conv_3x3.weight"
    exact = torch.from_numpy(want["detector." + key]).to(dtype).float().numpy()
    assert state[key].dtype == np.float32
    np.testing.assert_array_equal(state[key], exact)
    lin = "transformer.decoder.layers.0.linear1.weight"
    exact = torch.from_numpy(want["detector." + lin]).to(dtype).float().numpy().T
    np.testing.assert_array_equal(state[lin], exact)


def test_convert_checkpoint_and_cli(tmp_path, capsys):
    path = _tiny_official(tmp_path, seed=3)
    dst = tmp_path / "tiny.pdparams"
    meta = convert_checkpoint(path, dst, spec=TINY, progress=False)  # type detected
    assert meta["model_type"] == "sam3" and meta["format"] == "paddle-sam/sam3"
    assert read_sidecar(dst)["spec"]["encoder_embed_dim"] == 32 and meta["interactive"] is False
    direct = build_sam3_image_model(spec=TINY, checkpoint_path=path)
    converted = build_sam3_image_model(spec=TINY, checkpoint_path=dst)
    d, c = direct.state_dict(), converted.state_dict()
    assert set(d) == set(c)
    for k in d:
        np.testing.assert_array_equal(d[k].numpy(), c[k].numpy(), err_msg=k)

    meta2 = convert_checkpoint(path, tmp_path / "t2.pdparams", "sam3", spec=TINY, progress=False)
    assert meta2["source"]["sha256"] == meta["source"]["sha256"]
    with pytest.raises(ValueError, match="SAM 3 model"):
        load_sam(dst)
    # the CLI converts at the released size: a tiny file is refused with the keys named
    out = tmp_path / "cli.pdparams"
    assert cli.main(["convert", str(path), str(out), "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "checkpoint does not match the model" in err and "pos_embed" in err
    assert not out.exists()


def test_cli_converts_released_size_layout(tmp_path, capsys, monkeypatch):
    """``paddle-sam convert`` with and without ``--model-type sam3`` on a file in the released
    layout; the "released" sizes are made tiny here so the test stays small."""
    from paddle_sam.convert import checkpoint

    monkeypatch.setattr(checkpoint, "SAM3_SPEC", TINY)
    path = _tiny_official(tmp_path, seed=4)
    for i, extra in enumerate(([], ["--model-type", "sam3"])):
        out = tmp_path / f"cli{i}.pdparams"
        assert cli.main(["convert", str(path), str(out), "--quiet", *extra]) == 0, (
            capsys.readouterr()
        )
        side = json.loads((tmp_path / f"cli{i}.pdparams.json").read_text())
        assert side["model_type"] == "sam3" and side["spec"]["encoder_depth"] == 2
        assert "sam3" in capsys.readouterr().out


def _expected(spec):
    with paddle.LazyGuard(), pytest.warns(UserWarning):
        return model_shapes(build_sam3_image_model(spec=spec))


def test_refusals_name_the_key(tmp_path):
    good = conv.random_released_state_dict(TINY, 5)
    expected = _expected(TINY)
    conv.convert_state_dict(good, expected)  # sanity: the good one passes

    key = "detector.transformer.decoder.layers.0.linear2.bias"
    bad = dict(good, **{key: good[key].astype(np.int32)})
    with pytest.raises(CheckpointMismatchError, match=f"{key}: dtype int32 is not floating"):
        conv.convert_state_dict(bad)

    key = "detector.segmentation_head.cross_attend_prompt.in_proj_weight"
    bad = dict(good, **{key: good[key][:-1]})
    with pytest.raises(CheckpointMismatchError, match=f"{key}: fused in_proj .* split in 3"):
        conv.convert_state_dict(bad)

    missing = dict(good)
    del missing["detector.dot_prod_scoring.hs_proj.bias"]
    with pytest.raises(
        CheckpointMismatchError, match=r"1 missing keys:\s+dot_prod_scoring.hs_proj"
    ):
        conv.convert_state_dict(missing, expected)

    extra = dict(good, **{"detector.transformer.decoder.surprise": np.zeros(3, np.float32)})
    with pytest.raises(
        CheckpointMismatchError, match=r"unexpected keys:\s+transformer.decoder.surprise"
    ):
        conv.convert_state_dict(extra, expected)

    key = "detector.backbone.vision_backbone.trunk.ln_pre.weight"
    wrong = dict(good, **{key: np.ones(7, np.float32)})
    with pytest.raises(CheckpointMismatchError, match=r"trunk.ln_pre.weight: checkpoint \[7\]"):
        conv.convert_state_dict(wrong, expected)

    foreign = dict(good, **{"image_encoder.pos_embed": np.zeros(3, np.float32)})
    with pytest.raises(
        CheckpointMismatchError, match="not a SAM 3 checkpoint layout.*image_encoder"
    ):
        conv.convert_state_dict(foreign)

    # two source keys landing on one target key
    key = "detector.backbone.language_backbone.encoder.transformer.resblocks.0.attn."
    clash = dict(good, **{key + "q_proj.weight": np.zeros((32, 32), np.float32)})
    with pytest.raises(CheckpointMismatchError, match="q_proj.weight, as .*in_proj_weight does"):
        conv.convert_state_dict(clash)


def test_malformed_and_mismatched_files(tmp_path):
    torch = pytest.importorskip("torch")
    path = _tiny_official(tmp_path, seed=6)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointFormatError, match="truncated.pt"):
        read_sam3_weights(truncated)
    with pytest.raises(CheckpointFormatError, match="not a valid .pdparams"):
        bad = tmp_path / "bad.pdparams"
        bad.write_bytes(b"nonsense")
        read_sam3_weights(bad)
    v1 = tmp_path / "sam_v1.pth"
    torch.save({"image_encoder.pos_embed": torch.zeros(1, 4, 4, 8)}, v1)
    with pytest.raises(CheckpointMismatchError, match="not a SAM 3 checkpoint"):
        read_sam3_weights(v1)
    with pytest.raises(CheckpointMismatchError, match="not a SAM 3 checkpoint layout"):
        convert_checkpoint(v1, tmp_path / "o.pdparams", "sam3", progress=False)
    with pytest.raises(CheckpointMismatchError, match="vit_b does not match .* sam3"):
        convert_checkpoint(path, tmp_path / "o.pdparams", "vit_b", progress=False)
    with pytest.raises(ValueError, match="'vit_b' and spec .* do not describe SAM 3"):
        convert_checkpoint(path, tmp_path / "o.pdparams", "vit_b", spec=TINY, progress=False)
    assert not list(tmp_path.glob("o.pdparams*"))


def test_released_tracker_heads_are_mapped(released):
    """With instance interactivity, the released ``tracker.*`` keys of the SAM heads map onto
    our ``Sam3TrackerHeads`` key for key and shape for shape; the rest of the tracker is the
    video-only modules (VIDEO_ONLY), converted but left out when loading an image model; and
    the tracker layout we derive from our model is the released one."""
    expected = conv.expected_layout(enable_inst_interactivity=True)
    shapes = conv.converted_shapes(released)
    video = tuple(conv.VIDEO_ONLY)
    assert {k: v for k, v in shapes.items() if not k.startswith(video)} == expected
    dropped = {k for k in shapes if k.startswith(video)}
    assert dropped and all(k.startswith(conv.INTERACTIVE_PREFIX) for k in dropped)
    for prefix in video:  # each group exists in the released file
        assert any(k.startswith(prefix) for k in dropped), prefix
    heads = [k for k in expected if k.startswith(conv.INTERACTIVE_PREFIX)]
    assert len(heads) == sum(
        k.startswith(("tracker.sam_", "tracker.no_mem_embed")) for k in released
    )

    ours = conv.released_layout(enable_inst_interactivity=True)
    want = {k: v for k, v in released.items() if k in ours or k.startswith("detector.")}
    assert ours == want
    rest = {k for k in released if k.startswith("tracker.") and k not in ours}
    assert {conv.rename(k) for k in rest} == dropped


def test_interactive_weights_load_from_released_layout(tmp_path):
    """A released-layout file holding the tracker's heads: converted by the CLI (heads checked
    strictly), loaded with enable_inst_interactivity=True, values exact; a model without
    interactivity loads the same file. Video-only tracker keys are checked as a whole tracker:
    two of them alone (and a model too small for a tracker) are refused."""
    torch = pytest.importorskip("torch")
    state = conv.random_released_state_dict(TINY, 3, enable_inst_interactivity=True)
    assert any(k.startswith("tracker.sam_mask_decoder.") for k in state)
    extra = {
        "tracker.maskmem_tpos_enc": torch.randn(7, 1, 1, 64),
        "tracker.transformer.encoder.layers.0.self_attn.q_proj.weight": torch.randn(256, 256),
    }
    path = _tiny_official(tmp_path, seed=3, extra=extra, enable_inst_interactivity=True)
    with pytest.raises(CheckpointMismatchError, match="video tracker weights"):
        convert_checkpoint(path, tmp_path / "partial.pdparams", spec=TINY)
    path = _tiny_official(tmp_path, seed=3, enable_inst_interactivity=True)
    out = tmp_path / "sam3_tiny.pdparams"

    meta = convert_checkpoint(path, out, spec=TINY)
    assert meta["interactive"] is True
    model = build_sam3_image_model(spec=TINY, checkpoint_path=out, enable_inst_interactivity=True)
    got = {k: v.numpy() for k, v in model.state_dict().items()}
    key = "sam_mask_decoder.output_hypernetworks_mlps.0.layers.0.weight"
    np.testing.assert_array_equal(got[conv.INTERACTIVE_PREFIX + key], state["tracker." + key].T)
    key = "sam_prompt_encoder.point_embeddings.1.weight"
    np.testing.assert_array_equal(got[conv.INTERACTIVE_PREFIX + key], state["tracker." + key])
    assert not any(k.startswith(tuple(conv.VIDEO_ONLY)) for k in got)
    plain = build_sam3_image_model(spec=TINY, checkpoint_path=out)
    assert not any(k.startswith(conv.INTERACTIVE_PREFIX) for k in plain.state_dict())

    # a tracker head missing from the file is named
    broken = {k: v for k, v in state.items() if "iou_token" not in k}
    bad = tmp_path / "broken.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in broken.items()}}, bad)
    with pytest.raises(CheckpointMismatchError, match="iou_token"):
        convert_checkpoint(bad, tmp_path / "broken.pdparams", spec=TINY)


def test_convert_consuming_the_source_gives_the_same_weights():
    """``consume=True`` (loading and converting the released file) empties the source dict as
    it goes and converts exactly what the copying conversion does."""
    raw = conv.random_released_state_dict(TINY, 3)
    raw["detector.backbone.vision_backbone.trunk.blocks.0.attn.freqs_cis"] = np.zeros(
        (4, 8), np.complex64
    )  # dropped by the plan: cleared too
    want = conv.convert_state_dict(dict(raw))
    source = dict(raw)
    got = conv.convert_state_dict(source, consume=True)
    assert source == {}
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key].dtype == np.float32 and got[key].flags.c_contiguous
        np.testing.assert_array_equal(got[key], value)
