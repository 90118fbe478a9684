"""One rule for what a test needs and cannot find: a skip here, a failure in CI.

CI installs everything the tests use (``make test``) and lays ``shared/`` beside the clone, so
there a missing tool, file or folder is an error of the setup, not a reason to skip.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

# values of CI that say "not CI" (CI=true on the CI runners)
_NOT_CI = {"", "0", "false", "no"}


def in_ci() -> bool:
    """Whether the tests run in CI: the ``CI`` environment variable set, other than to
    ``0``, ``false`` or ``no``."""
    return os.environ.get("CI", "").strip().lower() not in _NOT_CI


def missing(reason: str) -> NoReturn:
    """Stop the test for lack of something it needs: ``pytest.skip(reason)``, or in CI
    ``pytest.fail`` with the same reason. Reported at the caller's line."""
    __tracebackhide__ = True
    if in_ci():
        pytest.fail(f"{reason} (missing in CI, which provides it)", pytrace=False)
    pytest.skip(reason)
