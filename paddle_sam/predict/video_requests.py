"""Upstream SAM 3's request API for video predictors: ``handle_request`` and
``handle_stream_request`` dispatch a ``{"type": ..., ...}`` dict to the predictor's methods
(``start_session``, ``add_prompt``, ``remove_object``, ``reset_session``, ``close_session``,
``propagate_in_video``). SAM 3's video predictor and SAM 2's request adapter share it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

REQUEST_TYPES = ("start_session", "add_prompt", "remove_object", "reset_session", "close_session")


def required(request: Mapping[str, Any], key: str) -> Any:
    """``request[key]``, or ValueError naming the request type and the missing key."""
    if key not in request:
        raise ValueError(f"request {request.get('type')!r} needs {key!r}")
    return request[key]


class VideoRequests:
    """The dispatch of upstream's video requests; subclasses implement the methods."""

    def handle_request(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Dispatch a request by its ``type`` (upstream ``handle_request``)."""
        request_type = self._type(request)
        if request_type == "start_session":
            return self.start_session(
                resource_path=required(request, "resource_path"),
                session_id=request.get("session_id", None),
            )
        if request_type == "add_prompt":
            return self.add_prompt(
                session_id=required(request, "session_id"),
                frame_idx=required(request, "frame_index"),
                text=request.get("text", None),
                points=request.get("points", None),
                point_labels=request.get("point_labels", None),
                bounding_boxes=request.get("bounding_boxes", None),
                bounding_box_labels=request.get("bounding_box_labels", None),
                obj_id=request.get("obj_id", None),
            )
        if request_type == "remove_object":
            return self.remove_object(
                session_id=required(request, "session_id"),
                obj_id=required(request, "obj_id"),
                **self._remove_object_options(request),
            )
        if request_type in ("reset_session", "close_session"):
            return getattr(self, request_type)(session_id=required(request, "session_id"))
        if request_type == "propagate_in_video":
            raise ValueError("propagate_in_video is a stream request: use handle_stream_request")
        raise ValueError(f"invalid request type: {request_type!r} ({', '.join(REQUEST_TYPES)})")

    def handle_stream_request(self, request: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """Dispatch a stream request (upstream ``handle_stream_request``): the request is
        checked now, the generator then yields ``{"frame_index", "outputs"}`` per frame.
        Stop iterating (or ``close()`` it) to cancel; the session stays usable."""
        request_type = self._type(request)
        if request_type != "propagate_in_video":
            raise ValueError(f"invalid stream request type: {request_type!r} (propagate_in_video)")
        return self.propagate_in_video(
            session_id=required(request, "session_id"),
            propagation_direction=request.get("propagation_direction", "both"),
            start_frame_idx=request.get("start_frame_index", None),
            max_frame_num_to_track=request.get("max_frame_num_to_track", None),
        )

    def _remove_object_options(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """What else a ``remove_object`` request passes to :meth:`remove_object`."""
        return {}

    @staticmethod
    def _type(request: Any) -> Any:
        if not isinstance(request, Mapping):
            raise ValueError(f"a request is a dict with a 'type', got {type(request).__name__}")
        return required(request, "type")

    # implemented by each predictor
    def start_session(self, resource_path: Any, session_id: str | None = None) -> dict:
        raise NotImplementedError

    def add_prompt(self, session_id: str, frame_idx: int, **prompt: Any) -> dict:
        raise NotImplementedError

    def remove_object(self, session_id: str, obj_id: int, **options: Any) -> dict:
        raise NotImplementedError

    def reset_session(self, session_id: str) -> dict:
        raise NotImplementedError

    def close_session(self, session_id: str) -> dict:
        raise NotImplementedError

    def propagate_in_video(self, session_id: str, **options: Any) -> Iterator[dict]:
        raise NotImplementedError


__all__ = ["REQUEST_TYPES", "VideoRequests", "required"]
