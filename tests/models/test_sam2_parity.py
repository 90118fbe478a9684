"""SAM 2 / 2.1 against the official code (sam2 1.1.0) at a reduced size: upstream's model of the
tiny config with a smaller Hiera at 256 px (tests/helpers/sam2_ref.py), random weights from a
fixed seed perturbed so none is trivial, saved as an official checkpoint, converted by our
converter and loaded by our ``build_sam2``. Compared: the image encoder's outputs, the image
predictor's masks, scores and low-res logits for each kind of prompt, and four tracking steps
through the memory (SAM 2.1 and SAM 2.0 settings). Seconds on 2 cores.

The opt-in full-size runs (``pytest --runslow``) do the same at 1024 px for each released
Hiera size, converted through ``paddle-sam convert`` with the size detected from the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_sam.convert.checkpoint import convert_checkpoint
from paddle_sam.loading.sam2 import build_sam2
from paddle_sam.models.sam2.build_sam import SAM2_CONFIGS, SAM2_SPECS
from paddle_sam.predict.sam2.predictor import SAM2ImagePredictor
from tests.helpers.sam2_ref import (
    REDUCED_OVERRIDES,
    config_file,
    official_model,
    official_predictor,
    reduced_spec,
    save_official,
)

torch = pytest.importorskip("torch")
pytest.importorskip("sam2")

MASK_AGREEMENT = 0.9999  # fraction of mask pixels equal
SCORE_TOL = 1e-5
LOGIT_TOL = 1e-4


def _pair(tmp: Path, version: str) -> tuple:
    ref = official_model(config_file(version), REDUCED_OVERRIDES)
    pt = save_official(ref, tmp / f"reduced_{version}.pt")
    spec = reduced_spec(version)
    convert_checkpoint(pt, tmp / f"reduced_{version}.pdparams", spec=spec, progress=False)
    ours = build_sam2(spec, tmp / f"reduced_{version}.pdparams")
    return ref, ours


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return _pair(tmp_path_factory.mktemp("sam2_reduced"), "2.1")


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (180, 240, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def predictors(pair, image):
    ref, ours = pair
    theirs, mine = official_predictor(ref), SAM2ImagePredictor(ours)
    theirs.set_image(image)
    mine.set_image(image)
    return theirs, mine


def _close(a, b, tol: float, what: str) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} vs {b.shape}"
    err = float(np.abs(a - b).max())
    assert err <= tol, f"{what}: max abs error {err:.3g} > {tol}"


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_image_encoder(pair) -> None:
    _check_image_encoder(*pair)


@pytest.mark.parametrize("path", ["inference", "unfused attention", "MLP in row chunks"])
def test_image_encoder_paths(pair, monkeypatch, path: str) -> None:
    """Without gradients, as the predictors run it: Paddle's fused attention kernel where this
    CPU has it (AVX-512), attention without it (other CPUs), and the MLP in row chunks (the
    first stage's at full size; forced here, in uneven chunks)."""
    from paddle_sam.models.sam2 import hieradet
    from paddle_sam.models.sam3.model_misc import fused_attention_available

    calls = []
    if path == "inference":
        if not fused_attention_available():
            pytest.skip("no fused attention kernel on this CPU")
        fused = hieradet.fused_self_attention
        monkeypatch.setattr(
            hieradet, "fused_self_attention", lambda *a: calls.append(a) or fused(*a)
        )
    elif path == "unfused attention":
        monkeypatch.setattr(hieradet, "use_fused_attention", lambda *a: calls.append(a) and False)
    else:
        monkeypatch.setattr(hieradet, "MLP_CHUNKED_FROM", 1)
        monkeypatch.setattr(hieradet, "MLP_CHUNK_HIDDEN", 1000)
        split = paddle.split
        monkeypatch.setattr(paddle, "split", lambda *a, **k: calls.append(a) or split(*a, **k))
    with paddle.no_grad():
        _check_image_encoder(*pair)
    assert calls, f"{path}: the path was not taken"


def _check_image_encoder(ref, ours) -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 256, 256)).astype(np.float32)
    with torch.no_grad():
        want = ref.forward_image(torch.from_numpy(x))
    got = ours.forward_image(paddle.to_tensor(x))
    for key in ("backbone_fpn", "vision_pos_enc"):
        assert len(want[key]) == len(got[key]) == 3
        for i, (a, b) in enumerate(zip(want[key], got[key], strict=True)):
            a, b = a.numpy(), b.numpy()
            assert _cosine(a, b) >= 0.99999, f"{key}[{i}]"
            _close(a, b, 1e-5 * max(1.0, float(np.abs(a).max())), f"{key}[{i}]")
    _close(want["vision_features"].numpy(), got["vision_features"].numpy(), 1e-5, "features")


