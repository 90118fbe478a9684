"""SAM 3 PIR export + ``StaticSam3Processor`` (Paddle Inference) against the dynamic
``Sam3Processor``: reduced configuration, random weights in every tensor, CPU.

Measured here (Paddle 3.3.1, 2 cores), static vs dynamic at threshold 0 (every query), over
the five prompt cases on two images: scores <= 2.1e-7, boxes <= 1e-4 px, mask probabilities
<= 2.2e-6, raw decoder outputs <= 1.5e-6 (query logits) and 1.4e-5 (low-res mask logits); no
thresholded mask pixel differed (the bar allows pixels within 1e-4 of 0.5).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import paddle
import pytest
from PIL import Image

from paddle_sam.align.sam_v1 import compare
from paddle_sam.convert.core import save_pdparams
from paddle_sam.deploy.sam3 import StaticSam3Processor
from paddle_sam.deploy.sam_v1 import ExportFormatError
from paddle_sam.export.sam3 import FUSED_KERNEL, PromptDecoder, attention_kernel, export_sam3
from paddle_sam.loading.sam3 import build_sam3_image_model, load_sam3
from paddle_sam.predict.outputs import MARKER, owned
from paddle_sam.predict.sam3.processor import Sam3Processor
from tests.helpers.sam3_ref import attention_path, run_prompts
from tests.helpers.specs import tiny_sam3_spec

pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

TINY = tiny_sam3_spec()
H, W = 90, 130
BOX = [0.45, 0.5, 0.3, 0.4]
CASES = {
    "text": [("text", "a red car")],  # no box: the decoder gets one masked padding box
    "box": [("box", BOX, True)],
    "text+box": [("text", "a red car"), ("box", BOX, True)],
    "negative box": [
        ("text", "the dog"),
        ("box", BOX, True),
        ("box", [0.7, 0.3, 0.2, 0.2], False),
    ],
    "boxes only, one negative": [("box", BOX, True), ("box", [0.2, 0.7, 0.25, 0.3], False)],
}


def image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth random image with a bright rectangle (not pure noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), (x + y) % 256], -1)
    img = (img + rng.integers(0, 40, (h, w, 3))).clip(0, 255)
    img[h // 4 : h // 2, w // 3 : 2 * w // 3] = [250, 240, 30]
    return img.astype(np.uint8)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A converted tiny checkpoint (.pdparams + sidecar): Paddle's initialisation with every
    tensor perturbed, so norms at 1 and biases at 0 matter too."""
    paddle.seed(11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights
        built = build_sam3_image_model(spec=TINY)
    rng = np.random.default_rng(11)
    state = {}
    for key, value in built.state_dict().items():
        v = value.numpy()
        noise = rng.standard_normal(v.shape) * (np.abs(v).mean() + 0.5)
        state[key] = (v + 0.02 * noise).astype(np.float32)
    path = tmp_path_factory.mktemp("sam3_ckpt") / "sam3_tiny.pdparams"
    meta = {
        "format": "paddle-sam/sam3",
        "model_type": "sam3",
        "spec": dataclasses.asdict(TINY),
        "interactive": False,
        "source": {"file": "random", "sha256": "1" * 64, "layout": "official"},
    }
    save_pdparams(state, path, meta)
    return path


@pytest.fixture(scope="module")
def model(ckpt):
    return load_sam3(ckpt)


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("sam3_export") / "tiny"
    return d, export_sam3(model, d, source_sha256="1" * 64, spec=TINY)


@pytest.fixture(scope="module")
def pair(model, exported):
    d, _ = exported
    static = StaticSam3Processor(d, confidence_threshold=0.0)
    dynamic = Sam3Processor(model, resolution=TINY.image_size, confidence_threshold=0.0)
    return static, dynamic


def assert_same_results(s: dict, d: dict, name: str) -> None:
    for key, bound in (("scores", 1e-5), ("masks_logits", 1e-4), ("boxes", 1e-3)):
        a, b = s[key].numpy(), d[key].numpy()
        assert a.shape == b.shape, f"{name} {key}: {a.shape} vs {b.shape}"
        diff = float(np.abs(a - b).max(initial=0.0))
        assert diff <= bound, f"{name} {key}: max abs diff {diff:.3g} > {bound:g}"
    row = compare("masks", d["masks"].numpy(), s["masks"].numpy(), d["masks_logits"].numpy(), 0.5)
    assert row.agreement_decided == 1.0 and row.agreement >= 0.9999, f"{name}: {row}"


def test_files_and_manifest(exported):
    d, manifest = exported
    names = sorted(p.name for p in d.iterdir() if p.name != MARKER)
    assert sorted(owned(d)) == names  # every file recorded as paddle-sam's
    assert names == sorted(
        ["export.json"] + [f"{p}.{e}" for p in manifest["programs"] for e in ("json", "pdiparams")]
    )
    assert json.loads((d / "export.json").read_text()) == manifest
    assert manifest["format"] == "paddle-sam/sam3-static" and manifest["format_version"] == 1
    assert set(manifest["programs"]) == {"backbone", "text_encoder", "prompt_decoder"}
    assert manifest["image_size"] == TINY.image_size
    assert manifest["context_length"] == TINY.context_length
    assert manifest["spec"] == dataclasses.asdict(TINY) | {
        "encoder_global_attn_indexes": list(TINY.encoder_global_attn_indexes),
        "scale_factors": list(TINY.scale_factors),
        "conv_stem": [list(layer) for layer in TINY.conv_stem],
    }
    assert manifest["source_sha256"] == "1" * 64
    assert manifest["paddle_version"] == paddle.__version__
    # no attention of the tiny model is long enough for the fused CPU kernel: runs anywhere
    assert manifest["cpu_fused_attention"] is False
    assert not any(FUSED_KERNEL in (d / f"{p}.json").read_text() for p in manifest["programs"])


def test_fused_attention_export(model, pair, tmp_path, monkeypatch):
    """With the kernel's length floor lowered to the tiny sizes, the ViT and fusion-encoder
    self-attentions go into the programs as Paddle's fused CPU kernel: same results as the
    dynamic model without it; the manifest says so and the runtime refuses such an export
    where the kernel cannot run. ``fused_attention=False`` keeps it out."""
    attention_path(monkeypatch, fused=True)  # skips where the kernel cannot run
    d = tmp_path / "fused"
    manifest = export_sam3(model, d, fused_attention=True)
    assert manifest["cpu_fused_attention"] is True
    for prog in ("backbone", "prompt_decoder"):  # ViT blocks; fusion encoder
        assert FUSED_KERNEL in (d / f"{prog}.json").read_text(), prog
    static = StaticSam3Processor(d, confidence_threshold=0.0)
    _, dynamic = pair
    img = image(H, W, seed=3)
    with attention_kernel(dynamic.model, False):
        for case in ("text+box", "negative box"):
            s, r = run_prompts(static, img, CASES[case]), run_prompts(dynamic, img, CASES[case])
            assert_same_results(s, r, f"fused kernel, {case}")
    with pytest.raises(ValueError, match="fused CPU attention.*device='gpu'.*--no-fused"):
        StaticSam3Processor(d, device="gpu")
    from paddle_sam.deploy import sam3 as static_sam3

    monkeypatch.setattr(static_sam3, "fused_attention_available", lambda: False)
    with pytest.raises(ValueError, match="fused CPU attention.*lacks AVX-512F"):
        StaticSam3Processor(d)
    plain = export_sam3(model, tmp_path / "plain", fused_attention=False)
    assert plain["cpu_fused_attention"] is False
    for prog in plain["programs"]:
        assert FUSED_KERNEL not in (tmp_path / "plain" / f"{prog}.json").read_text()


@pytest.mark.parametrize("case", list(CASES))
def test_static_matches_dynamic(pair, case):
    """Every query kept (threshold 0): scores, boxes, mask probabilities, binary masks."""
    static, dynamic = pair
    img = image(H, W, seed=3)
    s = run_prompts(static, img, CASES[case])
    d = run_prompts(dynamic, img, CASES[case])
    assert s["scores"].shape == [TINY.num_queries]
    assert s["masks"].shape == [TINY.num_queries, 1, H, W]
    assert_same_results(s, d, case)
    # not a parity of trivial outputs
    assert s["boxes"].numpy().std() > 1.0 and 0 < s["masks"].numpy().mean() < 1


@pytest.mark.parametrize("case", ["text", "negative box"])
def test_decoder_logits(pair, case):
    """The program's raw outputs (before any post-processing) against forward_grounding."""
    static, dynamic = pair
    img = image(H, W, seed=5)
    s = run_prompts(static, img, CASES[case])
    d = run_prompts(dynamic, img, CASES[case])
    out_s, out_d = static._run_heads(s), dynamic._run_heads(d)
    for key in ("pred_logits", "pred_boxes", "presence_logit_dec", "pred_masks"):
        diff = float(np.abs(out_s[key].numpy() - out_d[key].numpy()).max())
        assert diff <= 1e-4, f"{case} {key}: {diff:.3g}"


def test_padding_box_is_no_box(model, pair):
    """No box in the static graph is one padding box with mask True. In dygraph, that
    decoder layer with the padding box equals the dynamic model on the empty prompt (to
    float rounding), and the padding box's value does not matter at all."""
    static, dynamic = pair
    d = run_prompts(dynamic, image(H, W, seed=7), CASES["text"])
    ref = dynamic._run_heads(d)
    layer = PromptDecoder(model)
    feeds = static.decoder_feeds(run_prompts(static, image(H, W, seed=7), CASES["text"]))
    assert feeds["box_mask"].tolist() == [[True]]

    def run(boxes, labels):
        with paddle.no_grad():
            return layer(
                list(d["backbone_out"]["backbone_fpn"]),
                d["backbone_out"]["language_features"],
                d["backbone_out"]["language_mask"],
                paddle.to_tensor(boxes, "float32"),
                paddle.to_tensor(labels, "int64"),
                paddle.to_tensor([[True]]),
            )

    padded = run(feeds["boxes"], feeds["box_labels"])
    other = run([[[0.1, 0.8, 0.05, 0.1]]], [[1]])
    for key, a, b in zip(
        ("pred_logits", "pred_boxes", "presence", "pred_masks"), padded, other, strict=True
    ):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=key)
    for key, a in zip(
        ("pred_logits", "pred_boxes", "presence_logit_dec", "pred_masks"), padded, strict=True
    ):
        # measured: <= 8.2e-7 (queries, boxes, presence), 8.6e-6 (low-res mask logits): the
        # extra masked key changes only the GEMMs' summation order
        bound = 5e-5 if key == "pred_masks" else 1e-5
        diff = float(np.abs(a.numpy() - ref[key].numpy()).max())
        assert diff <= bound, f"{key}: padded vs no box {diff:.3g}"


