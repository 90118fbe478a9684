"""Training run configuration machinery both families share: YAML files under ``configs/``,
checked strictly.

A config is nested plain dataclasses (each family's schema: ``sam_v1.config.Config``,
``sam3.config.Sam3Config``; :func:`~paddle_sam.train.families.load_config` picks one by the
file's ``family``). Unknown keys, values of the wrong type and missing files are errors that
name the key, the value and the file. ``--set a.b=value`` overrides apply on top of the YAML
(values parsed as YAML: ``--set optim.lr=3e-4``).

Every value, from the file or from ``--set``, passes one checker (:func:`checked`) before the
schema sees it: YAML is read by a bounded loader (at most :data:`MAX_ALIASES` aliases,
:data:`MAX_DEPTH` levels of nesting and :data:`MAX_NODES` values with aliases expanded, so an
alias bomb or a deeply nested file is refused before it takes memory or the stack), numbers
must be finite and fit 64 bits, and every error message shows values cut to
:data:`SHOWN_CHARS` characters (:func:`shown`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

MAX_CONFIG_BYTES = 1 << 20  # a run config is a few hundred bytes
MAX_DEPTH = 32  # levels of nesting (the schemas use five)
MAX_NODES = 100_000  # values in one document, aliases expanded
MAX_ALIASES = 100  # uses of YAML aliases (*name) in one document
MAX_INT = 2**63 - 1  # integers beyond 64 bits are no setting
SHOWN_CHARS = 80  # values in error messages are cut to this many characters

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
# decimal and sign-exponent floats without a dot (1e-4, 3E5), YAML 1.2's, that YAML 1.1 reads
# as text: --set optim.lr=3e-4 is a number
_EXP_FLOAT = r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"


class ConfigError(ValueError):
    """A problem in a training config (the message names the key and the file)."""


def shown(value: Any) -> str:
    """``repr(value)`` cut to at most :data:`SHOWN_CHARS` characters, for error messages."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # an integer too long for repr()
        text = f"<an integer of {value.bit_length()} bits>"
    if len(text) > SHOWN_CHARS:
        text = text[: SHOWN_CHARS - 3] + "..."
    return text


def refuse(where: str, key: str, value: Any, why: str) -> NoReturn:
    """Raise the one-line error for a bad value: ``WHERE: KEY = VALUE: WHY`` (no ``WHERE: ``
    when ``where`` is empty)."""
    raise ConfigError(f"{where + ': ' if where else ''}{key} = {shown(value)}: {why}")


def key_text(key: Any) -> str:
    """A mapping key as a message names it: text as it is (cut), anything else shown."""
    return key[:SHOWN_CHARS] if isinstance(key, str) else shown(key)


def checked(value: Any, key: str, where: str) -> Any:
    """``value`` (a YAML value under ``key``) checked and copied: numbers finite and within
    64 bits, at most :data:`MAX_DEPTH` levels and :data:`MAX_NODES` values. The copy shares
    nothing, so an override never changes a value an alias repeats elsewhere."""
    count = 0
    prefix = f"{where}: " if where else ""

    def walk(v: Any, k: str, depth: int) -> Any:
        nonlocal count
        count += 1
        if count > MAX_NODES:
            raise ConfigError(f"{prefix}{key or 'the config'}: more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{prefix}{k}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(v, float) and not math.isfinite(v):
            refuse(where, k, v, "not a finite number")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
            refuse(where, k, v, "too large a number")
        if isinstance(v, dict):
            return {
                kk: walk(vv, f"{k}.{key_text(kk)}" if k else key_text(kk), depth + 1)
                for kk, vv in v.items()
            }
        if isinstance(v, list):
            return [walk(vv, f"{k}[{i}]", depth + 1) for i, vv in enumerate(v)]
        return v

    return walk(value, key, 0)


@functools.cache
def _loader() -> type:
    """A ``yaml.SafeLoader`` that refuses documents beyond the bounds above while composing
    them, before any Python value is built."""
    import re

    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self.sizes: dict[int, int] = {}  # id(node) -> its values, aliases expanded
            self.depth = 0
            self.aliases = 0

        def _refuse(self, why: str, event) -> NoReturn:
            raise ConfigError(f"{why} (line {event.start_mark.line + 1})")

        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    self._refuse(f"more than {MAX_ALIASES} aliases (*name)", event)
                target = self.anchors.get(event.anchor)
                if target is not None and id(target) not in self.sizes:
                    self._refuse(f"alias *{key_text(event.anchor)} inside its own anchor", event)
                return super().compose_node(parent, index)
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self._refuse(f"nested deeper than {MAX_DEPTH} levels", event)
            node = super().compose_node(parent, index)
            self.depth -= 1
            if isinstance(node, yaml.SequenceNode):
                children = node.value
            elif isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                children = []
            size = 1 + sum(self.sizes[id(c)] for c in children)
            if size > MAX_NODES:
                self._refuse(f"more than {MAX_NODES} values (aliases expanded)", event)
            self.sizes[id(node)] = size
            return node

    BoundedLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(_EXP_FLOAT), list("-+0123456789")
    )
    return BoundedLoader