CASES = {
    "point": dict(point_coords=[[100.0, 80.0]], point_labels=[1]),
    "points single": dict(
        point_coords=[[100.0, 80.0], [30.0, 40.0]], point_labels=[1, 0], multimask_output=False
    ),
    "box": dict(box=[20.0, 30.0, 200.0, 150.0], multimask_output=False),
    "box and point": dict(
        box=[20.0, 30.0, 200.0, 150.0], point_coords=[[100, 80]], point_labels=[1]
    ),
    "two boxes": dict(box=[[20.0, 30.0, 200.0, 150.0], [0.0, 0.0, 100.0, 100.0]]),
    "normalised point": dict(
        point_coords=[[0.4, 0.5]], point_labels=[1], normalize_coords=False, return_logits=True
    ),
}


def _compare(want, got, what: str, logits: bool = False) -> None:
    """Masks (0/1 as float32, as upstream returns them; or logits), scores, low-res logits."""
    (wm, ws, wl), (gm, gs, gl) = want, got
    assert gm.shape == wm.shape and gm.dtype == wm.dtype, what
    if not logits:
        assert set(np.unique(gm)) <= {0.0, 1.0}, what
        agreement = float((wm == gm).mean())
        assert agreement >= MASK_AGREEMENT, f"{what}: masks agree on {agreement:.6f}"
        assert 0.0 < wm.mean() < 1.0, f"{what}: a trivial mask compares nothing"
    else:
        _close(wm, gm, LOGIT_TOL, f"{what} mask logits")
    _close(ws, gs, SCORE_TOL, f"{what} scores")
    _close(wl, gl, LOGIT_TOL, f"{what} low-res logits")


@pytest.mark.parametrize("case", sorted(CASES))
def test_predict(predictors, case: str) -> None:
    theirs, mine = predictors
    kw = {k: np.asarray(v) if isinstance(v, list) else v for k, v in CASES[case].items()}
    want, got = theirs.predict(**kw), mine.predict(**kw)
    logits = kw.get("return_logits", False)
    _compare(want, got, case, logits)
    # the best mask's logits fed back as the mask prompt
    low_res, scores = want[2], want[1]
    if low_res.ndim == 3:
        kw["mask_input"] = low_res[None, int(np.argmax(scores))]
    else:
        kw["mask_input"] = low_res[:, :1]
    _compare(theirs.predict(**kw), mine.predict(**kw), case + " + mask input", logits)


def test_mask_input_alone(predictors) -> None:
    theirs, mine = predictors
    _, _, low_res = theirs.predict(point_coords=np.array([[60, 50]]), point_labels=np.array([1]))
    kw = dict(mask_input=low_res[:1], multimask_output=False)
    _compare(theirs.predict(**kw), mine.predict(**kw), "mask input alone")


def test_embedding(predictors) -> None:
    theirs, mine = predictors
    _close(theirs.get_image_embedding().numpy(), mine.get_image_embedding().numpy(), 1e-5, "emb")


def test_pil_image(pair, predictors, image) -> None:
    """A PIL image gives the array's embedding, here as upstream (ToTensor of either)."""
    from PIL import Image

    ref, ours = pair
    theirs, mine = official_predictor(ref), SAM2ImagePredictor(ours)
    theirs.set_image(Image.fromarray(image))
    mine.set_image(Image.fromarray(image))
    np.testing.assert_array_equal(
        mine.get_image_embedding().numpy(), predictors[1].get_image_embedding().numpy()
    )
    _close(theirs.get_image_embedding().numpy(), mine.get_image_embedding().numpy(), 1e-5, "pil")


def test_batch(pair) -> None:
    """Two images of other sizes (one larger than the model's input: antialiased downsizing)."""
    ref, ours = pair
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, s, dtype=np.uint8) for s in ((300, 420, 3), (120, 90, 3))]
    theirs, mine = official_predictor(ref), SAM2ImagePredictor(ours)
    theirs.set_image_batch(images)
    mine.set_image_batch(images)
    kw = dict(
        point_coords_batch=[np.array([[[200.0, 150.0]]]), np.array([[[40.0, 60.0]], [[10, 10]]])],
        point_labels_batch=[np.array([[1]]), np.array([[1], [1]])],
        box_batch=[None, np.array([[5.0, 5.0, 80.0, 100.0], [0.0, 0.0, 50.0, 50.0]])],
    )
    want, got = theirs.predict_batch(**kw), mine.predict_batch(**kw)
    for i in range(2):
        _compare((want[0][i], want[1][i], want[2][i]), (got[0][i], got[1][i], got[2][i]), f"{i}")


