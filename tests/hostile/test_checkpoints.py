"""Hostile checkpoints: each is refused by the command line with exit status 2 and exactly one
stderr line naming the problem, and the process refusing it stays under 1.5 GB of memory
(importing Paddle alone takes a few hundred MB).

``CASES`` is one table, a line per case: a name, the function that writes the hostile file
into a folder (and returns the command line to run on it) and a regular expression the error
line must match. Every file is crafted here, without torch: zip archives with ``zipfile``,
pickles by hand, safetensors headers as JSON, sidecars next to a copy of the bundled model.
Each case runs ``python -m paddle_sam`` in a child process, alone, and reads that child's
peak RSS from ``os.wait4`` (in a launcher process: see ``LAUNCHER``).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from paddle_sam.loading.sam_v1 import DEFAULT_MODEL
from tests.helpers.pickles import LEGACY_MAGIC, G, R, dumps, tensor_rec

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "paddle_sam" / "assets" / "example.png"
MAX_RSS_BYTES = 1.5e9
CHILD_TIMEOUT_S = 120
MiB = 1 << 20


def tensor(storage_cls: str, numel: int, size: tuple, stride: tuple) -> R:
    """``_rebuild_tensor_v2`` of storage "0" (``numel`` elements of ``storage_cls``)."""
    return tensor_rec(storage_cls, "0", numel, 0, size, stride)


def convert_argv(src: Path) -> list[str]:
    return ["convert", str(src), str(src.parent / "out.pdparams")]


def write_zip(path: Path, obj: Any, storage: bytes) -> list[str]:
    """A torch.save layout: pickle, byte order, one uncompressed storage record."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", dumps(obj))
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", storage)
    return convert_argv(path)


def write_zeros(member: Any, n: int) -> None:
    chunk = bytes(16 * MiB)
    while n:
        member.write(chunk[: min(n, len(chunk))])
        n -= min(n, len(chunk))


# ----------------------------------------------------------------------------- the hostile files


def zip_bomb(tmp: Path) -> list[str]:
    """A 1.5 GiB float storage deflated to ~1.5 MB: the pickle and the record agree."""
    numel = 3 << 27  # 1.5 GiB of float32
    path = tmp / "bomb.pth"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", dumps({"w": tensor("FloatStorage", numel, (numel,), (1,))}))
        info = zipfile.ZipInfo("archive/data/0")
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w") as member:
            write_zeros(member, numel * 4)
    assert path.stat().st_size < 4 * MiB
    return convert_argv(path)


def huge_pickle(tmp: Path) -> list[str]:
    """A data.pkl of 80 MiB (one byte string of zeros), deflated to ~80 KB."""
    n = 80 * MiB
    path = tmp / "huge_pickle.pth"
    with zipfile.ZipFile(path, "w") as z:
        info = zipfile.ZipInfo("archive/data.pkl")
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w") as member:
            member.write(b"\x80\x04}\x8c\x03padB" + struct.pack("<I", n))  # {"pad": bytes(n)}
            write_zeros(member, n)
            member.write(b"s.")
        z.writestr("archive/byteorder", "little")
    return convert_argv(path)


def broadcast(storage_cls: str) -> Callable[[Path], list[str]]:
    """One element broadcast (stride 0) to 3 x 2^26 elements: 768 MiB once widened to
    float32, half that as stored (bfloat16 / float16)."""

    def make(tmp: Path) -> list[str]:
        numel = 3 << 26
        obj = {"w": tensor(storage_cls, 1, (numel,), (0,))}
        return write_zip(tmp / f"broadcast_{storage_cls}.pth", obj, bytes(2))

    return make


def legacy_2_40(tmp: Path) -> list[str]:
    """A legacy (torch < 1.6) file whose storage claims 2^40 floats, holding 16 bytes."""
    numel = 1 << 40
    path = tmp / "legacy.pth"
    with open(path, "wb") as f:
        for record in (LEGACY_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True}):
            f.write(pickle.dumps(record, protocol=2))
        f.write(dumps({"w": tensor("FloatStorage", numel, (numel,), (1,))}))
        f.write(pickle.dumps(["0"], protocol=2))
        f.write(struct.pack("<q", numel) + bytes(16))
    return convert_argv(path)


