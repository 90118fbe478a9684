"""SAM 2's video predictor against the official one (sam2 1.1.0 ``SAM2VideoPredictor``, built by
upstream's ``build_sam2_video_predictor``) at the reduced size of test_sam2_parity.py, on a
four-frame JPEG folder read by both: two objects (clicks, a box, a mask), propagation forwards
and backwards, a correction click on a tracked frame, removing an object, clearing prompts.

Two CPU facts of the official code, handled here only: it stores memory
features as bfloat16 and relies on CUDA autocast, so on the CPU its memory attention gets
bfloat16 memories that its float32 Linear refuses: they are cast to float32 on the way in
(values stay bfloat16-rounded, as ours). Its hole filling needs its CUDA extension (skipped
with a warning on the CPU): ``fill_hole_area=0`` on both sides; ours is tested on its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
import pytest
from PIL import Image

from paddle_sam.convert.checkpoint import convert_checkpoint
from paddle_sam.loading.sam2 import build_sam2_video_predictor
from paddle_sam.predict.sam2.video_predictor import SAM2VideoPredictor
from paddle_sam.predict.video import open_video, preprocess_sam3_frame
from tests.helpers.sam2_ref import (
    REDUCED_OVERRIDES,
    config_file,
    ensure_hydra,
    reduced_spec,
    save_official,
)

torch = pytest.importorskip("torch")
pytest.importorskip("sam2")

TOL = 1e-4  # mask logits


def _official_video_predictor(version: str):
    from sam2.build_sam import build_sam2_video_predictor as build

    ensure_hydra()
    torch.manual_seed(0)
    ref = build(config_file(version), None, device="cpu", hydra_overrides_extra=REDUCED_OVERRIDES)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in ref.state_dict().values():
            if t.is_floating_point():
                t.add_(0.05 * torch.randn(t.shape, generator=gen) * (t.abs().mean() + 0.5))
        # object scores clearly positive: the tracked masks are not all "no object"
        ref.sam_mask_decoder.pred_obj_score_head.layers[2].bias.add_(2.0)
    ref.eval()
    ref.fill_hole_area = 0
    forward = ref.memory_attention.forward

    def float_memory(curr, memory, curr_pos=None, memory_pos=None, num_obj_ptr_tokens=0):
        return forward(curr, memory.float(), curr_pos, memory_pos.float(), num_obj_ptr_tokens)

    ref.memory_attention.forward = float_memory
    return ref


@pytest.fixture(scope="module", params=["2.1", pytest.param("2.0", marks=pytest.mark.slow)])
def predictors(request, tmp_path_factory):
    version = request.param
    tmp = tmp_path_factory.mktemp(f"sam2_video_{version}")
    ref = _official_video_predictor(version)
    save_official(ref, tmp / "reduced.pt")
    spec = reduced_spec(version)
    convert_checkpoint(tmp / "reduced.pt", tmp / "reduced.pdparams", spec=spec, progress=False)
    ours = build_sam2_video_predictor(spec, tmp / "reduced.pdparams", fill_hole_area=0)
    assert isinstance(ours, SAM2VideoPredictor)
    assert ours.binarize_mask_from_pts_for_mem_enc and ref.binarize_mask_from_pts_for_mem_enc
    return ref, ours


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> Path:
    """Four JPEG frames (upstream reads JPEG folders), a textured scene drifting right."""
    folder = tmp_path_factory.mktemp("frames")
    base = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    for i in range(4):
        Image.fromarray(np.roll(base, 3 * i, axis=1)).save(folder / f"{i:05d}.jpg", quality=95)
    return folder


def _close(want, got, what: str) -> None:
    want = want.float().numpy()
    got = got.numpy()
    assert want.shape == got.shape, f"{what}: {want.shape} vs {got.shape}"
    err = float(np.abs(want - got).max())
    assert err <= TOL, f"{what}: max abs error {err:.3g}"
    fg = float((want > 0).mean())
    assert 0.0 < fg < 1.0, f"{what}: a trivial mask compares nothing"


def _both(ref, ours, method: str, ref_state, our_state, *args, **kwargs):
    with torch.inference_mode():
        want = getattr(ref, method)(ref_state, *args, **kwargs)
    return want, getattr(ours, method)(our_state, *args, **kwargs)


def _propagate(ref, ours, ref_state, our_state, what: str, **kwargs) -> None:
    with torch.inference_mode():
        want = list(ref.propagate_in_video(ref_state, **kwargs))
    got = list(ours.propagate_in_video(our_state, **kwargs))
    assert [f for f, _, _ in got] == [f for f, _, _ in want]
    for (f, ids, m), (_, ids2, m2) in zip(want, got, strict=True):
        assert list(ids) == list(ids2)
        _close(m, m2, f"{what} frame {f}")


def test_session(predictors, video) -> None:
    ref, ours = predictors
    ts, ps = ref.init_state(str(video)), ours.init_state(str(video))
    assert (ps["video_height"], ps["video_width"], ps["num_frames"]) == (96, 128, 4)

    want, got = _both(ref, ours, "add_new_points_or_box", ts, ps, 0, 1, [[40, 50]], [1])
    assert got[0] == want[0] == 0 and list(got[1]) == [1]
    _close(want[2], got[2], "clicks")
    want, got = _both(ref, ours, "add_new_points_or_box", ts, ps, 1, 2, box=[10, 10, 70, 60])
    _close(want[2], got[2], "box")
    mask = np.zeros((96, 128), bool)
    mask[20:70, 60:110] = True
    want, got = _both(ref, ours, "add_new_mask", ts, ps, 2, 3, mask)
    _close(want[2], got[2], "mask")
    _propagate(ref, ours, ts, ps, "forward")
    _propagate(
        ref, ours, ts, ps, "backward", start_frame_idx=2, max_frame_num_to_track=1, reverse=True
    )

    # a correction click on a tracked frame (refined from the previous mask), then again
    want, got = _both(
        ref, ours, "add_new_points_or_box", ts, ps, 3, 1, [[90, 30]], [0], clear_old_points=False
    )
    _close(want[2], got[2], "correction")
    _propagate(ref, ours, ts, ps, "after correction", start_frame_idx=3, max_frame_num_to_track=0)

    want, got = _both(ref, ours, "clear_all_prompts_in_frame", ts, ps, 1, 2)
    _close(want[2], got[2], "cleared")
    want, got = _both(ref, ours, "remove_object", ts, ps, 3)
    assert list(want[0]) == list(got[0]) == [1, 2]
    _both(ref, ours, "add_new_points_or_box", ts, ps, 1, 2, [[20, 20]], [1])
    _propagate(ref, ours, ts, ps, "after removal", start_frame_idx=1, max_frame_num_to_track=1)

    _both(ref, ours, "reset_state", ts, ps)
    assert ps["obj_ids"] == []
    with pytest.raises(RuntimeError, match="No input points or masks"):
        next(ours.propagate_in_video(ps))


def test_refusals(predictors, video) -> None:
    _, ours = predictors
    state = ours.init_state(str(video))
    with pytest.raises(ValueError, match="points and labels must be provided together"):
        ours.add_new_points_or_box(state, 0, 1, points=[[1, 2]])
    with pytest.raises(IndexError, match="out of range: the video has 4 frames"):
        ours.add_new_points_or_box(state, 4, 1, points=[[1, 2]], labels=[1])
    with pytest.raises(ValueError, match="cannot add box without clearing old points"):
        ours.add_new_points_or_box(state, 0, 1, box=[1, 2, 3, 4], clear_old_points=False)
    with pytest.raises(ValueError, match="mask must be H x W"):
        ours.add_new_mask(state, 0, 1, np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="never downloads"):
        SAM2VideoPredictor.from_pretrained("facebook/sam2.1-hiera-tiny")
    # frames prepared for SAM 3 (0.5 / 0.5 normalisation) would track silently wrong
    sam3_frames = open_video(video, image_size=ours.image_size, preprocess=preprocess_sam3_frame)
    with pytest.raises(ValueError, match="another model's preparation"):
        ours.init_state(sam3_frames)


def test_hole_filling(predictors) -> None:
    """``fill_hole_area`` (upstream's CUDA post-processing, the reference skips it on the CPU):
    a background hole of at most that many low-res pixels becomes foreground (0.1)."""
    _, ours = predictors
    scores = np.full((1, 1, 16, 16), 5.0, np.float32)
    scores[0, 0, 4:6, 4:6] = -3.0  # a 4-pixel hole
    scores[0, 0, :, 12:] = -3.0  # background of 64 pixels
    old = ours.fill_hole_area
    try:
        ours.fill_hole_area = 8
        from paddle_sam.models.sam3.sam3_tracker_utils import fill_holes_in_mask_scores

        out = fill_holes_in_mask_scores(paddle.to_tensor(scores), 8, remove_sprinkles=False).numpy()
    finally:
        ours.fill_hole_area = old
    assert (out[0, 0, 4:6, 4:6] == 0.1).all() and (out[0, 0, :, 12:] == -3.0).all()
