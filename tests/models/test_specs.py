"""Model specs: one convention for both families (validated, plain dicts and back, attached to
the built model), and sidecars written before the SAM 3 fields were renamed still read."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import paddle
import pytest

from paddle_sam.convert.checkpoint import convert_checkpoint
from paddle_sam.convert.core import CheckpointFormatError, read_sidecar, sidecar_path
from paddle_sam.convert.sam3 import random_released_state_dict
from paddle_sam.loading.sam3 import load_sam3
from paddle_sam.models.sam3.build_sam3 import SAM3_SPEC, Sam3Spec, build_sam3_model
from paddle_sam.models.sam_v1.build_sam import SAM_SPECS, SamSpec, build_sam_model

TINY3 = Sam3Spec(
    image_size=56,
    pretrain_image_size=28,
    encoder_embed_dim=16,
    encoder_depth=2,
    encoder_num_heads=2,
    window_size=2,
    encoder_global_attn_indexes=(1,),
    text_width=16,
    text_heads=2,
    text_layers=1,
    context_length=8,
    d_model=16,
    num_heads=2,
    dim_feedforward=32,
    encoder_layers=1,
    decoder_layers=1,
    num_queries=4,
    geometry_layers=1,
)


@pytest.mark.parametrize("spec", [SAM_SPECS["vit_b"], SAM_SPECS["vit_tiny_synthetic"], SAM3_SPEC])
def test_dict_round_trip_through_json(spec):
    d = json.loads(json.dumps(spec.to_dict()))  # tuples become lists in a sidecar
    assert type(spec).from_dict(d) == spec


def test_same_names_for_the_same_things():
    shared = {
        "image_size",
        "vit_patch_size",
        "encoder_embed_dim",
        "encoder_depth",
        "encoder_num_heads",
        "encoder_global_attn_indexes",
        "window_size",
        "mlp_ratio",
    }
    for cls in (SamSpec, Sam3Spec):
        assert shared <= {f.name for f in dataclasses.fields(cls)}, cls.__name__


@pytest.mark.parametrize("cls", [SamSpec, Sam3Spec])
def test_unknown_fields_and_bad_sizes_are_refused(cls):
    base = SAM_SPECS["vit_b"] if cls is SamSpec else SAM3_SPEC
    with pytest.raises(ValueError, match="unknown .*fields.*'bogus'"):
        cls.from_dict(base.to_dict() | {"bogus": 1})
    with pytest.raises(ValueError, match="must be a JSON object"):
        cls.from_dict([1, 2])
    for field, value, message in (
        ("encoder_depth", 0, "positive.*encoder_depth=0"),
        ("encoder_num_heads", -2, "positive.*encoder_num_heads=-2"),
        ("vit_patch_size", 7 if cls is SamSpec else 5, "not a multiple of the patch size"),
        ("encoder_num_heads", 7, "must divide"),
        ("encoder_global_attn_indexes", (99,), "outside"),
    ):
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(base, **{field: value})


def test_older_sam3_field_names_are_read():
    old = {
        "img_size": 56,
        "pretrain_img_size": 28,
        "patch_size": 14,
        "vit_embed_dim": 16,
        "vit_depth": 2,
        "vit_num_heads": 2,
        "vit_mlp_ratio": 4.625,
        "global_att_blocks": [1],
    }
    rest = {k: v for k, v in TINY3.to_dict().items() if k not in Sam3Spec.RENAMED.values()}
    assert Sam3Spec.from_dict(old | rest) == TINY3


def test_specs_are_attached_to_built_models():
    with paddle.LazyGuard():
        sam = build_sam_model(SAM_SPECS["vit_b"])
        sam3 = build_sam3_model(TINY3)
    assert sam.spec == SAM_SPECS["vit_b"] and sam3.spec == TINY3


def test_sidecar_with_older_names_loads(tmp_path):
    """A SAM 3 .pdparams converted before the rename (its sidecar's spec under the old names)
    still loads at its own sizes."""
    from safetensors.numpy import save_file

    src = tmp_path / "sam3_tiny.safetensors"
    save_file(random_released_state_dict(TINY3, seed=1), str(src))
    dst = tmp_path / "sam3_tiny.pdparams"
    convert_checkpoint(src, dst, "sam3", spec=TINY3, progress=False)
    meta = read_sidecar(dst)
    inverse = {new: old for old, new in Sam3Spec.RENAMED.items()}
    meta["spec"] = {inverse.get(k, k): v for k, v in meta["spec"].items()}
    sidecar_path(dst).write_text(json.dumps(meta))
    model = load_sam3(dst)
    assert model.spec == TINY3
    sidecar_path(dst).write_text("[1, 2]")
    with pytest.raises(CheckpointFormatError, match="JSON object"):
        read_sidecar(dst)


def test_conv_stem_is_checked_and_keeps_the_token_grid(tmp_path):
    """``conv_stem`` (not in upstream; empty in every released spec) puts stride-2 convolutions
    before a patch projection that covers the rest of the patch: the trunk's token grid, and so
    every later shape, stay as without it; the spec's field survives the sidecar."""
    from paddle_sam.convert.core import save_pdparams, sidecar_meta

    for value in (((8, 0),), ((8, 2), (8, 2)), ((-1, 2),)):
        with pytest.raises(ValueError, match="positive widths and strides whose product"):
            dataclasses.replace(TINY3, conv_stem=value)
    with pytest.raises(ValueError, match="width, stride"):
        dataclasses.replace(TINY3, conv_stem=(8, 2))
    spec = dataclasses.replace(TINY3, conv_stem=((4, 1), (8, 2)))
    paddle.seed(0)
    model = build_sam3_model(spec)
    trunk = model.backbone.vision_backbone.trunk
    assert trunk.patch_embed.proj.weight.shape == [16, 8, 7, 7]
    x = paddle.rand([2, 3, 56, 56])
    (out,) = trunk(x)
    assert out.shape == [2, 16, 4, 4]
    stem_out = trunk.stem(x)
    assert stem_out.shape == [2, 8, 28, 28] and float(stem_out.min()) >= 0  # ReLU'd
    model.eval()  # batch norm's running statistics from here on
    dst = tmp_path / "stem.pdparams"
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    save_pdparams(state, dst, sidecar_meta("sam3", "stem", spec, {"file": None}))
    loaded = load_sam3(dst)
    assert loaded.spec == spec and not loaded.training
    with paddle.no_grad():
        (again,) = loaded.backbone.vision_backbone.trunk(x)
        (first,) = trunk(x)
    assert float((again - first).abs().max()) == 0.0


def test_layer_scale_init():
    """encoder_init_values (upstream ViT's init_values; None in the released model) puts a
    LayerScale at that value on both branches of every trunk block."""
    with pytest.raises(ValueError, match="encoder_init_values must be positive"):
        dataclasses.replace(TINY3, encoder_init_values=0.0)
    assert not hasattr(
        build_sam3_model(TINY3).backbone.vision_backbone.trunk.blocks[0].ls1, "gamma"
    )
    spec = Sam3Spec.from_dict(
        json.loads(json.dumps(TINY3.to_dict() | {"encoder_init_values": 0.01}))
    )
    for block in build_sam3_model(spec).backbone.vision_backbone.trunk.blocks:
        for ls in (block.ls1, block.ls2):
            np.testing.assert_array_equal(ls.gamma.numpy(), np.full([16], 0.01, np.float32))
