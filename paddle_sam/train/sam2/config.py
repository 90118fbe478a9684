"""SAM 2 run configuration (``family: sam2`` in a YAML under ``configs/``): the video tracker
trained on synthetic clips (:mod:`..clips`), checked as strictly as the other families'.

The loss weights are upstream's SAM 2.1 training recipe (mask focal 20, dice 1, IoU 1 as an L1
distance, object score 1); each clip's objects are prompted on the first frame with a click, a
box or their mask, then tracked through the following frames from their memories, and every
frame is supervised.
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
from ..sam_v1.config import OptimConfig


@dataclass
class Sam2ModelConfig:
    type: str = "sam2.1_hiera_tiny"  # a name in SAM2_SPECS, the sizes ``spec`` changes
    spec: dict[str, Any] = field(default_factory=dict)  # Sam2Spec fields over the type's
    checkpoint: str | None = None  # initial weights (a .pdparams of this spec); None = random
    # from scratch: the SAM decoder's attention starts with keys equal to queries (as SAM v1's
    # tiny model: a prompt point first attends to its own location)
    tied_qk_init: bool = False
    # a SAM v1 model (.pdparams with its sidecar) of the same hidden width and input size: a
    # model started from scratch takes its prompt encoder and mask decoder (where the layouts
    # are the same), and its image encoder is the teacher of ``loss.distill_weight``
    teacher: str | None = None


@dataclass
class ClipSpec:
    """Synthetic clips (``train.clips.synthetic_clip``): ``num_clips`` of ``seed`` (0: a new
    clip at every step), ``num_frames`` each, drawn at one of ``sizes`` ([[w, h], ...])."""

    seed: int = 0
    num_clips: int = 0
    num_frames: int = 6
    sizes: list[list[int]] | None = None


@dataclass
class Sam2DataConfig:
    train: ClipSpec = field(default_factory=ClipSpec)
    val: ClipSpec | None = None
    max_objects: int = 3  # objects tracked per clip (the batch of the heads)
    min_area: int = 64  # pixels on the first frame for an object to be prompted
    eval_clips: int = 20


@dataclass
class Sam2PromptConfig:
    point_prob: float = 0.5  # the first frame's prompt: one click ...
    box_prob: float = 0.3  # ... a box (with noise) ...; otherwise the object's mask
    box_noise: float = 0.1  # std of the box noise, relative to the box side
    correction_prob: float = 0.3  # share of clips with a correction click on a later frame


@dataclass
class Sam2LossConfig:
    focal_weight: float = 20.0
    dice_weight: float = 1.0
    iou_weight: float = 1.0
    object_weight: float = 1.0
    focal_alpha: float = 0.25
    focal_gamma: float = 2.0
    # mean squared distance between the image features the SAM heads read (the neck's coarsest
    # level) and ``model.teacher``'s image embedding of the same frames (feature distillation,
    # as MobileSAM's encoder is trained); 0: off
    distill_weight: float = 0.0


@dataclass
class Sam2TrainConfig:
    steps: int = 1000  # optimizer steps
    batch_size: int = 1  # clips per micro-batch (one: a clip's objects are the heads' batch)
    grad_accum: int = 1  # clips per optimizer step
    amp: bool = False
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    threads: int | None = None


@dataclass
class Sam2Config(ConfigBase):
    family: str = "sam2"
    model: Sam2ModelConfig = field(default_factory=Sam2ModelConfig)
    data: Sam2DataConfig = field(default_factory=Sam2DataConfig)
    prompts: Sam2PromptConfig = field(default_factory=Sam2PromptConfig)
    loss: Sam2LossConfig = field(default_factory=Sam2LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: Sam2TrainConfig = field(default_factory=Sam2TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)


def model_spec(model: Sam2ModelConfig) -> Any:
    """The run's ``Sam2Spec``: ``model.type``'s with ``model.spec`` over it."""
    from ...models.sam2.build_sam import SAM2_SPECS, Sam2Spec

    return Sam2Spec.from_dict({**SAM2_SPECS[model.type].to_dict(), **model.spec})


def validate_sam2(cfg: Sam2Config, where: str) -> None:
    """Value checks that types cannot express; the values are finite already."""
    from ...models.sam2.build_sam import SAM2_SPECS

    bad = functools.partial(refuse, where)
    if cfg.model.type not in SAM2_SPECS:
        bad("model.type", cfg.model.type, f"choose from {sorted(SAM2_SPECS)}")
    try:
        model_spec(cfg.model)
    except (TypeError, ValueError) as exc:
        bad("model.spec", cfg.model.spec, str(exc))
    check_path("model.checkpoint", cfg.model.checkpoint, where)
    check_path("model.teacher", cfg.model.teacher, where)
    if cfg.loss.distill_weight > 0 and cfg.model.teacher is None:
        bad("loss.distill_weight", cfg.loss.distill_weight, "needs model.teacher (a SAM v1 model)")
    for name in ("train", "val"):
        spec = getattr(cfg.data, name)
        if spec is None:
            continue
        check_at_least(
            {f"data.{name}.seed": spec.seed, f"data.{name}.num_clips": spec.num_clips}, 0, bad
        )
        # training clips of one frame are a prompted-frame stage (no tracking); judging a
        # tracker needs frames to track
        least = 1 if name == "train" else 2
        if spec.num_frames < least:
            why = "a prompted frame" if least == 1 else "a prompted frame, then tracking"
            bad(f"data.{name}.num_frames", spec.num_frames, f"must be >= {least} ({why})")
        check_sizes(f"data.{name}.sizes", spec.sizes, bad)
    check_positive(
        {
            "data.max_objects": cfg.data.max_objects,
            "data.min_area": cfg.data.min_area,
            "data.eval_clips": cfg.data.eval_clips,
        },
        bad,
    )
    check_fraction(
        {
            "prompts.point_prob": cfg.prompts.point_prob,
            "prompts.box_prob": cfg.prompts.box_prob,
            "prompts.correction_prob": cfg.prompts.correction_prob,
        },
        bad,
    )
    if cfg.prompts.point_prob + cfg.prompts.box_prob > 1:
        bad(
            "prompts.box_prob",
            cfg.prompts.box_prob,
            f"point_prob + box_prob must be <= 1 (the rest are mask prompts), got "
            f"{cfg.prompts.point_prob} + {cfg.prompts.box_prob}",
        )
    check_at_least({"prompts.box_noise": cfg.prompts.box_noise}, 0, bad)
    check_at_least(
        {
            f"loss.{k}": getattr(cfg.loss, k)
            for k in (
                "focal_weight",
                "dice_weight",
                "iou_weight",
                "object_weight",
                "focal_gamma",
                "distill_weight",
            )
        },
        0,
        bad,
    )
    if cfg.loss.focal_alpha != -1 and not 0 <= cfg.loss.focal_alpha <= 1:
        bad("loss.focal_alpha", cfg.loss.focal_alpha, "must be in [0, 1] (or -1: none)")
    check_train(cfg.train, bad)
    if cfg.train.batch_size != 1:
        bad("train.batch_size", cfg.train.batch_size, "must be 1 (more clips: train.grad_accum)")
    if cfg.model.tied_qk_init and cfg.model.checkpoint is not None:
        bad("model.tied_qk_init", True, "initialises a model trained from scratch only")
    check_optim(cfg.optim, bad)
