"""SAM v1's run configuration (a YAML under ``configs/`` without ``family``, or with
``family: sam_v1``): the schema and its value checks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from ..config import (
    ConfigBase,
    RunConfig,
    check_at_least,
    check_fraction,
    check_optim,
    check_path,
    check_positive,
    check_sizes,
    check_train,
    refuse,
)


@dataclass
class DataSpec:
    """One dataset: ``format`` coco / sa1b / folder (with ``path``) or synthetic."""

    format: str = "synthetic"
    path: str | None = None
    images: str | None = None  # COCO image folder (default: images/ next to the JSON)
    num_images: int = 0  # synthetic only
    seed: int = 0  # synthetic only
    sizes: list[list[int]] | None = None  # synthetic only: [[width, height], ...]


@dataclass
class ModelConfig:
    type: str = "vit_b"  # a name in paddle_sam.SAM_SPECS
    spec: dict[str, Any] = field(default_factory=dict)  # SamSpec fields overriding the type's
    checkpoint: str | None = None  # initial weights; None = random initialisation
    # from scratch only: start every mask-decoder attention with its key projection equal to
    # its query projection, so attention starts as a positional-encoding similarity (a prompt
    # point attends to its own location) instead of a random bilinear form; with random q/k
    # the decoder sits for hundreds of steps predicting empty masks before it uses the prompt
    tied_qk_init: bool = False


@dataclass
class DataConfig:
    train: DataSpec = field(default_factory=DataSpec)
    val: DataSpec | None = None
    masks_per_image: int = 8
    eval_images: int = 50  # held-out images used by each evaluation
    hflip: bool = True


@dataclass
class PromptConfig:
    box_fraction: float = 0.5  # share of prompts that start from a box instead of a point
    box_noise: float = 0.1  # std of the box noise, relative to the box side
    box_max_noise: float = 20.0  # pixels (in the resized frame)
    correction_rounds: int = 2  # extra clicks from the error region, previous logits fed back


@dataclass
class LossConfig:
    focal_weight: float = 20.0
    dice_weight: float = 1.0
    iou_weight: float = 1.0
    focal_alpha: float = 0.25  # weight of positives in the focal loss; -1: none
    focal_gamma: float = 2.0
    # loss resolution: the low-res logits (4 x the embedding grid) upsampled by this factor;
    # 4 = the encoder input size (as SAM), 2 is 4x cheaper
    logit_upsample: int = 4


@dataclass
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.999
    warmup_steps: int = 100
    decay: str = "cosine"  # cosine, linear, none (after warm-up) or inverse_sqrt (SAM 3's)
    timescale: int = 20  # inverse_sqrt: lr / sqrt((step + timescale - warmup) / timescale)
    cooldown_steps: int = 0  # inverse_sqrt: linear decay to 0 over the last N steps
    min_lr_ratio: float = 0.05
    grad_clip: float | None = 1.0  # global norm; None = off
    encoder_lr_scale: float = 0.1  # stage 2: unfrozen encoder blocks learn at lr * this


@dataclass
class TrainConfig:
    steps: int = 1000  # optimizer steps
    batch_size: int = 1  # images per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer step
    freeze_encoder_steps: int = 1000  # stage 1: image encoder frozen for this many steps
    unfreeze_last_blocks: int = 2  # stage 2: train the last N encoder blocks (+ neck); -1: all
    amp: bool = False  # float16 autocast where the device supports it (never on CPU)
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    threads: int | None = None


@dataclass
class Config(ConfigBase):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompts: PromptConfig = field(default_factory=PromptConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)


def validate(cfg: Config, where: str) -> None:
    """Value checks that types cannot express (ranges, choices, files that must exist); the
    values are finite already (``config.checked``)."""
    from ...models.sam_v1.build_sam import SAM_SPECS

    bad = functools.partial(refuse, where)
    if cfg.model.type not in SAM_SPECS:
        bad("model.type", cfg.model.type, f"choose from {sorted(SAM_SPECS)}")
    check_path("model.checkpoint", cfg.model.checkpoint, where)
    for name in ("train", "val"):
        spec = getattr(cfg.data, name)
        if spec is None:
            continue
        if spec.format not in ("coco", "sa1b", "folder", "synthetic"):
            bad(f"data.{name}.format", spec.format, "choose from coco, sa1b, folder, synthetic")
        if spec.format == "synthetic":
            if spec.num_images < 1:
                bad(f"data.{name}.num_images", spec.num_images, "must be >= 1 for synthetic data")
        elif not spec.path:
            bad(f"data.{name}.path", spec.path, f"a {spec.format} dataset needs a path")
        else:
            check_path(f"data.{name}.path", spec.path, where, kind="path")
        check_at_least({f"data.{name}.num_images": spec.num_images}, 0, bad)
        check_at_least({f"data.{name}.seed": spec.seed}, 0, bad)
        check_sizes(f"data.{name}.sizes", spec.sizes, bad)
    check_positive(
        {
            "data.masks_per_image": cfg.data.masks_per_image,
            "data.eval_images": cfg.data.eval_images,
        },
        bad,
    )
    check_train(cfg.train, bad)
    check_at_least({"train.freeze_encoder_steps": cfg.train.freeze_encoder_steps}, 0, bad)
    if cfg.loss.logit_upsample not in (1, 2, 4):
        bad("loss.logit_upsample", cfg.loss.logit_upsample, "choose from 1, 2, 4")
    check_at_least(
        {
            f"loss.{k}": getattr(cfg.loss, k)
            for k in ("focal_weight", "dice_weight", "iou_weight", "focal_gamma")
        },
        0,
        bad,
    )
    if cfg.loss.focal_alpha != -1 and not 0 <= cfg.loss.focal_alpha <= 1:
        bad("loss.focal_alpha", cfg.loss.focal_alpha, "must be in [0, 1] (or -1: none)")
    check_optim(cfg.optim, bad)
    check_at_least({"optim.encoder_lr_scale": cfg.optim.encoder_lr_scale}, 0, bad)
    check_fraction({"prompts.box_fraction": cfg.prompts.box_fraction}, bad)
    check_at_least(
        {
            "prompts.box_noise": cfg.prompts.box_noise,
            "prompts.box_max_noise": cfg.prompts.box_max_noise,
            "prompts.correction_rounds": cfg.prompts.correction_rounds,
        },
        0,
        bad,
    )
    if cfg.train.unfreeze_last_blocks < -1:
        bad("train.unfreeze_last_blocks", cfg.train.unfreeze_last_blocks, "-1 (all) or >= 0")
