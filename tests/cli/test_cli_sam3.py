"""``paddle-sam segment`` with a SAM 3 model: --text / exemplar --box prompts write one mask
PNG per instance, an overlay and COCO RLE annotations that agree with ``Sam3Processor``'s
state for the same prompts; model type detected from the checkpoint; one-line errors."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddle_sam.convert import sam3 as conv
from paddle_sam.convert.checkpoint import convert_checkpoint, detect_family
from paddle_sam.convert.sam_v1 import random_official_state_dict
from paddle_sam.loading.sam3 import load_sam3
from paddle_sam.predict.sam3.processor import Sam3Processor
from tests.cli.test_cli import (
    _check_mask,
    _test_image,
    assert_bbox_is_the_masks,
    assert_user_error,
    coco_of,
    run,
)
from tests.helpers.specs import TINY as SAM1_TINY
from tests.helpers.specs import tiny_sam3_spec

pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

# as tests/models/test_sam3_model.py: 112 px / patch 14 = 8x8 tokens, 12 queries
TINY = tiny_sam3_spec()
H, W = 60, 90
BOX = [20.0, 15.0, 60.0, 45.0]  # the bright rectangle of the test image


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli_sam3")


@pytest.fixture(scope="module")
def official(work) -> Path:
    """A tiny SAM 3 checkpoint in the released layout ({"model": ...}, torch.save)."""
    torch = pytest.importorskip("torch")
    state = conv.random_released_state_dict(TINY, seed=7)
    path = work / "sam3_tiny.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, path)
    return path


@pytest.fixture(scope="module")
def ckpt(official, work) -> Path:
    """Converted; the sidecar carries the spec and model type, so no --model-type."""
    dst = work / "sam3_tiny.pdparams"
    convert_checkpoint(official, dst, spec=TINY, progress=False)
    return dst


@pytest.fixture(scope="module")
def interactive_ckpt(work) -> Path:
    """Released layout with the tracker's SAM heads: clicks work (predict_inst)."""
    torch = pytest.importorskip("torch")
    state = conv.random_released_state_dict(TINY, seed=8, enable_inst_interactivity=True)
    src = work / "sam3_tiny_tracker.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, src)
    dst = work / "sam3_tiny_tracker.pdparams"
    assert convert_checkpoint(src, dst, spec=TINY, progress=False)["interactive"] is True
    return dst


@pytest.fixture(scope="module")
def sam1_ckpt(work) -> Path:
    from safetensors.numpy import save_file

    src = work / "sam1_tiny.safetensors"
    save_file(random_official_state_dict(SAM1_TINY, seed=0), str(src))
    dst = work / "sam1_tiny.pdparams"
    convert_checkpoint(src, dst, spec=SAM1_TINY, progress=False)
    return dst


@pytest.fixture(scope="module")
def image_png(work) -> Path:
    path = work / "image.png"
    Image.fromarray(_test_image()).save(path)
    return path


@pytest.fixture(scope="module")
def processor(ckpt) -> Sam3Processor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_sam3(ckpt)
    return Sam3Processor(model, resolution=TINY.image_size)


def expected_state(processor, text, boxes, negative, threshold) -> dict:
    """Sam3Processor's results for the CLI's prompts (xyxy pixels -> cx, cy, w, h in [0, 1])."""
    processor.set_confidence_threshold(threshold)
    state = processor.set_image(_test_image())
    if text is not None:
        state = processor.set_text_prompt(text, state)
    for (x0, y0, x1, y1), label in [(b, True) for b in boxes] + [(b, False) for b in negative]:
        cxcywh = [(x0 + x1) / 2 / W, (y0 + y1) / 2 / H, (x1 - x0) / W, (y1 - y0) / H]
        state = processor.add_geometric_prompt(cxcywh, label, state)
    return state


