"""SAM 2's video tracker trained on synthetic clips (``family: sam2`` configs): the clip
generator and its files, the config checks, the loss (every frame supervised, gradients
through the memories), and a whole ``paddle-sam train`` run whose model the video predictor
loads."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import cv2
import numpy as np
import paddle
import pytest

from paddle_sam.cli import main
from paddle_sam.train.clips import inside_point, read_clip_truth, synthetic_clip, write_clip
from paddle_sam.train.config import ConfigError
from paddle_sam.train.families import load_config
from tests.helpers.train_runs import write_yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "sam2_tiny_clips.yaml"

# a SAM 2.1 small enough for a test step in a second
TINY = {
    "encoder_embed_dim": 8,
    "encoder_num_heads": 1,
    "encoder_stages": [1, 1, 1, 1],
    "encoder_global_attn_indexes": [2],
    "encoder_window_spec": [4, 2, 2, 2],
    "encoder_window_pos_embed_size": [2, 2],
    "image_size": 64,
    "d_model": 32,
    "sam_mlp_dim": 64,
    "memory_attention_layers": 1,
    "memory_attention_dim_feedforward": 64,
    "mem_dim": 16,
}


def tiny_config(out: Path, **sections) -> dict:
    cfg = {
        "family": "sam2",
        "model": {"spec": TINY, "tied_qk_init": True},
        "data": {
            "train": {"seed": 1, "num_frames": 3, "sizes": [[64, 64], [80, 60]]},
            "val": {"seed": 2, "num_frames": 3, "sizes": [[80, 60]]},
            "max_objects": 2,
            "min_area": 16,
            "eval_clips": 2,
        },
        "prompts": {"correction_prob": 0.5},
        "optim": {"lr": 1e-3, "warmup_steps": 1},
        "train": {"steps": 3, "log_every": 1, "checkpoint_every": 2, "seed": 3},
        "run": {"output_dir": str(out / "run"), "model_name": "sam2_test"},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


# -- clips ---------------------------------------------------------------------------------


def test_clips_are_reproducible_moving_and_occluding():
    a = synthetic_clip(3, 5, 96, 72, 6)
    b = synthetic_clip(3, 5, 96, 72, 6)
    assert a.frames.shape == (6, 72, 96, 3) and a.frames.dtype == np.uint8
    np.testing.assert_array_equal(a.frames, b.frames)
    np.testing.assert_array_equal(a.masks, b.masks)
    assert not np.array_equal(a.frames, synthetic_clip(3, 6, 96, 72, 6).frames)
    # the visible masks of a frame never overlap
    assert (a.masks.sum(axis=1) <= 1).all()
    moved = occluded = 0
    for seed in range(6):
        clip = synthetic_clip(seed, 0, 128, 96, 8)
        for i in range(clip.masks.shape[1]):
            m = clip.masks[:, i]
            seen = [t for t in range(8) if m[t].any()]
            if len(seen) >= 2:
                c0 = np.argwhere(m[seen[0]]).mean(0)
                c1 = np.argwhere(m[seen[-1]]).mean(0)
                moved += np.abs(c1 - c0).max() > 2
            areas = m.reshape(8, -1).sum(1)
            occluded += bool(areas.max() > areas.min())
    assert moved >= 6 and occluded >= 3


def test_clip_files_round_trip(tmp_path):
    clip = synthetic_clip(0, 1, 96, 64, 5)
    path = write_clip(clip, tmp_path / "c.mp4", fps=10)
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    assert len(frames) == 5 and frames[0].shape == (64, 96, 3)
    # lossy codec: close to the clip, not equal
    assert np.abs(frames[2][..., ::-1].astype(int) - clip.frames[2]).mean() < 12
    truth = read_clip_truth(path)
    assert [o["kind"] for o in truth["objects"]] == clip.kinds
    for i, obj in enumerate(truth["objects"]):
        np.testing.assert_array_equal(obj["masks"], clip.masks[:, i])
        if obj["point"] is not None:
            x, y = obj["point"]
            assert clip.masks[0, i, y, x]
    with pytest.raises(FileExistsError, match="c.mp4 exists"):
        write_clip(clip, path)


def test_inside_point_is_far_from_the_edge():
    mask = np.zeros((40, 60), bool)
    mask[10:30, 5:55] = True
    x, y = inside_point(mask)
    assert mask[y - 9 : y + 10, x - 9 : x + 10].all()  # 9 px from the edge every way


# -- config --------------------------------------------------------------------------------


def test_recipe_and_config_errors(tmp_path):
    cfg = load_config(RECIPE)
    assert cfg.family == "sam2" and cfg.model.spec["d_model"] == 128
    bad = {
        "prompts.box_prob=0.8": "point_prob \\+ box_prob must be <= 1",
        "data.train.num_frames=0": "data.train.num_frames",
        "data.val.num_frames=1": "data.val.num_frames",
        "train.batch_size=2": "train.grad_accum",
        "model.type=sam2.1_hiera_huge": "model.type",
        "model.spec.mem_dim=48": "mem_dim must divide",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            load_config(RECIPE, [override])
    with pytest.raises(ConfigError, match="unknown"):
        load_config(write_yaml(tmp_path / "x.yaml", {"family": "sam2", "prompt": {}}))


# -- the loss ------------------------------------------------------------------------------


def test_every_frame_is_supervised_through_the_memories(tmp_path):
    """One clip's loss: finite, IoU statistics in [0, 1], and gradients reach the memory
    attention and the memory encoder (they only act on tracked frames) and the object-score
    head; the decoder starts with tied query and key projections."""
    from paddle_sam.models.sam2.build_sam import build_sam2_model
    from paddle_sam.models.sam_v1.transformer import Attention
    from paddle_sam.train.sam2.config import model_spec
    from paddle_sam.train.sam2.trainer import Sam2Trainer, clip_loss

    cfg = load_config(write_yaml(tmp_path / "c.yaml", tiny_config(tmp_path)))
    trainer = Sam2Trainer(cfg, progress=False)
    model = trainer.model
    tied = [a for _, a in model.sam_mask_decoder.named_sublayers() if isinstance(a, Attention)]
    assert tied and all(
        np.array_equal(a.k_proj.weight.numpy(), a.q_proj.weight.numpy()) for a in tied
    )
    fresh = build_sam2_model(model_spec(cfg.model)).sam_mask_decoder.transformer.layers[0]
    assert not np.array_equal(
        fresh.self_attn.q_proj.weight.numpy(), fresh.self_attn.k_proj.weight.numpy()
    )
    rng = np.random.default_rng(0)
    clip = synthetic_clip(1, 0, 64, 64, 4)
    loss, stats = clip_loss(model, clip, rng, cfg)
    assert math.isfinite(float(loss))
    assert 0 <= stats["train_iou_first"] <= 1 and 0 <= stats["train_iou_track"] <= 1
    loss.backward()

    def grad_norm(layer) -> float:
        grads = [p.grad for p in layer.parameters() if p.grad is not None]
        return float(sum(paddle.abs(g).sum() for g in grads)) if grads else 0.0

    assert grad_norm(model.memory_attention) > 0
    assert grad_norm(model.memory_encoder) > 0
    assert grad_norm(model.sam_mask_decoder.pred_obj_score_head) > 0


def test_one_frame_clips_train_the_prompted_frame(tmp_path):
    """A prompted-frame stage (clips of one frame, even with corrections asked for): a finite
    loss, the prompted frame's IoU and no tracked frame."""
    from paddle_sam.train.sam2.trainer import Sam2Trainer, clip_loss

    cfg = load_config(
        write_yaml(tmp_path / "c.yaml", tiny_config(tmp_path, prompts={"correction_prob": 1.0}))
    )
    model = Sam2Trainer(cfg, progress=False).model
    clip = synthetic_clip(1, 0, 64, 64, 1)
    loss, stats = clip_loss(model, clip, np.random.default_rng(0), cfg)
    assert math.isfinite(float(loss)) and float(loss) > 0
    assert 0 <= stats["train_iou_first"] <= 1
    assert stats["train_iou_track"] == 0.0


