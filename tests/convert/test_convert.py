"""Checkpoint conversion (paddle_sam.convert.sam_v1 / .checkpoint): key maps against the
official key lists, round trips from real torch files, the HF layout, refusals and strict
loading."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_sam.convert.checkpoint import convert_checkpoint
from paddle_sam.convert.core import (
    CONVERTER_VERSION,
    CheckpointFormatError,
    CheckpointMismatchError,
    UnknownCheckpointFormatError,
    UnsafeCheckpointError,
    read_sidecar,
    sidecar_path,
)
from paddle_sam.convert.sam_v1 import (
    convert_state_dict,
    detect_model_type,
    expected_layout,
    random_official_state_dict,
)
from paddle_sam.loading.sam_v1 import build_sam, load_sam, sam_model_registry
from paddle_sam.models.sam_v1.build_sam import SAM_SPECS, SamSpec
from tests.conftest import find_reference_dir
from tests.helpers.specs import TINY

REFERENCE = find_reference_dir()


def _torch_layout(spec: SamSpec) -> dict[str, tuple[int, ...]]:
    shapes, linear = expected_layout(spec)
    return {k: (s[::-1] if k in linear else s) for k, s in shapes.items()}


def _paddle_layout(state: dict[str, np.ndarray], spec: SamSpec) -> dict[str, np.ndarray]:
    """Official torch-layout arrays -> what the converter must produce (float32, Linear.T)."""
    _, linear = expected_layout(spec)
    return {k: (v.T if k in linear else v).astype(np.float32) for k, v in state.items()}


def _model_state(model) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in model.state_dict().items()}


def _assert_states_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == np.float32, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _save_np(state: dict[str, np.ndarray], path: Path) -> Path:
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(path))
    return path


def _pdparams_state(path: Path) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in paddle.load(str(path), return_numpy=True).items()}


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def torch_ref():
    """Tiny official torch model with every weight perturbed, and its state dict in numpy."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("segment_anything")
    from paddle_sam.align.reference import build_reference_sam, numpy_state_dict, perturb_weights_

    torch.manual_seed(0)
    model = build_reference_sam(TINY)
    perturb_weights_(model, seed=1, scale=0.05)
    return model, numpy_state_dict(model)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("convert")


@pytest.fixture(scope="module")
def official_pth(torch_ref, work) -> Path:
    import torch

    path = work / "tiny_official.pth"
    torch.save(torch_ref[0].state_dict(), path)
    return path


@pytest.fixture(scope="module")
def converted(official_pth, work) -> Path:
    dst = work / "tiny.pdparams"
    convert_checkpoint(official_pth, dst, spec=TINY, progress=False)
    return dst


@pytest.fixture(scope="module")
def random_state() -> dict[str, np.ndarray]:
    """Torch-free official-layout weights for the refusal tests."""
    return random_official_state_dict(TINY, seed=3)


@pytest.fixture(scope="module")
def random_st(random_state, work) -> Path:
    return _save_np(random_state, work / "random_official.safetensors")


# ---------------------------------------------------------------------------- 1. key map


def _read_tsv(model_type: str) -> dict[str, tuple[int, ...]]:
    path = REFERENCE / f"sam_{model_type}_checkpoint_keys.tsv"
    if not path.is_file():
        pytest.skip(f"reference key list {path} not found (the shared/ folder next to the repo)")
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == ["key", "shape"]
    out = {}
    for line in lines[1:]:
        key, shape = line.split("\t")
        out[key] = tuple(json.loads(shape))
    return out


@pytest.mark.parametrize("model_type", ["vit_b", "vit_l", "vit_h"])
def test_expected_layout_matches_official_key_list(model_type):
    reference = _read_tsv(model_type)
    ours = _torch_layout(SAM_SPECS[model_type])
    assert sorted(set(reference) - set(ours)) == []  # keys we would not map
    assert sorted(set(ours) - set(reference)) == []  # keys we would miss
    bad = {k: (reference[k], ours[k]) for k in reference if reference[k] != ours[k]}
    assert bad == {}
    assert len(reference) == len(ours)


@pytest.mark.parametrize("model_type", ["vit_b", "vit_l", "vit_h"])
def test_detect_model_type_from_official_shapes(model_type):
    reference = _read_tsv(model_type)
    state = {k: np.broadcast_to(np.float32(0), s) for k, s in reference.items()}
    assert detect_model_type(state) == model_type