def check_outputs(out: Path, state: dict, text, boxes) -> dict:
    """Every instance of ``state`` written, best score first: mask PNG, RLE, box, score."""
    from pycocotools import mask as mask_utils

    doc = json.loads((out / "annotations.json").read_text())
    info = doc["info"]
    assert info["model_type"] == "sam3" and [(i["height"], i["width"]) for i in doc["images"]] == [
        (H, W)
    ]
    assert info["prompts"]["text"] == text and info["prompts"]["boxes"] == boxes
    coco_of(out / "annotations.json")  # a real COCO file
    scores = state["scores"].numpy()
    masks = state["masks"].numpy()[:, 0]
    order = [q for q in np.argsort(-scores, kind="stable") if masks[q].any()]  # no empty masks
    anns = doc["annotations"]
    assert len(anns) == len(order)
    assert sorted((out / "masks").glob("*.png")) == [
        out / "masks" / f"{i:04d}.png" for i in range(len(anns))
    ]
    boxes_px = state["boxes"].numpy()
    for i, (ann, q) in enumerate(zip(anns, order, strict=True)):
        assert ann["id"] == i + 1
        np.testing.assert_allclose(ann["score"], scores[q], rtol=1e-6)
        np.testing.assert_allclose(ann["detector_box_xyxy"], boxes_px[q], rtol=1e-5, atol=1e-4)
        assert_bbox_is_the_masks(ann)
        png = _check_mask(out / "masks" / f"{i:04d}.png") > 0
        np.testing.assert_array_equal(png, masks[q])
        rle = dict(ann["segmentation"], counts=ann["segmentation"]["counts"].encode())
        np.testing.assert_array_equal(mask_utils.decode(rle).astype(bool), masks[q])
        assert ann["area"] == int(masks[q].sum())
    with Image.open(out / "overlay.png") as im:
        assert im.size == (W, H) and im.mode == "RGB"
    return doc


def test_detect_family(official, ckpt, sam1_ckpt, work):
    assert detect_family(official) == "sam3"  # pickle key names, not unpickled
    assert detect_family(ckpt) == "sam3"  # sidecar
    assert detect_family(sam1_ckpt) == "sam_v1"
    assert detect_family(work / "sam1_tiny.safetensors") == "sam_v1"  # safetensors header


def test_segment_text_all_queries(ckpt, image_png, work, processor, capsys):
    """Threshold 0: every query is an instance; no --model-type (read from the sidecar)."""
    out = work / "text_all"
    argv = ["segment", image_png, "--checkpoint", ckpt, "-o", out, "--text", "a yellow box"]
    assert run(argv + ["--confidence-threshold", "0"]) == 0
    assert "12 instance(s) of 'a yellow box'" in capsys.readouterr().out
    state = expected_state(processor, "a yellow box", [], [], 0.0)
    doc = check_outputs(out, state, "a yellow box", [])
    assert len(doc["annotations"]) == TINY.num_queries
    assert doc["info"]["confidence_threshold"] == 0.0


def test_segment_text_default_threshold(ckpt, image_png, work, processor):
    """The default threshold 0.5: exactly the instances Sam3Processor keeps (maybe none)."""
    out = work / "text_default"
    argv = ["segment", image_png, "--checkpoint", ckpt, "-o", out, "--text", "a dog"]
    assert run(argv + ["--model-type", "sam3"]) == 0
    state = expected_state(processor, "a dog", [], [], 0.5)
    check_outputs(out, state, "a dog", [])


def test_segment_text_and_boxes(ckpt, image_png, work, processor):
    out = work / "boxes"
    neg = [70.0, 5.0, 85.0, 20.0]
    argv = ["segment", image_png, "--checkpoint", ckpt, "-o", out, "--text", "a yellow box"]
    argv += ["--box", ",".join(map(str, BOX)), "--negative-box", ",".join(map(str, neg))]
    assert run(argv + ["--confidence-threshold", "0.2"]) == 0
    state = expected_state(processor, "a yellow box", [BOX], [neg], 0.2)
    doc = check_outputs(out, state, "a yellow box", [BOX])
    assert doc["info"]["prompts"]["negative_boxes"] == [neg]


