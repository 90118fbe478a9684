"""SAM 3's video tracker end to end against the official one (sam3 0.1.4): a reduced model
(112 px, 2-block ViT, the tracker's own widths) with random weights written in the released
``sam3.pt`` layout, converted by our converter, loaded by ``load_sam3_tracker``; upstream's
tracker holds the same weights. Both open the same folder of JPEG frames of a generated video
(``init_state(video_path=...)``) and run the same prompts and propagations; masks, object
scores and returned ids are compared at every step."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_sam.convert import sam3 as convert_sam3
from paddle_sam.convert.checkpoint import convert_checkpoint
from paddle_sam.convert.core import CheckpointMismatchError
from paddle_sam.loading.sam3 import build_sam3_video_model, build_tracker, load_sam3_tracker
from paddle_sam.models.sam3.build_sam3 import SAM3_SPEC, TRACKER_SETTINGS
from paddle_sam.predict.video import VideoError
from tests.helpers.sam3_ref import (
    assert_close,
    assert_masks_close,
    import_sam3,
    randomise_tracker_,
    reference_tracker,
    tracker_cpu_patches,
)
from tests.helpers.specs import tiny_sam3_tracker_spec
from tests.helpers.video import scene, write_frames, write_mp4

torch, _ = import_sam3()

# the tracker's heads keep the released widths whatever the detector's size
SPEC = tiny_sam3_tracker_spec()
NUM_FRAMES, H, W = 8, 60, 80


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory):
    return write_frames(scene(NUM_FRAMES, H, W), tmp_path_factory.mktemp("video"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The official tracker (with backbone) and a file in the released layout holding its
    weights plus random detector weights, converted to .pdparams by our converter."""
    with tracker_cpu_patches():
        torch.manual_seed(0)
        ref = randomise_tracker_(reference_tracker(SPEC, with_backbone=True, **TRACKER_SETTINGS))
    ref_state = ref.state_dict()
    model = {}
    gen = torch.Generator().manual_seed(5)
    for key, (shape, dtype) in convert_sam3.released_layout(SPEC).items():
        if dtype == "complex64":
            model[key] = torch.zeros(shape, dtype=torch.complex64)
        else:
            model[key] = torch.randn(shape, generator=gen) * 0.02
    for key, value in ref_state.items():
        if key.startswith("backbone."):
            assert "detector." + key in model, key
            model["detector." + key] = value
        else:
            model["tracker." + key] = value
    folder = tmp_path_factory.mktemp("ckpt")
    torch.save({"model": model}, folder / "sam3_tiny.pt")
    convert_checkpoint(folder / "sam3_tiny.pt", folder / "sam3_tiny.pdparams", spec=SPEC)
    return ref, folder / "sam3_tiny.pdparams"


@pytest.fixture
def pair(checkpoint):
    ref, path = checkpoint
    return ref, load_sam3_tracker(path)


def _points(p: dict) -> dict:
    return {k: (torch.tensor(v) if k in ("points", "box") else v) for k, v in p.items()}


def _run(ref, ours, video_dir, steps: list) -> list[float]:
    """Runs ``steps`` (``("prompt", kwargs)``, ``("mask", kwargs)``, ``("propagate", kwargs)``)
    on both sides from ``init_state(video_path=...)``, comparing every output."""
    with tracker_cpu_patches():
        r_state = ref.init_state(
            video_path=str(video_dir), offload_video_to_cpu=True, offload_state_to_cpu=True
        )
    o_state = ours.init_state(video_path=str(video_dir))
    assert (o_state["video_height"], o_state["video_width"], o_state["num_frames"]) == (
        r_state["video_height"],
        r_state["video_width"],
        r_state["num_frames"],
    )
    errs = []
    for kind, kw in steps:
        if kind == "prompt":
            with tracker_cpu_patches():
                r = ref.add_new_points_or_box(r_state, **_points(kw))
            o = ours.add_new_points_or_box(o_state, **kw)
        elif kind == "mask":
            with tracker_cpu_patches():
                r = ref.add_new_mask(
                    r_state, kw["frame_idx"], kw["obj_id"], torch.tensor(kw["mask"])
                )
            o = ours.add_new_mask(o_state, **kw)
        if kind in ("prompt", "mask"):
            assert r[0] == o[0] and list(r[1]) == list(o[1])
            errs.append(assert_masks_close(r[3], o[3], f"{kind} {kw}"))
            continue
        with tracker_cpu_patches():
            r_out = list(ref.propagate_in_video(r_state, **kw, propagate_preflight=True))
        o_out = list(ours.propagate_in_video(o_state, **kw, propagate_preflight=True))
        assert [x[0] for x in r_out] == [x[0] for x in o_out], kw
        for r, o in zip(r_out, o_out, strict=True):
            name = f"propagate {kw} frame {r[0]}"
            assert list(r[1]) == list(o[1])
            errs.append(assert_masks_close(r[3], o[3], name + ": masks"))
            assert_close(r[4], o[4], max_abs=1e-3, name=name + ": object scores")
    return errs


