"""The model behind the service: one predictor under one lock, its per-image state swapped in
for each session, and "everything" (automatic mask generation) as a background job.

Paddle is not thread-safe, so every model call runs under the lock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._runtime import cpu_count, get_num_threads, set_num_threads
from ..loading import Source, bundled_notice, generator_defaults_for, vocabulary
from ..models.sam_v1.build_sam import SAM_SPECS
from ..predict.base import InteractivePredictor
from .sessions import Session, SessionStore

logger = logging.getLogger(__name__)

# -- the model behind a lock ------------------------------------------------------------


class ModelService:
    """One predictor shared by all sessions; its per-image state is swapped per call.

    The predictor's state after ``set_image`` is the attributes named by its
    ``session_state_keys``, which a session keeps and restores before each prompt. A
    predictor with ``takes_text`` (SAM 3) receives a prompt's text as
    ``predict(..., text=...)``; ``takes_points = False`` tells clients it refuses points, and
    ``returns_instances`` that an answer can be a set of instances (all shown) rather than
    candidate masks of one object (one shown).

    ``source``: where the model came from (:func:`paddle_sam.loading.resolve`), when known:
    it tells the bundled demo model (:attr:`demo`), its vocabulary and the generator's
    defaults for it.
    """

    def __init__(
        self,
        predictor: InteractivePredictor,
        model_type: str | None = None,
        threads: int | None = None,
        source: Source | None = None,
    ) -> None:
        self.predictor = predictor
        self.source = source
        self.lock = threading.Lock()
        # OpenMP's thread count is per calling thread, and requests run on worker threads
        # that would otherwise compute on one core: apply the creator's count in each of them
        self.threads = threads or get_num_threads() or cpu_count()
        self._configured = threading.local()
        self.state_keys = tuple(predictor.session_state_keys)
        self.takes_text = predictor.takes_text
        self.takes_points = predictor.takes_points
        self.returns_instances = predictor.returns_instances
        # the dynamic model (Sam, Sam3Image); None for an exported one
        self.model: Any = getattr(predictor, "model", None)
        self.model_type, self.spec = self._describe(model_type)
        self.last_embed_seconds: float | None = None
        # upload id -> [encoder blocks done, blocks in all]; the latest uploads only
        self.embed_progress: OrderedDict[str, list[int]] = OrderedDict()

    def _describe(self, model_type: str | None) -> tuple[str, dict | None]:
        """The model's name and spec: ``model_type`` if given, else the predictor's own (SAM
        3), a SAM v1 spec's name in ``SAM_SPECS`` ("custom" if none), or an export's."""
        own = self.predictor.model_type
        spec = getattr(self.model, "spec", None)
        if spec is not None:
            found = own or next((k for k, v in SAM_SPECS.items() if v == spec), None)
            return model_type or found or "custom", spec.to_dict()
        manifest = getattr(self.predictor, "manifest", None)
        if manifest is not None:
            return model_type or manifest.get("model_type") or "custom", manifest.get("spec")
        return model_type or own or type(self.predictor).__name__, None

    @property
    def runtime(self) -> str:
        return "paddle-inference" if hasattr(self.predictor, "manifest") else "dygraph"

    @property
    def sam2(self) -> bool:
        from ..predict.sam2.predictor import Sam2Predictor

        return isinstance(self.predictor, Sam2Predictor)

    @property
    def supports_everything(self) -> bool:
        # SAM v1, dynamic or on Paddle Inference (not ONNX, not SAM 3), and SAM 2
        return hasattr(self.predictor, "predict_point_grid") or self.sam2

    @property
    def everything_refusal(self) -> str:
        return (
            self.predictor.everything_refusal
            or f"'everything' mode needs SAM v1 on Paddle; this server runs {self.runtime}"
        )

    @property
    def generator_defaults(self) -> dict[str, Any]:
        """The "everything" generator's defaults for this model (lowered for the bundled one)."""
        return generator_defaults_for(self.source)

    @property
    def vocabulary(self) -> list[str] | None:
        """The phrases a SAM 3 was trained on, where its sidecar lists them (the bundled one)."""
        return vocabulary(self.source)

    @property
    def demo(self) -> str | None:
        """What the bundled demo model is and the command that gets real weights ("the default
        synthetic model (sam_tiny_synthetic.pdparams, ...: paddle-sam download vit_b)"); None
        for any other model."""
        notice = bundled_notice(self.source) if self.source is not None else None
        return notice.removeprefix("using ") if notice else None

    @property
    def confidence_threshold(self) -> float | None:
        """SAM 3's score threshold for instances; None for a model without one."""
        value = getattr(self.predictor, "confidence_threshold", None)
        return float(value) if value is not None else None

    @property
    def takes_mask_input(self) -> bool:
        return self.predictor.takes_mask_input

    @property
    def mask_refusal(self) -> str:
        return self.predictor.mask_refusal or "this model cannot refine a mask"

    def answers_instances(self, text: str | None, has_points: bool, has_mask: bool) -> bool:
        """Whether this request's answer is a set of instances rather than candidate masks of
        one object (SAM 3 answers points or a previous mask with the latter)."""
        return self.returns_instances and not self.predictor.is_interactive(
            text, has_points, has_mask
        )

    def _use_threads(self) -> None:
        if not getattr(self._configured, "done", False):
            set_num_threads(self.threads)
            self._configured.done = True

    def _track(self, upload_id: str | None) -> list[int]:
        blocks = getattr(getattr(self.model, "image_encoder", None), "blocks", None)
        # one step per encoder block, and a last one when the embedding is ready
        progress = [0, len(blocks) + 1 if blocks is not None else 0]
        if upload_id is not None:
            self.embed_progress[upload_id] = progress
            while len(self.embed_progress) > 256:
                self.embed_progress.popitem(last=False)
        return progress

    def embed(
        self, image: np.ndarray, upload_id: str | None = None
    ) -> tuple[dict[str, Any], float]:
        """Embed an image; with ``upload_id``, count encoder blocks done for progress polls."""
        progress = self._track(upload_id)
        with self.lock:
            self._use_threads()
            hooks = []
            if upload_id is not None and progress[1]:

                def block_done(layer, inputs, output) -> None:
                    progress[0] += 1

                hooks = [
                    b.register_forward_post_hook(block_done)
                    for b in self.model.image_encoder.blocks
                ]
            t = time.perf_counter()
            try:
                self.predictor.set_image(image)
            finally:
                for h in hooks:
                    h.remove()
            seconds = time.perf_counter() - t
            state = self.current_state()
        progress[0] = progress[1]
        self.last_embed_seconds = seconds
        return state, seconds

    def current_state(self) -> dict[str, Any]:
        """The predictor's state for its current image (``session_state_keys``)."""
        return {k: getattr(self.predictor, k) for k in self.state_keys}

    def restore(self, state: dict[str, Any]) -> None:
        """Put an image's state (from :meth:`embed`) back into the predictor; under the lock."""
        for k, v in state.items():
            setattr(self.predictor, k, v)
        self.predictor.is_image_set = True

    def predict(
        self, state: dict[str, Any], confidence_threshold: float | None = None, **kwargs
    ) -> tuple[np.ndarray, ...]:
        """The predictor's answer on a session's state; ``confidence_threshold`` (SAM 3) for
        this call only (the server's own is put back after it)."""
        with self.lock:
            self._use_threads()
            self.restore(state)
            if confidence_threshold is None:
                return self.predictor.predict(**kwargs)
            processor = self.predictor.processor
            before = processor.confidence_threshold
            processor.set_confidence_threshold(confidence_threshold)
            try:
                return self.predictor.predict(**kwargs)
            finally:
                processor.set_confidence_threshold(before)

    def yield_lock(self) -> None:
        """Let waiting requests run between the batches of a long job holding the lock."""
        self.lock.release()
        time.sleep(0.002)
        self.lock.acquire()


