"""Training SAM 2's video tracker on synthetic clips (upstream: ``training/model/sam2.py``,
``SAM2Train``, and ``training/loss_fns.py``, ``MultiStepMultiMasksAndIous``).

A step takes one clip (:func:`..clips.synthetic_clip`): up to ``data.max_objects`` objects
seen on its first frame are the batch of the SAM heads. The first frame is prompted (a click,
a noisy box or the object's mask), the model's own :meth:`track_step` then tracks every later
frame from the memories of the frames before it (gradients flow through the memories, as
upstream), and on some clips one later frame gets a correction click from the error of its
prediction (a conditioning frame, as a user's correction is). Every frame is supervised:
focal + dice on the best of the multimask outputs (or the single one), L1 between the
predicted and the actual IoU of every output, and the object score against whether the object
is seen on that frame (mask terms only where it is).

Started from scratch, a model can take a trained SAM v1 of the same width as its teacher
(``model.teacher``): the SAM heads start as the teacher's (SAM 2's heads are SAM v1's with an
object-score token and high-resolution skips, which start at zero), and the image features the
heads read are pulled towards the teacher's image embedding of the same frames
(``loss.distill_weight``), so the heads understand clicks from the first step and the Hiera
encoder learns from a dense target rather than from masks alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from ...predict.video import preprocess_frame
from ..base import TrainerBase
from ..clips import Clip, clip_at
from ..sam_v1.losses import dice_loss, focal_loss, mask_iou
from ..sam_v1.trainer import tie_decoder_qk
from .config import Sam2Config, model_spec


def clip_for_step(spec_data: Any, rng: np.random.Generator, step_index: int) -> Clip:
    """The clip of a training step: one of ``num_clips`` of the seed (0: a new one per step)."""
    index = step_index if not spec_data.num_clips else int(rng.integers(spec_data.num_clips))
    return clip_at(spec_data, index)


def _resize_masks(masks: np.ndarray, size: int) -> np.ndarray:
    """``... x H x W`` bool -> ``... x size x size`` float32 (nearest, as the frames' resize)."""
    import cv2

    flat = masks.reshape(-1, *masks.shape[-2:]).astype(np.uint8)
    out = [cv2.resize(m, (size, size), interpolation=cv2.INTER_NEAREST) for m in flat]
    return np.asarray(out, np.float32).reshape(*masks.shape[:-2], size, size)


def _random_point(mask: np.ndarray, rng: np.random.Generator) -> tuple[float, float] | None:
    ys, xs = np.nonzero(mask)
    if not len(xs):
        return None
    i = int(rng.integers(len(xs)))
    return float(xs[i]) + 0.5, float(ys[i]) + 0.5


def _noisy_box(mask: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
    w, h = box[2] - box[0], box[3] - box[1]
    box += rng.normal(0, noise, 4) * np.array([w, h, w, h])
    size = mask.shape[-1]
    return np.clip(box, 0, size)


def init_heads_from_sam(model, sam) -> None:
    """Copy SAM v1 ``sam``'s prompt encoder and mask decoder into SAM 2 ``model``'s where the
    names (``mlp.lin1`` / ``lin2`` are SAM 2's ``mlp.layers.0`` / ``1``) and shapes agree; the
    high-resolution skips (``conv_s0``, ``conv_s1``) start at zero, so the decoder first computes
    what SAM v1's does, and the object score starts positive (masks kept while it learns); the
    rest (the object-score token and head, the IoU head of another width) stay as built."""
    if sam.prompt_encoder.embed_dim != model.sam_prompt_embed_dim:
        raise ValueError(
            f"model.teacher: its prompt_embed_dim {sam.prompt_encoder.embed_dim} differs from "
            f"the model's d_model {model.sam_prompt_embed_dim}"
        )
    if sam.image_encoder.img_size != model.image_size:
        raise ValueError(
            f"model.teacher: its image_size {sam.image_encoder.img_size} differs from the "
            f"model's {model.image_size}"
        )
    renamed = {".mlp.lin1.": ".mlp.layers.0.", ".mlp.lin2.": ".mlp.layers.1."}
    source = {}
    for k, v in sam.state_dict().items():
        if k.startswith(("prompt_encoder.", "mask_decoder.")):
            for old, new in renamed.items():
                k = k.replace(old, new)
            source["sam_" + k] = v
    with paddle.no_grad():
        for name, param in model.state_dict().items():
            if not name.startswith(("sam_prompt_encoder.", "sam_mask_decoder.")):
                continue
            if name in source and list(source[name].shape) == list(param.shape):
                param.set_value(source[name])
            elif name.startswith(("sam_mask_decoder.conv_s0.", "sam_mask_decoder.conv_s1.")):
                param.set_value(paddle.zeros_like(param))
        head = model.sam_mask_decoder.pred_obj_score_head
        last = head.layers[-1] if hasattr(head, "layers") else head
        last.bias.set_value(paddle.full_like(last.bias, 2.0))


def frame_losses(out: dict, target: paddle.Tensor, present: paddle.Tensor, lc: Any) -> tuple:
    """One frame's loss for ``B`` objects: ``target`` ``B x S x S`` (0/1), ``present`` ``B``
    (0/1). Returns (loss, IoU of the supervised mask per object, its parts)."""
    logits = out["multimasks_high_res"]  # B x C x S x S
    ious = out["ious"]  # B x C
    t = target.unsqueeze(1).expand_as(logits)
    # every pixel counts (the losses take means over the valid pixels of a padded frame)
    valid = paddle.ones([1, 1, *logits.shape[-2:]], dtype="float32")
    focal = focal_loss(logits, t, valid, lc.focal_alpha, lc.focal_gamma)
    dice = dice_loss(logits, t, valid)
    per_output = lc.focal_weight * focal + lc.dice_weight * dice  # B x C
    best = paddle.argmin(per_output.detach(), axis=1, keepdim=True)
    mask_term = paddle.take_along_axis(per_output, best, axis=1).squeeze(1)  # B
    actual = mask_iou(logits, t, valid)  # B x C
    iou_term = (ious - actual).abs().mean(axis=1)
    obj = out["object_score_logits"].squeeze(-1)  # B
    obj_term = F.binary_cross_entropy_with_logits(obj, present, reduction="none")
    n_present = present.sum().clip(min=1.0)
    loss = ((mask_term + lc.iou_weight * iou_term) * present).sum() / n_present
    loss = loss + lc.object_weight * obj_term.mean()
    best_iou = paddle.take_along_axis(actual, best, axis=1).squeeze(1)
    parts = {
        "focal": float((paddle.take_along_axis(focal, best, axis=1).squeeze(1) * present).sum())
        / float(n_present),
        "dice": float((paddle.take_along_axis(dice, best, axis=1).squeeze(1) * present).sum())
        / float(n_present),
        "obj": float(obj_term.mean()),
    }
    return loss, best_iou, parts


def clip_loss(
    model, clip: Clip, rng: np.random.Generator, cfg: Sam2Config, teacher=None
) -> tuple[Any, dict]:
    """The loss of tracking ``clip``'s objects (see the module's docstring) and statistics:
    the mean loss parts, ``train_iou_first`` (the prompted frame) and ``train_iou_track`` (the
    tracked frames, objects seen there); ``teacher`` (a SAM v1 model) adds the distillation
    term of ``loss.distill_weight``."""
    size = model.image_size
    dc, pc, lc = cfg.data, cfg.prompts, cfg.loss
    t_frames = clip.frames.shape[0]
    if clip.masks.shape[1] == 0:
        return None, {}
    area0 = clip.masks[0].reshape(clip.masks.shape[1], -1).sum(axis=1)
    candidates = np.nonzero(area0 >= dc.min_area)[0]
    if not len(candidates):
        return None, {}
    objs = rng.permutation(candidates)[: dc.max_objects]
    b = len(objs)
    target_np = _resize_masks(clip.masks[:, objs], size)  # T x B x S x S
    present_np = (target_np.reshape(t_frames, b, -1).sum(-1) > 0).astype(np.float32)
    images = paddle.to_tensor(np.stack([preprocess_frame(f, size) for f in clip.frames]))
    backbone_out = model.forward_image(images)
    distill = None
    if teacher is not None and lc.distill_weight > 0:
        # SAM v1 normalises as SAM 2 does (ImageNet mean and std): the same input tensor
        with paddle.no_grad():
            target_embed = teacher.image_encoder(images)
        distill = F.mse_loss(backbone_out["vision_features"], target_embed)
    _, feats, pos, sizes = model._prepare_backbone_features(backbone_out)

    def frame_feats(t: int) -> tuple[list, list]:
        pick = [x[:, t : t + 1].expand([-1, b, -1]) for x in feats]
        return pick, [x[:, t : t + 1].expand([-1, b, -1]) for x in pos]

    kind = rng.random()
    point_inputs, mask_inputs = None, None
    if kind < pc.point_prob:
        pts = [_random_point(target_np[0, i] > 0, rng) for i in range(b)]
        point_inputs = {
            "point_coords": paddle.to_tensor(np.asarray(pts, np.float32)[:, None]),
            "point_labels": paddle.ones([b, 1], dtype="int32"),
        }
    elif kind < pc.point_prob + pc.box_prob:
        boxes = np.stack([_noisy_box(target_np[0, i] > 0, rng, pc.box_noise) for i in range(b)])
        point_inputs = {
            "point_coords": paddle.to_tensor(boxes.reshape(b, 2, 2)),
            "point_labels": paddle.to_tensor(np.tile([[2, 3]], (b, 1)).astype(np.int32)),
        }
    else:
        mask_inputs = paddle.to_tensor(target_np[0][:, None])
    correct_at = -1  # a correction click on a later frame (clips of one frame have none)
    if t_frames > 1 and rng.random() < pc.correction_prob:
        correct_at = int(rng.integers(1, t_frames))

    output_dict: dict[str, dict] = {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}
    total = paddle.zeros([], dtype="float32")
    stats: dict[str, float] = {"focal": 0.0, "dice": 0.0, "obj": 0.0}
    tracked: list[float] = []
    first_iou = 0.0
    for t in range(t_frames):
        cur, cur_pos = frame_feats(t)
        target = paddle.to_tensor(target_np[t])
        present = paddle.to_tensor(present_np[t])
        step_points = point_inputs if t == 0 else None
        if t == correct_at:
            # the frame tracked first (no gradient), then a click on its error, as a user would
            with paddle.no_grad():
                probe = model.track_step(
                    t,
                    False,
                    cur,
                    cur_pos,
                    sizes,
                    None,
                    None,
                    output_dict,
                    t_frames,
                    run_mem_encoder=False,
                )
            pred = probe["pred_masks_high_res"][:, 0].numpy() > 0
            pts, labels = [], []
            for i in range(b):
                gt = target_np[t, i] > 0
                miss, extra = gt & ~pred[i], pred[i] & ~gt
                use_miss = miss.sum() >= extra.sum()
                p = _random_point(miss if use_miss else extra, rng) or (size / 2, size / 2)
                pts.append(p)
                labels.append(1 if use_miss else 0)
            step_points = {
                "point_coords": paddle.to_tensor(np.asarray(pts, np.float32)[:, None]),
                "point_labels": paddle.to_tensor(np.asarray(labels, np.int32)[:, None]),
            }
        out = model.track_step(
            frame_idx=t,
            is_init_cond_frame=t == 0,
            current_vision_feats=cur,
            current_vision_pos_embeds=cur_pos,
            feat_sizes=sizes,
            point_inputs=step_points,
            mask_inputs=mask_inputs if t == 0 else None,
            output_dict=output_dict,
            num_frames=t_frames,
        )
        kind_of = (
            "cond_frame_outputs" if step_points is not None or t == 0 else "non_cond_frame_outputs"
        )
        output_dict[kind_of][t] = out
        loss, best_iou, parts = frame_losses(out, target, present, lc)
        total = total + loss
        for k, v in parts.items():
            stats[k] += v / t_frames
        seen = present_np[t] > 0
        ious = best_iou.numpy()
        if t == 0:
            first_iou = float(ious.mean())
        elif seen.any():
            tracked.extend(ious[seen].tolist())
    stats["train_iou_first"] = first_iou
    stats["train_iou_track"] = float(np.mean(tracked)) if tracked else 0.0
    total = total / t_frames
    if distill is not None:
        stats["distill"] = float(distill)
        total = total + lc.distill_weight * distill
    return total, stats


class Sam2Trainer(TrainerBase):
    """SAM 2's video tracker on synthetic clips (see the module's docstring)."""

    metric_fields = ("focal", "dice", "obj", "distill", "train_iou_first", "train_iou_track")
    eval_fields = ("val_miou",)

    def build_model(self):
        from ...loading.sam2 import load_sam2_weights
        from ...models.sam2.build_sam import build_sam2_model

        cfg = self.cfg
        self.spec = model_spec(cfg.model)
        model = build_sam2_model(self.spec)
        self.teacher = None
        if cfg.model.teacher is not None:
            from ...loading.sam_v1 import load_sam

            self.teacher = load_sam(cfg.model.teacher)
            self.teacher.eval()
            for p in self.teacher.parameters():
                p.stop_gradient = True
        if cfg.model.checkpoint is not None:
            load_sam2_weights(model, cfg.model.checkpoint)
        elif self.teacher is not None:
            init_heads_from_sam(model, self.teacher)
        elif cfg.model.tied_qk_init:
            tie_decoder_qk(model.sam_mask_decoder)
        return model

    def build_data(self) -> None:
        pass  # clips are drawn per step

    def micro_batch_loss(self, rng: np.random.Generator, n_images: int, micro: int):
        tc = self.cfg.train
        for attempt in range(20):
            # a different clip for every step, micro-batch and process
            index = ((self.step * tc.grad_accum + micro) * self.world + self.rank) * 20 + attempt
            clip = clip_for_step(self.cfg.data.train, rng, index)
            loss, stats = clip_loss(self.model, clip, rng, self.cfg, self.teacher)
            if loss is not None:
                return loss / n_images, {k: v / n_images for k, v in stats.items()}
        raise ValueError("20 clips in a row had no object to prompt (data.min_area too large?)")

    def spec_dict(self) -> dict:
        return self.spec.to_dict()

    def evaluate(self) -> dict:
        from .evaluate import evaluate_clips

        val = self.cfg.data.val
        if val is None:
            return {}
        self.model.eval()
        try:
            result = evaluate_clips(self.model, val, self.cfg.data.eval_clips, self.progress)
        finally:
            self.set_train_mode()
        return {"val_miou": result["miou"]}

    def export(self, metrics: dict) -> Path:
        model_type = self.cfg.run.model_name or self.cfg.model.type
        return self.save_model("sam2", model_type, self.model, metrics)

    def plot(self, rows: list[dict]) -> None:
        fig, plt = self._figure(2)
        a, b = fig.axes
        a.plot(*self._col(rows, "loss"), label="loss")
        a.set_xlabel("step")
        a.set_yscale("log")
        a.legend()
        b.plot(*self._col(rows, "train_iou_first"), label="train IoU, prompted frame", alpha=0.5)
        b.plot(*self._col(rows, "train_iou_track"), label="train IoU, tracked frames", alpha=0.5)
        b.plot(*self._col(rows, "val_miou"), "o-", label="held-out mean IoU")
        b.set_xlabel("step")
        b.legend()
        self._save_figure(fig, plt)
