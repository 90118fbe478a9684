"""A tiny protocol-2 pickle writer, so checkpoints (good and hostile) can be built without
torch: globals, calls, persistent ids, BUILD, containers and scalars; torch zip and legacy files
around them."""

from __future__ import annotations

import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class G:
    """A global reference (GLOBAL opcode)."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class R:
    """A call: ``func(*args)`` (REDUCE opcode)."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args


class P:
    """A persistent id (BINPERSID opcode)."""

    def __init__(self, pid: tuple) -> None:
        self.pid = pid


class Build:
    """``obj`` followed by BUILD with ``state``."""

    def __init__(self, obj: Any, state: Any) -> None:
        self.obj, self.state = obj, state


def enc(obj: Any) -> bytes:
    if isinstance(obj, G):
        return b"c" + f"{obj.module}\n{obj.name}\n".encode()
    if isinstance(obj, R):
        return enc(obj.func) + enc(tuple(obj.args)) + b"R"
    if isinstance(obj, P):
        return enc(obj.pid) + b"Q"
    if isinstance(obj, Build):
        return enc(obj.obj) + enc(obj.state) + b"b"
    if isinstance(obj, tuple):
        return b"(" + b"".join(enc(v) for v in obj) + b"t"
    if isinstance(obj, list):
        return b"](" + b"".join(enc(v) for v in obj) + b"e"
    if isinstance(obj, dict):
        return b"}(" + b"".join(enc(k) + enc(v) for k, v in obj.items()) + b"u"
    return pickle.dumps(obj, protocol=2)[2:-1]  # scalars and strings


def dumps(obj: Any) -> bytes:
    return b"\x80\x02" + enc(obj) + b"."


def tensor_rec(
    storage_cls: str, key: str, numel: int, offset: int, size: tuple, stride: tuple
) -> R:
    storage = P(("storage", G("torch", storage_cls), key, "cpu", numel))
    hooks = R(G("collections", "OrderedDict"))
    return R(G("torch._utils", "_rebuild_tensor_v2"), storage, offset, size, stride, False, hooks)


def write_zip(
    path: Path,
    obj: Any,
    records: dict[str, bytes],
    *,
    byteorder: str | None = "little",
    pkl: bytes | None = None,
    compression: int = zipfile.ZIP_STORED,
) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("archive/data.pkl", dumps(obj) if pkl is None else pkl)
        if byteorder is not None:
            z.writestr("archive/byteorder", byteorder)
        for key, data in records.items():
            z.writestr(f"archive/data/{key}", data)
    return path


def write_legacy(path: Path, main_pickle: bytes, storages: dict[str, tuple[int, bytes]]) -> Path:
    with open(path, "wb") as f:
        f.write(pickle.dumps(LEGACY_MAGIC, protocol=2))
        f.write(pickle.dumps(1001, protocol=2))
        f.write(pickle.dumps({"protocol_version": 1001, "little_endian": True}, protocol=2))
        f.write(main_pickle)
        f.write(pickle.dumps(sorted(storages), protocol=2))
        for key in sorted(storages):
            numel, data = storages[key]
            f.write(struct.pack("<q", numel) + data)
    return path
