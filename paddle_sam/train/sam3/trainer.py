"""SAM 3 fine-tuning: ``paddle-sam train`` with a ``family: sam3`` config.

Each micro-batch is ``batch_size`` images with all their find queries (every category of the
dataset: the ones present with their instances, the others as negative phrases), through
:func:`~.step.step_loss` (the training forward, the matchers and upstream's roboflow_v100
criterion). The loop (accumulation, data parallel, schedule, checkpoints and exact resume,
metrics, curves) is :class:`~paddle_sam.train.base.TrainerBase`'s.

Images are drawn for the whole data-parallel group at once from ``(seed, step, micro-batch)``
and each process takes its share, so N processes of ``batch_size`` images see exactly the
images of one process with ``N x batch_size``; dropout is seeded from the same draw and the
rank. Parameters: the parts named by ``model.freeze`` stay fixed; the vision backbone learns
at ``lr x vision_lr_scale`` with upstream's layer-wise decay over its blocks, the text encoder
at ``lr x text_lr_scale``; with ``model.lora_rank`` only LoRA adapters train, and the exported
model has them merged into plain weights (the original keys: converter, predictors and export
take it unchanged).
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from ...loading.sam3 import build_sam3_image_model
from ..base import TrainerBase
from ..data import SkipLog
from .config import Sam3Config, model_spec
from .data import ConceptDataset, collate_concepts
from .init import box_prior_init, load_vision_backbone
from .lora import DEFAULT_LORA_TARGETS, apply_lora, merge_lora
from .sam3_loss import build_roboflow_v100_loss
from .step import (
    MODEL_PARTS,
    disable_dropout,
    freeze,
    freeze_batch_norm_statistics,
    step_loss,
)

TRUNK = "backbone.vision_backbone.trunk."
_BLOCK = re.compile(r"\bblocks\.(\d+)\.")


def trunk_layer_id(name: str, num_blocks: int) -> int:
    """Upstream's layer id of a vision-trunk parameter (name relative or full): 0 for the
    patch and position embeddings and the pre-norm (and the convolutional stem, which upstream
    does not have), block i -> i + 1, anything else (relative position tables, the last norm)
    num_blocks + 1."""
    if "rel_pos" in name:
        return num_blocks + 1
    if any(k in name for k in ("ln_pre", "pos_embed", "cls_token", "patch_embed", "stem.")):
        return 0
    m = _BLOCK.search(name)
    return int(m.group(1)) + 1 if m else num_blocks + 1


def lr_scales(model: Any, oc: Any) -> dict[str, float]:
    """Each parameter's learning-rate multiplier (of ``optim.lr``), as upstream's param groups
    set them: text encoder x ``text_lr_scale``; vision backbone x ``vision_lr_scale``, its
    trunk also x ``layer_decay ** (L - layer id)`` (L = blocks + 1; position embeddings x 1)."""
    blocks = getattr(model.backbone.vision_backbone.trunk, "blocks", [])
    top = len(blocks) + 1
    out = {}
    for name, _ in model.named_parameters():
        scale = 1.0
        if name.startswith(MODEL_PARTS["text_encoder"]):
            scale = oc.text_lr_scale
        elif name.startswith(MODEL_PARTS["vision_backbone"]):
            scale = oc.vision_lr_scale
            if name.startswith(TRUNK) and not fnmatch.fnmatchcase(name, "*pos_embed*"):
                scale *= oc.layer_decay ** (top - trunk_layer_id(name, len(blocks)))
        out[name] = scale
    return out


# the denoising queries' main terms, logged when the config turns them on
DENOISE_METRICS = ("loss_ce_dn", "loss_bbox_dn", "loss_giou_dn", "loss_dice_dn")


def _write_concepts(spec: Any) -> Path | None:
    """Write ``spec``'s synthetic concept scenes into its ``path`` unless they are there (its
    ``annotations.json``, written last); None when nothing was written."""
    if spec is None or spec.format != "concepts":
        return None
    if (Path(spec.path) / "annotations.json").is_file():
        return None
    from ..synthetic import write_concept_dataset

    return write_concept_dataset(
        spec.path, spec.num_images, spec.seed, spec.sizes, overwrite=True, styles=spec.styles
    )


class Sam3Trainer(TrainerBase):
    """SAM 3 on concept datasets (:class:`~.config.Sam3Config`)."""

    metric_fields: tuple[str, ...] = (
        "loss_ce",
        "presence_loss",
        "loss_bbox",
        "loss_giou",
        "loss_mask",
        "loss_dice",
        "loss_semantic_seg",
        "loss_semantic_dice",
        "queries",
        "targets",
        "grad_norm",
    )
    eval_fields = ("mask_AP50", "mask_AP", "box_AP50", "box_AP")
    cfg: Sam3Config

    # -- the model --

    def build_model(self):
        cfg = self.cfg
        self.spec = model_spec(cfg.model)  # a checkpoint's from its sidecar, checked
        model = build_sam3_image_model(
            bpe_path=cfg.model.bpe, checkpoint_path=cfg.model.checkpoint, spec=self.spec
        )
        if cfg.model.box_prior_init:
            box_prior_init(model)
        if cfg.model.backbone_init:
            load_vision_backbone(model, cfg.model.backbone_init)
        if cfg.model.freeze:
            freeze(model, *cfg.model.freeze)
        if cfg.model.lora_rank:
            targets = cfg.model.lora_targets or DEFAULT_LORA_TARGETS
            apply_lora(model, cfg.model.lora_rank, cfg.model.lora_alpha, targets=targets)
        params = dict(model.named_parameters())
        for name, scale in lr_scales(model, cfg.optim).items():
            params[name].optimize_attr["learning_rate"] = scale
        if cfg.loss.denoise:
            self.metric_fields = (*type(self).metric_fields, *DENOISE_METRICS)
        self.criterion = build_roboflow_v100_loss(
            with_masks=cfg.data.with_masks,
            o2m_weight=cfg.loss.o2m_weight,
            scale_by_find_batch_size=cfg.loss.scale_by_batch_size,
            semantic_seg=cfg.loss.semantic_seg,
            pad_n_queries=cfg.loss.pad_n_queries,
        )
        return model

    def set_train_mode(self) -> None:
        self.model.train()
        if not self.cfg.model.dropout:
            disable_dropout(self.model)
        freeze_batch_norm_statistics(self.model)

    def optim_parameters(self) -> list[tuple[str, Any]]:
        """The trainable parameters only: what is frozen stays frozen for the whole run, and
        the frozen backbone's moments would double its memory."""
        return [(n, p) for n, p in self.model.named_parameters() if not p.stop_gradient]

    def no_decay(self, named: list[tuple[str, Any]]) -> set[str]:
        """Upstream: no weight decay on biases and LayerNorm parameters."""
        norms = {
            f"{prefix}.{pname}" if prefix else pname
            for prefix, layer in self.model.named_sublayers(include_self=True)
            if isinstance(layer, paddle.nn.LayerNorm)
            for pname, _ in layer.named_parameters(include_sublayers=False)
        }
        return {p.name for n, p in named if n.endswith("bias") or n in norms}

    def spec_dict(self) -> dict:
        return {"spec": self.spec.to_dict(), "lora_rank": self.cfg.model.lora_rank}

    # -- data --

    @classmethod
    def prepare_data(cls, cfg: Any) -> list[Path]:
        """The concept datasets of ``cfg`` (train and val) that are not on disk yet, written."""
        return [p for spec in (cfg.data.train, cfg.data.val) if (p := _write_concepts(spec))]

    def _dataset(self, spec: Any, train: bool) -> ConceptDataset:
        cfg = self.cfg
        path = Path(spec.path)
        if spec.format == "concepts":
            if self.rank == 0:
                _write_concepts(spec)
            self._barrier()
        resolution = int(self.spec.image_size)
        min_size = cfg.data.min_size or min(480, resolution // 2)
        return ConceptDataset(
            path,
            spec.images,
            resolution=resolution,
            train=train,
            min_size=min_size,
            with_masks=cfg.data.with_masks,
            max_negatives=cfg.data.max_negatives if train else None,
            exemplar_prob=cfg.data.exemplar_prob if train else 0.0,
            exemplar_keeps_text=cfg.data.exemplar_keeps_text,
            num_images=spec.num_images if spec.format == "coco" and spec.num_images else None,
            seed=cfg.train.seed,
            skips=self.skips,
        )

    def build_data(self) -> None:
        self.skips = SkipLog()
        self.train_data = self._dataset(self.cfg.data.train, train=True)
        val = self.cfg.data.val
        self.val_data = None if val is None else self._dataset(val, train=False)

    # -- one micro-batch --

    def micro_batch_loss(self, rng: np.random.Generator, n_images: int, micro: int):
        tc, ds = self.cfg.train, self.train_data
        # the data-parallel group's images of this micro-batch, from (seed, step, micro) only
        group = np.random.default_rng([tc.seed, self.step, micro, 1 << 20])
        share = group.integers(ds.num_images, size=tc.batch_size * self.world)
        mine = share[self.rank * tc.batch_size : (self.rank + 1) * tc.batch_size]
        ds.set_epoch(int(group.integers(1 << 30)))
        samples = [ds[q] for i in mine for q in ds.queries(int(i))]
        batch = collate_concepts(samples)
        paddle.seed(int(rng.integers(1 << 31)))  # dropout: a function of (seed, step, micro, rank)
        lc = self.cfg.loss
        core, losses = step_loss(
            self.model,
            batch,
            self.criterion,
            tc.recompute,
            denoise_weight=lc.denoise,
            denoise_box_noise=lc.denoise_box_noise,
            rng=rng,
        )
        weight = tc.batch_size / n_images
        stats = {k: float(v) * weight for k, v in losses.items() if k in self.metric_fields}
        stats["queries"] = len(samples) * weight
        stats["targets"] = sum(len(s.boxes) for s in samples) * weight
        return core * weight, stats

    def postfix(self, stats: dict) -> dict[str, str]:
        return {"loss": f"{stats['loss']:.3f}", "ce": f"{stats.get('loss_ce', 0.0):.3f}"}

    # -- evaluation and export --

    def merged_model(self):
        """The model to evaluate and export: LoRA adapters merged into a copy's weights."""
        if not self.cfg.model.lora_rank:
            return self.model
        import copy

        model = copy.deepcopy(self.model)
        merge_lora(model)
        return model

    def evaluate(self) -> dict:
        if self.val_data is None:
            return {}
        from ...predict.sam3.predictor import Sam3Predictor
        from .evaluate import AP_CONFIDENCE_THRESHOLD, evaluate_concepts

        model = self.merged_model()
        model.eval()
        try:
            res = evaluate_concepts(
                Sam3Predictor(model, confidence_threshold=AP_CONFIDENCE_THRESHOLD),
                self.val_data.ann_path,
                self.val_data.image_dir,
                self.cfg.data.eval_images,
            )
        finally:
            self.set_train_mode()
        return {
            "mask_AP50": res["mask"]["AP50"],
            "mask_AP": res["mask"]["AP"],
            "box_AP50": res["box"]["AP50"],
            "box_AP": res["box"]["AP"],
            "per_concept": res["per_concept"],
        }

    def export(self, metrics: dict) -> Path:
        summary = {k: v for k, v in metrics.items() if k != "per_concept"}
        return self.save_model(
            "sam3",
            self.cfg.run.model_name or "sam3",
            self.merged_model(),
            summary,
            interactive=False,
            # the phrases it was trained on: what commands name when a prompt is not one of them
            vocabulary=sorted(set(self.train_data.categories.values())),
        )

    def plot(self, rows: list[dict]) -> None:
        fig, plt = self._figure(2)
        a, b = fig.axes
        a.plot(*self._col(rows, "loss"), label="loss (roboflow_v100 weights)")
        for key in ("loss_ce", "loss_bbox", "loss_giou", "loss_dice"):
            a.plot(*self._col(rows, key), label=key, alpha=0.6)
        a.set_xlabel("step")
        a.set_yscale("log")
        a.legend()
        for key, name in (("mask_AP50", "held-out mask AP50"), ("box_AP50", "held-out box AP50")):
            b.plot(*self._col(rows, key), marker="o", label=name)
        b.set_xlabel("step")
        b.set_ylim(0, 1)
        b.legend()
        self._save_figure(fig, plt)


__all__ = ["Sam3Trainer", "lr_scales", "trunk_layer_id"]
