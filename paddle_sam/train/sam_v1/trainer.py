"""SAM v1's training loop: prompt simulation, loss, staged encoder (the loop itself, AdamW,
checkpoints and resume are ``base.TrainerBase``'s).

For every image, ``masks_per_image`` instances are prompted with a point or a noisy box and
then ``correction_rounds`` correction clicks, each round fed the previous low-res logits;
losses are averaged over rounds. Under ``python -m paddle.distributed.launch`` each process
draws different images; ranks keep identical weights (checked by the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F
from PIL import Image

from ...loading.sam_v1 import build_sam, load_sam_weights
from ...models.sam_v1.build_sam import SAM_SPECS, SamSpec
from ...predict.sam_v1.transforms import ResizeLongestSide
from ..base import TrainerBase
from ..data import SkipLog
from .config import Config
from .data import open_dataset
from .losses import sam_loss
from .prompts import correction_click, noisy_box, random_point


@dataclass
class Sample:
    image: np.ndarray  # h x w x 3 uint8, longest side = image_size
    gt: np.ndarray  # K x S x S bool, padded bottom-right
    valid: np.ndarray  # S x S bool: inside the resized image


def tie_decoder_qk(mask_decoder) -> None:
    """Set each mask-decoder attention's key projection to its query projection (a from-
    scratch initialisation: attention logits start as q(x) . q(y), a positive semi-definite
    kernel, so a point token attends to the image positions whose encoding matches its own)."""
    from ...models.sam_v1.transformer import Attention

    for _, layer in mask_decoder.named_sublayers():
        if isinstance(layer, Attention):
            layer.k_proj.weight.set_value(layer.q_proj.weight.clone())
            layer.k_proj.bias.set_value(layer.q_proj.bias.clone())


def model_spec(cfg: Config) -> SamSpec:
    spec = SAM_SPECS[cfg.model.type]
    if cfg.model.spec:
        spec = SamSpec.from_dict({**spec.to_dict(), **cfg.model.spec})
    return spec


def prepare_sample(image, masks, size: int, k: int, rng, hflip: bool) -> Sample | None:
    """Resize to the longest side ``size``, pad, keep up to ``k`` random visible instances."""
    if hflip and rng.random() < 0.5:
        image = image[:, ::-1]
        masks = [m[:, ::-1] for m in masks]
    tf = ResizeLongestSide(size)
    small = tf.apply_image(np.ascontiguousarray(image))
    h, w = small.shape[:2]
    gts = []
    for m in masks:
        r = Image.fromarray(np.ascontiguousarray(m).astype(np.uint8) * 255)
        r = np.asarray(r.resize((w, h), Image.BILINEAR)) > 127
        if r.sum() >= 4:
            gts.append(r)
    if not gts:
        return None
    pick = rng.choice(len(gts), size=min(k, len(gts)), replace=False)
    gt = np.zeros((len(pick), size, size), bool)
    for i, j in enumerate(pick):
        gt[i, :h, :w] = gts[j]
    valid = np.zeros((size, size), bool)
    valid[:h, :w] = True
    return Sample(small, gt, valid)


def _take(x: paddle.Tensor, idx: paddle.Tensor) -> paddle.Tensor:
    """x: K x C x ..., idx: K -> K x 1 x ... (the chosen output of each prompt)."""
    shape = [x.shape[0], 1] + [1] * (x.ndim - 2)
    return paddle.take_along_axis(
        x, idx.reshape(shape).expand([x.shape[0], 1, *x.shape[2:]]), axis=1
    )


def _pool(masks: np.ndarray, f: int) -> np.ndarray:
    """K x S x S bool -> K x S/f x S/f bool (majority of each f x f cell)."""
    if f == 1:
        return masks
    k, s, _ = masks.shape
    return masks.reshape(k, s // f, f, s // f, f).mean(axis=(2, 4)) >= 0.5


def prompt_rounds(sam, emb, pe, sample: Sample, rng, cfg: Config):
    """Loss of one image's prompts over every round; returns (loss, stats).

    The loss is taken at ``res`` = low-res size x ``loss.logit_upsample`` against the ground
    truth pooled to that size; correction clicks are drawn there and mapped to the input frame.
    """
    size = sam.image_encoder.img_size
    res = min(size, 4 * sam.prompt_encoder.image_embedding_size[0] * cfg.loss.logit_upsample)
    if size % res:
        res = size
    f = size // res
    pc = cfg.prompts
    k = sample.gt.shape[0]
    is_box = rng.random(k) < pc.box_fraction
    valid_np = _pool(sample.valid[None], f)[0]
    valid = paddle.to_tensor(valid_np.astype(np.float32))[None, None]
    total = paddle.zeros([])
    stats = {"focal": 0.0, "dice": 0.0, "iou_mse": 0.0, "iou_first": 0.0, "iou_last": 0.0}
    rounds = pc.correction_rounds + 1
    for use_box in (False, True):
        idx = np.nonzero(is_box == use_box)[0]
        if len(idx) == 0:
            continue
        gt_full = sample.gt[idx]
        gt = _pool(gt_full, f)
        gt_t = paddle.to_tensor(gt.astype(np.float32))[:, None]
        weight = len(idx) / k / rounds
        coords = np.zeros((len(idx), 0, 2), np.float32)
        labels = np.zeros((len(idx), 0), np.float32)
        boxes = None
        if use_box:
            boxes = paddle.to_tensor(
                np.stack([noisy_box(g, rng, pc.box_noise, pc.box_max_noise) for g in gt_full]),
                dtype="float32",
            )
        else:
            coords = np.array([[random_point(g, rng)] for g in gt_full], np.float32)
            labels = np.ones((len(idx), 1), np.float32)
        mask_input = None
        for r in range(rounds):
            points = None
            if coords.shape[1]:
                points = (paddle.to_tensor(coords), paddle.to_tensor(labels))
            sparse, dense = sam.prompt_encoder(points, boxes, mask_input)
            low, iou_pred = sam.mask_decoder(emb, pe, sparse, dense, r == 0 and not use_box)
            up = low
            if res != low.shape[-1]:
                up = F.interpolate(low, size=[res, res], mode="bilinear", align_corners=False)
            loss, parts, best = sam_loss(
                up,
                iou_pred,
                gt_t.expand_as(up),
                valid,
                cfg.loss.focal_weight,
                cfg.loss.dice_weight,
                cfg.loss.iou_weight,
                cfg.loss.focal_alpha,
                cfg.loss.focal_gamma,
            )
            total = total + loss * weight
            for key in ("focal", "dice", "iou_mse"):
                stats[key] += float(parts[key]) * weight
            if r == 0:
                stats["iou_first"] += float(parts["iou"]) * len(idx) / k
            if r == rounds - 1:
                stats["iou_last"] += float(parts["iou"]) * len(idx) / k
                break
            pred = (_take(up, best)[:, 0].numpy() > 0) & valid_np
            clicks = []
            for p_i, g, g_full in zip(pred, gt, gt_full, strict=True):
                if g.any():  # drawn at the loss resolution, mapped into the input frame
                    x, y, lab = correction_click(p_i, g, rng)
                    clicks.append((x * f + rng.integers(f), y * f + rng.integers(f), lab))
                else:  # too small to survive pooling: a positive click on the object
                    clicks.append((*random_point(g_full, rng), 1))
            xy = np.array([[c[:2]] for c in clicks], np.float32)
            coords = np.concatenate([coords, xy], 1)
            labels = np.concatenate([labels, np.array([[c[2]] for c in clicks], np.float32)], 1)
            mask_input = _take(low, best).detach()
    return total, stats


class Trainer(TrainerBase):
    """SAM v1: prompt simulation over each image's instances, staged encoder."""

    metric_fields = ("focal", "dice", "iou_mse", "train_iou_first", "train_iou_last")
    eval_fields = ("miou_1click", "miou_3click", "miou_box")

    @property
    def sam(self):
        return self.model

    def build_model(self):
        cfg = self.cfg
        self.spec = model_spec(cfg)
        sam = build_sam(self.spec)
        if cfg.model.checkpoint is not None:
            load_sam_weights(sam, cfg.model.checkpoint)
        elif cfg.model.tied_qk_init:
            tie_decoder_qk(sam.mask_decoder)
        return sam

    def build_data(self) -> None:
        cfg = self.cfg
        self.skips = SkipLog()
        self.train_data = open_dataset(vars(cfg.data.train), self.skips)
        self.val_data = open_dataset(vars(cfg.data.val), self.skips) if cfg.data.val else None

    def spec_dict(self) -> dict:
        return self.spec.to_dict()

    def apply_stage(self) -> None:
        """Stage 1: encoder frozen. Stage 2: last N blocks + neck train at a lower lr."""
        tc = self.cfg.train
        stage = 1 if self.step < tc.freeze_encoder_steps else 2
        if stage == self.stage:
            return
        self.stage = stage
        enc = self.sam.image_encoder
        for p in enc.parameters():
            p.stop_gradient = True
        if stage == 2:
            if tc.unfreeze_last_blocks == -1:
                layers = [enc]
            else:
                n = tc.unfreeze_last_blocks
                layers = (
                    [enc.blocks[i] for i in range(len(enc.blocks) - n, len(enc.blocks))]
                    if n
                    else []
                ) + [enc.neck]
            for layer in layers:
                for p in layer.parameters():
                    p.stop_gradient = False
                    p.optimize_attr["learning_rate"] = self.cfg.optim.encoder_lr_scale
        self.encoder_trains = any(not p.stop_gradient for p in enc.parameters())

    # -- data --

    def _draw(self, rng) -> Sample:
        cfg = self.cfg
        for _ in range(50):
            item = self.train_data.load(int(rng.integers(len(self.train_data))))
            if item is None:
                continue
            s = prepare_sample(
                *item, self.spec.image_size, cfg.data.masks_per_image, rng, cfg.data.hflip
            )
            if s is not None:
                return s
            self.skips.add("no instance left after resizing", "training sample")
        raise ValueError(
            f"50 draws in a row gave no usable training image ({self.skips.summary()})"
        )

    # -- one micro-batch --

    def micro_batch_loss(self, rng, n_images: int, micro: int):
        samples = [self._draw(rng) for _ in range(self.cfg.train.batch_size)]
        x = paddle.stack(
            [self.sam.preprocess(paddle.to_tensor(s.image).transpose([2, 0, 1])) for s in samples]
        )
        if self.encoder_trains:
            emb = self.sam.image_encoder(x)
        else:
            with paddle.no_grad():
                emb = self.sam.image_encoder(x)
        pe = self.sam.prompt_encoder.get_dense_pe()
        loss = paddle.zeros([])
        stats: dict[str, float] = {}
        for b, s in enumerate(samples):
            l_img, st = prompt_rounds(self.sam, emb[b : b + 1], pe, s, rng, self.cfg)
            loss = loss + l_img
            for k, v in st.items():
                stats[k] = stats.get(k, 0.0) + v / n_images
        return loss / n_images, stats

    def row(self, mean: dict[str, float]) -> dict:
        return {
            "focal": mean["focal"],
            "dice": mean["dice"],
            "iou_mse": mean["iou_mse"],
            "train_iou_first": mean["iou_first"],
            "train_iou_last": mean["iou_last"],
        }

    def postfix(self, stats: dict) -> dict[str, str]:
        return {"loss": f"{stats['loss']:.3f}", "iou": f"{stats['iou_last']:.3f}"}

    # -- the run --

    def evaluate(self) -> dict:
        from .evaluate import evaluate

        if self.val_data is None:
            return {}
        return evaluate(self.sam, self.val_data, self.cfg.data.eval_images, self.progress)

    def export(self, metrics: dict) -> Path:
        """The final weights as a loadable ``model.pdparams`` with its sidecar."""
        model_type = self.cfg.run.model_name or self.cfg.model.type
        return self.save_model("sam_v1", model_type, self.sam, metrics)

    def plot(self, rows: list[dict]) -> None:
        fig, plt = self._figure(2)
        a, b = fig.axes
        a.plot(*self._col(rows, "loss"), label="loss (20 focal + dice + IoU MSE)")
        a.set_xlabel("step")
        a.set_yscale("log")
        a.legend()
        b.plot(*self._col(rows, "train_iou_last"), label="train IoU, last round", alpha=0.5)
        for key, name in (
            ("miou_1click", "held-out 1 click"),
            ("miou_3click", "held-out 3 clicks"),
            ("miou_box", "held-out box"),
        ):
            b.plot(*self._col(rows, key), marker="o", label=name)
        b.set_xlabel("step")
        b.set_ylim(0, 1)
        b.legend()
        self._save_figure(fig, plt)
