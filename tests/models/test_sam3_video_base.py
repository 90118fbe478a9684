"""SAM 3's dense video inference (``Sam3VideoBase``, the detector's per-frame video grounding)
against the official sam3 0.1.4 code, at a reduced size: a 112 px detector (2-block ViT, the
SAM 2 neck on, d_model 256 for the tracker's heads) and the tracker of the released settings,
the same perturbed weights on both sides (copied into ours with ``load_from_torch``), a
generated 5-frame video and a text prompt, score thresholds lowered so that random weights
give several detections.

Compared frame by frame: the detector's outputs and the tracker's backbone features
(``forward_video_grounding_multigpu``, ``run_backbone_and_detection``), then the whole step
(``_det_track_one_frame``: object ids, masks, scores, tracker scores, metadata, the tracker's
low-res mask logits). The association and hot-start logic is also fed identical synthetic
inputs on both sides.

Upstream's CUDA assumptions are patched inside the tests only: ``tracker_cpu_patches``, the
tracker's inference states kept on the CPU (``offload_state_to_cpu``), and the bfloat16 SAM 2
features that upstream's detector hands over (its all-gather cast, kept with one process)
cast back to float32 before the tracker's float32 convolutions (on a GPU, autocast runs them
in bfloat16; on the CPU upstream would stop with a dtype error; ours does the same cast), and
the CPU connected components given a batch of no mask (see ``reference_patches``).
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_sam.models.sam3.sam3_video_base import Sam3VideoBase
from tests.helpers.sam3_ref import assert_close, assert_masks_close, to_numpy
from tests.helpers.sam3_video import (
    NUM_FRAMES,
    VIDEO_H,
    VIDEO_W,
    inputs,
    make_models,
    make_parts,
    reference_patches,
    torch,
)


@pytest.fixture(scope="module")
def parts(bpe_path):
    """(reference detector, reference tracker, our detector, our tracker), same weights."""
    return make_parts(bpe_path)


# ---------------------------------------------------------------- detector on a video


def _text(det, batch, is_ref: bool):
    if is_ref:
        return det.backbone.forward_text(batch.find_text_batch, device="cpu")
    return det.backbone.forward_text(batch.find_text_batch)


@pytest.mark.parametrize("reverse", [False, True])
def test_video_grounding_matches_official(parts, reverse):
    """``forward_video_grounding_multigpu`` with NMS, frame by frame in either direction:
    the same outputs (NMS-suppressed logits included), the same bfloat16 SAM 2 features and
    the same buffer entries after each call (current frame kept, previous evicted, next
    computed ahead)."""
    ref_det, _, det, _ = parts
    (ref_batch, ref_prompt), (batch, prompt) = inputs()
    with reference_patches():
        ref_text = _text(ref_det, ref_batch, True)
    text = _text(det, batch, False)
    ref_buffer, buffer = {}, {}
    order = range(NUM_FRAMES - 1, -1, -1) if reverse else range(NUM_FRAMES)
    nms = dict(run_nms=True, nms_prob_thresh=0.5, nms_iou_thresh=0.5, track_in_reverse=reverse)
    num_suppressed = 0
    for t in order:
        with reference_patches():
            r, _ = ref_det.forward_video_grounding_multigpu(
                backbone_out={"img_batch_all_stages": ref_batch.img_batch, **ref_text},
                find_inputs=ref_batch.find_inputs,
                geometric_prompt=ref_prompt,
                frame_idx=t,
                num_frames=NUM_FRAMES,
                multigpu_buffer=ref_buffer,
                **nms,
            )
        o, _ = det.forward_video_grounding_multigpu(
            backbone_out={"img_batch_all_stages": batch.img_batch, **text},
            find_inputs=batch.find_inputs,
            geometric_prompt=prompt,
            frame_idx=t,
            num_frames=NUM_FRAMES,
            multigpu_buffer=buffer,
            **nms,
        )
        assert sorted(buffer) == sorted(ref_buffer), f"frame {t}"
        assert sorted(o) == sorted(r)
        suppressed = to_numpy(r["pred_logits"]) < -1e3
        np.testing.assert_array_equal(to_numpy(o["pred_logits"]) < -1e3, suppressed)
        num_suppressed += int(suppressed.sum())
        # 1e4 below: float32 spacing there is 2**-10, so those agree to 1e-3 only
        r_logits = to_numpy(r["pred_logits"]) + 1e4 * suppressed
        o_logits = to_numpy(o["pred_logits"]) + 1e4 * suppressed
        assert_close(r_logits, o_logits, max_abs=2e-3, name=f"{t} logits")
        assert_close(r_logits[~suppressed], o_logits[~suppressed], max_abs=5e-4, name=f"{t}")
        assert_close(r["pred_boxes"], o["pred_boxes"], max_abs=3e-4, name=f"{t} boxes")
        assert_close(r["pred_boxes_xyxy"], o["pred_boxes_xyxy"], max_abs=3e-4, name=f"{t} xyxy")
        # the mask head's balanced biases cancel most of its output: errors are those of the
        # ~5x larger terms (see balance_mask_head_), ~2e-4 of the logits' scale
        assert_masks_close(r["pred_masks"], o["pred_masks"], f"{t} masks", rel=1e-3)
        for i in range(3):
            key = f"tracker_backbone_fpn_{i}"
            assert o[key].dtype == paddle.bfloat16
            # bfloat16 values: one unit in the last place (2**-8 relative) at most
            ours = o[key].astype("float32").numpy()
            assert_close(r[key], ours, max_abs=2**-7 * float(np.abs(ours).max()), name=key)
        for a, b in zip(r["tracker_backbone_pos_enc"], o["tracker_backbone_pos_enc"], strict=True):
            assert_close(a, b, max_abs=1e-5, name="pos enc")
    assert num_suppressed > 0  # NMS removed some detections


def test_backbone_and_detection_matches_official(parts):
    """``run_backbone_and_detection``: the same detections (boxes, masks, scores) above the
    threshold after NMS, the same cache entries and tracker features per frame; with
    ``allow_new_detections=False`` nothing is detected."""
    ref, ours = make_models(parts, score_threshold_detection=0.5, det_nms_thresh=0.5)
    (ref_batch, ref_prompt), (batch, prompt) = inputs()
    ref_cache, cache = {}, {}
    counts = []
    for t in range(NUM_FRAMES):
        kw = dict(frame_idx=t, num_frames=NUM_FRAMES, reverse=False, allow_new_detections=t != 3)
        with reference_patches():
            r = ref.run_backbone_and_detection(
                input_batch=ref_batch, geometric_prompt=ref_prompt, feature_cache=ref_cache, **kw
            )
        o = ours.run_backbone_and_detection(
            input_batch=batch, geometric_prompt=prompt, feature_cache=cache, **kw
        )
        counts.append(len(r["scores"]))
        assert len(o["scores"]) == counts[-1]
        assert_close(r["scores"], o["scores"], max_abs=1e-4, name=f"{t} scores")
        assert_close(r["bbox"], o["bbox"], max_abs=3e-4, name=f"{t} boxes")
        assert o["mask"].shape == list(r["mask"].shape) and o["bbox"].shape == [counts[-1], 4]
        if counts[-1]:
            assert_masks_close(r["mask"][:, None], o["mask"].unsqueeze(1), f"{t} masks", rel=1e-3)
        assert sorted(map(str, cache)) == sorted(map(str, ref_cache))
        r_feats = ref_cache[t][1]["tracker_backbone_out"]
        o_feats = cache[t][1]["tracker_backbone_out"]
        # from bfloat16 inputs, where float32 noise may flip a rounding by one unit (2**-8)
        for a, b in zip(r_feats["backbone_fpn"], o_feats["backbone_fpn"], strict=True):
            tol = 2**-7 * float(b.abs().max())
            assert_close(a, b, cos=0.9999, max_abs=tol, name=f"{t} tracker features")
        assert o_feats["vision_features"] is o_feats["backbone_fpn"][-1]
        np.testing.assert_array_equal(ref_cache[t][0].numpy(), cache[t][0].numpy())
    assert counts[3] == 0 and min(counts[:3] + counts[4:]) >= 1 and sum(counts) >= 8, counts


# ---------------------------------------------------------------- the whole frame step


def _plain(x):
    """Metadata values as plain Python / NumPy, for comparison across the two sides."""
    if isinstance(x, dict):
        return {_key(_plain(k)): _plain(v) for k, v in x.items()}
    if isinstance(x, (set, frozenset)):
        return sorted(_plain(v) for v in x)
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "numpy"):
        return _plain(x.detach().numpy() if hasattr(x, "detach") else x.numpy())
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    return x


def _key(k):
    return tuple(k) if isinstance(k, list) else k


def _close_scores(r: dict, o: dict, name: str) -> None:
    r, o = _plain(r), _plain(o)
    assert list(r) == list(o), f"{name}: {list(r)} vs {list(o)}"
    np.testing.assert_allclose(list(o.values()), list(r.values()), atol=1e-4, err_msg=name)


def _tracker_masks_close(r_state, o_state, key: str, frame_idx: int, name: str):
    """The tracker's low-res mask logits of a frame, both sides; returns the max abs error
    and whether prompt pixels flipped.

    The tracker reads bfloat16 features, where float32 noise flips some roundings by a unit
    (2**-8): its outputs agree to ~5e-4 of their scale, not 1e-5. On a frame where masklets
    were (re)started from detections, the mask prompts are detector logits binarized: a logit
    within float noise of 0 may flip a prompt pixel (at most 0.1 %), which moves the logits
    near it (the prompt is encoded at +-1024) and the memory encoded there, but flips no
    predicted pixel. Prompts of one object clear the others' under them, so a flip moves the
    logits of every object there: each logit off by more than the noise must lie within 1.5
    low-res pixels of a flipped prompt pixel of some object, however many there are."""
    r = to_numpy(r_state["output_dict"][key][frame_idx]["pred_masks"])
    o = to_numpy(o_state["output_dict"][key][frame_idx]["pred_masks"])
    flips, total = [], 0
    for obj_idx, r_inputs in r_state["mask_inputs_per_obj"].items():
        if frame_idx in r_inputs:
            a = to_numpy(r_inputs[frame_idx])
            b = to_numpy(o_state["mask_inputs_per_obj"][obj_idx][frame_idx])
            h, w = a.shape[-2:]
            flips.append(np.argwhere((a != b).reshape(h, w)))
            total += a.size
    flips = np.concatenate(flips) if flips else np.zeros((0, 2), int)
    assert len(flips) <= 1e-3 * max(total, 1), f"{name}: {len(flips)} prompt pixels"
    if len(flips) == 0:
        return assert_masks_close(r, o, name, rel=2e-3), False
    tol = 2e-3 * max(1.0, float(np.abs(r).max()))
    off = np.abs(r - o) > tol
    low_h, low_w = r.shape[-2:]
    centres = (flips + 0.5) * np.array([low_h / h, low_w / w])  # flips in low-res pixels
    for i, j in {tuple(p) for p in np.argwhere(off)[:, -2:]}:
        near = np.abs(centres - (i + 0.5, j + 0.5)).max(axis=1).min()
        assert near <= 1.5, f"{name}: logit ({i}, {j}) differs {near:.1f} px from any flip"
    assert ((r > 0) != (o > 0)).mean() <= 1e-3, f"{name}: binary masks differ"
    return float(np.abs(r - o)[~off].max()), True


def compare_step(r, o, r_states, o_states, frame_idx: int) -> float:
    """Everything ``_det_track_one_frame`` returned on a frame, and the inference states'
    current outputs; returns the max abs error of the tracker's mask logits."""
    name = f"frame {frame_idx}"
    r_masks, r_scores, _, r_meta, r_stats, r_trk = r
    o_masks, o_scores, _, o_meta, o_stats, o_trk = o
    assert _plain(list(o_masks)) == _plain(list(r_masks)), name
    for k in r_masks:
        a, b = r_masks[k].numpy(), o_masks[k].numpy()
        assert a.shape == b.shape == (1, VIDEO_H, VIDEO_W) and b.dtype == bool
        assert (a != b).mean() <= 1e-3, f"{name} object {k}: masks differ on {(a != b).mean()}"
    _close_scores(r_scores, o_scores, name + " scores")
    assert _plain(o_stats) == _plain(r_stats)
    if isinstance(r_trk, list):
        np.testing.assert_allclose(o_trk, r_trk, atol=1e-4, err_msg=name)
    else:
        assert r_trk.shape[0] == o_trk.shape[0] == 0
    for key in ("obj_ids_per_gpu", "obj_ids_all_gpu", "num_obj_per_gpu", "max_obj_id"):
        assert _plain(o_meta[key]) == _plain(r_meta[key]), f"{name}: {key}"
    assert _plain(o_meta["obj_id_to_last_occluded"]) == _plain(r_meta["obj_id_to_last_occluded"])
    r_fw, o_fw = (
        r_meta["obj_id_to_tracker_score_frame_wise"],
        o_meta["obj_id_to_tracker_score_frame_wise"],
    )
    assert list(r_fw) == list(o_fw)
    for t in r_fw:
        _close_scores(r_fw[t], o_fw[t], f"{name}: tracker scores of frame {t}")
    assert _plain(o_meta["rank0_metadata"]) == _plain(r_meta["rank0_metadata"]), name
    # the inference states: objects, and this frame's outputs (masks, memories)
    assert [_plain(s["obj_ids"]) for s in o_states] == [_plain(s["obj_ids"]) for s in r_states]
    err = 0.0
    for rs, os_ in zip(r_states, o_states, strict=True):
        for key in ("cond_frame_outputs", "non_cond_frame_outputs"):
            ro, oo = rs["output_dict"][key].get(frame_idx), os_["output_dict"][key].get(frame_idx)
            assert (ro is None) == (oo is None), f"{name}: {key}"
            if ro is None:
                continue
            masks_err, flipped = _tracker_masks_close(rs, os_, key, frame_idx, name)
            err = max(err, masks_err)
            assert_close(ro["object_score_logits"], oo["object_score_logits"], max_abs=1e-3)
            rm = ro["maskmem_features"].float().numpy()
            om = oo["maskmem_features"].astype("float32").numpy()
            # bfloat16 memories: a few units (2**-8) of their scale; more near a flipped prompt
            tol = (2**-3 if flipped else 2**-6) * float(np.abs(rm).max())
            assert_close(rm, om, cos=0.9999, max_abs=tol, name=name + " memory")
    return err


