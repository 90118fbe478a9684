"""The assembled SAM 3 image model and ``Sam3Processor`` against the official sam3 code.

A tiny configuration is built on both sides with the same (perturbed, finite) weights:
``forward_grounding`` is compared on identical backbone features, then the whole pipeline
through ``Sam3Processor`` (image -> backbone -> heads -> post-processing) for text, box,
text+box and negative-box prompts.
"""

from __future__ import annotations

import warnings

import numpy as np
import paddle
import pytest

from paddle_sam.align.sam3 import reduced_reference
from paddle_sam.loading.sam3 import build_sam3_image_model
from paddle_sam.models.sam3.build_sam3 import Sam3Spec
from paddle_sam.models.sam3.geometry_encoders import Prompt
from paddle_sam.models.sam3.sam3_image import FindStage
from paddle_sam.predict.sam3.processor import Sam3Processor, resize_uint8_antialias
from tests.helpers.sam3_ref import (
    assert_close,
    cpu_patches,
    import_sam3,
    perturb_module_,
    run_prompts,
)
from tests.helpers.specs import tiny_sam3_spec
from tests.models.test_sam3_heads import load_from_torch

torch, _ = import_sam3()

# 112 px / patch 14 = 8x8 tokens; windows of 4; FPN levels 32, 16, 8 (4 scalped)
TINY = tiny_sam3_spec()


def build_reference(spec: Sam3Spec, bpe_path: str):
    """The official Sam3Image with upstream's configuration (model_builder.py) at ``spec``'s
    sizes."""
    from sam3.model.sam3_image import Sam3Image

    model = reduced_reference(spec, bpe_path, interactive=False)
    assert isinstance(model, Sam3Image)
    return model.eval()


@pytest.fixture(scope="module")
def pair(bpe_path):
    with cpu_patches():
        torch.manual_seed(0)
        ref = build_reference(TINY, bpe_path)
        perturb_module_(ref, seed=0, scale=0.2)
        ref.eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = build_sam3_image_model(bpe_path=bpe_path, spec=TINY)
        load_from_torch(ours, ref, skip_complex=True)
        ours.eval()
        yield ref, ours


def to_paddle(x):
    if isinstance(x, torch.Tensor):
        return paddle.to_tensor(x.detach().numpy())
    if isinstance(x, dict):
        return {k: to_paddle(v) for k, v in x.items()}
    if isinstance(x, list):
        return [to_paddle(v) for v in x]
    return x


