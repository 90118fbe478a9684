"""Read PyTorch checkpoints into numpy without torch and without running pickled code.

Supported inputs:

* the zip format written by ``torch.save`` (torch >= 1.6): ``<dir>/data.pkl`` plus one
  ``<dir>/data/<key>`` record per storage;
* the legacy stream format (torch < 1.6, or ``_use_new_zipfile_serialization=False``): magic
  number, protocol version, system info, the main pickle, the list of storage keys, then each
  storage's bytes prefixed by its little-endian int64 element count;
* ``.safetensors`` files.

Pickles are read by an unpickler whose ``find_class`` only hands out inert stand-ins for the few
globals a tensor checkpoint needs (tensor/parameter rebuild functions, storage classes, dtypes,
``OrderedDict``). Any other global is refused with :class:`UnsafeCheckpointError` before it is
imported, so nothing from the file is ever executed. Tensors come back as numpy arrays; bfloat16
is widened to float32 (numpy has no bfloat16); every other dtype is kept as stored.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import pickle
import struct
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, Literal

import numpy as np

from .core import (
    CheckpointError,
    CheckpointFormatError,
    UnknownCheckpointFormatError,
    UnsafeCheckpointError,
)

__all__ = [
    "PROGRESS_MIN_BYTES",
    "CheckpointError",
    "CheckpointFormatError",
    "UnknownCheckpointFormatError",
    "UnsafeCheckpointError",
    "load_checkpoint_tree",
    "load_state_dict",
    "load_tensor_shapes",
    "read_zip_pickle",
]

Progress = bool | Literal["always"]
PathLike = str | os.PathLike[str]

#: ``progress=True`` only shows a bar for files larger than this; ``progress="always"`` forces it.
PROGRESS_MIN_BYTES = 100 * 1024 * 1024

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
# Memory limits: what the reader allocates is bounded by what a real checkpoint needs, never by
# sizes a hostile file merely declares.
#
# Broadcast (stride-0) tensors may legitimately be larger than their storage; cap the total
# extra memory such tensors may claim, counted as float32 (or wider) elements, the size they
# reach once converted, so a hostile file cannot ask for terabytes. Real checkpoints hold no
# broadcast tensors worth mentioning.
_MAX_EXPANSION_BYTES = 256 << 20
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
# A checkpoint's pickle is kilobytes to a few MiB (the tensors live in storage records).
_MAX_PICKLE_BYTES = 64 << 20
# torch.save writes zip records uncompressed (ZIP_STORED). Compressed records (an archive
# re-zipped by hand) are read, but all of them together may not expand to more than this
# ratio of their compressed size plus a little: a zip bomb stays a few MiB.
_MAX_ZIP_RATIO = 8
_ZIP_SLACK_BYTES = 1 << 20
# Small records that hold a word.
_MAX_SMALL_RECORD = 4096


class _Bad(Exception):
    """Internal: a format problem; re-raised as CheckpointFormatError naming the file."""


# ----------------------------------------------------------------------------- element types


class _Elem:
    """A torch element type: its name and the little-endian numpy dtype of its bytes."""

    __slots__ = ("name", "np_dtype")

    def __init__(self, name: str, np_dtype: str) -> None:
        self.name = name
        self.np_dtype = np.dtype(np_dtype)

    @property
    def itemsize(self) -> int:
        return self.np_dtype.itemsize


_ELEMS: dict[str, _Elem] = {
    name: _Elem(name, code)
    for name, code in [
        ("float64", "<f8"),
        ("float32", "<f4"),
        ("float16", "<f2"),
        ("bfloat16", "<u2"),  # widened to float32 on output
        ("int64", "<i8"),
        ("int32", "<i4"),
        ("int16", "<i2"),
        ("int8", "i1"),
        ("uint8", "u1"),
        ("uint16", "<u2"),
        ("uint32", "<u4"),
        ("uint64", "<u8"),
        ("bool", "?"),
        ("complex64", "<c8"),
        ("complex128", "<c16"),
    ]
}
_DTYPE_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "cfloat": "complex64",
    "cdouble": "complex128",
}
_STORAGE_ELEMS = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "UntypedStorage": "uint8",
}
_UNSUPPORTED_TORCH_PREFIXES = ("float8_", "float4_", "bits", "qint", "quint", "complex32", "chalf")


# ----------------------------------------------------------------------------- pickle stand-ins


class _Inert:
    """Base of the stand-ins; refuses pickle BUILD so a file cannot alter their fields."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise _Bad(f"pickle tries to set state on {type(self).__name__}")


