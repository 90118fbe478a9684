"""Parity of SAM 3's tracker inference state (``Sam3TrackerPredictor``: prompts per object,
consolidation, preflight memory encoding, propagation forward and in reverse, object removal)
against the official sam3 predictor, at 224 px with perturbed weights and the same random
backbone features per frame on both sides (upstream's ``cached_features``; ours from an
``image_feature_fn``)."""

from __future__ import annotations

import numpy as np
import paddle

from paddle_sam.models.sam3 import memory as PM
from paddle_sam.models.sam3.memory_attention import build_tracker_memory_attention
from paddle_sam.models.sam3.model_misc import TransformerWrapper
from paddle_sam.models.sam3.position_encoding import PositionEmbeddingSine
from paddle_sam.models.sam3.sam3_tracking_predictor import Sam3TrackerPredictor
from tests.helpers.sam3_ref import (
    assert_close,
    assert_masks_close,
    fan_in_init_,
    import_sam3,
    perturb_module_,
    tracker_cpu_patches,
)
from tests.models.test_sam3_heads import load_from_torch, randn, t2p
from tests.models.test_sam3_memory import _torch_layout
from tests.models.test_sam3_tracker import IMAGE, RELEASED, SIDE, _maskmem

torch, _ = import_sam3()

NUM_FRAMES = 4
VIDEO_H, VIDEO_W = 120, 160
EXTRA = dict(clear_non_cond_mem_around_input=True)


def _build_pair(**extra):
    from sam3 import model_builder as mb
    from sam3.model import memory as RM
    from sam3.model.position_encoding import PositionEmbeddingSine as RefPE
    from sam3.model.sam3_tracking_predictor import Sam3TrackerPredictor as RefPredictor

    with tracker_cpu_patches():
        torch.manual_seed(0)
        ref = RefPredictor(
            backbone=None,
            transformer=mb._create_tracker_transformer(),
            maskmem_backbone=_maskmem(RM, RefPE),
            **RELEASED,
            **EXTRA,
            **extra,
        )
        perturb_module_(ref, seed=1, scale=0.05)
        fan_in_init_(ref.transformer.encoder, seed=3, gain=1.0)
        with torch.no_grad():
            for name in ("no_mem_embed", "no_obj_ptr", "no_obj_embed_spatial", "maskmem_tpos_enc"):
                getattr(ref, name).normal_(0, 0.5)
            ref.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.fill_(6.0)
    ref.eval()
    ours = Sam3TrackerPredictor(
        transformer=TransformerWrapper(build_tracker_memory_attention((SIDE, SIDE)), None, 256),
        maskmem_backbone=_maskmem(PM, PositionEmbeddingSine),
        **RELEASED,
        **EXTRA,
        **extra,
    )
    load_from_torch(ours, ref, skip_complex=True)
    ours.eval()
    return ref, ours


def _raw(frame: int) -> dict:
    sides = (4 * SIDE, 2 * SIDE, SIDE)
    return {
        "backbone_fpn": [randn(1, 256, s, s, seed=100 * frame + s) for s in sides],
        "vision_pos_enc": [randn(1, 256, s, s, seed=100 * frame + s + 1) for s in sides],
    }


def _states(ref, ours):
    cached = {}
    with torch.no_grad():
        for f in range(NUM_FRAMES):
            raw = _raw(f)
            raw["backbone_fpn"][0] = ref.sam_mask_decoder.conv_s0(raw["backbone_fpn"][0])
            raw["backbone_fpn"][1] = ref.sam_mask_decoder.conv_s1(raw["backbone_fpn"][1])
            cached[f] = (torch.zeros(1, 3, IMAGE, IMAGE), raw)
    with tracker_cpu_patches():
        r_state = ref.init_state(
            video_height=VIDEO_H,
            video_width=VIDEO_W,
            num_frames=NUM_FRAMES,
            cached_features=cached,
            offload_video_to_cpu=True,
            offload_state_to_cpu=True,
        )

    def feature_fn(frame: int) -> dict:
        raw = {k: [t2p(x) for x in v] for k, v in _raw(frame).items()}
        with paddle.no_grad():
            return ours.prepare_backbone_out(raw)

    o_state = ours.init_state(VIDEO_H, VIDEO_W, NUM_FRAMES, image_feature_fn=feature_fn)
    return r_state, o_state


def _propagate(ref, ours, r_state, o_state, tag: str, **kw) -> list[float]:
    with tracker_cpu_patches():
        ref.propagate_in_video_preflight(r_state)
        r_out = list(ref.propagate_in_video(r_state, tqdm_disable=True, **kw))
    ours.propagate_in_video_preflight(o_state)
    o_out = list(ours.propagate_in_video(o_state, **kw))
    assert [x[0] for x in r_out] == [x[0] for x in o_out]
    errs = []
    for r, o in zip(r_out, o_out, strict=True):
        frame = r[0]
        assert list(r[1]) == list(o[1])
        errs.append(assert_masks_close(r[3], o[3], f"{tag} frame {frame}: video masks"))
        errs.append(assert_masks_close(r[2], o[2], f"{tag} frame {frame}: low-res masks"))
        assert_close(r[4], o[4], max_abs=1e-4 * max(1.0, float(r[4].abs().max())))
        assert (r[4] > 0.5).all(), f"{tag} frame {frame}: object score too close to 0"
    return errs


