"""Sessions: one uploaded image and its embedding (or one video and SAM 3's tracking state,
``video.VideoSession``), in an LRU cache bounded by bytes.

A session holds what a prompt needs without recomputing the embedding: the predictor state
captured after ``set_image`` (embedding, sizes), the image itself (for "everything" crops),
and the last answer (low-res logits for mask refinement, mask PNGs for download). Its size
is the sum of the bytes of those arrays; the store evicts least recently used sessions to
stay within its budget, and remembers evicted ids so their clients are told to re-upload
instead of "not found".
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .errors import ServiceError

logger = logging.getLogger(__name__)


def nbytes(x: Any) -> int:
    """Bytes held by a numpy array, a Paddle tensor, bytes, or a list/tuple/dict of them."""
    if x is None:
        return 0
    if isinstance(x, np.ndarray | bytes | bytearray):
        return x.nbytes if isinstance(x, np.ndarray) else len(x)
    if isinstance(x, list | tuple):
        return sum(nbytes(v) for v in x)
    if isinstance(x, dict):
        return sum(nbytes(v) for v in x.values())
    if hasattr(x, "numel") and hasattr(x, "element_size"):  # paddle.Tensor
        return int(x.numel()) * int(x.element_size())
    return 0


@dataclass
class Answer:
    """The last prediction of a session: kept for refinement and downloads."""

    low_res_logits: np.ndarray  # C x h x w float32
    scores: np.ndarray  # C
    pngs: list[bytes]
    best: int | None  # None: no masks (a text prompt that found nothing)

    @property
    def nbytes(self) -> int:
        return nbytes(self.low_res_logits) + nbytes(self.scores) + nbytes(self.pngs)


@dataclass
class Session:
    noun: ClassVar[str] = "image"  # what its client uploads again once it is gone
    # what its size counts, for the refusal of a session larger than the whole budget
    contents: ClassVar[str] = "image + embedding"

    id: str
    image: np.ndarray  # H x W x 3 uint8
    state: dict[str, Any]  # the predictor's attributes after set_image
    embed_seconds: float
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    answer: Answer | None = None
    jobs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # warnings from decoding the upload
    # serialises a session's own read-modify-write of ``answer`` across concurrent requests
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def nbytes(self) -> int:
        jobs = sum(getattr(j, "nbytes", 0) for j in self.jobs.values())
        answer = self.answer.nbytes if self.answer is not None else 0
        return nbytes(self.image) + nbytes(self.state) + answer + jobs


class SessionError(ServiceError):
    """Base of the errors a client gets for a session id: a :class:`ServiceError` whose
    status and code are the class's."""

    status = 404
    code = "session_not_found"

    def __init__(self, detail: str) -> None:
        super().__init__(type(self).status, type(self).code, detail)


class SessionNotFound(SessionError):
    pass


class SessionGone(SessionError):
    status = 410
    code = "session_expired"


class SessionTooLarge(SessionError):
    status = 413
    code = "session_too_large"