def image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth random image (blobs), so resizing and features behave like on photos."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    out = np.zeros((h, w, 3))
    for _ in range(6):
        cy, cx, r = rng.uniform(0, 1, 3)
        out += (
            rng.uniform(0, 255, 3)
            * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (0.05 + r / 5))[..., None]
        )
    out += rng.normal(0, 8, out.shape)
    return np.clip(out / out.max() * 255, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("hw", [(48, 64), (300, 200), (112, 112)])
def test_resize_matches_torchvision(hw):
    from torchvision.transforms import v2

    img = image(*hw, seed=hw[0])
    ref = v2.Resize(size=(112, 112))(torch.from_numpy(img).permute(2, 0, 1)).permute(1, 2, 0)
    np.testing.assert_array_equal(ref.numpy(), resize_uint8_antialias(img, 112, 112))


def grounding_inputs(ref, prompt_text: str, boxes=(), labels=()):
    with cpu_patches(), torch.no_grad():
        img = torch.from_numpy(image(112, 112).transpose(2, 0, 1).astype(np.float32) / 127.5 - 1)
        backbone_out = ref.backbone.forward_image(img[None])
        backbone_out.update(ref.backbone.forward_text([prompt_text], device="cpu"))
    return backbone_out


@pytest.mark.parametrize(
    "case",
    [
        ("a red car", []),
        ("visual", [([0.5, 0.4, 0.3, 0.5], True)]),
        ("a red car", [([0.5, 0.4, 0.3, 0.5], True), ([0.2, 0.7, 0.2, 0.2], False)]),
    ],
)
def test_forward_grounding(pair, case):
    """Same backbone features in, same heads out (isolates everything this part owns)."""
    from sam3.model.data_misc import FindStage as RefFind

    ref, ours = pair
    text, boxes = case
    backbone_out = grounding_inputs(ref, text)
    r_prompt = ref._get_dummy_prompt()
    o_prompt = ours._get_dummy_prompt()
    for box, label in boxes:
        r_prompt.append_boxes(torch.tensor(box).view(1, 1, 4), torch.tensor([label]).view(1, 1))
        o_prompt.append_boxes(
            paddle.to_tensor(box).reshape([1, 1, 4]), paddle.to_tensor([[int(label)]])
        )
    ids = torch.tensor([0])
    with cpu_patches(), torch.no_grad():
        r = ref.forward_grounding(
            backbone_out=dict(backbone_out),
            find_input=RefFind(
                img_ids=ids,
                text_ids=ids,
                input_boxes=None,
                input_boxes_mask=None,
                input_boxes_label=None,
                input_points=None,
                input_points_mask=None,
            ),
            geometric_prompt=r_prompt,
            find_target=None,
        )
    o = ours.forward_grounding(
        backbone_out=to_paddle(backbone_out),
        find_input=FindStage(img_ids=paddle.to_tensor([0]), text_ids=paddle.to_tensor([0])),
        geometric_prompt=o_prompt,
    )
    for key in ("pred_logits", "pred_boxes", "pred_boxes_xyxy", "presence_logit_dec"):
        assert_close(r[key], o[key], name=key)
    assert_close(r["pred_masks"], o["pred_masks"], max_abs=1e-3, name="pred_masks")
    assert_close(r["semantic_seg"], o["semantic_seg"], max_abs=1e-3, name="semantic_seg")
    assert_close(r["encoder_hidden_states"], o["encoder_hidden_states"], name="encoder")
    assert isinstance(o_prompt, Prompt)


CASES = {
    "text": [("text", "a red car")],
    "box": [("box", [0.45, 0.5, 0.3, 0.4], True)],
    "text+box": [("text", "a red car"), ("box", [0.45, 0.5, 0.3, 0.4], True)],
    "negative box": [
        ("text", "the dog"),
        ("box", [0.45, 0.5, 0.3, 0.4], True),
        ("box", [0.7, 0.3, 0.2, 0.2], False),
    ],
}


@pytest.fixture(scope="module")
def processors(pair):
    from sam3.model.sam3_image_processor import Sam3Processor as RefProcessor

    ref, ours = pair
    return (
        RefProcessor(ref, resolution=TINY.image_size, device="cpu"),
        Sam3Processor(ours, resolution=TINY.image_size),
    )


@pytest.mark.parametrize("case", list(CASES))
def test_processor_end_to_end(processors, case):
    """Image in, results out, every query kept (threshold 0): scores, boxes, masks."""
    from PIL import Image

    ref_proc, our_proc = processors
    img = Image.fromarray(image(90, 130, seed=3))
    with cpu_patches(), torch.inference_mode():
        r = run_prompts(ref_proc, img, CASES[case], threshold=0.0)
    o = run_prompts(our_proc, img, CASES[case], threshold=0.0)
    assert o["scores"].shape == [TINY.num_queries]
    assert_close(r["scores"], o["scores"], max_abs=1e-5, name=f"{case} scores")
    assert_close(r["boxes"], o["boxes"], max_abs=1e-3, name=f"{case} boxes (px)")
    assert_close(r["masks_logits"], o["masks_logits"], max_abs=1e-4, name=f"{case} masks")
    agree = (r["masks"].numpy() == o["masks"].numpy()).mean()
    assert agree >= 0.9999, f"{case}: binary masks agree on {agree:.6f} of pixels"
    assert o["masks"].shape == [TINY.num_queries, 1, 90, 130]
    assert o["boxes"].numpy().std() > 1.0 and o["masks"].numpy().any()


def test_processor_threshold_and_reset(processors):
    """The kept set follows the threshold; a new text prompt reuses the cached image."""
    ref_proc, our_proc = processors
    img = image(70, 60, seed=5)
    state = our_proc.set_image(img)
    backbone = state["backbone_out"]
    our_proc.set_confidence_threshold(0.0)
    state = our_proc.set_text_prompt("a cat", state)
    scores = state["scores"].numpy()
    cut = float(np.median(scores))
    state = our_proc.set_confidence_threshold(cut, state)
    assert len(state["scores"]) == int((scores > cut).sum())
    np.testing.assert_allclose(state["scores"].numpy(), scores[scores > cut], rtol=1e-6)
    state = our_proc.set_confidence_threshold(1.0, state)
    assert state["masks"].shape == [0, 1, 70, 60] and state["boxes"].shape == [0, 4]
    our_proc.reset_all_prompts(state)
    assert "language_features" not in state["backbone_out"] and "scores" not in state
    assert state["backbone_out"] is backbone  # image features kept


def test_processor_numpy_image_and_errors(processors):
    from PIL import Image

    _, our_proc = processors
    img = image(50, 40, seed=6)
    our_proc.set_confidence_threshold(0.0)
    a = our_proc.set_text_prompt("x", our_proc.set_image(img))
    b = our_proc.set_text_prompt("x", our_proc.set_image(Image.fromarray(img)))
    np.testing.assert_array_equal(a["masks_logits"].numpy(), b["masks_logits"].numpy())
    with pytest.raises(ValueError, match="set_image"):
        our_proc.set_text_prompt("x", {})
    with pytest.raises(ValueError, match="H x W x 3"):
        our_proc.set_image(np.zeros((10, 10), np.uint8))
    with pytest.raises(ValueError, match="box must be 4"):
        our_proc.add_geometric_prompt([0.5, 0.5, 0.2], True, a)


def test_build_from_official_checkpoint_file(pair, bpe_path, tmp_path):
    """``build_sam3_image_model(checkpoint_path=...)`` on a file in sam3.pt's layout
    (``{"model": {"detector.*": ...}}``, fused in_proj, complex freqs_cis) gives the same
    results as the official model holding those weights; lazy top-level imports work."""
    from PIL import Image
    from sam3.model.sam3_image_processor import Sam3Processor as RefProcessor

    import paddle_sam

    ref, _ = pair
    path = tmp_path / "sam3_tiny.pt"
    torch.save({"model": {f"detector.{k}": v for k, v in ref.state_dict().items()}}, path)
    ours = paddle_sam.build_sam3_image_model(checkpoint_path=path, bpe_path=bpe_path, spec=TINY)
    assert not ours.training
    img = Image.fromarray(image(64, 80, seed=9))
    steps = CASES["text+box"]
    with cpu_patches(), torch.inference_mode():
        r = run_prompts(RefProcessor(ref, resolution=TINY.image_size, device="cpu"), img, steps, 0)
    o = run_prompts(paddle_sam.Sam3Processor(ours, resolution=TINY.image_size), img, steps, 0)
    assert_close(r["scores"], o["scores"], max_abs=1e-5, name="scores from checkpoint")
    assert_close(r["masks_logits"], o["masks_logits"], max_abs=1e-4, name="masks from checkpoint")


def test_set_image_batch(processors):
    """Backbone features of a batch equal those of each image alone; prompting a batch state
    is refused with a clear message (upstream uses it for the interactive predictor only)."""
    _, our_proc = processors
    imgs = [image(40, 50, seed=1), image(60, 30, seed=2)]
    state = our_proc.set_image_batch(imgs)
    assert state["original_heights"] == [40, 60] and state["original_widths"] == [50, 30]
    for i, img in enumerate(imgs):
        single = our_proc.set_image(img)["backbone_out"]["backbone_fpn"]
        for a, b in zip(single, state["backbone_out"]["backbone_fpn"], strict=True):
            assert_close(a, b[i : i + 1], max_abs=1e-4, name=f"batch image {i}")
    with pytest.raises(ValueError, match="set_image"):
        our_proc.set_text_prompt("x", state)


def test_predict_inst_wiring(bpe_path):
    """predict_inst runs on a Sam3Processor state: second-neck features projected once by
    set_image, masks at the original size, three of them for one click."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_sam3_image_model(bpe_path=bpe_path, spec=TINY, enable_inst_interactivity=True)
    processor = Sam3Processor(model, resolution=TINY.image_size)
    state = processor.set_image(image(60, 90, seed=4))
    sam2 = state["backbone_out"]["sam2_backbone_out"]
    assert sam2["backbone_fpn"][0].shape[1] == TINY.d_model // 8  # conv_s0 applied
    masks, ious, low_res = model.predict_inst(
        state, point_coords=np.array([[30.0, 20.0]]), point_labels=np.array([1])
    )
    assert masks.shape == (3, 60, 90) and ious.shape == (3,)
    assert low_res.shape == (3, 4 * TINY.image_size // 14, 4 * TINY.image_size // 14)
    again = model.predict_inst(state, point_coords=np.array([[30.0, 20.0]]), point_labels=[1])
    np.testing.assert_array_equal(low_res, again[2])
    with pytest.raises(ValueError, match="enable_inst_interactivity"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = build_sam3_image_model(bpe_path=bpe_path, spec=TINY)
        plain.predict_inst(state, point_coords=np.array([[1.0, 1.0]]), point_labels=[1])
