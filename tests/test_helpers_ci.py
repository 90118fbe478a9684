"""The rule for what a test needs and cannot find (``tests.helpers.ci.missing``): a skip here,
a failure in CI; and the fixtures of ``tests/conftest.py`` that follow it, run by pytest in a
subprocess on a copy of the conftest where ``shared/reference`` is absent or incomplete."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.ci import in_ci, missing

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("", False), ("0", False), ("false", False), ("True", True), ("1", True)],
)
def test_in_ci_reads_the_ci_variable(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert in_ci() is expected


def test_missing_skips_here_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no widget"):
        missing("no widget")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no widget"):
        missing("no widget")


def _copy_of_the_conftest(root: Path) -> None:
    """``root/tests``: the conftest and the helpers it imports, and one test per fixture."""
    (root / "tests" / "helpers").mkdir(parents=True)
    for name in ("__init__.py", "conftest.py", "helpers/__init__.py", "helpers/ci.py"):
        shutil.copy(TESTS / name, root / "tests" / name)
    shutil.copy(TESTS / "helpers" / "sam3_ref.py", root / "tests" / "helpers" / "sam3_ref.py")
    (root / "tests" / "test_needs_files.py").write_text(
        "def test_reference_dir(reference_dir):\n"
        "    assert reference_dir.is_dir()\n\n\n"
        "def test_bpe_path(bpe_path):\n"
        "    assert bpe_path\n"
    )


def _run(root: Path, test: str, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "PYTHONPATH"}}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
        + [f"tests/test_needs_files.py::{test}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("test", "reference", "message"),
    [
        ("test_reference_dir", False, "reference checkpoint key lists not found"),
        ("test_bpe_path", True, "bpe_simple_vocab_16e6.txt.gz not found"),
    ],
)
def test_reference_fixtures_skip_here_and_fail_in_ci(tmp_path, test, reference, message):
    """No ``shared/reference`` (``reference_dir``), or one without the BPE file
    (``bpe_path``): the test is skipped, and in CI it errors in its setup."""
    root = tmp_path / "repo"
    _copy_of_the_conftest(root)
    if reference:
        (tmp_path / "shared" / "reference").mkdir(parents=True)
    else:
        # the conftest looks beside the repository and one level higher, no further
        found = [p for p in root.parents[:2] if (p / "shared" / "reference").is_dir()]
        assert not found, f"a shared/reference near the temporary folder: {found}"

    here = _run(root, test, ci=None)
    assert here.returncode == 0, here.stdout + here.stderr
    assert "1 skipped" in here.stdout and message in here.stdout, here.stdout

    in_ci = _run(root, test, ci="true")
    assert in_ci.returncode == 1, in_ci.stdout + in_ci.stderr
    assert "1 error" in in_ci.stdout and message in in_ci.stdout, in_ci.stdout
    assert "missing in CI" in in_ci.stdout and "skipped" not in in_ci.stdout, in_ci.stdout
