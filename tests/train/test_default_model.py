"""The bundled default model and example: what `make demo` shows must hold."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from paddle_sam.cli import DEFAULT_MODEL, main
from paddle_sam.models.sam_v1.build_sam import SAM_SPECS, SamSpec
from paddle_sam.train.example import DEMO_POINT, EXAMPLE, INSTANCES, mask_iou_at

pytestmark = pytest.mark.skipif(not DEFAULT_MODEL.is_file(), reason="default model not built")


def test_default_model_is_small_and_described():
    assert DEFAULT_MODEL.stat().st_size <= 25 * 2**20
    meta = json.loads(DEFAULT_MODEL.with_name(DEFAULT_MODEL.name + ".json").read_text())
    assert meta["model_type"] == "vit_tiny_synthetic"
    assert SamSpec.from_dict(meta["spec"]) == SAM_SPECS["vit_tiny_synthetic"]


def test_example_assets_come_from_the_generator():
    from paddle_sam.train.synthetic import example_scene, instance_map

    scene = example_scene()
    assert np.array_equal(np.asarray(Image.open(EXAMPLE).convert("RGB")), scene.image)
    assert np.array_equal(np.asarray(Image.open(INSTANCES)), instance_map(scene.masks))


def test_demo_command_segments_the_clicked_object(tmp_path, capsys):
    """The same command as `make demo`: the mask must match the clicked object (IoU >= 0.9)."""
    point = ",".join(map(str, DEMO_POINT))
    assert main(["segment", str(EXAMPLE), "--point", point, "-o", str(tmp_path / "seg")]) == 0
    assert "default synthetic model" in capsys.readouterr().err
    iou, obj = mask_iou_at(tmp_path / "seg" / "mask.png", DEMO_POINT)
    assert obj == 3  # the red disc
    assert iou >= 0.9, iou
    assert json.loads((tmp_path / "seg" / "result.json").read_text())["checkpoint"] == (
        DEFAULT_MODEL.name
    )


def test_eval_runs_on_the_default_model(tmp_path):
    out = tmp_path / "eval.json"
    args = ["eval", "--format", "synthetic", "--num-images", "1", "--json", str(out), "--quiet"]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["images"] == 1 and result["instances"] >= 1
    for key in ("miou_1click", "miou_3click", "miou_box"):
        assert 0.0 <= result[key] <= 1.0


def test_other_model_types_still_need_a_checkpoint(tmp_path, capsys):
    args = ["segment", str(EXAMPLE), "--point", "10,10", "--model-type", "vit_b"]
    assert main([*args, "-o", str(tmp_path)]) == 2
    assert "needs --checkpoint" in capsys.readouterr().err
