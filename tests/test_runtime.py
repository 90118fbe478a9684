"""What importing paddle_sam sets in the process, in either import order, and what only
``tune_process`` (called by the CLI) sets; a user's choices win. Each case runs in a fresh
process, since these settings are per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "paddle_sam" / "_runtime.py"
TUNING_VARS = (
    "OMP_NUM_THREADS",
    "MKL_DEBUG_CPU_TYPE",
    "FLAGS_use_stride_kernel",
    "FLAGS_new_executor_serial_run",
    "PADDLE_SAM_NO_CPU_TUNING",
)

IMPORTS = {
    "paddle_sam first": "import paddle_sam\nimport paddle\n",
    "paddle first": "import paddle\nimport paddle_sam\n",
    # MKL has chosen its code path before paddle_sam is imported
    "paddle ran first": (
        "import paddle\n"
        "paddle.matmul(paddle.ones([64, 64]), paddle.ones([64, 64]))\n"
        "import paddle_sam\n"
    ),
}

# paddle_sam._runtime loaded ahead of the package, its vendor check answering "AMD", so the
# AMD path runs on any x86 CPU (MKL follows MKL_DEBUG_CPU_TYPE on Intel too)
SIMULATED_AMD = (
    "import importlib.util\n"
    f"spec = importlib.util.spec_from_file_location('paddle_sam._runtime', {str(RUNTIME)!r})\n"
    "rt = importlib.util.module_from_spec(spec)\n"
    "sys.modules['paddle_sam._runtime'] = rt\n"
    "spec.loader.exec_module(rt)\n"
    "rt._is_amd = lambda: True\n"
)

PROBE = """\
import json, os, sys, warnings
{preamble}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
{imports}
    import paddle_sam._runtime as rt
    rt.apply_import_defaults()  # a second call does nothing more
    on_import = rt.applied_settings()
    if {tune}:
        paddle_sam.tune_process()
a = paddle.ones([128, 128])
float(paddle.matmul(a, a)[0, 0])
flag = lambda name: paddle.get_flags([name])[name]
print(json.dumps({{
    "mkl": rt.get_num_threads(),
    "stride": flag("FLAGS_use_stride_kernel"),
    "serial": flag("FLAGS_new_executor_serial_run"),
    "mkl_cpu_type": os.environ.get("MKL_DEBUG_CPU_TYPE"),
    "mkl_code_path": rt.mkl_code_path(),
    "on_import": on_import,
    "applied": rt.applied_settings(),
    "warnings": [str(w.message) for w in caught if "MKL_DEBUG_CPU_TYPE" in str(w.message)],
}}))
"""


def run_python(code: str, **env_overrides) -> str:
    env = {k: v for k, v in os.environ.items() if k not in TUNING_VARS}
    env.update(env_overrides)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def probe(order: str = "paddle_sam first", amd: bool = False, tune: bool = False, **env) -> dict:
    imports = "".join(f"    {line}\n" for line in IMPORTS[order].splitlines())
    code = PROBE.format(
        preamble=SIMULATED_AMD if amd else "", imports=imports.rstrip("\n"), tune=tune
    )
    return json.loads(run_python(code, **env))


def cpu_info() -> tuple[bool, set[str]]:
    text = Path("/proc/cpuinfo").read_text()
    flags = next(line for line in text.splitlines() if line.startswith("flags"))
    return "AuthenticAMD" in text, set(flags.split(":", 1)[1].split())


def fast_amd_mkl_expected() -> bool:
    amd, flags = cpu_info()
    return amd and {"avx2", "fma"} <= flags


@pytest.mark.parametrize("order", ["paddle_sam first", "paddle first"])
def test_import_sets_only_the_safe_settings_in_either_order(order):
    """Threads on every CPU and the serial executor whatever the import order; Paddle's view
    semantics and the allocator stay as the host had them."""
    got = probe(order)
    assert got["mkl"] == len(os.sched_getaffinity(0))
    assert got["serial"] is True
    assert got["stride"] is True  # Paddle's default: views stay views
    assert "mallopt" not in got["applied"] and "FLAGS_use_stride_kernel" not in got["applied"]
    assert got["applied"]["threads"] == len(os.sched_getaffinity(0))
    assert got["mkl_cpu_type"] == ("5" if fast_amd_mkl_expected() else None)
    assert got["warnings"] == []


@pytest.mark.parametrize("order", ["paddle_sam first", "paddle first"])
def test_amd_code_path_holds_in_either_order(order):
    """MKL reads MKL_DEBUG_CPU_TYPE at its first computation, so setting it after Paddle's
    import still takes MKL's AVX2 path (checked in MKL itself)."""
    if not {"avx2", "fma"} <= cpu_info()[1]:
        pytest.skip("MKL's AVX2 kernels need avx2 and fma")
    got = probe(order, amd=True)
    assert got["mkl_cpu_type"] == "5"
    assert got["mkl_code_path"] == 5
    assert got["applied"]["MKL_DEBUG_CPU_TYPE"] == "5"
    assert got["warnings"] == []


