"""CPU settings: the ones importing ``paddle_sam`` applies, safe in any host process, and the
process-wide ones :func:`tune_process` applies when asked (``paddle-sam``, and with it
``paddle-sam serve``, calls it first thing; a program that embeds the library calls
``paddle_sam.tune_process()`` itself, early, before it starts threads or loads models).

On import (each only where the user has not set it; they change the speed of Paddle's CPU
kernels in this process, not what Paddle's ops mean):

- Threads: all the CPUs this process may run on. Out of the box Paddle's dygraph matmuls run
  MKL on one thread (measured here: 120 GFLOP/s on two cores, 205-228 with two threads).
  Paddle itself sets ``OMP_NUM_THREADS=1`` in ``os.environ`` when imported without one, so the
  count is set after Paddle's import, through Paddle, MKL and OpenMP, and a user's
  ``OMP_NUM_THREADS`` is one in the environment the process started with, or one set before
  Paddle was imported (when ``import paddle`` came first, a ``1`` the process did not start
  with is taken for Paddle's).
- MKL's code path on AMD: the MKL Paddle bundles takes a slow code path on AMD processors
  unless ``MKL_DEBUG_CPU_TYPE=5`` (its AVX2 kernels) is set; on Intel the same variable halves
  the speed, so it is set on AMD processors with AVX2 and FMA only, in ``os.environ`` (child
  processes inherit it). That MKL (2019.0.5) reads the variable when it first chooses its
  kernels, at the first MKL computation, not when it loads (measured on the Intel machine, where
  the forced path shows: set after ``import paddle`` and before any op, MKL ran type 5; set after
  one matmul, it kept its own choice). So the import order does not matter: only MKL work done
  before ``paddle_sam`` is imported does, and then the import warns once (``UserWarning``)
  and leaves the variable unset. The check reads MKL's choice through
  ``mkl_serv_get_cpu_type``, an internal MKL 2019 symbol; without it (another MKL) the
  variable is set and not checked.
- ``FLAGS_new_executor_serial_run`` on (CPU-only builds): static programs run from dygraph
  (``paddle.jit.to_static``; SAM 3 reaches Paddle's fused CPU attention kernel this way,
  ``models/sam3/model_misc.py``) otherwise execute on a worker thread of Paddle's interpreter,
  where OpenMP keeps the thread count Paddle set at import (1): the kernel ran on one thread
  whatever ``set_num_threads`` said (measured here: 0.39 s on one thread and on two). Serial,
  those programs run on the calling thread with its thread count (0.20 s on two threads).
  Their ops and results are the same.

By :func:`tune_process` (it changes what the host's own Paddle code computes or how the whole
process uses memory, so only a program that is a paddle-sam process asks for it):

- ``FLAGS_use_stride_kernel`` off (CPU-only builds). Paddle 3's strided views make every
  transpose that is later reshaped go through a generic strided-copy kernel, about 8x slower
  on CPU than its transpose kernel (measured here: a 12 x 4096 x 4096 transposed copy in 2.7 s
  against 0.35 s; 2x on the Intel machine, 12 x 2048 x 2048: 0.36 s against 0.18 s). Off,
  slicing, transposing and reshaping copy as in Paddle 2.x: an in-place op on ``a[0]``,
  ``a.transpose(...)`` or ``a.reshape(...)`` no longer writes through to ``a`` (measured), so
  a host's code written for views would compute something else.
- glibc ``mallopt`` (Linux with glibc): Paddle's CPU allocator hands large blocks straight to
  glibc, which maps every block above 32 MB freshly from the kernel and unmaps it on free:
  each attention matrix of a ViT-B global block (12 x 4096 x 4096 floats, 805 MB) is
  page-faulted and zeroed anew, about 0.25 s each (measured here: a new 805 MB result 0.36 s,
  the same op in place 0.08 s). So freed memory stays in the heap for reuse (no mmap for large
  blocks, trim threshold 2 GB): a ViT-B forward went from 10.1 s to 7.7 s. The cost is that
  the process keeps its peak heap instead of returning it to the system between calls. Large
  attentions run their rows on worker threads (``models/sam3/model_misc.py``); glibc would
  give each thread its own arena, whose heaps cannot hold such blocks and are trimmed on every
  free, so all threads share the main arena (``M_ARENA_MAX`` 1: in a SAM 3 fusion-encoder
  attention the system time fell from 0.76 to 0.0 s and the attention from 0.95 to 0.42 s).
  Both settings are for the whole process, allocations of the host's other libraries
  included.

What a library user gets without :func:`tune_process` (measured 2026-12-03 on an Intel Xeon
with avx512f, avx512_bf16 and AMX, 2 cores, a busy host, ``benchmarks/bench_import_order.py``;
the AMD path was not measured, no AMD machine being at hand): it keeps the thread count and
the serial executor whatever the import order (2 MKL threads with ``import paddle`` first
too, against Paddle's 1), Paddle's view semantics and its memory: after a ViT-B predictor is
freed the process holds 966 MB, against 1858 MB tuned. It loses the strided-copy and
page-fault time: SAM v1 ViT-B ``set_image`` on a 768 x 1024 image takes 1.3-1.7x as long
(8.80 s against 5.83 s in the quietest round; 16.4 CPU seconds against 10.1, with 1.3 million
page faults a call against 4 thousand).

A user's choice always wins: an existing ``OMP_NUM_THREADS``, ``MKL_DEBUG_CPU_TYPE``,
``FLAGS_use_stride_kernel``, ``FLAGS_new_executor_serial_run`` or any ``MALLOC_*`` variable is
left alone, and ``PADDLE_SAM_NO_CPU_TUNING=1`` turns all of this off, on import and in
:func:`tune_process`. :func:`applied_settings` says what was applied in this process.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from pathlib import Path
from typing import Any

_applied: dict[str, Any] = {}
_import_done = False
_process_done = False

FAST_AMD_MKL_TYPE = "5"  # MKL_DEBUG_CPU_TYPE: MKL's AVX2 kernels


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


def available_memory() -> int | None:
    """Bytes of memory the kernel says are available for new allocations (Linux's
    ``MemAvailable``), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # pragma: no cover - non-Linux
        pass
    return None