def test_caches_threshold_and_reset(pair, monkeypatch):
    """Backbone features stay in the state; a new text reruns text encoder + decoder only,
    a text seen before reruns the decoder only; threshold and reset as the dynamic one."""
    from paddle_sam.deploy import sam3 as static_sam3

    static, dynamic = pair
    calls = []
    real = static_sam3.run_predictor

    def counting(predictor, inputs):
        calls.append(next(iter(inputs)))
        return real(predictor, inputs)

    monkeypatch.setattr(static_sam3, "run_predictor", counting)
    img = image(70, 60, seed=5)
    state = static.set_image(img)
    backbone = state["backbone_out"]
    assert calls == ["image"]
    state = static.set_text_prompt("a cat never seen", state)
    assert calls[1:] == ["token_ids", "backbone_fpn_0"]
    state = static.set_text_prompt("a cat never seen", state)
    assert calls[3:] == ["backbone_fpn_0"]
    assert state["backbone_out"] is backbone
    scores = state["scores"].numpy()
    cut = float(np.median(scores))
    state = static.set_confidence_threshold(cut, state)
    assert len(state["scores"]) == int((scores > cut).sum())
    state = static.set_confidence_threshold(1.0, state)
    assert state["masks"].shape == [0, 1, 70, 60] and state["boxes"].shape == [0, 4]
    static.set_confidence_threshold(0.0)
    static.reset_all_prompts(state)
    assert "language_features" not in state["backbone_out"] and "scores" not in state
    assert state["backbone_out"] is backbone
    d = run_prompts(dynamic, img, CASES["box"])
    assert_same_results(static.add_geometric_prompt(BOX, True, state), d, "after reset")


