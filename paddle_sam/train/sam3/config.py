"""SAM 3 run configuration (``family: sam3`` in a YAML under ``configs/``), checked as strictly
as SAM v1's: unknown keys, wrong types and missing files are errors naming the key and file.

The defaults are upstream's roboflow_v100 fine-tuning recipe: AdamW with the transformer at
8e-5, the vision backbone at 2.5e-5 with layer-wise decay 0.9 over its blocks, the text encoder
at 5e-6, weight decay 0.1 (none on biases and LayerNorms), gradient clipping at 0.1, the
inverse-square-root schedule (time scale, warm-up and cool-down 20 steps), the loss weights of
:func:`~.sam3_loss.build_roboflow_v100_loss`.
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

FREEZABLE = ("vision_backbone", "text_encoder")


@dataclass
class Sam3DataSpec:
    """One dataset: ``coco`` (a COCO JSON file, or a Roboflow split folder with
    ``_annotations.coco.json``; category names are the prompts) or ``concepts`` (synthetic
    concept scenes written into ``path`` on first use: ``num_images`` of ``seed``)."""

    format: str = "concepts"
    path: str | None = None
    images: str | None = None  # coco: the image folder (default: beside the JSON)
    num_images: int = 0  # concepts: scenes to write; coco: the first N images (0: all)
    seed: int = 0
    sizes: list[list[int]] | None = None  # concepts: [[width, height], ...]
    # concepts: drawing styles picked at random (train.synthetic.CONCEPT_STYLES); None: "flat"
    styles: list[str] | None = None


@dataclass
class Sam3ModelConfig:
    checkpoint: str | None = None  # sam3.pt or a .pdparams; None = random initialisation
    # Sam3Spec fields over the released sizes, or over the checkpoint's where one is given
    # (then only those that keep its weights' shapes, e.g. image_size)
    spec: dict[str, Any] = field(default_factory=dict)
    bpe: str | None = None  # the tokenizer's vocabulary (default: the bundled one)
    freeze: list[str] = field(default_factory=lambda: ["vision_backbone", "text_encoder"])
    lora_rank: int = 0  # > 0: LoRA adapters (merged into plain weights on export)
    lora_alpha: float = 16.0
    lora_targets: list[str] | None = None  # name patterns (default: attention and MLP layers)
    dropout: bool = True  # upstream trains with dropout 0.1; false: deterministic steps
    # from scratch only: reference boxes on a grid and a decoder attention bias that keeps
    # each query inside its reference box (train/sam3/init.py); random ones leave every query
    # looking at the whole image and the box and mask losses on a plateau
    box_prior_init: bool = False
    # a .pdparams whose backbone.vision_backbone.* tensors start the vision backbone (e.g. one
    # pretrained on dense labels by `python -m paddle_sam.train.sam3.pretrain`); None: as above
    backbone_init: str | None = None


@dataclass
class Sam3DataConfig:
    train: Sam3DataSpec = field(default_factory=Sam3DataSpec)
    val: Sam3DataSpec | None = None
    min_size: int | None = None  # random resize's smallest side (default: min(480, R / 2))
    max_negatives: int | None = None  # negative phrases per image (None: every absent one)
    # upstream's TextQueryToVisual: this share of positive queries get one target's (jittered)
    # box as an exemplar prompt instead of their text (training only; the roboflow configs: 0)
    exemplar_prob: float = 0.0
    exemplar_keeps_text: bool = False  # the exemplar joins the text instead of replacing it
    with_masks: bool = True  # mask losses (False: boxes only, for detection datasets)
    eval_images: int = 50


@dataclass
class Sam3OptimConfig:
    lr: float = 8e-5  # the transformer, heads and everything not named below
    vision_lr_scale: float = 0.3125  # vision backbone: lr x this (2.5e-5)
    text_lr_scale: float = 0.0625  # text encoder: lr x this (5e-6)
    layer_decay: float = 0.9  # vision trunk block i of n: x layer_decay ** (n + 1 - i)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.999
    warmup_steps: int = 20
    decay: str = "inverse_sqrt"
    timescale: int = 20
    cooldown_steps: int = 20
    min_lr_ratio: float = 0.0  # cosine / linear only
    grad_clip: float | None = 0.1


@dataclass
class Sam3LossConfig:
    o2m_weight: float = 2.0  # the one-to-many branch's weight
    # upstream multiplies the loss by sqrt(queries in the batch); false: N data-parallel
    # processes then give exactly the step of one process with their batches together
    scale_by_batch_size: bool = True
    # the roboflow_v100 segmentation variant's semantic-map loss (SemanticSegCriterion, weights
    # 20 / 30): dense supervision of where each query's concept is; needs data.with_masks
    semantic_seg: bool = False
    # denoising queries (train/sam3/denoise.py; DN-DETR with DINO's negatives, not upstream):
    # the weight of their terms (0: off) and the box noise, a fraction of half the box's size
    denoise: float = 0.0
    denoise_box_noise: float = 0.5
    # the classification loss (IABCEMdetr) is a sum over the queries divided by this many per
    # prompt: upstream's 200, its own query count; a model with fewer queries then weighs its
    # scores that much less against its boxes and masks (null: divide by the model's queries)
    pad_n_queries: int | None = 200


@dataclass
class Sam3TrainConfig:
    steps: int = 1000
    batch_size: int = 1  # images per micro-batch, per process (each with all its queries)
    grad_accum: int = 1
    amp: bool = False
    # the fusion encoder's activations recomputed in the backward pass (upstream's setting):
    # the same gradients, and memory for more than one query per image at full size
    recompute: bool = True
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    threads: int | None = None


@dataclass
class Sam3Config(ConfigBase):
    family: str = "sam3"
    model: Sam3ModelConfig = field(default_factory=Sam3ModelConfig)
    data: Sam3DataConfig = field(default_factory=Sam3DataConfig)
    loss: Sam3LossConfig = field(default_factory=Sam3LossConfig)
    optim: Sam3OptimConfig = field(default_factory=Sam3OptimConfig)
    train: Sam3TrainConfig = field(default_factory=Sam3TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)


def model_spec(model: Sam3ModelConfig) -> Any:
    """The sizes of the model a run trains: from scratch ``model.spec`` over the released
    ones; from a checkpoint its sidecar's (checked against its weights), with ``model.spec``'s
    keys over them (e.g. ``image_size``: fine-tuning at another resolution). A bad value is a
    ``ValueError`` naming it."""
    from ...loading.sam3 import sam3_spec
    from ...models.sam3.build_sam3 import SAM3_SPEC, Sam3Spec

    if model.checkpoint is None:
        base = SAM3_SPEC
    else:
        base = sam3_spec(model.checkpoint, enable_inst_interactivity=False)
    if not model.spec:
        return base
    return Sam3Spec.from_dict({**base.to_dict(), **model.spec})


def validate_sam3(cfg: Sam3Config, where: str) -> None:
    """Value checks that types cannot express; the values are finite already
    (``config.checked``)."""
    from ...models.sam3.build_sam3 import SAM3_SPEC, Sam3Spec

    bad = functools.partial(refuse, where)
    check_path("model.checkpoint", cfg.model.checkpoint, where)
    if cfg.model.checkpoint is None:
        try:
            Sam3Spec.from_dict({**SAM3_SPEC.to_dict(), **cfg.model.spec})
        except ValueError as exc:
            bad("model.spec", cfg.model.spec, str(exc))
    elif cfg.model.spec:
        from ...convert.sam3 import expected_layout

        base = model_spec(Sam3ModelConfig(checkpoint=cfg.model.checkpoint))
        try:
            spec = model_spec(cfg.model)
        except ValueError as exc:
            bad("model.spec", cfg.model.spec, str(exc))
        if expected_layout(spec) != expected_layout(base):
            bad(
                "model.spec",
                cfg.model.spec,
                f"changes the shapes of {cfg.model.checkpoint}'s weights: from a checkpoint only "
                "sizes that keep them can change (e.g. image_size)",
            )
    for part in cfg.model.freeze:
        if part not in FREEZABLE:
            bad("model.freeze", part, f"choose from {', '.join(FREEZABLE)}")
    if cfg.model.box_prior_init and cfg.model.checkpoint is not None:
        bad("model.box_prior_init", True, "initialises a model trained from scratch only")
    if cfg.loss.denoise < 0:
        bad("loss.denoise", cfg.loss.denoise, "must be >= 0 (0: no denoising queries)")
    if not 0 < cfg.loss.denoise_box_noise <= 1:
        bad("loss.denoise_box_noise", cfg.loss.denoise_box_noise, "must be in (0, 1]")
    if cfg.loss.pad_n_queries is not None and cfg.loss.pad_n_queries < 1:
        bad(
            "loss.pad_n_queries", cfg.loss.pad_n_queries, "must be >= 1 (null: the model's queries)"
        )
    if cfg.loss.semantic_seg and not cfg.data.with_masks:
        bad("loss.semantic_seg", True, "needs masks (data.with_masks: true)")
    if cfg.model.lora_rank < 0:
        bad("model.lora_rank", cfg.model.lora_rank, "must be >= 0 (0: no LoRA)")
    for name in ("train", "val"):
        spec = getattr(cfg.data, name)
        if spec is None:
            continue
        if spec.format not in ("coco", "concepts"):
            bad(f"data.{name}.format", spec.format, "choose from coco, concepts")
        if not spec.path:
            bad(f"data.{name}.path", spec.path, "a dataset needs a path")
        if spec.format == "concepts" and spec.num_images < 1:
            bad(f"data.{name}.num_images", spec.num_images, "must be >= 1 for concept scenes")
        if spec.format == "coco":
            check_path(f"data.{name}.path", spec.path, where, kind="path")
        check_at_least({f"data.{name}.num_images": spec.num_images}, 0, bad)
        check_at_least({f"data.{name}.seed": spec.seed}, 0, bad)
        check_sizes(f"data.{name}.sizes", spec.sizes, bad)
    check_train(cfg.train, bad)
    check_positive({"data.eval_images": cfg.data.eval_images}, bad)
    check_at_least({"data.min_size": cfg.data.min_size}, 1, bad)
    check_at_least({"data.max_negatives": cfg.data.max_negatives}, 0, bad)
    check_fraction({"data.exemplar_prob": cfg.data.exemplar_prob}, bad)
    check_positive({"model.lora_alpha": cfg.model.lora_alpha}, bad)
    check_at_least({"loss.o2m_weight": cfg.loss.o2m_weight}, 0, bad)
    if not 0 < cfg.optim.layer_decay <= 1:
        bad("optim.layer_decay", cfg.optim.layer_decay, "must be in (0, 1]")
    check_optim(cfg.optim, bad)
    check_at_least(
        {
            "optim.vision_lr_scale": cfg.optim.vision_lr_scale,
            "optim.text_lr_scale": cfg.optim.text_lr_scale,
        },
        0,
        bad,
    )


__all__ = [
    "FREEZABLE",
    "Sam3Config",
    "Sam3DataConfig",
    "Sam3DataSpec",
    "Sam3LossConfig",
    "Sam3ModelConfig",
    "Sam3OptimConfig",
    "Sam3TrainConfig",
    "model_spec",
    "validate_sam3",
]
