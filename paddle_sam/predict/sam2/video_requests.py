"""SAM 2's video predictor behind the request API of SAM 3's ``Sam3VideoPredictor`` (upstream
sam3's ``handle_request`` / ``handle_stream_request``), which the service's video mode speaks.

:class:`Sam2VideoRequests` holds sessions over one :class:`SAM2VideoPredictor` and answers
``start_session``, ``add_prompt`` (clicks and/or one box for an object: a new id adds it, an
existing one refines it, on any frame, also after tracking), ``remove_object``,
``reset_session``, ``close_session`` and the stream request ``propagate_in_video``. Each
frame's ``outputs`` are SAM 3's: ``out_obj_ids``, ``out_probs`` (the sigmoid of the object's
score on that frame), ``out_boxes_xywh`` (normalised, the box of the mask) and
``out_binary_masks`` (mask logits above 0, at the video's size). Coordinates are normalised
to [0, 1], as SAM 3's; boxes are ``x, y, w, h``. SAM 2 takes no text: a text prompt is a
:class:`ValueError` saying so.
"""

from __future__ import annotations

import gc
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..video import VideoFrames
from ..video_requests import VideoRequests
from .video_predictor import SAM2VideoPredictor

logger = logging.getLogger(__name__)

NO_TEXT = "SAM 2 takes no text prompts: click the object (points) or draw its box; text needs SAM 3"


def _box_xywh(mask: np.ndarray) -> list[float]:
    """The box of a mask, ``x, y, w, h`` normalised by its size (zeros for an empty one)."""
    h, w = mask.shape
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not len(rows):
        return [0.0, 0.0, 0.0, 0.0]
    x0, x1, y0, y1 = cols[0], cols[-1] + 1, rows[0], rows[-1] + 1
    return [x0 / w, y0 / h, (x1 - x0) / w, (y1 - y0) / h]


def _latest_output(state: dict, obj_idx: int, frame_idx: int) -> dict | None:
    """An object's output on a frame: a prompt's not yet propagated, else the stored one."""
    for outputs in (state["temp_output_dict_per_obj"], state["output_dict_per_obj"]):
        for key in ("cond_frame_outputs", "non_cond_frame_outputs"):
            out = outputs[obj_idx][key].get(frame_idx)
            if out is not None:
                return out
    return None


def object_probs(state: dict, frame_idx: int) -> np.ndarray:
    """Each object's probability of being on a frame (a SAM 2 video predictor's inference
    state): the sigmoid of the object score of its latest output there, 1 where it has none."""
    probs = []
    for obj_idx in range(len(state["obj_ids"])):
        out = _latest_output(state, obj_idx, frame_idx)
        logit = None if out is None else out.get("object_score_logits")
        if logit is None:
            probs.append(1.0)
            continue
        value = float(logit.astype("float32").numpy().reshape(-1)[0])
        probs.append(1.0 / (1.0 + np.exp(-value)))
    return np.asarray(probs, np.float32)