# -- "everything": automatic mask generation as a background job -------------------------


class JobCancelled(Exception):
    pass


class QueueFull(Exception):
    """The job queue holds its maximum of jobs waiting or running."""


class JobQueue:
    """One worker thread for "everything" jobs, and at most ``max_jobs`` of them waiting or
    running at once: ``submit`` raises :class:`QueueFull` beyond that."""

    def __init__(self, max_jobs: int) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        self.max_jobs = max_jobs
        self._pending = 0
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="everything")

    @property
    def pending(self) -> int:
        return self._pending

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        with self._lock:
            if self._pending >= self.max_jobs:
                raise QueueFull(
                    f"{self._pending} 'everything' jobs are already waiting or running (the "
                    f"limit is {self.max_jobs}): try again when one has finished"
                )
            self._pending += 1
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._done(None)
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future | None) -> None:
        with self._lock:
            self._pending -= 1
        if future is not None and not future.cancelled() and future.exception() is not None:
            # a job reports its own failures; this is one that escaped it (nobody reads the
            # future, so it would be lost)
            logger.error("a background job raised", exc_info=future.exception())

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class EverythingJob:
    """An "everything" job: its progress in generator batches and, once done, its masks."""

    id: str
    total: int
    status: str = "queued"  # queued, running, done, failed, cancelled
    done: int = 0
    error: str | None = None
    result: list[dict] | None = None
    seconds: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def nbytes(self) -> int:
        if not self.result:
            return 0
        return sum(len(r["segmentation"]["counts"]) + 200 for r in self.result)

    def to_json(self, with_result: bool) -> dict:
        out = {
            "job_id": self.id,
            "status": self.status,
            "done": self.done,
            "total": self.total,
            "progress": round(self.done / self.total, 4) if self.total else 1.0,
            "error": self.error,
            "seconds": self.seconds,
        }
        if with_result and self.result is not None:
            out["masks"] = self.result
        return out