def test_segment_box_only(ckpt, image_png, work, processor):
    out = work / "box_only"
    argv = ["segment", image_png, "--checkpoint", ckpt, "-o", out, "--box", "20,15,60,45"]
    assert run(argv + ["--confidence-threshold", "0"]) == 0
    check_outputs(out, expected_state(processor, None, [BOX], [], 0.0), None, [BOX])
    # rerun with --overwrite and a higher threshold: no stale mask files remain
    assert run(argv + ["--confidence-threshold", "0.99", "--overwrite"]) == 0
    check_outputs(out, expected_state(processor, None, [BOX], [], 0.99), None, [BOX])


def test_segment_sam3_errors(ckpt, sam1_ckpt, image_png, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["segment", image_png, "-o", out]
    sam1 = base + ["--checkpoint", sam1_ckpt]
    sam3 = base + ["--checkpoint", ckpt]
    assert_user_error(capsys, sam1 + ["--text", "a dog"], "--text", "SAM 3")
    assert_user_error(capsys, sam1 + ["--point", "5,5", "--text", "a"], "--text", "SAM 3")
    assert_user_error(capsys, sam1 + ["--box", "1,1,5,5", "--box", "2,2,6,6"], "one --box", "got 2")
    assert_user_error(
        capsys, sam1 + ["--point", "5,5", "--negative-box", "1,1,5,5"], "--negative-box"
    )
    # clicks need the tracker heads, which this file lacks
    assert_user_error(capsys, sam3 + ["--point", "5,5"], "--point", "tracker", "sam3_tiny")
    assert_user_error(capsys, sam3 + ["--text", "a", "--point", "5,5"], "--point and --text")
    assert_user_error(capsys, sam3, "--text", "--box")  # no prompt
    assert_user_error(capsys, sam3 + ["--text", "  "], "--text is empty")
    assert_user_error(
        capsys, sam3 + ["--text", "a", "--confidence-threshold", "2"], "threshold", "[0, 1)"
    )
    assert_user_error(capsys, sam3 + ["--box", "10,10,200,40"], "box", "outside")
    assert_user_error(capsys, sam3 + ["--text", "a", "--single-mask"], "--point")
    assert_user_error(
        capsys, sam3 + ["--text", "a", "--bpe", tmp_path / "none.txt.gz"], "BPE", "none.txt.gz"
    )
    missing = tmp_path / "nope.pdparams"
    assert_user_error(
        capsys, base + ["--checkpoint", missing, "--text", "a"], "not found", "nope.pdparams"
    )
    # without --checkpoint, --text / --box use the bundled small SAM 3 (test_default_sam3.py);
    # clicks need the tracker's heads, which it has not
    assert_user_error(
        capsys, base + ["--model-type", "sam3", "--point", "5,5"], "no --checkpoint", "tracker"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "prompts, multimask",
    [
        (["--point", "40,30"], True),  # one click: three masks, the best kept
        (["--point", "10,10,0", "--box", "20,15,60,45"], False),
    ],
)
def test_segment_sam3_clicks(interactive_ckpt, image_png, tmp_path, prompts, multimask):
    """--point with a SAM 3 checkpoint holding the tracker: SAM v1 style outputs, equal to
    predict_inst on a Sam3Processor state."""
    out = tmp_path / "clicks"
    argv = ["segment", image_png, "--checkpoint", interactive_ckpt, "-o", out, *prompts]
    assert run(argv) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_sam3(interactive_ckpt, enable_inst_interactivity=True)
    state = Sam3Processor(model, resolution=TINY.image_size).set_image(_test_image())
    points = [p for p in prompts[1::2] if p.count(",") in (1, 2)]
    coords = np.array([[float(v) for v in p.split(",")[:2]] for p in points])
    labels = np.array([int(p.split(",")[2]) if p.count(",") == 2 else 1 for p in points])
    box = np.array([20.0, 15.0, 60.0, 45.0]) if "--box" in prompts else None
    masks, scores, _ = model.predict_inst(
        state, point_coords=coords, point_labels=labels, box=box, multimask_output=multimask
    )
    result = json.loads((out / "result.json").read_text())
    best = int(np.argmax(scores))
    assert result["multimask_output"] is multimask and result["best"] == best
    np.testing.assert_allclose(result["scores"], scores, rtol=1e-6)
    np.testing.assert_array_equal(_check_mask(out / "mask.png") > 0, masks[best] > 0.5)
    assert (out / "mask_2.png").exists() is multimask


@pytest.fixture
def served(monkeypatch) -> dict:
    """``paddle-sam serve`` up to the app: what it would serve, without starting uvicorn."""
    import uvicorn

    import paddle_sam.serve

    built: dict = {}

    def create_app(model, **kwargs):
        built.update(model=model, **kwargs)
        return "app"

    monkeypatch.setattr(paddle_sam.serve, "create_app", create_app, raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: built.update(app=app))
    return built


def test_serve_detects_sam3_from_the_sidecar(ckpt, interactive_ckpt, sam1_ckpt, served, capsys):
    """No --model-type: ``serve`` tells SAM 3 from SAM v1 by the checkpoint, as ``segment``."""
    from paddle_sam.predict.sam3.predictor import Sam3Predictor
    from paddle_sam.predict.sam_v1.predictor import SamPredictor

    argv = ["serve", "--port", "0", "--checkpoint"]
    assert run([*argv, ckpt, "--confidence-threshold", "0.3"]) == 0
    predictor = served["model"]
    assert isinstance(predictor, Sam3Predictor) and served["app"] == "app"
    assert predictor.confidence_threshold == 0.3 and served["model_type"] is None
    assert predictor.takes_points is False  # converted without the tracker
    assert run([*argv, interactive_ckpt]) == 0
    assert isinstance(served["model"], Sam3Predictor) and served["model"].takes_points is True
    assert served["model"].confidence_threshold == 0.5
    assert run([*argv, sam1_ckpt]) == 0
    assert isinstance(served["model"], SamPredictor)
    served.clear()
    line = assert_user_error(capsys, [*argv, sam1_ckpt, "--confidence-threshold", "0.3"])
    assert "apply to --model-type sam3 only" in line and not served


def test_predictor_grounds_several_boxes(processor, image_png, work):
    """``Sam3Predictor.ground``: the text, then positive and negative boxes, best first; the
    same through a wrapped processor; clicks refused without the interactive predictor."""
    from paddle_sam.predict.sam3.predictor import PromptNotSupported, Sam3Predictor

    neg = [70.0, 5.0, 85.0, 20.0]
    state = expected_state(processor, "a yellow box", [BOX], [neg], 0.0)
    order = np.argsort(-state["scores"].numpy(), kind="stable")
    own = Sam3Processor(processor.model, resolution=TINY.image_size, confidence_threshold=0.0)
    for predictor in (
        Sam3Predictor(processor.model, confidence_threshold=0.0),
        Sam3Predictor(processor=own),
    ):
        assert predictor.confidence_threshold == 0.0
        predictor.set_image(_test_image())
        found = predictor.ground("a yellow box", [BOX, neg], [True, False])
        np.testing.assert_array_equal(found.masks, state["masks"].numpy()[order, 0])
        np.testing.assert_array_equal(found.scores, state["scores"].numpy()[order])
        np.testing.assert_array_equal(found.boxes, state["boxes"].numpy()[order])
        assert found.low_res_logits.shape[0] == len(found.scores) == TINY.num_queries
        masks, scores, low_res = predictor.predict(text="a yellow box", box=np.array(BOX))
        single = predictor.ground("a yellow box", [BOX])
        np.testing.assert_array_equal(masks, single.masks)
        np.testing.assert_array_equal(scores, single.scores)
        np.testing.assert_array_equal(low_res, single.low_res_logits)
        with pytest.raises(ValueError, match="2 boxes but 1 box labels"):
            predictor.ground("a", [BOX, neg], [True])
        with pytest.raises(PromptNotSupported, match="point prompts need"):
            predictor.predict(np.array([[5.0, 5.0]]), np.array([1]))
    with pytest.raises(TypeError, match="exactly one"):
        Sam3Predictor(processor.model, processor=own)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Sam3Predictor(processor=own, confidence_threshold=1.0)