def test_detect_model_type_refuses_unknown_size():
    state = {k: np.broadcast_to(np.float32(0), s) for k, s in _torch_layout(TINY).items()}
    with pytest.raises(
        CheckpointMismatchError, match=f"embed dim 64 and depth {TINY.encoder_depth}"
    ):
        detect_model_type(state)
    with pytest.raises(CheckpointMismatchError, match="patch_embed.proj.weight"):
        detect_model_type({"foo.weight": np.zeros(3, np.float32)})


def test_random_official_state_dict_layout_and_seed():
    a = random_official_state_dict(TINY, seed=0)
    assert {k: v.shape for k, v in a.items()} == _torch_layout(TINY)
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in a.values())
    b = random_official_state_dict(TINY, seed=0)
    c = random_official_state_dict(TINY, seed=1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["image_encoder.pos_embed"], c["image_encoder.pos_embed"])


# ---------------------------------------------------------------------------- 2. round trip


def test_round_trip_weights_equal_torch(torch_ref, converted):
    _, state = torch_ref
    model = build_sam(TINY, checkpoint=converted)
    _assert_states_equal(_model_state(model), _paddle_layout(state, TINY))
    # the Linear transposition really happened (a non-square Linear proves the direction)
    w = model.image_encoder.blocks[0].attn.qkv.weight.numpy()
    assert w.shape == (64, 192)
    np.testing.assert_array_equal(w, state["image_encoder.blocks.0.attn.qkv.weight"].T)