def test_set_image_batch(pair):
    static, dynamic = pair
    imgs = [image(40, 50, seed=1), image(60, 30, seed=2)]
    s, d = static.set_image_batch(imgs), dynamic.set_image_batch(imgs)
    assert s["original_heights"] == [40, 60] and s["original_widths"] == [50, 30]
    for a, b in zip(
        s["backbone_out"]["backbone_fpn"], d["backbone_out"]["backbone_fpn"], strict=True
    ):
        assert a.shape == tuple(b.shape)
        np.testing.assert_allclose(a, b.numpy(), atol=1e-4)
    with pytest.raises(ValueError, match="set_image"):
        static.set_text_prompt("x", s)


def test_same_errors_as_dynamic(pair):
    static, _ = pair
    with pytest.raises(ValueError, match="set_image before"):
        static.set_text_prompt("x", {})
    state = static.set_image(image(30, 40))
    with pytest.raises(ValueError, match="4 finite numbers"):
        static.add_geometric_prompt([0.5, 0.5, 0.2], True, state)
    with pytest.raises(TypeError, match="string"):
        static.set_text_prompt(3, state)


def test_reload_in_fresh_process(model, exported, tmp_path):
    """Nothing but paddle and paddle_sam: the folder alone reproduces the results."""
    d, _ = exported
    img = image(H, W, seed=9)
    np.save(tmp_path / "img.npy", img)
    code = (
        "import sys, numpy as np\n"
        "from paddle_sam.deploy.sam3 import StaticSam3Processor\n"
        f"p = StaticSam3Processor({str(d)!r}, confidence_threshold=0.0)\n"
        f"s = p.set_image(np.load({str(tmp_path / 'img.npy')!r}))\n"
        "s = p.set_text_prompt('a red car', s)\n"
        f"s = p.add_geometric_prompt({BOX}, True, s)\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, "
        "**{k: s[k].numpy() for k in ('scores', 'boxes', 'masks', 'masks_logits')})\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    out = np.load(tmp_path / "out.npz")
    dynamic = Sam3Processor(model, resolution=TINY.image_size, confidence_threshold=0.0)
    want = run_prompts(dynamic, img, CASES["text+box"])
    got = {k: paddle.to_tensor(out[k]) for k in out.files}
    assert_same_results(got, want, "fresh process")


def test_corrupt_or_missing_files(exported, tmp_path):
    d, _ = exported
    with pytest.raises(FileNotFoundError, match="not found"):
        StaticSam3Processor(tmp_path / "nope")
    broken = tmp_path / "broken"
    shutil.copytree(d, broken)
    (broken / "text_encoder.pdiparams").unlink()
    with pytest.raises(ExportFormatError, match="text_encoder.pdiparams is missing"):
        StaticSam3Processor(broken)
    shutil.copy(d / "text_encoder.pdiparams", broken / "text_encoder.pdiparams")
    (broken / "prompt_decoder.pdiparams").write_bytes(b"")
    with pytest.raises(ExportFormatError, match="prompt_decoder.pdiparams is missing or empty"):
        StaticSam3Processor(broken)
    shutil.copy(d / "prompt_decoder.pdiparams", broken / "prompt_decoder.pdiparams")
    (broken / "backbone.json").write_text("{ not a program")
    with pytest.raises(ExportFormatError, match="backbone"):
        StaticSam3Processor(broken)
    manifest = json.loads((d / "export.json").read_text())
    (broken / "export.json").write_text(json.dumps(manifest | {"format_version": 0}))
    with pytest.raises(ExportFormatError, match="export the model again"):
        StaticSam3Processor(broken)
    (broken / "export.json").write_text(
        json.dumps(manifest | {"format": "paddle-sam/sam_v1-static"})
    )
    with pytest.raises(ExportFormatError, match="format"):
        StaticSam3Processor(broken)


def test_options_and_onednn(exported, pair):
    """oneDNN runs the text encoder by default; without it the results are the same."""
    d, _ = exported
    static, _ = pair
    assert static.options["onednn"] == {
        "backbone": False,
        "text_encoder": True,
        "prompt_decoder": False,
    }
    plain = StaticSam3Processor(d, onednn=False, threads=1, confidence_threshold=0.0)
    assert not any(plain.options["onednn"].values())
    img = image(H, W, seed=4)
    assert_same_results(
        run_prompts(plain, img, CASES["text"]), run_prompts(static, img, CASES["text"]), "onednn"
    )
    with pytest.raises(ValueError, match="device"):
        StaticSam3Processor(d, device="tpu")


def test_export_refuses_to_overwrite(model, exported):
    d, _ = exported
    before = (d / "export.json").read_text()
    with pytest.raises(FileExistsError, match="overwrite"):
        export_sam3(model, d)
    assert (d / "export.json").read_text() == before


def test_cli_export_and_segment_exported(ckpt, tmp_path):
    from paddle_sam import cli

    exp = tmp_path / "exp"
    assert cli.main(["export", "--checkpoint", str(ckpt), "-o", str(exp)]) == 0
    manifest = json.loads((exp / "export.json").read_text())
    assert manifest["format"] == "paddle-sam/sam3-static"
    assert manifest["source_sha256"] == "1" * 64
    Image.fromarray(image(H, W, seed=2)).save(tmp_path / "img.png")
    common = [
        "segment",
        str(tmp_path / "img.png"),
        "--text",
        "a yellow box",
        "--box",
        "40,20,90,45",
        "--confidence-threshold",
        "0.0",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main([*common, "--exported", str(exp), "-o", str(tmp_path / "s")]) == 0
        assert cli.main([*common, "--checkpoint", str(ckpt), "-o", str(tmp_path / "d")]) == 0
    a = json.loads((tmp_path / "s" / "annotations.json").read_text())["annotations"]
    b = json.loads((tmp_path / "d" / "annotations.json").read_text())["annotations"]
    assert len(a) == len(b) == TINY.num_queries
    np.testing.assert_allclose([x["score"] for x in a], [x["score"] for x in b], atol=1e-5)
    np.testing.assert_allclose([x["bbox"] for x in a], [x["bbox"] for x in b], atol=1e-3)
    areas_a, areas_b = [x["area"] for x in a], [x["area"] for x in b]
    assert all(abs(p - q) <= 2 for p, q in zip(areas_a, areas_b, strict=True)), (areas_a, areas_b)
    # one runtime at a time, clear errors
    both = [*common, "--exported", str(exp), "--checkpoint", str(ckpt), "-o", str(tmp_path / "x")]
    assert cli.main(both) == 2
    assert cli.main([*common, "--exported", str(tmp_path / "nope"), "-o", str(tmp_path / "y")]) == 2
    # ONNX (for OpenVINO) takes none of the PIR options
    argv = ["export", "--checkpoint", str(ckpt), "--format", "onnx", "--no-fused-attention"]
    assert cli.main([*argv, "-o", str(tmp_path / "z")]) == 2
    assert not (tmp_path / "z").exists()


def test_conv_stem_model_exports(tmp_path):
    """A small model's options (``conv_stem`` with batch norm, ``encoder_init_values``) export
    and run the same as the dynamic model (batch norm with its running statistics)."""
    spec = dataclasses.replace(TINY, conv_stem=((8, 2), (16, 1)), encoder_init_values=0.1)
    paddle.seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights
        model = build_sam3_image_model(spec=spec)
    for layer in model.sublayers():  # running statistics that are not 0 and 1
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer._mean.set_value(paddle.rand(layer._mean.shape) - 0.5)
            layer._variance.set_value(paddle.rand(layer._variance.shape) + 0.5)
    model.eval()
    d = tmp_path / "stem"
    export_sam3(model, d, source_sha256="1" * 64, spec=spec)
    static = StaticSam3Processor(d, confidence_threshold=0.0)
    dynamic = Sam3Processor(model, resolution=spec.image_size, confidence_threshold=0.0)
    img = image(H, W, seed=4)
    assert_same_results(
        run_prompts(static, img, CASES["text"]), run_prompts(dynamic, img, CASES["text"]), "stem"
    )
