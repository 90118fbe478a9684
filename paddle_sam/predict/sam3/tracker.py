"""SAM 3's video tracker on video files, frame folders and frame lists (upstream:
sam3/model/sam3_tracking_predictor.py with its frame loader, the API of sam3's
``sam3_for_sam2_video_task_example`` notebook).

:class:`Sam3TrackerVideoPredictor` is the model's :class:`Sam3TrackerPredictor` plus what
needs files: ``init_state(video_path=...)`` opens the video with
:func:`paddle_sam.predict.video.open_video` (frames decoded on demand, at most a few held in
memory, so long videos stay within bounded memory) and each frame goes through ``backbone``
(SAM 3's vision backbone with its SAM 2 neck) when the tracker first needs it; as upstream,
only the most recent frame's features are kept.

Upstream normalises tracker frames with ImageNet's mean and std (not the 0.5 / 0.5 of SAM 3's
image predictor); so do we. Upstream decodes MP4 files with decord, resized by the decoder;
we decode every video format with OpenCV and resize like upstream's JPEG-folder path (PIL
bicubic), so a video file and the same frames as a JPEG folder give the same masks here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import paddle
from paddle import nn

from ...models.sam3.sam3_tracking_predictor import BackboneOut, Sam3TrackerPredictor
from ..video import VideoFrames, open_video


class Sam3TrackerVideoPredictor(Sam3TrackerPredictor):
    """:class:`Sam3TrackerPredictor` that opens videos itself. ``backbone``: a
    ``SAM3VLBackbone`` whose vision neck has the SAM 2 branch (built ``with_backbone``, or set
    by the caller as upstream's notebook does: ``tracker.backbone = model.detector.backbone``).
    """

    def __init__(self, *args: Any, backbone: nn.Layer | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.backbone = backbone

    def forward_image(self, img_batch: paddle.Tensor) -> BackboneOut:
        """Backbone features of ``B x 3 x S x S`` normalised frames, the two finest levels
        through ``conv_s0`` / ``conv_s1`` (upstream's ``forward_image``)."""
        if self.backbone is None:
            raise RuntimeError(
                "the tracker has no image backbone: build it with_backbone=True, or set "
                "tracker.backbone = model.detector.backbone"
            )
        out = self.backbone.forward_image(img_batch).get("sam2_backbone_out")
        if out is None:
            raise RuntimeError(
                "the backbone has no SAM 2 neck (sam2_convs): build the image model with "
                "enable_inst_interactivity=True"
            )
        return self.prepare_backbone_out(out)

    @paddle.no_grad()
    def init_state(  # type: ignore[override]
        self,
        video_height: int | None = None,
        video_width: int | None = None,
        num_frames: int | None = None,
        video_path: str | os.PathLike | Sequence[Any] | None = None,
        cached_features: dict[int, Any] | None = None,
        offload_video_to_cpu: bool = False,
        offload_state_to_cpu: bool = False,
        async_loading_frames: bool = False,
        image_feature_fn: Any = None,
    ) -> dict[str, Any]:
        """A new inference state, upstream's arguments. ``video_path``: a video file (MP4,
        MOV, AVI, MKV, WEBM), a folder of frames (JPEG, PNG, ...; sorted by their number), a
        list of frames (``H x W x 3`` uint8 RGB arrays or PIL images), or an opened
        :class:`VideoFrames`. Without it give the sizes and ``cached_features`` /
        ``image_feature_fn`` as :class:`Sam3TrackerPredictor` takes them.

        Frames are always decoded on demand and kept on the host, so the ``offload_*`` and
        ``async_loading_frames`` switches change nothing (accepted for upstream's API)."""
        del async_loading_frames
        frames = None
        if video_path is not None:
            frames = (
                video_path
                if isinstance(video_path, VideoFrames)
                else open_video(video_path, image_size=self.image_size)
            )
            if frames.image_size != self.image_size:
                raise ValueError(
                    f"the frames are resized to {frames.image_size}, the model takes "
                    f"{self.image_size}"
                )
            video_height, video_width, num_frames = frames.height, frames.width, len(frames)
            if image_feature_fn is None:

                def image_feature_fn(frame_idx: int) -> BackboneOut:
                    image = paddle.to_tensor(frames[frame_idx])[None]
                    return self.forward_image(image)

        if video_height is None or video_width is None or num_frames is None:
            raise ValueError("give video_path, or video_height, video_width and num_frames")
        state = super().init_state(
            video_height,
            video_width,
            num_frames,
            cached_features=cached_features,
            image_feature_fn=image_feature_fn,
            offload_video_to_cpu=offload_video_to_cpu,
            offload_state_to_cpu=offload_state_to_cpu,
        )
        state["images"] = frames
        return state


__all__ = ["Sam3TrackerVideoPredictor"]
