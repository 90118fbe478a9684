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
    OUTPUTS,
    REPORT_FILE,
    WorkerDied,
    job_description,
    merge,
    pending_shards,
    plan_shards,
    prepare_output,
    read_shard,
    run_local,
)
from .labelers import EVERYTHING_DEFAULTS, LabelSpec
from .sources import ImageItem, list_images

ENGINES = ("local", "ray")


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
    ray_address: str | None = None,
    cpus_per_worker: int = 1,
    gpus_per_worker: float = 0.0,
) -> dict[str, Any]:
    """Label every image of ``source`` into ``out`` (see the module docstring); returns the
    report (counts, skipped images and why, seconds). ``num_workers`` workers each hold one
    model: processes on this machine (``engine="local"``) or Ray actors (``engine="ray"``,
    on ``ray_address``: "auto", "HOST:PORT", or None for a Ray started for the job; each actor
    reserves ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs). ``shard_size`` images
    make one unit of work and of resumption."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if num_workers < 1 or shard_size < 1:
        raise ValueError("num_workers and shard_size must be at least 1")
    out = Path(out)
    items = list_images(source, image_root)
    _check_source_not_output(Path(source), out)
    description = job_description(spec, items, shard_size, max_pixels)
    prepare_output(out, description, resume, overwrite)
    shards = plan_shards(items, shard_size)
    todo = pending_shards(out, shards)
    for i in sorted(set(range(len(shards))) - set(todo)):  # a resumed job's shards, checked
        read_shard(out, i, shards[i])  # before any labelling, not after it
    done = len(items) - sum(len(shards[i]) for i in todo)
    bar = None
    if progress:
        import sys

        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), initial=done, unit="img", desc="labelling", file=sys.stderr)
    t = time.perf_counter()
    update = bar.update if bar else lambda n: None
    try:
        if engine == "ray":
            from .ray_engine import run_ray

            run_ray(
                out,
                spec,
                shards,
                todo,
                num_workers,
                max_pixels,
                update,
                address=ray_address,
                cpus_per_worker=cpus_per_worker,
                gpus_per_worker=gpus_per_worker,
            )
        else:
            run_local(out, spec, shards, todo, num_workers, max_pixels, update)
    finally:
        if bar is not None:
            bar.close()
    report = merge(out, spec, shards, time.perf_counter() - t)
    report["resumed_shards"] = len(shards) - len(todo)
    report["shards"] = len(shards)
    return report


def _check_source_not_output(source: Path, out: Path) -> None:
    """A source file (a COCO .json, a .txt list) that the job would write over is refused,
    whoever wrote it: the job reads it, and the user gave it."""
    if not source.is_file():
        return
    for name in OUTPUTS:
        target = out / name
        if target.exists() and os.path.samefile(source, target):
            raise ValueError(
                f"the source {source} is where the job writes its {name} (in {out}): it would "
                "be replaced; write the job to another folder (-o)"
            )


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
