"""samexporter's SAM 3 client, unchanged, on our ``export --format samexporter`` files.

samexporter (the package on the registry, 0.5.0) exports the official SAM 3 to three ONNX files
and runs them on ONNX Runtime with its own client (``samexporter.sam3_onnx.SegmentAnything3ONNX``
and the ``samexporter.inference`` command); X-AnyLabeling-style tools read the same layout. Here
that client code runs as published, only the paths given, on the files ``paddle-sam export
--format samexporter`` writes from the bundled SAM 3 (a trained model, so that text prompts find
real instances), and what it finds is compared with ``Sam3Processor`` on the same weights: the
same instances, masks >= 99.9 % equal pixel for pixel, scores within 1e-4.

The images are concept scenes of exactly the model's input size: the client resizes with
OpenCV and ``Sam3Processor`` with its own filter, and only an image that needs no resize gives
both the same input. The client's duplicate suppression (mask NMS, not in the official
``Sam3Processor``) is switched off with its own ``nms_mode="none"`` for the comparison; its
command runs with its defaults.
"""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from PIL import Image
from samexporter import inference as samexporter_inference
from samexporter.clip_tokenizer import tokenize
from samexporter.sam3_onnx import SegmentAnything3ONNX

from paddle_sam.cli import main
from paddle_sam.loading.sam3 import DEFAULT_SAM3_MODEL, load_sam3
from paddle_sam.predict.sam3.processor import Sam3Processor
from paddle_sam.train.synthetic import CONCEPT_PHRASES, concept_scene

