"""Training run configuration machinery both families share: YAML files under ``configs/``,
checked strictly.

A config is nested plain dataclasses (each family's schema: ``sam_v1.config.Config``,
``sam3.config.Sam3Config``; :func:`~paddle_sam.train.families.load_config` picks one by the
file's ``family``). Unknown keys, values of the wrong type and missing files are errors that
name the key, the value and the file. ``--set a.b=value`` overrides apply on top of the YAML
(values parsed as YAML: ``--set optim.lr=3e-4``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A problem in a training config (the message names the key and the file)."""


@dataclass
class RunConfig:
    output_dir: str = "runs/default"
    model_name: str | None = None  # model_type written in the final model's sidecar


class ConfigBase:
    """What a family's run config (a dataclass) shares."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


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


DECAYS = ("cosine", "linear", "none", "inverse_sqrt")


def check_positive(values: dict[str, float], bad) -> None:
    """Each of ``values`` (key -> value) must be > 0."""
    for key, v in values.items():
        if v <= 0:
            bad(key, v, "must be > 0")


def check_optim(oc: Any, bad) -> None:
    """The optimizer section's value checks (both families: an ``OptimConfig`` or a
    ``Sam3OptimConfig``)."""
    if oc.decay not in DECAYS:
        bad("optim.decay", oc.decay, f"choose from {', '.join(DECAYS)}")
    if oc.timescale < 1:
        bad("optim.timescale", oc.timescale, "must be >= 1")
    for key in ("warmup_steps", "cooldown_steps"):
        if getattr(oc, key) < 0:
            bad(f"optim.{key}", getattr(oc, key), "must be >= 0")
    if oc.grad_clip is not None and oc.grad_clip <= 0:
        bad("optim.grad_clip", oc.grad_clip, "must be > 0 (or null: off)")