#: the int8 dot-product instructions (VNNI) that make int8 activations faster than fp32
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_activation_note() -> str | None:
    """None when this CPU has VNNI int8 dot products (``avx512_vnni``, ``avx_vnni`` or AMX), or
    when its flags cannot be read; otherwise a sentence saying that int8 activations do not pay
    here. Without VNNI an int8 product takes two instructions through 16-bit sums: measured on
    an AMD EPYC with avx2 only, no runtime's int8 encoder beat its fp32 one (docs/performance.md
    section 26; the export's 7-bit weights keep the answers as on other CPUs)."""
    flags = cpu_flags()
    if not flags or any(f in flags for f in INT8_FLAGS):
        return None
    return (
        "this CPU has no VNNI int8 instructions (avx512_vnni, avx_vnni, amx_int8), so int8 "
        "activations run no faster than fp32 here (on an AMD EPYC with avx2 only: SAM v1 "
        "ViT-B's encoder 8.8 s against 8.4 s in fp32, SAM 3's backbone 42.1 s against 38.8 s); "
        "what int8 gives here is the smaller memory (weights a quarter of fp32's)"
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


def _opted_out() -> bool:
    return os.environ.get("PADDLE_SAM_NO_CPU_TUNING") == "1"


def _launch_environ() -> set[str] | None:
    """Names in the environment this process started with (Linux), whatever was set since."""
    try:
        with open("/proc/self/environ", "rb") as f:
            data = f.read()
    except OSError:  # pragma: no cover - non-Linux
        return None
    return {item.split(b"=", 1)[0].decode("utf-8", "replace") for item in data.split(b"\0")}


def _user_set_threads() -> bool:
    """Whether ``OMP_NUM_THREADS`` is the user's rather than the ``1`` Paddle's import sets."""
    if "OMP_NUM_THREADS" not in os.environ:
        return False
    if "paddle" not in sys.modules:
        return True  # set before Paddle was imported: only the user does that
    launch = _launch_environ()
    if launch is not None and "OMP_NUM_THREADS" in launch:
        return True
    return os.environ["OMP_NUM_THREADS"].strip() != "1"


def apply_import_defaults() -> None:
    """The settings ``import paddle_sam`` applies (see the module docstring): threads, MKL's
    code path on AMD, Paddle's serial executor on CPU-only builds. Once per process."""
    global _import_done
    if _import_done or _opted_out():
        return
    _import_done = True
    cpu_only = not _has_gpu_build()
    user_threads = _user_set_threads()
    set_mkl_type = (
        "MKL_DEBUG_CPU_TYPE" not in os.environ
        and _is_amd()
        and {"avx2", "fma"} <= cpu_flags()  # the kernels it selects need both
    )
    if set_mkl_type:
        os.environ["MKL_DEBUG_CPU_TYPE"] = FAST_AMD_MKL_TYPE  # read at MKL's first computation
    import paddle

    if set_mkl_type:
        _check_mkl_type()
    if cpu_only and "FLAGS_new_executor_serial_run" not in os.environ:
        paddle.set_flags({"FLAGS_new_executor_serial_run": True})
        _applied["FLAGS_new_executor_serial_run"] = True
    if not user_threads:
        set_num_threads(cpu_count())
        _applied["threads"] = cpu_count()


def _check_mkl_type() -> None:
    """MKL_DEBUG_CPU_TYPE was just set: keep it if MKL follows it, else warn once and unset."""
    chosen = _mkl_cpu_type(detect=True)
    if chosen is None or chosen == int(FAST_AMD_MKL_TYPE):
        _applied["MKL_DEBUG_CPU_TYPE"] = FAST_AMD_MKL_TYPE
        return
    del os.environ["MKL_DEBUG_CPU_TYPE"]
    warnings.warn(
        "paddle_sam: Paddle's MKL chose its slow code path for AMD processors before paddle_sam "
        "was imported (an MKL computation already ran), and it does not change it afterwards: "
        f"GEMMs run several times slower. Set MKL_DEBUG_CPU_TYPE={FAST_AMD_MKL_TYPE} in the "
        "environment before starting Python, or import paddle_sam before running any Paddle "
        "op.",
        UserWarning,
        stacklevel=3,
    )


def tune_process() -> dict[str, Any]:
    """Apply the process-wide settings (module docstring): ``FLAGS_use_stride_kernel`` off on
    CPU-only builds (slicing, transposing and reshaping copy, as in Paddle 2.x), and glibc's
    ``mallopt`` keeping freed memory in the heap with one arena (the process keeps its peak
    heap). For a process that runs paddle-sam models; call it early, before threads start and
    models load. The import-time settings too, if the import skipped them. Each setting the
    user made is left alone; ``PADDLE_SAM_NO_CPU_TUNING=1`` makes this do nothing. Returns
    :func:`applied_settings`. Calling it again does nothing more."""
    global _process_done
    if _opted_out():
        return applied_settings()
    apply_import_defaults()
    if _process_done:
        return applied_settings()
    _process_done = True
    import paddle

    if not _has_gpu_build() and "FLAGS_use_stride_kernel" not in os.environ:
        paddle.set_flags({"FLAGS_use_stride_kernel": False})
        _applied["FLAGS_use_stride_kernel"] = False
    if not any(k.startswith("MALLOC_") for k in os.environ) and keep_freed_memory():
        _applied["mallopt"] = "M_MMAP_MAX 0, M_ARENA_MAX 1, M_TRIM_THRESHOLD 2**31-1"
    return applied_settings()


def applied_settings() -> dict[str, Any]:
    """What paddle-sam has set in this process, by name (``threads``, ``MKL_DEBUG_CPU_TYPE``,
    ``FLAGS_new_executor_serial_run``, ``FLAGS_use_stride_kernel``, ``mallopt``) with the value
    set; a setting the user made, or one that did not apply here, is absent."""
    return dict(_applied)


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory() -> bool:
    """Make glibc reuse freed large blocks instead of unmapping them; False if unavailable.
    Process-wide: :func:`tune_process` calls it."""
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


def _mkl():
    import paddle

    return _load(Path(paddle.__file__).parent / "libs" / "libmklml_intel.so")


def _mkl_cpu_type(detect: bool) -> int | None:
    """MKL 2019's internal ``mkl_serv_get_cpu_type(int)``: with 1, the CPU type MKL detects
    (``MKL_DEBUG_CPU_TYPE`` when set at its first detection, which it keeps); with 0, the code
    path its computations took, -1 before the first. None without that MKL."""
    mkl = _mkl()
    if mkl is None or not hasattr(mkl, "mkl_serv_get_cpu_type"):
        return None
    fn = mkl.mkl_serv_get_cpu_type
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return int(fn(1 if detect else 0))


def mkl_code_path() -> int | None:
    """The code path MKL's computations took, numbered as ``MKL_DEBUG_CPU_TYPE`` (5: AVX2; 7 on
    the AVX-512 Intel machine, on its own); None before MKL's first computation, or without the
    MKL 2019 Paddle bundles. Reading it changes nothing."""
    path = _mkl_cpu_type(detect=False)
    return None if path is None or path < 0 else path


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
    mkl = _mkl()
    if mkl is None or not hasattr(mkl, "MKL_Get_Max_Threads"):
        return None
    return int(mkl.MKL_Get_Max_Threads())