def _tiny_sam_v1_teacher(path: Path, prompt_embed_dim: int = 32) -> Path:
    """A random SAM v1 of the tiny SAM 2's input size (64 px, a 4 x 4 embedding), saved with
    its sidecar as ``paddle-sam train`` saves one."""
    from paddle_sam.convert.core import save_pdparams, sidecar_meta
    from paddle_sam.models.sam_v1.build_sam import SamSpec, build_sam_model

    spec = SamSpec(
        encoder_embed_dim=16,
        encoder_depth=1,
        encoder_num_heads=1,
        encoder_global_attn_indexes=(0,),
        image_size=64,
        prompt_embed_dim=prompt_embed_dim,
        decoder_mlp_dim=64,
        decoder_num_heads=2,
        iou_head_hidden_dim=16,
    )
    paddle.seed(5)
    state = {k: v.numpy() for k, v in build_sam_model(spec).state_dict().items()}
    source = {"file": None, "sha256": None, "layout": "test"}
    save_pdparams(state, path, sidecar_meta("sam_v1", "vit_test", spec, source))
    return path


def test_a_sam_v1_teacher_starts_the_heads_and_distils_the_encoder(tmp_path):
    """``model.teacher``: the SAM heads start as the SAM v1 model's (the MLPs renamed, the
    high-resolution skips at zero, the object score positive); the distillation term is the
    mean squared distance between the features the heads read and the teacher's embedding of
    the same frames, and with the mask terms off its gradient reaches the image encoder only.
    A teacher of another width, a missing one, or distillation without one: errors naming it."""
    from paddle_sam.loading.sam_v1 import load_sam
    from paddle_sam.predict.video import preprocess_frame
    from paddle_sam.train.sam2.trainer import Sam2Trainer, clip_loss

    teacher_path = _tiny_sam_v1_teacher(tmp_path / "teacher.pdparams")
    zero = {k: 0.0 for k in ("focal_weight", "dice_weight", "iou_weight", "object_weight")}
    raw = tiny_config(
        tmp_path,
        model={"teacher": str(teacher_path), "tied_qk_init": False},
        loss={**zero, "distill_weight": 1.0},
    )
    cfg = load_config(write_yaml(tmp_path / "c.yaml", raw))
    trainer = Sam2Trainer(cfg, progress=False)
    model, teacher = trainer.model, load_sam(teacher_path)
    t_state, s_state = teacher.state_dict(), model.state_dict()
    np.testing.assert_array_equal(
        s_state["sam_prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"].numpy(),
        t_state["prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"].numpy(),
    )
    np.testing.assert_array_equal(
        s_state["sam_mask_decoder.transformer.layers.1.mlp.layers.0.weight"].numpy(),
        t_state["mask_decoder.transformer.layers.1.mlp.lin1.weight"].numpy(),
    )
    np.testing.assert_array_equal(
        s_state["sam_mask_decoder.output_hypernetworks_mlps.2.layers.1.bias"].numpy(),
        t_state["mask_decoder.output_hypernetworks_mlps.2.layers.1.bias"].numpy(),
    )
    assert not s_state["sam_mask_decoder.conv_s0.weight"].numpy().any()
    assert s_state["sam_mask_decoder.pred_obj_score_head.layers.2.bias"].numpy().tolist() == [2.0]

    clip = synthetic_clip(1, 0, 64, 64, 2)
    loss, stats = clip_loss(model, clip, np.random.default_rng(0), cfg, trainer.teacher)
    images = paddle.to_tensor(np.stack([preprocess_frame(f, 64) for f in clip.frames]))
    with paddle.no_grad():
        want = paddle.nn.functional.mse_loss(
            model.forward_image(images)["vision_features"], teacher.image_encoder(images)
        )
    assert stats["distill"] == pytest.approx(float(want), rel=1e-5)
    assert float(loss) == pytest.approx(float(want), rel=1e-5)  # the mask terms are off
    loss.backward()

    def grad_sum(layer) -> float:
        grads = [p.grad for p in layer.parameters() if p.grad is not None]
        return float(sum(float(g.abs().sum()) for g in grads))

    assert grad_sum(model.image_encoder.trunk) > 0
    assert grad_sum(model.sam_mask_decoder.transformer) == 0
    assert all(p.grad is None for p in trainer.teacher.parameters())

    narrow = _tiny_sam_v1_teacher(tmp_path / "narrow.pdparams", prompt_embed_dim=16)
    raw["model"]["teacher"] = str(narrow)
    with pytest.raises(ValueError, match="prompt_embed_dim 16 differs from the model's d_model 32"):
        Sam2Trainer(load_config(write_yaml(tmp_path / "n.yaml", raw)), progress=False)
    with pytest.raises(ConfigError, match="needs model.teacher"):
        load_config(RECIPE, ["model.teacher=null"])
    with pytest.raises(FileNotFoundError, match="model.teacher file not found"):
        load_config(RECIPE, [f"model.teacher={tmp_path / 'none.pdparams'}"])