class _StorageType(_Inert):
    """Stand-in for a ``torch.<X>Storage`` class."""

    __slots__ = ("name", "elem")

    def __init__(self, name: str, elem: _Elem) -> None:
        self.name = name
        self.elem = elem


class _DType(_Inert):
    """Stand-in for a ``torch.<dtype>`` object."""

    __slots__ = ("elem",)

    def __init__(self, elem: _Elem) -> None:
        self.elem = elem


class _Storage(_Inert):
    """A storage named by the pickle; ``root`` is itself unless this is a legacy storage view."""

    __slots__ = ("key", "elem", "numel", "root", "byte_offset", "value")

    def __init__(self, key: str, elem: _Elem, numel: int) -> None:
        self.key = key
        self.elem = elem
        self.numel = numel
        self.root: _Storage = self
        self.byte_offset = 0
        self.value: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.numel * self.elem.itemsize


class _LazyTensor(_Inert):
    """A tensor whose data is read after the pickle (storages may follow it in the file)."""

    __slots__ = ("storage", "offset", "shape", "stride", "elem", "value")

    def __init__(
        self,
        storage: _Storage,
        offset: int,
        shape: tuple[int, ...],
        stride: tuple[int, ...],
        elem: _Elem,
    ) -> None:
        self.storage = storage
        self.offset = offset
        self.shape = shape
        self.stride = stride
        self.elem = elem
        self.value: np.ndarray | None = None


def _index(x: object, what: str) -> int:
    if type(x) is not int or x < 0 or x >= 1 << 62:
        raise _Bad(f"invalid {what} {x!r} in tensor record")
    return x


def _dims(x: object, what: str) -> tuple[int, ...]:
    if not isinstance(x, tuple | list):
        raise _Bad(f"invalid {what} {x!r} in tensor record")
    return tuple(_index(v, what) for v in x)


def _tensor(
    storage: object, offset: object, size: object, stride: object, elem: _Elem | None
) -> _LazyTensor:
    if not isinstance(storage, _Storage):
        raise _Bad(f"tensor record has no storage reference (got {type(storage).__name__})")
    shape = _dims(size, "size")
    strides = _dims(stride, "stride")
    if len(shape) != len(strides):
        raise _Bad(f"tensor size {shape} and stride {strides} differ in length")
    return _LazyTensor(
        storage, _index(offset, "storage offset"), shape, strides, elem or storage.elem
    )


def _rebuild_tensor(
    storage: object, storage_offset: object, size: object, stride: object
) -> _LazyTensor:
    return _tensor(storage, storage_offset, size, stride, None)


def _rebuild_tensor_v2(
    storage: object,
    storage_offset: object,
    size: object,
    stride: object,
    requires_grad: object = False,
    backward_hooks: object = None,
    metadata: object = None,
) -> _LazyTensor:
    return _tensor(storage, storage_offset, size, stride, None)


def _rebuild_tensor_v3(
    storage: object,
    storage_offset: object,
    size: object,
    stride: object,
    requires_grad: object,
    backward_hooks: object,
    dtype: object,
    metadata: object = None,
) -> _LazyTensor:
    if not isinstance(dtype, _DType):
        raise _Bad(f"tensor record has an invalid dtype {dtype!r}")
    return _tensor(storage, storage_offset, size, stride, dtype.elem)


def _rebuild_parameter(
    data: object, requires_grad: object = False, backward_hooks: object = None
) -> _LazyTensor:
    if not isinstance(data, _LazyTensor):
        raise _Bad("parameter record does not wrap a tensor")
    return data


def _rebuild_parameter_with_state(
    data: object, requires_grad: object, backward_hooks: object, state: object
) -> _LazyTensor:
    return _rebuild_parameter(data)


def _codecs_encode(text: object, encoding: object = "utf-8") -> bytes:
    # protocol-2 pickles store ``bytes`` as _codecs.encode(str, "latin1")
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Bad("unexpected _codecs.encode call in pickle")
    return text.encode("latin1")


def _torch_size(dims: object = ()) -> tuple[int, ...]:
    return _dims(dims, "torch.Size entry")


