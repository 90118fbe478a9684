import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def find_reference_dir() -> Path:
    """The nearest ``shared/reference`` among the repository's ancestors."""
    parents = Path(__file__).resolve().parents
    for parent in parents[1:]:
        if (parent / "shared" / "reference").is_dir():
            return parent / "shared" / "reference"
    return parents[2] / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """../shared/reference next to the repository (CI lays it out the same way); from a git
    worktree nested deeper (``/work/wt/NAME``), the nearest ancestor's ``shared/reference``."""
    d = find_reference_dir()
    if not d.is_dir():
        pytest.skip(f"reference checkpoint key lists not found at {d}")
    return d
