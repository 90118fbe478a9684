"""OpenVINO (the optional ``openvino`` extra) for the ONNX files ``paddle-sam export`` writes:
one place that compiles a file for the CPU in a stated precision.

OpenVINO computes in bf16 by itself on CPUs with ``avx512_bf16`` or AMX; here the precision is
always set: ``fp32`` (the exported model's answer, to about 1e-5) unless ``bf16`` is asked for,
which is refused by name on a CPU without it. ``int8`` compiles a file quantised by
``export --quantize int8`` (int8 weights; with ``--calibration``, int8 activations too), its
other operations in fp32.

An OpenVINO IR (``.xml`` with its ``.bin``) stays mapped after compiling, every page read by
the compilation resident, while the CPU plugin computes from its own repacked copy of the
weights: the mapped pages are handed back to the kernel after compiling
(:func:`drop_mapped_pages`; measured on SAM 3's int8 export: 431 MB of the backbone's and
289 MB of the text encoder's resident memory, the answers bitwise the same, the pages not read
again by inference).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .._runtime import bf16_refusal, get_num_threads, int8_activation_note

#: precision -> OpenVINO's INFERENCE_PRECISION_HINT; int8 is a file quantised by
#: ``export --quantize int8``, what it left in float computed in fp32
PRECISIONS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}


def openvino_module() -> Any:
    """``openvino``, or an ImportError naming the extra to install."""
    try:
        import openvino
    except ImportError as exc:
        raise ImportError(
            "this runs on OpenVINO, which is not installed: pip install 'paddle-sam[openvino]'"
        ) from exc
    return openvino


def check_precision(precision: str) -> None:
    """A ValueError for an unknown precision, or bf16 on a CPU without it."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    if precision == "bf16" and (why := bf16_refusal()) is not None:
        raise ValueError(why)


def compile_onnx(
    path: str | os.PathLike, precision: str = "fp32", threads: int | None = None
) -> Any:
    """``path`` (ONNX, or OpenVINO's .xml) compiled for the CPU: ``precision`` fp32, bf16, or
    int8 for an int8 file; ``threads`` inference threads (default: the process's Paddle
    thread count). An int8 file with int8 activations (``--calibration``) on a CPU without
    VNNI is compiled with a warning saying it does not pay there
    (:func:`~paddle_sam._runtime.int8_activation_note`)."""
    check_precision(precision)
    ov = openvino_module()
    threads = int(threads or get_num_threads() or os.cpu_count() or 1)
    config = {
        "INFERENCE_PRECISION_HINT": PRECISIONS[precision],
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
    }
    core = ov.Core()
    model: Any = str(Path(path))
    if precision == "int8":  # read first: is it an int8-activation file (FakeQuantize)?
        model = core.read_model(model)
        note = int8_activation_note()
        if note is not None and any(
            op.get_type_name() == "FakeQuantize" for op in model.get_ordered_ops()
        ):
            warnings.warn(f"{Path(path).name} has int8 activations, but {note}", stacklevel=2)
    compiled = core.compile_model(model, "CPU", config)
    del model
    if Path(path).suffix == ".xml":
        drop_mapped_pages(Path(path).with_suffix(".bin"))
    return compiled


_MADV_DONTNEED = 4