def _compare_state(r_state, o_state):
    assert set(o_state) - set(r_state) == {"image_feature_fn"}
    assert set(r_state) <= set(o_state)
    for key in ("obj_ids", "first_ann_frame_idx", "tracking_has_started"):
        assert r_state[key] == o_state[key], key
    assert r_state["consolidated_frame_inds"] == o_state["consolidated_frame_inds"]
    assert r_state["frames_already_tracked"] == o_state["frames_already_tracked"]
    banks = [("all", r_state["output_dict"], o_state["output_dict"])]
    for idx, r_bank in r_state["output_dict_per_obj"].items():
        banks.append((f"obj {idx}", r_bank, o_state["output_dict_per_obj"][idx]))
    for tag, r_bank, o_bank in banks:
        for storage_key in ("cond_frame_outputs", "non_cond_frame_outputs"):
            assert sorted(r_bank[storage_key]) == sorted(o_bank[storage_key]), (tag, storage_key)
            for frame, r_out in r_bank[storage_key].items():
                o_out = o_bank[storage_key][frame]
                assert sorted(r_out) == sorted(o_out)
                r_mem, o_mem = r_out["maskmem_features"], o_out["maskmem_features"]
                assert (r_mem is None) == (o_mem is None)
                if r_mem is not None:
                    assert r_mem.dtype == torch.bfloat16 and o_mem.dtype == paddle.bfloat16
                    assert tuple(r_mem.shape) == tuple(o_mem.shape)
                    name = f"{tag} {storage_key} {frame}: memory"
                    # a binarised click mask can flip one pixel at float32 noise (see
                    # test_sam3_tracker): memory near it moves by up to ~1e-2 relative
                    r_np = r_mem.float().numpy()
                    scale = max(1.0, float(np.abs(r_np).max()))
                    o_np = o_mem.astype("float32").numpy()
                    assert_close(r_np, o_np, cos=0.9999, max_abs=1e-2 * scale, name=name)
                for key in ("pred_masks", "obj_ptr", "object_score_logits"):
                    assert tuple(r_out[key].shape) == tuple(o_out[key].shape), key


def test_two_objects_clicks_correction_reverse():
    """Objects 1 (a click) and 7 (a box and a click) on frame 0, forward propagation; a
    negative click for object 1 on frame 2 and a re-propagation; a reverse propagation from
    frame 2 (from the last frame, upstream's CPU run attends to bfloat16 memories alone and
    torch refuses the mixed-dtype matmul that CUDA autocast would take); object 7 removed."""
    ref, ours = _build_pair()
    r_state, o_state = _states(ref, ours)
    prompts = [
        dict(frame_idx=0, obj_id=1, points=[[0.3, 0.4]], labels=[1]),
        dict(frame_idx=0, obj_id=7, points=[[0.7, 0.6]], labels=[1], box=[0.5, 0.45, 0.9, 0.8]),
    ]
    report = []

    def add(p):
        r_kw = {k: (torch.tensor(v) if k in ("points", "box") else v) for k, v in p.items()}
        with tracker_cpu_patches():
            r = ref.add_new_points_or_box(r_state, **r_kw)
        o = ours.add_new_points_or_box(o_state, **p)
        assert r[0] == o[0] and list(r[1]) == list(o[1]) and r[2] is None and o[2] is None
        report.append(
            assert_masks_close(r[3], o[3], f"click frame {p['frame_idx']}, obj {p['obj_id']}")
        )

    for p in prompts:
        add(p)
    report += _propagate(ref, ours, r_state, o_state, "forward", start_frame_idx=0,
                         max_frame_num_to_track=None, reverse=False)  # fmt: skip
    _compare_state(r_state, o_state)

    add(dict(frame_idx=2, obj_id=1, points=[[0.6, 0.5]], labels=[0], clear_old_points=False))
    report += _propagate(ref, ours, r_state, o_state, "after correction", start_frame_idx=None,
                         max_frame_num_to_track=None, reverse=False)  # fmt: skip
    report += _propagate(ref, ours, r_state, o_state, "reverse", start_frame_idx=2,
                         max_frame_num_to_track=None, reverse=True)  # fmt: skip
    _compare_state(r_state, o_state)

    with tracker_cpu_patches():
        r_ids, r_frames = ref.remove_object(r_state, 7)
    o_ids, o_frames = ours.remove_object(o_state, 7)
    assert list(r_ids) == list(o_ids) == [1]
    assert [f for f, _ in r_frames] == [f for f, _ in o_frames]
    for (f, r), (_, o) in zip(r_frames, o_frames, strict=True):
        assert_masks_close(r, o, f"after removal, frame {f}")
    _compare_state(r_state, o_state)
    print(f"tracking predictor: max abs mask error {max(report):.2e}")

    ours.reset_state(o_state)
    assert o_state["obj_ids"] == [] and not o_state["output_dict"]["cond_frame_outputs"]


