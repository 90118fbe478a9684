"""An OpenVINO IR compiled by ``compile_onnx``: its ``.bin``'s mapped pages are handed back to
the kernel after compiling (``drop_mapped_pages``), and the compiled model still answers as
before, bitwise. The IR is written by the test (one MatMul with a 16 MB weight)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from paddle_sam.deploy.openvino import compile_onnx, drop_mapped_pages

ov = pytest.importorskip("openvino")

K, N = 1024, 4096  # a 16 MB float32 weight


def _ir(folder: Path) -> tuple[Path, np.ndarray]:
    from openvino import opset13 as ops

    weight = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    x = ops.parameter([2, K], np.float32, name="x")
    y = ops.matmul(x, ops.constant(weight), False, False)
    path = folder / "matmul.xml"
    ov.save_model(ov.Model([y], [x], "matmul"), str(path), compress_to_fp16=False)
    return path, weight


def _resident_kb(path: Path) -> int | None:
    """Resident kB of this process's mappings of ``path`` (None: not mapped)."""
    target = str(path.resolve())
    total, found, inside = 0, False, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split(None, 5)
        if "-" in fields[0] and len(fields) >= 5 and ":" not in fields[0]:
            inside = len(fields) == 6 and fields[5] == target
            found |= inside
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total if found else None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc are Linux's")
def test_the_weights_mapping_is_handed_back_and_the_answer_kept(tmp_path):
    path, weight = _ir(tmp_path)
    x = np.random.default_rng(1).standard_normal((2, K)).astype(np.float32)
    want = x @ weight
    compiled = compile_onnx(path, "fp32", 1)
    bin_path = path.with_suffix(".bin")
    resident = _resident_kb(bin_path)
    if resident is None:  # this OpenVINO read the weights instead of mapping them
        pytest.skip("OpenVINO did not map the .bin here")
    assert resident < 1024, f"{resident} kB of the 16 MB weights still resident"
    got = compiled.create_infer_request().infer([x])[compiled.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert (_resident_kb(bin_path) or 0) < 1024  # inference did not read them again
    # the same answer as a compilation that keeps its pages
    keep = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert _resident_kb(bin_path) > 8 * 1024  # this one's pages are resident
    np.testing.assert_array_equal(keep.create_infer_request().infer([x])[keep.outputs[0]], got)


def test_nothing_to_drop(tmp_path):
    unmapped = tmp_path / "none.bin"
    unmapped.write_bytes(b"\0" * 4096)
    assert drop_mapped_pages(unmapped) == 0
    assert drop_mapped_pages(tmp_path / "missing.bin") == 0


def _fake_quantized_ir(folder: Path) -> Path:
    """A MatMul whose input goes through FakeQuantize: what NNCF's calibrated int8 writes."""
    from openvino import opset13 as ops

    x = ops.parameter([2, 8], np.float32, name="x")
    lo, hi = ops.constant(np.float32(-4.0)), ops.constant(np.float32(4.0))
    q = ops.fake_quantize(x, lo, hi, lo, hi, 256)
    y = ops.matmul(q, ops.constant(np.eye(8, dtype=np.float32)), False, False)
    path = folder / "fq.xml"
    ov.save_model(ov.Model([y], [x], "fq"), str(path), compress_to_fp16=False)
    return path


AVX2_ONLY = {"sse4_2", "avx", "avx2", "fma", "f16c"}


def test_int8_activations_without_vnni_warn_and_still_run(tmp_path, monkeypatch):
    import warnings

    from paddle_sam import _runtime

    fq, plain = _fake_quantized_ir(tmp_path), _ir(tmp_path)[0]
    monkeypatch.setattr(_runtime, "cpu_flags", lambda: AVX2_ONLY)
    with pytest.warns(UserWarning, match=r"fq\.xml has int8 activations.*no VNNI.*avx512_vnni"):
        compiled = compile_onnx(fq, "int8", 1)
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
    got = compiled.create_infer_request().infer([x])[compiled.outputs[0]]
    np.testing.assert_allclose(got, x, atol=8 / 255 + 1e-6)  # quantised to 256 levels
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_onnx(fq, "fp32", 1)  # fp32 asked: nothing to say
        compile_onnx(plain, "int8", 1)  # no int8 activations (weights-only files): nothing
        monkeypatch.setattr(_runtime, "cpu_flags", lambda: AVX2_ONLY | {"avx_vnni"})
        compile_onnx(fq, "int8", 1)
        monkeypatch.setattr(_runtime, "cpu_flags", set)  # flags unknown: no guess
        compile_onnx(fq, "int8", 1)