def test_round_trip_predictions_equal_official(torch_ref, converted):
    import torch
    from segment_anything import SamPredictor as TorchPredictor

    from paddle_sam import SamPredictor

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:120, 0:170]
    image = np.stack([(xx * 1.5) % 256, (yy * 2.0) % 256, (xx + yy) % 256], axis=-1)
    image = np.clip(image + rng.normal(0, 8, image.shape), 0, 255).astype(np.uint8)
    point, label = np.array([[60.0, 40.0]]), np.array([1])

    ref = TorchPredictor(torch_ref[0])
    with torch.no_grad():
        ref.set_image(image)
        ref_masks, ref_iou, ref_low = ref.predict(point, label, multimask_output=True)
    ours = SamPredictor(build_sam(TINY, checkpoint=converted))
    ours.set_image(image)
    masks, iou, low = ours.predict(point, label, multimask_output=True)

    assert masks.shape == ref_masks.shape == (3, 120, 170)
    np.testing.assert_allclose(low, ref_low, atol=2e-4, rtol=0)
    np.testing.assert_allclose(iou, ref_iou, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(masks, ref_masks)
    assert 0 < masks.sum() < masks.size  # the comparison is not between two empty masks


def test_legacy_torch_file(torch_ref, work):
    import torch

    src = work / "legacy.pth"
    torch.save(torch_ref[0].state_dict(), src, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(src)
    dst = work / "legacy.pdparams"
    meta = convert_checkpoint(src, dst, spec=TINY, progress=False)
    assert meta["source"]["layout"] == "official"
    _assert_states_equal(_pdparams_state(dst), _paddle_layout(torch_ref[1], TINY))


def test_safetensors_from_torch(torch_ref, work):
    from safetensors.torch import save_file

    src = work / "official.safetensors"
    save_file({k: v.contiguous() for k, v in torch_ref[0].state_dict().items()}, str(src))
    dst = work / "from_st.pdparams"
    convert_checkpoint(src, dst, spec=TINY, progress=False)
    _assert_states_equal(_pdparams_state(dst), _paddle_layout(torch_ref[1], TINY))


@pytest.mark.parametrize(
    "dtype,fmt", [("float16", "pth"), ("bfloat16", "pth"), ("bfloat16", "safetensors")]
)
def test_half_precision_sources_upcast(torch_ref, work, dtype, fmt):
    import torch

    tdtype = getattr(torch, dtype)
    half = {k: v.to(tdtype).contiguous() for k, v in torch_ref[0].state_dict().items()}
    src = work / f"half_{dtype}.{fmt}"
    if fmt == "pth":
        torch.save(half, src)
    else:
        from safetensors.torch import save_file

        save_file(half, str(src))
    dst = work / f"half_{dtype}_{fmt}.pdparams"
    convert_checkpoint(src, dst, spec=TINY, progress=False)
    want = _paddle_layout({k: v.float().numpy() for k, v in half.items()}, TINY)
    got = _pdparams_state(dst)
    _assert_states_equal(got, want)
    # rounding to half precision did change the values: the test sees the source dtype
    full = _paddle_layout(torch_ref[1], TINY)
    assert not np.array_equal(got["image_encoder.pos_embed"], full["image_encoder.pos_embed"])
    build_sam(TINY, checkpoint=dst)  # loads strictly


def test_sidecar_contents(official_pth, converted):
    meta = read_sidecar(converted)
    assert sidecar_path(converted) == converted.with_name("tiny.pdparams.json")
    assert meta == json.loads(sidecar_path(converted).read_text())
    assert meta["format"] == "paddle-sam/sam_v1"
    assert meta["model_type"] == "custom"
    assert SamSpec.from_dict(meta["spec"]) == TINY
    assert meta["source"]["file"] == official_pth.name
    assert meta["source"]["sha256"] == hashlib.sha256(official_pth.read_bytes()).hexdigest()
    assert meta["source"]["layout"] == "official"
    assert meta["converter_version"] == CONVERTER_VERSION
    assert meta["paddle_version"] == paddle.__version__
    # the sidecar is what lets load_sam rebuild a custom size without being told
    model = load_sam(converted)
    assert model.spec == TINY


def test_sidecar_for_detected_model_type(work, monkeypatch):
    """A standard size is detected and named in the sidecar (vit_b swapped for a tiny spec)."""
    monkeypatch.setitem(SAM_SPECS, "vit_b", TINY)
    src = _save_np(random_official_state_dict(TINY, seed=5), work / "detect.safetensors")
    dst = work / "detect.pdparams"
    meta = convert_checkpoint(src, dst, progress=False)
    assert meta["model_type"] == "vit_b"
    assert read_sidecar(dst)["model_type"] == "vit_b"


# ---------------------------------------------------------------------------- 3. HF layout

# The rename table of transformers' models/sam/convert_sam_to_hf.py (KEYS_TO_MODIFY_MAPPING),
# applied the way that script applies it: in order, substring replacement on the running key.
HF_KEYS_TO_MODIFY = [
    ("iou_prediction_head.layers.0", "iou_prediction_head.proj_in"),
    ("iou_prediction_head.layers.1", "iou_prediction_head.layers.0"),
    ("iou_prediction_head.layers.2", "iou_prediction_head.proj_out"),
    ("mask_decoder.output_upscaling.0", "mask_decoder.upscale_conv1"),
    ("mask_decoder.output_upscaling.1", "mask_decoder.upscale_layer_norm"),
    ("mask_decoder.output_upscaling.3", "mask_decoder.upscale_conv2"),
    ("mask_downscaling.0", "mask_embed.conv1"),
    ("mask_downscaling.1", "mask_embed.layer_norm1"),
    ("mask_downscaling.3", "mask_embed.conv2"),
    ("mask_downscaling.4", "mask_embed.layer_norm2"),
    ("mask_downscaling.6", "mask_embed.conv3"),
    ("point_embeddings", "point_embed"),
    ("pe_layer.positional_encoding_gaussian_matrix", "shared_embedding.positional_embedding"),
    ("image_encoder", "vision_encoder"),
    ("neck.0", "neck.conv1"),
    ("neck.1", "neck.layer_norm1"),
    ("neck.2", "neck.conv2"),
    ("neck.3", "neck.layer_norm2"),
    ("patch_embed.proj", "patch_embed.projection"),
    (".norm", ".layer_norm"),
    ("blocks", "layers"),
]
HF_HYPERNET = re.compile(r".*.output_hypernetworks_mlps.(\d+).layers.(\d+).*")
HF_PE = "prompt_encoder.shared_embedding.positional_embedding"
HF_PE_TIED = "shared_image_embedding.positional_embedding"


def official_to_hf(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for key, value in state.items():
        for old, new in HF_KEYS_TO_MODIFY:
            if old in key:
                key = key.replace(old, new)
        m = HF_HYPERNET.match(key)
        if m:
            layer = int(m.group(2))
            key = key.replace(
                f"layers.{layer}", {0: "proj_in", 1: "layers.0", 2: "proj_out"}[layer]
            )
        assert key not in out, key
        out[key] = value
    out[HF_PE_TIED] = out[HF_PE]
    return out


def test_hf_key_names_look_like_transformers():
    hf = official_to_hf(random_official_state_dict(TINY, seed=0))
    for key in [
        "vision_encoder.patch_embed.projection.weight",
        "vision_encoder.layers.0.layer_norm1.weight",
        "vision_encoder.layers.1.attn.rel_pos_h",
        "vision_encoder.neck.layer_norm2.bias",
        "prompt_encoder.mask_embed.conv3.weight",
        "prompt_encoder.point_embed.0.weight",
        "mask_decoder.upscale_layer_norm.weight",
        "mask_decoder.iou_prediction_head.proj_in.weight",
        "mask_decoder.iou_prediction_head.layers.0.weight",
        "mask_decoder.output_hypernetworks_mlps.3.proj_out.bias",
        "mask_decoder.transformer.layer_norm_final_attn.weight",
        "mask_decoder.transformer.layers.1.layer_norm4.weight",
        HF_PE,
        HF_PE_TIED,
    ]:
        assert key in hf, key
    assert not any("blocks" in k or ".norm" in k for k in hf)


@pytest.mark.parametrize("pe_keys", ["both", HF_PE, HF_PE_TIED])
def test_hf_layout_converts_like_official(random_state, random_st, work, pe_keys):
    hf = official_to_hf(random_state)
    if pe_keys != "both":
        hf.pop(HF_PE_TIED if pe_keys == HF_PE else HF_PE)
    src = _save_np(hf, work / f"hf_{pe_keys.split('.')[0]}.safetensors")
    dst, ref = work / f"hf_{pe_keys.split('.')[0]}.pdparams", work / "hf_ref_official.pdparams"
    meta = convert_checkpoint(src, dst, spec=TINY, progress=False)
    assert meta["source"]["layout"] == "hf"
    if not ref.exists():
        convert_checkpoint(random_st, ref, spec=TINY, progress=False)
    _assert_states_equal(_pdparams_state(dst), _pdparams_state(ref))
    _assert_states_equal(_pdparams_state(dst), _paddle_layout(random_state, TINY))


def test_hf_layout_refuses_untied_positional_embedding(random_state, work):
    hf = official_to_hf(random_state)
    hf[HF_PE_TIED] = hf[HF_PE] + 1.0
    src = _save_np(hf, work / "hf_untied.safetensors")
    dst = work / "hf_untied.pdparams"
    with pytest.raises(CheckpointMismatchError, match="positional_embedding.*differ"):
        convert_checkpoint(src, dst, spec=TINY, progress=False)
    assert not dst.exists() and not sidecar_path(dst).exists()


# ---------------------------------------------------------------------------- 4. refusals


def _convert_refused(src: Path, dst: Path, exc, match: str | None = None, **kw):
    with pytest.raises(exc, match=match) as info:
        convert_checkpoint(src, dst, progress=False, **kw)
    assert not dst.exists() and not sidecar_path(dst).exists()
    return str(info.value)


def test_refuses_missing_keys(random_state, work):
    state = dict(random_state)
    del state["mask_decoder.iou_token.weight"]
    del state["image_encoder.blocks.1.attn.rel_pos_w"]
    msg = _convert_refused(
        _save_np(state, work / "missing.safetensors"),
        work / "missing.pdparams",
        CheckpointMismatchError,
        spec=TINY,
    )
    assert "2 missing keys" in msg
    assert "mask_decoder.iou_token.weight" in msg
    assert "image_encoder.blocks.1.attn.rel_pos_w" in msg
    assert "unexpected" not in msg


def test_refuses_unexpected_keys(random_state, work):
    state = dict(random_state)
    state["mask_decoder.extra_head.weight"] = np.zeros((2, 2), np.float32)
    msg = _convert_refused(
        _save_np(state, work / "extra.safetensors"),
        work / "extra.pdparams",
        CheckpointMismatchError,
        spec=TINY,
    )
    assert "1 unexpected keys" in msg and "mask_decoder.extra_head.weight" in msg
    assert "missing" not in msg


def test_refuses_misshaped_tensor(random_state, work):
    state = dict(random_state)
    state["image_encoder.blocks.0.mlp.lin1.weight"] = np.zeros((256, 32), np.float32)
    msg = _convert_refused(
        _save_np(state, work / "shape.safetensors"),
        work / "shape.pdparams",
        CheckpointMismatchError,
        spec=TINY,
    )
    assert "image_encoder.blocks.0.mlp.lin1.weight" in msg
    assert "[256, 32]" in msg and "[256, 64]" in msg  # the file's shape and the expected one


def test_refuses_model_type_contradicting_weights(work):
    """A file that looks like vit_b (width 768, 12 blocks) converted as vit_l."""
    state = {"image_encoder.patch_embed.proj.weight": np.zeros((768, 3, 16, 16), np.float32)}
    state.update(
        {f"image_encoder.blocks.{i}.norm1.weight": np.ones(1, np.float32) for i in range(12)}
    )
    src = _save_np(state, work / "looks_vit_b.safetensors")
    msg = _convert_refused(
        src, work / "looks_vit_b.pdparams", CheckpointMismatchError, model_type="vit_l"
    )
    assert "vit_l" in msg and "vit_b" in msg


def test_refuses_spec_contradicting_model_type(random_st, work):
    _convert_refused(
        random_st, work / "both.pdparams", ValueError, match="vit_b", model_type="vit_b", spec=TINY
    )


def test_refuses_wrong_suffix(random_st, work):
    for name in ("out.pth", "out.pdparams.tmp", "out"):
        _convert_refused(random_st, work / name, ValueError, match=r"\.pdparams", spec=TINY)


def test_refuses_existing_destination(random_st, work):
    dst = work / "exists.pdparams"
    dst.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="overwrite"):
        convert_checkpoint(random_st, dst, spec=TINY, progress=False)
    assert dst.read_bytes() == b"precious"
    assert not sidecar_path(dst).exists()
    # an existing sidecar alone is also protected
    dst2 = work / "exists2.pdparams"
    sidecar_path(dst2).write_text("{}")
    with pytest.raises(FileExistsError):
        convert_checkpoint(random_st, dst2, spec=TINY, progress=False)
    assert not dst2.exists() and sidecar_path(dst2).read_text() == "{}"
    # overwrite=True replaces both
    convert_checkpoint(random_st, dst, spec=TINY, overwrite=True, progress=False)
    assert read_sidecar(dst)["source"]["file"] == random_st.name
    build_sam(TINY, checkpoint=dst)


def test_refuses_output_equal_to_input(random_st, work):
    src = work / "same.pdparams"
    shutil.copyfile(random_st, src)
    for kw in ({}, {"overwrite": True}):
        with pytest.raises(ValueError, match="is the input"):
            convert_checkpoint(src, src, spec=TINY, progress=False, **kw)
        assert src.read_bytes() == random_st.read_bytes()
    link = work / "link.pdparams"
    link.symlink_to(src)
    with pytest.raises(ValueError, match="is the input"):
        convert_checkpoint(src, link, spec=TINY, progress=False, overwrite=True)
    assert src.read_bytes() == random_st.read_bytes()


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_refuses_malicious_pickle(work):
    marker = work / "pwned"
    src = work / "evil.pth"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"w": _Evil(marker)}, protocol=2))
        zf.writestr("archive/version", "3\n")
    # the payload is real: plain pickle would run it
    assert b"system" in zipfile.ZipFile(src).read("archive/data.pkl")
    msg = _convert_refused(src, work / "evil.pdparams", UnsafeCheckpointError, spec=TINY)
    assert "system" in msg
    assert not marker.exists()
    with pytest.raises(UnsafeCheckpointError):
        build_sam(TINY, checkpoint=src)
    assert not marker.exists()


