"""The training families and the loader that picks one: a YAML run config's top-level
``family`` (``sam_v1`` by default, ``sam2`` or ``sam3``) selects the schema it is read with.
Nothing in the families imports this module; the commands do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import build_config, read_raw, refuse
from .sam_v1.config import Config, validate

FAMILIES = ("sam_v1", "sam2", "sam3")


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Any:
    """Read a YAML config (or start from the defaults if ``path`` is None), apply overrides.
    Its top-level ``family`` (``sam_v1`` by default, ``sam2`` or ``sam3``) selects the schema: a
    ``sam_v1.config.Config``, ``sam2.config.Sam2Config`` or ``sam3.config.Sam3Config``."""
    raw, where = read_raw(path, overrides)
    family = raw.get("family", "sam_v1")
    if family not in FAMILIES:
        refuse(where, "family", family, f"choose from {', '.join(FAMILIES)}")
    if family == "sam3":
        # here, not at the top: the sam3 package imports its criterion (Paddle and the model)
        from .sam3.config import Sam3Config, validate_sam3

        cfg = build_config(Sam3Config, raw, where)
        validate_sam3(cfg, where)
        return cfg
    if family == "sam2":
        from .sam2.config import Sam2Config, validate_sam2

        cfg = build_config(Sam2Config, raw, where)
        validate_sam2(cfg, where)
        return cfg
    raw.pop("family", None)
    cfg = build_config(Config, raw, where)
    validate(cfg, where)
    return cfg