def load_yaml(text: str) -> Any:
    """One YAML document read by the bounded loader. Raises ``ConfigError`` (without a file
    name: the caller adds it) for anything not valid or beyond the bounds."""
    import yaml

    loader = _loader()(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {_short_yaml_error(exc)}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5000 digits
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"not valid YAML: {str(exc)[:200]}") from None
    finally:
        loader.dispose()


def _short_yaml_error(exc: Exception) -> str:
    """PyYAML's message on one line: the problem and its place, no source snippet."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None:
        return str(exc).splitlines()[0][:200]
    context = getattr(exc, "context", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{context + ': ' if context else ''}{problem}{where}"[:300]


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
            errors[0]
            if len(errors) == 1
            else f"{where}: {shown(value)} does not fit {_type_name(tp)}"
        )
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {shown(value)}")
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {shown(value)}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {shown(value)}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {shown(value)}")
        if not math.isfinite(value):  # checked() saw it first; kept for values built in code
            raise ConfigError(f"{where}: {shown(value)}: not a finite number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {shown(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {shown(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {shown(value)}")
        return value
    raise ConfigError(f"{where}: unsupported type {tp}")  # pragma: no cover


def _build(cls, d: dict, where: str):
    hints = typing.get_type_hints(cls)
    unknown = sorted((k for k in d if k not in hints), key=str)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"unknown key {prefix}{key_text(unknown[0])}; known keys"
            f"{' of ' + where if where else ''}: {', '.join(sorted(hints))}"
        )
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in d.items()}
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``KEY=VALUE`` of ``--set``: the key's parts and the value (YAML, bounded and checked
    as a file's values are; errors name ``--set KEY``)."""
    if "=" not in text:
        raise ConfigError(f"--set needs KEY=VALUE, got {shown(text)}")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    name = f"--set {key.strip()[:SHOWN_CHARS]}"
    if len(keys) > MAX_DEPTH or not all(keys):
        raise ConfigError(f"{name}: expected a key like optim.lr (at most {MAX_DEPTH} parts)")
    if len(raw.encode()) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: the value is longer than {MAX_CONFIG_BYTES} bytes")
    try:
        value = load_yaml(raw) if raw != "" else None
    except ConfigError as exc:
        raise ConfigError(f"{name}: cannot parse value {shown(raw)}: {exc}") from None
    return keys, checked(value, name, "")


def read_raw(path: str | Path | None, overrides: list[str] = ()) -> tuple[dict, str]:
    """A YAML config as a mapping with the ``--set`` overrides applied, and its name. Every
    value is :func:`checked`."""
    raw: dict = {}
    where = "defaults"
    if path is not None:
        path = Path(path)
        where = str(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {path.stat().st_size} bytes is too large for a run config "
                f"(at most {MAX_CONFIG_BYTES})"
            )
        try:
            text = path.read_text()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a text file ({exc.reason})") from None
        try:
            raw = load_yaml(text)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        raw = checked(raw, "", where)
    for text in overrides:
        try:
            keys, value = parse_override(text)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{where}: --set {shown(text)}: {k} is not a section")
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


