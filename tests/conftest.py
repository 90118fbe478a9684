import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """../shared/reference next to the repository (CI lays it out the same way)."""
    d = Path(__file__).resolve().parents[2] / "shared" / "reference"
    if not d.is_dir():
        pytest.skip(f"reference checkpoint key lists not found at {d}")
    return d