def inject_tracker_masks(model, frames, is_ref: bool, num: int = 2) -> None:
    """Random weights never make a detection match a masklet closely (IoU >= 0.8, what
    reconditioning needs): on ``frames``, the first ``num`` propagated masklets are appended
    to the detections (score 0.9, a small box far from the masklets' boxes) before the
    planning phase, on both sides alike."""
    planning = model.run_tracker_update_planning_phase

    def run_tracker_update_planning_phase(**kw):
        trk = kw["tracker_low_res_masks_global"][:num]
        if kw["frame_idx"] in frames and trk.shape[0] > 0:
            det_out, n = kw["det_out"], trk.shape[0]
            if is_ref:
                det_out["mask"] = torch.cat([det_out["mask"], trk.clone()])
                det_out["scores"] = torch.cat([det_out["scores"], torch.full((n,), 0.9)])
                box = torch.tensor([[0.45, 0.45, 0.55, 0.55]]).expand(n, 4)
                det_out["bbox"] = torch.cat([det_out["bbox"], box])
            else:
                det_out["mask"] = paddle.concat([det_out["mask"], trk.clone()])
                det_out["scores"] = paddle.concat([det_out["scores"], paddle.full([n], 0.9)])
                box = paddle.to_tensor([[0.45, 0.45, 0.55, 0.55]]).expand([n, 4])
                det_out["bbox"] = paddle.concat([det_out["bbox"], box])
        return planning(**kw)

    model.run_tracker_update_planning_phase = run_tracker_update_planning_phase