class UploadsBusy(SessionError):
    """Uploads in flight already hold the memory budget: retry shortly."""

    status = 429
    code = "uploads_busy"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.headers = {"Retry-After": "5"}


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class Reservation:
    """Bytes of an upload in flight held in a :class:`SessionStore`'s budget (see
    :meth:`SessionStore.reserve`): ``grow`` as bytes arrive, ``release`` when the upload is
    refused or became a session (``SessionStore.add(session, reservation)`` releases it)."""

    def __init__(self, store: SessionStore, noun: str) -> None:
        self.store, self.noun, self.bytes = store, noun, 0

    def grow(self, nbytes: int) -> None:
        self.store._reserve(self, nbytes)

    def release(self) -> None:
        with self.store._lock:
            self.store._release_locked(self)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SessionStore:
    """Thread-safe LRU of sessions under a byte budget, with an optional idle timeout.

    ``refresh`` re-measures a session after it grew and evicts others (least recently used
    first) until the total fits again. A session alone larger than the budget is refused
    with :class:`SessionTooLarge` by ``add``, and dropped by ``refresh`` (the others are not
    evicted for it). Uploads in flight hold their bytes in the same budget
    (:meth:`reserve`): sessions are evicted to leave them room.
    """

    def __init__(
        self,
        budget_bytes: int,
        ttl_seconds: float | None = None,
        remember: int = 10_000,
        on_drop: Callable[[Session], None] | None = None,
    ) -> None:
        """``on_drop`` is called (under the store's lock: keep it quick) for each session
        evicted or expired, e.g. to cancel its background jobs."""
        if budget_bytes <= 0:
            raise ValueError(f"memory budget must be positive, got {budget_bytes} bytes")
        self.budget_bytes = int(budget_bytes)
        self.ttl_seconds = ttl_seconds
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._gone: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id -> (why, noun)
        self._remember = remember
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self.total_bytes = 0  # of the sessions
        self.reserved_bytes = 0  # of the uploads in flight
        self.peak_bytes = 0
        self.evictions = 0

    @staticmethod
    def new_id() -> str:
        return secrets.token_urlsafe(12)

    def __len__(self) -> int:
        return len(self._sessions)

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def _too_large(self, session: Any, size: int) -> str:
        return (
            f"this {session.noun} needs {_mib(size)} in the session cache "
            f"({session.contents}), above the server's budget of {_mib(self.budget_bytes)}; "
            f"upload a smaller {session.noun} or start the server with a larger "
            "--memory-budget-mb"
        )

    def reserve(self, nbytes: int, noun: str) -> Reservation:
        """Hold ``nbytes`` of the budget for an upload in flight (its Content-Length, or 0
        to ``grow`` as bytes arrive). Uploads in flight together may hold the whole budget,
        no more: past it :class:`UploadsBusy` (429, retry); one upload above the whole
        budget: :class:`SessionTooLarge` (413). Sessions are evicted (least recently used
        first) to leave the reserved bytes room."""
        reservation = Reservation(self, noun)
        reservation.grow(nbytes)
        return reservation

    def _reserve(self, reservation: Reservation, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            wanted = reservation.bytes + nbytes
            # refused: what it holds stays held until its owner releases it (after removing
            # the bytes it wrote)
            if wanted > self.budget_bytes:
                raise SessionTooLarge(
                    f"this {reservation.noun} upload is more than {_mib(wanted)}, above the "
                    f"server's memory budget of {_mib(self.budget_bytes)} (its session keeps "
                    f"the file); upload a smaller {reservation.noun} or start the server with "
                    "a larger --memory-budget-mb"
                )
            if self.reserved_bytes + nbytes > self.budget_bytes:
                held = self.reserved_bytes - reservation.bytes
                raise UploadsBusy(
                    f"other uploads in flight hold {_mib(held)} of the server's memory budget "
                    f"of {_mib(self.budget_bytes)}; this {reservation.noun} upload needs "
                    f"{_mib(wanted)}: retry when they are done, or start the server with a "
                    "larger --memory-budget-mb"
                )
            reservation.bytes = wanted
            self.reserved_bytes += nbytes
            self._evict_locked(keep=None)

    def _release_locked(self, reservation: Reservation) -> None:
        self.reserved_bytes -= reservation.bytes
        reservation.bytes = 0

    def add(self, session: Any, reservation: Reservation | None = None) -> list[Any]:
        """Insert a session (a :class:`Session` or any object with its ``id``, ``nbytes``,
        ``last_used``, ``noun`` and ``contents``); return the sessions evicted to make room.
        ``reservation``: the upload's, released as the session takes its place."""
        size = session.nbytes
        if size > self.budget_bytes:
            raise SessionTooLarge(self._too_large(session, size))
        with self._lock:
            if reservation is not None:
                self._release_locked(reservation)
            self._expire_locked()
            self._sessions[session.id] = session
            self._sizes[session.id] = size
            self.total_bytes += size
            logger.info(
                "%s session %s created: %.1f MiB (cache: %d sessions, %.1f of %.1f MiB)",
                session.noun,
                session.id,
                size / 2**20,
                len(self._sessions),
                self.total_bytes / 2**20,
                self.budget_bytes / 2**20,
            )
            return self._evict_locked(keep=session.id)

    def get(self, session_id: str, kind: type | None = None) -> Any:
        """The session, marked most recently used; raises a :class:`SessionError`. ``kind``:
        the class it must be (an image route does not serve a video session's id)."""
        kind = kind or Session
        with self._lock:
            self._expire_locked()
            s = self._sessions.get(session_id)
            if s is None or not isinstance(s, kind):
                gone = self._gone.get(session_id)
                if gone is not None and s is None:
                    why, noun = gone
                    raise SessionGone(
                        f"session {session_id} {why}; upload the {noun} again for a new session"
                    )
                raise SessionNotFound(
                    f"unknown {kind.noun} session {session_id!r} (never created or deleted)"
                )
            self._sessions.move_to_end(session_id)
            s.last_used = time.monotonic()
            return s

    def refresh(self, session: Session) -> list[Session]:
        """Re-measure a session after it changed; evict others if the total is over budget.
        A session grown past the whole budget by itself is dropped instead (and returned
        among the evicted: ``dropped_message`` says why), the others kept."""
        size = session.nbytes
        with self._lock:
            if session.id not in self._sessions:
                return []
            self.total_bytes += size - self._sizes[session.id]
            self._sizes[session.id] = size
            if size > self.budget_bytes:
                self.peak_bytes = max(self.peak_bytes, self.total_bytes + self.reserved_bytes)
                why = (
                    f"was dropped: it grew to {_mib(size)} ({session.contents}), above the "
                    f"server's memory budget of {_mib(self.budget_bytes)} by itself "
                    "(start the server with a larger --memory-budget-mb)"
                )
                return [self._drop_locked(session.id, why)]
            return self._evict_locked(keep=session.id)

    def dropped_message(self, session_id: str) -> str | None:
        """Why a session is gone (evicted, expired, grown past the budget); None if it is
        not."""
        with self._lock:
            gone = self._gone.get(session_id)
        return None if gone is None else f"session {session_id} {gone[0]}"

    def delete(self, session_id: str, kind: type | None = None) -> Any:
        kind = kind or Session
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None or not isinstance(s, kind):
                if s is None and session_id in self._gone:
                    raise SessionGone(f"session {session_id} {self._gone[session_id][0]}")
                raise SessionNotFound(
                    f"unknown {kind.noun} session {session_id!r} (never created or deleted)"
                )
            del self._sessions[session_id]
            self.total_bytes -= self._sizes.pop(session_id)
            logger.info("%s session %s deleted", s.noun, session_id)
            return s

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._expire_locked()
            return {
                "count": len(self._sessions),
                "bytes": self.total_bytes,
                "uploads_in_flight_bytes": self.reserved_bytes,
                "peak_bytes": self.peak_bytes,
                "budget_bytes": self.budget_bytes,
                "evictions": self.evictions,
                "ttl_seconds": self.ttl_seconds,
            }

    def _drop_locked(self, session_id: str, why: str) -> Session:
        s = self._sessions.pop(session_id)
        self.total_bytes -= self._sizes.pop(session_id)
        self._gone[session_id] = (why, s.noun)
        logger.info("%s session %s %s", s.noun, session_id, why)
        while len(self._gone) > self._remember:
            self._gone.popitem(last=False)
        if self._on_drop is not None:
            self._on_drop(s)
        return s

    def _evict_locked(self, keep: str | None) -> list[Session]:
        """Evict sessions but ``keep`` (least recently used first) until the sessions and
        the uploads in flight fit the budget, or none is left to evict."""
        evicted = []
        while self.total_bytes + self.reserved_bytes > self.budget_bytes:
            victim = next((k for k in self._sessions if k != keep), None)
            if victim is None:
                break
            evicted.append(
                self._drop_locked(
                    victim, "was evicted from the cache to stay within the server's memory budget"
                )
            )
            self.evictions += 1
        self.peak_bytes = max(self.peak_bytes, self.total_bytes + self.reserved_bytes)
        return evicted

    def _expire_locked(self) -> None:
        if self.ttl_seconds is None:
            return
        limit = time.monotonic() - self.ttl_seconds
        for k in [k for k, s in self._sessions.items() if s.last_used < limit]:
            self._drop_locked(k, f"expired after {self.ttl_seconds:g} s without use")