def lying_safetensors(tmp: Path) -> list[str]:
    """A safetensors header declaring a 1 GiB tensor in a file of 16 data bytes."""
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [1 << 28], "data_offsets": [0, 1 << 30]}}
    ).encode()
    path = tmp / "lying.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    return convert_argv(path)


def sidecar(edit: Callable[[dict], None]) -> Callable[[Path], list[str]]:
    """The bundled model (a 7 MB .pdparams) with its sidecar edited by ``edit``."""

    def make(tmp: Path) -> list[str]:
        ckpt = tmp / "model.pdparams"
        shutil.copyfile(DEFAULT_MODEL, ckpt)
        meta = json.loads(Path(f"{DEFAULT_MODEL}.json").read_text())
        edit(meta)
        Path(f"{ckpt}.json").write_text(json.dumps(meta))
        out = tmp / "out"
        return ["segment", str(IMAGE), "--point", "5,5", "--checkpoint", str(ckpt), "-o", str(out)]

    return make


def spec_set(**values: Any) -> Callable[[dict], None]:
    return lambda meta: meta["spec"].update(values)


def vit_h_spec(meta: dict) -> None:
    from paddle_sam.models.sam_v1.build_sam import SAM_SPECS

    meta["spec"] = json.loads(json.dumps(SAM_SPECS["vit_h"].to_dict()))
    meta["model_type"] = "vit_h"


def set_meta(key: str, value: Any) -> Callable[[dict], None]:
    return lambda meta: meta.update({key: value})


SIDE = r"sidecar \S+model\.pdparams\.json: "

# (name, maker, the error line's expected pattern)
CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("zip bomb storage", zip_bomb, r"expand from [\d.]+ MiB to 1536\.0 MiB \(a zip bomb\?\)"),
    ("huge compressed data.pkl", huge_pickle, r"pickle record 'archive/data\.pkl' is 80\.0 MiB"),
    ("bf16 stride-0 broadcast", broadcast("BFloat16Storage"), r"broadcast tensors expand"),
    ("fp16 stride-0 broadcast", broadcast("HalfStorage"), r"broadcast tensors expand"),
    ("legacy 2^40 floats", legacy_2_40, r"claims 1099511627776 float32 elements .* more than"),
    ("safetensors offsets", lying_safetensors, r"claims bytes 0\.\.1073741824, past the end"),
    (
        "sidecar float size",
        sidecar(spec_set(encoder_depth=4.5)),
        SIDE + r"bad SamSpec values: encoder_depth must be an integer",
    ),
    ("sidecar spec not object", sidecar(set_meta("spec", "vit_h")), SIDE + r"'spec' must be"),
    ("sidecar zero size", sidecar(spec_set(encoder_depth=0)), SIDE + r".*must be positive"),
    ("sidecar negative size", sidecar(spec_set(decoder_mlp_dim=-512)), SIDE + r".*positive"),
    (
        "sidecar spec vs weights",
        sidecar(spec_set(window_size=8)),
        SIDE + r"its spec does not match the weights .*rel_pos_h: file \[7, 32\], spec \[15, 32\]",
    ),
    (
        "sidecar far bigger",
        sidecar(vit_h_spec),
        SIDE + r"its spec describes a model of at least 6\d\d,\d{3},\d{3} parameters",
    ),
]


