"""Parity of SAM 3's video tracker core (``Sam3TrackerBase``: SAM heads with object pointers,
memory encoder, memory-conditioned features, ``track_step``) against the official sam3 module,
over a few frames (a click on frame 0, propagation after), with the released configuration at
224 px (16 x 16 features) and perturbed weights; and its state-dict keys against the released
checkpoint's ``tracker.*`` rows."""

from __future__ import annotations

import ast

import paddle
import pytest

from paddle_sam.models.sam3 import memory as PM
from paddle_sam.models.sam3.memory_attention import build_tracker_memory_attention
from paddle_sam.models.sam3.model_misc import TransformerWrapper
from paddle_sam.models.sam3.position_encoding import PositionEmbeddingSine
from paddle_sam.models.sam3.sam3_tracker_base import (
    Sam3TrackerBase,
    get_1d_sine_pe,
    round_to_bfloat16,
    select_closest_cond_frames,
)
from tests.helpers.sam3_ref import (
    assert_close,
    fan_in_init_,
    import_sam3,
    perturb_module_,
    tracker_cpu_patches,
)
from tests.models.test_sam3_heads import load_from_torch, randn, t2p
from tests.models.test_sam3_memory import _torch_layout

torch, _ = import_sam3()

IMAGE, STRIDE = 224, 14
SIDE = IMAGE // STRIDE  # 16
NUM_FRAMES = 4
GAIN = 1.0
RELEASED = dict(
    num_maskmem=7,
    image_size=IMAGE,
    backbone_stride=STRIDE,
    multimask_output_in_sam=True,
    multimask_output_for_tracking=True,
    multimask_min_pt_num=0,
    multimask_max_pt_num=1,
    non_overlap_masks_for_mem_enc=False,
    max_cond_frames_in_attn=4,
    sam_mask_decoder_extra_args={
        "dynamic_multimask_via_stability": True,
        "dynamic_multimask_stability_delta": 0.05,
        "dynamic_multimask_stability_thresh": 0.98,
    },
)


def _maskmem(mod, pe_cls):
    """The released memory encoder, its mask resize scaled to 224 px (256 = 16 x 16)."""
    ds = mod.SimpleMaskDownSampler(
        kernel_size=3, stride=2, padding=1, interpol_size=[16 * SIDE, 16 * SIDE]
    )
    cx = mod.CXBlock(
        dim=256, kernel_size=7, padding=3, layer_scale_init_value=1e-6, use_dwconv=True
    )
    pe = pe_cls(num_pos_feats=64, normalize=True, scale=None, temperature=10000)
    return mod.SimpleMaskEncoder(
        out_dim=64,
        position_encoding=pe,
        mask_downsampler=ds,
        fuser=mod.SimpleFuser(layer=cx, num_layers=2),
    )


def _build_pair(obj_bias: float, **extra):
    from sam3 import model_builder as mb
    from sam3.model import memory as RM
    from sam3.model.position_encoding import PositionEmbeddingSine as RefPE
    from sam3.model.sam3_tracker_base import Sam3TrackerBase as RefTracker

    with tracker_cpu_patches():
        torch.manual_seed(0)
        ref = RefTracker(
            backbone=None,
            transformer=mb._create_tracker_transformer(),
            maskmem_backbone=_maskmem(RM, RefPE),
            **RELEASED,
            **extra,
        )
        perturb_module_(ref, seed=1, scale=0.05)
        fan_in_init_(ref.transformer.encoder, seed=3, gain=GAIN)
        with torch.no_grad():
            for name in ("no_mem_embed", "no_obj_ptr", "no_obj_embed_spatial", "maskmem_tpos_enc"):
                getattr(ref, name).normal_(0, 0.5)
            # object scores clearly away from 0, so that both sides take the same decisions
            ref.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.fill_(obj_bias)
    ref.eval()
    ours = Sam3TrackerBase(
        transformer=TransformerWrapper(build_tracker_memory_attention((SIDE, SIDE)), None, 256),
        maskmem_backbone=_maskmem(PM, PositionEmbeddingSine),
        **RELEASED,
        **extra,
    )
    load_from_torch(ours, ref, skip_complex=True)  # every key on both sides, same shapes
    ours.eval()
    return ref, ours