def test_mask_prompt_and_hole_filling():
    """A click for object 1 on frame 0 and a mask prompt (video resolution, with a hole and a
    speck) for object 3 on frame 1, the mask then replaced on frame 1 and propagated both
    ways, with ``fill_hole_area=40`` (upstream fills holes on the CPU with scikit-image)."""
    ref, ours = _build_pair(fill_hole_area=40)
    r_state, o_state = _states(ref, ours)
    mask = np.zeros((VIDEO_H, VIDEO_W), bool)
    mask[30:90, 40:110] = True
    mask[50:55, 60:66] = False  # a 30-pixel hole
    mask[5:8, 5:8] = True  # a 9-pixel speck
    with tracker_cpu_patches():
        r = ref.add_new_points_or_box(r_state, 0, 1, torch.tensor([[0.3, 0.4]]), [1])
    o = ours.add_new_points_or_box(o_state, 0, 1, [[0.3, 0.4]], [1])
    assert_masks_close(r[3], o[3], "click")
    for m in (mask, np.roll(mask, 4, axis=1)):
        with tracker_cpu_patches():
            r = ref.add_new_mask(r_state, 1, 3, torch.from_numpy(m))
        o = ours.add_new_mask(o_state, 1, 3, m)
        assert r[0] == o[0] == 1 and list(r[1]) == list(o[1]) == [1, 3] and o[2] is None
        assert_masks_close(r[3], o[3], "mask prompt")
        filled = o[3].numpy()[1, 0] > 0
        assert filled[52, 64 + 4] and not filled[6, 10], "hole filled and speck removed"
    _propagate(ref, ours, r_state, o_state, "forward", start_frame_idx=0,
               max_frame_num_to_track=None, reverse=False)  # fmt: skip
    _propagate(ref, ours, r_state, o_state, "reverse", start_frame_idx=1,
               max_frame_num_to_track=None, reverse=True)  # fmt: skip
    _compare_state(r_state, o_state)


def test_prompt_errors_name_the_problem():
    """Bad prompts are one-line errors raised before the object is registered."""
    import pytest

    _, ours = _build_pair()
    state = ours.init_state(VIDEO_H, VIDEO_W, NUM_FRAMES, image_feature_fn=lambda f: {})
    cases = [
        (dict(frame_idx=NUM_FRAMES, points=[[0.1, 0.1]], labels=[1]), IndexError, "out of range"),
        (dict(frame_idx=-1, points=[[0.1, 0.1]], labels=[1]), IndexError, "out of range"),
        (dict(frame_idx=0.5, points=[[0.1, 0.1]], labels=[1]), TypeError, "integer"),
        (dict(frame_idx=0, points=[[0.1, 0.1, 0.2]], labels=[1]), ValueError, "N x 2"),
        (dict(frame_idx=0, points=[[0.1, 0.1]], labels=[1, 0]), ValueError, "one per point"),
        (dict(frame_idx=0, points=[[0.1, 0.1]], labels=[5]), ValueError, "labels"),
        (dict(frame_idx=0, points=[[np.nan, 0.1]], labels=[1]), ValueError, "finite"),
        (dict(frame_idx=0, points=[[0.1, 0.1]]), ValueError, "together"),
        (dict(frame_idx=0), ValueError, "at least one"),
        (dict(frame_idx=0, box=[0.1, 0.2, 0.3]), ValueError, "4 numbers"),
        (dict(frame_idx=0, box=[0.5, 0.2, 0.3, 0.4]), ValueError, "x0 <= x1"),
        (dict(frame_idx=0, box=[0.1, 0.2, 0.3, 0.4], clear_old_points=False), ValueError, "box"),
    ]
    for kw, exc, words in cases:
        with pytest.raises(exc, match=words):
            ours.add_new_points_or_box(state, obj_id=1, **kw)
    with pytest.raises(ValueError, match="H x W"):
        ours.add_new_mask(state, 0, 1, np.zeros((2, 3, 4)))
    with pytest.raises(IndexError, match="out of range"):
        ours.add_new_mask(state, 9, 1, np.zeros((3, 4)))
    assert state["obj_ids"] == []
    with pytest.raises(RuntimeError, match="add points first"):
        next(ours.propagate_in_video(state))
    with pytest.raises(IndexError, match="start frame index 7"):
        next(ours.propagate_in_video(state, start_frame_idx=7))
    with pytest.raises(ValueError, match="max_frame_num_to_track"):
        next(ours.propagate_in_video(state, max_frame_num_to_track=-2))


def test_state_dict_matches_upstream():
    """The predictor adds no parameters: keys and shapes are upstream predictor's."""
    ref, ours = _build_pair()
    expected = {k: list(v.shape) for k, v in ref.state_dict().items() if not v.is_complex()}
    assert {k: list(v) for k, v in _torch_layout(ours).items()} == expected
