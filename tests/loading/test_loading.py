"""The loading layer: what ``sniff`` reads a source as (family, layout, runtime, parts), what
the registry builds from it, and what it refuses, naming what the source lacks."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from paddle_sam import loading
from paddle_sam.convert.checkpoint import convert_checkpoint, detect_family
from paddle_sam.convert.sam3 import random_released_state_dict
from paddle_sam.convert.sam_v1 import random_official_state_dict
from paddle_sam.loading import FAMILIES, SourceRefused, sniff
from paddle_sam.models.sam_v1.build_sam import SAM_SPECS
from tests.helpers.specs import tiny_sam3_tracker_spec

SMALL = "vit_tiny_synthetic"  # the smallest registered size: detected from the weights


def save_safetensors(state: dict, path):
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(path))
    return path


def save_released(state: dict, path):
    torch = pytest.importorskip("torch")
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, path)
    return path


@pytest.fixture(scope="module")
def sam3_files(tmp_path_factory):
    """A tiny SAM 3 in the released layout without the tracker, with the tracker's heads only,
    and with the whole video tracker."""
    tmp = tmp_path_factory.mktemp("sam3")
    spec = tiny_sam3_tracker_spec()
    return {
        "image": save_released(random_released_state_dict(spec, 1), tmp / "image.pt"),
        "heads": save_released(
            random_released_state_dict(spec, 2, enable_inst_interactivity=True), tmp / "heads.pt"
        ),
        "video": save_released(
            random_released_state_dict(spec, 3, enable_inst_interactivity=True, with_tracker=True),
            tmp / "video.pt",
        ),
    }


def test_bundled_models_are_sniffed_as_their_families():
    v1, sam3 = loading.bundled("sam_v1"), loading.bundled("sam3")
    assert (v1.family, v1.layout, v1.runtime) == ("sam_v1", "pdparams", "dynamic")
    assert v1.parts == {"image", "clicks"} and v1.model_type == "vit_tiny_synthetic"
    # the bundled SAM 3 was trained as an image model: text and boxes, no tracker
    assert (sam3.family, sam3.parts) == ("sam3", {"image", "text"})
    assert loading.is_bundled(v1) and loading.bundled_notice(sam3).startswith("using the default")
    assert "no tracker weights" in loading.video_refusal(sam3)
    with pytest.raises(SourceRefused, match="sam3_tiny_concepts.pdparams"):
        loading.require(sam3, "clicks", "--point")


def test_an_official_sam_v1_file(tmp_path):
    path = save_safetensors(
        random_official_state_dict(SAM_SPECS[SMALL], seed=0), tmp_path / "v1.safetensors"
    )
    source = sniff(path)
    assert (source.family, source.layout, source.parts) == (
        "sam_v1",
        "official",
        {"image", "clicks"},
    )
    assert detect_family(path) == "sam_v1"  # the converter's answer is the same sniff
    predictor = loading.load_image_predictor(source, model_type=None)
    assert type(predictor).__name__ == "SamPredictor"
    assert "video needs SAM 2, or SAM 3" in loading.video_refusal(source)
    with pytest.raises(SourceRefused, match="SAM 3"):
        loading.load_video_predictor(source)


def test_released_sam3_parts_come_from_its_key_names(sam3_files):
    image, heads, video = (sniff(sam3_files[k]) for k in ("image", "heads", "video"))
    assert {image.family, heads.family, video.family} == {"sam3"}
    assert image.parts == {"image", "text"}
    assert heads.parts == {"image", "text", "clicks"}
    assert video.parts == {"image", "text", "clicks", "video"}
    assert loading.video_refusal(video) is None
    assert "no tracker weights" in loading.video_refusal(heads)
    with pytest.raises(SourceRefused, match="needs a model that takes clicks"):
        loading.load_image_predictor(image, clicks=True)


def test_conversion_keeps_what_the_file_holds(sam3_files, tmp_path):
    """A .pdparams converted from each file is sniffed with the same parts as its source."""
    spec = tiny_sam3_tracker_spec()
    for name in ("image", "heads", "video"):
        dst = tmp_path / f"{name}.pdparams"
        convert_checkpoint(sam3_files[name], dst, spec=spec, progress=False)
        assert sniff(dst).parts == sniff(sam3_files[name]).parts, name
        assert sniff(dst).layout == "pdparams"


def test_the_video_source_builds_both_video_predictors(sam3_files, tmp_path):
    """From the converted file, whose sidecar gives the tiny sizes."""
    dst = tmp_path / "video.pdparams"
    convert_checkpoint(sam3_files["video"], dst, spec=tiny_sam3_tracker_spec(), progress=False)
    source = sniff(dst)
    tracker = loading.load_video_predictor(source, kind="tracker")
    assert hasattr(tracker, "propagate_in_video") and hasattr(tracker, "init_state")
    dense = loading.load_video_predictor(source)
    assert hasattr(dense, "handle_stream_request")
    assert loading.is_video_model(dense)
    image = loading.image_predictor_of_video(dense, confidence_threshold=0.3)
    assert image.takes_points and image.confidence_threshold == 0.3


def test_export_folders_by_their_manifest(tmp_path):
    def folder(name, manifest):
        d = tmp_path / name
        d.mkdir()
        (d / "export.json").write_text(json.dumps(manifest))
        return d

    sam3 = sniff(folder("sam3", {"format": "paddle-sam/sam3-static", "version": 1}))
    assert (sam3.family, sam3.runtime, sam3.exported) == ("sam3", "paddle-inference", True)
    onnx = sniff(folder("onnx", {"format": "paddle-sam/sam_v1-onnx", "model_type": "vit_b"}))
    assert (onnx.family, onnx.runtime, onnx.model_type) == ("sam_v1", "onnxruntime", "vit_b")
    with pytest.raises(SourceRefused, match="export folder"):
        loading.load_model(sam3)
    with pytest.raises(ValueError, match=r"which runs in fp32 \("):
        loading.load_image_predictor(sam3, precision="bf16")
    assert "export folder" in loading.video_refusal(sam3)
    unknown = sniff(folder("other", {"format": "someone-else/model"}))
    assert unknown.family is None
    with pytest.raises(SourceRefused, match="cannot tell which model family"):
        loading.load_image_predictor(unknown)
    with pytest.raises(ValueError, match="not readable as JSON"):
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "export.json").write_text("{")
        sniff(tmp_path / "bad")


def test_what_cannot_be_told_is_said(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        sniff(tmp_path / "nope.pt")
    bare = tmp_path / "bare.pdparams"
    bare.write_bytes(b"not a pickle")
    assert sniff(bare).family is None
    assert sniff(bare, "sam_v1").family == "sam_v1"  # --model-type decides
    with pytest.raises(ValueError, match="unknown model family"):
        sniff(bare, "sam9")
    with pytest.raises(ValueError, match="either --checkpoint or --exported"):
        loading.resolve(bare, tmp_path)
    with pytest.raises(TypeError, match="create_app needs a SAM model or a predictor"):
        loading.as_image_predictor(object(), "create_app")


def test_a_family_without_its_bundled_model(monkeypatch, tmp_path):
    missing = dataclasses.replace(FAMILIES["sam3"], default=tmp_path / "gone.pdparams")
    monkeypatch.setitem(FAMILIES, "sam3", missing)
    with pytest.raises(ValueError, match=r"no default SAM 3 \(gone.pdparams: make train-sam3"):
        loading.resolve(model_type="sam3")