class _Callable(_Inert):
    """Wraps an allowed callable so pickle BUILD cannot set attributes on the real function."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


_ALLOWED_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
    ("torch", "Size"): _torch_size,
    ("collections", "OrderedDict"): OrderedDict,
    ("_codecs", "encode"): _codecs_encode,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only allow-listed globals, to inert stand-ins."""

    def __init__(self, file: IO[bytes], path: str, storages: dict[str, _Storage]) -> None:
        super().__init__(file)
        self._path = path
        self._storages = storages
        self._views: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED_GLOBALS.get((module, name))
        if allowed is not None:
            return _Callable(allowed)
        if module in ("torch", "torch.cuda", "torch.storage") and name in _STORAGE_ELEMS:
            return _StorageType(name, _ELEMS[_STORAGE_ELEMS[name]])
        if module == "torch":
            elem = _ELEMS.get(_DTYPE_ALIASES.get(name, name))
            if elem is not None:
                return _DType(elem)
            if name.startswith(_UNSUPPORTED_TORCH_PREFIXES) or name.startswith(
                tuple(q + "Storage" for q in ("QInt8", "QInt32", "QUInt8", "QUInt4x2", "QUInt2x4"))
            ):
                raise _Bad(f"unsupported torch type 'torch.{name}'")
        raise UnsafeCheckpointError(
            f"refusing to load global '{module}.{name}' from checkpoint '{self._path}': only "
            "plain tensors, dicts, lists and Python scalars can be read without executing code"
        )

    def persistent_load(self, pid: Any) -> _Storage:
        if not isinstance(pid, tuple) or len(pid) not in (5, 6):
            raise _Bad(f"unexpected persistent id {pid!r}")
        kind = pid[0].decode("ascii") if isinstance(pid[0], bytes) else pid[0]
        if kind != "storage":
            raise _Bad(f"unsupported persistent id type {kind!r}")
        stype, key, _location, numel = pid[1:5]
        if not isinstance(stype, _StorageType):
            raise _Bad(f"persistent id names no storage class: {stype!r}")
        if isinstance(key, bytes):
            key = key.decode("ascii")
        if not isinstance(key, str | int) or isinstance(key, bool):
            raise _Bad(f"invalid storage key {key!r}")
        key = str(key)
        numel = _index(numel, "storage size")
        root = self._storages.get(key)
        if root is None:
            root = self._storages[key] = _Storage(key, stype.elem, numel)
        elif root.elem is not stype.elem or root.numel != numel:
            raise _Bad(f"storage {key!r} is declared twice with different dtype or size")
        view = pid[5] if len(pid) == 6 else None
        if view is None:
            return root
        if not isinstance(view, tuple) or len(view) != 3:
            raise _Bad(f"invalid storage view {view!r}")
        view_key, view_offset, view_numel = str(view[0]), view[1], view[2]
        existing = self._views.get(view_key)
        if existing is not None:
            return existing
        sub = _Storage(view_key, stype.elem, _index(view_numel, "storage view size"))
        sub.root = root
        sub.byte_offset = _index(view_offset, "storage view offset") * stype.elem.itemsize
        if sub.byte_offset + sub.nbytes > root.nbytes:
            raise _Bad(f"storage view {view_key!r} exceeds storage {key!r}")
        self._views[view_key] = sub
        return sub


def _unpickle(f: IO[bytes], path: str, storages: dict[str, _Storage]) -> Any:
    try:
        return _RestrictedUnpickler(f, path, storages).load()
    except MemoryError:
        # a byte string or container declared far larger than memory: never a real checkpoint
        raise _Bad("the pickle declares an object larger than available memory") from None


# ----------------------------------------------------------------------------- materialising


