"""The training loop: prompt simulation, loss, staged encoder, AdamW, checkpoints, resume.

One optimizer step = ``grad_accum`` micro-batches of ``batch_size`` images on each process.
For every image, ``masks_per_image`` instances are prompted with a point or a noisy box and
then ``correction_rounds`` correction clicks, each round fed the previous low-res logits;
losses are averaged over rounds. Under ``python -m paddle.distributed.launch`` each process
draws different images and gradients are averaged across processes with
``paddle.distributed.all_reduce`` before every optimizer step, so all ranks keep identical
weights (checked by the tests). Randomness is a pure function of (seed, step, micro-batch,
rank), so a resumed run continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F
from PIL import Image

from ..build.sam_v1 import build_sam, load_sam_weights
from ..convert.core import save_pdparams, sidecar_meta
from ..models.sam_v1.build_sam import SAM_SPECS, SamSpec
from ..predict.sam_v1.transforms import ResizeLongestSide
from .config import Config
from .data import SkipLog, open_dataset
from .losses import sam_loss
from .prompts import correction_click, noisy_box, random_point

METRIC_FIELDS = [
    "step",
    "lr",
    "loss",
    "focal",
    "dice",
    "iou_mse",
    "train_iou_first",
    "train_iou_last",
    "seconds",
    "miou_1click",
    "miou_3click",
    "miou_box",
]
RUN_FILES = (
    "checkpoints",
    "metrics.csv",
    "curves.png",
    "config.yaml",
    "model.pdparams",
    "model.pdparams.json",
    "eval.json",
    "ranks.json",
)


@dataclass
class Sample:
    image: np.ndarray  # h x w x 3 uint8, longest side = image_size
    gt: np.ndarray  # K x S x S bool, padded bottom-right
    valid: np.ndarray  # S x S bool: inside the resized image


def tie_decoder_qk(sam) -> None:
    """Set each mask-decoder attention's key projection to its query projection (a from-
    scratch initialisation: attention logits start as q(x) . q(y), a positive semi-definite
    kernel, so a point token attends to the image positions whose encoding matches its own)."""
    from ..models.sam_v1.transformer import Attention

    for _, layer in sam.mask_decoder.named_sublayers():
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


class Trainer:
    def __init__(
        self,
        cfg: Config,
        resume: bool = False,
        overwrite: bool = False,
        progress: bool = True,
        config_text: str | None = None,
    ) -> None:
        import paddle.distributed as dist

        self.cfg = cfg
        self.world = dist.get_world_size()
        if self.world > 1:
            dist.init_parallel_env()
        self.rank = dist.get_rank()
        self.progress = progress and self.rank == 0
        self.out = Path(cfg.run.output_dir)
        if cfg.train.threads is not None:
            from .._runtime import set_num_threads

            set_num_threads(cfg.train.threads)
        self._prepare_run_dir(resume, overwrite, config_text)
        self.amp = self._amp_setting()

        self.spec = model_spec(cfg)
        paddle.seed(cfg.train.seed)
        self.sam = build_sam(self.spec)
        if cfg.model.checkpoint is not None:
            load_sam_weights(self.sam, cfg.model.checkpoint)
        elif cfg.model.tied_qk_init:
            tie_decoder_qk(self.sam)
        self.sam.train()
        if self.world > 1:  # every rank starts from rank 0's weights
            for p in self.sam.parameters():
                dist.broadcast(p, src=0)

        self.skips = SkipLog()
        self.train_data = open_dataset(vars(cfg.data.train), self.skips)
        self.val_data = open_dataset(vars(cfg.data.val), self.skips) if cfg.data.val else None

        oc = cfg.optim
        self.scheduler = paddle.optimizer.lr.LambdaDecay(oc.lr, self._lr_factor)
        named = list(self.sam.named_parameters())
        no_decay = {p.name for n, p in named if p.ndim < 2 or "embed" in n or "pos" in n}
        self.optimizer = paddle.optimizer.AdamW(
            learning_rate=self.scheduler,
            parameters=[p for _, p in named],
            beta1=oc.beta1,
            beta2=oc.beta2,
            weight_decay=oc.weight_decay,
            apply_decay_param_fun=lambda name: name not in no_decay,
            grad_clip=paddle.nn.ClipGradByGlobalNorm(oc.grad_clip) if oc.grad_clip else None,
        )
        # moments for every parameter from the start (zeros until it trains), so a checkpoint
        # taken while the encoder is frozen still holds a complete state (exact resume)
        self.optimizer._create_accumulators(
            paddle.static.default_main_program().global_block(), [p for _, p in named]
        )
        self.scaler = paddle.amp.GradScaler() if self.amp else None
        self.step = 0
        self.stage = None
        if resume:
            self._load_latest()

    # -- setup --

    def _prepare_run_dir(self, resume: bool, overwrite: bool, config_text: str | None) -> None:
        out = self.out
        if resume and overwrite:
            raise ValueError("give --resume or --overwrite, not both")
        if self.rank == 0:
            # launch_logs/ is written by paddle.distributed.launch before we start
            existing = out.is_dir() and any(p.name != "launch_logs" for p in out.iterdir())
            if resume and not (out / "checkpoints").is_dir():
                raise FileNotFoundError(f"--resume: no checkpoints in {out}/checkpoints")
            if existing and not (resume or overwrite):
                raise FileExistsError(
                    f"run folder {out} is not empty; pass --resume to continue it or "
                    "--overwrite to start again (removes its checkpoints, metrics and model)"
                )
            if overwrite:
                for name in RUN_FILES:
                    p = out / name
                    if p.is_dir():
                        shutil.rmtree(p)
                    elif p.exists():
                        p.unlink()
            out.mkdir(parents=True, exist_ok=True)
            if config_text is not None:
                (out / "config.yaml").write_text(config_text)
        self._barrier()

    def _barrier(self) -> None:
        if self.world > 1:
            paddle.distributed.barrier()

    def _amp_setting(self) -> bool:
        if not self.cfg.train.amp:
            return False
        if paddle.device.get_device().startswith("cpu"):
            warnings.warn(
                "train.amp: mixed precision is off on CPU (float16 autocast needs a GPU); "
                "training in float32",
                stacklevel=2,
            )
            return False
        return True  # GPU path: written against the Paddle 3 API, not run on hardware here

    def _lr_factor(self, step: int) -> float:
        oc, total = self.cfg.optim, self.cfg.train.steps
        if oc.warmup_steps and step < oc.warmup_steps:
            return (step + 1) / oc.warmup_steps
        if oc.decay == "none":
            return 1.0
        t = (step - oc.warmup_steps) / max(1, total - oc.warmup_steps)
        t = min(max(t, 0.0), 1.0)
        shape = 0.5 * (1 + math.cos(math.pi * t)) if oc.decay == "cosine" else 1 - t
        return oc.min_lr_ratio + (1 - oc.min_lr_ratio) * shape

    def _apply_stage(self) -> None:
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

    # -- one optimizer step --

    def train_step(self) -> dict:
        cfg, tc = self.cfg, self.cfg.train
        self._apply_stage()
        stats: dict[str, float] = {}
        n_images = tc.batch_size * tc.grad_accum
        for micro in range(tc.grad_accum):
            rng = np.random.default_rng([tc.seed, self.step, micro, self.rank])
            samples = [self._draw(rng) for _ in range(tc.batch_size)]
            x = paddle.stack(
                [
                    self.sam.preprocess(paddle.to_tensor(s.image).transpose([2, 0, 1]))
                    for s in samples
                ]
            )
            with paddle.amp.auto_cast(enable=self.amp, dtype="float16"):
                if self.encoder_trains:
                    emb = self.sam.image_encoder(x)
                else:
                    with paddle.no_grad():
                        emb = self.sam.image_encoder(x)
                pe = self.sam.prompt_encoder.get_dense_pe()
                loss = paddle.zeros([])
                for b, s in enumerate(samples):
                    l_img, st = prompt_rounds(self.sam, emb[b : b + 1], pe, s, rng, cfg)
                    loss = loss + l_img
                    for k, v in st.items():
                        stats[k] = stats.get(k, 0.0) + v / n_images
            loss = loss / n_images
            stats["loss"] = stats.get("loss", 0.0) + float(loss)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
        self._allreduce_grads(stats)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.clear_grad(set_to_zero=False)
        stats["lr"] = self.optimizer.get_lr()
        self.scheduler.step()
        self.step += 1
        return stats

    def _allreduce_grads(self, stats: dict) -> None:
        """Average gradients (and the logged statistics) over processes, one fused buffer."""
        if self.world == 1:
            return
        import paddle.distributed as dist

        params = [p for p in self.sam.parameters() if not p.stop_gradient]
        has = paddle.to_tensor([float(p.grad is not None) for p in params])
        dist.all_reduce(has)
        used = [p for p, h in zip(params, has.numpy(), strict=True) if h > 0]
        for p in used:
            if p.grad is None:  # this rank's prompts never reached it; others' did
                p._set_grad_ivar(paddle.zeros_like(p))
        flat = paddle.concat([p.grad.reshape([-1]) for p in used])
        keys = sorted(stats)
        flat = paddle.concat([flat, paddle.to_tensor([stats[k] for k in keys], "float32")])
        dist.all_reduce(flat)
        flat = flat / self.world
        offset = 0
        for p in used:
            n = int(np.prod(p.shape))
            p.grad.set_value(flat[offset : offset + n].reshape(p.shape))
            offset += n
        for k, v in zip(keys, flat[offset:].numpy(), strict=True):
            stats[k] = float(v)

    # -- checkpoints --

    def _ckpt_dir(self, step: int) -> Path:
        return self.out / "checkpoints" / f"step_{step:07d}"

    def save_checkpoint(self) -> Path:
        """Model, optimizer (with lr scheduler) and step, written atomically (rank 0)."""
        final = self._ckpt_dir(self.step)
        if self.rank == 0:
            tmp = final.with_name(final.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            paddle.save(self.sam.state_dict(), str(tmp / "model.pdparams"))
            paddle.save(self._optimizer_state(), str(tmp / "optimizer.pdopt"))
            (tmp / "trainer.json").write_text(
                json.dumps(
                    {
                        "step": self.step,
                        "world_size": self.world,
                        "spec": self.spec.to_dict(),
                        "scheduler": self.scheduler.state_dict(),
                    },
                    indent=2,
                )
                + "\n"
            )
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            kept = sorted((self.out / "checkpoints").glob("step_???????"))
            for old in kept[: -max(1, self.cfg.train.keep_checkpoints)]:
                shutil.rmtree(old)
        self._barrier()
        return final

    def _optimizer_state(self) -> dict:
        """Optimizer state keyed by structured parameter names (Paddle's own tensor names
        depend on how many layers the process built before, so they differ between runs)."""
        names = {p.name: n for n, p in self.sam.named_parameters()}
        out = {}
        for key, v in self.optimizer.state_dict().items():
            base, sep, suffix = (
                key.partition("_moment") if "_moment" in key else (key.partition("_beta"))
            )
            if sep and base in names:
                key = f"param:{names[base]}{sep}{suffix}"
            out[key] = v
        return out

    def _set_optimizer_state(self, state: dict) -> None:
        names = {n: p.name for n, p in self.sam.named_parameters()}
        out = {}
        for key, v in state.items():
            if key.startswith("param:"):
                rest = key[len("param:") :]
                sep = "_moment" if "_moment" in rest else "_beta"
                base, _, suffix = rest.partition(sep)
                key = f"{names[base]}{sep}{suffix}"
            out[key] = v
        self.optimizer.set_state_dict(out)

    def _load_latest(self) -> None:
        ckpts = sorted((self.out / "checkpoints").glob("step_???????"))
        if not ckpts:
            raise FileNotFoundError(f"--resume: no complete checkpoint in {self.out}/checkpoints")
        d = ckpts[-1]
        meta = json.loads((d / "trainer.json").read_text())
        missing = sorted({"spec", "step", "scheduler"} - set(meta))
        if missing:
            raise ValueError(f"--resume: {d / 'trainer.json'} lacks {', '.join(missing)}")
        if SamSpec.from_dict(meta["spec"]) != self.spec:
            raise ValueError(f"--resume: {d} holds a different model size than the config")
        self.sam.set_state_dict(paddle.load(str(d / "model.pdparams")))
        self.step = int(meta["step"])
        self._apply_stage()  # create the parameter set of the stage before loading moments
        self._set_optimizer_state(paddle.load(str(d / "optimizer.pdopt")))
        self.scheduler.set_state_dict(meta["scheduler"])
        if self.rank == 0 and self.progress:
            print(f"resumed from {d} (step {self.step})")

    # -- the run --

    def evaluate(self) -> dict:
        from .evaluate import evaluate

        if self.val_data is None:
            return {}
        return evaluate(self.sam, self.val_data, self.cfg.data.eval_images, self.progress)

    def export(self, metrics: dict) -> Path:
        """The final weights as a loadable ``model.pdparams`` with its sidecar."""
        dst = self.out / "model.pdparams"
        state = {k: v.numpy() for k, v in self.sam.state_dict().items()}
        meta = sidecar_meta(
            "sam_v1",
            self.cfg.run.model_name or self.cfg.model.type,
            self.spec,
            {"file": None, "sha256": None, "layout": "trained by paddle-sam train"},
            training={"steps": self.step, "world_size": self.world, **metrics},
        )
        save_pdparams(state, dst, meta)
        return dst

    def run(self) -> dict:
        from tqdm import tqdm

        tc = self.cfg.train
        rows = self._read_metrics()
        window: list[dict] = []
        t0 = time.perf_counter()
        bar = tqdm(total=tc.steps, initial=self.step, desc="train", disable=not self.progress)
        final_eval: dict = {}
        while self.step < tc.steps:
            stats = self.train_step()
            window.append(stats)
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.3f}", iou=f"{stats['iou_last']:.3f}")
            log_now = self.step % tc.log_every == 0 or self.step == tc.steps
            eval_now = self.step == tc.steps or (tc.eval_every and self.step % tc.eval_every == 0)
            if log_now or eval_now:
                row = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
                row = {
                    "step": self.step,
                    "lr": row["lr"],
                    "loss": row["loss"],
                    "focal": row["focal"],
                    "dice": row["dice"],
                    "iou_mse": row["iou_mse"],
                    "train_iou_first": row["iou_first"],
                    "train_iou_last": row["iou_last"],
                    "seconds": round(time.perf_counter() - t0, 2),
                }
                window = []
                if eval_now and self.rank == 0:
                    final_eval = self.evaluate()
                    row.update(
                        {
                            k: final_eval.get(k, "")
                            for k in ("miou_1click", "miou_3click", "miou_box")
                        }
                    )
                rows.append(row)
                if self.rank == 0:
                    self._write_metrics(rows)
                self._barrier()
            if self.step % tc.checkpoint_every == 0 or self.step == tc.steps:
                self.save_checkpoint()
        bar.close()
        self._check_ranks_agree()
        result = {"steps": self.step, "eval": final_eval, "skipped": self.skips.summary()}
        if self.rank == 0:
            model = self.export({k: final_eval[k] for k in final_eval})
            (self.out / "eval.json").write_text(json.dumps(final_eval, indent=2) + "\n")
            self._plot(rows)
            result["model"] = str(model)
        self._barrier()
        return result

    def weights_sha256(self) -> str:
        import hashlib

        h = hashlib.sha256()
        for name, v in sorted(self.sam.state_dict().items()):
            h.update(name.encode())
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return h.hexdigest()

    def _check_ranks_agree(self) -> None:
        """Data parallel: every rank must end with the same weights (written to ranks.json)."""
        if self.world == 1:
            return
        hashes: list = []
        paddle.distributed.all_gather_object(hashes, self.weights_sha256())
        agree = len(set(hashes)) == 1
        if self.rank == 0:
            doc = {"world_size": self.world, "weights_sha256": hashes, "agree": agree}
            (self.out / "ranks.json").write_text(json.dumps(doc, indent=2) + "\n")
        if not agree:
            raise RuntimeError(f"data-parallel ranks ended with different weights: {hashes}")

    # -- metrics --

    def _read_metrics(self) -> list[dict]:
        path = self.out / "metrics.csv"
        if not path.is_file():
            return []
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= self.step]
        return rows

    def _write_metrics(self, rows: list[dict]) -> None:
        path = self.out / "metrics.csv"
        tmp = path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=METRIC_FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, path)

    def _plot(self, rows: list[dict]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        def col(key):
            pts = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in ("", None)]
            return [p[0] for p in pts], [p[1] for p in pts]

        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        a.plot(*col("loss"), label="loss (20 focal + dice + IoU MSE)")
        a.set_xlabel("step")
        a.set_yscale("log")
        a.legend()
        b.plot(*col("train_iou_last"), label="train IoU, last round", alpha=0.5)
        for key, name in (
            ("miou_1click", "held-out 1 click"),
            ("miou_3click", "held-out 3 clicks"),
            ("miou_box", "held-out box"),
        ):
            b.plot(*col(key), marker="o", label=name)
        b.set_xlabel("step")
        b.set_ylim(0, 1)
        b.legend()
        fig.tight_layout()
        fig.savefig(self.out / "curves.png", dpi=100)
        plt.close(fig)
