"""PIR static export + Paddle Inference runtime against the dynamic model (tiny config, CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import paddle
import pytest

from paddle_sam import SamPredictor, build_sam
from paddle_sam.deploy import StaticSamPredictor
from paddle_sam.deploy.sam_v1 import ExportFormatError
from paddle_sam.export.sam_v1 import (
    DecoderImageTerms,
    FewTokenDecoder,
    PromptDecoder,
    decoder_formulation,
    export_sam,
)
from paddle_sam.predict.outputs import MARKER, owned
from tests.helpers.pairs import image
from tests.helpers.specs import TINY

H, W = 150, 230


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    paddle.seed(3)
    model = build_sam(TINY)
    d = tmp_path_factory.mktemp("export") / "tiny"
    manifest = export_sam(model, d, model_type="tiny")
    return model, d, manifest


@pytest.fixture(scope="module")
def pair(exported):
    model, d, _ = exported
    sp, dp = StaticSamPredictor(d), SamPredictor(model)
    img = image(H, W, seed=4)
    sp.set_image(img)
    dp.set_image(img)
    return sp, dp


def _same(a, b):
    np.testing.assert_allclose(a[2], b[2], atol=1e-4, rtol=0)  # low-res logits
    np.testing.assert_array_equal(a[0], b[0])  # masks
    np.testing.assert_allclose(a[1], b[1], atol=1e-5)  # IoU


def test_files_and_manifest(exported):
    _, d, manifest = exported
    names = sorted(p.name for p in d.iterdir() if p.name != MARKER)
    assert sorted(owned(d)) == names  # every file recorded as paddle-sam's
    assert names == sorted(
        [
            "decoder_image_terms.json",
            "decoder_image_terms.pdiparams",
            "export.json",
            "image_encoder.json",
            "image_encoder.pdiparams",
            "prompt_decoder.json",
            "prompt_decoder.pdiparams",
            "prompt_decoder_few.json",
            "prompt_decoder_few.pdiparams",
        ]
    )
    on_disk = json.loads((d / "export.json").read_text())
    assert on_disk == manifest
    assert manifest["image_size"] == TINY.image_size
    assert manifest["pixel_mean"] == pytest.approx([123.675, 116.28, 103.53])
    assert manifest["paddle_version"] == paddle.__version__
    assert manifest["few_tokens_max"] == 8  # TINY decoder: 16 internal channels, 2 heads
    grid, dim = TINY.image_embedding_size, TINY.prompt_embed_dim
    hw, heads, c = grid * grid, 2, 8  # TINY decoder: 2 heads of 8 channels after downsampling
    assert manifest["image_terms"] == {
        "image_tokens": [1, hw, dim],
        "token_to_image_keys": [1, heads, c, hw],
        "token_to_image_values": [1, heads, hw, c],
        "image_to_token_queries": [1, heads, c, hw],
    }


def test_image_embedding_identical(pair):
    sp, dp = pair
    np.testing.assert_allclose(
        sp.get_image_embedding(), dp.get_image_embedding().numpy(), atol=1e-5
    )


@pytest.mark.parametrize("n", [1, 3, 7])
@pytest.mark.parametrize("multimask", [True, False])
def test_points(pair, n, multimask):
    sp, dp = pair
    rng = np.random.default_rng(n)
    coords = rng.uniform(0, [W, H], size=(n, 2))
    labels = rng.integers(0, 2, n)
    labels[0] = 1
    _same(
        sp.predict(coords, labels, multimask_output=multimask),
        dp.predict(coords, labels, multimask_output=multimask),
    )


@pytest.mark.parametrize("few_tokens_max", [0, 100])
def test_both_decoder_programs(exported, few_tokens_max):
    """The few-token program (reassociated attention) and the general one, each forced for
    prompts it would not get by default, against the dynamic model."""
    model, d, _ = exported
    sp, dp = StaticSamPredictor(d), SamPredictor(model)
    sp._few_tokens_max = few_tokens_max
    img = image(H, W, seed=4)
    sp.set_image(img)
    dp.set_image(img)
    rng = np.random.default_rng(5)
    for n in (1, 7):
        coords, labels = rng.uniform(0, [W, H], size=(n, 2)), np.ones(n, int)
        _same(sp.predict(coords, labels), dp.predict(coords, labels))
    prev = dp.predict(coords, labels)[2][:1]
    _same(
        sp.predict(coords, labels, mask_input=prev, multimask_output=False),
        dp.predict(coords, labels, mask_input=prev, multimask_output=False),
    )


@pytest.mark.parametrize("n", [1, 2])
def test_few_token_decoder_same_function(exported, n):
    """In dygraph: the image terms + few-token decoder (reassociated attention, batched
    hypernetworks, per-token upscaling) against the upstream-form prompt decoder."""
    model, _, _ = exported
    rng = np.random.default_rng(n)
    emb = paddle.to_tensor(rng.standard_normal((1, 32, 16, 16)).astype("float32"))
    coords = paddle.to_tensor(rng.uniform(0, 256, (1, n, 2)).astype("float32"))
    labels = paddle.to_tensor(np.array([[1, 0, -1][:n]], np.float32))
    no_mask = (paddle.zeros([1, 1, 64, 64]), paddle.zeros([1]))
    with paddle.no_grad():
        iou, low_res = PromptDecoder(model)(emb, coords, labels, *no_mask)
        terms = DecoderImageTerms(model)(emb)
        with decoder_formulation(model, few_tokens=True, channels_last=True):
            iou_few, low_res_few = FewTokenDecoder(model)(*terms, coords, labels)
    np.testing.assert_allclose(iou_few.numpy(), iou.numpy(), atol=1e-5)
    np.testing.assert_allclose(low_res_few.numpy(), low_res.numpy(), atol=1e-4)


class _Counted:
    """A Paddle Inference predictor whose ``run`` calls are counted."""

    def __init__(self, predictor):
        self._predictor, self.runs = predictor, 0

    def run(self, *args):
        self.runs += 1
        return self._predictor.run(*args)

    def __getattr__(self, name):
        return getattr(self._predictor, name)


def test_image_terms_once_per_image(exported):
    """The per-image program runs in set_image only; prompts without mask input and few
    tokens run the few-token program on its outputs, the others the general program."""
    model, d, _ = exported
    sp, dp = StaticSamPredictor(d), SamPredictor(model)
    terms = sp._image_terms_program = _Counted(sp._image_terms_program)
    few = sp._decoder_few = _Counted(sp._decoder_few)
    general = sp._decoder = _Counted(sp._decoder)
    for seed in (4, 5):
        img = image(H, W, seed=seed)
        sp.set_image(img)
        dp.set_image(img)
        # 1 + 4 output tokens + n points + 1 padding: few_tokens_max (8) allows n <= 2
        for n in (1, 2, 3):
            coords, labels = np.random.default_rng(n).uniform(0, [W, H], size=(n, 2)), np.ones(n)
            _same(sp.predict(coords, labels), dp.predict(coords, labels))
        _same(
            sp.predict(box=np.array([10, 20, 90, 100])), dp.predict(box=np.array([10, 20, 90, 100]))
        )
    assert (terms.runs, few.runs, general.runs) == (2, 6, 2)
    prev = dp.predict(coords, labels)[2][:1]
    sp.predict(coords[:1], labels[:1], mask_input=prev)  # mask input: the general program
    sp.predict(box=np.array([10, 20, 90, 100]), mask_input=prev)
    assert (terms.runs, few.runs, general.runs) == (2, 6, 4)
    sp.reset_image()
    assert sp.image_terms is None


def test_box_box_with_points_and_mask_input(pair):
    sp, dp = pair
    box = np.array([20, 30, 150, 120])
    pts, lbl = np.array([[60, 70], [140, 40]]), np.array([1, 0])
    _same(sp.predict(box=box, multimask_output=False), dp.predict(box=box, multimask_output=False))
    _same(sp.predict(pts, lbl, box=box), dp.predict(pts, lbl, box=box))
    prev = dp.predict(pts, lbl)[2][:1]
    _same(
        sp.predict(pts, lbl, mask_input=prev, multimask_output=False),
        dp.predict(pts, lbl, mask_input=prev, multimask_output=False),
    )
    logits_s, _, _ = sp.predict(pts, lbl, return_logits=True)
    logits_d, _, _ = dp.predict(pts, lbl, return_logits=True)
    np.testing.assert_allclose(logits_s, logits_d, atol=1e-4)


def test_same_errors_as_dynamic(pair):
    sp, _ = pair
    with pytest.raises(ValueError, match="outside the image"):
        sp.predict(np.array([[W + 5, 10]]), np.array([1]))
    with pytest.raises(ValueError, match="at least one point or a box"):
        sp.predict(mask_input=np.zeros((1, 64, 64), np.float32))
    with pytest.raises(ValueError, match="H x W x 3"):
        sp.set_image(np.zeros((10, 10), np.uint8))


def test_reload_in_fresh_process(exported, tmp_path):
    """Nothing but paddle and paddle_sam: the exported folder alone reproduces the masks."""
    model, d, _ = exported
    img = image(H, W, seed=9)
    np.save(tmp_path / "img.npy", img)
    code = (
        "import sys, numpy as np\n"
        "from paddle_sam.deploy import StaticSamPredictor\n"
        f"p = StaticSamPredictor({str(d)!r})\n"
        f"p.set_image(np.load({str(tmp_path / 'img.npy')!r}))\n"
        "m, s, l = p.predict(np.array([[100, 80]]), np.array([1]))\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, m=m, s=s, l=l)\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    out = np.load(tmp_path / "out.npz")
    dp = SamPredictor(model)
    dp.set_image(img)
    _same((out["m"], out["s"], out["l"]), dp.predict(np.array([[100, 80]]), np.array([1])))


def test_corrupt_or_missing_files(exported, tmp_path):
    _, d, _ = exported
    with pytest.raises(FileNotFoundError, match="not found"):
        StaticSamPredictor(tmp_path / "nope")
    broken = tmp_path / "broken"
    shutil.copytree(d, broken)
    (broken / "prompt_decoder.pdiparams").unlink()
    with pytest.raises(ExportFormatError, match="prompt_decoder.pdiparams is missing"):
        StaticSamPredictor(broken)
    shutil.copy(d / "prompt_decoder.pdiparams", broken / "prompt_decoder.pdiparams")
    (broken / "image_encoder.json").write_text("{ not a program")
    with pytest.raises(ExportFormatError, match="image_encoder"):
        StaticSamPredictor(broken)
    (broken / "export.json").write_text("{}")
    with pytest.raises(ExportFormatError, match="format"):
        StaticSamPredictor(broken)


def test_options(exported):
    _, d, _ = exported
    with pytest.raises(ValueError, match="device"):
        StaticSamPredictor(d, device="tpu")
    with pytest.raises(ValueError, match="tensorrt"):
        StaticSamPredictor(d, backend="tensorrt")
    # memory_optim is refused by Paddle Inference 3.3.x: a warning and a working predictor
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = StaticSamPredictor(d, memory_optim=True, threads=1)
    p.set_image(image(40, 60))
    assert p.predict(np.array([[10, 10]]), np.array([1]))[0].shape == (3, 40, 60)
    if not p.options["memory_optim"]:
        assert any("memory optimisation" in str(w.message) for w in caught)
    assert p.options["onednn"] == {
        "image_encoder": False,
        "prompt_decoder": True,
        "decoder_image_terms": True,
        "prompt_decoder_few": True,
    }


def test_decoder_with_and_without_onednn(exported, pair):
    """oneDNN runs the decoder by default; Paddle's own kernels give the same answer."""
    _, d, _ = exported
    sp, dp = pair
    plain = StaticSamPredictor(d, onednn=False)
    assert not any(plain.options["onednn"].values())
    plain.set_image(image(H, W, seed=4))
    pts, lbl = np.array([[40.0, 50.0], [120, 90]]), np.array([1, 0])
    for p in (sp, plain):
        _same(p.predict(pts, lbl), dp.predict(pts, lbl))


