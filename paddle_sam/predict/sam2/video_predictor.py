"""Drop-in ``SAM2VideoPredictor`` (upstream: sam2/sam2_video_predictor.py of sam2 1.1.0):
``init_state(video_path)``, ``add_new_points_or_box``, ``add_new_mask``,
``propagate_in_video``, ``clear_all_prompts_in_frame``, ``remove_object``, ``reset_state``.

The model's :class:`~paddle_sam.models.sam2.sam2_video_predictor.SAM2VideoPredictorBase` plus
what needs files: ``init_state`` opens the video with :func:`paddle_sam.predict.video.open_video`
(frames decoded on demand; a few held in memory) and each frame goes through the image encoder
when first needed; as upstream, only the most recent frame's features are kept. Frames are
prepared as upstream's loader does (PIL bicubic to the model's square input, ``/ 255``,
ImageNet mean and std); upstream reads JPEG folders only, here video files, folders of frame
images and lists of frames are read alike.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import paddle

from ...models.sam2.sam2_video_predictor import SAM2VideoPredictorBase
from ..video import VideoFrames, open_video, preprocess_frame


class SAM2VideoPredictor(SAM2VideoPredictorBase):
    """SAM 2 on videos, with upstream's API."""

    #: how this model's frames are prepared (``open_video(..., preprocess=...)``): upstream's
    #: ImageNet normalisation
    frame_preprocess = staticmethod(preprocess_frame)

    @paddle.no_grad()
    def init_state(  # type: ignore[override]
        self,
        video_path: str | os.PathLike | Sequence[Any] | VideoFrames,
        offload_video_to_cpu: bool = False,
        offload_state_to_cpu: bool = False,
        async_loading_frames: bool = False,
    ) -> dict[str, Any]:
        """A new inference state over a video: a video file (MP4, MOV, AVI, MKV, WEBM), a
        folder of frames (JPEG, PNG, ...; sorted by their number), a list of frames
        (``H x W x 3`` uint8 RGB arrays or PIL images) or an opened :class:`VideoFrames`.

        Frames are decoded on demand and kept on the host, so the ``offload_*`` and
        ``async_loading_frames`` switches change nothing (accepted for upstream's API)."""
        del async_loading_frames
        frames = (
            video_path
            if isinstance(video_path, VideoFrames)
            else open_video(video_path, image_size=self.image_size)
        )
        if frames.preprocess is not preprocess_frame:
            raise ValueError(
                "these frames were opened with another model's preparation; open them with "
                "open_video(..., preprocess=preprocess_frame), SAM 2's (ImageNet normalisation)"
            )
        if frames.image_size != self.image_size:
            raise ValueError(
                f"the frames are resized to {frames.image_size}, the model takes {self.image_size}"
            )

        def image_feature_fn(frame_idx: int) -> dict[str, Any]:
            return self.forward_image(paddle.to_tensor(frames[frame_idx])[None])

        state = super().init_state(
            frames.height,
            frames.width,
            len(frames),
            image_feature_fn=image_feature_fn,
            offload_video_to_cpu=offload_video_to_cpu,
            offload_state_to_cpu=offload_state_to_cpu,
        )
        state["images"] = frames
        return state

    @classmethod
    def from_pretrained(cls, model_id: str, **kwargs: Any) -> SAM2VideoPredictor:
        raise ValueError(
            f"paddle-sam never downloads weights ({model_id!r}): use build_sam2_video_predictor"
            "(config, ckpt_path) from paddle_sam.loading.sam2 with a local checkpoint"
        )


__all__ = ["SAM2VideoPredictor"]