def _frame_inputs(ref, frame: int):
    """Both sides' (HW x B x C features, positions, sizes) of one frame: random second-neck
    maps with ``conv_s0``/``conv_s1`` applied to the high-res levels, as forward_image does."""
    fpn = [randn(1, 256, s, s, seed=100 * frame + s) for s in (4 * SIDE, 2 * SIDE, SIDE)]
    pos = [randn(1, 256, s, s, seed=100 * frame + s + 1) for s in (4 * SIDE, 2 * SIDE, SIDE)]
    with torch.no_grad():
        fpn[0] = ref.sam_mask_decoder.conv_s0(fpn[0])
        fpn[1] = ref.sam_mask_decoder.conv_s1(fpn[1])
        _, feats, pos_embeds, sizes = ref._prepare_backbone_features(
            {"backbone_fpn": fpn, "vision_pos_enc": pos}
        )
    return (feats, pos_embeds, sizes), ([t2p(f) for f in feats], [t2p(p) for p in pos_embeds])


def _rel(x, rel: float) -> float:
    return rel * max(1.0, float(x.detach().abs().max()))


def _compare_out(r: dict, o: dict, frame: int, mem_rel: float = 1e-4) -> dict[str, float]:
    errs = {}
    for key, rel in (
        ("object_score_logits", 1e-4),
        ("obj_ptr", 1e-4),
        ("pred_masks", 1e-4),
        ("pred_masks_high_res", 1e-4),
        ("maskmem_features", mem_rel),
    ):
        _, errs[key], _ = assert_close(
            r[key], o[key], max_abs=_rel(r[key], rel), name=f"frame {frame}: {key}"
        )
    assert_close(r["maskmem_pos_enc"][0], o["maskmem_pos_enc"][0], max_abs=1e-5, name="memory pos")
    return errs


def _run_video(ref, ours, click_frames=(0,), bf16=True, mem_rel=1e-4):
    """Frames 0..NUM_FRAMES-1: clicks (conditioning frames) on ``click_frames``, tracking
    elsewhere; memory-conditioned features compared before each track_step; outputs stored as
    upstream's predictor stores them (memory features in bfloat16)."""
    ref_bank = {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}
    our_bank = {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}
    report = []
    for frame in range(NUM_FRAMES):
        (rf, rp, sizes), (of, op) = _frame_inputs(ref, frame)
        is_cond = frame in click_frames
        rpts = opts = None
        if is_cond:
            xy = [[[60.0 + 30 * frame, 100.0]]]
            rpts = {"point_coords": torch.tensor(xy), "point_labels": torch.tensor([[1]]).int()}
            opts = {"point_coords": paddle.to_tensor(xy), "point_labels": paddle.to_tensor([[1]])}
        common = dict(frame_idx=frame, is_init_cond_frame=is_cond, num_frames=NUM_FRAMES)
        with tracker_cpu_patches(), torch.no_grad():
            r_mem = ref._prepare_memory_conditioned_features(
                current_vision_feats=rf[-1:],
                current_vision_pos_embeds=rp[-1:],
                feat_sizes=sizes[-1:],
                output_dict=ref_bank,
                **common,
            )
            r = ref.track_step(
                current_vision_feats=rf,
                current_vision_pos_embeds=rp,
                feat_sizes=sizes,
                image=None,
                point_inputs=rpts,
                mask_inputs=None,
                output_dict=ref_bank,
                **common,
            )
        with paddle.no_grad():
            o_mem = ours._prepare_memory_conditioned_features(
                current_vision_feats=of[-1:],
                current_vision_pos_embeds=op[-1:],
                feat_sizes=sizes[-1:],
                output_dict=our_bank,
                **common,
            )
            o = ours.track_step(
                current_vision_feats=of,
                current_vision_pos_embeds=op,
                feat_sizes=sizes,
                point_inputs=opts,
                mask_inputs=None,
                output_dict=our_bank,
                **common,
            )
        _, e_mem, _ = assert_close(
            r_mem, o_mem, max_abs=_rel(r_mem, mem_rel), name=f"frame {frame}: memory-conditioned"
        )
        # a click's memory encodes the binarised mask: where a logit is within float32 noise
        # of 0 the two sides may binarise one pixel differently (checked: 99.99 % agree),
        # which moves the memory features near it
        binary_rel = 1e-2 if is_cond and frame > 0 else 1e-4
        agree = float(
            (
                (r["pred_masks_high_res"] > 0).numpy() == (o["pred_masks_high_res"] > 0).numpy()
            ).mean()
        )
        assert agree >= 0.9999, f"frame {frame}: binary masks agree on {agree}"
        errs = _compare_out(r, o, frame, mem_rel=binary_rel)
        errs["pix_feat_with_mem"] = e_mem
        score = float(r["object_score_logits"].abs().min())
        assert score > 0.5, f"frame {frame}: object score {score} too close to 0"
        report.append(errs)
        key = "cond_frame_outputs" if is_cond else "non_cond_frame_outputs"
        if bf16:
            r = dict(r, maskmem_features=r["maskmem_features"].to(torch.bfloat16))
            o = dict(o, maskmem_features=round_to_bfloat16(o["maskmem_features"]))
        ref_bank[key][frame], our_bank[key][frame] = r, o
    return report


