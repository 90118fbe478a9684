"""SAM 2's export: the image encoder to ONNX, run by OpenVINO in the dynamic model's place
(a reduced SAM 2.1 with random weights, written by the test). The exported model's image
predictor and video predictor answer as the dynamic model's; ``export``, ``segment
--exported`` and ``track --exported`` from the CLI; clear refusals for broken folders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_sam import loading
from paddle_sam._runtime import bf16_refusal
from paddle_sam.deploy.sam2 import (
    OpenVinoImageEncoder,
    OpenVinoMemoryAttention,
    OpenVinoMemoryEncoder,
)
from paddle_sam.deploy.sam_v1 import ExportFormatError
from paddle_sam.export.sam2 import export_sam2
from paddle_sam.loading.sam2 import (
    build_sam2,
    build_sam2_video_predictor,
    load_sam2_export,
)
from paddle_sam.predict.sam2.predictor import SAM2ImagePredictor
from tests.cli.test_cli import assert_user_error, run
from tests.helpers.sam2_ref import reduced_checkpoint, reduced_spec
from tests.helpers.video import scene, write_mp4

pytest.importorskip("openvino")

SPEC = reduced_spec("2.1")  # 256 px; its third stage's windows (6) pad the 16 x 16 grid
H, W = 96, 128
FRAMES = 4


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("export_sam2")


@pytest.fixture(scope="module")
def ckpt(work) -> Path:
    pytest.importorskip("torch")
    return reduced_checkpoint(work)[1]


@pytest.fixture(scope="module")
def exported(work, ckpt) -> Path:
    out = work / "export"
    manifest = export_sam2(build_sam2(SPEC, ckpt), out, model_type="custom")
    assert manifest["format"] == "paddle-sam/sam2-onnx"
    assert manifest["levels"] == [[256, 64, 64], [256, 32, 32], [256, 16, 16]]
    return out


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return scene(1, H, W)[0]


def _agree(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a > 0) == (b > 0)))


def test_the_folder_holds_the_encoder_and_the_other_weights(exported):
    source = loading.resolve(exported=exported)
    assert (source.family, source.runtime, source.exported) == ("sam2", "openvino", True)
    assert {"image", "clicks", "video"} <= source.parts
    import onnx

    from paddle_sam.convert.core import read_pdparams

    graph = onnx.load(str(exported / "image_encoder.onnx")).graph
    assert [o.name for o in graph.output] == ["backbone_fpn_0", "backbone_fpn_1", "backbone_fpn_2"]
    assert not any(n.op_type == "Constant" for n in graph.node)  # weights are initializers
    graph = onnx.load(str(exported / "memory_attention.onnx")).graph
    assert [i.name for i in graph.input] == [
        *["curr", "curr_pos", "memory", "memory_pos", "num_obj_ptr_tokens"]
    ]
    assert graph.input[2].type.tensor_type.shape.dim[0].dim_param == "tokens"
    graph = onnx.load(str(exported / "memory_encoder.onnx")).graph
    assert [i.name for i in graph.input] == ["pix_feat", "masks"]
    assert [o.name for o in graph.output] == ["maskmem_features"]
    assert graph.input[1].type.tensor_type.shape.dim[0].dim_param == "objects"
    keys = set(read_pdparams(exported / "model.pdparams"))
    assert keys and not any(k.startswith("image_encoder.") for k in keys)
    assert "sam_mask_decoder.conv_s0.weight" in keys and "memory_encoder.pix_feat_proj.weight" in (
        keys
    )


def test_image_predictor_answers_as_the_dynamic_model(exported, ckpt, image):
    dynamic = SAM2ImagePredictor(build_sam2(SPEC, ckpt))
    ours = loading.load_image_predictor(loading.resolve(exported=exported))
    assert isinstance(ours.model.image_encoder, OpenVinoImageEncoder)
    dynamic.set_image(image)
    ours.set_image(image)
    for a, b in zip(
        dynamic._features["high_res_feats"], ours.predictor._features["high_res_feats"], strict=True
    ):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-4)
    np.testing.assert_allclose(
        ours.predictor._features["image_embed"].numpy(),
        dynamic._features["image_embed"].numpy(),
        rtol=0,
        atol=1e-4,
    )
    for prompt in (
        {"point_coords": np.array([[30, 25]]), "point_labels": np.array([1])},
        {"box": np.array([20, 10, 90, 70])},
    ):
        m1, s1, l1 = dynamic.predict(**prompt, return_logits=True)
        m2, s2, l2 = ours.predict(
            prompt.get("point_coords"),
            prompt.get("point_labels"),
            prompt.get("box"),
            return_logits=True,
        )
        np.testing.assert_allclose(s2, s1, rtol=0, atol=1e-4)
        assert _agree(m2, m1) >= 0.999 and _agree(l2, l1) >= 0.999


def test_a_batch_runs_image_by_image(exported, ckpt, image):
    dynamic = SAM2ImagePredictor(build_sam2(SPEC, ckpt))
    ours = SAM2ImagePredictor(load_sam2_export(exported))
    images = [image, image[::-1].copy()]
    dynamic.set_image_batch(images)
    ours.set_image_batch(images)
    np.testing.assert_allclose(
        ours._features["image_embed"].numpy(),
        dynamic._features["image_embed"].numpy(),
        rtol=0,
        atol=1e-4,
    )


@pytest.fixture(scope="module")
def video(work) -> Path:
    return write_mp4(scene(FRAMES, H, W), work / "clip.mp4", fps=8.0)


def test_video_predictor_tracks_as_the_dynamic_model(exported, ckpt, video):
    dynamic = build_sam2_video_predictor(SPEC, ckpt)
    ours = load_sam2_export(exported, video=True)
    assert ours.fill_hole_area == dynamic.fill_hole_area == 8  # upstream's post-processing
    assert isinstance(ours.memory_attention, OpenVinoMemoryAttention)
    assert isinstance(ours.memory_encoder, OpenVinoMemoryEncoder)
    results = []
    for model in (dynamic, ours):
        state = model.init_state(str(video))
        model.add_new_points_or_box(state, 0, 1, points=[[20, 25]], labels=[1])
        model.add_new_points_or_box(state, 1, 2, box=[45, 50, 80, 90])
        results.append({f: (ids, m.numpy()) for f, ids, m in model.propagate_in_video(state, 0)})
    assert results[0].keys() == results[1].keys() and len(results[0]) == FRAMES
    for f in results[0]:
        assert results[0][f][0] == results[1][f][0]
        assert _agree(results[1][f][1], results[0][f][1]) >= 0.999, f


@pytest.mark.parametrize(("frames", "pointers", "batch"), [(1, 0, 1), (3, 5, 2), (2, 16, 1)])
def test_memory_attention_answers_as_the_dynamic_one(exported, ckpt, frames, pointers, batch):
    """The exported memory attention (any memory length, with or without object pointers,
    object by object for a batch) against the dynamic module on the same weights."""
    dynamic = build_sam2_video_predictor(SPEC, ckpt).memory_attention
    ours = load_sam2_export(exported, video=True).memory_attention
    rng = np.random.default_rng(frames)
    tokens, n = 16 * 16, frames * 16 * 16 + pointers
    curr, curr_pos = (rng.standard_normal((tokens, batch, 256), np.float32) for _ in range(2))
    memory, memory_pos = (rng.standard_normal((n, batch, 64), np.float32) for _ in range(2))
    args = {
        "curr": [paddle.to_tensor(curr)],
        "curr_pos": [paddle.to_tensor(curr_pos)],
        "memory": paddle.to_tensor(memory),
        "memory_pos": paddle.to_tensor(memory_pos),
        "num_obj_ptr_tokens": pointers,
    }
    with paddle.no_grad():
        want = dynamic(**args).numpy()
        got = ours(**args).numpy()
    assert got.shape == want.shape == (tokens, batch, 256)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("objects", [1, 3])
def test_memory_encoder_answers_as_the_dynamic_one(exported, ckpt, objects):
    """The exported memory encoder (every object in one call; logits or probabilities in)
    against the dynamic module on the same weights: features and position encodings."""
    dynamic = build_sam2_video_predictor(SPEC, ckpt).memory_encoder
    ours = load_sam2_export(exported, video=True).memory_encoder
    rng = np.random.default_rng(objects)
    pix_feat = paddle.to_tensor(rng.standard_normal((objects, 256, 16, 16), np.float32))
    logits = paddle.to_tensor(4 * rng.standard_normal((objects, 1, 256, 256), np.float32))
    for skip in (False, True):
        masks = paddle.nn.functional.sigmoid(logits) if skip else logits
        with paddle.no_grad():
            want = dynamic(pix_feat, masks, skip_mask_sigmoid=skip)
            got = ours(pix_feat, masks, skip_mask_sigmoid=skip)
        a, b = want["vision_features"].numpy(), got["vision_features"].numpy()
        assert b.shape == a.shape == (objects, 64, 16, 16)
        assert np.abs(a).max() > 0.1  # not an all-zero answer
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)
        np.testing.assert_array_equal(
            got["vision_pos_enc"][0].numpy(), want["vision_pos_enc"][0].numpy()
        )


def test_bf16_where_the_cpu_has_it(exported, image):
    why = bf16_refusal()
    if why is not None:
        with pytest.raises(ValueError, match="bf16"):
            load_sam2_export(exported, precision="bf16")
        return
    fp32 = load_sam2_export(exported)
    bf16 = load_sam2_export(exported, precision="bf16")
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((1, 3, 256, 256)), "float32")
    a = fp32.forward_image(x)["vision_features"].numpy().ravel()
    b = bf16.forward_image(x)["vision_features"].numpy().ravel()
    cosine = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert np.abs(a - b).max() > 0  # bf16 was applied: not the fp32 answer
    assert cosine > 0.99, cosine


def test_int8_weights_from_the_cli(work, ckpt, exported, image, video, capsys):
    """``export --quantize int8`` adds the encoder with int8 weights; ``--precision int8``
    runs it (image and video): close to the fp32 export, not equal to it. An export without
    the file, and --calibration (SAM 2 stores int8 weights only), are refused by name."""
    pytest.importorskip("nncf")
    out = work / "int8"
    assert run(["export", "--checkpoint", ckpt, "-o", out, "--quantize", "int8"]) == 0
    assert "image_encoder.int8.xml/.bin" in capsys.readouterr().out
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["programs"]["image_encoder_int8"] == [
        "image_encoder.int8.xml",
        "image_encoder.int8.bin",
    ]
    assert "weights" in manifest["quantized"]["int8"]["method"]
    int8 = load_sam2_export(out, precision="int8")
    fp32 = load_sam2_export(exported)
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((1, 3, 256, 256)), "float32")
    for a, b in zip(
        fp32.forward_image(x)["backbone_fpn"], int8.forward_image(x)["backbone_fpn"], strict=True
    ):
        a, b = a.numpy().ravel(), b.numpy().ravel()
        assert np.abs(a - b).max() > 0  # int8 was applied: not the fp32 answer
        assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.999
    ours, theirs = SAM2ImagePredictor(int8), SAM2ImagePredictor(fp32)
    for p in (ours, theirs):
        p.set_image(image)
    m1, s1, _ = theirs.predict([[30, 25]], [1])
    m2, s2, _ = ours.predict([[30, 25]], [1])
    assert _agree(m2, m1) >= 0.98 and np.abs(s2 - s1).max() < 0.05

    tracked = work / "track_int8"
    argv = ["track", video, "--exported", out, "-o", tracked, "--quiet", "--point", "0,20,25"]
    assert run([*argv, "--precision", "int8"]) == 0
    assert len(list((tracked / "masks" / "1").glob("*.png"))) == FRAMES
    with pytest.raises(ValueError, match="no int8 image encoder.*--quantize int8"):
        load_sam2_export(exported, precision="int8")
    assert_user_error(
        capsys,
        [*["export", "--checkpoint", ckpt, "-o", work / "cal", "--quantize", "int8"]]
        + ["--calibration", work],
        "int8 weights only",
    )


def test_broken_folders_are_named(exported, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(exported, broken)
    (broken / "model.pdparams").unlink()
    with pytest.raises(ExportFormatError, match="model.pdparams is missing"):
        load_sam2_export(broken)
    manifest = json.loads((exported / "export.json").read_text())
    manifest["format_version"] = 99
    (broken / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportFormatError, match="version 99"):
        load_sam2_export(broken)
    with pytest.raises(ValueError, match="precision must be"):
        load_sam2_export(exported, precision="int4")


def test_cli_export_segment_and_track(work, ckpt, image, video, capsys):
    from PIL import Image

    out = work / "cli_export"
    assert run(["export", "--checkpoint", ckpt, "-o", out]) == 0
    assert "image_encoder.onnx" in capsys.readouterr().out
    png = work / "image.png"
    Image.fromarray(image).save(png)
    seg = work / "seg"
    assert run(["segment", png, "--exported", out, "-o", seg, "--point", "30,25"]) == 0
    dynamic = SAM2ImagePredictor(build_sam2(SPEC, ckpt))
    dynamic.set_image(image)
    _, scores, _ = dynamic.predict([[30, 25]], [1])
    result = json.loads((seg / "result.json").read_text())
    np.testing.assert_allclose(result["scores"], scores, atol=1e-4)

    tracked = work / "track"
    argv = ["track", video, "--exported", out, "-o", tracked, "--quiet", "--point", "0,20,25"]
    assert run(argv) == 0
    assert len(list((tracked / "masks" / "1").glob("*.png"))) == FRAMES
    # the export again over itself: refused without --overwrite
    assert_user_error(capsys, ["export", "--checkpoint", ckpt, "-o", out], "--overwrite")
    assert_user_error(
        capsys,
        ["export", "--checkpoint", ckpt, "-o", work / "pir", "--format", "pir"],
        "ONNX",
    )
    assert_user_error(
        capsys,
        [
            *["track", video, "--checkpoint", ckpt, "-o", work / "t2"],
            *["--point", "0,20,25", "--precision", "bf16"],
        ],
        "--exported",
    )


def test_everything_and_serve_from_the_export(exported, ckpt, image, work):
    """``everything --exported`` and ``label --everything --exported`` write the generator's
    masks of the dynamic model; ``serve --exported`` serves the image page (a click) and the
    video mode from the export."""
    import uvicorn
    from fastapi.testclient import TestClient
    from PIL import Image

    from paddle_sam.predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator
    from tests.helpers.server import png_bytes

    png = work / "image_everything.png"
    Image.fromarray(image).save(png)
    out = work / "everything"
    options = ["--points-per-side", "4", "--pred-iou-thresh", "0", "--stability-score-thresh", "0"]
    argv = ["everything", png, "--exported", exported, "-o", out, "--quiet", *options]
    assert run(argv) == 0
    want = SAM2AutomaticMaskGenerator(
        build_sam2(SPEC, ckpt), points_per_side=4, pred_iou_thresh=0, stability_score_thresh=0
    ).generate(image)
    coco = json.loads((out / "annotations.json").read_text())
    assert len(coco["annotations"]) == len([r for r in want if r["area"] > 0]) >= 1
    folder = work / "label_images"
    folder.mkdir()
    Image.fromarray(image).save(folder / "a.png")
    labels = work / "labels"
    argv = ["label", folder, "-o", labels, "--exported", exported, "--quiet", "--everything"]
    assert run([*argv, *options, "--num-workers", "1"]) == 0
    doc = json.loads((labels / "annotations.json").read_text())
    assert len(doc["annotations"]) == len(coco["annotations"])

    started: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(uvicorn, "run", lambda app, **kwargs: started.update(app=app, **kwargs))
        assert run(["serve", "--exported", exported, "--port", "0"]) == 0
    with TestClient(started["app"]) as client:
        model = client.get("/health").json()["model"]
        assert model["video"] is True and model["takes_points"] is True
        r = client.post("/sessions", files={"image": ("x.png", png_bytes(image), "image/png")})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        r = client.post(f"/sessions/{sid}/prompt", json={"points": [[30, 25]], "multimask": True})
        assert r.status_code == 200, r.text
        dynamic = SAM2ImagePredictor(build_sam2(SPEC, ckpt))
        dynamic.set_image(image)
        _, scores, _ = dynamic.predict([[30, 25]], [1])
        got = [m["score"] for m in r.json()["masks"]]
        np.testing.assert_allclose(got, scores, atol=1e-4)


def test_without_openvino_the_extra_is_named(exported, image, work, capsys, monkeypatch):
    """OpenVINO missing (an import that fails, as without the extra): one line naming the
    extra to install, from the library and from the CLI."""
    import sys

    from PIL import Image

    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    with pytest.raises(ImportError, match=r"paddle-sam\[openvino\]"):
        load_sam2_export(exported)
    png = work / "image_no_ov.png"
    Image.fromarray(image).save(png)
    argv = ["segment", png, "--exported", exported, "-o", work / "no_ov", "--point", "30,25"]
    assert_user_error(capsys, argv, "paddle-sam[openvino]")
