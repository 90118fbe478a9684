"""SAM 3's ONNX export: the vision backbone run by OpenVINO in the dynamic model's place (a
reduced SAM 3 with its tracker, random weights balanced so that masks differ). The exported
model answers as the dynamic one for text and box prompts, clicks and dense video; ``export
--format onnx``, ``segment --exported`` and ``track --exported`` from the CLI; broken folders
and missing parts refused by name."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_sam import loading
from paddle_sam._runtime import bf16_refusal
from paddle_sam.convert.core import read_pdparams, save_pdparams
from paddle_sam.deploy.sam3 import OpenVinoTextEncoder, OpenVinoVisionBackbone
from paddle_sam.deploy.sam_v1 import ExportFormatError
from paddle_sam.export.sam3 import TEXT_PREFIX, export_sam3_onnx
from paddle_sam.loading.sam3 import build_sam3_video_model, load_sam3, load_sam3_export
from paddle_sam.models.sam3.text_encoder import VETextEncoder
from paddle_sam.predict.sam3.processor import Sam3Processor
from paddle_sam.predict.sam3.video_predictor import Sam3VideoPredictor
from tests.cli.test_cli import assert_user_error, run
from tests.helpers.sam3_ref import run_prompts
from tests.helpers.server import VIDEO_SETTINGS, tiny_sam3_video_model
from tests.helpers.specs import tiny_sam3_tracker_spec
from tests.helpers.video import scene, write_frames, write_mp4

pytest.importorskip("openvino")
pytest.importorskip("paddle2onnx")

SPEC = tiny_sam3_tracker_spec()
H, W = 60, 80
BOX = [0.45, 0.5, 0.3, 0.4]
CASES = {
    "text": [("text", "a shape")],
    "box": [("box", BOX, True)],
    "text+negative box": [
        ("text", "a shape"),
        ("box", BOX, True),
        ("box", [0.2, 0.3, 0.2, 0.2], False),
    ],
}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("export_sam3_ov")


@pytest.fixture(scope="module")
def ckpt(work) -> Path:
    """A converted checkpoint of the balanced tiny video model: the detector (with its second
    neck) and the tracker under the image model's interactive prefix, as ``convert`` writes
    the released sam3.pt."""
    model = tiny_sam3_video_model(seed=3)
    state = {k: v.numpy() for k, v in model.detector.state_dict().items()}
    state.update(
        {
            f"inst_interactive_predictor.model.{k}": v.numpy()
            for k, v in model.tracker.state_dict().items()
        }
    )
    path = work / "sam3_tiny.pdparams"
    meta = {
        "format": "paddle-sam/sam3",
        "model_type": "sam3",
        "spec": dataclasses.asdict(SPEC),
        "interactive": True,
        "source": {"file": "random", "sha256": "2" * 64, "layout": "official"},
    }
    save_pdparams(state, path, meta)
    return path


@pytest.fixture(scope="module")
def dynamic(ckpt):
    return load_sam3(ckpt, enable_inst_interactivity=True)


@pytest.fixture(scope="module")
def exported(work, ckpt, dynamic) -> Path:
    out = work / "export"
    manifest = export_sam3_onnx(dynamic, out, state=read_pdparams(ckpt), source_sha256="2" * 64)
    assert manifest["format"] == "paddle-sam/sam3-onnx"
    assert manifest["levels"]["sam3"] == [[256, 32, 32], [256, 16, 16], [256, 8, 8], [256, 4, 4]]
    assert manifest["levels"]["sam2"] == manifest["levels"]["sam3"]
    return out


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return scene(1, H, W)[0]


def _agree(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a == b)) if a.size else 1.0


def test_the_folder_holds_the_backbone_and_the_other_weights(exported):
    import onnx

    source = loading.resolve(exported=exported)
    assert (source.family, source.runtime, source.exported) == ("sam3", "openvino", True)
    assert {"image", "text", "clicks", "video"} <= source.parts
    assert (exported / "vision_backbone.onnx.data").stat().st_size > 0  # external weights
    graph = onnx.load(str(exported / "vision_backbone.onnx"), load_external_data=False).graph
    assert [o.name for o in graph.output] == [f"sam{v}_fpn_{i}" for v in (3, 2) for i in range(4)]
    assert not any(n.op_type == "Constant" for n in graph.node)
    keys = set(read_pdparams(exported / "model.pdparams"))
    assert not any(k.startswith("backbone.vision_backbone.") for k in keys)
    assert "inst_interactive_predictor.model.maskmem_tpos_enc" in keys  # the video tracker too
    assert any(k.startswith("backbone.language_backbone.") for k in keys)


@pytest.mark.parametrize("case", sorted(CASES))
def test_prompts_answer_as_the_dynamic_model(exported, dynamic, image, case):
    model = load_sam3_export(exported)
    assert isinstance(model.backbone.vision_backbone, OpenVinoVisionBackbone)
    ours = run_prompts(Sam3Processor(model, resolution=SPEC.image_size), image, CASES[case], 0.0)
    ref = run_prompts(Sam3Processor(dynamic, resolution=SPEC.image_size), image, CASES[case], 0.0)
    np.testing.assert_allclose(ours["scores"].numpy(), ref["scores"].numpy(), atol=1e-4)
    np.testing.assert_allclose(ours["boxes"].numpy(), ref["boxes"].numpy(), atol=1e-2)
    assert _agree(ours["masks"].numpy(), ref["masks"].numpy()) >= 0.999


def test_clicks_answer_as_the_dynamic_model(exported, dynamic, image):
    model = load_sam3_export(exported, interactive=True)
    got = []
    for m in (model, dynamic):
        proc = Sam3Processor(m, resolution=SPEC.image_size)
        state = proc.set_image(image)
        masks, scores, _ = m.predict_inst(
            state, point_coords=np.array([[40.0, 30.0]]), point_labels=np.array([1])
        )
        got.append((np.asarray(masks), np.asarray(scores)))
    (a, sa), (b, sb) = got
    np.testing.assert_allclose(sa, sb, atol=1e-4)
    assert _agree(a, b) >= 0.999 and 0 < b.mean() < 1  # a mask, not all or nothing


def _track(predictor, video: Path) -> list[tuple[int, list[int], np.ndarray]]:
    sid = predictor.handle_request({"type": "start_session", "resource_path": str(video)})[
        "session_id"
    ]
    predictor.handle_request(
        {"type": "add_prompt", "session_id": sid, "frame_index": 0, "text": "a shape"}
    )
    out = []
    for r in predictor.handle_stream_request({"type": "propagate_in_video", "session_id": sid}):
        o = r["outputs"]
        out.append(
            (r["frame_index"], list(map(int, o["out_obj_ids"])), np.asarray(o["out_binary_masks"]))
        )
    predictor.handle_request({"type": "close_session", "session_id": sid})
    return out


def _video_predictor(model) -> Sam3VideoPredictor:
    for name, value in VIDEO_SETTINGS.items():
        setattr(model, name, value)
    return Sam3VideoPredictor(model)


def test_dense_video_answers_as_the_dynamic_model(exported, ckpt, work):
    video = write_frames(scene(4, H, W), work / "frames")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _track(_video_predictor(build_sam3_video_model(checkpoint_path=ckpt)), video)
    ours = _track(_video_predictor(load_sam3_export(exported, "video")), video)
    assert [f for f, _, _ in ours] == [f for f, _, _ in ref] == [0, 1, 2, 3]
    assert any(ids for _, ids, _ in ref)  # objects found, so the comparison means something
    for (f, ids_a, a), (_, ids_b, b) in zip(ours, ref, strict=True):
        assert ids_a == ids_b, f"frame {f}"
        assert _agree(a, b) >= 0.999, f"frame {f}"


def test_tracker_with_its_backbone_loads(exported):
    tracker = load_sam3_export(exported, "tracker")
    assert isinstance(tracker.backbone.vision_backbone, OpenVinoVisionBackbone)


def test_bf16_applied_or_refused(exported, image):
    why = bf16_refusal()
    if why is not None:
        with pytest.raises(ValueError, match="bf16"):
            load_sam3_export(exported, precision="bf16")
        return
    fp32, bf16 = (load_sam3_export(exported, precision=p) for p in ("fp32", "bf16"))
    x = Sam3Processor(fp32, resolution=SPEC.image_size).set_image(image)
    y = Sam3Processor(bf16, resolution=SPEC.image_size).set_image(image)
    a = x["backbone_out"]["backbone_fpn"][0].numpy().ravel()
    b = y["backbone_out"]["backbone_fpn"][0].numpy().ravel()
    assert not np.array_equal(a, b)  # bf16 really applied
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.99


def test_broken_folders_and_missing_parts_are_named(exported, dynamic, work, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(exported, broken)
    (broken / "vision_backbone.onnx.data").unlink()
    with pytest.raises(ExportFormatError, match="vision_backbone.onnx.data"):
        load_sam3_export(broken)
    manifest = json.loads((exported / "export.json").read_text())
    manifest["format_version"] = 99
    shutil.copytree(exported, tmp_path / "future")
    (tmp_path / "future" / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportFormatError, match="export the model again"):
        load_sam3_export(tmp_path / "future")
    with pytest.raises(ValueError, match="kind"):
        load_sam3_export(exported, "everything")
    # an image model without its tracker: text and boxes, no clicks, no video
    image_only = tmp_path / "image_only"
    state = {
        k: v
        for k, v in read_pdparams(exported / "model.pdparams").items()
        if not k.startswith("inst_")
    }
    export_sam3_onnx(dynamic, image_only, state=state)
    assert loading.resolve(exported=image_only).parts == {"image", "text"}
    for kind in ("video", "tracker"):
        with pytest.raises(ValueError, match="without its tracker"):
            load_sam3_export(image_only, kind)
    with pytest.raises(FileExistsError):
        export_sam3_onnx(dynamic, image_only, state=state)


def test_cli_export_segment_and_track(ckpt, tmp_path, image, capsys):
    from PIL import Image

    out = tmp_path / "exp"
    assert run(["export", "--checkpoint", ckpt, "--format", "onnx", "-o", out]) == 0
    assert json.loads((out / "export.json").read_text())["format"] == "paddle-sam/sam3-onnx"
    assert {"clicks", "video"} <= loading.resolve(exported=out).parts  # the tracker came along
    Image.fromarray(image).save(tmp_path / "img.png")
    common = ["segment", tmp_path / "img.png", "--text", "a shape", "--confidence-threshold", "0"]
    assert run([*common, "--exported", out, "-o", tmp_path / "s"]) == 0
    assert run([*common, "--checkpoint", ckpt, "-o", tmp_path / "d"]) == 0
    a = json.loads((tmp_path / "s" / "annotations.json").read_text())["annotations"]
    b = json.loads((tmp_path / "d" / "annotations.json").read_text())["annotations"]
    assert len(a) == len(b) == SPEC.num_queries
    np.testing.assert_allclose([x["score"] for x in a], [x["score"] for x in b], atol=1e-4)
    clip = write_mp4(scene(3, H, W), tmp_path / "clip.mp4")
    assert run(["track", clip, "--exported", out, "--text", "a shape", "-o", tmp_path / "t"]) == 0
    assert any((tmp_path / "t").iterdir())
    # clicks: the tracker alone, its backbone on OpenVINO
    assert run(["track", clip, "--exported", out, "--point", "0,40,30", "-o", tmp_path / "c"]) == 0
    assert any((tmp_path / "c" / "masks").iterdir())
    capsys.readouterr()
    # the options of the other exports are refused by name
    argv = ["export", "--checkpoint", ckpt, "--format", "onnx", "--dynamic-batch"]
    assert_user_error(capsys, [*argv, "-o", tmp_path / "q"], "--dynamic-batch")
    assert not (tmp_path / "q").exists()


def _cosine(a, b) -> float:
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _int8_close_to_fp32(folder: Path, image: np.ndarray) -> None:
    """The export's int8 backbone moves every FPN level (int8 really applied) and keeps it
    close to fp32's (cosine > 0.99); so does its int8 text encoder, which runs on OpenVINO
    in the dynamic one's place, without the fp32 text weights in memory."""
    fp32, int8 = (load_sam3_export(folder, precision=p) for p in ("fp32", "int8"))
    x = Sam3Processor(fp32, resolution=SPEC.image_size).set_image(image)
    y = Sam3Processor(int8, resolution=SPEC.image_size).set_image(image)
    for level in range(len(x["backbone_out"]["backbone_fpn"])):
        a = x["backbone_out"]["backbone_fpn"][level].numpy()
        b = y["backbone_out"]["backbone_fpn"][level].numpy()
        assert not np.array_equal(a, b)
        assert _cosine(a, b) > 0.99
    assert isinstance(int8.backbone.language_backbone, OpenVinoTextEncoder)
    assert not int8.backbone.language_backbone.parameters()
    assert isinstance(fp32.backbone.language_backbone, VETextEncoder)
    prompts = ["a shape", "two red things"]
    t32, t8 = (m.backbone.forward_text(prompts) for m in (fp32, int8))
    assert np.array_equal(t32["language_mask"].numpy(), t8["language_mask"].numpy())
    assert t8["language_mask"].numpy()[0].sum() > t8["language_mask"].numpy()[1].sum()
    for key in ("language_features", "language_embeds"):
        assert t32[key].shape == t8[key].shape
        assert not np.array_equal(t32[key].numpy(), t8[key].numpy())
        assert _cosine(t32[key].numpy(), t8[key].numpy()) > 0.99
    with pytest.raises(ValueError, match=f"B x {SPEC.context_length}"):
        int8.backbone.language_backbone.encode_tokens(paddle.zeros([1, 3], "int64"))