class Sam2VideoRequests(VideoRequests):
    """Upstream SAM 3's request API over SAM 2's per-object video predictor (one process).

    Requests may come from several threads: each session is used under its own lock."""

    takes_text = False
    #: a backward propagation visits its start frame again (upstream SAM 2's
    #: ``propagate_in_video(reverse=True)``), where SAM 3's starts one frame before it
    backward_includes_start = True

    def __init__(self, model: SAM2VideoPredictor) -> None:
        if not isinstance(model, SAM2VideoPredictor):
            raise TypeError(
                "model must be SAM 2's video predictor (build_sam2_video_predictor), got "
                f"{type(model).__name__}"
            )
        self.model = model.eval()
        self._sessions: dict[str, dict[str, Any]] = {}
        self._sessions_lock = threading.Lock()

    # ------------------------------------------------------------------ requests

    def start_session(self, resource_path: Any, session_id: str | None = None) -> dict[str, Any]:
        """Open a video (a file, a folder of frames, a list of frames) in a new session."""
        if session_id is not None and not isinstance(session_id, str):
            raise ValueError(f"session_id must be a string, got {type(session_id).__name__}")
        state = self.model.init_state(resource_path)
        session_id = session_id or str(uuid.uuid4())
        with self._sessions_lock:
            if session_id in self._sessions:
                raise ValueError(f"session {session_id!r} already exists")
            self._sessions[session_id] = {
                "state": state,
                "session_id": session_id,
                "lock": threading.RLock(),
                "max_obj_id": -1,
            }
        return {"session_id": session_id}

    def add_prompt(
        self,
        session_id: str,
        frame_idx: int,
        text: str | None = None,
        points: Any = None,
        point_labels: Any = None,
        bounding_boxes: Any = None,
        bounding_box_labels: Any = None,
        obj_id: int | None = None,
    ) -> dict[str, Any]:
        """Clicks (``N x 2`` in [0, 1], labels 1 / 0) and/or one box (``x, y, w, h`` in
        [0, 1]) for the object ``obj_id`` (default: a new one) on a frame -> ``{"frame_index",
        "outputs"}``: every object on that frame."""
        if text is not None:
            raise ValueError(NO_TEXT)
        if points is None and bounding_boxes is None:
            raise ValueError("give points and/or a box for the object")
        session = self._get_session(session_id)
        with session["lock"]:
            state = session["state"]
            size = np.array([state["video_width"], state["video_height"]], np.float64)
            pts = labels = box = None
            if points is not None:
                pts = np.asarray(points, np.float64).reshape(-1, 2) * size
                labels = point_labels
            if bounding_boxes is not None:
                boxes = np.asarray(bounding_boxes, np.float64).reshape(-1, 4)
                if len(boxes) != 1:
                    raise ValueError(f"SAM 2 takes one box per object, got {len(boxes)}")
                if bounding_box_labels is not None and list(
                    np.asarray(bounding_box_labels).reshape(-1)
                ) != [1]:
                    raise ValueError(
                        "SAM 2 takes no negative box (a box is the object); click the "
                        "background (label 0) instead"
                    )
                x, y, w, h = boxes[0]
                box = np.array([x, y, x + w, y + h]) * np.tile(size, 2)
            if obj_id is None:
                obj_id = self._next_obj_id(session)
            obj_id = int(obj_id)
            try:
                frame_idx, obj_ids, masks = self.model.add_new_points_or_box(
                    state, frame_idx, obj_id, points=pts, labels=labels, box=box
                )
            except IndexError as exc:  # the frame index
                raise ValueError(str(exc)) from None
            session["max_obj_id"] = max(session["max_obj_id"], obj_id)
            outputs = self._outputs(state, frame_idx, obj_ids, masks)
        return {"frame_index": int(frame_idx), "outputs": outputs}

    def remove_object(self, session_id: str, obj_id: int) -> dict[str, Any]:
        """Stop tracking an object (its results on every frame go)."""
        session = self._get_session(session_id)
        with session["lock"]:
            try:
                self.model.remove_object(session["state"], obj_id, strict=True, need_output=False)
            except RuntimeError as exc:
                raise ValueError(str(exc)) from None
        return {"is_success": True}

    def propagate_in_video(
        self,
        session_id: str,
        propagation_direction: str = "both",
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Track the objects forward, backward or both (forward, then backward from the same
        start frame); checked now, computed as the generator is consumed."""
        session = self._get_session(session_id)
        if propagation_direction not in ("both", "forward", "backward"):
            raise ValueError(
                f"invalid propagation direction: {propagation_direction!r} (both, forward, "
                "backward)"
            )
        state = session["state"]
        if not state["obj_ids"]:
            raise ValueError("nothing to propagate: add points or a box for an object first")
        if start_frame_idx is not None:
            try:
                self.model._check_frame_idx(state, start_frame_idx, "start frame")
            except IndexError as exc:
                raise ValueError(str(exc)) from None
        if max_frame_num_to_track is not None and (
            isinstance(max_frame_num_to_track, bool)
            or not isinstance(max_frame_num_to_track, int)
            or max_frame_num_to_track < 0
        ):
            raise ValueError(
                "max_frame_num_to_track must be a non-negative integer, got "
                f"{max_frame_num_to_track!r}"
            )
        return self._propagate(
            session, propagation_direction, start_frame_idx, max_frame_num_to_track
        )

    def _propagate(
        self,
        session: dict[str, Any],
        direction: str,
        start_frame_idx: int | None,
        max_frame_num_to_track: int | None,
    ) -> Iterator[dict[str, Any]]:
        reverse_flags = {"forward": (False,), "backward": (True,), "both": (False, True)}
        state = session["state"]
        with session["lock"]:
            for reverse in reverse_flags[direction]:
                for frame_idx, obj_ids, masks in self.model.propagate_in_video(
                    state,
                    start_frame_idx=start_frame_idx,
                    max_frame_num_to_track=max_frame_num_to_track,
                    reverse=reverse,
                ):
                    outputs = self._outputs(state, frame_idx, obj_ids, masks)
                    yield {"frame_index": int(frame_idx), "outputs": outputs}

    def reset_session(self, session_id: str) -> dict[str, Any]:
        """Back to the state right after ``start_session`` (ids are still never reused)."""
        session = self._get_session(session_id)
        with session["lock"]:
            self.model.reset_state(session["state"])
        return {"is_success": True}

    def close_session(self, session_id: str) -> dict[str, Any]:
        """Close a session; closing one that does not exist (any more) is not an error."""
        with self._sessions_lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            logger.warning("cannot close session %s as it does not exist", session_id)
        else:
            images = session["state"].get("images")
            if isinstance(images, VideoFrames):
                images.close()
            del session
            gc.collect()
        return {"is_success": True}

    # ------------------------------------------------------------------ sessions

    def _get_session(self, session_id: Any) -> dict[str, Any]:
        with self._sessions_lock:
            session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise ValueError(f"Cannot find session {session_id!r}; it might have expired")
        return session

    def session_state(self, session_id: str) -> dict[str, Any]:
        """A session's inference state, for inspection (memory accounting): change it only
        through requests."""
        return self._get_session(session_id)["state"]

    @staticmethod
    def _next_obj_id(session: dict[str, Any]) -> int:
        ids = [int(i) for i in session["state"]["obj_ids"]]
        return max([session["max_obj_id"], *ids]) + 1

    def next_obj_id(self, session_id: str) -> int:
        """An object id never used in the session (removed objects' ids are not reused)."""
        return self._next_obj_id(self._get_session(session_id))

    def session_ids(self) -> list[str]:
        with self._sessions_lock:
            return list(self._sessions)

    def shutdown(self) -> None:
        """Close every session."""
        for session_id in self.session_ids():
            self.close_session(session_id)

    # ------------------------------------------------------------------ outputs

    def _outputs(self, state: dict, frame_idx: int, obj_ids: list, masks: Any) -> dict[str, Any]:
        binary = masks.numpy()[:, 0] > 0.0
        return {
            "out_obj_ids": np.asarray([int(i) for i in obj_ids], np.int64),
            "out_probs": object_probs(state, frame_idx),
            "out_boxes_xywh": np.asarray([_box_xywh(m) for m in binary], np.float32).reshape(-1, 4),
            "out_binary_masks": binary,
        }


__all__ = ["NO_TEXT", "Sam2VideoRequests", "object_probs"]
