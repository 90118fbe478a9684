"""OpenVINO (the optional ``openvino`` extra) for the ONNX files ``paddle-sam export`` writes:
one place that compiles a file for the CPU in a stated precision.

OpenVINO computes in bf16 by itself on CPUs with ``avx512_bf16`` or AMX; here the precision is
always set: ``fp32`` (the exported model's answer, to about 1e-5) unless ``bf16`` is asked for,
which is refused by name on a CPU without it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._runtime import bf16_refusal, get_num_threads

#: precision -> OpenVINO's INFERENCE_PRECISION_HINT
PRECISIONS = {"fp32": "f32", "bf16": "bf16"}


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
    """``path`` compiled for the CPU: ``precision`` fp32 or bf16, ``threads`` inference
    threads (default: the process's Paddle thread count)."""
    check_precision(precision)
    ov = openvino_module()
    threads = int(threads or get_num_threads() or os.cpu_count() or 1)
    config = {
        "INFERENCE_PRECISION_HINT": PRECISIONS[precision],
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
    }
    return ov.Core().compile_model(str(Path(path)), "CPU", config)