def test_int8_backbone(exported, dynamic, ckpt, image, tmp_path, capsys):
    """``--quantize int8``: the backbone again with int8 weights (a quarter of the bytes),
    which ``precision="int8"`` runs: close to fp32, not equal to it; an export without it
    refuses int8 by name."""
    pytest.importorskip("nncf")
    out = tmp_path / "int8"
    manifest = export_sam3_onnx(dynamic, out, state=read_pdparams(ckpt), quantize="int8")
    assert manifest["programs"]["vision_backbone_int8"] == [
        "vision_backbone.int8.xml",
        "vision_backbone.int8.bin",
    ]
    assert manifest["quantized"]["int8"]["nncf"]
    assert manifest["programs"]["text_encoder_int8"] == [
        "text_encoder.int8.xml",
        "text_encoder.int8.bin",
    ]
    assert "weights only" in manifest["quantized"]["text_int8"]["method"]
    fp32_bytes = (out / "vision_backbone.onnx.data").stat().st_size
    assert (out / "vision_backbone.int8.bin").stat().st_size < 0.35 * fp32_bytes
    text_bytes = 4 * sum(
        v.size for k, v in read_pdparams(ckpt).items() if k.startswith(TEXT_PREFIX)
    )
    assert (out / "text_encoder.int8.bin").stat().st_size < 0.35 * text_bytes
    _int8_close_to_fp32(out, image)
    # an int8 export from before the text encoder had its int8 file: fp32 text on Paddle
    older = tmp_path / "older"
    shutil.copytree(out, older)
    listed = json.loads((older / "export.json").read_text())
    del listed["programs"]["text_encoder_int8"]
    (older / "export.json").write_text(json.dumps(listed))
    text = load_sam3_export(older, precision="int8").backbone.language_backbone
    assert isinstance(text, VETextEncoder) and not isinstance(text, OpenVinoTextEncoder)
    with pytest.raises(ValueError, match="quantize int8"):
        load_sam3_export(exported, precision="int8")
    from PIL import Image

    Image.fromarray(image).save(tmp_path / "img.png")
    seg = ["segment", tmp_path / "img.png", "--text", "a shape", "--precision", "int8"]
    assert run([*seg, "--exported", out, "-o", tmp_path / "s"]) == 0
    capsys.readouterr()
    assert_user_error(capsys, [*seg, "--exported", exported, "-o", tmp_path / "r"], "int8")
    # track: the tracker on the int8 backbone; an export without it refused by name
    clip = write_mp4(scene(3, H, W), tmp_path / "clip.mp4")
    trk = ["track", clip, "--point", "0,40,30", "--precision", "int8"]
    assert run([*trk, "--exported", out, "-o", tmp_path / "t"]) == 0
    assert any((tmp_path / "t" / "masks").iterdir())
    capsys.readouterr()
    assert_user_error(capsys, [*trk, "--exported", exported, "-o", tmp_path / "u"], "int8")


