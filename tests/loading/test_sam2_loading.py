"""SAM 2 through the loading layer (paddle_sam.loading): a converted .pdparams (with its sidecar)
and an official .pt (converted on the fly) give the model, the image predictor and both video
predictors (upstream's, and the request API the service drives), equal to what the SAM 2 API
builds itself; SAM 2's bundled model is the small video model; the other families keep theirs."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_sam.convert import checkpoint
from paddle_sam.convert import sam2 as conv
from paddle_sam.convert.core import CheckpointMismatchError
from paddle_sam.loading import (
    FAMILIES,
    SourceRefused,
    as_image_predictor,
    image_predictor_of_video,
    load_image_predictor,
    load_model,
    load_video_predictor,
    resolve,
    sniff,
)
from paddle_sam.loading.sam2 import build_sam2, build_sam2_video_predictor
from paddle_sam.models.sam2.sam2_base import SAM2Base
from paddle_sam.predict.sam2.predictor import SAM2ImagePredictor, Sam2Predictor
from paddle_sam.predict.sam2.video_predictor import SAM2VideoPredictor
from paddle_sam.predict.sam2.video_requests import Sam2VideoRequests
from tests.helpers.sam2_ref import reduced_checkpoint, reduced_spec

pytest.importorskip("torch")

SPEC = reduced_spec("2.1")
IMAGE = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
CLICK = (np.array([[40.0, 50.0]]), np.array([1]))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return reduced_checkpoint(tmp_path_factory.mktemp("sam2_loading"))


@pytest.fixture
def released_are_reduced(monkeypatch):
    """The released 2.1 tiny made reduced, so an official file of it is read at a small size."""
    from paddle_sam.loading import sam2 as loading_sam2

    specs = {"sam2.1_hiera_tiny": SPEC}
    for module in (conv, checkpoint, loading_sam2):
        monkeypatch.setattr(module, "SAM2_SPECS", specs)


def _reference_masks(path) -> tuple[np.ndarray, np.ndarray]:
    ref = SAM2ImagePredictor(build_sam2(SPEC, path))
    ref.set_image(IMAGE)
    masks, scores, _ = ref.predict(*CLICK)
    return masks, scores


def test_converted_file(files):
    official, converted = files
    source = sniff(converted)
    assert source.family == "sam2" and {"image", "clicks", "video"} <= source.parts
    model = load_model(source)
    assert isinstance(model, SAM2Base) and model.spec == SPEC
    predictor = load_image_predictor(source, clicks=True)
    assert isinstance(predictor, Sam2Predictor)
    predictor.set_image(IMAGE)
    masks, scores, low_res = predictor.predict(*CLICK)
    want, want_scores = _reference_masks(official)
    assert masks.dtype == bool and masks.shape == (3, 96, 128) and low_res.shape == (3, 64, 64)
    np.testing.assert_array_equal(masks, want > 0.5)
    np.testing.assert_array_equal(scores, want_scores)
    assert 0 < masks.mean() < 1
    # a previous answer refined; a mask input of another size is named
    again, _, _ = predictor.predict(*CLICK, mask_input=low_res[:1], multimask_output=False)
    assert again.shape == (1, 96, 128)
    with pytest.raises(ValueError, match="mask_input must be 1 x 64 x 64"):
        predictor.predict(*CLICK, mask_input=np.zeros((1, 256, 256), np.float32))
    # a model or SAM2ImagePredictor given directly is wrapped the same way
    assert isinstance(as_image_predictor(model), Sam2Predictor)
    assert isinstance(as_image_predictor(SAM2ImagePredictor(model)), Sam2Predictor)


def test_official_file_converted_on_the_fly(files, released_are_reduced):
    official, _ = files
    source = sniff(official)
    assert source.family == "sam2" and source.layout == "official"
    predictor = load_image_predictor(source)
    predictor.set_image(IMAGE)
    masks, _, _ = predictor.predict(*CLICK)
    np.testing.assert_array_equal(masks, _reference_masks(official)[0] > 0.5)
    # --model-type names a released size: the file's sizes must be it
    assert load_model(source, model_type="sam2.1_hiera_tiny").spec == SPEC


def test_model_type_of_other_sizes_is_refused(files):
    _, converted = files
    with pytest.raises(CheckpointMismatchError, match="other sizes.*encoder_embed_dim"):
        load_model(sniff(converted), model_type="sam2.1_hiera_large")


def test_video_predictors(files):
    _, converted = files
    source = sniff(converted)
    tracker = load_video_predictor(source, kind="tracker")
    assert isinstance(tracker, SAM2VideoPredictor)
    requests = load_video_predictor(source)
    assert isinstance(requests, Sam2VideoRequests)
    # one copy of the weights serves the image page too
    image = image_predictor_of_video(requests)
    assert isinstance(image, Sam2Predictor) and image.model is requests.model

    frames = [np.roll(IMAGE, 3 * i, axis=1) for i in range(3)]
    ref = build_sam2_video_predictor(SPEC, converted)
    state = ref.init_state(frames)
    ref.add_new_points_or_box(state, 0, 1, points=[[40, 50]], labels=[1])
    want = [(f, m.numpy()[:, 0] > 0) for f, _, m in ref.propagate_in_video(state)]

    sid = requests.handle_request({"type": "start_session", "resource_path": frames})["session_id"]
    out = requests.handle_request(
        {
            "type": "add_prompt",
            "session_id": sid,
            "frame_index": 0,
            "points": [[40 / 128, 50 / 96]],
            "point_labels": [1],
            "obj_id": 1,
        }
    )
    assert out["frame_index"] == 0 and list(out["outputs"]["out_obj_ids"]) == [1]
    got = [
        (item["frame_index"], item["outputs"]["out_binary_masks"])
        for item in requests.handle_stream_request(
            {"type": "propagate_in_video", "session_id": sid, "propagation_direction": "forward"}
        )
    ]
    assert [f for f, _ in got] == [f for f, _ in want] == [0, 1, 2]
    for (_, a), (_, b) in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
        assert 0 < b.mean() < 1
    with pytest.raises(ValueError, match="SAM 2 takes no text"):
        requests.handle_request(
            {"type": "add_prompt", "session_id": sid, "frame_index": 0, "text": "a dog"}
        )
    assert requests.next_obj_id(sid) == 2
    requests.handle_request({"type": "close_session", "session_id": sid})
    assert requests.session_ids() == []


def test_bundled_model_and_released_sizes_without_weights(tmp_path):
    """SAM 2's bundled model is the small video model; a released size named without its
    weights is refused with the command that fetches them."""
    from paddle_sam.loading.sam2 import DEFAULT_SAM2_MODEL

    assert FAMILIES["sam2"].default == DEFAULT_SAM2_MODEL
    source = resolve(family="sam2")
    assert source.path == DEFAULT_SAM2_MODEL and source.family == "sam2"
    with pytest.raises(ValueError, match="sam2.1_hiera_tiny needs its weights.*download sam2.1"):
        resolve(model_type="sam2.1_hiera_tiny")
    # the other families keep theirs
    assert resolve().path == FAMILIES["sam_v1"].default
    assert resolve(model_type="sam3").path == FAMILIES["sam3"].default


def test_a_pdparams_without_sidecar_is_named(files, tmp_path):
    _, converted = files
    bare = tmp_path / "bare.pdparams"
    bare.write_bytes(converted.read_bytes())
    with pytest.raises(SourceRefused, match="cannot tell which model family"):
        load_model(sniff(bare))
    with pytest.raises(ValueError, match="has no sidecar"):
        load_model(sniff(bare, "sam2"))


def test_top_level_names():
    """``from paddle_sam import ...`` gives sam2's public names (imported on first use)."""
    import paddle_sam
    from paddle_sam.predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

    assert paddle_sam.build_sam2 is build_sam2
    assert paddle_sam.build_sam2_video_predictor is build_sam2_video_predictor
    assert paddle_sam.SAM2ImagePredictor is SAM2ImagePredictor
    assert paddle_sam.SAM2AutomaticMaskGenerator is SAM2AutomaticMaskGenerator
    assert paddle_sam.SAM2VideoPredictor is SAM2VideoPredictor
    for name in ("build_sam2", "SAM2ImagePredictor", "SAM2VideoPredictor"):
        assert name in paddle_sam.__all__
