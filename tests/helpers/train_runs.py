"""Training-run helpers shared by the SAM v1 and SAM 3 training tests: configs written as
YAML, the losses a run logged."""

from __future__ import annotations

import csv
from pathlib import Path

import yaml


def write_yaml(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def losses_of(run: Path) -> dict[int, float]:
    """``metrics.csv``'s loss per logged step."""
    with open(run / "metrics.csv", newline="") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}