def test_reset_and_errors(pair, image) -> None:
    _, ours = pair
    predictor = SAM2ImagePredictor(ours)
    with pytest.raises(RuntimeError, match="set_image"):
        predictor.predict(point_coords=np.array([[1, 1]]), point_labels=np.array([1]))
    with pytest.raises(ValueError, match="H x W x 3"):
        predictor.set_image(image[..., 0])
    with pytest.raises(ValueError, match="uint8"):
        predictor.set_image(image.astype(np.int64))
    predictor.set_image(image)
    with pytest.raises(ValueError, match="point_labels must be supplied"):
        predictor.predict(point_coords=np.array([[1, 1]]))
    with pytest.raises(RuntimeError, match="batch"):
        predictor.predict_batch()
    predictor.reset_predictor()
    with pytest.raises(RuntimeError, match="set_image"):
        predictor.get_image_embedding()
    with pytest.raises(ValueError, match="never downloads"):
        SAM2ImagePredictor.from_pretrained("facebook/sam2.1-hiera-tiny")


@pytest.mark.parametrize("version", ["2.1", "2.0"])
def test_track_steps(pair, tmp_path, version: str) -> None:
    """Four frames through ``track_step``: points on frames 0 and 2 (conditioning), tracking
    on 1 and 3 from the memory bank (memory encoder, memory attention with RoPE over the
    memories and object pointers, temporal encodings)."""
    ref, ours = pair if version == "2.1" else _pair(tmp_path, version)
    frames = np.random.default_rng(3).standard_normal((4, 1, 3, 256, 256)).astype(np.float32)
    banks: list[dict] = [{"cond_frame_outputs": {}, "non_cond_frame_outputs": {}} for _ in "ab"]
    points = np.array([[[60.0, 80.0], [120.0, 100.0]]], np.float32)
    labels = np.array([[1, 0]], np.int32)
    for f in range(4):
        cond = f in (0, 2)
        with torch.no_grad():
            _, tv, tpos, tsz = ref._prepare_backbone_features(
                ref.forward_image(torch.from_numpy(frames[f]))
            )
            tp = None
            if cond:
                tp = {
                    "point_coords": torch.from_numpy(points),
                    "point_labels": torch.from_numpy(labels),
                }
            want = ref.track_step(f, f == 0, tv, tpos, tsz, tp, None, banks[0], 4)
        _, pv, ppos, psz = ours._prepare_backbone_features(
            ours.forward_image(paddle.to_tensor(frames[f]))
        )
        pp = None
        if cond:
            pp = {
                "point_coords": paddle.to_tensor(points),
                "point_labels": paddle.to_tensor(labels),
            }
        got = ours.track_step(f, f == 0, pv, ppos, psz, pp, None, banks[1], 4)
        key = "cond_frame_outputs" if cond else "non_cond_frame_outputs"
        banks[0][key][f], banks[1][key][f] = want, got
        score = float(want["object_score_logits"].numpy().ravel()[0])
        assert abs(score) > 1e-3, "object score too near 0 to compare the decision"
        for name in ("pred_masks", "pred_masks_high_res", "obj_ptr", "object_score_logits"):
            _close(want[name].numpy(), got[name].numpy(), 1e-4, f"frame {f} {name}")
        _close(
            want["maskmem_features"].numpy(), got["maskmem_features"].numpy(), 1e-4, f"frame {f}"
        )
        _close(want["maskmem_pos_enc"][-1].numpy(), got["maskmem_pos_enc"][-1].numpy(), 1e-5, "pos")


# ----------------------------------------------------------------------- opt-in: full size

_FULL = [name for name in SAM2_SPECS if name.startswith("sam2.1_")] + ["sam2_hiera_tiny"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _FULL)
def test_full_size(tmp_path, name: str) -> None:
    """A released size at 1024 px: upstream's config with random weights, saved as an official
    checkpoint, converted by ``paddle-sam convert`` (size detected), through both predictors."""
    from paddle_sam.cli import main as cli

    ref = official_model(SAM2_CONFIGS[name], scale=0.02)
    pt = save_official(ref, tmp_path / f"{name}.pt")
    dst = tmp_path / f"{name}.pdparams"
    assert cli(["convert", str(pt), str(dst), "--quiet"]) == 0
    assert json.loads((tmp_path / f"{name}.pdparams.json").read_text())["model_type"] == name
    pt.unlink()
    ours = build_sam2(SAM2_CONFIGS[name], dst)
    image = np.random.default_rng(5).integers(0, 256, (600, 800, 3), dtype=np.uint8)
    theirs, mine = official_predictor(ref), SAM2ImagePredictor(ours)
    theirs.set_image(image)
    mine.set_image(image)
    emb_t, emb_m = theirs.get_image_embedding().numpy(), mine.get_image_embedding().numpy()
    assert _cosine(emb_t, emb_m) >= 0.99999
    for case in ("point", "box and point", "two boxes"):
        kw = {k: np.asarray(v) if isinstance(v, list) else v for k, v in CASES[case].items()}
        _compare(theirs.predict(**kw), mine.predict(**kw), f"{name} {case}")