def test_manifest_without_image_terms_refused(exported, tmp_path):
    _, d, _ = exported
    broken = tmp_path / "broken"
    shutil.copytree(d, broken)
    manifest = json.loads((broken / "export.json").read_text())
    del manifest["image_terms"]
    (broken / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportFormatError, match="image_terms"):
        StaticSamPredictor(broken)


def test_old_export_version_refused(exported, tmp_path):
    _, d, _ = exported
    old = tmp_path / "old"
    shutil.copytree(d, old)
    manifest = json.loads((old / "export.json").read_text())
    manifest["format_version"] = 1
    (old / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportFormatError, match="export the model again"):
        StaticSamPredictor(old)


def test_export_refuses_to_overwrite(exported):
    model, d, _ = exported
    before = (d / "export.json").read_text()
    with pytest.raises(FileExistsError, match="overwrite"):
        export_sam(model, d)
    assert (d / "export.json").read_text() == before


def test_cli_export_and_segment_exported(exported, tmp_path, capsys):
    from PIL import Image

    from paddle_sam import cli
    from paddle_sam.convert.core import save_pdparams

    model, _, _ = exported
    ckpt = tmp_path / "tiny.pdparams"
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    save_pdparams(
        state,
        ckpt,
        {
            "format": "paddle-sam/sam_v1",
            "model_type": "custom",
            "spec": TINY.to_dict(),
            "source": {"sha256": "0" * 64},
        },
    )
    assert cli.main(["export", "--checkpoint", str(ckpt), "-o", str(tmp_path / "exp")]) == 0
    said = capsys.readouterr().out
    for name in ("image_encoder", "prompt_decoder", "decoder_image_terms", "prompt_decoder_few"):
        assert f"{name}.json, {name}.pdiparams" in said  # every file written, by name
    manifest = json.loads((tmp_path / "exp" / "export.json").read_text())
    assert manifest["source_sha256"] == "0" * 64
    # a SAM 3 only option is refused, not ignored
    opt = ["export", "--checkpoint", str(ckpt), "-o", str(tmp_path / "e2"), "--fused-attention"]
    assert cli.main(opt) == 2 and not (tmp_path / "e2").exists()
    Image.fromarray(image(H, W, seed=2)).save(tmp_path / "img.png")
    common = ["segment", str(tmp_path / "img.png"), "--point", "50,60", "--box", "10,10,200,140"]
    assert cli.main([*common, "--exported", str(tmp_path / "exp"), "-o", str(tmp_path / "s")]) == 0
    assert cli.main([*common, "--checkpoint", str(ckpt), "-o", str(tmp_path / "d")]) == 0
    a = np.asarray(Image.open(tmp_path / "s" / "mask.png"))
    b = np.asarray(Image.open(tmp_path / "d" / "mask.png"))
    np.testing.assert_array_equal(a, b)
    assert cli.main([*common, "--exported", str(tmp_path / "nope"), "-o", str(tmp_path / "x")]) == 2