@pytest.mark.parametrize("obj_bias", [6.0, -6.0], ids=["present", "absent"])
def test_track_video(obj_bias):
    """Click on frame 0, then three tracked frames attending to 1-3 memories and pointers."""
    ref, ours = _build_pair(obj_bias)
    report = _run_video(ref, ours)
    worst = {k: max(e[k] for e in report) for k in report[0]}
    print(f"tracker ({'present' if obj_bias > 0 else 'absent'}): max abs errors {worst}")


def test_track_video_two_clicks_memory_selection():
    """Clicks on frames 0 and 2 (two conditioning frames), memory selection on."""
    ref, ours = _build_pair(6.0, use_memory_selection=True)
    _run_video(ref, ours, click_frames=(0, 2))


def test_forward_sam_heads_mask_input():
    """A mask prompt (resized with antialiasing) and a binary mask used as output."""
    ref, ours = _build_pair(6.0)
    (rf, _, sizes), (of, _) = _frame_inputs(ref, 0)
    r_map = rf[-1].permute(1, 2, 0).reshape(1, 256, SIDE, SIDE)
    r_hr = [f.permute(1, 2, 0).reshape(1, -1, *s) for f, s in zip(rf[:-1], sizes[:-1], strict=True)]
    o_map, o_hr = t2p(r_map), [t2p(h) for h in r_hr]
    logits = randn(1, 1, 100, 100, seed=5) * 4
    mask = randn(1, 1, IMAGE, IMAGE, seed=6) > 0.3
    with tracker_cpu_patches(), torch.no_grad():
        r1 = ref._forward_sam_heads(r_map, mask_inputs=logits, high_res_features=r_hr)
        r2 = ref._use_mask_as_output(r_map, r_hr, mask)
    o1 = ours._forward_sam_heads(o_map, mask_inputs=t2p(logits), high_res_features=o_hr)
    o2 = ours._use_mask_as_output(o_map, o_hr, t2p(mask))
    names = ("low_res_multimasks", "high_res_multimasks", "ious", "low", "high", "ptr", "score")
    for tag, rs, os_ in (("mask prompt", r1, o1), ("mask as output", r2, o2)):
        for name, a, b in zip(names, rs, os_, strict=True):
            assert_close(a, b, max_abs=_rel(a, 1e-4), name=f"{tag}: {name}")


def test_helpers():
    pos = torch.tensor([0.0, 1.0, 2.0, 5.0]) / 15
    from sam3.model.sam3_tracker_utils import get_1d_sine_pe as ref_pe
    from sam3.model.sam3_tracker_utils import select_closest_cond_frames as ref_select

    assert_close(ref_pe(pos, 256), get_1d_sine_pe(t2p(pos), 256), max_abs=1e-6, name="sine pe")
    outs = {t: f"out{t}" for t in (0, 3, 7, 9, 12, 20)}
    for frame in (5, 10, 25):
        for n in (-1, 2, 3, 4, 10):
            for keep in (False, True):
                assert select_closest_cond_frames(frame, outs, n, keep) == ref_select(
                    frame, outs, n, keep
                )
    x = randn(1000, seed=9) * 100
    assert (t2p(x.to(torch.bfloat16).float()) == round_to_bfloat16(t2p(x))).all()


def test_state_dict_keys_match_checkpoint(reference_dir):
    """The released configuration (1008 px): our keys and torch-layout shapes are the
    checkpoint's ``tracker.*`` rows (the whole tracker: it has no backbone)."""
    ours = Sam3TrackerBase(
        transformer=TransformerWrapper(build_tracker_memory_attention(), None, 256),
        maskmem_backbone=PM.build_tracker_maskmem_backbone(),
        **dict(RELEASED, image_size=1008),
    )
    rows = (reference_dir / "sam3_checkpoint_keys.tsv").read_text().splitlines()[1:]
    ckpt = {r.split("\t")[0]: ast.literal_eval(r.split("\t")[1]) for r in rows}
    expected = {k[len("tracker.") :]: v for k, v in ckpt.items() if k.startswith("tracker.")}
    assert _torch_layout(ours) == expected
