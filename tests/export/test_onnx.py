"""ONNX export (paddle2onnx) checked with onnxruntime against the dynamic model (tiny config)."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import paddle
import pytest

from paddle_sam import SamPredictor, build_sam
from paddle_sam.deploy import OnnxSamPredictor
from paddle_sam.deploy.sam_v1 import ExportFormatError
from paddle_sam.export.onnx import export_onnx
from tests.helpers.pairs import TINY, image

H, W = 150, 230


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    paddle.seed(5)
    model = build_sam(TINY)
    d = tmp_path_factory.mktemp("onnx") / "tiny"
    manifest = export_onnx(model, d, model_type="tiny")
    return model, d, manifest


@pytest.fixture(scope="module")
def pair(exported):
    model, d, _ = exported
    op, dp = OnnxSamPredictor(d), SamPredictor(model)
    img = image(H, W, seed=6)
    op.set_image(img)
    dp.set_image(img)
    return op, dp


def _same(op, dp, *args, **kw):
    """Low-res logits and IoU match; the masks (upscaled by onnxruntime's Resize, not Paddle's
    interpolate) match except where the logit is within 1e-4 of the threshold."""
    a, b = op.predict(*args, **kw), dp.predict(*args, **kw)
    np.testing.assert_allclose(a[2], b[2], atol=1e-4, rtol=0)
    np.testing.assert_allclose(a[1], b[1], atol=1e-5)
    la = op.predict(*args, **kw, return_logits=True)[0]
    lb = dp.predict(*args, **kw, return_logits=True)[0]
    np.testing.assert_allclose(la, lb, atol=1e-4, rtol=0)
    differ = a[0] != b[0]
    assert np.all(np.abs(lb[differ]) < 1e-4), np.abs(lb[differ]).max()
    assert differ.mean() < 1e-4


def test_files_and_dynamic_inputs(exported):
    import onnx

    _, d, manifest = exported
    assert sorted(p.name for p in d.iterdir()) == [
        "export.json",
        "image_encoder.onnx",
        "prompt_decoder.onnx",
    ]
    assert json.loads((d / "export.json").read_text()) == manifest
    assert manifest["format"] == "paddle-sam/sam_v1-onnx"
    graph = onnx.load(str(d / "prompt_decoder.onnx")).graph
    onnx.checker.check_model(onnx.load(str(d / "prompt_decoder.onnx")))
    dims = {
        i.name: [x.dim_value or x.dim_param for x in i.type.tensor_type.shape.dim]
        for i in graph.input
    }
    # the point count is symbolic: one graph serves any number of clicks
    assert isinstance(dims["point_coords"][1], str) and dims["point_coords"][2] == 2
    assert set(dims) == {
        "image_embeddings",
        "point_coords",
        "point_labels",
        "mask_input",
        "has_mask_input",
        "orig_im_size",
    }


def test_image_embedding(pair):
    op, dp = pair
    np.testing.assert_allclose(
        op.get_image_embedding(), dp.get_image_embedding().numpy(), atol=1e-5
    )


@pytest.mark.parametrize("n", [1, 3, 7])
@pytest.mark.parametrize("multimask", [True, False])
def test_points(pair, n, multimask):
    op, dp = pair
    rng = np.random.default_rng(10 + n)
    coords = rng.uniform(0, [W, H], size=(n, 2))
    labels = rng.integers(0, 2, n)
    labels[0] = 1
    _same(op, dp, coords, labels, multimask_output=multimask)


def test_box_and_mask_input(pair):
    op, dp = pair
    box = np.array([20, 30, 150, 120])
    pts, lbl = np.array([[60, 70], [140, 40]]), np.array([1, 0])
    _same(op, dp, box=box, multimask_output=False)
    _same(op, dp, pts, lbl, box=box)
    prev = dp.predict(pts, lbl)[2][:1]
    _same(op, dp, pts, lbl, mask_input=prev, multimask_output=False)


def test_errors(exported, tmp_path, monkeypatch):
    model, d, _ = exported
    broken = tmp_path / "broken"
    shutil.copytree(d, broken)
    (broken / "prompt_decoder.onnx").write_bytes(b"not onnx")
    with pytest.raises(ExportFormatError, match="prompt_decoder.onnx"):
        OnnxSamPredictor(broken)
    (broken / "prompt_decoder.onnx").unlink()
    with pytest.raises(ExportFormatError, match="prompt_decoder.onnx is missing"):
        OnnxSamPredictor(broken)
    with pytest.raises(FileExistsError, match="overwrite"):
        export_onnx(model, d)
    monkeypatch.setitem(sys.modules, "paddle2onnx", None)  # the extra not installed
    with pytest.raises(ImportError, match=r"paddle-sam\[onnx\]"):
        export_onnx(model, tmp_path / "x")


def test_cli_export_onnx_and_segment(exported, tmp_path):
    from PIL import Image

    from paddle_sam import cli
    from paddle_sam.convert.core import save_pdparams

    model, _, _ = exported
    ckpt = tmp_path / "tiny.pdparams"
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    save_pdparams(
        state,
        ckpt,
        {"format": "paddle-sam/sam_v1", "model_type": "custom", "spec": TINY.to_dict()},
    )
    out = tmp_path / "onnx"
    assert cli.main(["export", "--format", "onnx", "--checkpoint", str(ckpt), "-o", str(out)]) == 0
    Image.fromarray(image(H, W, seed=2)).save(tmp_path / "img.png")
    common = ["segment", str(tmp_path / "img.png"), "--point", "50,60"]
    assert cli.main([*common, "--exported", str(out), "-o", str(tmp_path / "s")]) == 0
    assert cli.main([*common, "--checkpoint", str(ckpt), "-o", str(tmp_path / "d")]) == 0
    a = np.asarray(Image.open(tmp_path / "s" / "mask.png"))
    b = np.asarray(Image.open(tmp_path / "d" / "mask.png"))
    np.testing.assert_array_equal(a, b)