def _walk(obj: Any, seen: set[int], found: list[_LazyTensor | _Storage]) -> None:
    """Collect the tensors and raw storages reachable from ``obj``."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, _LazyTensor | _Storage):
        found.append(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, _Inert):
                raise _Bad("a tensor or storage is used as a dictionary key")
            _walk(v, seen, found)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _walk(v, seen, found)
    elif isinstance(obj, set | frozenset):
        if any(isinstance(v, _Inert) for v in obj):
            raise _Bad("a tensor or storage is stored inside a set")


def _replace(obj: Any, memo: dict[int, Any]) -> Any:
    """Swap stand-ins for their numpy values (containers are updated in place)."""
    if isinstance(obj, _LazyTensor | _Storage):
        return obj.value
    if isinstance(obj, _DType):
        return f"torch.{obj.elem.name}"
    if isinstance(obj, _StorageType):
        return f"torch.{obj.name}"
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, dict):
        memo[id(obj)] = obj
        for k in list(obj):
            obj[k] = _replace(obj[k], memo)
    elif isinstance(obj, list):
        memo[id(obj)] = obj
        obj[:] = [_replace(v, memo) for v in obj]
    elif isinstance(obj, tuple):
        new = tuple(_replace(v, memo) for v in obj)
        memo[id(obj)] = obj if all(a is b for a, b in zip(new, obj, strict=True)) else new
        return memo[id(obj)]
    return obj


def _widened_itemsize(elem: _Elem) -> int:
    """Bytes per element once converted: the converters widen every float to float32."""
    return max(elem.itemsize, 4)


def _finish(arr: np.ndarray, elem: _Elem) -> np.ndarray:
    """Convert stored bytes to the output dtype (native order; bfloat16 widened to float32)."""
    if elem.name == "bfloat16":
        out = arr.astype(np.uint32)
        out <<= 16  # in place: the widened copy is the only one made
        return out.view(np.float32)
    if not arr.dtype.isnative:
        return arr.astype(arr.dtype.newbyteorder("="))
    return arr


def _c_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


class _Materializer:
    """Turns stand-ins into arrays, one root storage at a time."""

    def __init__(self, big_endian: bool) -> None:
        self.big_endian = big_endian
        self.expansion_left = _MAX_EXPANSION_BYTES

    def dtype(self, elem: _Elem) -> np.dtype:
        return elem.np_dtype.newbyteorder(">") if self.big_endian else elem.np_dtype

    def fill(self, user: _LazyTensor | _Storage, raw: np.ndarray, exclusive: bool) -> None:
        if isinstance(user, _Storage):
            end = user.byte_offset + user.nbytes
            data = raw[user.byte_offset : end].view(self.dtype(user.elem)).copy()
            user.value = _finish(data, user.elem)
            return
        storage, elem = user.storage, user.elem
        isz = elem.itemsize
        numel = math.prod(user.shape)
        if numel == 0:
            user.value = _finish(np.empty(user.shape, self.dtype(elem)), elem)
            return
        avail = storage.nbytes
        last = user.offset + sum((n - 1) * s for n, s in zip(user.shape, user.stride, strict=True))
        if (last + 1) * isz > avail:
            raise _Bad(
                f"tensor of shape {user.shape} (stride {user.stride}, offset {user.offset}, "
                f"{elem.name}) reads past the end of storage {storage.key!r} ({avail} bytes)"
            )
        # elements beyond the storage's, at the size they reach once widened to float32
        excess = (numel - avail // isz) * _widened_itemsize(elem)
        if excess > 0:
            self.expansion_left -= excess
            if self.expansion_left < 0:
                raise _Bad(
                    f"broadcast tensors expand to far more memory than the file holds (a "
                    f"{elem.name} tensor of shape {list(user.shape)} from {avail} bytes of "
                    f"storage {storage.key!r}; at most {_MAX_EXPANSION_BYTES >> 20} MiB of "
                    "expansion is read)"
                )
        start = storage.byte_offset
        buf = raw[start : start + avail // isz * isz].view(self.dtype(elem))
        if (
            exclusive
            and start == 0
            and user.offset == 0
            and numel * isz == raw.size
            and _c_contiguous(user.shape, user.stride)
        ):
            user.value = _finish(buf.reshape(user.shape), elem)
            return
        steps = tuple(s * isz if n > 1 else 0 for n, s in zip(user.shape, user.stride, strict=True))
        view = np.lib.stride_tricks.as_strided(
            buf[user.offset :], shape=user.shape, strides=steps, writeable=False
        )
        if elem.name == "bfloat16":  # widen while copying: no bfloat16 copy on the way
            out = np.empty(user.shape, np.uint32)
            np.copyto(out, view, casting="safe")
            out <<= 16
            user.value = out.view(np.float32)
        else:
            user.value = _finish(np.array(view, copy=True, order="C"), elem)


RootReader = Callable[[list[_Storage]], Iterator[tuple[_Storage, np.ndarray]]]


def _materialize(
    tree: Any, read_roots: RootReader, big_endian: bool, path: str, progress: Progress
) -> Any:
    found: list[_LazyTensor | _Storage] = []
    _walk(tree, set(), found)
    users: dict[int, list[_LazyTensor | _Storage]] = {}
    roots: dict[int, _Storage] = {}
    for item in found:
        root = (item.storage if isinstance(item, _LazyTensor) else item).root
        roots[id(root)] = root
        users.setdefault(id(root), []).append(item)
    mat = _Materializer(big_endian)
    total = sum(r.nbytes for r in roots.values())
    with _progress_bar(path, total, progress) as bar:
        done = set()
        for root, raw in read_roots(list(roots.values())):
            group = users[id(root)]
            for item in group:
                mat.fill(item, raw, exclusive=len(group) == 1)
            done.add(id(root))
            del raw
            bar.update(root.nbytes)
    missing = [r.key for i, r in roots.items() if i not in done]
    if missing:
        raise _Bad(f"storage data missing for keys {missing[:5]}")
    return _replace(tree, {})


class _ShapeLeaf:
    """A tensor's shape where :func:`load_tensor_shapes` leaves the tensor unread."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