def test_image_encoder_on_onednn(exported):
    """The image encoder program on oneDNN (fp32; padded windows and relative positions, one
    fusion pass of Paddle Inference 3.3.1 left out) gives the dynamic model's embedding and
    masks."""
    model, d, _ = exported
    sp = StaticSamPredictor(d, onednn_encoder=True)
    assert sp.options["onednn"]["image_encoder"], "oneDNN fell back on the image encoder"
    dp = SamPredictor(model)
    img = image(H, W, seed=9)
    sp.set_image(img)
    dp.set_image(img)
    np.testing.assert_allclose(
        sp.get_image_embedding(), dp.get_image_embedding().numpy(), atol=1e-4, rtol=0
    )
    pts, lbl = np.array([[60.0, 40.0]]), np.array([1])
    got, want = sp.predict(pts, lbl), dp.predict(pts, lbl)
    assert (got[0] == want[0]).mean() >= 0.999
    np.testing.assert_allclose(got[1], want[1], atol=1e-4)


def test_bf16_precision(exported):
    """precision='bf16' runs on CPUs with avx512_bf16 or AMX (detected at run time), with
    masks agreeing with fp32's; elsewhere it is refused with a clear error, and a bad value
    or a GPU device too."""
    from paddle_sam._runtime import bf16_refusal

    model, d, _ = exported
    with pytest.raises(ValueError, match="precision must be one of"):
        StaticSamPredictor(d, precision="fp16")
    with pytest.raises(ValueError, match="tensorrt"):
        StaticSamPredictor(d, precision="bf16", device="gpu")
    refusal = bf16_refusal()
    if refusal is not None:
        with pytest.raises(ValueError, match="avx512_bf16 or AMX.*avx512_bf16 no"):
            StaticSamPredictor(d, precision="bf16")
        return
    sp, ref = StaticSamPredictor(d, precision="bf16"), StaticSamPredictor(d)
    assert all(sp.options["onednn"].values())
    img = image(H, W, seed=9)
    sp.set_image(img)
    ref.set_image(img)
    for pt in ([60.0, 40.0], [150.0, 100.0], [20.0, 120.0]):
        got = sp.predict(np.array([pt]), np.array([1]))
        want = ref.predict(np.array([pt]), np.array([1]))
        assert (got[0] == want[0]).mean() >= 0.99