def check_at_least(values: dict[str, float | None], low: float, bad) -> None:
    """Each of ``values`` (key -> value; None: not set) must be >= ``low``."""
    for key, v in values.items():
        if v is not None and v < low:
            bad(key, v, f"must be >= {low}")


def check_fraction(values: dict[str, float], bad) -> None:
    """Each of ``values`` (key -> value) must lie in [0, 1]."""
    for key, v in values.items():
        if not 0 <= v <= 1:
            bad(key, v, "must be in [0, 1]")


def check_path(key: str, value: str | None, where: str, kind: str = "file") -> None:
    """``value`` (a path; None: not set) must exist, a file for ``kind="file"``. Names too
    long for the system are errors naming the key like missing ones."""
    if value is None:
        return
    try:
        ok = Path(value).is_file() if kind == "file" else Path(value).exists()
    except (OSError, ValueError) as exc:  # too long a name, a NUL byte
        raise ConfigError(f"{where}: {key} = {shown(value)}: not a usable path ({exc})") from None
    if not ok:
        raise FileNotFoundError(f"{where}: {key} {'file ' * (kind == 'file')}not found: {value}")


def check_sizes(key: str, sizes: list[list[int]] | None, bad) -> None:
    """Synthetic scene sizes ``[[width, height], ...]``: each side at least 32 pixels, and no
    more pixels than the image readers accept (``predict.io.MAX_IMAGE_PIXELS``)."""
    from ..predict.io import MAX_IMAGE_PIXELS

    for i, size in enumerate(sizes or []):
        if len(size) != 2:
            bad(f"{key}[{i}]", size, "expected [width, height]")
        w, h = size
        if min(w, h) < 32:
            bad(f"{key}[{i}]", size, "each side must be >= 32 pixels")
        if w * h > MAX_IMAGE_PIXELS:
            bad(f"{key}[{i}]", size, f"above the limit of {MAX_IMAGE_PIXELS} pixels")


def check_train(tc: Any, bad) -> None:
    """The ``train`` section's value checks (both families)."""
    check_positive(
        {
            "train.steps": tc.steps,
            "train.batch_size": tc.batch_size,
            "train.grad_accum": tc.grad_accum,
            "train.log_every": tc.log_every,
            "train.checkpoint_every": tc.checkpoint_every,
            "train.keep_checkpoints": tc.keep_checkpoints,
        },
        bad,
    )
    check_at_least({"train.seed": tc.seed, "train.eval_every": tc.eval_every}, 0, bad)
    check_at_least({"train.threads": tc.threads}, 1, bad)


def check_optim(oc: Any, bad) -> None:
    """The optimizer section's value checks (both families: an ``OptimConfig`` or a
    ``Sam3OptimConfig``)."""
    if oc.decay not in DECAYS:
        bad("optim.decay", oc.decay, f"choose from {', '.join(DECAYS)}")
    check_positive({"optim.lr": oc.lr}, bad)
    if oc.timescale < 1:
        bad("optim.timescale", oc.timescale, "must be >= 1")
    for key in ("warmup_steps", "cooldown_steps"):
        if getattr(oc, key) < 0:
            bad(f"optim.{key}", getattr(oc, key), "must be >= 0")
    if oc.grad_clip is not None and oc.grad_clip <= 0:
        bad("optim.grad_clip", oc.grad_clip, "must be > 0 (or null: off)")
    check_at_least({"optim.weight_decay": oc.weight_decay}, 0, bad)
    check_fraction({"optim.min_lr_ratio": oc.min_lr_ratio}, bad)
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(oc, key) < 1:
            bad(f"optim.{key}", getattr(oc, key), "must be in [0, 1)")
