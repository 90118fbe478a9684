"""What every model family's conversion shares: the errors, the strict key check, the
``.pdparams`` reader and writer with its JSON sidecar, and the source hashes.

The family files (:mod:`.sam_v1`, :mod:`.sam3`, :mod:`.sam3_hf`) keep only their key maps.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import pickle
import re
import typing
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

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


def declared_parameters(weights_follow: bool) -> contextlib.AbstractContextManager:
    """Build a model inside this when a strict load (:func:`load_state_strict`) will set every
    parameter: under ``paddle.LazyGuard`` parameters are declared, not filled with random
    values that the load would overwrite (for SAM 3: 848 M random numbers, seconds of work,
    and pages touched twice). A no-op when ``weights_follow`` is False."""
    return paddle.LazyGuard() if weights_follow else contextlib.nullcontext()


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


# ---------------------------------------------------------------- .pdparams shapes
# paddle.save pickles each array as numpy does: _reconstruct(ndarray, (0,), b"b") then BUILD
# with (version, shape, dtype, is_fortran, bytes). Reading the shapes needs only those calls;
# the array bytes are skipped (seeked over), so no weights are read into memory.

_SKIP_MIN_BYTES = 1 << 20  # byte strings this large are array data: skipped, never read
_DTYPE_CODE = re.compile(r"[?bBhHiIlLqQefdgFDGu]|[biufc][1248]|f16|c(8|16|32)|b1")


class _PdBad(Exception):
    """Internal: a .pdparams pickle that paddle.save does not write."""


class _SkippingReader:
    """The file as the unpickler reads it: large byte strings are skipped, not read (their
    buffer is allocated but never touched, so it costs no memory)."""

    def __init__(self, f: IO[bytes], size: int) -> None:
        self._f = f
        self._size = size

    def _left(self) -> int:
        return self._size - self._f.tell()

    def read(self, n: int = -1) -> bytes:
        left = self._left()
        return self._f.read(left if n is None or n < 0 or n > left else n)

    def readline(self) -> bytes:
        return self._f.readline()

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf)
        if view.nbytes < _SKIP_MIN_BYTES:
            return self._f.readinto(view)  # type: ignore[attr-defined]
        n = min(view.nbytes, self._left())
        self._f.seek(n, os.SEEK_CUR)
        return n


class _ArrayShape:
    """Stands in for a pickled numpy array: keeps its shape, checks its data size."""

    __slots__ = ("shape",)

    def __init__(self) -> None:
        self.shape: tuple[int, ...] | None = None

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5) or self.shape is not None:
            raise _PdBad("unexpected array record")
        _, shape, dtype, _, data = state
        if not (
            isinstance(shape, tuple)
            and all(type(d) is int and 0 <= d < 1 << 62 for d in shape)
            and isinstance(dtype, _DtypeCode)
            and isinstance(data, bytes | bytearray)
        ):
            raise _PdBad("unexpected array record")
        if len(data) != math.prod(shape) * dtype.itemsize:
            raise _PdBad(f"array data of {len(data)} bytes for shape {list(shape)}")
        self.shape = shape


class _DtypeCode:
    """Stands in for ``numpy.dtype(code)`` of a plain numeric type."""

    __slots__ = ("itemsize",)

    def __init__(self, code: Any, align: Any = False, copy: Any = False) -> None:
        if not isinstance(code, str) or not _DTYPE_CODE.fullmatch(code):
            raise _PdBad(f"unsupported array dtype {code!r}")
        self.itemsize = np.dtype(code).itemsize

    def __setstate__(self, state: Any) -> None:
        return None


class _NdarrayClass:
    """Stands in for ``numpy.ndarray`` (the class argument of ``_reconstruct``)."""


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> _ArrayShape:
    if not isinstance(cls, _NdarrayClass):
        raise _PdBad("array record of another class")
    return _ArrayShape()


def _scalar(*args: Any) -> None:
    return None  # a numpy scalar: not a weight


def _latin1(text: Any, encoding: Any = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _PdBad("unexpected _codecs.encode call")
    return text.encode("latin1")


_PD_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        (mod, name): fn
        for mod in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name, fn in (("_reconstruct", _reconstruct), ("scalar", _scalar))
    },
    ("numpy", "ndarray"): _NdarrayClass(),
    ("numpy", "dtype"): _DtypeCode,
    ("collections", "OrderedDict"): OrderedDict,
    ("_codecs", "encode"): _latin1,
}


class _ShapeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _PD_GLOBALS.get((module, name))
        if found is None:
            raise UnsafeCheckpointError(f"refusing to load global '{module}.{name}'")
        return found


def pdparams_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of the arrays in a ``.pdparams`` file, read from its pickle without
    reading the weights and without running pickled code (only numpy's array records are
    allowed). A file ``paddle.save`` does not write is a :class:`CheckpointFormatError`."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            state = _ShapeUnpickler(_SkippingReader(f, os.fstat(f.fileno()).st_size)).load()
    except OSError:
        raise
    except UnsafeCheckpointError as exc:
        raise UnsafeCheckpointError(f"{path}: {exc}; a .pdparams holds arrays only") from None
    except MemoryError:
        raise CheckpointFormatError(
            f"cannot read {path}: not a valid {PADDLE_SUFFIX} file (it declares an object "
            "larger than memory)"
        ) from None
    except Exception as exc:  # damaged pickles raise many types
        raise CheckpointFormatError(
            f"cannot read {path}: not a valid {PADDLE_SUFFIX} file ({exc})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointFormatError(
            f"{path} does not hold a state dict (got {type(state).__name__})"
        )
    out = {}
    for key, value in state.items():
        if isinstance(value, _ArrayShape) and value.shape is not None:
            out[str(key)] = value.shape
    return out


# A sidecar is a few KiB; a far larger one is not ours.
MAX_SIDECAR_BYTES = 1 << 20
# The JSON types of the sidecar entries the loaders read.
_SIDECAR_TYPES: dict[str, tuple[type, str]] = {
    "format": (str, "a string"),
    "model_type": (str, "a string"),
    "spec": (dict, "a JSON object"),
    "interactive": (bool, "true or false"),
}
# Sizes in a spec are far below this; larger ones are refused before any arithmetic on them.
_MAX_SPEC_INT = 1 << 31


def read_sidecar(path: str | os.PathLike) -> dict | None:
    """The JSON sidecar of a ``.pdparams`` file, or None when it has none. Entries the loaders
    read (``format``, ``model_type``, ``spec``, ``interactive``) must have their JSON types."""
    side = sidecar_path(path)
    if not side.is_file():
        return None
    if side.stat().st_size > MAX_SIDECAR_BYTES:
        raise CheckpointFormatError(
            f"sidecar {side} is {side.stat().st_size} bytes, far larger than a sidecar"
        )
    try:
        meta = json.loads(side.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointFormatError(f"sidecar {side} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise CheckpointFormatError(f"sidecar {side} must hold a JSON object")
    for key, (kind, what) in _SIDECAR_TYPES.items():
        if key in meta and not isinstance(meta[key], kind):
            raise CheckpointFormatError(
                f"sidecar {side}: {key!r} must be {what}, got {_json_brief(meta[key])}"
            )
    return meta


def _json_brief(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _spec_value_problem(value: Any, hint: Any) -> str | None:
    """Why ``value`` (from JSON) cannot be a spec field of type ``hint``, or None."""
    if hint in (int, float):
        ok = type(value) is int or hint is float and type(value) is float and math.isfinite(value)
        if not ok:
            return "must be an integer" if hint is int else "must be a number"
        return "is too large" if abs(value) >= _MAX_SPEC_INT else None
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list):
            return "must be a list"
        if len(value) > 64:
            return "is too long"
        elem = typing.get_args(hint)[0]
        if any(_spec_value_problem(v, elem) for v in value):
            return "entries must be integers" if elem is int else "entries must be numbers"
        if elem is float and any(v <= 0 for v in value):
            return "entries must be positive"
    return None


def _check_spec_types(side: Path, spec: Any, spec_cls: type) -> None:
    if not isinstance(spec, dict):
        raise CheckpointFormatError(
            f"sidecar {side}: 'spec' must be a JSON object, got {_json_brief(spec)}"
        )
    hints = typing.get_type_hints(spec_cls)
    for name, value in spec.items():
        hint = hints.get(spec_cls.RENAMED.get(name, name))
        problem = _spec_value_problem(value, hint) if hint is not None else None
        if problem:
            raise CheckpointFormatError(
                f"sidecar {side}: bad {spec_cls.__name__} values: {name} {problem}, got "
                f"{_json_brief(value)}"
            )


def sidecar_spec(path: str | os.PathLike, meta: dict, spec_cls: type[SpecT]) -> SpecT:
    """The model spec in the sidecar ``meta`` of ``path`` as a ``spec_cls``; a bad one (a
    value of the wrong JSON type, a size zero, negative or absurd) is a
    :class:`CheckpointFormatError` naming the sidecar."""
    side = sidecar_path(path)
    _check_spec_types(side, meta.get("spec"), spec_cls)
    try:
        return spec_cls.from_dict(meta["spec"])
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise CheckpointFormatError(f"sidecar {side}: {exc}") from exc


def sidecar_family(meta: dict | None) -> str | None:
    """``"sam3"``, ``"sam2"`` or ``"sam_v1"`` from a sidecar (:func:`sidecar_meta`'s
    ``format``; older sidecars without it by their ``model_type``, which only SAM 3's converter
    set to ``"sam3"``), or None without a sidecar. A trained model's ``model_type`` is its
    run's name, so the format decides when there is one."""
    if meta is None:
        return None
    fmt = meta.get("format")
    if fmt is not None:
        return {"paddle-sam/sam3": "sam3", "paddle-sam/sam2": "sam2"}.get(fmt, "sam_v1")
    if "model_type" not in meta:
        return None
    return "sam3" if meta["model_type"] == "sam3" else "sam_v1"


def sidecar_meta(
    family: str, model_type: str, spec: Any, source: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """The sidecar of a model of ``family`` (``sam_v1`` / ``sam2`` / ``sam3``): what it is, its
    spec, where its weights came from, and which converter and Paddle wrote it."""
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
        # paddle.save's format for a dict of arrays (paddle.load reads it back as tensors),
        # written without the pickle memo: paddle.save keeps every array's bytes in it until
        # the end, a second copy of the whole model (16.4 GB peak converting sam3.pt, 3.8 now)
        with open(tmp, "wb") as f:
            pickler = pickle.Pickler(f, protocol=4)
            pickler.fast = True  # no memo: each array's bytes are dropped once written
            pickler.dump({k: np.ascontiguousarray(v) for k, v in state.items()})
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
