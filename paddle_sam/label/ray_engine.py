"""The Ray engine of ``paddle-sam label``: Ray Data over the shards still to do, a fixed pool of
actors (one model each) labelling one shard per call and writing its file, on a local Ray or a
cluster (``address``). The output folder must be on storage every node sees.

A killed actor is restarted by Ray and its shard retried: a shard file is written atomically
and a retried shard rewrites the same content, so nothing is lost or written twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .job import label_shard, write_shard
from .labelers import LabelSpec, build_labeler
from .sources import ImageItem


class ShardLabeler:
    """A Ray Data actor: builds the labeller once, then labels the shards of each batch."""

    def __init__(self, spec: dict, out: str, max_pixels: int | None, threads: int) -> None:
        from .._runtime import set_num_threads, tune_process

        tune_process()  # an actor process of ours: the process-wide settings, as the CLI's
        set_num_threads(threads)
        self.labeler = build_labeler(LabelSpec.from_dict(spec))
        self.out = Path(out)
        self.max_pixels = max_pixels

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        shards, counts = [], []
        for index, items in zip(batch["shard"], batch["items"], strict=True):
            images = [ImageItem(*row) for row in json.loads(str(items))]
            write_shard(self.out, label_shard(self.labeler, int(index), images, self.max_pixels))
            shards.append(int(index))
            counts.append(len(images))
        return {"shard": shards, "images": counts}


def run_ray(
    out: Path,
    spec: LabelSpec,
    shards: list[list[ImageItem]],
    todo: list[int],
    num_workers: int,
    max_pixels: int | None,
    progress: Callable[[int], None],
    address: str | None = None,
    cpus_per_worker: int = 1,
    gpus_per_worker: float = 0.0,
) -> None:
    """Label the shards ``todo`` with ``num_workers`` Ray actors, each reserving
    ``cpus_per_worker`` CPUs (its thread count) and ``gpus_per_worker`` GPUs. ``address``:
    "auto", "HOST:PORT" of a running cluster, or None for a Ray started here for the job."""
    if not todo:
        return
    try:
        import ray
        import ray.data
    except ImportError:
        raise ImportError("the Ray engine needs Ray Data: pip install 'paddle-sam[ray]'") from None
    import logging

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        rows = [
            {
                "shard": i,
                "items": json.dumps([[it.id, it.file_name, it.path] for it in shards[i]]),
            }
            for i in todo
        ]
        ds = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            ShardLabeler,
            fn_constructor_kwargs={
                "spec": spec.to_dict(),
                "out": str(Path(out).resolve()),
                "max_pixels": max_pixels,
                "threads": cpus_per_worker,
            },
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=num_workers),
            num_cpus=cpus_per_worker,
            num_gpus=gpus_per_worker,
        )
        for row in ds.iter_rows():
            progress(int(row["images"]))
    finally:
        if started_here:
            ray.shutdown()
