"""SAM 3's dense video inference behind its official request API: prompts on a frame, then
propagation through the video, with instance clicks on tracked objects (upstream:
sam3/model/sam3_video_inference.py, ``Sam3VideoInference`` and
``Sam3VideoInferenceWithInstanceInteractivity``).

One process, as :class:`~paddle_sam.models.sam3.sam3_video_base.Sam3VideoBase`: rank 0 of 1,
upstream's broadcasts and all-gathers gone, its per-GPU bookkeeping kept with one entry.

The model opens no files: ``init_state`` takes the frames already opened, as a sequence
``frames[i] -> 3 x S x S`` array with the original ``height`` and ``width`` as attributes (what
:func:`paddle_sam.predict.video.open_video` returns). The predictor layer
(``paddle_sam.predict.sam3.video_predictor``) opens video files, frame folders and images.

Outputs are upstream's: ``(frame_idx, {"out_obj_ids", "out_probs", "out_boxes_xywh",
"out_binary_masks", "frame_stats"})`` with NumPy arrays (int64 ids, float32 probabilities,
float32 ``N x 4`` boxes normalised by the video's size, bool ``N x H x W`` masks).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import paddle

from ..common import resize_bilinear
from .geometry_encoders import Prompt
from .perflib.masks_ops import masks_to_boxes
from .sam3_image import FindStage
from .sam3_tracker_utils import fill_holes_in_mask_scores
from .sam3_tracking_predictor import check_prompt
from .sam3_video_base import BatchedDatapoint, MaskletConfirmationStatus, Sam3VideoBase

logger = logging.getLogger(__name__)

#: image file extensions upstream treats as a one-frame video (``is_image_type``)
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tiff", ".webp")

_TEXT_PLACEHOLDER = "<text placeholder>"
_HAS_OUTPUTS = "_THIS_FRAME_HAS_OUTPUTS_"


def is_image_type(resource_path: Any) -> bool:
    """Whether a resource is one image (upstream ``is_image_type``): a list of one frame, or
    a path with an image extension."""
    if isinstance(resource_path, list | tuple):
        return len(resource_path) == 1
    return str(resource_path).lower().endswith(IMAGE_EXTS)


class _PackedMask:
    """A bool mask kept 8 pixels to a byte (the cached outputs of every frame and object:
    at video resolution they would otherwise be the state's largest part)."""

    __slots__ = ("bits", "shape")

    def __init__(self, mask: Any) -> None:
        mask = _to_numpy_bool(mask)
        self.shape = mask.shape
        self.bits = np.packbits(mask.reshape(-1))

    def unpack(self) -> np.ndarray:
        count = int(np.prod(self.shape))
        return np.unpackbits(self.bits, count=count).astype(bool).reshape(self.shape)


def _to_numpy_bool(mask: Any) -> np.ndarray:
    if isinstance(mask, _PackedMask):
        return mask.unpack()
    return mask.numpy() if isinstance(mask, paddle.Tensor) else np.asarray(mask)


def _check_int(value: Any, name: str) -> int:
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None


class Sam3VideoInference(Sam3VideoBase):
    """Upstream ``Sam3VideoInference``: text and box prompts on a frame, propagation of the
    detections through the video with hot-start buffering of the outputs."""

    TEXT_ID_FOR_TEXT = 0
    TEXT_ID_FOR_VISUAL = 1

    def __init__(
        self,
        image_size: int = 1008,
        image_mean: Sequence[float] = (0.5, 0.5, 0.5),
        image_std: Sequence[float] = (0.5, 0.5, 0.5),
        compile_model: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.image_size = image_size
        self.image_mean = tuple(image_mean)
        self.image_std = tuple(image_std)
        self.compile_model = compile_model  # accepted for upstream's API; nothing is compiled

    # ------------------------------------------------------------------ state

    def _open_resource(self, resource_path: Any, **kwargs: Any) -> tuple[Any, int, int]:
        """``(frames, orig_height, orig_width)`` of an opened video: ``frames[i]`` a
        ``3 x S x S`` normalised frame, ``height`` / ``width`` its original size. The
        predictor layer overrides this to open paths."""
        del kwargs
        try:
            height, width, n = resource_path.height, resource_path.width, len(resource_path)
        except (AttributeError, TypeError):
            raise TypeError(
                "the model takes opened frames (paddle_sam.predict.video.open_video); open "
                "paths with paddle_sam.build_sam3_video_predictor or build_sam3_video_model"
            ) from None
        if n == 0:
            raise ValueError("the video has no frames")
        if getattr(resource_path, "image_size", self.image_size) != self.image_size:
            raise ValueError(
                f"the frames are resized to {resource_path.image_size}, the model takes "
                f"{self.image_size}"
            )
        return resource_path, int(height), int(width)

    @paddle.no_grad()
    def init_state(
        self,
        resource_path: Any,
        offload_video_to_cpu: bool = False,
        async_loading_frames: bool = False,
        video_loader_type: str = "cv2",
    ) -> dict[str, Any]:
        """A new inference state on a video (upstream ``init_state``). Frames are read when
        first needed and stay on the host, so the offload / async switches change nothing."""
        del offload_video_to_cpu, async_loading_frames
        images, orig_height, orig_width = self._open_resource(
            resource_path, video_loader_type=video_loader_type
        )
        inference_state: dict[str, Any] = {}
        inference_state["image_size"] = self.image_size
        inference_state["num_frames"] = len(images)
        inference_state["orig_height"] = orig_height
        inference_state["orig_width"] = orig_width
        inference_state["constants"] = {}
        self._construct_initial_input_batch(inference_state, images)
        inference_state["tracker_inference_states"] = []
        inference_state["tracker_metadata"] = {}
        inference_state["feature_cache"] = {}
        inference_state["cached_frame_outputs"] = {}
        inference_state["action_history"] = []
        inference_state["is_image_only"] = is_image_type(resource_path)
        return inference_state

    @paddle.no_grad()
    def reset_state(self, inference_state: dict[str, Any]) -> None:
        """Back to the state right after ``init_state`` (upstream ``reset_state``)."""
        inference_state["input_batch"].find_text_batch[0] = _TEXT_PLACEHOLDER
        inference_state["text_prompt"] = None
        for t in range(inference_state["num_frames"]):
            self._set_text_id(inference_state, t, 0)
            inference_state["previous_stages_out"][t] = None
            inference_state["per_frame_raw_point_input"][t] = None
            inference_state["per_frame_raw_box_input"][t] = None
            inference_state["per_frame_visual_prompt"][t] = None
            inference_state["per_frame_geometric_prompt"][t] = None
            inference_state["per_frame_cur_step"][t] = 0
        inference_state["visual_prompt_embed"] = None
        inference_state["visual_prompt_mask"] = None
        inference_state["tracker_inference_states"].clear()
        inference_state["tracker_metadata"].clear()
        inference_state["feature_cache"].clear()
        inference_state["cached_frame_outputs"].clear()
        inference_state["action_history"].clear()

    @staticmethod
    def _set_text_id(inference_state: dict[str, Any], frame_idx: int, text_id: int) -> None:
        inference_state["input_batch"].find_inputs[frame_idx].text_ids = paddle.to_tensor(
            [text_id], dtype="int64"
        )

    def _construct_initial_input_batch(self, inference_state: dict[str, Any], images: Any) -> None:
        """The per-frame inputs and placeholders (upstream ``_construct_initial_input_batch``):
        one find stage per frame, text "<text placeholder>" until a text prompt arrives."""
        num_frames = len(images)
        stages = [
            FindStage(
                img_ids=paddle.to_tensor([stage_id], dtype="int64"),
                text_ids=paddle.to_tensor([0], dtype="int64"),
            )
            for stage_id in range(num_frames)
        ]
        inference_state["input_batch"] = BatchedDatapoint(
            img_batch=images,
            find_text_batch=[_TEXT_PLACEHOLDER, "visual"],
            find_inputs=stages,
            find_targets=[None] * num_frames,
            find_metadatas=[None] * num_frames,
        )
        bs = 1
        inference_state["constants"]["empty_geometric_prompt"] = Prompt(
            box_embeddings=paddle.zeros([0, bs, 4]),
            box_mask=paddle.zeros([bs, 0], "bool"),
            box_labels=paddle.zeros([0, bs], "int64"),
            point_embeddings=paddle.zeros([0, bs, 2]),
            point_mask=paddle.zeros([bs, 0], "bool"),
            point_labels=paddle.zeros([0, bs], "int64"),
        )
        inference_state["previous_stages_out"] = [None] * num_frames
        inference_state["text_prompt"] = None
        inference_state["per_frame_raw_point_input"] = [None] * num_frames
        inference_state["per_frame_raw_box_input"] = [None] * num_frames
        inference_state["per_frame_visual_prompt"] = [None] * num_frames
        inference_state["per_frame_geometric_prompt"] = [None] * num_frames
        inference_state["per_frame_cur_step"] = [0] * num_frames
        inference_state["visual_prompt_embed"] = None
        inference_state["visual_prompt_mask"] = None

    def _get_visual_prompt(
        self,
        inference_state: dict[str, Any],
        frame_idx: int,
        boxes_cxcywh: paddle.Tensor,
        box_labels: paddle.Tensor,
    ):
        """The first box on a frame without results is the visual (exemplar) prompt; later
        boxes refine (upstream ``_get_visual_prompt``). Returns ``(remaining boxes, their
        labels, the new visual prompt or None)``."""
        is_new_visual_prompt = (
            inference_state["per_frame_visual_prompt"][frame_idx] is None
            and inference_state["previous_stages_out"][frame_idx] is None
        )
        if is_new_visual_prompt:
            if boxes_cxcywh.shape[0] != 1:
                raise ValueError(
                    "the first box prompt on a frame is the visual (exemplar) prompt and must "
                    f"be one box, got {boxes_cxcywh.shape[0]}"
                )
            if not bool(box_labels[0]):
                logger.warning("A negative box is added as a visual prompt.")
            new_visual_prompt = Prompt(
                box_embeddings=boxes_cxcywh[0:1].unsqueeze(0),  # (seq, bs, 4)
                box_mask=None,
                box_labels=box_labels[0:1].unsqueeze(0),  # (seq, bs)
                point_embeddings=None,
                point_mask=None,
                point_labels=None,
            )
            inference_state["per_frame_visual_prompt"][frame_idx] = new_visual_prompt
        else:
            new_visual_prompt = None
        if inference_state["per_frame_visual_prompt"][frame_idx] is not None:
            boxes_cxcywh = boxes_cxcywh[1:]
            box_labels = box_labels[1:]
        return boxes_cxcywh, box_labels, new_visual_prompt

    def _get_processing_order(
        self,
        inference_state: dict[str, Any],
        start_frame_idx: int | None,
        max_frame_num_to_track: int | None,
        reverse: bool,
    ) -> tuple[range, int]:
        """Frames to visit and the last one (upstream ``_get_processing_order``): from the
        first prompted frame by default, over the whole video by default."""
        num_frames = inference_state["num_frames"]
        previous_stages_out = inference_state["previous_stages_out"]
        if all(out is None for out in previous_stages_out) and start_frame_idx is None:
            raise ValueError(
                "No prompts are received on any frames. Please add prompt on at least one "
                "frame before propagation."
            )
        if start_frame_idx is None:
            start_frame_idx = min(t for t, out in enumerate(previous_stages_out) if out is not None)
        else:
            start_frame_idx = _check_int(start_frame_idx, "start_frame_idx")
            if not 0 <= start_frame_idx < num_frames:
                raise ValueError(
                    f"start_frame_idx {start_frame_idx} out of range: the video has "
                    f"{num_frames} frames (0-{num_frames - 1})"
                )
        if max_frame_num_to_track is None:
            max_frame_num_to_track = num_frames
        else:
            max_frame_num_to_track = _check_int(max_frame_num_to_track, "max_frame_num_to_track")
            if max_frame_num_to_track < 0:
                raise ValueError(
                    f"max_frame_num_to_track must be >= 0, got {max_frame_num_to_track}"
                )
        if reverse:
            end_frame_idx = max(start_frame_idx - max_frame_num_to_track, 0)
            processing_order = range(start_frame_idx - 1, end_frame_idx - 1, -1)
        else:
            end_frame_idx = min(start_frame_idx + max_frame_num_to_track, num_frames - 1)
            processing_order = range(start_frame_idx, end_frame_idx + 1)
        return processing_order, end_frame_idx

    # ------------------------------------------------------------------ propagation

    @paddle.no_grad()
    def propagate_in_video(
        self,
        inference_state: dict[str, Any],
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(frame_idx, outputs)`` for the frames from ``start_frame_idx`` over
        ``max_frame_num_to_track`` frames (upstream ``propagate_in_video``). With hot-start,
        outputs are held back ``hotstart_delay`` frames so that masklets removed within it
        are never shown."""
        processing_order, end_frame_idx = self._get_processing_order(
            inference_state, start_frame_idx, max_frame_num_to_track, reverse=reverse
        )
        inference_state["feature_cache"]["tracking_bounds"] = {
            "max_frame_num_to_track": max_frame_num_to_track,
            "propagate_in_video_start_frame_idx": start_frame_idx,
        }
        hotstart_buffer: list = []
        hotstart_removed_obj_ids: set = set()
        # an output on frame t is shown only if its masklet is confirmed
        # `unconfirmed_status_delay` frames later
        unconfirmed_status_delay = self.masklet_confirmation_consecutive_det_thresh - 1
        unconfirmed_obj_ids_per_frame: dict[int, list] = {}
        num_frames = inference_state["num_frames"]
        for frame_idx in processing_order:
            out = self._run_single_frame_inference(inference_state, frame_idx, reverse)
            if self.hotstart_delay > 0:
                hotstart_buffer.append([frame_idx, out])
                hotstart_removed_obj_ids.update(out["removed_obj_ids"])
                unconfirmed_obj_ids = out.get("unconfirmed_obj_ids", None)
                if unconfirmed_obj_ids is not None:
                    unconfirmed_obj_ids_per_frame[frame_idx] = unconfirmed_obj_ids
                if frame_idx == end_frame_idx:
                    yield_list = hotstart_buffer
                    hotstart_buffer = []
                elif len(hotstart_buffer) >= self.hotstart_delay:
                    yield_list = hotstart_buffer[:1]
                    hotstart_buffer = hotstart_buffer[1:]
                else:
                    yield_list = []
            else:
                yield_list = [(frame_idx, out)]

            for yield_frame_idx, yield_out in yield_list:
                suppressed_obj_ids = yield_out["suppressed_obj_ids"]
                status_frame_idx = (
                    yield_frame_idx + unconfirmed_status_delay
                    if not reverse
                    else yield_frame_idx - unconfirmed_status_delay
                )
                status_frame_idx = max(0, min(status_frame_idx, num_frames - 1))
                unconfirmed_obj_ids = unconfirmed_obj_ids_per_frame.get(status_frame_idx, None)
                postprocessed_out = self._postprocess_output(
                    inference_state,
                    yield_out,
                    hotstart_removed_obj_ids,
                    suppressed_obj_ids,
                    unconfirmed_obj_ids,
                )
                self._cache_frame_outputs(
                    inference_state,
                    yield_frame_idx,
                    yield_out["obj_id_to_mask"],
                    suppressed_obj_ids=suppressed_obj_ids,
                    removed_obj_ids=hotstart_removed_obj_ids,
                    unconfirmed_obj_ids=unconfirmed_obj_ids,
                )
                yield yield_frame_idx, postprocessed_out

    def _run_single_frame_inference(
        self, inference_state: dict[str, Any], frame_idx: int, reverse: bool
    ) -> dict[str, Any]:
        """Detect and track on one frame, updating the state (upstream
        ``_run_single_frame_inference``)."""
        has_text_prompt = inference_state["text_prompt"] is not None
        geometric_prompt = inference_state["per_frame_geometric_prompt"][frame_idx]
        has_geometric_prompt = geometric_prompt is not None
        (
            obj_id_to_mask,
            obj_id_to_score,
            tracker_states_local_new,
            tracker_metadata_new,
            frame_stats,
            _,
        ) = self._det_track_one_frame(
            frame_idx=frame_idx,
            num_frames=inference_state["num_frames"],
            reverse=reverse,
            input_batch=inference_state["input_batch"],
            geometric_prompt=(
                geometric_prompt
                if has_geometric_prompt
                else inference_state["constants"]["empty_geometric_prompt"]
            ),
            tracker_states_local=inference_state["tracker_inference_states"],
            tracker_metadata_prev=inference_state["tracker_metadata"],
            feature_cache=inference_state["feature_cache"],
            orig_vid_height=inference_state["orig_height"],
            orig_vid_width=inference_state["orig_width"],
            is_image_only=inference_state["is_image_only"],
            allow_new_detections=has_text_prompt or has_geometric_prompt,
        )
        inference_state["tracker_inference_states"] = tracker_states_local_new
        inference_state["tracker_metadata"] = tracker_metadata_new
        inference_state["previous_stages_out"][frame_idx] = _HAS_OUTPUTS
        self._cache_frame_outputs(inference_state, frame_idx, obj_id_to_mask)

        rank0_metadata = tracker_metadata_new["rank0_metadata"]
        out = {
            "obj_id_to_mask": obj_id_to_mask,
            "obj_id_to_score": obj_id_to_score,  # first-frame detection scores
            "obj_id_to_tracker_score": tracker_metadata_new["obj_id_to_tracker_score_frame_wise"][
                frame_idx
            ],
            "removed_obj_ids": rank0_metadata["removed_obj_ids"],
            "suppressed_obj_ids": rank0_metadata["suppressed_obj_ids"][frame_idx],
            "frame_stats": frame_stats,
        }
        if self.masklet_confirmation_enable:
            status = rank0_metadata["masklet_confirmation"]["status"]
            is_unconfirmed = status == MaskletConfirmationStatus.UNCONFIRMED.value
            out["unconfirmed_obj_ids"] = tracker_metadata_new["obj_ids_all_gpu"][
                is_unconfirmed
            ].tolist()
        else:
            out["unconfirmed_obj_ids"] = []
        return out

    def _postprocess_output(
        self,
        inference_state: dict[str, Any],
        out: dict[str, Any],
        removed_obj_ids: Any = None,
        suppressed_obj_ids: Any = None,
        unconfirmed_obj_ids: Any = None,
    ) -> dict[str, Any]:
        """The frame's outputs as upstream's API returns them (``_postprocess_output``):
        objects with an empty mask or hidden (suppressed, removed, unconfirmed) dropped,
        boxes from the masks, then at most one object per pixel (the higher tracker score)."""
        obj_id_to_mask = out["obj_id_to_mask"]
        curr_obj_ids = sorted(obj_id_to_mask.keys())
        H_video, W_video = inference_state["orig_height"], inference_state["orig_width"]
        if len(curr_obj_ids) == 0:
            out_obj_ids = np.zeros(0, dtype=np.int64)
            out_probs = np.zeros(0, dtype=np.float32)
            out_binary_masks = np.zeros((0, H_video, W_video), dtype=bool)
            out_boxes_xywh = np.zeros((0, 4), dtype=np.float32)
            out_tracker_probs = np.zeros(0, dtype=np.float32)
        else:
            out_obj_ids = np.asarray(curr_obj_ids, dtype=np.int64)
            out_probs = np.asarray(
                [out["obj_id_to_score"][obj_id] for obj_id in curr_obj_ids], dtype=np.float32
            )
            out_tracker_probs = np.asarray(
                [out["obj_id_to_tracker_score"].get(obj_id, 0.0) for obj_id in curr_obj_ids],
                dtype=np.float32,
            )
            out_binary_masks = np.concatenate(
                [_to_numpy_bool(obj_id_to_mask[obj_id]) for obj_id in curr_obj_ids], axis=0
            )
            if out_binary_masks.dtype != np.bool_:
                raise TypeError(f"bool masks expected, got {out_binary_masks.dtype}")
            keep = out_binary_masks.any(axis=(1, 2))  # drop masks of zero area
            obj_ids_to_hide: list = []
            for ids in (suppressed_obj_ids, removed_obj_ids, unconfirmed_obj_ids):
                if ids is not None:
                    obj_ids_to_hide.extend(ids)
            if obj_ids_to_hide:
                keep &= ~np.isin(out_obj_ids, np.asarray(obj_ids_to_hide, dtype=np.int64))
            keep_idx = np.nonzero(keep)[0]
            out_obj_ids = out_obj_ids[keep_idx]
            out_probs = out_probs[keep_idx]
            out_tracker_probs = out_tracker_probs[keep_idx]
            out_binary_masks = out_binary_masks[keep_idx]
            boxes_xyxy = masks_to_boxes(
                paddle.to_tensor(out_binary_masks), out_obj_ids.tolist()
            ).numpy()
            out_boxes_xywh = boxes_xyxy.copy()
            out_boxes_xywh[:, 2:] = boxes_xyxy[:, 2:] - boxes_xyxy[:, :2]
            out_boxes_xywh[:, 0] /= W_video
            out_boxes_xywh[:, 1] /= H_video
            out_boxes_xywh[:, 2] /= W_video
            out_boxes_xywh[:, 3] /= H_video

        if out_binary_masks.shape[0] > 1:
            out_binary_masks = self._object_wise_non_overlapping(
                out_binary_masks, out_tracker_probs
            )
        return {
            "out_obj_ids": out_obj_ids,
            "out_probs": out_probs,
            "out_boxes_xywh": out_boxes_xywh,
            "out_binary_masks": out_binary_masks,
            "frame_stats": out.get("frame_stats", None),
        }

    @staticmethod
    def _object_wise_non_overlapping(masks: np.ndarray, obj_scores: np.ndarray) -> np.ndarray:
        """Upstream's ``tracker._apply_object_wise_non_overlapping_constraints(masks, scores,
        background_value=0) > 0`` on bool masks: a pixel stays with the first object of the
        highest score among those covering it (score 0 where not covered; objects of score
        <= 0 keep nothing)."""
        scores = np.where(masks, obj_scores[:, None, None], np.float32(0.0)).astype(np.float32)
        winner = scores.argmax(axis=0)
        keep = winner[None] == np.arange(masks.shape[0])[:, None, None]
        return masks & keep & (scores > 0)

    def _cache_frame_outputs(
        self,
        inference_state: dict[str, Any],
        frame_idx: int,
        obj_id_to_mask: dict,
        suppressed_obj_ids: Any = None,
        removed_obj_ids: Any = None,
        unconfirmed_obj_ids: Any = None,
    ) -> None:
        """Keep the frame's masks for later fetches and refinements, hidden objects left out
        (upstream ``_cache_frame_outputs``), packed 8 pixels to a byte."""
        hidden = set()
        for ids in (suppressed_obj_ids, removed_obj_ids, unconfirmed_obj_ids):
            hidden.update(ids or ())
        inference_state["cached_frame_outputs"][frame_idx] = {
            obj_id: mask if isinstance(mask, _PackedMask) else _PackedMask(mask)
            for obj_id, mask in obj_id_to_mask.items()
            if obj_id not in hidden
        }

    def _build_tracker_output(
        self,
        inference_state: dict[str, Any],
        frame_idx: int,
        refined_obj_id_to_mask: dict | None = None,
    ) -> dict:
        """The cached masks of a frame with refined ones put in (upstream
        ``_build_tracker_output``). A frame without results yet (clicks before any
        propagation, where upstream stops on an assertion) starts from no object."""
        obj_id_to_mask = dict(inference_state.get("cached_frame_outputs", {}).get(frame_idx, {}))
        for obj_id, refined_mask in (refined_obj_id_to_mask or {}).items():
            if refined_mask is None:
                raise ValueError(f"no refined mask for object {obj_id}")
            obj_id_to_mask[obj_id] = refined_mask
        return obj_id_to_mask

    # ------------------------------------------------------------------ prompts

    def _check_frame_idx(self, inference_state: dict[str, Any], frame_idx: Any) -> int:
        frame_idx = _check_int(frame_idx, "frame_idx")
        num_frames = inference_state["num_frames"]
        if not 0 <= frame_idx < num_frames:
            raise ValueError(
                f"frame_idx {frame_idx} out of range: the video has {num_frames} frames "
                f"(0-{num_frames - 1})"
            )
        return frame_idx

    @staticmethod
    def _check_boxes(boxes_xywh: Any, box_labels: Any) -> tuple[np.ndarray, np.ndarray]:
        """Normalised ``N x 4`` xywh boxes and ``N`` labels, as upstream asserts them."""
        if (boxes_xywh is None) != (box_labels is None):
            raise ValueError("give bounding_boxes and bounding_box_labels together")
        try:
            boxes = np.asarray(boxes_xywh, dtype=np.float32)
            labels = np.asarray(box_labels)
        except (TypeError, ValueError):
            raise ValueError("bounding boxes must be numbers [[x, y, w, h], ...]") from None
        if boxes.ndim != 2 or boxes.shape[0] == 0 or boxes.shape[1] != 4:
            raise ValueError(
                f"bounding boxes must be N x 4 [x, y, w, h] with N >= 1, got shape {boxes.shape}"
            )
        if labels.ndim != 1 or labels.shape[0] != boxes.shape[0]:
            raise ValueError(
                f"one label per box expected: {boxes.shape[0]} boxes, labels of shape "
                f"{labels.shape}"
            )
        if not np.issubdtype(labels.dtype, np.integer) and labels.dtype != np.bool_:
            raise ValueError(f"box labels must be integers (1 or 0), got {labels.dtype}")
        if not np.all(np.isfinite(boxes)):
            raise ValueError("bounding boxes must be finite")
        cxcywh = np.concatenate([boxes[:, :2] + 0.5 * boxes[:, 2:], boxes[:, 2:]], axis=1)
        if (boxes < 0).any() or (boxes > 1).any() or (cxcywh < 0).any() or (cxcywh > 1).any():
            raise ValueError(
                "bounding boxes are [x, y, w, h] normalised by the video's width and height: "
                "every value and the box centre must lie in [0, 1]"
            )
        return boxes, labels.astype(np.int64)

    @paddle.no_grad()
    def add_prompt(
        self,
        inference_state: dict[str, Any],
        frame_idx: int,
        text_str: str | None = None,
        boxes_xywh: Any = None,
        box_labels: Any = None,
    ) -> tuple[int, dict[str, Any]]:
        """A text and/or box prompt on a frame (upstream ``add_prompt``): the session starts
        over (a concept prompt replaces every object), the detector runs on ``frame_idx``
        and its outputs there are returned. The text applies to every frame."""
        if text_str is None and boxes_xywh is None:
            raise ValueError("at least one type of prompt (text, boxes) must be provided")
        if text_str is not None and not isinstance(text_str, str):
            raise ValueError(f"text must be a string, got {type(text_str).__name__}")
        frame_idx = self._check_frame_idx(inference_state, frame_idx)
        if boxes_xywh is not None or box_labels is not None:
            boxes_np, labels_np = self._check_boxes(boxes_xywh, box_labels)
        self.reset_state(inference_state)

        # 1) the text prompt
        if text_str is not None and text_str != "visual":
            inference_state["text_prompt"] = text_str
            inference_state["input_batch"].find_text_batch[0] = text_str
            text_id = self.TEXT_ID_FOR_TEXT
        else:
            inference_state["text_prompt"] = None
            inference_state["input_batch"].find_text_batch[0] = _TEXT_PLACEHOLDER
            text_id = self.TEXT_ID_FOR_VISUAL
        for t in range(inference_state["num_frames"]):
            self._set_text_id(inference_state, t, text_id)

        # 2) the boxes: the first is the visual prompt on a frame without results
        if boxes_xywh is not None:
            boxes = paddle.to_tensor(boxes_np)
            boxes_cxcywh = paddle.concat([boxes[:, :2] + 0.5 * boxes[:, 2:], boxes[:, 2:]], axis=1)
            labels = paddle.to_tensor(labels_np)
            inference_state["per_frame_raw_box_input"][frame_idx] = (boxes_cxcywh, labels)
            boxes_cxcywh, labels, geometric_prompt = self._get_visual_prompt(
                inference_state, frame_idx, boxes_cxcywh, labels
            )
            inference_state["per_frame_geometric_prompt"][frame_idx] = geometric_prompt

        out = self._run_single_frame_inference(inference_state, frame_idx, reverse=False)
        return frame_idx, self._postprocess_output(inference_state, out)


class Sam3VideoInferenceWithInstanceInteractivity(Sam3VideoInference):
    """Upstream ``Sam3VideoInferenceWithInstanceInteractivity``: clicks add objects or refine
    tracked ones, and the next propagation reruns only what the clicks changed (the tracker
    for the clicked objects, merged with the cached results) or fetches the cached results."""

    def __init__(
        self,
        use_prev_mem_frame: bool = False,
        use_stateless_refinement: bool = False,
        refinement_detector_cond_frame_removal_window: int = 16,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.use_prev_mem_frame = use_prev_mem_frame
        self.use_stateless_refinement = use_stateless_refinement
        self.refinement_detector_cond_frame_removal_window = (
            refinement_detector_cond_frame_removal_window
        )

    def _init_new_tracker_state(self, inference_state: dict[str, Any]) -> dict[str, Any]:
        return self.tracker.init_state(
            cached_features=inference_state["feature_cache"],
            video_height=inference_state["orig_height"],
            video_width=inference_state["orig_width"],
            num_frames=inference_state["num_frames"],
        )

    @paddle.no_grad()
    def propagate_in_video(
        self,
        inference_state: dict[str, Any],
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """Upstream's propagation with instance interactivity: the full detect-and-track
        propagation the first time, then the tracker alone for the objects clicked since
        (``propagation_partial``), or the cached results (``propagation_fetch``)."""
        propagation_type, obj_ids = self.parse_action_history_for_propagation(inference_state)
        # checked before the action is recorded, so that a bad call leaves the history as is
        processing_order, _ = self._get_processing_order(
            inference_state, start_frame_idx, max_frame_num_to_track, reverse=reverse
        )
        self.add_action_history(
            inference_state,
            action_type=propagation_type,
            obj_ids=obj_ids,
            frame_idx=start_frame_idx,
        )
        if propagation_type == "propagation_full":
            yield from super().propagate_in_video(
                inference_state,
                start_frame_idx=start_frame_idx,
                max_frame_num_to_track=max_frame_num_to_track,
                reverse=reverse,
            )
            return

        tracker_metadata = inference_state["tracker_metadata"]
        if propagation_type == "propagation_fetch":
            for frame_idx in processing_order:
                out = {
                    "obj_id_to_mask": inference_state["cached_frame_outputs"].get(frame_idx, {}),
                    "obj_id_to_score": tracker_metadata["obj_id_to_score"],
                    "obj_id_to_tracker_score": tracker_metadata[
                        "obj_id_to_tracker_score_frame_wise"
                    ][frame_idx],
                }
                suppressed = tracker_metadata["rank0_metadata"]["suppressed_obj_ids"][frame_idx]
                yield (
                    frame_idx,
                    self._postprocess_output(inference_state, out, suppressed_obj_ids=suppressed),
                )
            return

        # propagation_partial: the tracker for the inference states holding the objects
        tracker_states_local = self._get_tracker_inference_states_by_obj_ids(
            inference_state, obj_ids
        )
        for tracker_state in tracker_states_local:
            self.tracker.propagate_in_video_preflight(tracker_state, run_mem_encoder=True)
        for frame_idx in processing_order:
            self._prepare_backbone_feats(inference_state, frame_idx, reverse)
            obj_ids_local, low_res_masks_local, tracker_scores_local = (
                self._propogate_tracker_one_frame_local_gpu(
                    tracker_states_local, frame_idx=frame_idx, reverse=reverse, run_mem_encoder=True
                )
            )
            refined_obj_data = {}  # obj_id -> (score logit, low-res mask)
            for obj_id in obj_ids:
                if obj_id in obj_ids_local:
                    i = obj_ids_local.index(obj_id)
                    refined_obj_data[obj_id] = (tracker_scores_local[i], low_res_masks_local[i])
            # upstream stores the tracker's score logit here (not its sigmoid)
            for obj_id, (refined_score, _) in refined_obj_data.items():
                tracker_metadata["obj_id_to_tracker_score_frame_wise"][frame_idx].update(
                    {obj_id: float(refined_score)}
                )
            refined_obj_id_to_mask = {
                obj_id: self._convert_low_res_mask_to_video_res(mask, inference_state)
                for obj_id, (_, mask) in refined_obj_data.items()
            }
            obj_id_to_mask = self._build_tracker_output(
                inference_state, frame_idx, refined_obj_id_to_mask
            )
            out = {
                "obj_id_to_mask": obj_id_to_mask,
                "obj_id_to_score": tracker_metadata["obj_id_to_score"],
                "obj_id_to_tracker_score": tracker_metadata["obj_id_to_tracker_score_frame_wise"][
                    frame_idx
                ],
            }
            suppressed = tracker_metadata["rank0_metadata"]["suppressed_obj_ids"][frame_idx]
            self._cache_frame_outputs(
                inference_state, frame_idx, obj_id_to_mask, suppressed_obj_ids=suppressed
            )
            yield (
                frame_idx,
                self._postprocess_output(inference_state, out, suppressed_obj_ids=suppressed),
            )

    _INSTANCE_ACTIONS = ("add", "remove", "refine")
    _PROPAGATION_ACTIONS = ("propagation_full", "propagation_partial", "propagation_fetch")

    def add_action_history(
        self,
        inference_state: dict[str, Any],
        action_type: str,
        frame_idx: int | None = None,
        obj_ids: Any = None,
    ) -> None:
        """Record a user action; the next propagation reads the history (upstream
        ``add_action_history``)."""
        if action_type not in self._INSTANCE_ACTIONS + self._PROPAGATION_ACTIONS:
            raise ValueError(
                f"Invalid action type: {action_type}, must be one of "
                f"{list(self._INSTANCE_ACTIONS + self._PROPAGATION_ACTIONS)}"
            )
        inference_state["action_history"].append(
            {"type": action_type, "frame_idx": frame_idx, "obj_ids": obj_ids}
        )

    def _has_object_been_refined(self, inference_state: dict[str, Any], obj_id: int) -> bool:
        return any(
            action["type"] in ("add", "refine")
            and action.get("obj_ids")
            and obj_id in action["obj_ids"]
            for action in inference_state["action_history"]
        )

    def parse_action_history_for_propagation(
        self, inference_state: dict[str, Any]
    ) -> tuple[str, list | None]:
        """Which propagation the actions since the last one call for (upstream
        ``parse_action_history_for_propagation``): ``propagation_full`` the first time,
        ``propagation_partial`` with the objects added or refined since, or
        ``propagation_fetch`` (after both directions, or one from the first or last frame)."""
        action_history = inference_state["action_history"]
        if len(action_history) == 0:
            return "propagation_full", None
        last = action_history[-1]
        if "propagation" in last["type"]:
            if last["type"] == "propagation_fetch":
                return "propagation_fetch", None
            if (
                len(action_history) > 1
                and action_history[-2]["type"] in ("propagation_partial", "propagation_full")
            ) or last["frame_idx"] in (0, inference_state["num_frames"] - 1):
                return "propagation_fetch", None
            return last["type"], last["obj_ids"]
        obj_ids: list = []
        for action in action_history[::-1]:
            if "propagation" in action["type"]:
                break
            if action["type"] in ("add", "refine"):
                obj_ids.extend(action["obj_ids"])
        obj_ids_or_none = list(set(obj_ids)) if obj_ids else None
        propagation_type = "propagation_partial" if obj_ids_or_none else "propagation_fetch"
        return propagation_type, obj_ids_or_none

    def remove_object(
        self, inference_state: dict[str, Any], obj_id: int, is_user_action: bool = False
    ) -> None:
        """Remove an object from the tracker, the metadata and the cached results (upstream
        ``remove_object``)."""
        obj_id = _check_int(obj_id, "obj_id")
        if self._get_gpu_id_by_obj_id(inference_state, obj_id) is None:
            known = inference_state["tracker_metadata"].get("obj_ids_all_gpu", [])
            raise ValueError(f"object {obj_id} is not tracked (objects: {list(map(int, known))})")
        self._tracker_remove_object(inference_state["tracker_inference_states"], obj_id)
        if is_user_action:
            self.add_action_history(inference_state, action_type="remove", obj_ids=[obj_id])
        tracker_metadata = inference_state["tracker_metadata"]
        ids = tracker_metadata["obj_ids_per_gpu"][0]
        tracker_metadata["obj_ids_per_gpu"][0] = ids[ids != obj_id]
        tracker_metadata["num_obj_per_gpu"][0] = len(tracker_metadata["obj_ids_per_gpu"][0])
        tracker_metadata["obj_ids_all_gpu"] = np.concatenate(tracker_metadata["obj_ids_per_gpu"])
        tracker_metadata["obj_id_to_score"].pop(obj_id, None)
        # max_obj_id stays: ids are never reused
        for frame_cache in inference_state.get("cached_frame_outputs", {}).values():
            frame_cache.pop(obj_id, None)

    def _get_gpu_id_by_obj_id(self, inference_state: dict[str, Any], obj_id: int) -> int | None:
        for rank, obj_ids in enumerate(
            inference_state["tracker_metadata"].get("obj_ids_per_gpu", [])
        ):
            if obj_id in obj_ids:
                return rank
        return None

    def _get_tracker_inference_states_by_obj_ids(
        self, inference_state: dict[str, Any], obj_ids: Any
    ) -> list[dict[str, Any]]:
        return [
            state
            for state in inference_state["tracker_inference_states"]
            if set(obj_ids) & set(state["obj_ids"])
        ]

    def _prepare_backbone_feats(
        self, inference_state: dict[str, Any], frame_idx: int, reverse: bool
    ) -> None:
        """The frame's features into the feature cache (the detector runs too, as
        upstream's ``_prepare_backbone_feats``; its detections are not used)."""
        geometric_prompt = inference_state["per_frame_geometric_prompt"][frame_idx]
        self.run_backbone_and_detection(
            frame_idx=frame_idx,
            num_frames=inference_state["num_frames"],
            input_batch=inference_state["input_batch"],
            geometric_prompt=(
                geometric_prompt
                if geometric_prompt is not None
                else inference_state["constants"]["empty_geometric_prompt"]
            ),
            feature_cache=inference_state["feature_cache"],
            reverse=reverse,
            allow_new_detections=True,
        )

    @paddle.no_grad()
    def add_prompt(  # type: ignore[override]
        self,
        inference_state: dict[str, Any],
        frame_idx: int,
        text_str: str | None = None,
        boxes_xywh: Any = None,
        box_labels: Any = None,
        points: Any = None,
        point_labels: Any = None,
        obj_id: int | None = None,
        rel_coordinates: bool = True,
    ) -> tuple[int, dict[str, Any]]:
        """Clicks for an object (``points``, ``point_labels``, ``obj_id``: a new id adds an
        object, a tracked one is refined) or a concept prompt (text and/or boxes, see
        :meth:`Sam3VideoInference.add_prompt`), as upstream's ``add_prompt``."""
        if points is not None:
            if text_str is not None or boxes_xywh is not None:
                raise ValueError("When points are provided, text_str and boxes_xywh must be None.")
            if obj_id is None:
                raise ValueError("When points are provided, obj_id must be provided.")
            return self.add_tracker_new_points(
                inference_state,
                frame_idx,
                obj_id=obj_id,
                points=points,
                labels=point_labels,
                rel_coordinates=rel_coordinates,
                use_prev_mem_frame=self.use_prev_mem_frame,
            )
        if point_labels is not None:
            raise ValueError("point_labels given without points")
        return super().add_prompt(
            inference_state,
            frame_idx,
            text_str=text_str,
            boxes_xywh=boxes_xywh,
            box_labels=box_labels,
        )

    @paddle.no_grad()
    def add_tracker_new_points(
        self,
        inference_state: dict[str, Any],
        frame_idx: int,
        obj_id: int,
        points: Any,
        labels: Any,
        rel_coordinates: bool = True,
        use_prev_mem_frame: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        """Clicks on a frame for object ``obj_id`` (upstream ``add_tracker_new_points``):
        a new id starts a new tracker state, a tracked id is refined (its conditioning frames
        from detections near ``frame_idx`` cleared). Returns the frame's outputs with every
        object, the clicked one with its new mask."""
        frame_idx = self._check_frame_idx(inference_state, frame_idx)
        obj_id = _check_int(obj_id, "obj_id")
        if labels is None:
            raise ValueError("point_labels must be given with points")
        tracker_metadata = inference_state["tracker_metadata"]
        if tracker_metadata == {}:
            tracker_metadata.update(self._initialize_metadata())
        obj_rank = self._get_gpu_id_by_obj_id(inference_state, obj_id)
        check_prompt(points, labels, None)  # before anything changes

        self._prepare_backbone_feats(inference_state, frame_idx, reverse=False)
        if (
            obj_rank is not None
            and self.use_stateless_refinement
            and not self._has_object_been_refined(inference_state, obj_id)
        ):
            logger.debug(f"Removing object {obj_id} before refinement.")
            self.remove_object(inference_state, obj_id, is_user_action=False)
            obj_rank = None

        if obj_rank is None:
            num_prev_obj = int(np.sum(tracker_metadata["num_obj_per_gpu"]))
            if num_prev_obj >= self.max_num_objects:
                # upstream logs a warning and returns a tuple its predictor cannot unpack
                raise ValueError(
                    f"cannot add object {obj_id}: already tracking {num_prev_obj} objects "
                    f"(max_num_objects={self.max_num_objects})"
                )
            tracker_state = self._init_new_tracker_state(inference_state)
            inference_state["tracker_inference_states"].append(tracker_state)
            tracker_metadata["obj_ids_per_gpu"][0] = np.concatenate(
                [tracker_metadata["obj_ids_per_gpu"][0], np.array([obj_id], dtype=np.int64)]
            )
            tracker_metadata["num_obj_per_gpu"][0] = len(tracker_metadata["obj_ids_per_gpu"][0])
            tracker_metadata["obj_ids_all_gpu"] = np.concatenate(
                tracker_metadata["obj_ids_per_gpu"]
            )
            tracker_metadata["max_obj_id"] = max(tracker_metadata["max_obj_id"], obj_id)
            logger.debug(f"Adding new object with id {obj_id} at frame {frame_idx}.")
            self.add_action_history(inference_state, "add", frame_idx=frame_idx, obj_ids=[obj_id])
        else:
            tracker_states = self._get_tracker_inference_states_by_obj_ids(
                inference_state, [obj_id]
            )
            if len(tracker_states) != 1:
                raise RuntimeError(f"{len(tracker_states)} tracker states hold object {obj_id}")
            tracker_state = tracker_states[0]
            logger.debug(f"Refining existing object with id {obj_id} at frame {frame_idx}.")
            self.add_action_history(
                inference_state, "refine", frame_idx=frame_idx, obj_ids=[obj_id]
            )

        # the added / refined object gets the highest score
        tracker_metadata["obj_id_to_score"][obj_id] = 1.0
        tracker_metadata["obj_id_to_tracker_score_frame_wise"][frame_idx][obj_id] = 1.0
        rank0_metadata = tracker_metadata.get("rank0_metadata", {})
        if "removed_obj_ids" in rank0_metadata:
            rank0_metadata["removed_obj_ids"].discard(obj_id)
        if "suppressed_obj_ids" in rank0_metadata:
            for suppressed in rank0_metadata["suppressed_obj_ids"].values():
                suppressed.discard(obj_id)
        if "masklet_confirmation" in rank0_metadata:
            obj_indices = np.where(tracker_metadata["obj_ids_all_gpu"] == obj_id)[0]
            confirmation = rank0_metadata["masklet_confirmation"]
            if len(obj_indices) > 0 and obj_indices[0] < len(confirmation["status"]):
                confirmation["status"][obj_indices[0]] = 1
                confirmation["consecutive_det_num"][obj_indices[0]] = (
                    self.masklet_confirmation_consecutive_det_thresh
                )

        # a clicked frame counts as prompted (upstream: only frames the detector ran on), so
        # that propagation after clicks alone starts there by default
        if inference_state["previous_stages_out"][frame_idx] is None:
            inference_state["previous_stages_out"][frame_idx] = _HAS_OUTPUTS
        frame_idx, obj_ids, _, video_res_masks = self.tracker.add_new_points(
            inference_state=tracker_state,
            frame_idx=frame_idx,
            obj_id=obj_id,
            points=points,
            labels=labels,
            clear_old_points=True,
            rel_coordinates=rel_coordinates,
            use_prev_mem_frame=use_prev_mem_frame,
        )
        if video_res_masks is not None and len(video_res_masks) > 0:
            video_res_masks = fill_holes_in_mask_scores(
                video_res_masks,
                max_area=self.fill_hole_area,
                fill_holes=True,
                remove_sprinkles=True,
            )
        self.tracker.propagate_in_video_preflight(tracker_state, run_mem_encoder=True)
        # detector-added conditioning frames near the click no longer hold the mask
        self.clear_detector_added_cond_frame_in_tracker(tracker_state, obj_id, frame_idx)

        new_mask_data = None
        if len(obj_ids) > 0:
            new_mask_data = video_res_masks[obj_ids.index(obj_id)] > 0.0
        obj_id_to_mask = self._build_tracker_output(
            inference_state,
            frame_idx,
            {obj_id: new_mask_data} if new_mask_data is not None else None,
        )
        suppressed = tracker_metadata["rank0_metadata"]["suppressed_obj_ids"][frame_idx]
        out = {
            "obj_id_to_mask": obj_id_to_mask,
            "obj_id_to_score": tracker_metadata["obj_id_to_score"],
            "obj_id_to_tracker_score": tracker_metadata["obj_id_to_tracker_score_frame_wise"][
                frame_idx
            ],
        }
        self._cache_frame_outputs(
            inference_state, frame_idx, obj_id_to_mask, suppressed_obj_ids=suppressed
        )
        return frame_idx, self._postprocess_output(
            inference_state, out, suppressed_obj_ids=suppressed
        )

    def _convert_low_res_mask_to_video_res(
        self, low_res_mask: paddle.Tensor | None, inference_state: dict[str, Any]
    ) -> paddle.Tensor | None:
        """``H x W`` low-res logits -> ``1 x H_video x W_video`` bool (upstream
        ``_convert_low_res_mask_to_video_res``)."""
        if low_res_mask is None:
            return None
        size = (inference_state["orig_height"], inference_state["orig_width"])
        video_res = resize_bilinear(low_res_mask.astype("float32")[None, None], size)
        return video_res.squeeze(0) > 0.0

    def clear_detector_added_cond_frame_in_tracker(
        self, tracker_state: dict[str, Any], obj_id: int, refined_frame_idx: int
    ) -> None:
        """Clear the mask-only (detector-added) conditioning frames within
        ``refinement_detector_cond_frame_removal_window`` of a refined frame, so the model
        may update the masks there (upstream ``clear_detector_added_cond_frame_in_tracker``)."""
        obj_idx = self.tracker._obj_id_to_idx(tracker_state, obj_id)
        window = self.refinement_detector_cond_frame_removal_window
        mask_only_cond_frame_indices = [
            frame_idx
            for frame_idx in tracker_state["mask_inputs_per_obj"][obj_idx]
            if frame_idx not in tracker_state["point_inputs_per_obj"][obj_idx]
            and abs(frame_idx - refined_frame_idx) <= window
        ]
        for frame_idx in mask_only_cond_frame_indices:
            # every object of the state: they are batched together
            for obj_id2 in list(tracker_state["obj_id_to_idx"].keys()):
                self.tracker.clear_all_points_in_frame(
                    tracker_state, frame_idx, obj_id2, need_output=False
                )


__all__ = [
    "IMAGE_EXTS",
    "Sam3VideoInference",
    "Sam3VideoInferenceWithInstanceInteractivity",
    "is_image_type",
]
