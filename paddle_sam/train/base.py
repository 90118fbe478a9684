"""What every family's training loop shares: the run folder, the learning-rate schedule,
gradient accumulation and mixed precision, data-parallel gradient averaging, atomic checkpoints
with exact resume, metrics CSV and curves, and the check that all ranks end equal.

A family's trainer (``sam_v1.trainer.Trainer`` for SAM v1, ``sam3.trainer.Sam3Trainer``) subclasses
:class:`TrainerBase` and supplies the model, its data, one micro-batch's loss, evaluation,
export and the metrics it logs. One optimizer step = ``grad_accum`` micro-batches of
``batch_size`` images on each process; under ``python -m paddle.distributed.launch`` gradients
are averaged across processes with ``paddle.distributed.all_reduce`` before every optimizer
step, and batch-norm running statistics (SAM 3's convolutional stem) after it, so all ranks
keep identical weights. Randomness is a pure function of (seed, step,
micro-batch, rank), so a resumed run continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import paddle

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


def lr_factor(step: int, total: int, oc: Any) -> float:
    """The learning rate of optimizer step ``step`` (of ``total``) as a factor of ``oc.lr``:
    linear warm-up over ``oc.warmup_steps``, then ``oc.decay``: ``cosine`` / ``linear`` to
    ``oc.min_lr_ratio``, ``none``, or ``inverse_sqrt`` (upstream SAM 3's schedule:
    ``1 / sqrt((step + timescale - warmup) / timescale)`` after the warm-up, and a linear
    cool-down over the last ``oc.cooldown_steps``)."""
    if oc.decay == "inverse_sqrt":
        # upstream's InverseSquareRootParamScheduler, with ``where`` = step / total
        f = 1.0
        if oc.warmup_steps < step:
            f /= math.sqrt((step + oc.timescale - oc.warmup_steps) / oc.timescale)
        if oc.warmup_steps:
            f *= min(1.0, step / oc.warmup_steps)
        if oc.cooldown_steps:
            f *= min(1.0, (total - step) / oc.cooldown_steps)
        return f
    if oc.warmup_steps and step < oc.warmup_steps:
        return (step + 1) / oc.warmup_steps
    if oc.decay == "none":
        return 1.0
    t = (step - oc.warmup_steps) / max(1, total - oc.warmup_steps)
    t = min(max(t, 0.0), 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * t)) if oc.decay == "cosine" else 1 - t
    return oc.min_lr_ratio + (1 - oc.min_lr_ratio) * shape


class TrainerBase:
    """The loop over a model ``self.model`` built by :meth:`build_model`.

    Subclasses set ``metric_fields`` (the CSV columns after ``step``, ``lr``, ``loss``) and
    implement :meth:`build_model`, :meth:`build_data`, :meth:`micro_batch_loss`,
    :meth:`spec_dict`, :meth:`evaluate`, :meth:`export`; optionally :meth:`apply_stage`
    (which parameters train at this step), :meth:`no_decay`, :meth:`row`, :meth:`plot`,
    :meth:`prepare_data`.
    """

    metric_fields: tuple[str, ...] = ()
    eval_fields: tuple[str, ...] = ()

    @classmethod
    def prepare_data(cls, cfg: Any) -> list[Path]:
        """Write the data a run generates on disk, before any process of it starts (``paddle-sam
        train --nproc N`` calls it once, in the launching process: processes waiting at a
        barrier while one of them writes for minutes time out). Returns what it wrote."""
        return []

    def __init__(
        self,
        cfg: Any,
        resume: bool = False,
        overwrite: bool = False,
        progress: bool = True,
        config_text: str | None = None,
        recipe: str | None = None,
    ) -> None:
        import paddle.distributed as dist

        self.cfg = cfg
        self.recipe = recipe  # the config file the run came from, for the model's sidecar
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

        paddle.seed(cfg.train.seed)
        self.model = self.build_model()
        self.set_train_mode()
        if self.world > 1:  # every rank starts from rank 0's weights
            for p in self.model.parameters():
                dist.broadcast(p, src=0)
        self.build_data()

        oc = cfg.optim
        self.scheduler = paddle.optimizer.lr.LambdaDecay(oc.lr, self._lr_factor)
        named = self.optim_parameters()
        no_decay = self.no_decay(named)
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
        # taken while a part is frozen still holds a complete state (exact resume)
        self.optimizer._create_accumulators(
            paddle.static.default_main_program().global_block(), [p for _, p in named]
        )
        self.scaler = paddle.amp.GradScaler() if self.amp else None
        self.step = 0
        self.stage: Any = None
        if resume:
            self._load_latest()

    # -- what a family supplies --

    def build_model(self) -> paddle.nn.Layer:
        raise NotImplementedError

    def build_data(self) -> None:
        raise NotImplementedError

    def micro_batch_loss(
        self, rng: np.random.Generator, n_images: int, micro: int
    ) -> tuple[Any, dict]:
        """Micro-batch ``micro``'s loss (already divided by ``n_images``, the images of the
        whole optimizer step on this process) and its statistics (each divided likewise);
        ``rng`` is drawn from (seed, step, micro, rank)."""
        raise NotImplementedError

    def set_train_mode(self) -> None:
        """Put the model in training mode (after building it, and after evaluations)."""
        self.model.train()

    def optim_parameters(self) -> list[tuple[str, Any]]:
        """The (name, parameter) pairs the optimizer holds (default: all, so that a part
        frozen in one stage still has its moments in every checkpoint)."""
        return list(self.model.named_parameters())

    def spec_dict(self) -> dict:
        raise NotImplementedError

    def evaluate(self) -> dict:
        return {}

    def export(self, metrics: dict) -> Path:
        raise NotImplementedError

    def save_model(
        self, family: str, model_type: str, model: paddle.nn.Layer, metrics: dict, **extra: Any
    ) -> Path:
        """``model``'s weights as the run's ``model.pdparams`` with its sidecar: ``family``,
        ``model_type``, the run's spec (``self.spec``), ``extra`` fields and the training
        record (:meth:`training_meta` of ``metrics``)."""
        from ..convert.core import save_pdparams, sidecar_meta

        dst = self.out / "model.pdparams"
        state = {k: v.numpy() for k, v in model.state_dict().items()}
        source = {"file": None, "sha256": None, "layout": "trained by paddle-sam train"}
        training = self.training_meta(metrics)
        meta = sidecar_meta(family, model_type, self.spec, source, **extra, training=training)
        save_pdparams(state, dst, meta)
        return dst

    def apply_stage(self) -> None:
        """Set which parameters train from this step on (default: all, set once)."""

    def no_decay(self, named: list[tuple[str, Any]]) -> set[str]:
        """Parameters without weight decay (Paddle tensor names): vectors, embeddings."""
        return {p.name for n, p in named if p.ndim < 2 or "embed" in n or "pos" in n}

    def row(self, mean: dict[str, float]) -> dict[str, Any]:
        """A metrics row from the statistics averaged over the logging window."""
        return {k: mean[k] for k in self.metric_fields if k in mean}

    def postfix(self, stats: dict) -> dict[str, str]:
        return {"loss": f"{stats['loss']:.3f}"}

    def training_meta(self, metrics: dict) -> dict:
        """The sidecar's ``training`` record: the recipe, steps, processes and metrics. A run
        that starts from a model trained by paddle-sam (``model.checkpoint``) continues that
        model's record: ``recipe`` lists every stage and ``total_steps`` counts them all."""
        from ..loading import sniff

        record = {"steps": self.step, "world_size": self.world, **metrics}
        this = f"{self.recipe} ({self.step} steps)" if self.recipe else f"({self.step} steps)"
        start = self.cfg.model.checkpoint
        prior = (sniff(start).meta.get("training") if start else None) or {}
        steps = prior.get("total_steps", prior.get("steps"))
        if not isinstance(steps, int):  # from scratch, or weights trained elsewhere
            return {"recipe": this, **record} if self.recipe else record
        before = prior.get("recipe", f"({steps} steps)")
        before = [before] if isinstance(before, str) else list(before)
        return {"recipe": [*before, this], "total_steps": steps + self.step, **record}

    def plot(self, rows: list[dict]) -> None:
        """Draw ``curves.png`` from the metrics rows (default: the loss)."""
        fig, plt = self._figure(1)
        ax = fig.axes[0]
        ax.plot(*self._col(rows, "loss"), label="loss")
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.legend()
        self._save_figure(fig, plt)

    # -- setup --

    def _prepare_run_dir(self, resume: bool, overwrite: bool, config_text: str | None) -> None:
        """The run folder, by paddle-sam's rule for outputs (:mod:`paddle_sam.predict.outputs`):
        a file of a run's name that paddle-sam did not write is never replaced; an earlier
        run's files only with --resume (continued) or --overwrite (removed)."""
        from ..predict.outputs import check_targets, claim, remove_owned

        out = self.out
        if resume and overwrite:
            raise ValueError("give --resume or --overwrite, not both")
        if self.rank == 0:
            # launch_logs/ is written by paddle.distributed.launch before we start
            if out.exists() and not out.is_dir():
                raise FileExistsError(f"run folder {out} exists and is not a folder")
            present = check_targets(out, RUN_FILES, replace=True)  # the user's files: refused
            if resume and not (out / "checkpoints").is_dir():
                raise FileNotFoundError(f"--resume: no checkpoints in {out}/checkpoints")
            if present and not (resume or overwrite):
                raise FileExistsError(
                    f"run folder {out} holds a run ({', '.join(present)}); pass --resume to "
                    "continue it or --overwrite to start again (removes its checkpoints, "
                    "metrics and model)"
                )
            if overwrite:
                remove_owned(out, RUN_FILES)
            claim(out, RUN_FILES, "train")
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
        return lr_factor(step, self.cfg.train.steps, self.cfg.optim)

    # -- one optimizer step --

    def train_step(self) -> dict:
        tc = self.cfg.train
        self.apply_stage()
        stats: dict[str, float] = {}
        n_images = tc.batch_size * tc.grad_accum
        for micro in range(tc.grad_accum):
            rng = np.random.default_rng([tc.seed, self.step, micro, self.rank])
            with paddle.amp.auto_cast(enable=self.amp, dtype="float16"):
                loss, micro_stats = self.micro_batch_loss(rng, n_images, micro)
            for k, v in micro_stats.items():
                stats[k] = stats.get(k, 0.0) + v
            stats["loss"] = stats.get("loss", 0.0) + float(loss)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
        self._allreduce_grads(stats)
        # the mean over ranks, so every rank stops; with fp16 loss scaling an overflow is the
        # scaler's to skip
        if self.scaler is None and not math.isfinite(stats["loss"]):
            raise ValueError(
                f"step {self.step + 1}: the loss is {stats['loss']} (not finite); stopped before "
                "updating the weights (lower optim.lr, set optim.grad_clip, or check the data)"
            )
        if self.scaler is None and "grad_norm" in self.metric_fields:
            stats["grad_norm"] = self._grad_norm()
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

    def _grad_norm(self) -> float:
        """The global L2 norm of this step's gradients (after averaging, before clipping)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        with paddle.no_grad():
            return float(paddle.sqrt(sum((g.astype("float32") ** 2).sum() for g in grads)))

    def _running_stats(self) -> list:
        """Batch-norm running means and variances: each process updates them from its own
        batch, so they are averaged over processes after every step (as timm's
        ``distribute_bn(reduce=True)``), or the ranks would end with different models."""
        from paddle.nn.layer.norm import _BatchNormBase

        return [
            t
            for layer in self.model.sublayers()
            if isinstance(layer, _BatchNormBase)
            for t in (layer._mean, layer._variance)
        ]

    def _allreduce_grads(self, stats: dict) -> None:
        """Average gradients, batch-norm running statistics (:meth:`_running_stats`) and the
        logged statistics over processes, one fused buffer."""
        if self.world == 1:
            return
        import paddle.distributed as dist

        params = [p for p in self.model.parameters() if not p.stop_gradient]
        has = paddle.to_tensor([float(p.grad is not None) for p in params])
        dist.all_reduce(has)
        used = [p for p, h in zip(params, has.numpy(), strict=True) if h > 0]
        for p in used:
            if p.grad is None:  # this rank's batch never reached it; others' did
                p._set_grad_ivar(paddle.zeros_like(p))
        running = self._running_stats()
        keys = sorted(stats)
        flat = paddle.concat(
            [p.grad.reshape([-1]) for p in used]
            + [t.reshape([-1]).astype("float32") for t in running]
            + [paddle.to_tensor([stats[k] for k in keys], "float32")]
        )
        dist.all_reduce(flat)
        flat = flat / self.world
        offset = 0
        for p in used:
            n = int(np.prod(p.shape))
            p.grad.set_value(flat[offset : offset + n].reshape(p.shape))
            offset += n
        with paddle.no_grad():
            for t in running:
                n = int(np.prod(t.shape))
                t.set_value(flat[offset : offset + n].reshape(t.shape).astype(t.dtype))
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
            paddle.save(self.model.state_dict(), str(tmp / "model.pdparams"))
            paddle.save(self._optimizer_state(), str(tmp / "optimizer.pdopt"))
            meta = {
                "step": self.step,
                "world_size": self.world,
                "spec": self.spec_dict(),
                "scheduler": self.scheduler.state_dict(),
            }
            (tmp / "trainer.json").write_text(json.dumps(meta, indent=2) + "\n")
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
        names = {p.name: n for n, p in self.optim_parameters()}
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
        names = {n: p.name for n, p in self.optim_parameters()}
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
        if meta["spec"] != json.loads(json.dumps(self.spec_dict())):
            raise ValueError(f"--resume: {d} holds a different model size than the config")
        self.model.set_state_dict(paddle.load(str(d / "model.pdparams")))
        self.step = int(meta["step"])
        self.apply_stage()  # create the parameter set of the stage before loading moments
        self._set_optimizer_state(paddle.load(str(d / "optimizer.pdopt")))
        self.scheduler.set_state_dict(meta["scheduler"])
        if self.rank == 0 and self.progress:
            print(f"resumed from {d} (step {self.step})")

    # -- the run --

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
            bar.set_postfix(**self.postfix(stats))
            log_now = self.step % tc.log_every == 0 or self.step == tc.steps
            eval_now = self.step == tc.steps or (tc.eval_every and self.step % tc.eval_every == 0)
            if log_now or eval_now:
                mean = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
                row = {
                    "step": self.step,
                    "lr": mean["lr"],
                    "loss": mean["loss"],
                    **self.row(mean),
                    "seconds": round(time.perf_counter() - t0, 2),
                }
                window = []
                if eval_now:
                    # every process evaluates (the same work, in the same time): a process
                    # left waiting at the barrier below while another evaluates alone fails
                    # there (gloo's transport gives up after about half a minute)
                    final_eval = self.evaluate()
                    row.update({k: final_eval.get(k, "") for k in self.eval_fields})
                rows.append(row)
                if self.rank == 0:
                    self._write_metrics(rows)
                self._barrier()
            if self.step % tc.checkpoint_every == 0 or self.step == tc.steps:
                self.save_checkpoint()
        bar.close()
        self._check_ranks_agree()
        result = {"steps": self.step, "eval": final_eval, "skipped": self.skipped()}
        if self.rank == 0:
            model = self.export(dict(final_eval))
            (self.out / "eval.json").write_text(json.dumps(final_eval, indent=2) + "\n")
            self.plot(rows)
            result["model"] = str(model)
        self._barrier()
        return result

    def skipped(self) -> str:
        skips = getattr(self, "skips", None)
        return skips.summary() if skips is not None else "nothing skipped"

    def weights_sha256(self) -> dict[str, str]:
        """The SHA-256 of every tensor of the model's state, by name."""
        import hashlib

        return {
            name: hashlib.sha256(np.ascontiguousarray(v.numpy()).tobytes()).hexdigest()
            for name, v in self.model.state_dict().items()
        }

    def _check_ranks_agree(self) -> None:
        """Data parallel: every rank must end with the same weights (written to ranks.json)."""
        if self.world == 1:
            return
        import hashlib

        per_rank: list = []
        paddle.distributed.all_gather_object(per_rank, self.weights_sha256())
        differ = sorted(k for k in per_rank[0] if len({r.get(k) for r in per_rank}) > 1)
        if self.rank == 0:
            whole = [
                hashlib.sha256("".join(f"{k}:{r[k]}" for k in sorted(r)).encode()).hexdigest()
                for r in per_rank
            ]
            doc = {
                "world_size": self.world,
                "weights_sha256": whole,
                "agree": not differ,
                "tensors_that_differ": differ,
            }
            (self.out / "ranks.json").write_text(json.dumps(doc, indent=2) + "\n")
        if differ:
            more = f" and {len(differ) - 8} more" if len(differ) > 8 else ""
            shown = ", ".join(differ[:8]) + more
            raise RuntimeError(
                f"data-parallel ranks ended with different weights in {len(differ)} of "
                f"{len(per_rank[0])} tensors: {shown} (listed in {self.out / 'ranks.json'})"
            )

    # -- metrics --

    @property
    def all_fields(self) -> list[str]:
        return ["step", "lr", "loss", *self.metric_fields, "seconds", *self.eval_fields]

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
            w = csv.DictWriter(f, fieldnames=self.all_fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, path)

    @staticmethod
    def _col(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
        pts = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in ("", None)]
        return [p[0] for p in pts], [p[1] for p in pts]

    @staticmethod
    def _figure(n: int):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, _ = plt.subplots(1, n, figsize=(5 * n, 4))
        return fig, plt

    def _save_figure(self, fig, plt) -> None:
        fig.tight_layout()
        fig.savefig(self.out / "curves.png", dpi=100)
        plt.close(fig)


__all__ = ["RUN_FILES", "TrainerBase", "lr_factor"]
