"""SAM 2 / 2.1 checkpoint conversion (paddle_sam.convert.sam2): official-layout files written
with torch.save (``{"model": state_dict}``, float32 or float16) at a reduced size, the CLI with
the size detected, the sidecar and what the loaders make of it, and refusals that name the
offending key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from paddle_sam import cli
from paddle_sam.convert import checkpoint
from paddle_sam.convert import sam2 as conv
from paddle_sam.convert.checkpoint import checked_sidecar_spec, convert_checkpoint
from paddle_sam.convert.core import (
    CheckpointFormatError,
    CheckpointMismatchError,
    pdparams_shapes,
    read_pdparams,
    read_sidecar,
)
from paddle_sam.convert.source import sniff
from paddle_sam.loading.sam2 import build_sam2, checkpoint_spec, load_sam2
from paddle_sam.models.sam2.build_sam import SAM2_SPECS
from tests.helpers.sam2_ref import reduced_spec

torch = pytest.importorskip("torch")

SPEC = reduced_spec("2.1")
SPEC_2_0 = reduced_spec("2.0")


def _official(tmp: Path, spec=SPEC, name: str = "tiny.pt", dtype=None, edit=None) -> Path:
    state = conv.random_official_state_dict(spec, seed=3)
    if edit is not None:
        edit(state)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    path = tmp / name
    torch.save({"model": tensors}, path)
    return path


@pytest.fixture
def released_are_reduced(monkeypatch):
    """The "released" tiny sizes made reduced, so the CLI's size detection runs on small
    files (as the SAM 3 conversion tests do)."""
    specs = {"sam2.1_hiera_tiny": SPEC, "sam2_hiera_tiny": SPEC_2_0}
    monkeypatch.setattr(conv, "SAM2_SPECS", specs)
    monkeypatch.setattr(checkpoint, "SAM2_SPECS", specs)
    from paddle_sam.loading import sam2 as loading_sam2

    monkeypatch.setattr(loading_sam2, "SAM2_SPECS", specs)


@pytest.mark.parametrize("version", ["2.1", "2.0"])
def test_cli_detects_the_size(tmp_path, capsys, released_are_reduced, version):
    name = "sam2.1_hiera_tiny" if version == "2.1" else "sam2_hiera_tiny"
    src = _official(tmp_path, SPEC if version == "2.1" else SPEC_2_0, dtype=torch.float16)
    dst = tmp_path / "out.pdparams"
    assert cli.main(["convert", str(src), str(dst), "--quiet"]) == 0, capsys.readouterr()
    assert name in capsys.readouterr().out
    meta = read_sidecar(dst)
    assert meta["format"] == "paddle-sam/sam2" and meta["model_type"] == name
    assert meta["source"]["layout"] == "official" and len(meta["source"]["sha256"]) == 64
    assert type(SPEC).from_dict(meta["spec"]) == conv.SAM2_SPECS[name]
    source = sniff(dst)
    assert source.family == "sam2" and {"image", "clicks", "video"} <= source.parts
    assert sniff(src).family == "sam2" and sniff(src).layout == "official"
    # every key, Linear weights transposed, float32
    state = read_pdparams(dst)
    shapes, linear = conv.expected_layout(conv.SAM2_SPECS[name])
    assert {k: tuple(v.shape) for k, v in state.items()} == shapes
    raw = torch.load(src, weights_only=True)["model"]
    for key in ("image_encoder.trunk.blocks.0.attn.qkv.weight", "sam_mask_decoder.conv_s0.weight"):
        want = raw[key].float().numpy()
        want = want.T if key in linear else want
        np.testing.assert_array_equal(state[key], want)
        assert state[key].dtype == np.float32
    assert "image_encoder.trunk.blocks.0.attn.qkv.weight" in linear
    # the size of the converted file, from its sidecar, and of the official one, detected
    assert checkpoint_spec(dst) == checkpoint_spec(src) == conv.SAM2_SPECS[name]
    model = load_sam2(dst)
    assert model.spec == conv.SAM2_SPECS[name]
    assert (model.no_obj_embed_spatial is not None) == (version == "2.1")


def test_cli_refuses_a_wrong_model_type(tmp_path, capsys, released_are_reduced):
    src = _official(tmp_path)
    out = tmp_path / "out.pdparams"
    assert cli.main(["convert", str(src), str(out), "--model-type", "sam2_hiera_tiny"]) == 2
    err = capsys.readouterr().err
    assert "sam2_hiera_tiny" in err and "looks like sam2.1_hiera_tiny" in err
    assert cli.main(["convert", str(src), str(out), "--model-type", "vit_b"]) == 2
    assert "SAM 2" in capsys.readouterr().err
    assert not out.exists()


def test_unknown_size_is_named(tmp_path, capsys):
    src = _official(tmp_path)  # reduced: not a released size
    assert cli.main(["convert", str(src), str(tmp_path / "o.pdparams"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "width 32 and stages [1, 1, 2, 1]" in err and "Sam2Spec" in err


def _drop(key):
    return lambda state: state.pop(key)


def _add(key):
    return lambda state: state.__setitem__(key, np.zeros(3, np.float32))


def _reshape(key):
    return lambda state: state.__setitem__(key, state[key][..., :-1])


def _as_int(key):
    return lambda state: state.__setitem__(key, state[key].astype(np.int64))


@pytest.mark.parametrize(
    "edit, key, message",
    [
        (_drop, "memory_encoder.fuser.layers.1.gamma", "1 missing keys"),
        (_add, "image_encoder.trunk.extra", "1 unexpected keys"),
        (_reshape, "image_encoder.trunk.pos_embed", r"checkpoint \[1, 32, 4, 3\]"),
        (_as_int, "sam_mask_decoder.iou_token.weight", "not floating point"),
    ],
)
def test_refusals_name_the_key(tmp_path, edit, key, message):
    src = _official(tmp_path, edit=edit(key))
    with pytest.raises(CheckpointMismatchError, match=message) as info:
        convert_checkpoint(src, tmp_path / "o.pdparams", spec=SPEC, progress=False)
    assert key in str(info.value) and str(src) in str(info.value)
    assert not (tmp_path / "o.pdparams").exists()


def test_official_file_loads_directly(tmp_path):
    """build_sam2 reads the official file itself (converted in memory), the same weights as
    a converted .pdparams; a config of another size is refused before anything is built."""
    src = _official(tmp_path)
    convert_checkpoint(src, tmp_path / "c.pdparams", spec=SPEC, progress=False)
    direct = build_sam2(SPEC, src).state_dict()
    converted = build_sam2(SPEC, tmp_path / "c.pdparams").state_dict()
    assert direct.keys() == converted.keys()
    for k in direct:
        np.testing.assert_array_equal(direct[k].numpy(), converted[k].numpy())
    with pytest.raises(CheckpointMismatchError, match="other sizes.*encoder_embed_dim 96"):
        build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", tmp_path / "c.pdparams")
    with pytest.raises(ValueError, match="unknown SAM 2 config"):
        build_sam2("sam2.1_hiera_huge.yaml")
    with pytest.raises(ValueError, match="hydra overrides"):
        build_sam2(SPEC, hydra_overrides_extra=["++model.image_size=512"])


def test_a_lying_sidecar_is_refused(tmp_path):
    src = _official(tmp_path)
    dst = tmp_path / "c.pdparams"
    convert_checkpoint(src, dst, spec=SPEC, progress=False)
    side = dst.with_name(dst.name + ".json")
    meta = json.loads(side.read_text())
    meta["spec"] = SAM2_SPECS["sam2.1_hiera_large"].to_dict()
    side.write_text(json.dumps(meta))
    with pytest.raises(CheckpointFormatError, match="does not belong to these weights"):
        checked_sidecar_spec(dst, read_sidecar(dst), type(SPEC))
    meta["spec"] = dataclasses.replace(SPEC, encoder_window_pos_embed_size=(5, 5)).to_dict()
    side.write_text(json.dumps(meta))
    with pytest.raises(CheckpointFormatError, match="does not match the weights"):
        load_sam2(dst)
    assert set(pdparams_shapes(dst)) == set(conv.expected_layout(SPEC)[0])