# Runs the command and reports its exit status and peak RSS. A forked child's peak RSS counts
# the memory of the process that forked it (Linux keeps the pre-exec high-water mark), so the
# command is started by this small launcher, not by pytest, whose memory would be counted.
LAUNCHER = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss * 1024}")
"""


def run_child(argv: list[str], cwd: Path) -> tuple[int, str, int]:
    """``python -m paddle_sam *argv`` alone: (exit status, stderr, peak RSS in bytes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    report = cwd / "report.txt"
    command = [sys.executable, "-c", LAUNCHER, str(report), sys.executable, "-m", "paddle_sam"]
    with open(cwd / "stdout.txt", "wb") as out, open(cwd / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(
            [*command, *argv], cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True
        )
        try:
            proc.wait(CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"paddle-sam {argv[0]} ran past {CHILD_TIMEOUT_S}s")
    assert proc.returncode == 0, (cwd / "stderr.txt").read_text()  # the launcher's own
    code, peak = (int(v) for v in report.read_text().split())
    return code, (cwd / "stderr.txt").read_text(), peak


@pytest.mark.parametrize(("name", "make", "pattern"), CASES, ids=[c[0] for c in CASES])
def test_hostile_checkpoint_is_one_line_error(
    tmp_path: Path, name: str, make: Callable[[Path], list[str]], pattern: str
) -> None:
    argv = make(tmp_path)
    code, stderr, peak = run_child(argv, tmp_path)
    lines = stderr.splitlines()
    print(f"{name}: exit {code}, peak RSS {peak / 2**20:.0f} MiB, stderr {lines}")
    assert code == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"paddle-sam {argv[0]}: error: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    assert peak < MAX_RSS_BYTES, f"{name}: peak RSS {peak / 2**20:.0f} MiB"
    assert not (tmp_path / "out.pdparams").exists() and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- in-process checks


def test_model_floor_is_a_lower_bound() -> None:
    """The sidecar check refuses a spec whose floor exceeds the file: the floor must never
    exceed the real model (built lazily here: shapes only)."""
    import numpy as np
    import paddle

    from paddle_sam.convert.checkpoint import model_floor
    from paddle_sam.models.sam3.build_sam3 import SAM3_SPEC, build_sam3_model
    from paddle_sam.models.sam_v1.build_sam import SAM_SPECS, SamSpec, build_sam_model
    from tests.helpers.specs import one_layer_sam3_spec

    # a deeper trunk, text encoder and detector encoder than the conversion tests', two FPN levels
    tiny3 = one_layer_sam3_spec(
        encoder_depth=3, text_layers=2, encoder_layers=2, scale_factors=(2.0, 1.0)
    )
    odd = SamSpec(24, 3, 3, (2,), 96, 8, 5, 2.5, 16, 4, 3, 8, 2, 2, 4, 8)
    cases = [*SAM_SPECS.values(), odd, SAM3_SPEC, tiny3]
    for spec in cases:
        with paddle.LazyGuard():
            model = (build_sam_model if isinstance(spec, SamSpec) else build_sam3_model)(spec)
        state = model.state_dict()
        elements = sum(int(np.prod(v.shape)) for v in state.values())
        elements += sum(int(np.prod(b.shape)) for n, b in model.named_buffers() if n not in state)
        floor, tensors = model_floor(spec)
        assert 0.6 * elements < floor <= elements, spec
        assert tensors <= len(state), spec


def test_true_sidecars_pass(tmp_path: Path) -> None:
    """The check accepts the bundled model's own sidecar (SAM 3 sidecars: tests/cli)."""
    from paddle_sam.convert.checkpoint import checked_sidecar_spec, weight_shapes
    from paddle_sam.models.sam_v1.build_sam import SAM_SPECS, SamSpec

    meta = json.loads(Path(f"{DEFAULT_MODEL}.json").read_text())
    assert checked_sidecar_spec(DEFAULT_MODEL, meta, SamSpec) == SAM_SPECS["vit_tiny_synthetic"]
    shapes = weight_shapes(DEFAULT_MODEL)
    assert shapes is not None and shapes["image_encoder.pos_embed"] == (1, 16, 16, 128)


def test_pdparams_shapes_skip_the_data(tmp_path: Path) -> None:
    """Shapes of a .pdparams come from its pickle; the array bytes are never read, and a
    pickle naming any other global is refused."""
    import numpy as np

    from paddle_sam.convert.core import CheckpointError, pdparams_shapes

    path = tmp_path / "big.pdparams"
    big = np.zeros((4, MiB), np.float32)  # 16 MiB: skipped
    with open(path, "wb") as f:
        pickle.dump({"big": big, "small": np.ones(3, np.float16), "name": "x"}, f, protocol=4)
    assert pdparams_shapes(path) == {"big": (4, MiB), "small": (3,)}
    path.write_bytes(pickle.dumps({"evil": G}, protocol=4))
    with pytest.raises(CheckpointError, match="refusing to load global"):
        pdparams_shapes(path)
    raw = pickle.dumps({"big": big}, protocol=4)
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match=r"big\.pdparams"):
        pdparams_shapes(path)
    # a byte string of 2^60 bytes: refused (memory or truncation), never a traceback
    path.write_bytes(b"\x80\x04}\x8c\x01w\x8e" + struct.pack("<Q", 1 << 60) + bytes(64))
    with pytest.raises(CheckpointError, match=r"not a valid \.pdparams file"):
        pdparams_shapes(path)