def _ov_op_types(xml: Path) -> set[str]:
    import openvino as ov

    return {op.get_type_name() for op in ov.Core().read_model(str(xml)).get_ops()}


def test_calibrated_int8_backbone(dynamic, ckpt, image, tmp_path, capsys, monkeypatch):
    """``--quantize int8 --calibration IMAGES``: the backbone with int8 activations too
    (quantise nodes on the activations, which the weights-only file has none of), calibrated
    on the images given; ``precision="int8"`` runs it close to fp32. Calibration images of
    the wrong kind, or without --quantize, are refused by name. A machine with less memory
    available than calibration took where measured is warned before it starts."""
    pytest.importorskip("nncf")
    import warnings

    from PIL import Image

    from paddle_sam import _runtime

    rng = np.random.default_rng(11)
    images = scene(4, H, W)[1:]  # frames other than the test image
    out = tmp_path / "static"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        manifest = export_sam3_onnx(
            dynamic, out, state=read_pdparams(ckpt), quantize="int8", calibration=images
        )
    assert not [w for w in seen if "killed for memory" in str(w.message)]  # a small backbone
    info = manifest["quantized"]["int8"]
    assert info["calibration_images"] == 3 and "activations" in info["method"]
    assert "FakeQuantize" in _ov_op_types(out / "vision_backbone.int8.xml")
    _int8_close_to_fp32(out, image)
    with pytest.raises(ValueError, match="calibration image 1"):
        bad = [images[0], rng.random((H, W, 3))]
        export_sam3_onnx(dynamic, tmp_path / "bad", quantize="int8", calibration=bad)
    with pytest.raises(ValueError, match="quantize='int8'"):
        export_sam3_onnx(dynamic, tmp_path / "bad", calibration=images)
    folder = tmp_path / "calib"
    folder.mkdir()
    for i, im in enumerate(images):
        Image.fromarray(im).save(folder / f"{i}.png")
    argv = ["export", "--checkpoint", ckpt, "--format", "onnx", "--calibration", folder]
    assert_user_error(capsys, [*argv, "-o", tmp_path / "c"], "--quantize int8")
    argv += ["--quantize", "int8", "--calibration-images", "2", "-o", tmp_path / "c"]
    monkeypatch.setattr(_runtime, "available_memory", lambda: 4096)  # a machine short of it
    with pytest.warns(UserWarning, match=r"needs about .* GB of memory .* killed for memory"):
        assert run(argv) == 0
    assert "on 2 of 3 images" in capsys.readouterr().out
    listed = json.loads((tmp_path / "c" / "export.json").read_text())
    assert listed["quantized"]["int8"]["calibration_images"] == 2