def test_refuses_damaged_files(official_pth, work):
    data = official_pth.read_bytes()
    truncated = work / "truncated.pth"
    truncated.write_bytes(data[: len(data) // 2])
    msg = _convert_refused(truncated, work / "truncated.pdparams", CheckpointFormatError, spec=TINY)
    assert "truncated.pth" in msg

    flipped = bytearray(data)
    with zipfile.ZipFile(official_pth) as zf:
        info = zf.getinfo(next(n for n in zf.namelist() if "/data/" in n))
    name_len, extra_len = struct.unpack(
        "<HH", data[info.header_offset + 26 : info.header_offset + 30]
    )
    flipped[info.header_offset + 30 + name_len + extra_len + 1] ^= 0xFF  # inside a tensor record
    corrupt = work / "corrupt.pth"
    corrupt.write_bytes(bytes(flipped))
    _convert_refused(corrupt, work / "corrupt.pdparams", CheckpointFormatError, spec=TINY)

    empty = work / "empty.pth"
    empty.write_bytes(b"")
    msg = _convert_refused(empty, work / "empty.pdparams", CheckpointFormatError, spec=TINY)
    assert "empty" in msg

    junk = work / "junk.safetensors"
    junk.write_bytes(b"this is not a checkpoint at all" * 10)
    _convert_refused(junk, work / "junk.pdparams", UnknownCheckpointFormatError, spec=TINY)


def test_refuses_missing_source(work):
    msg = _convert_refused(work / "nope.pth", work / "nope.pdparams", FileNotFoundError, spec=TINY)
    assert "nope.pth" in msg
    with pytest.raises(FileNotFoundError, match="nope.pdparams"):
        build_sam(TINY, checkpoint=work / "nope.pdparams")
    with pytest.raises(FileNotFoundError, match="nope.pdparams"):
        load_sam(work / "nope.pdparams")


def test_strict_load_of_edited_pdparams(converted, work):
    state = paddle.load(str(converted))
    removed = dict(state)
    del removed["mask_decoder.mask_tokens.weight"]
    paddle.save(removed, str(work / "removed.pdparams"))
    with pytest.raises(CheckpointMismatchError, match="mask_decoder.mask_tokens.weight") as info:
        build_sam(TINY, checkpoint=work / "removed.pdparams")
    assert "missing" in str(info.value) and "removed.pdparams" in str(info.value)

    extra = dict(state)
    extra["prompt_encoder.bonus"] = paddle.zeros([3])
    paddle.save(extra, str(work / "extra.pdparams"))
    with pytest.raises(CheckpointMismatchError, match="prompt_encoder.bonus") as info:
        build_sam(TINY, checkpoint=work / "extra.pdparams")
    assert "unexpected" in str(info.value)

    reshaped = dict(state)
    reshaped["image_encoder.neck.0.weight"] = paddle.zeros([32, 64, 1, 2])
    paddle.save(reshaped, str(work / "reshaped.pdparams"))
    with pytest.raises(CheckpointMismatchError, match=r"neck.0.weight.*\[32, 64, 1, 2\]"):
        build_sam(TINY, checkpoint=work / "reshaped.pdparams")


def test_damaged_pdparams(converted, work):
    data = converted.read_bytes()
    for name, payload in [
        ("cut.pdparams", data[: len(data) // 3]),
        ("zero.pdparams", b""),
        ("text.pdparams", b"hello world\n"),
    ]:
        path = work / name
        path.write_bytes(payload)
        with pytest.raises(CheckpointFormatError, match=re.escape(name)):
            build_sam(TINY, checkpoint=path)


# ---------------------------------------------------------------------------- 5. drop-in


def test_build_sam_with_official_file_converts_in_memory(torch_ref, official_pth, converted):
    in_memory = _model_state(build_sam(TINY, checkpoint=official_pth))
    _assert_states_equal(in_memory, _paddle_layout(torch_ref[1], TINY))
    _assert_states_equal(in_memory, _model_state(build_sam(TINY, checkpoint=converted)))


def test_registry_drop_in_is_strict(official_pth, converted, random_state, work, monkeypatch):
    monkeypatch.setitem(SAM_SPECS, "vit_b", TINY)
    # a deeper tiny size stands in for another registry entry
    deeper = TINY.encoder_depth + 1
    monkeypatch.setitem(SAM_SPECS, "vit_l", SamSpec(**{**TINY.to_dict(), "encoder_depth": deeper}))
    a = _model_state(sam_model_registry["vit_b"](checkpoint=converted))
    b = _model_state(sam_model_registry["vit_b"](checkpoint=official_pth))
    _assert_states_equal(a, b)
    with pytest.raises(CheckpointMismatchError, match=f"image_encoder.blocks.{TINY.encoder_depth}"):
        sam_model_registry["vit_l"](checkpoint=converted)
    with pytest.raises(CheckpointMismatchError, match=f"image_encoder.blocks.{TINY.encoder_depth}"):
        sam_model_registry["vit_l"](checkpoint=official_pth)
    state = dict(random_state)
    state["surplus.weight"] = np.zeros(1, np.float32)
    with pytest.raises(CheckpointMismatchError, match="surplus.weight"):
        sam_model_registry["vit_b"](checkpoint=_save_np(state, work / "surplus.safetensors"))


def test_convert_state_dict_drops_only_documented_keys(random_state):
    state = dict(random_state)
    state["pixel_mean"] = np.zeros((3, 1, 1), np.float32)
    state["pixel_std"] = np.ones((3, 1, 1), np.float32)
    out = convert_state_dict(state, TINY)
    assert set(out) == set(_torch_layout(TINY))
    state["image_encoder.blocks.0.attn.qkv.weight"] = np.zeros((192, 64), np.int64)
    with pytest.raises(CheckpointMismatchError, match="qkv.weight: dtype int64"):
        convert_state_dict(state, TINY)
