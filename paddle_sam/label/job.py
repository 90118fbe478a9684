"""A labelling job: the image list cut into shards, each shard labelled by a worker and written
atomically, then merged into one COCO file. An interrupted job resumes with the shards it has.

Layout of the output folder::

    job.json                   what the job is (model, mode, options, source list checksum)
    shards/shard-000007.json   one shard's images, annotations and skipped images
    annotations.json           the merged COCO file (images, categories, annotations)
    report.json                counts, skipped images with their reasons, timings

A shard file appears only once complete (written to a temporary name, then renamed), so a
killed worker leaves nothing half-written behind: ``--resume`` redoes exactly the shards
without a file and the merge never sees an image twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..predict.outputs import check_targets, claim, remove_owned
from .labelers import LabelSpec, build_labeler
from .sources import ImageItem

JOB_FILE = "job.json"
SHARD_DIR = "shards"
COCO_FILE = "annotations.json"
REPORT_FILE = "report.json"
JOB_FORMAT = 1
OUTPUTS = (JOB_FILE, SHARD_DIR, COCO_FILE, REPORT_FILE)  # what a job writes into its folder


class WorkerDied(RuntimeError):
    """A worker process of the local engine died; the shards written so far are kept."""


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.json"


def source_checksum(items: list[ImageItem]) -> str:
    h = hashlib.sha256()
    for it in items:
        h.update(f"{it.id}\t{it.file_name}\t{it.path}\n".encode())
    return h.hexdigest()


def job_description(
    spec: LabelSpec, items: list[ImageItem], shard_size: int, max_pixels: int | None
) -> dict[str, Any]:
    return {
        "format": JOB_FORMAT,
        "spec": spec.to_dict(),
        "images": len(items),
        "source_sha256": source_checksum(items),
        "shard_size": shard_size,
        "max_pixels": max_pixels,
    }


def prepare_output(out: Path, description: dict, resume: bool, overwrite: bool) -> None:
    """Start a job in ``out``, or continue the one there (``resume``: only when it is the
    same job). The job's files follow paddle-sam's one rule for outputs
    (:mod:`paddle_sam.predict.outputs`): a file of that name paddle-sam did not write is never
    replaced, whatever the flags; a job's results only with ``overwrite``."""
    job_file = out / JOB_FILE
    present = check_targets(out, OUTPUTS, replace=True)  # refuses the user's files only
    if resume and overwrite:
        raise ValueError("give --resume or --overwrite, not both")
    if overwrite:
        remove_owned(out, OUTPUTS)
    elif JOB_FILE in present:
        if not resume:
            raise FileExistsError(
                f"{out} already holds a labelling job: --resume to continue it, --overwrite "
                "to start again"
            )
        old = read_json(job_file, "job description")
        if not isinstance(old, dict):
            raise ValueError(
                f"{job_file}: not a job description (a JSON object expected, got "
                f"{type(old).__name__}); --overwrite starts the job again"
            )
        changed = [k for k in description if old.get(k) != description[k]]
        if changed:
            raise ValueError(
                f"{out} holds another job (different {', '.join(changed)}): --resume "
                "continues the same job only; use another folder or --overwrite"
            )
    elif resume and SHARD_DIR in present:
        raise ValueError(f"{out}: shards without {JOB_FILE}; use --overwrite to start again")
    elif present:  # a job's results without its description: not resumable, not replaced
        raise FileExistsError(
            f"{out} already has {', '.join(present)} of an earlier labelling job; pass "
            "--overwrite to replace them"
        )
    claim(out, OUTPUTS, "label")
    (out / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    _write_json(job_file, description)


def read_json(path: Path, what: str) -> Any:
    """The JSON document of a job's file; one ValueError naming the file when it is not one
    (unreadable, truncated, not UTF-8, nested too deeply)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ValueError(f"{path}: not a readable {what} ({why})") from None


def _write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` atomically: a temporary file, then a rename."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, path)


def plan_shards(items: list[ImageItem], shard_size: int) -> list[list[ImageItem]]:
    return [items[i : i + shard_size] for i in range(0, len(items), shard_size)]


def pending_shards(out: Path, shards: list[list[ImageItem]]) -> list[int]:
    return [i for i in range(len(shards)) if not (out / SHARD_DIR / shard_name(i)).exists()]


def label_shard(
    labeler: Any, index: int, items: Iterable[ImageItem], max_pixels: int | None
) -> dict[str, Any]:
    """Label the images of one shard: unreadable or too large images are skipped and listed
    with the reason; anything else that fails is a bug and propagates."""
    from ..predict.io import load_image

    images, annotations, skipped = [], [], []
    t = time.perf_counter()
    for it in items:
        try:
            image = load_image(it.path, max_pixels)
        except (OSError, ValueError) as exc:  # missing, unreadable, not an image, too large
            skipped.append({"id": it.id, "file_name": it.file_name, "reason": str(exc)})
            continue
        h, w = image.shape[:2]
        images.append({"id": it.id, "file_name": it.file_name, "width": w, "height": h})
        for ann in labeler.label(image):
            annotations.append({"image_id": it.id, **ann})
    return {
        "shard": index,
        "images": images,
        "annotations": annotations,
        "skipped": skipped,
        "seconds": round(time.perf_counter() - t, 3),
    }


def write_shard(out: Path, result: dict[str, Any]) -> None:
    _write_json(out / SHARD_DIR / shard_name(result["shard"]), result)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# a shard's lists: what each entry must hold (key, test, what it must be)
_SHARD_ENTRIES = {
    "images": (
        ("id", _is_int, "an integer"),
        ("file_name", lambda v: isinstance(v, str), "a string"),
        ("width", _is_int, "an integer"),
        ("height", _is_int, "an integer"),
    ),
    "annotations": (("image_id", _is_int, "an integer"),),
    "skipped": (("id", _is_int, "an integer"),),
}


def read_shard(out: Path, index: int, items: list[ImageItem]) -> dict[str, Any]:
    """Shard ``index``'s file, checked: its keys and their types, exactly the images of the
    shard (``items``), annotations only of the images it labelled. One ValueError naming the
    file (and the key) otherwise, saying how to redo the shard."""
    path = out / SHARD_DIR / shard_name(index)
    redo = "delete it to label its images again with --resume, or start again with --overwrite"
    try:
        doc = read_json(path, "shard")
    except ValueError as exc:
        raise ValueError(f"{exc}; {redo}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a shard (a JSON object expected); {redo}")
    for key in ("images", "annotations", "skipped"):
        entries = doc.get(key)
        if not isinstance(entries, list):
            got = "missing" if key not in doc else f"a {type(entries).__name__}, not a list"
            raise ValueError(f"{path}: '{key}' {got}; {redo}")
        for k, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ValueError(f"{path}: '{key}[{k}]' is not an object; {redo}")
            for name, ok, what in _SHARD_ENTRIES[key]:
                if not ok(entry.get(name)):
                    raise ValueError(f"{path}: '{key}[{k}].{name}' must be {what}; {redo}")
    if not _is_number(doc.get("seconds")):
        raise ValueError(f"{path}: 'seconds' must be a number; {redo}")
    expected = [it.id for it in items]
    got = [im["id"] for im in doc["images"]] + [s["id"] for s in doc["skipped"]]
    if sorted(got) != sorted(expected):
        raise ValueError(f"{path} does not hold the images of shard {index}; {redo}")
    labelled = {im["id"] for im in doc["images"]}
    for k, ann in enumerate(doc["annotations"]):
        if ann["image_id"] not in labelled:
            raise ValueError(
                f"{path}: 'annotations[{k}].image_id' {ann['image_id']} is not an image the "
                f"shard labelled; {redo}"
            )
    return doc


def merge(out: Path, spec: LabelSpec, shards: list[list[ImageItem]], seconds: float) -> dict:
    """Merge every shard (all must exist) into the COCO file and the report; returns the
    report. Annotation ids run from 1 in image order."""
    images, annotations, skipped, labelled_seconds = [], [], [], 0.0
    for i in range(len(shards)):
        doc = read_shard(out, i, shards[i])
        images += doc["images"]
        annotations += doc["annotations"]
        skipped += doc["skipped"]
        labelled_seconds += doc["seconds"]
    for k, ann in enumerate(annotations, 1):
        ann["id"] = k
    coco = {
        "info": {"description": "paddle-sam label", "mode": spec.mode},
        "images": images,
        "categories": spec.categories(),
        "annotations": annotations,
    }
    _write_json(out / COCO_FILE, coco)
    report = {
        "images": len(images) + len(skipped),
        "labelled": len(images),
        "skipped": len(skipped),
        "annotations": len(annotations),
        "skipped_images": skipped,
        "seconds_this_run": round(seconds, 3),
        "seconds_labelling_all_shards": round(labelled_seconds, 3),
    }
    _write_json(out / REPORT_FILE, report)
    return report


# -- the local engine ------------------------------------------------------------------------


def _exit_with(parent: int) -> None:
    """Stop this worker when the job process ``parent`` is gone (killed: a worker would
    otherwise label on, unseen, holding its model's memory)."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="paddle-sam-parent-watch", daemon=True).start()


def _worker(conn: Any, spec_dict: dict, threads: int, parent: int) -> None:
    """A worker process: builds its model once, then labels the shards the job sends it over
    its own pipe, one at a time, until it receives ``None``. It answers each shard with
    ``("done", images)`` or ``("error", exception)``."""
    from .._runtime import set_num_threads, tune_process

    _exit_with(parent)
    tune_process()  # a worker process of ours: the process-wide settings, as the CLI's
    set_num_threads(threads)  # the machine's threads shared out between the workers
    try:
        labeler = build_labeler(LabelSpec.from_dict(spec_dict))
    except Exception as exc:  # noqa: BLE001 - the job raises it as its own
        conn.send(("error", _picklable(exc)))
        return
    while (task := conn.recv()) is not None:
        out, index, items, max_pixels = task
        try:
            write_shard(Path(out), label_shard(labeler, index, items, max_pixels))
        except Exception as exc:  # noqa: BLE001 - handed to the job process, which raises it
            conn.send(("error", _picklable(exc)))
        else:
            conn.send(("done", len(items)))


def _picklable(exc: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception that cannot cross processes
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def run_local(
    out: Path,
    spec: LabelSpec,
    shards: list[list[ImageItem]],
    todo: list[int],
    num_workers: int,
    max_pixels: int | None,
    progress: Callable[[int], None],
) -> None:
    """Label the shards ``todo`` on this machine: in this process with one worker, else in
    ``num_workers`` processes (spawned, one model each, the CPU threads shared out). A worker
    that dies stops the job; the shards written so far stay for ``--resume``.

    Each worker has its own pipe to the job and nothing shared with the others (no common
    queue or lock that a killed worker could leave taken), and the job waits on the pipes and
    the processes' exit handles together, so a death is seen as soon as it happens."""
    if not todo:
        return
    if num_workers <= 1:
        labeler = build_labeler(spec)
        for i in todo:
            write_shard(out, label_shard(labeler, i, shards[i], max_pixels))
            progress(len(shards[i]))
        return
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from .._runtime import cpu_count

    ctx = mp.get_context("spawn")
    threads = max(1, cpu_count() // num_workers)
    pending = list(reversed(todo))
    workers = []  # (process, the job's end of its pipe)
    try:
        for _ in range(min(num_workers, len(todo))):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                args=(theirs, spec.to_dict(), threads, os.getpid()),
                name="paddle-sam-label-worker",
                daemon=True,
            )
            proc.start()
            theirs.close()
            workers.append((proc, mine))
        busy = 0
        for _, conn in workers:  # one shard each to start with
            if pending:
                conn.send((str(out), (i := pending.pop()), shards[i], max_pixels))
                busy += 1
        while busy:
            ready = wait([conn for _, conn in workers] + [p.sentinel for p, _ in workers])
            for proc, conn in workers:
                if conn in ready:
                    try:
                        kind, value = conn.recv()
                    except (EOFError, OSError):  # the worker died mid-answer
                        raise _died(out) from None
                    busy -= 1
                    if kind == "error":
                        raise value
                    progress(value)
                    if pending:
                        conn.send((str(out), (i := pending.pop()), shards[i], max_pixels))
                        busy += 1
                elif proc.sentinel in ready:
                    raise _died(out)
        for _, conn in workers:
            conn.send(None)
        for proc, _ in workers:
            proc.join(timeout=10)
    finally:
        for proc, conn in workers:
            if proc.is_alive():
                proc.kill()
            proc.join()
            conn.close()


def _died(out: Path) -> WorkerDied:
    return WorkerDied(
        "a labelling worker process died (killed, or out of memory); the shards "
        f"finished so far are kept in {out / SHARD_DIR}: run again with --resume"
    )


__all__ = [
    "COCO_FILE",
    "JOB_FILE",
    "OUTPUTS",
    "REPORT_FILE",
    "SHARD_DIR",
    "WorkerDied",
    "job_description",
    "label_shard",
    "merge",
    "pending_shards",
    "plan_shards",
    "prepare_output",
    "read_json",
    "read_shard",
    "run_local",
]
