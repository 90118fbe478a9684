import sys
from pathlib import Path

import pytest

from tests.helpers.ci import missing


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="also run the opt-in full-size runs marked slow (minutes, 12-18 GB of memory)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="opt-in full-size run: pytest --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _reference_weights_never_from_stale_memory() -> None:
    """The official code leaves some parameters as ``torch.empty`` (sam3's text encoder:
    ``positional_embedding``, ``text_projection``), and what that memory held depends on the
    tests that ran before. Torch's deterministic mode fills such memory with NaN, which
    ``perturb_state_dict`` always redraws from its seed; without it, stale finite values could
    be kept and a reference's weights (and outputs) would change from run to run. Set once the
    test modules are imported (they import torch where they need it), never importing torch
    here; ``warn_only``: no op is refused for lacking a deterministic kernel."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True


@pytest.fixture(scope="session", autouse=True)
def _tuned_process() -> None:
    """The suite runs with the process-wide settings the CLI applies (``tune_process``), as
    the commands it tests do; what a plain import does and does not change is checked in
    fresh processes (``test_runtime.py``)."""
    import paddle_sam

    paddle_sam.tune_process()


def find_reference_dir() -> Path:
    """``shared/reference`` beside the repository, else beside its parent (a worktree at
    ``/work/wt/NAME``); no higher, so a stray ``/tmp/shared`` is never taken for it."""
    parents = Path(__file__).resolve().parents
    for parent in parents[2:4]:
        if (parent / "shared" / "reference").is_dir():
            return parent / "shared" / "reference"
    return parents[2] / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """../shared/reference next to the repository (CI lays it out the same way); from a git
    worktree nested deeper (``/work/wt/NAME``), the nearest ancestor's ``shared/reference``.
    Missing: a skip, a failure in CI."""
    d = find_reference_dir()
    if not d.is_dir():
        missing(f"reference checkpoint key lists not found at {d}")
    return d


@pytest.fixture(scope="session")
def bpe_path(reference_dir: Path) -> str:
    """The official BPE vocabulary in ``shared/reference``; missing: a skip, a failure in CI."""
    from tests.helpers.sam3_ref import BPE_NAME

    path = reference_dir / BPE_NAME
    if not path.is_file():
        missing(f"{path} not found")
    return str(path)