FWD = dict(start_frame_idx=0, max_frame_num_to_track=None, reverse=False)
SCENARIOS = {
    "one click": [
        ("prompt", dict(frame_idx=0, obj_id=1, points=[[0.2, 0.4]], labels=[1])),
        ("propagate", FWD),
    ],
    "second object on frame 3": [
        ("prompt", dict(frame_idx=0, obj_id=1, points=[[0.2, 0.4]], labels=[1])),
        ("prompt", dict(frame_idx=3, obj_id=2, points=[[0.85, 0.1]], labels=[1])),
        ("propagate", FWD),
    ],
    "negative click then re-propagation": [
        ("prompt", dict(frame_idx=0, obj_id=1, points=[[0.2, 0.4]], labels=[1])),
        ("propagate", FWD),
        ("prompt", dict(frame_idx=5, obj_id=1, points=[[0.6, 0.3]], labels=[0],
                        clear_old_points=False)),
        ("propagate", dict(start_frame_idx=5, max_frame_num_to_track=None, reverse=False)),
    ],
    "box, object leaving and returning": [
        ("prompt", dict(frame_idx=0, obj_id=4, box=[0.55, 0.5, 0.85, 0.85])),
        ("propagate", FWD),
    ],
    "backward from the last frame": [
        ("prompt", dict(frame_idx=7, obj_id=3, points=[[0.8, 0.4], [0.1, 0.1]], labels=[1, 0])),
        ("propagate", dict(start_frame_idx=7, max_frame_num_to_track=4, reverse=True)),
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_tracking_matches_official(pair, video_dir, name):
    ref, ours = pair
    errs = _run(ref, ours, video_dir, SCENARIOS[name])
    print(f"{name}: max abs mask logit error {max(errs):.2e}")


def test_mask_prompt_from_video(pair, video_dir):
    ref, ours = pair
    mask = np.zeros((H, W), bool)
    mask[15:33, 8:26] = True
    _run(
        ref, ours, video_dir, [("mask", dict(frame_idx=0, obj_id=1, mask=mask)), ("propagate", FWD)]
    )


def test_video_sources_agree(pair, tmp_path):
    """A PNG folder, a list of frames and an MP4 file of the same video are tracked the same:
    PNG and list bit for bit; the MP4 (lossy) to the same shapes and ids."""
    _, ours = pair
    frames = scene(NUM_FRAMES, H, W)
    png = write_frames(frames, tmp_path / "png", ext=".png")
    mp4 = write_mp4(frames, tmp_path / "clip.mp4")
    results = {}
    for tag, source in (("png", png), ("list", frames), ("mp4", mp4)):
        state = ours.init_state(video_path=source)
        ours.add_new_points_or_box(state, 0, 1, [[0.2, 0.4]], [1])
        out = list(ours.propagate_in_video(state, propagate_preflight=True))
        results[tag] = out
        assert [o[0] for o in out] == list(range(NUM_FRAMES))
        assert all(tuple(o[3].shape) == (1, 1, H, W) for o in out)
    for a, b in zip(results["png"], results["list"], strict=True):
        np.testing.assert_array_equal(a[3].numpy(), b[3].numpy())


def test_notebook_pattern(checkpoint, video_dir):
    """sam3's SAM 2 task notebook: ``build_sam3_video_model``, then the tracker on the
    detector's backbone (loaded from the same file, so results equal load_sam3_tracker's
    with upstream's default for the video model: memory selection on)."""
    _, path = checkpoint
    model = build_sam3_video_model(checkpoint_path=path, spec=SPEC)
    predictor = model.tracker
    predictor.backbone = model.detector.backbone
    assert predictor.use_memory_selection
    alone = load_sam3_tracker(path, apply_temporal_disambiguation=True)
    outs = []
    for tracker in (predictor, alone):
        state = tracker.init_state(video_path=str(video_dir))
        tracker.add_new_points(state, 0, 1, [[0.2, 0.4]], [1], clear_old_points=False)
        outs.append(
            list(tracker.propagate_in_video(state, 0, 240, False, propagate_preflight=True))
        )
    for a, b in zip(*outs, strict=True):
        np.testing.assert_allclose(a[3].numpy(), b[3].numpy(), atol=1e-5)


def test_released_settings_are_upstreams():
    """TRACKER_SETTINGS (and the builder's sizes) are those of upstream's build_tracker."""
    from sam3 import model_builder as mb

    with tracker_cpu_patches():
        ref = mb.build_tracker(apply_temporal_disambiguation=False)
    ours = build_tracker()
    for key, value in TRACKER_SETTINGS.items():
        if key == "sam_mask_decoder_extra_args":
            dec = ref.sam_mask_decoder
            assert value == {
                "dynamic_multimask_via_stability": dec.dynamic_multimask_via_stability,
                "dynamic_multimask_stability_delta": dec.dynamic_multimask_stability_delta,
                "dynamic_multimask_stability_thresh": dec.dynamic_multimask_stability_thresh,
            }
            continue
        assert getattr(ref, key) == value == getattr(ours, key), key
    for key in ("image_size", "backbone_stride", "num_maskmem", "use_memory_selection"):
        assert getattr(ref, key) == getattr(ours, key), key
    assert ref.maskmem_backbone.mask_downsampler.interpol_size == [1152, 1152]
    assert list(ours.maskmem_backbone.mask_downsampler.interpol_size) == [1152, 1152]


def test_every_released_tracker_key_is_converted(reference_dir):
    """Every ``tracker.*`` row of the released checkpoint maps onto the tracker built at the
    released sizes (no key left over or missing, shapes in Paddle's layout)."""
    import ast

    rows = (reference_dir / "sam3_checkpoint_keys.tsv").read_text().splitlines()[1:]
    layout = {}
    for row in rows:
        key, shape, dtype = row.split("\t")[:3]
        if key.startswith("tracker."):
            layout[key] = (tuple(ast.literal_eval(shape)), dtype)
    target = convert_sam3.converted_shapes(layout)
    state = convert_sam3.tracker_state({k: np.empty(0) for k in target})
    assert set(state) == set(convert_sam3.tracker_layout(SAM3_SPEC))
    want = convert_sam3.tracker_layout(SAM3_SPEC)
    got = {k[len(convert_sam3.INTERACTIVE_PREFIX) :]: tuple(v) for k, v in target.items()}
    assert got == {k: tuple(v) for k, v in want.items()}


def test_errors_name_the_problem(checkpoint, tmp_path, video_dir):
    _, path = checkpoint
    with pytest.raises(FileNotFoundError, match="not found"):
        load_sam3_tracker(tmp_path / "missing.pdparams")
    tracker = build_tracker(spec=SPEC)
    with pytest.raises(RuntimeError, match="no image backbone"):
        state = tracker.init_state(video_path=str(video_dir))
        tracker.add_new_points_or_box(state, 0, 1, [[0.5, 0.5]], [1])
    with pytest.raises(ValueError, match="video_path"):
        tracker.init_state()
    with pytest.raises(VideoError):
        tracker.init_state(video_path=str(tmp_path / "nothing.mp4"))
    # a file converted without the tracker
    state = paddle.load(str(path))
    no_tracker = {k: v for k, v in state.items() if not k.startswith("inst_interactive")}
    bad = tmp_path / "image_only.pdparams"
    paddle.save(no_tracker, str(bad))
    with pytest.raises(CheckpointMismatchError, match="no video tracker"):
        load_sam3_tracker(bad)
