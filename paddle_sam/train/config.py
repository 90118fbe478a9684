"""Training run configuration: YAML files under ``configs/``, checked strictly.

A config is nested plain dataclasses. Unknown keys, values of the wrong type and missing
files are errors that name the key, the value and the file. ``--set a.b=value`` overrides
apply on top of the YAML (values parsed as YAML: ``--set optim.lr=3e-4``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A problem in a training config (the message names the key and the file)."""


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
class RunConfig:
    output_dir: str = "runs/default"
    model_name: str | None = None  # model_type written in the final model's sidecar


class ConfigBase:
    """What a family's run config (a dataclass) shares."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass
class Config(ConfigBase):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompts: PromptConfig = field(default_factory=PromptConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; build nested dataclasses."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"{where}: {value!r} does not fit {_type_name(tp)}"
        )
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type {tp}")  # pragma: no cover


def _build(cls, d: dict, where: str):
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(d) - set(hints))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"unknown key {prefix}{unknown[0]}; known keys"
            f"{' of ' + where if where else ''}: {', '.join(sorted(hints))}"
        )
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in d.items()}
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    import yaml

    if "=" not in text:
        raise ConfigError(f"--set needs KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: cannot parse value {raw!r}: {exc}") from None
    return key.strip().split("."), value


def read_raw(path: str | Path | None, overrides: list[str] = ()) -> tuple[dict, str]:
    """A YAML config as a mapping with the ``--set`` overrides applied, and its name."""
    import yaml

    raw: dict = {}
    where = "defaults"
    if path is not None:
        path = Path(path)
        where = str(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    for text in overrides:
        keys, value = parse_override(text)
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text}: {k} is not a section")
        node[keys[-1]] = value
    return raw, where


def build_config(cls, raw: dict, where: str):
    """``cls`` (a config dataclass) from ``raw``, errors prefixed with ``where``."""
    try:
        return _build(cls, raw, "")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


FAMILIES = ("sam_v1", "sam3")


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Any:
    """Read a YAML config (or start from the defaults if ``path`` is None), apply overrides.
    Its top-level ``family`` (``sam_v1`` by default, or ``sam3``) selects the schema: a
    :class:`Config` or a ``sam3.config.Sam3Config``."""
    raw, where = read_raw(path, overrides)
    family = raw.get("family", "sam_v1")
    if family not in FAMILIES:
        raise ConfigError(f"{where}: family = {family!r}: choose from {', '.join(FAMILIES)}")
    if family == "sam3":
        from .sam3.config import Sam3Config, validate_sam3

        cfg = build_config(Sam3Config, raw, where)
        validate_sam3(cfg, where)
        return cfg
    raw.pop("family", None)
    cfg = build_config(Config, raw, where)
    validate(cfg, where)
    return cfg


DECAYS = ("cosine", "linear", "none", "inverse_sqrt")


def check_positive(values: dict[str, float], bad) -> None:
    """Each of ``values`` (key -> value) must be > 0."""
    for key, v in values.items():
        if v <= 0:
            bad(key, v, "must be > 0")


def check_optim(oc: OptimConfig, bad) -> None:
    """The optimizer section's value checks (both families)."""
    if oc.decay not in DECAYS:
        bad("optim.decay", oc.decay, f"choose from {', '.join(DECAYS)}")
    if oc.timescale < 1:
        bad("optim.timescale", oc.timescale, "must be >= 1")
    for key in ("warmup_steps", "cooldown_steps"):
        if getattr(oc, key) < 0:
            bad(f"optim.{key}", getattr(oc, key), "must be >= 0")
    if oc.grad_clip is not None and oc.grad_clip <= 0:
        bad("optim.grad_clip", oc.grad_clip, "must be > 0 (or null: off)")


def validate(cfg: Config, where: str) -> None:
    """Value checks that types cannot express (ranges, choices, files that must exist)."""
    from ..models.sam_v1.build_sam import SAM_SPECS

    def bad(key: str, value, why: str):
        raise ConfigError(f"{where}: {key} = {value!r}: {why}")

    if cfg.model.type not in SAM_SPECS:
        bad("model.type", cfg.model.type, f"choose from {sorted(SAM_SPECS)}")
    if cfg.model.checkpoint is not None and not Path(cfg.model.checkpoint).is_file():
        raise FileNotFoundError(f"{where}: model.checkpoint file not found: {cfg.model.checkpoint}")
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
        elif not Path(spec.path).exists():
            raise FileNotFoundError(f"{where}: data.{name}.path not found: {spec.path}")
    positive = {
        "train.steps": cfg.train.steps,
        "train.batch_size": cfg.train.batch_size,
        "train.grad_accum": cfg.train.grad_accum,
        "train.log_every": cfg.train.log_every,
        "data.masks_per_image": cfg.data.masks_per_image,
        "optim.lr": cfg.optim.lr,
    }
    check_positive(positive, bad)
    if cfg.loss.logit_upsample not in (1, 2, 4):
        bad("loss.logit_upsample", cfg.loss.logit_upsample, "choose from 1, 2, 4")
    check_optim(cfg.optim, bad)
    if not 0 <= cfg.prompts.box_fraction <= 1:
        bad("prompts.box_fraction", cfg.prompts.box_fraction, "must be in [0, 1]")
    if cfg.prompts.correction_rounds < 0:
        bad("prompts.correction_rounds", cfg.prompts.correction_rounds, "must be >= 0")
    if cfg.train.unfreeze_last_blocks < -1:
        bad("train.unfreeze_last_blocks", cfg.train.unfreeze_last_blocks, "-1 (all) or >= 0")
