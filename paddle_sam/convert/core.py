"""What every model family's conversion shares: the errors, the strict key check, the
``.pdparams`` reader and writer with its JSON sidecar, and the source hashes.

The family files (:mod:`.sam_v1`, :mod:`.sam3`, :mod:`.sam3_hf`) keep only their key maps.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import paddle
from tqdm import tqdm

from ..models.common import Spec

CONVERTER_VERSION = "1"
PADDLE_SUFFIX = ".pdparams"

SpecT = TypeVar("SpecT", bound=Spec)


class CheckpointError(ValueError):
    """Base class for errors raised while reading or loading a checkpoint."""


class CheckpointFormatError(CheckpointError):
    """The file is truncated, corrupt, or uses an unsupported feature."""


class UnknownCheckpointFormatError(CheckpointFormatError):
    """The file is neither a torch zip, a legacy torch file, nor safetensors."""


class UnsafeCheckpointError(CheckpointError):
    """The pickle references a global outside the tensor-only allow list."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint's keys or shapes do not fit the model."""


# ----------------------------------------------------------------------- strict key check


def model_shapes(model: paddle.nn.Layer) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of a model's state dict."""
    return {k: tuple(int(d) for d in v.shape) for k, v in model.state_dict().items()}


def linear_weights(model: paddle.nn.Layer) -> set[str]:
    """The state-dict keys of the model's Linear weights (Paddle ``[in, out]``, torch
    ``[out, in]``: transposed by the converters)."""
    return {f"{n}.weight" for n, m in model.named_sublayers() if isinstance(m, paddle.nn.Linear)}


def check_keys(
    expected: Mapping[str, tuple[int, ...]],
    state: Mapping[str, np.ndarray],
    *,
    ignore: Mapping[str, str] | set[str] = (),
    wrong: list[str] | None = None,
    where: str = "",
) -> None:
    """Raise :class:`CheckpointMismatchError` listing every missing, unexpected (not in
    ``ignore``) and mis-shaped key of ``state`` against ``expected`` shapes, plus any
    problems already found (``wrong``); ``where`` prefixes the message (a file name)."""
    wrong = list(wrong or [])
    bad = {w.split(":")[0] for w in wrong}
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected and k not in ignore]
    wrong += [
        f"{k}: checkpoint {list(np.shape(state[k]))}, model expects {list(s)}"
        for k, s in expected.items()
        if k in state and k not in bad and tuple(np.shape(state[k])) != tuple(s)
    ]
    if missing or extra or wrong:
        raise CheckpointMismatchError(where + _mismatch_message(missing, extra, wrong))


def _mismatch_message(
    missing: list[str], extra: list[str], wrong: list[str], limit: int = 20
) -> str:
    parts = ["checkpoint does not match the model:"]
    sections = (("missing keys", missing), ("unexpected keys", extra), ("bad tensors", wrong))
    for title, items in sections:
        if items:
            shown = "\n    ".join(items[:limit])
            more = f"\n    ... and {len(items) - limit} more" if len(items) > limit else ""
            parts.append(f"  {len(items)} {title}:\n    {shown}{more}")
    return "\n".join(parts)


def load_state_strict(
    model: paddle.nn.Layer, state: Mapping[str, np.ndarray], where: str = ""
) -> None:
    """Set ``model``'s weights from a Paddle-layout state dict: every key present, nothing
    extra, shapes equal (:class:`CheckpointMismatchError` otherwise).

    Tensors are copied in one at a time, and a mutable ``state`` (a ``dict``) is emptied as it
    goes: a large model (SAM 3: 3.4 GB) then never exists three times over (arrays, temporary
    tensors, parameters), only the parameters plus what remains to be copied."""
    targets = model.state_dict()
    check_keys({k: tuple(int(d) for d in v.shape) for k, v in targets.items()}, state, where=where)
    pop = isinstance(state, dict)
    for key in list(state):
        value = state.pop(key) if pop else state[key]
        targets[key].set_value(np.asarray(value, dtype=np.float32))
        del value


def random_weight(key: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A float32 random tensor for an official-layout key, for demo and test checkpoints:
    norm weights near 1, everything else fan-in scaled (the model it gives is meaningless)."""
    if key.endswith(".weight") and len(shape) == 1:  # norms
        value = 1.0 + 0.02 * rng.standard_normal(shape)
    else:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        value = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
    return value.astype(np.float32)


# ---------------------------------------------------------------- .pdparams and sidecar


def sidecar_path(dst: str | os.PathLike) -> Path:
    """``model.pdparams`` -> ``model.pdparams.json``."""
    dst = Path(dst)
    return dst.with_name(dst.name + ".json")


def read_pdparams(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The state dict of a ``.pdparams`` file as numpy arrays; a damaged file is a
    :class:`CheckpointFormatError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        state = paddle.load(str(path), return_numpy=True)
    except Exception as exc:  # paddle raises many types for damaged files
        raise CheckpointFormatError(
            f"cannot read {path}: not a valid {PADDLE_SUFFIX} file ({exc})"
        ) from exc
    if not isinstance(state, dict):
        raise CheckpointFormatError(
            f"{path} does not hold a state dict (got {type(state).__name__})"
        )
    return state


def read_sidecar(path: str | os.PathLike) -> dict | None:
    """The JSON sidecar of a ``.pdparams`` file, or None when it has none."""
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        meta = json.loads(side.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointFormatError(f"sidecar {side} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise CheckpointFormatError(f"sidecar {side} must hold a JSON object")
    return meta


def sidecar_spec(path: str | os.PathLike, meta: dict, spec_cls: type[SpecT]) -> SpecT:
    """The model spec in the sidecar ``meta`` of ``path`` as a ``spec_cls``; a bad one is a
    :class:`CheckpointFormatError` naming the sidecar."""
    try:
        return spec_cls.from_dict(meta["spec"])
    except ValueError as exc:
        raise CheckpointFormatError(f"sidecar {sidecar_path(path)}: {exc}") from exc


def sidecar_meta(
    family: str, model_type: str, spec: Any, source: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """The sidecar of a model of ``family`` (``sam_v1`` / ``sam3``): what it is, its spec,
    where its weights came from, and which converter and Paddle wrote it."""
    return {
        "format": f"paddle-sam/{family}",
        "model_type": model_type,
        "spec": spec.to_dict(),
        **extra,
        "source": source,
        "converter_version": CONVERTER_VERSION,
        "paddle_version": paddle.__version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def save_pdparams(state: dict[str, np.ndarray], dst: str | os.PathLike, meta: dict) -> None:
    """Write weights and sidecar atomically (temporary files, then rename)."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp{PADDLE_SUFFIX}")
    side, side_tmp = sidecar_path(dst), sidecar_path(tmp)
    try:
        paddle.save({k: paddle.to_tensor(v) for k, v in state.items()}, str(tmp))
        side_tmp.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, dst)
        os.replace(side_tmp, side)
    finally:
        for p in (tmp, side_tmp):
            p.unlink(missing_ok=True)


def sha256_file(path: str | os.PathLike, progress: bool = False) -> str:
    path = Path(path)
    h = hashlib.sha256()
    size = path.stat().st_size
    with (
        open(path, "rb") as f,
        tqdm(
            total=size,
            unit="B",
            unit_scale=True,
            desc=f"sha256 {path.name}",
            disable=not progress or size < (100 << 20),
        ) as bar,
    ):
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()