def _shapes_only(tree: Any) -> Any:
    """The tree with every tensor (and raw storage) replaced by its :class:`_ShapeLeaf`."""
    found: list[_LazyTensor | _Storage] = []
    _walk(tree, set(), found)
    for item in found:
        shape = item.shape if isinstance(item, _LazyTensor) else (item.numel,)
        item.value = _ShapeLeaf(shape)  # type: ignore[assignment]
    return _replace(tree, {})


class _NullBar:
    def __enter__(self) -> _NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        return None


def _progress_bar(path: str, total: int, progress: Progress) -> Any:
    wanted = progress == "always" or (
        progress is True and os.path.getsize(path) > PROGRESS_MIN_BYTES
    )
    if not wanted:
        return _NullBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NullBar()
    return tqdm(total=total, unit="B", unit_scale=True, desc=os.path.basename(path))


# ----------------------------------------------------------------------------- file formats


def _read_exact(f: IO[bytes], n: int, what: str) -> np.ndarray:
    buf = np.empty(n, dtype=np.uint8)
    view = memoryview(buf)
    pos = 0
    while pos < n:
        got = f.readinto(view[pos:])  # type: ignore[attr-defined]
        if not got:
            raise _Bad(f"file ends inside {what} ({pos} of {n} bytes)")
        pos += got
    return buf


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _check_zip_sizes(zf: zipfile.ZipFile, archive_size: int) -> None:
    """Refuse, before reading anything, records whose declared sizes a real ``torch.save``
    archive never has: stored records larger than the archive, and compressed records that
    expand beyond :data:`_MAX_ZIP_RATIO` (a zip bomb)."""
    packed = unpacked = 0
    for info in zf.infolist():
        name = info.filename
        if info.flag_bits & 0x1:
            raise _Bad(f"record {name!r} is encrypted")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise _Bad(
                    f"stored record {name!r} declares {info.file_size} bytes but occupies "
                    f"{info.compress_size}"
                )
        else:
            packed += info.compress_size
            unpacked += info.file_size
        if info.header_offset + info.compress_size > archive_size:
            raise _Bad(
                f"record {name!r} claims {info.compress_size} bytes at offset "
                f"{info.header_offset}, past the end of the {archive_size}-byte archive"
            )
    if unpacked > _MAX_ZIP_RATIO * packed + _ZIP_SLACK_BYTES:
        raise _Bad(
            f"compressed records expand from {_mib(packed)} to {_mib(unpacked)} (a zip bomb?); "
            f"torch.save writes records uncompressed and at most {_MAX_ZIP_RATIO}x expansion "
            "is read"
        )


def _check_pickle_size(info: zipfile.ZipInfo) -> None:
    if info.file_size > _MAX_PICKLE_BYTES:
        raise _Bad(
            f"pickle record {info.filename!r} is {_mib(info.file_size)}, far above the "
            f"{_mib(_MAX_PICKLE_BYTES)} a checkpoint's pickle takes (its tensors live in "
            "separate records)"
        )


def _read_small_record(zf: zipfile.ZipFile, name: str, limit: int, what: str) -> bytes:
    info = zf.getinfo(name)
    if info.file_size > limit:
        raise _Bad(f"{what} record {name!r} is {_mib(info.file_size)}, more than {_mib(limit)}")
    with zf.open(info) as member:
        return member.read(limit)  # zipfile stops at the declared size, and checks the CRC


def _read_zip_member(zf: zipfile.ZipFile, fh: IO[bytes], info: zipfile.ZipInfo) -> np.ndarray:
    if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
        # torch stores records uncompressed: read straight into the array, then check the CRC.
        fh.seek(info.header_offset)
        header = fh.read(30)
        if len(header) < 30 or header[:4] != b"PK\x03\x04":
            raise _Bad(f"bad local header for record {info.filename!r}")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        if start + info.file_size > os.fstat(fh.fileno()).st_size:
            raise _Bad(f"record {info.filename!r} runs past the end of the archive")
        fh.seek(start)
        buf = _read_exact(fh, info.file_size, f"record {info.filename!r}")
        if zlib.crc32(buf) != info.CRC:
            raise _Bad(f"CRC mismatch in record {info.filename!r} (file corrupt)")
        return buf
    with zf.open(info) as member:
        return _read_exact(member, info.file_size, f"record {info.filename!r}")  # type: ignore[arg-type]


