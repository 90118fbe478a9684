"""Fast CPU defaults, applied once before Paddle is imported.

Out of the box Paddle runs its CPU kernels on one thread, and the MKL it bundles takes a slow
code path on AMD processors unless ``MKL_DEBUG_CPU_TYPE=5`` is in the environment when MKL
loads (DESIGN.md section 4). We set both defaults, but only where the user has not chosen:
an existing ``MKL_DEBUG_CPU_TYPE`` / ``OMP_NUM_THREADS`` is never overwritten, and
``PADDLE_SAM_NO_CPU_TUNING=1`` turns the whole thing off.
"""

from __future__ import annotations

import os
import sys

_applied = False


def cpu_count() -> int:
    """CPUs this process may run on (honours affinity masks and cgroup-pinned sets)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def apply_cpu_defaults() -> None:
    """Set MKL's code path and the intra-op thread count unless the user already did."""
    global _applied
    if _applied or os.environ.get("PADDLE_SAM_NO_CPU_TUNING") == "1":
        return
    _applied = True
    if "paddle" not in sys.modules:
        # MKL reads this when it is loaded, so it only helps before paddle's first import.
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
    if "OMP_NUM_THREADS" in os.environ:
        return  # the user's thread choice wins; paddle reads it itself
    import paddle

    paddle.base.core.set_num_threads(cpu_count())


def set_num_threads(n: int) -> None:
    """Set the number of CPU threads Paddle's kernels use."""
    if int(n) < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    import paddle

    paddle.base.core.set_num_threads(int(n))
