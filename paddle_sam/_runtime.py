"""Fast CPU defaults, applied when ``paddle_sam`` is imported.

Out of the box Paddle's dygraph matmuls run MKL on one thread (measured here: 120 GFLOP/s
on two cores, 205-228 with two threads), and on AMD processors the MKL it bundles takes a
slow code path unless ``MKL_DEBUG_CPU_TYPE=5`` is set before MKL loads (docs/design.md section
3; on Intel the same variable halves the speed, so it is set on AMD only).

Paddle 3's strided views make every transpose that is later reshaped go through a generic
strided-copy kernel, about 8x slower on CPU than its transpose kernel (measured here: a
12 x 4096 x 4096 transposed copy in 2.7 s against 0.35 s), so on a CPU-only build we also
default ``FLAGS_use_stride_kernel`` to off (Paddle 2.x semantics: such ops copy).

Paddle itself sets ``OMP_NUM_THREADS=1`` when it is imported without one (and prints a
warning when it finds more), so the thread count is set after the import, through Paddle,
MKL and OpenMP directly.

Paddle's CPU allocator hands large blocks straight to glibc, which maps every block above
32 MB freshly from the kernel and unmaps it on free: each attention matrix of a ViT-B global
block (12 x 4096 x 4096 floats, 805 MB) is page-faulted and zeroed anew, about 0.25 s each
(measured here: a new 805 MB result 0.36 s, the same op in place 0.08 s). With glibc on
Linux we therefore keep freed memory in the heap for reuse (``mallopt``: no mmap for large
blocks, trim threshold 2 GB): a ViT-B forward went from 10.1 s to 7.7 s. The cost is that
the process keeps its peak heap instead of returning it to the system between calls. Large
attentions run their rows on worker threads (``models/sam3/model_misc.py``); glibc would give
each thread its own arena, whose heaps cannot hold such blocks and are trimmed on every free,
so all threads share the main arena (``M_ARENA_MAX`` 1: in a SAM 3 fusion-encoder attention
the system time fell from 0.76 to 0.0 s and the attention from 0.95 to 0.42 s).

Static programs run from dygraph (``paddle.jit.to_static``; SAM 3 reaches Paddle's fused
CPU attention kernel this way, ``models/sam3/model_misc.py``) execute on a worker thread of
Paddle's interpreter, where OpenMP keeps the thread count Paddle set at import (1): the
kernel ran on one thread whatever ``set_num_threads`` said (measured here: 0.39 s on one
thread and on two). On a CPU-only build we default ``FLAGS_new_executor_serial_run`` to on,
so those programs run on the calling thread with its thread count (0.20 s on two threads).

A user's choice always wins: an existing ``OMP_NUM_THREADS``, ``MKL_DEBUG_CPU_TYPE``,
``FLAGS_use_stride_kernel``, ``FLAGS_new_executor_serial_run`` or any ``MALLOC_*`` variable
is left alone, and
``PADDLE_SAM_NO_CPU_TUNING=1`` turns all of this off.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

_applied = False


def cpu_count() -> int:
    """CPUs this process may run on (honours affinity masks and cgroup-pinned sets)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:  # pragma: no cover - non-Linux
        pass
    return set()


BF16_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def bf16_refusal() -> str | None:
    """None when this CPU runs bf16 GEMMs natively (``avx512_bf16`` or AMX, as oneDNN detects
    at run time); otherwise a sentence saying why bf16 inference is refused."""
    from paddle.base import core

    if core.supports_bfloat16_fast_performance():
        return None
    flags = cpu_flags()
    found = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in BF16_FLAGS)
    return (
        "bf16 inference needs a CPU with avx512_bf16 or AMX (amx_bf16), which oneDNN uses "
        f"for bf16 GEMMs; this CPU has none ({found}): use precision 'fp32'"
    )


def _is_amd() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return "AuthenticAMD" in line
    except OSError:  # pragma: no cover - non-Linux
        pass
    return False


def apply_cpu_defaults() -> None:
    """Set MKL's code path and the thread count unless the user already did."""
    global _applied
    if _applied or os.environ.get("PADDLE_SAM_NO_CPU_TUNING") == "1":
        return
    _applied = True
    cpu_only = not _has_gpu_build()
    user_threads = "OMP_NUM_THREADS" in os.environ  # paddle sets it to 1 on import
    if "paddle" not in sys.modules and _is_amd():
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")  # read when MKL loads
    import paddle

    if cpu_only and "FLAGS_use_stride_kernel" not in os.environ:
        paddle.set_flags({"FLAGS_use_stride_kernel": False})
    if cpu_only and "FLAGS_new_executor_serial_run" not in os.environ:
        paddle.set_flags({"FLAGS_new_executor_serial_run": True})
    if not user_threads:
        set_num_threads(cpu_count())
    if not any(k.startswith("MALLOC_") for k in os.environ):
        keep_freed_memory()


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory() -> bool:
    """Make glibc reuse freed large blocks instead of unmapping them; False if unavailable."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS): nothing to do
        return False
    if not hasattr(libc, "mallopt"):
        return False
    ok = libc.mallopt(_M_MMAP_MAX, 0) == 1
    ok = ok and libc.mallopt(_M_ARENA_MAX, 1) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1


def _has_gpu_build() -> bool:
    """True for paddlepaddle-gpu (and other accelerator builds), without importing paddle."""
    from importlib import metadata

    for dist in ("paddlepaddle-gpu", "paddlepaddle-xpu", "paddle-custom-device"):
        try:
            metadata.distribution(dist)
            return True
        except metadata.PackageNotFoundError:
            continue
    return False


def _load(lib: Path):
    if not lib.is_file():
        return None
    try:
        return ctypes.CDLL(str(lib))  # the copy paddle already loaded: same handle
    except OSError:  # pragma: no cover
        return None


def set_num_threads(n: int) -> None:
    """Use ``n`` CPU threads in Paddle's kernels, MKL's GEMMs included."""
    n = int(n)
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    import paddle

    paddle.base.core.set_num_threads(n)
    libs = Path(paddle.__file__).parent / "libs"
    for name, fn in (
        ("libmklml_intel.so", "MKL_Set_Num_Threads"),
        ("libiomp5.so", "omp_set_num_threads"),
    ):
        lib = _load(libs / name)
        if lib is not None and hasattr(lib, fn):
            getattr(lib, fn)(n)


def set_local_threads(n: int) -> None:
    """Use ``n`` threads in MKL's GEMMs and OpenMP regions started from the calling thread only
    (the process-wide count set by :func:`set_num_threads` stays for other threads)."""
    import paddle

    libs = Path(paddle.__file__).parent / "libs"
    for name, fn in (
        ("libmklml_intel.so", "MKL_Set_Num_Threads_Local"),
        ("libiomp5.so", "omp_set_num_threads"),  # a per-thread setting in OpenMP
    ):
        lib = _load(libs / name)
        if lib is not None and hasattr(lib, fn):
            getattr(lib, fn)(int(n))


def get_num_threads() -> int | None:
    """MKL's thread count, or None when Paddle was built without MKL."""
    import paddle

    mkl = _load(Path(paddle.__file__).parent / "libs" / "libmklml_intel.so")
    if mkl is None or not hasattr(mkl, "MKL_Get_Max_Threads"):
        return None
    return int(mkl.MKL_Get_Max_Threads())