class _SessionGrid:
    """The service's predictor as the mask generator's, for one session's image: the session's
    state is put back before every batch of points, since requests on other sessions swap
    theirs in while the job gives the lock back between batches. A crop (``crop_n_layers``)
    is embedded on the shared predictor and its state kept here the same way."""

    def __init__(self, service: ModelService, session: Session) -> None:
        self._service = service
        self._predictor = service.predictor
        self._session = session
        self._state: dict[str, Any] = {}
        # what the generator reads of its predictor: the transform, and the dynamic model
        # (threshold, device) or an exported runtime's own threshold
        self.transform = self._predictor.transform
        self.model = getattr(self._predictor, "model", None)
        self.mask_threshold = getattr(self._predictor, "mask_threshold", None)

    @property
    def input_size(self) -> tuple[int, ...]:
        return self._state["input_size"]

    @property
    def original_size(self) -> tuple[int, ...]:
        return self._state["original_size"]

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        if tuple(image.shape[:2]) == tuple(self._session.state["original_size"]):
            self._state = dict(self._session.state)  # the whole image: its embedding is kept
        else:  # a crop needs its own embedding
            self._predictor.set_image(image, image_format)
            self._state = self._service.current_state()

    def predict_point_grid(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._service.restore(self._state)
        return self._predictor.predict_point_grid(points)

    def reset_image(self) -> None:
        self._state = {}


class _Sam2SessionGrid:
    """The service's SAM 2 predictor (``Sam2Predictor``) as ``SAM2AutomaticMaskGenerator``'s,
    for one session's image: as :class:`_SessionGrid`, the session's features are put back
    before every batch, and a crop is embedded on the shared predictor and its features kept
    here. ``min_region_area`` is the generator's ``min_mask_region_area``, which upstream
    gives the predictor as its hole and speck areas."""

    def __init__(self, service: ModelService, session: Session, min_region_area: int) -> None:
        self._service = service
        self._wrapper = service.predictor
        self._inner = self._wrapper.predictor  # the SAM2ImagePredictor
        self._session = session
        self._state: dict[str, Any] | None = None
        self.max_hole_area = self.max_sprinkle_area = min_region_area

    @property
    def _orig_hw(self) -> list:
        return self._state["orig_hw"]

    def set_image(self, image: np.ndarray) -> None:
        whole = self._session.state["image_state"]
        if tuple(image.shape[:2]) == tuple(whole["orig_hw"][0]):
            self._state = whole  # the whole image: its features are kept
        else:  # a crop needs its own
            self._wrapper.set_image(image)
            self._state = self._wrapper.image_state

    def _activate(self) -> Any:
        self._service.restore({"image_state": self._state})
        return self._wrapper.activate()

    def _transform_coords(self, *args: Any) -> Any:
        return self._inner._transform_coords(*args)

    def _decode(self, *args: Any, **kwargs: Any) -> Any:
        return self._activate()._decode(*args, **kwargs)

    def _predict(self, *args: Any, **kwargs: Any) -> Any:
        return self._activate()._predict(*args, **kwargs)

    def _postprocess_masks(self, masks: Any, orig_hw: tuple[int, int]) -> Any:
        inner = self._inner
        kept = inner.max_hole_area, inner.max_sprinkle_area
        inner.max_hole_area, inner.max_sprinkle_area = self.max_hole_area, self.max_sprinkle_area
        try:
            return inner._postprocess_masks(masks, orig_hw)
        finally:
            inner.max_hole_area, inner.max_sprinkle_area = kept

    def reset_predictor(self) -> None:
        self._state = None


def _everything_generator(service: ModelService, session: Session, job: EverythingJob, **kw):
    """A mask generator on the session's image (its embedding reused) that reports progress
    per batch and gives the model lock back between batches: SAM v1's, or SAM 2's."""
    from ..predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

    if service.sam2:
        from ..predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

        base: type = SAM2AutomaticMaskGenerator
        grid: Any = _Sam2SessionGrid(service, session, kw.get("min_mask_region_area", 0))
    else:
        base, grid = SamAutomaticMaskGenerator, _SessionGrid(service, session)

    class SessionGenerator(base):  # type: ignore[misc, valid-type]
        def _process_batch(self, *args, **kwargs):
            if job.cancel.is_set():
                raise JobCancelled()
            service.yield_lock()
            out = super()._process_batch(*args, **kwargs)
            job.done += 1
            return out

    return SessionGenerator(grid, output_mode="coco_rle", **kw)


def _run_everything(
    service: ModelService, store: SessionStore, session: Session, job: EverythingJob, gen: Any
) -> None:
    """Run a job's generator under the model lock; its outcome goes into the job."""
    if job.cancel.is_set():
        job.status = "cancelled"
        logger.info("everything job %s (session %s) cancelled before it ran", job.id, session.id)
        return
    job.status = "running"
    logger.info("everything job %s (session %s) started: %d batches", job.id, session.id, job.total)
    t = time.perf_counter()
    try:
        with service.lock:
            service._use_threads()
            records = gen.generate(session.image)
        job.result = [
            {
                "segmentation": r["segmentation"],
                "area": int(r["area"]),
                "bbox": [float(v) for v in r["bbox"]],
                "predicted_iou": float(r["predicted_iou"]),
                "stability_score": float(r["stability_score"]),
                "point_coords": [[float(v) for v in p] for p in r["point_coords"]],
            }
            for r in records
        ]
        job.status = "done"
        logger.info(
            "everything job %s done in %.2f s: %d masks",
            job.id,
            time.perf_counter() - t,
            len(job.result),
        )
    except JobCancelled:
        job.status = "cancelled"
        logger.info(
            "everything job %s cancelled after %d of %d batches", job.id, job.done, job.total
        )
    except Exception as exc:  # the client reads one line through the progress endpoint
        logger.exception("everything job %s failed after %.2f s", job.id, time.perf_counter() - t)
        job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        job.seconds = round(time.perf_counter() - t, 3)
        store.refresh(session)


def cancel_jobs(session: Session) -> None:
    """Ask a session's background jobs to stop (at their next batch)."""
    for j in list(session.jobs.values()):
        j.cancel.set()


def start_everything(
    service: ModelService,
    store: SessionStore,
    jobs: JobQueue,
    session: Session,
    options: dict[str, Any],
) -> EverythingJob:
    """Queue automatic mask generation on a session; ``options`` are the generator's.
    Raises :class:`QueueFull` when ``jobs`` holds its maximum."""
    from ..predict.sam_v1.amg_utils import generate_crop_boxes

    job = EverythingJob(store.new_id(), total=0)
    gen = _everything_generator(service, session, job, **options)
    _, layers = generate_crop_boxes(
        (session.height, session.width), options["crop_n_layers"], 512 / 1500
    )
    batch = options["points_per_batch"]
    job.total = sum(math.ceil(len(gen.point_grids[i]) / batch) for i in layers)
    session.jobs[job.id] = job
    try:
        jobs.submit(_run_everything, service, store, session, job, gen)
    except QueueFull:
        session.jobs.pop(job.id, None)
        raise
    return job


__all__ = [
    "EverythingJob",
    "JobQueue",
    "ModelService",
    "QueueFull",
    "cancel_jobs",
    "start_everything",
]
