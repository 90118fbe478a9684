"""SAM 3 on videos: every instance of a concept through a video, with stable ids and click
refinement, behind upstream's request API (upstream: sam3/model/sam3_video_predictor.py,
``Sam3VideoPredictor``, and the frame loading of ``Sam3VideoInference.init_state``).

:class:`Sam3VideoModel` is the model's
:class:`~paddle_sam.models.sam3.sam3_video_inference.Sam3VideoInferenceWithInstanceInteractivity`
plus what needs files: ``init_state(resource_path)`` opens a video file, a folder of frames,
an image (a one-frame video) or a list of frames with
:func:`paddle_sam.predict.video.open_video`, frames decoded when first needed
(:func:`~paddle_sam.predict.video.preprocess_sam3_frame`: upstream's frame-folder recipe, for
every kind of source). It also carries ``tracker`` and ``detector`` as upstream's model does,
so sam3's SAM 2 task notebook runs on it (``model.tracker``, ``model.detector.backbone``).

:class:`Sam3VideoPredictor` holds sessions and answers requests as upstream's:
``handle_request`` (``start_session``, ``add_prompt``, ``remove_object``, ``reset_session``,
``close_session``) and ``handle_stream_request`` (``propagate_in_video``, a generator of
``{"frame_index", "outputs"}``). Unknown request types, unknown sessions and bad arguments
are :class:`ValueError` with one-line messages.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ...models.sam3.sam3_video_inference import (
    IMAGE_EXTS,
    Sam3VideoInferenceWithInstanceInteractivity,
)
from ..io import load_image
from ..video import VideoFrames, open_video, preprocess_sam3_frame
from ..video_requests import VideoRequests

logger = logging.getLogger(__name__)

_LOADER_TYPES = ("cv2", "torchcodec")


class Sam3VideoModel(Sam3VideoInferenceWithInstanceInteractivity):
    """SAM 3's dense video model (upstream ``build_sam3_video_model``'s result) that opens
    videos itself: ``init_state(resource_path)`` takes a video file (MP4, MOV, AVI, MKV,
    WEBM), a folder of frames, an image file, a list of frames (``H x W x 3`` uint8 RGB
    arrays or PIL images) or a :class:`VideoFrames` opened with
    :func:`~paddle_sam.predict.video.preprocess_sam3_frame`."""

    #: how this model's frames are prepared (``open_video(..., preprocess=...)``)
    frame_preprocess = staticmethod(preprocess_sam3_frame)

    def _open_resource(self, resource_path: Any, video_loader_type: str = "cv2", **kwargs: Any):
        del kwargs
        if video_loader_type not in _LOADER_TYPES:
            raise ValueError(
                f"video_loader_type must be one of {', '.join(_LOADER_TYPES)}, got "
                f"{video_loader_type!r} (every video is decoded with OpenCV here)"
            )
        if isinstance(resource_path, VideoFrames):
            if resource_path.preprocess is not preprocess_sam3_frame:
                raise ValueError(
                    "these frames were opened for the tracker (ImageNet normalisation); open "
                    "them with open_video(..., preprocess=preprocess_sam3_frame)"
                )
            frames = resource_path
        elif (
            isinstance(resource_path, str | os.PathLike)
            and Path(resource_path).suffix.lower() in IMAGE_EXTS
        ):
            path = Path(resource_path)
            if not path.is_file():
                raise FileNotFoundError(f"{path}: no such image file")
            frames = open_video(
                [load_image(path)], image_size=self.image_size, preprocess=preprocess_sam3_frame
            )
            frames.source = str(path)
        else:
            frames = open_video(
                resource_path, image_size=self.image_size, preprocess=preprocess_sam3_frame
            )
        return super()._open_resource(frames)


class Sam3VideoPredictor(VideoRequests):
    """Upstream's ``Sam3VideoPredictor`` on one process, around a built model
    (:func:`paddle_sam.build_sam3_video_predictor` builds both from a checkpoint, with
    upstream's arguments). Sessions belong to this predictor (upstream keeps them in a
    dictionary shared by every instance of the class).

    Requests may come from several threads: each session is used under its own lock, so one
    session's propagation does not block another's prompts (calls on one session wait)."""

    def __init__(
        self,
        model: Sam3VideoInferenceWithInstanceInteractivity,
        async_loading_frames: bool = False,
        video_loader_type: str = "cv2",
    ) -> None:
        if not isinstance(model, Sam3VideoInferenceWithInstanceInteractivity):
            raise TypeError(
                "model must be SAM 3's video model (build_sam3_video_model), got "
                f"{type(model).__name__}"
            )
        if video_loader_type not in _LOADER_TYPES:
            raise ValueError(
                f"video_loader_type must be one of {', '.join(_LOADER_TYPES)}, got "
                f"{video_loader_type!r}"
            )
        self.async_loading_frames = async_loading_frames
        self.video_loader_type = video_loader_type
        self.model = model.eval()
        self._sessions: dict[str, dict[str, Any]] = {}
        self._sessions_lock = threading.Lock()

    def _remove_object_options(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return {"is_user_action": request.get("is_user_action", True)}

    # ------------------------------------------------------------------ requests

    def start_session(self, resource_path: Any, session_id: str | None = None) -> dict[str, Any]:
        """Open a video (or an image, a one-frame video) in a new session."""
        if session_id is not None and not isinstance(session_id, str):
            raise ValueError(f"session_id must be a string, got {type(session_id).__name__}")
        inference_state = self.model.init_state(
            resource_path=resource_path,
            async_loading_frames=self.async_loading_frames,
            video_loader_type=self.video_loader_type,
        )
        session_id = session_id or str(uuid.uuid4())
        with self._sessions_lock:
            if session_id in self._sessions:
                raise ValueError(f"session {session_id!r} already exists")
            self._sessions[session_id] = {
                "state": inference_state,
                "session_id": session_id,
                "start_time": time.time(),
                "lock": threading.RLock(),
            }
        logger.debug("started session %s; %s", session_id, self._get_session_stats())
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
        """Text, box and/or point prompts on a frame -> ``{"frame_index", "outputs"}``."""
        session = self._get_session(session_id)
        with session["lock"]:
            frame_idx, outputs = self.model.add_prompt(
                inference_state=session["state"],
                frame_idx=frame_idx,
                text_str=text,
                points=points,
                point_labels=point_labels,
                boxes_xywh=bounding_boxes,
                box_labels=bounding_box_labels,
                obj_id=obj_id,
            )
        return {"frame_index": frame_idx, "outputs": outputs}

    def remove_object(
        self, session_id: str, obj_id: int, is_user_action: bool = True
    ) -> dict[str, Any]:
        """Stop tracking an object."""
        session = self._get_session(session_id)
        with session["lock"]:
            self.model.remove_object(
                inference_state=session["state"], obj_id=obj_id, is_user_action=is_user_action
            )
        return {"is_success": True}

    def propagate_in_video(
        self,
        session_id: str,
        propagation_direction: str = "both",
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Propagate the prompts (forward, then backward for ``"both"``); checked now,
        computed as the generator is consumed."""
        session = self._get_session(session_id)
        if propagation_direction not in ("both", "forward", "backward"):
            raise ValueError(
                f"invalid propagation direction: {propagation_direction!r} (both, forward, "
                "backward)"
            )
        state = session["state"]
        # the frame range is checked before any work (the model checks again when it runs)
        self.model._get_processing_order(state, start_frame_idx, max_frame_num_to_track, False)
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
        with session["lock"]:
            try:
                for reverse in reverse_flags[direction]:
                    for frame_idx, outputs in self.model.propagate_in_video(
                        inference_state=session["state"],
                        start_frame_idx=start_frame_idx,
                        max_frame_num_to_track=max_frame_num_to_track,
                        reverse=reverse,
                    ):
                        yield {"frame_index": frame_idx, "outputs": outputs}
            finally:
                logger.debug(
                    "propagation ended in session %s; %s",
                    session["session_id"],
                    self._get_session_stats(),
                )

    def reset_session(self, session_id: str) -> dict[str, Any]:
        """Back to the state right after ``start_session``."""
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
            images = session["state"]["input_batch"].img_batch
            if isinstance(images, VideoFrames):
                images.close()
            del session
            gc.collect()
        return {"is_success": True}

    def _get_session(self, session_id: Any) -> dict[str, Any]:
        with self._sessions_lock:
            session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise ValueError(f"Cannot find session {session_id!r}; it might have expired")
        return session

    def session_state(self, session_id: str) -> dict[str, Any]:
        """A session's inference state, for inspection (memory accounting, debugging):
        change it only through requests."""
        return self._get_session(session_id)["state"]

    def next_obj_id(self, session_id: str) -> int:
        """An object id never used in the session, for a new object added by clicks: ids of
        objects the model tracks but hides (hot-start, suppression) count, and removed
        objects' ids are never reused (upstream's rule)."""
        meta = self.session_state(session_id)["tracker_metadata"]
        return int(meta.get("max_obj_id", -1)) + 1 if meta else 0

    def session_ids(self) -> list[str]:
        """The open sessions."""
        with self._sessions_lock:
            return list(self._sessions)

    def _get_session_stats(self) -> str:
        with self._sessions_lock:
            live = [
                f"'{sid}' ({s['state']['num_frames']} frames)" for sid, s in self._sessions.items()
            ]
        return f"live sessions: [{', '.join(live)}]"

    def shutdown(self) -> None:
        """Close every session."""
        for session_id in self.session_ids():
            self.close_session(session_id)


__all__ = ["Sam3VideoModel", "Sam3VideoPredictor"]
