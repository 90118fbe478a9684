"""ONNX export (paddle2onnx) checked with onnxruntime against the dynamic model (tiny config):
the files and their interface, the encoder + decoder pair through ``OnnxSamPredictor``
against ``SamPredictor``, the single-mask decoder against the official selection rule, the
int8 variant against fp32, errors and the CLI. Upstream's own recipe on these files, against
the official export: ``tests/dropin/test_onnx_recipe.py``."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys

import numpy as np
import paddle
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("paddle2onnx")

from paddle_sam import SamPredictor, build_sam  # noqa: E402
from paddle_sam.deploy import OnnxSamPredictor  # noqa: E402
from paddle_sam.deploy.sam_v1 import ExportFormatError  # noqa: E402
from paddle_sam.export.onnx import export_onnx  # noqa: E402
from paddle_sam.predict.outputs import MARKER, owned
from tests.helpers.pairs import image  # noqa: E402
from tests.helpers.specs import TINY  # noqa: E402

H, W = 150, 230
FLOAT = 1  # onnx.TensorProto.FLOAT


@pytest.fixture(scope="module")
def model():
    paddle.seed(5)
    return build_sam(TINY)


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx") / "tiny"
    manifest = export_onnx(model, d, model_type="tiny", quantize="int8")
    return d, manifest


@pytest.fixture(scope="module")
def single(model, tmp_path_factory):
    """A single-mask decoder and an encoder with a dynamic batch."""
    d = tmp_path_factory.mktemp("onnx") / "single"
    manifest = export_onnx(model, d, return_single_mask=True, dynamic_batch=True)
    return d, manifest


@pytest.fixture(scope="module")
def pair(model, exported):
    op, dp = OnnxSamPredictor(exported[0], threads=2), SamPredictor(model)
    img = image(H, W, seed=6)
    op.set_image(img)
    dp.set_image(img)
    return op, dp


def _same(a, b, la, lb):
    """Low-res logits and IoU match; the masks (upscaled by onnxruntime's Resize, not Paddle's
    interpolate) match except where the logit is within 1e-4 of the threshold."""
    np.testing.assert_allclose(a[2], b[2], atol=1e-4, rtol=0)
    np.testing.assert_allclose(a[1], b[1], atol=1e-5)
    np.testing.assert_allclose(la, lb, atol=1e-4, rtol=0)
    differ = a[0] != b[0]
    assert np.all(np.abs(lb[differ]) < 1e-4), np.abs(lb[differ]).max()
    assert differ.mean() < 1e-4


def _same_predictions(op, dp, *args, **kw):
    a, b = op.predict(*args, **kw), dp.predict(*args, **kw)
    la = op.predict(*args, **kw, return_logits=True)[0]
    lb = dp.predict(*args, **kw, return_logits=True)[0]
    _same(a, b, la, lb)


def _io(path):
    """{name: (elem_type, dims)} of a model's inputs and outputs; symbolic dims as names."""
    import onnx

    model = onnx.load(str(path))
    onnx.checker.check_model(model)

    def table(values):
        return {
            v.name: (
                v.type.tensor_type.elem_type,
                [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
            )
            for v in values
        }

    return table(model.graph.input), table(model.graph.output)


def test_files_and_interface(exported):
    d, manifest = exported
    assert sorted(owned(d)) == sorted(p.name for p in d.iterdir() if p.name != MARKER)
    assert sorted(p.name for p in d.iterdir() if p.name != MARKER) == [
        "export.json",
        "image_encoder.onnx",
        "image_encoder.quant.onnx",
        "prompt_decoder.onnx",
        "prompt_decoder.quant.onnx",
    ]
    assert json.loads((d / "export.json").read_text()) == manifest
    assert manifest["format"] == "paddle-sam/sam_v1-onnx"
    assert manifest["format_version"] == 4
    inputs, outputs = _io(d / "prompt_decoder.onnx")
    c, g = TINY.prompt_embed_dim, TINY.image_embedding_size
    # upstream's interface: float32 everywhere, the point count symbolic ("num_points")
    assert inputs == {
        "image_embeddings": (FLOAT, [1, c, g, g]),
        "point_coords": (FLOAT, [1, "num_points", 2]),
        "point_labels": (FLOAT, [1, "num_points"]),
        "mask_input": (FLOAT, [1, 1, 4 * g, 4 * g]),
        "has_mask_input": (FLOAT, [1]),
        "orig_im_size": (FLOAT, [2]),
    }
    assert list(outputs) == ["masks", "iou_predictions", "low_res_masks"]
    assert manifest["decoder"]["outputs"] == list(outputs)
    assert manifest["decoder"]["inputs"]["point_coords"] == [1, "num_points", 2]
    opts = ("return_single_mask", "use_stability_score", "return_extra_metrics")
    assert not any(manifest["decoder"][k] for k in (*opts, "gelu_approximate"))
    inputs, outputs = _io(d / "image_encoder.onnx")
    assert inputs == {"image": (FLOAT, [1, 3, TINY.image_size, TINY.image_size])}
    assert list(outputs) == ["image_embeddings"]
    enc = manifest["encoder"]
    assert (enc["input"], enc["output"], enc["dynamic_batch"]) == (
        "image",
        "image_embeddings",
        False,
    )
    assert enc["input_shape"] == [1, 3, TINY.image_size, TINY.image_size]
    assert manifest["quantized"]["prompt_decoder"] == "prompt_decoder.quant.onnx"


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
    _same_predictions(op, dp, coords, labels, multimask_output=multimask)


def test_box_and_mask_input(pair):
    op, dp = pair
    box = np.array([20, 30, 150, 120])
    pts, lbl = np.array([[60, 70], [140, 40]]), np.array([1, 0])
    _same_predictions(op, dp, box=box, multimask_output=False)
    _same_predictions(op, dp, pts, lbl, box=box)
    prev = dp.predict(pts, lbl)[2][:1]
    _same_predictions(op, dp, pts, lbl, mask_input=prev, multimask_output=False)


def test_single_mask_follows_the_official_rule(model, single):
    """At most two points fed (a click and its padding point, or a box alone): the best of
    the three multimask outputs; more: the single-mask output."""
    d, manifest = single
    assert manifest["decoder"]["return_single_mask"] is True
    assert _io(d / "prompt_decoder.onnx")[0]["point_coords"][1][1] == "num_points"
    op, dp = OnnxSamPredictor(d, threads=2), SamPredictor(model)
    img = image(H, W, seed=7)
    op.set_image(img)
    dp.set_image(img)
    click = {"point_coords": np.array([[100, 60]]), "point_labels": np.array([1])}
    clicks = {"point_coords": np.array([[100, 60], [30, 120]]), "point_labels": np.array([1, 0])}
    box = {"box": np.array([20, 30, 150, 120])}
    box_and_click = {**box, **click}
    for prompt, multi in [(click, True), (box, True), (clicks, False), (box_and_click, False)]:
        # the predictor ignores multimask_output for a single-mask export
        a = op.predict(**prompt, multimask_output=not multi)
        la = op.predict(**prompt, return_logits=True)[0]
        b = dp.predict(**prompt, multimask_output=multi)
        lb = dp.predict(**prompt, multimask_output=multi, return_logits=True)[0]
        k = int(np.argmax(b[1]))
        assert a[0].shape == (1, H, W) and a[1].shape == (1,)
        _same(a, tuple(x[k : k + 1] for x in b), la, lb[k : k + 1])


def test_dynamic_batch_encoder(single):
    import onnxruntime as ort

    d, manifest = single
    inputs, outputs = _io(d / "image_encoder.onnx")
    size = TINY.image_size
    assert inputs == {"image": (FLOAT, ["batch", 3, size, size])}
    assert outputs["image_embeddings"][1][0] == "batch"
    assert manifest["encoder"]["input_shape"] == ["batch", 3, size, size]
    session = ort.InferenceSession(
        str(d / "image_encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    x = np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32)
    both = session.run(None, {"image": x})[0]
    first = session.run(None, {"image": x[:1]})[0]
    assert both.shape[0] == 2
    np.testing.assert_allclose(both[:1], first, atol=1e-5)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def test_int8_variant(exported, pair):
    """The int8 files hold int8 weights (integer GEMMs and convolutions, a smaller file: the
    weights are initializers the quantiser sees, not paddle2onnx's Constant nodes), load and
    run; their masks agree with fp32's (figures printed)."""
    import onnx

    op, _ = pair
    d = exported[0]
    for prog in ("image_encoder", "prompt_decoder"):
        ops = {n.op_type for n in onnx.load(str(d / f"{prog}.quant.onnx")).graph.node}
        assert {"MatMulInteger", "ConvInteger"} <= ops, (prog, sorted(ops))
        fp32 = onnx.load(str(d / f"{prog}.onnx")).graph
        assert not any(n.op_type == "Constant" for n in fp32.node)
    encoder = (d / "image_encoder.quant.onnx").stat().st_size
    assert encoder < 0.6 * (d / "image_encoder.onnx").stat().st_size
    q = OnnxSamPredictor(exported[0], threads=2, quantized=True)
    img = image(H, W, seed=6)
    q.set_image(img)
    emb, qemb = op.get_image_embedding(), q.get_image_embedding()
    cosine = float((emb * qemb).sum() / np.linalg.norm(emb) / np.linalg.norm(qemb))
    rng = np.random.default_rng(3)
    prompts = [{"box": np.array([20, 30, 150, 120])}]
    for n in (1, 2, 4):
        coords = rng.uniform(0, [W, H], size=(n, 2))
        prompts.append({"point_coords": coords, "point_labels": np.ones(n, int)})
    ious, score_err = [], []
    for prompt in prompts:
        a, b = op.predict(**prompt), q.predict(**prompt)
        ious += [_iou(x, y) for x, y in zip(a[0], b[0], strict=True)]
        score_err.append(float(np.abs(a[1] - b[1]).max()))
    assert cosine > 0.99, cosine
    print(
        f"\nint8 vs fp32 (tiny random model, {len(ious)} masks): embedding cosine {cosine:.5f}, "
        f"mask IoU mean {np.mean(ious):.4f} min {np.min(ious):.4f}, "
        f"max score difference {max(score_err):.4f}"
    )
    assert cosine > 0.99
    assert np.mean(ious) >= 0.9


def test_errors(model, exported, single, tmp_path, monkeypatch):
    d, _ = exported
    broken = tmp_path / "broken"
    shutil.copytree(d, broken)
    (broken / "prompt_decoder.onnx").write_bytes(b"not onnx")
    with pytest.raises(ExportFormatError, match="prompt_decoder.onnx"):
        OnnxSamPredictor(broken)
    (broken / "prompt_decoder.onnx").unlink()
    with pytest.raises(ExportFormatError, match="prompt_decoder.onnx is missing"):
        OnnxSamPredictor(broken)
    with pytest.raises(ExportFormatError, match="no int8 variant"):
        OnnxSamPredictor(single[0], quantized=True)
    old = tmp_path / "old"
    shutil.copytree(d, old)
    manifest = json.loads((old / "export.json").read_text())
    (old / "export.json").write_text(json.dumps({**manifest, "format_version": 3}))
    with pytest.raises(ExportFormatError, match="version 3.*export the model again"):
        OnnxSamPredictor(old)
    with pytest.raises(FileExistsError, match="overwrite"):
        export_onnx(model, d)
    with pytest.raises(ValueError, match="opset must be an integer >= 11"):
        export_onnx(model, tmp_path / "x", opset=9)
    with pytest.raises(ValueError, match="quantize must be one of"):
        export_onnx(model, tmp_path / "x", quantize="int4")
    assert not (tmp_path / "x").exists()
    monkeypatch.setitem(sys.modules, "paddle2onnx", None)  # the extra not installed
    with pytest.raises(ImportError, match=r"paddle-sam\[onnx\]"):
        export_onnx(model, tmp_path / "x")


@pytest.fixture
def checkpoint(model, tmp_path):
    from paddle_sam.convert.core import save_pdparams

    ckpt = tmp_path / "tiny.pdparams"
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    save_pdparams(
        state,
        ckpt,
        {"format": "paddle-sam/sam_v1", "model_type": "custom", "spec": TINY.to_dict()},
    )
    return ckpt


def test_cli_export_onnx_and_segment(checkpoint, tmp_path, capsys):
    """An export with options through the CLI; ``segment`` on it gives the dynamic model's
    mask (for one click the single-mask decoder picks the best of three, as segment does)."""
    from PIL import Image

    from paddle_sam import cli

    out = tmp_path / "onnx"
    args = ["export", "--format", "onnx", "--checkpoint", str(checkpoint), "-o", str(out)]
    flags = ["--return-single-mask", "--opset", "16", "--dynamic-batch"]
    assert cli.main([*args, *flags]) == 0
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["opset"] == 16 and manifest["encoder"]["dynamic_batch"] is True
    assert manifest["decoder"]["return_single_mask"] is True
    Image.fromarray(image(H, W, seed=2)).save(tmp_path / "img.png")
    common = ["segment", str(tmp_path / "img.png"), "--point", "50,60"]
    assert cli.main([*common, "--exported", str(out), "-o", str(tmp_path / "s")]) == 0
    assert cli.main([*common, "--checkpoint", str(checkpoint), "-o", str(tmp_path / "d")]) == 0
    a = np.asarray(Image.open(tmp_path / "s" / "mask.png"))
    b = np.asarray(Image.open(tmp_path / "d" / "mask.png"))
    np.testing.assert_array_equal(a, b)
    # one mask from this export: no candidate files, and an explicit --multimask is refused
    assert not list((tmp_path / "s").glob("mask_*.png"))
    assert json.loads((tmp_path / "s" / "result.json").read_text())["multimask_output"] is False
    multimask = [*common, "--multimask", "--exported", str(out), "-o", str(tmp_path / "m")]
    assert cli.main(multimask) == 2
    assert "--return-single-mask" in capsys.readouterr().err


def test_cli_onnx_options(checkpoint, tmp_path, capsys):
    """Every ONNX flag reaches ``export_onnx``; misuse is refused before any model loads."""
    from paddle_sam import cli
    from paddle_sam.cli.export import _check_onnx_options

    def options(*argv):
        return _check_onnx_options(cli.build_parser().parse_args(["export", "-o", "x", *argv]))

    assert options("--format", "onnx") == {
        "return_single_mask": False,
        "use_stability_score": False,
        "return_extra_metrics": False,
        "gelu_approximate": False,
        "dynamic_batch": False,
        "quantize": None,
        "opset": 17,
    }
    every = ["--return-single-mask", "--use-stability-score", "--return-extra-metrics"]
    every += ["--gelu-approximate", "--dynamic-batch", "--quantize", "int8", "--opset", "18"]
    got = options("--format", "onnx", *every)
    assert got == {**dict.fromkeys(got, True), "quantize": "int8", "opset": 18}
    assert options("--format", "pir") == {}
    base = ["export", "--checkpoint", str(checkpoint)]
    capsys.readouterr()
    for bad, says in [
        (["--format", "pir", "--return-single-mask"], "--return-single-mask: for --format onnx"),
        (["--quantize", "int8", "--dynamic-batch"], "--dynamic-batch, --quantize: for --format"),
        (["--format", "onnx", "--opset", "9"], "--opset must be an integer >= 11"),
    ]:
        assert cli.main([*base, *bad, "-o", str(tmp_path / "bad")]) == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_encoder_on_openvino(exported, pair):
    """``encoder_runtime="openvino"``: the same embedding as onnxruntime's (fp32) and the same
    answers; bf16 where the CPU has it (not the fp32 answer, close to it), refused elsewhere;
    the CLI's ``--precision bf16`` on an ONNX folder takes this path."""
    pytest.importorskip("openvino")
    from paddle_sam import loading
    from paddle_sam._runtime import bf16_refusal

    op, _ = pair
    d = exported[0]
    ov = OnnxSamPredictor(d, threads=2, encoder_runtime="openvino")
    assert "image_encoder" not in ov._sessions
    img = image(H, W, seed=6)
    ov.set_image(img)
    emb = op.get_image_embedding()
    np.testing.assert_allclose(ov.get_image_embedding(), emb, rtol=0, atol=1e-4)
    prompt = {"point_coords": np.array([[60.0, 40.0]]), "point_labels": np.array([1])}
    a, b = op.predict(**prompt), ov.predict(**prompt)
    np.testing.assert_allclose(b[1], a[1], atol=1e-4)
    with pytest.raises(ValueError, match="onnxruntime computes in fp32"):
        OnnxSamPredictor(d, precision="bf16")
    with pytest.raises(ValueError, match="encoder_runtime must be"):
        OnnxSamPredictor(d, encoder_runtime="tvm")
    source = loading.resolve(exported=d)
    if bf16_refusal() is not None:
        with pytest.raises(ValueError, match="bf16"):
            loading.load_image_predictor(source, precision="bf16")
        return
    bf16 = loading.load_image_predictor(source, precision="bf16")
    assert (bf16.encoder_runtime, bf16.precision) == ("openvino", "bf16")
    bf16.set_image(img)
    got = bf16.get_image_embedding()
    cosine = float((emb * got).sum() / np.linalg.norm(emb) / np.linalg.norm(got))
    assert np.abs(got - emb).max() > 0 and cosine > 0.99, cosine


def test_cli_precision_int8_runs_the_int8_files(exported, tmp_path, capsys):
    """``segment --exported DIR --precision int8`` answers with the int8 files (what
    ``OnnxSamPredictor(quantized=True)`` answers); an export without them is refused by
    name, and so is int8 on a runtime that has none."""
    from PIL import Image

    from paddle_sam import cli

    d = exported[0]
    img = image(H, W, seed=2)
    Image.fromarray(img).save(tmp_path / "img.png")
    common = ["segment", str(tmp_path / "img.png"), "--point", "50,60", "--exported"]
    assert cli.main([*common, str(d), "--precision", "int8", "-o", str(tmp_path / "q")]) == 0
    q = OnnxSamPredictor(d, quantized=True)
    q.set_image(img)
    _, scores, _ = q.predict(np.array([[50, 60]]), np.array([1]))
    result = json.loads((tmp_path / "q" / "result.json").read_text())
    np.testing.assert_allclose(result["scores"], scores, atol=1e-6)
    fp32 = OnnxSamPredictor(d)
    fp32.set_image(img)
    assert not np.allclose(fp32.predict(np.array([[50, 60]]), np.array([1]))[1], scores)
    plain = tmp_path / "plain"
    export_onnx(build_sam(TINY), plain)  # no --quantize int8
    capsys.readouterr()
    assert cli.main([*common, str(plain), "--precision", "int8", "-o", str(tmp_path / "r")]) == 2
    assert "--quantize int8" in capsys.readouterr().err


def test_calibrated_int8_encoder_on_openvino(checkpoint, model, pair, tmp_path, capsys):
    """``--quantize int8 --calibration IMAGES``: besides onnxruntime's files, the encoder for
    OpenVINO with int8 weights and activations calibrated on the images (activation quantise
    nodes in the file, a quarter of the weight bytes), which ``--precision int8`` then runs
    (the decoder in fp32): close to fp32, not equal to it. Refused by name: calibration
    without --quantize, an image of the wrong kind, int8 on OpenVINO without the file."""
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    import openvino
    from PIL import Image

    from paddle_sam import cli, loading
    from paddle_sam._runtime import int8_activation_note

    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(image(H, W, seed=20 + i)).save(folder / f"{i}.png")
    out = tmp_path / "int8"
    base = ["export", "--format", "onnx", "--checkpoint", str(checkpoint), "-o", str(out)]
    assert cli.main([*base, "--calibration", str(folder)]) == 2
    assert "--quantize int8" in capsys.readouterr().err
    assert cli.main([*base, "--quantize", "int8", "--calibration", str(folder)]) == 0
    said = capsys.readouterr()
    assert "on 3 of 3 images" in said.out
    # a CPU without VNNI is told that int8 activations will not pay on it
    assert ("no VNNI" in said.err) == (int8_activation_note() is not None)
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["programs"]["image_encoder_int8"] == [
        "image_encoder.int8.xml",
        "image_encoder.int8.bin",
    ]
    info = manifest["quantized"]["openvino"]
    assert info["calibration_images"] == 3 and "activations" in info["method"]
    assert (out / "image_encoder.quant.onnx").is_file()  # onnxruntime's files as before
    ops = openvino.Core().read_model(str(out / "image_encoder.int8.xml")).get_ops()
    assert "FakeQuantize" in {op.get_type_name() for op in ops}
    # the weights in 7 bits, as the manifest says: two u8 x s8 products summed cannot
    # overflow the 16-bit sums of a CPU without VNNI (8 bits would reach 127)
    assert info["weight_bits"] == 7
    weights = [
        op.get_data()
        for op in ops
        if op.get_type_name() == "Constant" and op.get_element_type() == openvino.Type.i8
    ]
    assert weights and max(int(np.abs(w.astype(np.int16)).max()) for w in weights) <= 64
    assert (out / "image_encoder.int8.bin").stat().st_size < 0.6 * (
        out / "image_encoder.onnx"
    ).stat().st_size

    op, _ = pair  # the same weights, fp32 on onnxruntime
    q = loading.load_image_predictor(loading.resolve(exported=out), precision="int8")
    assert (q.encoder_runtime, q.precision) == ("openvino", "int8")
    img = image(H, W, seed=6)
    q.set_image(img)
    emb, got = op.get_image_embedding(), q.get_image_embedding()
    cosine = float((emb * got).sum() / np.linalg.norm(emb) / np.linalg.norm(got))
    assert not np.array_equal(emb, got) and cosine > 0.99, cosine
    prompt = {"point_coords": np.array([[60.0, 40.0]]), "point_labels": np.array([1])}
    ious = [
        _iou(a, b) for a, b in zip(op.predict(**prompt)[0], q.predict(**prompt)[0], strict=True)
    ]
    print(f"\ncalibrated int8 vs fp32: embedding cosine {cosine:.5f}, mask IoUs {ious}")
    assert min(ious) > 0.8

    Image.fromarray(img).save(tmp_path / "img.png")
    seg = ["segment", str(tmp_path / "img.png"), "--point", "60,40", "--precision", "int8"]
    assert cli.main([*seg, "--exported", str(out), "-o", str(tmp_path / "s")]) == 0
    _, scores, _ = q.predict(**prompt)
    result = json.loads((tmp_path / "s" / "result.json").read_text())
    np.testing.assert_allclose(result["scores"], scores, atol=1e-6)

    with pytest.raises(ValueError, match="calibration image 0"):
        export_onnx(model, tmp_path / "x", quantize="int8", calibration=[img[..., :2]])
    with pytest.raises(ValueError, match="quantize='int8'"):
        export_onnx(model, tmp_path / "x", calibration=[img])
    assert not (tmp_path / "x").exists()
    with pytest.raises(ExportFormatError, match="--calibration"):
        OnnxSamPredictor(pair[0].export_dir, encoder_runtime="openvino", precision="int8")


def _mlp_model(openvino, rng):
    """A small transformer-like OpenVINO model: Linear, GELU, Linear, residual, Linear."""
    import openvino.opset13 as ops

    def linear(x, n_in, n_out):
        w = ops.constant(rng.standard_normal((n_out, n_in)).astype(np.float32) * 0.2)
        b = ops.constant(rng.standard_normal(n_out).astype(np.float32) * 0.1)
        return ops.add(ops.matmul(x, w, False, True), b)

    x = ops.parameter([1, 64, 32], np.float32, name="x")
    h = linear(ops.gelu(linear(x, 32, 96), "erf"), 96, 32)
    y = linear(ops.add(h, x), 32, 16)
    return openvino.Model([y], [x], "mlp")


def test_calibration_statistics_come_first_and_change_nothing(tmp_path, monkeypatch):
    """During calibration NNCF's statistics models list the statistics first, in graph order,
    and the model's own output last (OpenVINO then computes each statistic as soon as its
    activation; NNCF's own order held them all to the end: 20 GB for SAM 3's backbone).
    The file written is byte for byte the one NNCF writes without the reordering."""
    pytest.importorskip("nncf")
    import openvino
    from nncf.openvino.graph.model_transformer import OVModelTransformer

    from paddle_sam.export import onnx as export_onnx

    rng = np.random.default_rng(5)
    source = tmp_path / "mlp.xml"
    openvino.save_model(_mlp_model(openvino, rng), str(source), compress_to_fp16=False)
    data = [rng.standard_normal((1, 64, 32)).astype(np.float32) for _ in range(3)]

    original = OVModelTransformer.__dict__["_insert_outputs"]

    def spy(model, outputs):  # NNCF's own method, to see that it is put back afterwards
        return original.__func__(model, outputs)

    monkeypatch.setattr(OVModelTransformer, "_insert_outputs", staticmethod(spy))
    with export_onnx.statistics_outputs_first() as applied:
        assert applied  # the pinned NNCF has the method it reorders
        model = openvino.Core().read_model(str(source))
        first = OVModelTransformer._insert_outputs(
            model, [(op.output(0), 0, None) for op in model.get_ordered_ops()[::-1][2:8]]
        )
    assert OVModelTransformer.__dict__["_insert_outputs"].__func__ is spy  # put back
    names = [r.input_value(0).get_node().get_friendly_name() for r in first.get_results()]
    order = [op.get_friendly_name() for op in model.get_ordered_ops()]
    assert (
        len(names) == 7
        and names[-1] == model.get_results()[0].input_value(0).get_node().get_friendly_name()
    )
    assert [order.index(n) for n in names[:-1]] == sorted(order.index(n) for n in names[:-1])

    monkeypatch.setattr(OVModelTransformer, "_insert_outputs", original)
    export_onnx.quantize_int8(source, tmp_path / "reordered.xml", data)
    assert (tmp_path / "reordered.bin").stat().st_size > 0
    monkeypatch.setattr(export_onnx, "statistics_outputs_first", contextlib.nullcontext)
    export_onnx.quantize_int8(source, tmp_path / "nncf_order.xml", data)
    assert (tmp_path / "reordered.bin").read_bytes() == (tmp_path / "nncf_order.bin").read_bytes()

    def graph(name):  # the xml without the numbers OpenVINO counts up for unnamed nodes
        text = (tmp_path / name).read_text()
        return re.sub(r'name="([A-Za-z]+)_[0-9]+"', r'name="\1"', text)

    assert graph("reordered.xml") == graph("nncf_order.xml")
    ops = openvino.Core().read_model(str(tmp_path / "reordered.xml")).get_ops()
    assert "FakeQuantize" in {op.get_type_name() for op in ops}