MASK_AGREEMENT = 0.999
SCORE_TOL = 1e-4
THRESHOLD = 0.5


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("samexporter")
    code = main(
        [
            "export",
            "--checkpoint",
            str(DEFAULT_SAM3_MODEL),
            "--format",
            "samexporter",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    return out


@pytest.fixture(scope="module")
def ours():
    model = load_sam3(DEFAULT_SAM3_MODEL)
    size = int(model.backbone.vision_backbone.trunk.img_size)
    return Sam3Processor(model, resolution=size, confidence_threshold=THRESHOLD), size


def client(folder) -> SegmentAnything3ONNX:
    return SegmentAnything3ONNX(
        str(folder / "sam3_image_encoder.onnx"),
        str(folder / "sam3_decoder.onnx"),
        str(folder / "sam3_language_encoder.onnx"),
        providers="cpu",
    )


def by_score(state: dict) -> tuple[np.ndarray, np.ndarray]:
    """Our kept masks (N x H x W) and scores, highest score first (the client's order)."""
    scores = np.asarray(state["scores"].numpy(), np.float32).reshape(-1)
    masks = np.asarray(state["masks"].numpy(), bool).reshape(
        len(scores), *state["masks"].shape[-2:]
    )
    order = np.argsort(-scores, kind="stable")
    return masks[order], scores[order]


def assert_same(theirs_masks, theirs_scores, masks, scores, what: str) -> None:
    assert len(theirs_masks) == len(masks), f"{what}: {len(theirs_masks)} against {len(masks)}"
    np.testing.assert_allclose(theirs_scores, scores, atol=SCORE_TOL, err_msg=what)
    for i, (a, b) in enumerate(zip(theirs_masks[:, 0], masks, strict=True)):
        agreement = float((a == b).mean())
        assert agreement >= MASK_AGREEMENT, f"{what}, instance {i}: {agreement:.5f} equal"


def client_detections(
    sx: SegmentAnything3ONNX, embedding: dict, prompt: list, threshold: float = THRESHOLD
) -> tuple:
    """The client's own steps of ``predict_masks`` (decoder, then its selection without NMS),
    keeping the scores that ``predict_masks`` drops."""
    boxes, labels, pad = [], [], []
    h, w = embedding["original_size"]
    for mark in prompt:
        x0, y0, x1, y1 = mark["data"]
        boxes.append([(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h])
        labels.append(1)
        pad.append(False)
    if not boxes:  # the client's "no geometry": one padding slot
        boxes, labels, pad = [[0, 0, 0, 0]], [1], [True]
    masks, scores, found = sx.decoder(
        embedding["original_size"],
        *(embedding[f"vision_pos_enc_{i}"] for i in range(3)),
        *(embedding[f"backbone_fpn_{i}"] for i in range(3)),
        embedding["language_mask"],
        embedding["language_features"],
        embedding["language_embeds"],
        np.asarray(boxes, np.float32)[:, None],
        np.asarray(labels, np.int64)[:, None],
        np.asarray(pad, bool)[None],
    )
    masks, scores, _ = sx.select_detections(
        masks,
        scores,
        found,
        prompt,
        confidence_threshold=threshold,
        nms_threshold=None,
        nms_mode="none",
        max_instances=None,
        prefer_prompted_region=False,
    )
    return masks, scores


def test_the_client_tokenizes_as_we_do():
    """samexporter's own tokenizer (its copy of the CLIP vocabulary) and ours give the same
    32 ids for every phrase the model knows: its language encoder gets what ours gets."""
    model_tokens = load_sam3(DEFAULT_SAM3_MODEL).backbone.language_backbone
    for phrase in [*CONCEPT_PHRASES, "visual", "a Red  STAR!"]:
        ours = np.asarray(model_tokens.tokenize([phrase]).numpy())
        np.testing.assert_array_equal(tokenize([phrase], context_length=32), ours, err_msg=phrase)


def test_text_prompts_find_what_sam3processor_finds(exported, ours):
    proc, size = ours
    sx = client(exported)
    checked = found = 0
    for index in range(3):
        scene = concept_scene(11, index, [[size, size]])
        phrases = sorted({f"{c} {k}" for c, k in zip(scene.colours, scene.kinds, strict=True)})
        for text in [*phrases[:3], "green cross", "ring"]:
            embedding = sx.encode(cv2.cvtColor(scene.image, cv2.COLOR_RGB2BGR), text_prompt=text)
            masks, scores = client_detections(sx, embedding, [])
            # and the public call returns the same masks
            public = sx.predict_masks(
                embedding, [], confidence_threshold=THRESHOLD, nms_mode="none"
            )
            np.testing.assert_array_equal(public, masks)
            state = proc.set_text_prompt(text, proc.set_image(scene.image))
            assert_same(masks, scores, *by_score(state), f"scene {index}, {text!r}")
            checked += 1
            found += len(masks)
    assert checked == 15 and found >= 5, (checked, found)  # the model does find instances


@pytest.mark.parametrize("text", ["the instance's phrase", None])
def test_box_prompts_find_what_sam3processor_finds(exported, ours, text):
    """A box around an instance, with its phrase and alone (the text "visual"). The model
    was trained on phrases: alone, a box scores low (0.01-0.13 here), so that case is compared
    at a threshold of 0.01, where some queries pass."""
    proc, size = ours
    sx = client(exported)
    scene = concept_scene(12, 1, [[size, size]])
    phrase = f"{scene.colours[0]} {scene.kinds[0]}" if text else None
    threshold = THRESHOLD if text else 0.01
    ys, xs = np.nonzero(scene.masks[0])
    box = [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]
    prompt = [{"type": "rectangle", "data": box}]
    embedding = sx.encode(cv2.cvtColor(scene.image, cv2.COLOR_RGB2BGR), text_prompt=phrase)
    masks, scores = client_detections(sx, embedding, prompt, threshold)
    state = proc.set_image(scene.image)
    if phrase:
        state = proc.set_text_prompt(phrase, state)
    x0, y0, x1, y1 = box
    cxcywh = [(x0 + x1) / 2 / size, (y0 + y1) / 2 / size, (x1 - x0) / size, (y1 - y0) / size]
    proc.set_confidence_threshold(threshold)
    try:
        state = proc.add_geometric_prompt(cxcywh, True, state)
    finally:
        proc.set_confidence_threshold(THRESHOLD)
    assert_same(masks, scores, *by_score(state), f"box prompt, text {phrase!r}")
    assert len(masks) >= 1


def test_the_client_command_runs_with_only_paths_given(exported, ours, tmp_path, capsys):
    _, size = ours
    scene = concept_scene(13, 0, [[size, size]])
    Image.fromarray(scene.image).save(tmp_path / "scene.png")
    text = f"{scene.colours[0]} {scene.kinds[0]}"
    (tmp_path / "prompt.json").write_text(json.dumps([{"type": "text", "data": text}]))
    code = samexporter_inference.main(
        [
            "--sam_variant",
            "sam3",
            "--encoder_model",
            str(exported / "sam3_image_encoder.onnx"),
            "--decoder_model",
            str(exported / "sam3_decoder.onnx"),
            "--language_encoder_model",
            str(exported / "sam3_language_encoder.onnx"),
            "--image",
            str(tmp_path / "scene.png"),
            "--prompt",
            str(tmp_path / "prompt.json"),
            "--output",
            str(tmp_path / "out.png"),
        ]
    )
    assert code == 0
    retained = int(capsys.readouterr().out.split("SAM3 instances retained:")[1].split()[0])
    assert retained >= 1
    drawn = cv2.imread(str(tmp_path / "out.png"))  # the instances drawn over the image
    assert drawn.shape == scene.image.shape
    assert (drawn != cv2.cvtColor(scene.image, cv2.COLOR_RGB2BGR)).any()


def test_options_of_other_formats_are_refused(tmp_path, capsys):
    out = tmp_path / "x"
    common = ["export", "--checkpoint", str(DEFAULT_SAM3_MODEL), "--format", "samexporter"]
    assert main([*common, "--opset", "17", "-o", str(out)]) == 2
    assert "--opset: not options of --format samexporter" in capsys.readouterr().err
    assert main([*common, "--fused-attention", "-o", str(out)]) == 2
    assert "--fused-attention: not options of --format samexporter" in capsys.readouterr().err
    assert not out.exists()
