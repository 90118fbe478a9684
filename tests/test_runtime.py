"""Importing paddle_sam gives the fast CPU path, without overriding a user's choices."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = (
    "import json, os, paddle_sam, paddle\n"
    "from paddle_sam._runtime import get_num_threads\n"
    "print(json.dumps({'mkl': get_num_threads(),"
    " 'stride': paddle.get_flags(['FLAGS_use_stride_kernel'])['FLAGS_use_stride_kernel'],"
    " 'serial': paddle.get_flags(['FLAGS_new_executor_serial_run'])"
    "['FLAGS_new_executor_serial_run'],"
    " 'mkl_cpu_type': os.environ.get('MKL_DEBUG_CPU_TYPE')}))\n"
)


def probe(**env_overrides) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "OMP_NUM_THREADS",
            "MKL_DEBUG_CPU_TYPE",
            "FLAGS_use_stride_kernel",
            "FLAGS_new_executor_serial_run",
            "PADDLE_SAM_NO_CPU_TUNING",
        )
    }
    env.update(env_overrides)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _is_amd() -> bool:
    with open("/proc/cpuinfo") as f:
        return "AuthenticAMD" in f.read()


def test_defaults_use_every_core_and_fast_transposes():
    got = probe()
    assert got["mkl"] == len(os.sched_getaffinity(0))
    assert got["stride"] is False
    assert got["serial"] is True
    assert got["mkl_cpu_type"] == ("5" if _is_amd() else None)


def test_user_settings_win():
    got = probe(
        OMP_NUM_THREADS="1",
        FLAGS_use_stride_kernel="1",
        FLAGS_new_executor_serial_run="0",
        MKL_DEBUG_CPU_TYPE="6",
    )
    assert got == {"mkl": 1, "stride": True, "serial": False, "mkl_cpu_type": "6"}


def test_opt_out():
    got = probe(PADDLE_SAM_NO_CPU_TUNING="1")
    assert got["mkl"] == 1 and got["stride"] is True and got["serial"] is False


def test_set_num_threads_validates():
    import pytest

    from paddle_sam import set_num_threads

    with pytest.raises(ValueError, match=">= 1"):
        set_num_threads(0)


def test_freed_memory_is_reused():
    """With glibc, large freed blocks stay in the heap: a repeated big temporary is not
    page-faulted again (measured by minor page faults, not by time)."""
    import platform
    import resource

    import pytest

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    code = (
        "import resource, paddle_sam, paddle\n"
        "a = paddle.ones([64, 1024, 1024])\n"
        "for _ in range(2): b = a * 2.0; del b\n"
        "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(5): b = a * 2.0; del b\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)\n"
    )

    def faults(**env_overrides) -> int:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.pop("PADDLE_SAM_NO_CPU_TUNING", None)
        env.update(env_overrides)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return int(out.stdout.strip().splitlines()[-1])

    pages = 64 * 1024 * 1024 * 4 // resource.getpagesize()  # one 256 MB temporary
    assert faults() < 2 * pages  # reused: at most one fresh block over 5 temporaries
    assert faults(PADDLE_SAM_NO_CPU_TUNING="1") > 4 * pages  # each temporary faulted anew