def test_frame_loss_is_a_mean_over_pixels():
    """The mask terms are means over the frame's pixels (a sum would scale the gradients with
    the frame's area and leave clipping to throw the step away): zero logits on a frame
    half covered by the object give focal 0.25 * ln 2 / 4 at any size; a present object's
    terms count, an absent one's do not; the object score is trained either way."""
    from paddle_sam.train.sam2.config import Sam2LossConfig
    from paddle_sam.train.sam2.trainer import frame_losses

    lc = Sam2LossConfig()
    for size in (16, 64):
        target = np.zeros((2, size, size), np.float32)
        target[:, : size // 2] = 1
        out = {
            "multimasks_high_res": paddle.zeros([2, 3, size, size]),
            "ious": paddle.full([2, 3], 0.5),
            "object_score_logits": paddle.zeros([2, 1]),
        }
        present = paddle.to_tensor([1.0, 0.0])
        loss, _, parts = frame_losses(out, paddle.to_tensor(target), present, lc)
        # alpha 0.25 on the object's half, 0.75 on the background's: mean 0.5 * ln2 * 0.25
        assert parts["focal"] == pytest.approx(0.5 * math.log(2) * 0.25, rel=1e-4)
        assert parts["dice"] == pytest.approx(
            1 - (2 * 0.5 * size * size / 2 + 1) / (0.5 * size * size + size * size / 2 + 1),
            rel=1e-4,
        )
        assert parts["obj"] == pytest.approx(math.log(2), rel=1e-4)
        mask_only = lc.focal_weight * parts["focal"] + lc.dice_weight * parts["dice"]
        # IoU of empty predictions (logits 0 are not > 0) is 0: |0.5 - 0| per output
        assert float(loss) == pytest.approx(mask_only + 0.5 + math.log(2), rel=1e-4)


def test_clip_without_a_promptable_object_is_skipped(tmp_path):
    from paddle_sam.train.sam2.trainer import Sam2Trainer, clip_loss

    cfg = load_config(write_yaml(tmp_path / "c.yaml", tiny_config(tmp_path)))
    trainer = Sam2Trainer(cfg, progress=False)
    clip = synthetic_clip(1, 0, 64, 64, 3)
    clip.masks[:] = False
    assert clip_loss(trainer.model, clip, np.random.default_rng(0), cfg) == (None, {})


# -- a run ---------------------------------------------------------------------------------


def test_train_run_exports_a_model_the_video_predictor_loads(tmp_path, capsys):
    from paddle_sam.loading.sam2 import load_sam2_video_predictor
    from paddle_sam.models.sam2.build_sam import Sam2Spec
    from paddle_sam.train.sam2.evaluate import clip_miou

    config = write_yaml(tmp_path / "c.yaml", tiny_config(tmp_path))
    assert main(["train", str(config), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "held-out val_miou" in out
    run = tmp_path / "run"
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert all(math.isfinite(float(r["loss"])) for r in rows)
    assert 0 <= float(rows[-1]["val_miou"]) <= 1
    assert (run / "curves.png").is_file()
    predictor = load_sam2_video_predictor(run / "model.pdparams")
    assert predictor.spec == Sam2Spec.from_dict({**predictor.spec.to_dict(), **TINY})
    clip = synthetic_clip(2, 0, 128, 96, 3)
    assert clip.masks[0].sum(axis=(1, 2)).max() >= 16
    ious = clip_miou(predictor, clip.frames, clip.masks, min_area=16)
    assert ious and all(0 <= v <= 1 for v in ious)
    # paddle-sam eval on generated clips (the family read from the sidecar)
    result = tmp_path / "heldout.json"
    argv = ["eval", "--checkpoint", str(run / "model.pdparams"), "--num-images", "2"]
    assert main([*argv, "--frames", "3", "--json", str(result), "--quiet"]) == 0
    doc = json.loads(result.read_text())
    assert doc["clips"] == 2 and doc["frames"] == 3 and 0 <= doc["miou"] <= 1
    assert f"mean IoU {doc['miou']:.4f}" in capsys.readouterr().out
    assert main([*argv, "--format", "coco", "--quiet"]) == 2
    assert "SAM 2 is evaluated on generated clips" in capsys.readouterr().err
    # the same run again without --overwrite keeps the first one's files
    assert main(["train", str(config), "--quiet"]) == 2
