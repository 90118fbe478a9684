"""Tests for the torch-free checkpoint reader (paddle_sam.convert.torch_reader)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paddle_sam.convert.core import (
    CheckpointFormatError,
    UnknownCheckpointFormatError,
    UnsafeCheckpointError,
)
from paddle_sam.convert.torch_reader import load_checkpoint_tree, load_state_dict
from tests.helpers.pickles import (
    Build,
    G,
    P,
    R,
    dumps,
    tensor_rec,
    write_legacy,
    write_zip,
)

# ----------------------------------------------------------------------------- torch-free tests


def test_handmade_zip_views_and_dtypes(tmp_path: Path) -> None:
    base = np.arange(24, dtype=np.float32)
    bf16 = np.array([1.5, -2.25, 2.0**100, np.inf], dtype=np.float32)
    bf16_bits = (bf16.view(np.uint32) >> 16).astype("<u2")
    obj = {
        "m": tensor_rec("FloatStorage", "0", 24, 0, (4, 6), (6, 1)),
        "t": tensor_rec("FloatStorage", "0", 24, 2, (3, 4), (1, 6)),
        "x": tensor_rec("FloatStorage", "0", 24, 5, (2, 2), (0, 3)),
        "b": tensor_rec("BFloat16Storage", "1", 4, 0, (2, 2), (2, 1)),
        "meta": {"epoch": 3, "name": "run", "lr": 1e-4, "bytes": b"\x00\xff"},
    }
    path = write_zip(tmp_path / "w.pth", obj, {"0": base.tobytes(), "1": bf16_bits.tobytes()})
    tree = load_checkpoint_tree(path)
    m = base.reshape(4, 6)
    np.testing.assert_array_equal(tree["m"], m)
    np.testing.assert_array_equal(
        tree["t"], np.lib.stride_tricks.as_strided(base[2:], (3, 4), (4, 24))
    )
    np.testing.assert_array_equal(tree["x"], [[5, 8], [5, 8]])
    assert tree["b"].dtype == np.float32
    np.testing.assert_array_equal(tree["b"], bf16.reshape(2, 2))
    assert tree["meta"] == {"epoch": 3, "name": "run", "lr": 1e-4, "bytes": b"\x00\xff"}
    assert not np.shares_memory(tree["m"], tree["t"])
    assert all(tree[k].flags.c_contiguous and tree[k].flags.writeable for k in "mtxb")
    assert sorted(load_state_dict(path)) == ["b", "m", "t", "x"]


def test_handmade_big_endian_and_deflated(tmp_path: Path) -> None:
    data = np.array([1.0, -2.0, 3.5], dtype=">f4").tobytes()
    obj = {"w": tensor_rec("FloatStorage", "0", 3, 0, (3,), (1,))}
    path = write_zip(tmp_path / "be.pth", obj, {"0": data}, byteorder="big")
    out = load_state_dict(path)["w"]
    assert out.dtype == np.float32 and out.dtype.isnative
    np.testing.assert_array_equal(out, [1.0, -2.0, 3.5])
    little = np.array([4, 5], dtype="<i8").tobytes()
    obj = {"w": tensor_rec("LongStorage", "0", 2, 0, (2,), (1,))}
    path = write_zip(tmp_path / "d.pth", obj, {"0": little}, compression=zipfile.ZIP_DEFLATED)
    np.testing.assert_array_equal(load_state_dict(path)["w"], [4, 5])


def test_handmade_legacy_with_storage_view(tmp_path: Path) -> None:
    base = np.arange(10, dtype=np.float64)
    view_storage = P(("storage", G("torch", "DoubleStorage"), "0", "cpu", 10, ("v", 4, 3)))
    rebuild = G("torch._utils", "_rebuild_tensor")
    obj = {"v": R(rebuild, view_storage, 1, (2,), (1,))}
    path = write_legacy(tmp_path / "l.pth", dumps(obj), {"0": (10, base.tobytes())})
    np.testing.assert_array_equal(load_state_dict(path)["v"], [5.0, 6.0])


def test_reader_does_not_import_torch(tmp_path: Path) -> None:
    obj = {"w": tensor_rec("FloatStorage", "0", 1, 0, (1,), (1,))}
    path = write_zip(tmp_path / "w.pth", obj, {"0": np.float32(7).tobytes()})
    code = (
        "import sys\n"
        "from paddle_sam.convert.torch_reader import load_state_dict\n"
        f"assert float(load_state_dict({str(path)!r})['w'][0]) == 7.0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env, timeout=120)


def _evil_pickles(marker: Path) -> dict[str, bytes]:
    class System:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    class Eval:
        def __reduce__(self) -> tuple:
            return (eval, (f"open({str(marker)!r}, 'w').close()",))

    hooks_evil = R(G("builtins", "exec"), f"open({str(marker)!r}, 'w').close()")
    nested = {
        "w": R(G("torch._utils", "_rebuild_tensor_v2"), None, 0, (1,), (1,), False, hooks_evil)
    }
    return {
        "system-p2": pickle.dumps({"w": System()}, protocol=2),
        "system-p0": pickle.dumps(System(), protocol=0),
        "eval-p4": pickle.dumps([1, Eval()], protocol=4),
        "eval-p5": pickle.dumps({"model": {"x": Eval()}}, protocol=5),
        "exec-in-tensor-args": dumps(nested),
        "harmless-but-unlisted": dumps({"args": R(G("argparse", "Namespace"))}),
    }


@pytest.mark.parametrize("case", list(_evil_pickles(Path("x"))))
@pytest.mark.parametrize("container", ["zip", "legacy", "bare-pickle"])
def test_malicious_pickle_is_refused(tmp_path: Path, case: str, container: str) -> None:
    marker = tmp_path / "pwned"
    payload = _evil_pickles(marker)[case]
    path = tmp_path / "evil.pth"
    if container == "zip":
        write_zip(path, None, {}, pkl=payload)
    elif container == "legacy":
        write_legacy(path, payload, {})
    else:
        path.write_bytes(payload)
        if not payload.startswith(b"\x80"):  # protocol 0: not recognised as a checkpoint at all
            with pytest.raises(UnknownCheckpointFormatError):
                load_state_dict(path)
            assert not marker.exists()
            return
    with pytest.raises(UnsafeCheckpointError) as info:
        load_state_dict(path)
    message = str(info.value)
    assert "refusing to load global" in message and str(path) in message
    expected = {"system": "system'", "eval": "builtins.eval", "exec": "builtins.exec"}
    expected["harmless"] = "argparse.Namespace"
    assert expected[case.split("-")[0]] in message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("obj", "records", "needle"),
    [
        (
            {"w": tensor_rec("FloatStorage", "0", 4, 2, (3,), (1,))},
            {"0": bytes(16)},
            "past the end",
        ),
        (
            {"w": tensor_rec("FloatStorage", "0", 4, 0, (2, 2), (1, 3))},
            {"0": bytes(16)},
            "past the end",
        ),
        ({"w": tensor_rec("FloatStorage", "0", 4, 0, (4,), (1,))}, {}, "missing"),
        (
            {"w": tensor_rec("FloatStorage", "0", 4, 0, (4,), (1,))},
            {"0": bytes(12)},
            "holds 12 bytes",
        ),
        ({"w": tensor_rec("FloatStorage", "0", 4, "0", (4,), (1,))}, {"0": bytes(16)}, "invalid"),
        ({"w": tensor_rec("FloatStorage", "0", 4, 0, (4,), (1, 1))}, {"0": bytes(16)}, "length"),
        ({"w": tensor_rec("FloatStorage", "0", 1, 0, (1 << 40,), (0,))}, {"0": bytes(4)}, "expand"),
        ({"w": R(G("torch._utils", "_rebuild_tensor_v2"), 5, 0, (1,), (1,))}, {}, "storage"),
        ({"w": R(G("torch", "FloatStorage"), 3)}, {}, "not callable"),
        ({"w": Build(G("torch", "float32"), {"elem": 1})}, {}, "set state"),
        (
            {"w": Build(G("torch._utils", "_rebuild_tensor_v2"), (None, {"__defaults__": ()}))},
            {},
            "set state",
        ),
        ({"w": Build(G("collections", "OrderedDict"), {"x": 1})}, {}, "set state"),
        ({"w": tensor_rec("QInt8Storage", "0", 1, 0, (1,), (1,))}, {}, "unsupported"),
    ],
)
def test_bad_tensor_records(tmp_path: Path, obj: Any, records: dict, needle: str) -> None:
    path = write_zip(tmp_path / "bad.pth", obj, records)
    with pytest.raises(CheckpointFormatError, match=needle) as info:
        load_state_dict(path)
    assert str(path) in str(info.value)


def test_corrupt_storage_bytes_fail_crc(tmp_path: Path) -> None:
    obj = {"w": tensor_rec("FloatStorage", "0", 64, 0, (64,), (1,))}
    path = write_zip(tmp_path / "c.pth", obj, {"0": np.arange(64, dtype=np.float32).tobytes()})
    raw = bytearray(path.read_bytes())
    pos = raw.index(np.arange(64, dtype=np.float32).tobytes()) + 100
    raw[pos] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointFormatError, match="CRC"):
        load_state_dict(path)


def test_truncated_files(tmp_path: Path) -> None:
    obj = {"w": tensor_rec("FloatStorage", "0", 64, 0, (64,), (1,))}
    data = {"0": bytes(256)}
    full = write_zip(tmp_path / "z.pth", obj, data).read_bytes()
    legacy = write_legacy(tmp_path / "l.pth", dumps(obj), {"0": (64, bytes(256))}).read_bytes()
    for name, blob in [("z.pth", full), ("l.pth", legacy)]:
        for cut in (len(blob) // 2, len(blob) - 10, 3):
            path = tmp_path / f"cut-{cut}-{name}"
            path.write_bytes(blob[:cut])
            with pytest.raises(CheckpointFormatError) as info:
                load_state_dict(path)
            assert str(path) in str(info.value)


def test_empty_random_missing_and_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointFormatError, match="empty"):
        load_state_dict(empty)
    noise = tmp_path / "noise.bin"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(UnknownCheckpointFormatError, match="unknown format") as info:
        load_state_dict(noise)
    assert str(noise) in str(info.value)
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(CheckpointFormatError, match="magic"):
        load_state_dict(plain)
    missing = tmp_path / "nope" / "sam.pth"
    with pytest.raises(FileNotFoundError, match="sam.pth"):
        load_state_dict(missing)
    with pytest.raises(IsADirectoryError):
        load_state_dict(tmp_path)
    assert issubclass(CheckpointFormatError, ValueError)
    assert issubclass(UnsafeCheckpointError, ValueError)


def test_unwrap_rules(tmp_path: Path) -> None:
    one = np.float32(1).tobytes()
    w = tensor_rec("FloatStorage", "0", 1, 0, (1,), (1,))

    def write(obj: Any, name: str) -> Path:
        return write_zip(tmp_path / name, obj, {"0": one})

    assert list(load_state_dict(write({"model": {"a.w": w}, "epoch": 2}, "m.pth"))) == ["a.w"]
    assert list(load_state_dict(write({"state_dict": {"w": w}}, "s.pth"))) == ["w"]
    # top level holds a tensor: no unwrapping, nested keys are flattened
    assert sorted(load_state_dict(write({"x": w, "model": {"w": w}}, "t.pth"))) == ["model.w", "x"]
    with pytest.raises(CheckpointFormatError, match="both"):
        load_state_dict(write({"model": {"w": w}, "state_dict": {"w": w}}, "b.pth"))
    with pytest.raises(CheckpointFormatError, match="no tensors"):
        load_state_dict(write({"epoch": 1}, "n.pth"))
    with pytest.raises(CheckpointFormatError, match="list"):
        load_state_dict(write([w], "l.pth"))
    tree = load_checkpoint_tree(tmp_path / "m.pth")
    assert tree["epoch"] == 2 and isinstance(tree["model"]["a.w"], np.ndarray)


def test_progress_always(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    obj = {"w": tensor_rec("FloatStorage", "0", 1, 0, (1,), (1,))}
    path = write_zip(tmp_path / "p.pth", obj, {"0": np.float32(2).tobytes()})
    assert load_state_dict(path, progress="always")["w"][0] == 2
    assert "p.pth" in capsys.readouterr().err
    load_state_dict(path, progress=True)  # small file: no bar
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- against real torch


def _torch_payload() -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=g)
    bf = torch.randn(4, 6, generator=g).to(torch.bfloat16)
    lin = torch.nn.Linear(3, 2)
    return {
        "f32": base,
        "f32_t": base.t(),  # transposed view of the same storage
        "f32_slice": base[1:5, ::3],  # offset + step
        "f32_row": base[2],
        "f32_expand": torch.arange(3.0).unsqueeze(0).expand(4, 3),  # stride 0
        "f16": torch.randn(5, 3, generator=g).half()[:, 1],
        "bf16": bf,
        "bf16_t": bf.t()[1:],
        "f64": torch.randn(2, 3, 4, generator=g, dtype=torch.float64).permute(2, 0, 1),
        "i64": torch.arange(-5, 7, dtype=torch.int64).reshape(3, 4),
        "i32": torch.tensor([1, -2, 2**31 - 1], dtype=torch.int32),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([[True, False], [False, True]]).t(),
        "c64": torch.complex(torch.randn(3, 2, generator=g), torch.randn(3, 2, generator=g)),
        "c128": torch.randn(3, generator=g, dtype=torch.complex128)[::2],
        "u16": torch.tensor([1, 2, 65535], dtype=torch.uint16),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 4),
        "param": torch.nn.Parameter(torch.randn(2, 2, generator=g)),
        "nested": {"lin": lin.state_dict(), "deeper": {"x": base[0, :4]}, "n": 7, "s": "ok"},
    }


def _reference(t: Any) -> np.ndarray:
    t = t.detach()
    return t.float().numpy() if t.dtype == __import__("torch").bfloat16 else t.numpy()


def _assert_matches(got: Any, want: Any) -> None:
    torch = pytest.importorskip("torch")
    if isinstance(want, torch.Tensor):
        ref = _reference(want)
        assert isinstance(got, np.ndarray)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for k in want:
            _assert_matches(got[k], want[k])
    else:
        assert got == want


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_save_round_trip(tmp_path: Path, zip_format: bool) -> None:
    torch = pytest.importorskip("torch")
    payload = _torch_payload()
    path = tmp_path / "ckpt.pth"
    torch.save(payload, path, _use_new_zipfile_serialization=zip_format)
    tree = load_checkpoint_tree(path)
    _assert_matches(tree, payload)
    assert not np.shares_memory(tree["f32"], tree["f32_t"])
    flat = load_state_dict(path)
    assert "nested.lin.weight" in flat and "nested.n" not in flat
    np.testing.assert_array_equal(flat["nested.deeper.x"], payload["f32"][0, :4].numpy())


def test_torch_save_wrapped_model(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    sd = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.LayerNorm(3)).state_dict()
    path = tmp_path / "wrapped.pt"
    torch.save({"model": sd, "epoch": 5}, path)
    flat = load_state_dict(path)
    assert list(flat) == list(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(flat[k], v.numpy())


def test_safetensors_from_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(1)
    tensors = {
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "f16": torch.randn(4, generator=g).half(),
        "f32": torch.randn(2, 2, generator=g),
        "i64": torch.arange(6).reshape(2, 3),
        "bool": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3),
    }
    path = tmp_path / "w.safetensors"
    st.save_file(tensors, str(path), metadata={"format": "pt"})
    flat = load_state_dict(path)
    assert sorted(flat) == sorted(tensors)
    for k, v in tensors.items():
        ref = _reference(v)
        assert flat[k].dtype == ref.dtype and flat[k].shape == ref.shape
        np.testing.assert_array_equal(flat[k], ref)


def test_safetensors_from_numpy(tmp_path: Path) -> None:
    stn = pytest.importorskip("safetensors.numpy")
    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([1, 2], dtype=np.int32),
        "c": np.array([1 + 2j], dtype=np.complex64),
    }
    path = tmp_path / "n.safetensors"
    stn.save_file(tensors, str(path))
    flat = load_state_dict(path)
    for k, v in tensors.items():
        assert flat[k].dtype == v.dtype and flat[k].flags.writeable
        np.testing.assert_array_equal(flat[k], v)
    corrupt = tmp_path / "cut.safetensors"
    corrupt.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointFormatError, match="cut.safetensors"):
        load_state_dict(corrupt)


def test_truncated_torch_zip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "full.pth"
    torch.save({"w": torch.randn(64, 64)}, path)
    cut = tmp_path / "cut.pth"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointFormatError, match="corrupt or truncated zip"):
        load_state_dict(cut)