def test_amd_code_path_too_late_warns_once():
    """MKL ran before paddle_sam was imported: one warning saying what to do, and the variable
    is not left claiming a path MKL does not take."""
    if not {"avx2", "fma"} <= cpu_info()[1]:
        pytest.skip("MKL's AVX2 kernels need avx2 and fma")
    got = probe("paddle ran first", amd=True)
    assert len(got["warnings"]) == 1
    assert "MKL_DEBUG_CPU_TYPE=5" in got["warnings"][0]
    assert "before starting Python" in got["warnings"][0]
    assert got["mkl_cpu_type"] is None
    assert got["mkl_code_path"] != 5
    assert "MKL_DEBUG_CPU_TYPE" not in got["applied"]
    assert got["mkl"] == len(os.sched_getaffinity(0))  # threads are set however late


def test_tune_process_applies_the_process_wide_settings():
    got = probe(tune=True)
    assert "mallopt" not in got["on_import"]
    assert got["stride"] is False
    assert got["applied"]["FLAGS_use_stride_kernel"] is False
    assert "mallopt" in got["applied"]


@pytest.mark.parametrize("order", ["paddle_sam first", "paddle first"])
def test_user_settings_win(order):
    got = probe(
        order,
        tune=True,
        OMP_NUM_THREADS="1",
        FLAGS_use_stride_kernel="1",
        FLAGS_new_executor_serial_run="0",
        # a user's value (5: MKL's AVX2 path, safe on every CPU these tests run on; 6 died
        # with SIGILL in a subprocess on a Zen 4 VM)
        MKL_DEBUG_CPU_TYPE="5",
        MALLOC_ARENA_MAX="4",
    )
    assert (got["mkl"], got["stride"], got["serial"], got["mkl_cpu_type"]) == (1, True, False, "5")
    assert got["applied"] == {}


def test_opt_out():
    got = probe(tune=True, PADDLE_SAM_NO_CPU_TUNING="1")
    assert got["mkl"] == 1 and got["stride"] is True and got["serial"] is False
    assert got["applied"] == {}


def test_cli_tunes_the_process(tmp_path):
    """``paddle-sam`` (and so ``paddle-sam serve``) applies the process-wide settings; the
    import before it did not."""
    code = (
        "import json, paddle, paddle_sam\n"
        "from paddle_sam._runtime import applied_settings\n"
        "before = applied_settings()\n"
        "from paddle_sam.cli import main\n"
        f"rc = main(['random-checkpoint', '-o', {str(tmp_path / 'x.txt')!r}])\n"
        "stride = paddle.get_flags(['FLAGS_use_stride_kernel'])['FLAGS_use_stride_kernel']\n"
        "print(json.dumps([before, rc, stride, applied_settings()]))\n"
    )
    before, rc, stride, after = json.loads(run_python(code))
    assert rc == 2  # the user error (not a .safetensors name), after the settings
    assert "mallopt" not in before and "FLAGS_use_stride_kernel" not in before
    assert stride is False
    assert after["FLAGS_use_stride_kernel"] is False and "mallopt" in after


def test_set_num_threads_validates():
    from paddle_sam import set_num_threads

    with pytest.raises(ValueError, match=">= 1"):
        set_num_threads(0)


def test_freed_memory_is_reused_only_when_asked():
    """With glibc and ``tune_process``, large freed blocks stay in the heap: a repeated big
    temporary is not page-faulted again (measured by minor page faults, not by time). A plain
    import leaves glibc as it was: each temporary is faulted anew.

    The heap takes a few temporaries to settle (measured: the first one or two after a warm-up,
    once in 15 runs the first three, faulted afresh), and now and then a settled one is faulted
    again (once in three clean-clone runs, six of 12 were fresh; the heap's layout after
    Paddle's frees varies), so 24 are counted and at most a third may be fresh; the plain
    process faults every one."""
    import platform
    import resource

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    pages = 64 * 1024 * 1024 * 4 // resource.getpagesize()  # one 256 MB temporary
    code = (
        "import resource, sys, paddle_sam, paddle\n"
        "if sys.argv[-1] == 'tune': paddle_sam.tune_process()\n"
        "a = paddle.ones([64, 1024, 1024])\n"
        "for _ in range(2): b = a * 2.0; del b\n"
        "fresh = 0\n"
        "for _ in range(24):\n"
        "    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    b = a * 2.0; del b\n"
        f"    fresh += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0 > {pages // 2}\n"
        "print(fresh)\n"
    )

    def fresh(tune: bool, **env_overrides) -> int:
        """How many of the 24 temporaries were page-faulted afresh (over half their pages)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.pop("PADDLE_SAM_NO_CPU_TUNING", None)
        env.update(env_overrides)
        argv = [sys.executable, "-c", code, "tune" if tune else "plain"]
        out = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1])

    assert fresh(tune=True) <= 8  # reused once the heap has settled
    assert fresh(tune=False) >= 23  # each temporary faulted anew
    assert fresh(tune=True, PADDLE_SAM_NO_CPU_TUNING="1") >= 23