THRESHOLDS = dict(
    score_threshold_detection=0.5,
    det_nms_thresh=0.8,
    new_det_thresh=0.6,
    trk_assoc_iou_thresh=0.3,
)
SCENARIOS = {
    # upstream's released heuristics, hot-start shortened to the 5 frames
    "released": dict(
        THRESHOLDS, hotstart_delay=3, hotstart_unmatch_thresh=2, hotstart_dup_thresh=2
    ),
    # every optional heuristic on (suppress_det_close_to_boundary aside: the random boxes
    # hug the image's edge, it would drop them all; see test_small_helpers_match_official),
    # with reconditioning detections injected on frames 1-3
    "all heuristics": dict(
        THRESHOLDS,
        hotstart_delay=2,
        hotstart_unmatch_thresh=1,
        hotstart_dup_thresh=2,
        suppress_unmatched_only_within_hotstart=False,
        init_trk_keep_alive=1,
        max_trk_keep_alive=2,
        min_trk_keep_alive=-1,
        suppress_overlapping_based_on_recent_occlusion_threshold=0.3,
        decrease_trk_keep_alive_for_empty_masklets=True,
        o2o_matching_masklets_enable=True,
        max_num_objects=4,
        recondition_every_nth_frame=2,
        masklet_confirmation_enable=True,
        masklet_confirmation_consecutive_det_thresh=2,
        reconstruction_bbox_iou_thresh=0.5,
        reconstruction_bbox_det_score=0.5,
        _inject=(1, 2, 3),
    ),
    # tracking backwards from the last frame, no new detections on frame 2; strict matching:
    # masklets go unmatched and are removed (hot-start); keep-alive suppression, which these
    # videos do not reach, is in test_hotstart_and_confirmation_match_official
    "reverse": dict(
        THRESHOLDS,
        assoc_iou_thresh=0.5,
        trk_assoc_iou_thresh=0.5,
        hotstart_delay=2,
        hotstart_unmatch_thresh=1,
        hotstart_dup_thresh=2,
        suppress_unmatched_only_within_hotstart=False,
        init_trk_keep_alive=1,
        _reverse=True,
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_det_track_one_frame_matches_official(parts, scenario):
    """``_det_track_one_frame`` over the video, both sides with their own states: every
    output and state compared on every frame (``compare_step``)."""
    settings = dict(SCENARIOS[scenario])
    reverse = settings.pop("_reverse", False)
    inject = settings.pop("_inject", ())
    ref, ours = make_models(parts, **settings)
    reconditioned = []
    if inject:
        inject_tracker_masks(ref, inject, is_ref=True)
        inject_tracker_masks(ours, inject, is_ref=False)
        recondition = ours._recondition_masklets
        ours._recondition_masklets = lambda *a: reconditioned.append(a[0]) or recondition(*a)
    (ref_batch, ref_prompt), (batch, prompt) = inputs()
    r_states, r_meta, r_cache = [], {}, {}
    o_states, o_meta, o_cache = [], {}, {}
    order = range(NUM_FRAMES - 1, -1, -1) if reverse else range(NUM_FRAMES)
    errs, seen = [], set()
    for t in order:
        kw = dict(
            frame_idx=t,
            num_frames=NUM_FRAMES,
            reverse=reverse,
            orig_vid_height=VIDEO_H,
            orig_vid_width=VIDEO_W,
            allow_new_detections=not (reverse and t == 2),
        )
        with reference_patches():
            r = ref._det_track_one_frame(
                input_batch=ref_batch,
                geometric_prompt=ref_prompt,
                tracker_states_local=r_states,
                tracker_metadata_prev=r_meta,
                feature_cache=r_cache,
                **kw,
            )
        o = ours._det_track_one_frame(
            input_batch=batch,
            geometric_prompt=prompt,
            tracker_states_local=o_states,
            tracker_metadata_prev=o_meta,
            feature_cache=o_cache,
            **kw,
        )
        r_states, r_meta, o_states, o_meta = r[2], r[3], o[2], o[3]
        errs.append(compare_step(r, o, r_states, o_states, t))
        seen.update(_plain(list(o[0])))
    rank0 = o_meta["rank0_metadata"]
    print(
        f"{scenario}: objects {sorted(seen)}, removed {_plain(rank0['removed_obj_ids'])}, "
        f"max abs tracker mask logit error {max(errs):.2e}"
    )
    assert len(seen) >= 3 and rank0["removed_obj_ids"]
    assert bool(reconditioned) == bool(inject), reconditioned


# ---------------------------------------------------------------- the logic, synthetic inputs


def logic_models(**settings):
    """Both video bases without detector or tracker (the pure-logic methods need neither)."""
    from sam3.model.sam3_video_base import Sam3VideoBase as RefBase

    ref = RefBase(detector=torch.nn.Identity(), tracker=torch.nn.Identity(), **settings)
    return ref, Sam3VideoBase(paddle.nn.Identity(), paddle.nn.Identity(), **settings)


def blob_logits(rng, n: int, size: int, centres=None) -> np.ndarray:
    """``n`` float32 mask logits ``size x size``: discs of random centres and radii plus noise
    (no ties at 0)."""
    yy, xx = np.mgrid[:size, :size] / size
    if centres is None:
        centres = rng.uniform(0.2, 0.8, (n, 3))
    out = []
    for cy, cx, r in centres:
        out.append(0.08 + 0.1 * r - np.hypot(yy - cy, xx - cx) + rng.normal(0, 0.02, yy.shape))
    return np.stack(out).astype(np.float32) * 10


@pytest.mark.parametrize("o2o", [False, True])
@pytest.mark.parametrize("trk_size", [32, 24, 40])
def test_associate_det_trk_matches_official(o2o, trk_size):
    """``_associate_det_trk`` on the same detections and masklets (partly the same objects,
    one masklet empty, the sizes equal or not): the same new detections, matches,
    unmatched and empty masklets, confident matches; also with no detection or no masklet."""
    ref, ours = logic_models(
        assoc_iou_thresh=0.3,
        trk_assoc_iou_thresh=0.5,
        new_det_thresh=0.4,
        o2o_matching_masklets_enable=o2o,
    )
    rng = np.random.default_rng(trk_size + o2o)
    grid = np.array([(y, x) for y in (0.2, 0.5, 0.8) for x in (0.2, 0.5, 0.8)])
    centres = np.concatenate([grid[rng.permutation(9)[:8]], rng.random((8, 1))], axis=1)
    det = blob_logits(rng, 6, 32, centres[:6])
    # masklets: two of the same object, one no detection matches, one empty, one of det 0
    trk = blob_logits(rng, 6, trk_size, centres[[1, 2, 2, 7, 6, 0]])
    trk[4] = -np.abs(trk[4]) - 1  # an empty masklet
    if trk_size == 32:
        trk[5] = det[0]  # the same mask: a confident match (IoU 1, score >= 0.8)
    scores = np.array([0.9, 0.85, 0.3, 0.95, 0.5, 0.7], np.float32)
    obj_ids = np.array([3, 5, 8, 9, 11, 12], np.int64)
    results = []
    for d, t in [(det, trk), (det[:0], trk), (det, trk[:0])]:
        r = ref._associate_det_trk(
            torch.from_numpy(d), scores[: len(d)], torch.from_numpy(t), obj_ids[: len(t)]
        )
        o = ours._associate_det_trk(
            paddle.to_tensor(d), scores[: len(d)], paddle.to_tensor(t), obj_ids[: len(t)]
        )
        assert _plain(o) == _plain(r), (len(d), len(t))
        assert all(isinstance(x, np.ndarray) for x in (o[0], o[1], o[4]))
        results.append(o)
    new, unmatched, matched, confident, empty = results[0]
    assert len(new) and len(unmatched) and any(len(v) for v in matched.values())
    assert list(empty) == [11] and (trk_size != 32 or confident.get(12) == 0)


@pytest.mark.parametrize("reverse", [False, True])
def test_occlusion_suppression_matches_official(reverse):
    """``_suppress_overlapping_based_on_recent_occlusion``: of overlapping masklets the one
    occluded most recently (or removed by hot-start) is set to -10 in place; the last
    occluded frames are recorded (occluded and suppressed ones get this frame)."""
    ref, ours = logic_models(suppress_overlapping_based_on_recent_occlusion_threshold=0.5)
    rng = np.random.default_rng(1)
    c = np.array([[0.5, 0.5, 0.5], [0.3, 0.3, 0.4], [0.7, 0.6, 0.3]])
    masks = blob_logits(rng, 6, 32, c[[0, 0, 1, 1, 2, 2]])
    masks[5] = -np.abs(masks[5]) - 1  # occluded on this frame
    obj_ids = np.array([1, 2, 4, 6, 7, 9], np.int64)
    last = {1: 3, 2: 1, 6: 2, 9: 0}  # 4, 7: never occluded
    removed = {7}
    r_prev = {
        "obj_ids_all_gpu": obj_ids,
        "obj_id_to_last_occluded": {k: torch.tensor([v]) for k, v in last.items()},
    }
    o_prev = {
        "obj_ids_all_gpu": obj_ids,
        "obj_id_to_last_occluded": {k: paddle.to_tensor([v]) for k, v in last.items()},
    }
    r_new, o_new = {}, {}
    r_masks, o_masks = torch.from_numpy(masks.copy()), paddle.to_tensor(masks)
    r = ref._suppress_overlapping_based_on_recent_occlusion(
        5, r_masks, r_prev, r_new, removed, reverse
    )
    o = ours._suppress_overlapping_based_on_recent_occlusion(
        5, o_masks, o_prev, o_new, removed, reverse
    )
    assert r is r_masks and o is o_masks  # in place, as upstream
    np.testing.assert_array_equal(o.numpy(), r.numpy())
    assert (r.numpy() == -10).all(axis=(1, 2)).any()  # something was suppressed
    assert _plain(o_new) == _plain(r_new)


@pytest.mark.parametrize("reverse", [False, True])
def test_hotstart_and_confirmation_match_official(reverse):
    """``_process_hotstart`` and ``update_masklet_confirmation_status`` over a sequence of
    frames with the same random matches, new and unmatched objects on both sides: the same
    removals, suppressions, keep-alive counters and confirmation statuses."""
    settings = dict(
        hotstart_delay=3,
        hotstart_unmatch_thresh=2,
        hotstart_dup_thresh=2,
        suppress_unmatched_only_within_hotstart=False,
        decrease_trk_keep_alive_for_empty_masklets=True,
        init_trk_keep_alive=1,
        min_trk_keep_alive=-1,
        max_trk_keep_alive=3,
        masklet_confirmation_enable=True,
        masklet_confirmation_consecutive_det_thresh=2,
    )
    ref, ours = logic_models(**settings)
    r_meta, o_meta = ref._initialize_metadata(), ours._initialize_metadata()
    assert _plain(o_meta) == _plain(r_meta)
    rng = np.random.default_rng(7)
    obj_ids, next_id, removed_total = np.array([], np.int64), 0, set()
    order = range(9, -1, -1) if reverse else range(10)
    for frame_idx in order:
        new_ids = next_id + np.arange(rng.integers(0, 3))
        next_id += len(new_ids)
        alive = obj_ids[~np.isin(obj_ids, list(removed_total))]
        matched = {d: rng.choice(alive, rng.integers(0, 3)) for d in range(2)} if len(alive) else {}
        rest = alive[~np.isin(alive, np.concatenate([*matched.values(), new_ids]))]
        unmatched, empty = rest[rng.random(len(rest)) < 0.6], rest[rng.random(len(rest)) < 0.3]
        outs = []
        for model, meta in ((ref, r_meta), (ours, o_meta)):
            removed, meta["rank0_metadata"] = model._process_hotstart(
                frame_idx=frame_idx,
                num_frames=10,
                reverse=reverse,
                det_to_matched_trk_obj_ids=matched,
                new_det_obj_ids=new_ids,
                empty_trk_obj_ids=empty,
                unmatched_trk_obj_ids=unmatched,
                rank0_metadata=meta["rank0_metadata"],
                tracker_metadata=meta,
            )
            updated = np.concatenate([alive, new_ids])
            updated = updated[~np.isin(updated, list(removed))]
            model.update_masklet_confirmation_status(
                meta["rank0_metadata"], alive, updated, matched, new_ids
            )
            outs.append((removed, updated))
        assert _plain(outs[1]) == _plain(outs[0]), frame_idx
        assert _plain(o_meta["rank0_metadata"]) == _plain(r_meta["rank0_metadata"]), frame_idx
        removed_total |= outs[0][0]
        obj_ids = np.concatenate([obj_ids, new_ids])
        keep = ~np.isin(obj_ids, list(removed_total))
        obj_ids = obj_ids[keep]
    rank0 = o_meta["rank0_metadata"]
    assert rank0["removed_obj_ids"] and any(rank0["suppressed_obj_ids"].values())
    statuses = rank0["masklet_confirmation"]["status"]
    assert (statuses == 2).any() and (statuses == 1).any()


def test_small_helpers_match_official():
    """``_drop_new_det_with_obj_limit``, ``_suppress_detections_close_to_boundary`` and
    ``_assign_new_det_to_gpus`` on the same inputs."""
    ref, ours = logic_models()
    rng = np.random.default_rng(3)
    scores = rng.random(10).astype(np.float32)
    inds = np.array([1, 4, 5, 7, 9], np.int64)
    for keep in (0, 2, 5):
        np.testing.assert_array_equal(
            ours._drop_new_det_with_obj_limit(inds, scores, keep),
            ref._drop_new_det_with_obj_limit(inds, scores, keep),
        )
    boxes = np.sort(rng.uniform(-0.05, 1.05, (20, 2, 2)), axis=1).transpose(0, 2, 1)
    boxes = boxes.reshape(20, 4)[:, [0, 2, 1, 3]].astype(np.float32)
    r = ref._suppress_detections_close_to_boundary(torch.from_numpy(boxes), margin=0.1)
    o = ours._suppress_detections_close_to_boundary(paddle.to_tensor(boxes), margin=0.1)
    np.testing.assert_array_equal(o.numpy(), r.numpy())
    assert 0 < r.sum() < 20
    load = np.array([0], np.int64)
    np.testing.assert_array_equal(
        ours._assign_new_det_to_gpus(3, load), ref._assign_new_det_to_gpus(3, load)
    )