def _load_zip(path: str, progress: Progress, shapes_only: bool = False) -> Any:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, struct.error) as e:
        raise _Bad(f"corrupt or truncated zip archive ({e})") from e
    with zf, open(path, "rb") as fh:
        names = zf.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise _Bad(f"zip archive has {len(pickles)} '<dir>/data.pkl' records, expected 1")
        _check_pickle_size(zf.getinfo(pickles[0]))
        _check_zip_sizes(zf, os.fstat(fh.fileno()).st_size)
        prefix = pickles[0][: -len("data.pkl")]
        if f"{prefix}constants.pkl" in names or any(n.startswith(f"{prefix}code/") for n in names):
            raise _Bad(
                "this is a TorchScript archive (torch.jit.save), not a torch.save checkpoint"
            )
        byteorder = "little"
        if f"{prefix}byteorder" in names:
            raw_order = _read_small_record(zf, f"{prefix}byteorder", _MAX_SMALL_RECORD, "byteorder")
            byteorder = raw_order.decode("ascii", "replace").strip()
            if byteorder not in ("little", "big"):
                raise _Bad(f"unknown byte order record {byteorder!r}")
        data = _read_small_record(zf, pickles[0], _MAX_PICKLE_BYTES, "pickle")
        storages: dict[str, _Storage] = {}
        tree = _unpickle(io.BytesIO(data), path, storages)
        del data
        if shapes_only:
            return _shapes_only(tree)

        def read_roots(roots: list[_Storage]) -> Iterator[tuple[_Storage, np.ndarray]]:
            infos = []
            for root in roots:
                name = f"{prefix}data/{root.key}"
                try:
                    info = zf.getinfo(name)
                except KeyError:
                    raise _Bad(f"storage record {name!r} is missing") from None
                if info.file_size != root.nbytes:
                    raise _Bad(
                        f"storage record {name!r} holds {info.file_size} bytes, "
                        f"the pickle expects {root.nbytes}"
                    )
                infos.append((info.header_offset, root, info))
            for _, root, info in sorted(infos, key=lambda t: t[0]):
                yield root, _read_zip_member(zf, fh, info)

        return _materialize(tree, read_roots, byteorder == "big", path, progress)


def read_zip_pickle(path: PathLike) -> bytes | None:
    """The ``<dir>/data.pkl`` record of a torch zip archive, as bytes (never unpickled), or
    None when the archive has no single one or its sizes are refused (a zip bomb, a pickle
    far above a checkpoint's): the loaders then say why. For cheap looks at key names."""
    p = os.fspath(path)
    try:
        with zipfile.ZipFile(p) as zf:
            _check_zip_sizes(zf, os.path.getsize(p))
            pickles = [n for n in zf.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                return None
            return _read_small_record(zf, pickles[0], _MAX_PICKLE_BYTES, "pickle")
    except (_Bad, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, struct.error, zlib.error):
        return None
    except (OSError, NotImplementedError):  # unreadable, or a compression zipfile lacks
        return None


def _load_legacy(path: str, progress: Progress, shapes_only: bool = False) -> Any:
    with open(path, "rb") as f:
        storages: dict[str, _Storage] = {}

        def load() -> Any:
            return _unpickle(f, path, storages)

        if load() != _LEGACY_MAGIC:
            raise _Bad("pickle stream without the PyTorch magic number (not a torch checkpoint)")
        version = load()
        if version != _LEGACY_PROTOCOL:
            raise _Bad(f"unsupported legacy protocol version {version!r}")
        if not isinstance(load(), dict):
            raise _Bad("legacy system-info record is not a dict")
        tree = load()
        keys = load()
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _Bad("legacy storage key list is invalid")
        # every listed storage follows as an 8-byte count and its bytes: refuse sizes the file
        # cannot hold before anything is allocated
        left = os.fstat(f.fileno()).st_size - f.tell()
        need = 0
        for key in keys:
            root = storages.get(key)
            if root is None:
                raise _Bad(f"storage key {key!r} is listed but never referenced")
            need += 8 + root.nbytes
            if need > left:
                raise _Bad(
                    f"storage {key!r} claims {root.numel} {root.elem.name} elements "
                    f"({root.nbytes} bytes), more than the {left} bytes left in the file"
                )
        if shapes_only:
            return _shapes_only(tree)

        def read_roots(roots: list[_Storage]) -> Iterator[tuple[_Storage, np.ndarray]]:
            wanted = {r.key for r in roots}
            for key in keys:
                root = storages.get(key)
                if root is None:
                    raise _Bad(f"storage key {key!r} is listed but never referenced")
                head = f.read(8)
                if len(head) != 8:
                    raise _Bad(f"file ends before storage {key!r}")
                (numel,) = struct.unpack("<q", head)
                if numel != root.numel:
                    raise _Bad(
                        f"storage {key!r} holds {numel} elements, the pickle expects {root.numel}"
                    )
                if key in wanted:
                    yield root, _read_exact(f, root.nbytes, f"storage {key!r}")
                else:
                    f.seek(root.nbytes, os.SEEK_CUR)

        # legacy storages are always written little-endian
        return _materialize(tree, read_roots, False, path, progress)


_SAFETENSORS_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "U64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "C64": 8,
}