def test_weights_only_int8_has_float_activations(dynamic, tmp_path):
    """Without calibration images the int8 file quantises weights only: no activation is
    quantised (the calibrated file's FakeQuantize nodes are absent)."""
    pytest.importorskip("nncf")
    out = tmp_path / "w"
    export_sam3_onnx(dynamic, out, quantize="int8")
    assert "FakeQuantize" not in _ov_op_types(out / "vision_backbone.int8.xml")


def _served_text_scores(argv: list, image: np.ndarray) -> tuple[dict, list[float]]:
    import uvicorn
    from fastapi.testclient import TestClient

    from tests.helpers.server import png_bytes

    started: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(uvicorn, "run", lambda app, **kwargs: started.update(app=app, **kwargs))
        assert run(["serve", *argv, "--port", "0", "--confidence-threshold", "0"]) == 0
    with TestClient(started["app"]) as client:
        model = client.get("/health").json()["model"]
        r = client.post("/sessions", files={"image": ("x.png", png_bytes(image), "image/png")})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        r = client.post(f"/sessions/{sid}/prompt", json={"text": "a shape"})
        assert r.status_code == 200, r.text
    return model, sorted((m["score"] for m in r.json()["masks"]), reverse=True)


def test_serve_from_the_export(exported, ckpt, image):
    """``serve --exported`` serves the image page (text, clicks) and the video mode from the
    export; a text prompt scores as the same server on the checkpoint."""
    model, got = _served_text_scores(["--exported", exported], image)
    assert model["type"] == "sam3" and model["video"] is True
    assert model["takes_text"] is True and model["takes_points"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, want = _served_text_scores(["--checkpoint", ckpt], image)
    assert len(got) == len(want) == SPEC.num_queries
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_cli_eval_of_the_bundled_model_exported(tmp_path, capsys):
    """``eval --exported``: the bundled SAM 3's held-out AP through its export equals the
    dynamic model's; ``--precision bf16`` is applied (``segment``'s scores move, a little)
    where the CPU has bf16, refused by name elsewhere."""
    from PIL import Image

    bundled = loading.bundled("sam3").path
    out = tmp_path / "exp"
    assert run(["export", "--checkpoint", bundled, "--format", "onnx", "-o", out]) == 0
    common = ["eval", "--format", "concepts", "--num-images", "3", "--seed", "1000", "--quiet"]
    assert run([*common, "--checkpoint", bundled, "--json", tmp_path / "d.json"]) == 0
    assert run([*common, "--exported", out, "--json", tmp_path / "e.json"]) == 0
    d, e = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "de")
    assert d["mask"]["AP50"] > 0.3  # a model that finds things, so the comparison means something
    for kind in ("mask", "box"):
        for key in ("AP", "AP50"):
            assert abs(e[kind][key] - d[kind][key]) < 1e-3, (kind, key)
    assert e["exported"] == {"path": str(out), "precision": "fp32"}
    capsys.readouterr()
    assert_user_error(
        capsys, [*common, "--checkpoint", bundled, "--precision", "bf16"], "--exported"
    )

    image = scene(1, 240, 320)[0]
    Image.fromarray(image).save(tmp_path / "img.png")
    seg = ["segment", tmp_path / "img.png", "--text", "red circle", "--confidence-threshold", "0"]
    assert run([*seg, "--exported", out, "-o", tmp_path / "f"]) == 0
    if bf16_refusal() is not None:
        argv = [*seg, "--exported", out, "--precision", "bf16", "-o", tmp_path / "r"]
        assert_user_error(capsys, argv, "bf16")
        return
    assert run([*seg, "--exported", out, "--precision", "bf16", "-o", tmp_path / "b"]) == 0
    f, b = (
        [
            a["score"]
            for a in json.loads((tmp_path / n / "annotations.json").read_text())["annotations"]
        ]
        for n in "fb"
    )
    assert len(f) == len(b) and not np.allclose(f, b, atol=1e-6, rtol=0)  # bf16 applied
    np.testing.assert_allclose(b, f, atol=0.1)