def drop_mapped_pages(path: str | os.PathLike) -> int:
    """Hand the resident pages of ``path``'s read-only mappings in this process back to the
    kernel (Linux's ``madvise(MADV_DONTNEED)``; elsewhere nothing). A later read of such a page
    maps it again from the file, so nothing changes but resident memory; the file's pages stay
    in the kernel's page cache, which it reclaims when memory is short. Returns the bytes of
    the mappings advised (0 where none, or not on Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    target = os.path.realpath(path)
    spans = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.rstrip("\n").split(None, 5)
                if len(parts) == 6 and parts[5] == target and "w" not in parts[1]:
                    start, end = (int(v, 16) for v in parts[0].split("-"))
                    spans.append((start, end - start))
    except OSError:
        return 0
    if not spans:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    done = 0
    for start, size in spans:
        if libc.madvise(start, size, _MADV_DONTNEED) == 0:
            done += size
    return done


class OpenVinoProgram:
    """An exported ONNX file of one input (an image, or a text's token ids) in, fixed-shape
    arrays out, compiled once and called on a batch item by item (the files take a batch of 1)
    under a lock (one infer request, shared by the threads of a service). The input is cast
    to the file's element type (float32 images, int64 token ids).

    ``shapes``: each output's shape without the batch axis, as the export's manifest lists
    them; a file that answers otherwise is refused by name. ``release_after_call``: hand the
    compiled model's intermediate buffers back after each call (``release_memory``; the next
    call allocates them again): for a program called seldom whose buffers are large (SAM 3's
    backbone: 0.16-0.26 GB lower peak memory, no measurable time)."""

    def __init__(
        self,
        path: str | os.PathLike,
        shapes: list[list[int]],
        *,
        precision: str = "fp32",
        threads: int | None = None,
        release_after_call: bool = False,
    ) -> None:
        self.path = Path(path)
        self.release_after_call = release_after_call
        self.precision = precision
        self.shapes = [list(map(int, s)) for s in shapes]
        self.compiled = compile_onnx(self.path, precision, threads)
        if len(self.compiled.outputs) != len(self.shapes):
            raise ValueError(
                f"{self.path}: {len(self.compiled.outputs)} outputs, the manifest lists "
                f"{len(self.shapes)}"
            )
        self.dtype = np.dtype(self.compiled.inputs[0].get_element_type().to_dtype())
        self._request = self.compiled.create_infer_request()
        self._lock = threading.Lock()

    def __call__(self, inputs: np.ndarray) -> list[np.ndarray]:
        """``B x ...`` inputs (images, token ids) -> the outputs, each ``B x shape``."""
        inputs = np.ascontiguousarray(inputs, dtype=self.dtype)
        per_image = []
        with self._lock:
            for i in range(inputs.shape[0]):
                # infer's arrays are the request's outputs copied out (share_outputs=False):
                # the caller's to own, not copied again (SAM 3's levels are ~0.2 GB an image)
                results = self._request.infer({0: inputs[i : i + 1]}, share_outputs=False)
                per_image.append([results[out] for out in self.compiled.outputs])
            if self.release_after_call:
                self.compiled.release_memory()
        if len(per_image) == 1:
            outputs = per_image[0]
        else:
            outputs = [np.concatenate(level, axis=0) for level in zip(*per_image, strict=True)]
        for got, shape in zip(outputs, self.shapes, strict=True):
            if list(got.shape[1:]) != shape:
                raise ValueError(
                    f"{self.path} returned an output of shape {list(got.shape)}, the manifest "
                    f"says B x {' x '.join(map(str, shape))}"
                )
        return outputs


class OpenVinoFunction:
    """An exported ONNX file of several inputs and outputs (a video model's module), compiled
    once in fp32 and called under a lock (one infer request, shared by the threads of a
    service). ``inputs`` / ``outputs``: how many the file must have, else it is refused by
    name (``what`` says what it was meant to be)."""

    def __init__(
        self,
        path: str | os.PathLike,
        inputs: int,
        outputs: int,
        what: str,
        *,
        threads: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.compiled = compile_onnx(self.path, "fp32", threads)
        got = len(self.compiled.inputs), len(self.compiled.outputs)
        if got != (inputs, outputs):
            raise ValueError(
                f"{self.path}: {got[0]} inputs and {got[1]} outputs, {what} has {inputs} and "
                f"{outputs}"
            )
        self._request = self.compiled.create_infer_request()
        self._lock = threading.Lock()

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """The inputs in the file's order -> its outputs (arrays the caller owns)."""
        with self._lock:
            results = self._request.infer(list(arrays), share_outputs=False)
        return [results[out] for out in self.compiled.outputs]