def _check_safetensors_header(header: dict[str, Any], data_bytes: int) -> None:
    """Every entry well formed, its byte range inside the file and of its shape's size:
    refused before anything is allocated."""
    for name, info in header.items():
        if not isinstance(info, dict):
            raise _Bad(f"safetensors entry {name!r} is not a JSON object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            raise _Bad(f"safetensors entry {name!r} has no dtype")
        if dtype not in _SAFETENSORS_ITEMSIZE:
            raise _Bad(f"tensor {name!r} has unsupported dtype {dtype}")
        if not isinstance(shape, list) or not all(
            type(d) is int and 0 <= d < 1 << 62 for d in shape
        ):
            raise _Bad(f"safetensors entry {name!r} has an invalid shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(x) is int for x in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _Bad(f"safetensors entry {name!r} has invalid data_offsets {offsets!r}")
        if offsets[1] > data_bytes:
            raise _Bad(
                f"tensor {name!r} claims bytes {offsets[0]}..{offsets[1]}, past the end of the "
                f"file's {data_bytes} data bytes"
            )
        size = math.prod(shape) * _SAFETENSORS_ITEMSIZE[dtype]
        if offsets[1] - offsets[0] != size:
            raise _Bad(
                f"tensor {name!r} of shape {shape} ({dtype}) needs {size} bytes, its "
                f"data_offsets span {offsets[1] - offsets[0]}"
            )


def _load_safetensors(path: str, progress: Progress, shapes_only: bool = False) -> Any:
    try:
        from safetensors import safe_open
    except ImportError as e:  # pragma: no cover - safetensors is a dependency
        raise ImportError(f"reading '{path}' needs the 'safetensors' package") from e
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _Bad(f"safetensors header is not valid JSON ({e})") from e
        if not isinstance(header, dict):
            raise _Bad("safetensors header is not a JSON object")
        header.pop("__metadata__", None)
        _check_safetensors_header(header, os.fstat(f.fileno()).st_size - 8 - n)
        if shapes_only:
            return {name: _ShapeLeaf(tuple(info["shape"])) for name, info in header.items()}
        try:
            handle = safe_open(path, framework="np")
        except Exception as e:  # SafetensorError and friends
            raise _Bad(f"invalid safetensors file ({e})") from e
        out: dict[str, np.ndarray] = {}
        total = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in header.values())
        with handle, _progress_bar(path, total, progress) as bar:
            for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
                info = header[name]
                begin, end = info["data_offsets"]
                if info["dtype"] == "BF16":
                    f.seek(8 + n + begin)
                    raw = _read_exact(f, end - begin, f"tensor {name!r}").view("<u2")
                    out[name] = _finish(raw, _ELEMS["bfloat16"]).reshape(info["shape"])
                else:
                    arr = handle.get_tensor(name)
                    out[name] = arr if arr.flags.writeable else arr.copy()
                bar.update(end - begin)
        return out


def _sniff(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(512)
    size = os.path.getsize(path)
    if not head:
        raise _Bad("file is empty")
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:1] == b"\x80" or head.startswith(b"L%d" % _LEGACY_MAGIC):  # protocol >= 2, or 0/1
        return "legacy"
    if len(head) >= 9 and head[8:9] == b"{":
        (n,) = struct.unpack("<Q", head[:8])
        if 2 <= n <= min(size - 8, _MAX_SAFETENSORS_HEADER):
            return "safetensors"
    if len(head) >= 262 and head[257:262] == b"ustar":
        raise _Bad("legacy tar checkpoint (torch < 0.4) is not supported")
    raise UnknownCheckpointFormatError(
        f"checkpoint '{path}' is in an unknown format: not a torch zip archive, a legacy torch "
        "file, or safetensors"
    )


_LOADERS: dict[str, Callable[[str, Progress, bool], Any]] = {
    "zip": _load_zip,
    "legacy": _load_legacy,
    "safetensors": _load_safetensors,
}


# ----------------------------------------------------------------------------- public API


def load_checkpoint_tree(path: PathLike, *, progress: Progress = False) -> Any:
    """Read a checkpoint and return its object tree with tensors as numpy arrays.

    Dicts (incl. ``OrderedDict``), lists, tuples and Python scalars come back as stored; torch
    dtype objects become strings such as ``"torch.float16"``. Safetensors files yield a flat
    dict. ``progress=True`` shows a tqdm bar for files over ``PROGRESS_MIN_BYTES``;
    ``progress="always"`` shows it regardless of size.
    """
    return _read_tree(path, progress, shapes_only=False)


def _read_tree(path: PathLike, progress: Progress, shapes_only: bool) -> Any:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(errno.ENOENT, "checkpoint not found", p)
    if os.path.isdir(p):
        raise IsADirectoryError(errno.EISDIR, "checkpoint path is a directory", p)
    try:
        return _LOADERS[_sniff(p)](p, progress, shapes_only)
    except _Bad as e:
        raise CheckpointFormatError(f"cannot read checkpoint '{p}': {e}") from None
    except CheckpointError:
        raise
    except RecursionError:
        raise CheckpointFormatError(
            f"cannot read checkpoint '{p}': objects nested too deeply"
        ) from None
    except (MemoryError, OSError):
        raise
    except Exception as e:  # malformed pickle opcodes, bad argument types, short reads, ...
        raise CheckpointFormatError(
            f"cannot read checkpoint '{p}': corrupt or truncated data ({type(e).__name__}: {e})"
        ) from e


def _flatten(tree: Any, prefix: str, out: dict[str, Any], seen: set[int]) -> None:
    if isinstance(tree, np.ndarray | _ShapeLeaf):
        if prefix in out:
            raise _Bad(f"key {prefix!r} occurs twice after flattening")
        out[prefix] = tree
        return
    if id(tree) in seen:
        return
    if isinstance(tree, dict):
        seen.add(id(tree))
        items: Iterable[tuple[Any, Any]] = tree.items()
    elif isinstance(tree, list | tuple):
        seen.add(id(tree))
        items = enumerate(tree)
    else:
        return
    for k, v in items:
        _flatten(v, f"{prefix}.{k}" if prefix else str(k), out, seen)


def load_state_dict(path: PathLike, *, progress: Progress = False) -> dict[str, np.ndarray]:
    """Read a checkpoint and return ``{name: array}`` for every tensor in it.

    If the top-level dict holds no tensors itself but has exactly one of the keys ``"model"``
    or ``"state_dict"`` holding a dict, that dict is used instead (one level only; other
    entries such as optimizer state are ignored). Nested dicts, lists and tuples are flattened
    into dotted keys; non-tensor leaves (ints, strings, ...) are skipped. Use
    :func:`load_checkpoint_tree` to see the full object.
    """
    p = os.fspath(path)
    return _state(p, load_checkpoint_tree(p, progress=progress))


def load_tensor_shapes(path: PathLike) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of the tensors :func:`load_state_dict` would return, from the
    checkpoint's pickle (or safetensors header) alone: no tensor data is read."""
    p = os.fspath(path)
    state = _state(p, _read_tree(p, False, shapes_only=True))
    return {k: v.shape for k, v in state.items()}


def _state(p: str, tree: Any) -> dict[str, Any]:
    if not isinstance(tree, dict):
        raise CheckpointFormatError(
            f"checkpoint '{p}' holds a {type(tree).__name__}, not a dict of tensors"
        )
    if not any(isinstance(v, np.ndarray | _ShapeLeaf) for v in tree.values()):
        wrappers = [k for k in ("model", "state_dict") if isinstance(tree.get(k), dict)]
        if len(wrappers) > 1:
            raise CheckpointFormatError(
                f"checkpoint '{p}' has both 'model' and 'state_dict' entries; pick one via "
                "load_checkpoint_tree"
            )
        if wrappers:
            tree = tree[wrappers[0]]
    out: dict[str, Any] = {}
    try:
        _flatten(tree, "", out, set())
    except _Bad as e:
        raise CheckpointFormatError(f"checkpoint '{p}': {e}") from None
    if not out:
        raise CheckpointFormatError(f"checkpoint '{p}' contains no tensors")
    return out
