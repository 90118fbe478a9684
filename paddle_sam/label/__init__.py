"""Dataset labelling: ``paddle-sam label SOURCE -o OUT`` and :func:`label`.

SAM v1's automatic masks (``everything``) or every instance of SAM 3 text concepts
(``concepts``) over a folder, a glob, a list of paths or a COCO file's images, written as one
COCO JSON. The images are labelled in shards, each written once complete, so an interrupted
job resumes where it stopped; unreadable or too large images are skipped and reported.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .job import (
    COCO_FILE,
    REPORT_FILE,
    WorkerDied,
    job_description,
    merge,
    pending_shards,
    plan_shards,
    prepare_output,
    run_local,
)
from .labelers import EVERYTHING_DEFAULTS, LabelSpec
from .sources import ImageItem, list_images

ENGINES = ("local",)


def label(
    source: str | os.PathLike,
    out: str | os.PathLike,
    spec: LabelSpec,
    *,
    engine: str = "local",
    num_workers: int = 1,
    shard_size: int = 16,
    resume: bool = False,
    overwrite: bool = False,
    image_root: str | os.PathLike | None = None,
    max_pixels: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Label every image of ``source`` into ``out`` (see the module docstring); returns the
    report (counts, skipped images and why, seconds). ``num_workers`` processes each hold one
    model; ``shard_size`` images make one unit of work and of resumption."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if num_workers < 1 or shard_size < 1:
        raise ValueError("num_workers and shard_size must be at least 1")
    out = Path(out)
    items = list_images(source, image_root)
    description = job_description(spec, items, shard_size, max_pixels)
    prepare_output(out, description, resume, overwrite)
    shards = plan_shards(items, shard_size)
    todo = pending_shards(out, shards)
    done = sum(len(shards[i]) for i in range(len(shards)) if i not in set(todo))
    bar = None
    if progress:
        import sys

        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), initial=done, unit="img", desc="labelling", file=sys.stderr)
    t = time.perf_counter()
    try:
        run_local(
            out, spec, shards, todo, num_workers, max_pixels, bar.update if bar else lambda n: None
        )
    finally:
        if bar is not None:
            bar.close()
    report = merge(out, spec, shards, time.perf_counter() - t)
    report["resumed_shards"] = len(shards) - len(todo)
    report["shards"] = len(shards)
    return report


__all__ = [
    "COCO_FILE",
    "EVERYTHING_DEFAULTS",
    "REPORT_FILE",
    "ImageItem",
    "LabelSpec",
    "WorkerDied",
    "label",
    "list_images",
]
