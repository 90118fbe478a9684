"""The inference state of SAM 2's video predictor (upstream: sam2/sam2_video_predictor.py,
``SAM2VideoPredictor`` of sam2 1.1.0) without its frame loading, which
:mod:`paddle_sam.predict.sam2.video_predictor` adds.

Since sam2 1.1.0 every object is tracked on its own: each has its own memory bank, prompts on
one object never re-encode another's memory, and objects may be added after tracking started.
SAM 3's tracker state (:class:`~..sam3.sam3_tracking_predictor.Sam3TrackerPredictor`) is the
older batched one (upstream's ``sam2_video_predictor_legacy``); what the two share (frame
features, one tracking step with its bfloat16 memory, the memory re-encoding, the cached memory
position encoding, prompt checks) is inherited from it, the per-object bookkeeping is here.

A state is made over the frames' backbone outputs, given as ``cached_features`` and/or an
``image_feature_fn(frame_idx) -> backbone_out`` (the image encoder run on demand), as SAM 3's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import paddle

from ..common import resize_bilinear
from ..sam3.memory import resize_antialias
from ..sam3.sam3_tracker_base import NO_OBJ_SCORE, concat_points
from ..sam3.sam3_tracker_utils import fill_holes_in_mask_scores
from ..sam3.sam3_tracking_predictor import Sam3TrackerPredictor, _as_array, check_prompt
from .sam2_base import SAM2Base

BackboneOut = dict[str, Any]


def _empty_outputs() -> dict[str, dict]:
    return {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}


class SAM2VideoPredictorBase(SAM2Base, Sam3TrackerPredictor):
    """:class:`SAM2Base` with upstream SAM 2's interactive, per-object video state.

    ``fill_hole_area``: fill background holes of at most this many low-res pixels in each
    prediction (upstream's CUDA post-processing; 0 disables); ``non_overlap_masks``: keep only
    the highest-scoring object at each pixel of the outputs; ``clear_non_cond_mem_around_input``
    and ``add_all_frames_to_correct_as_cond``: as upstream. Other arguments: :class:`SAM2Base`.
    """

    def __init__(
        self,
        fill_hole_area: int = 0,
        non_overlap_masks: bool = False,
        clear_non_cond_mem_around_input: bool = False,
        add_all_frames_to_correct_as_cond: bool = False,
        **kwargs: Any,
    ) -> None:
        SAM2Base.__init__(self, **kwargs)
        self.fill_hole_area = fill_hole_area
        self.non_overlap_masks = non_overlap_masks
        self.clear_non_cond_mem_around_input = clear_non_cond_mem_around_input
        self.add_all_frames_to_correct_as_cond = add_all_frames_to_correct_as_cond

    # ------------------------------------------------------------------ state

    @paddle.no_grad()
    def init_state(  # type: ignore[override]
        self,
        video_height: int,
        video_width: int,
        num_frames: int,
        cached_features: dict[int, Any] | None = None,
        image_feature_fn: Callable[[int], BackboneOut] | None = None,
        offload_video_to_cpu: bool = False,
        offload_state_to_cpu: bool = False,
    ) -> dict[str, Any]:
        """A new inference state over ``num_frames`` frames of ``video_height x
        video_width`` (the size of the output masks); frame 0's features are computed (or
        read) at once, as upstream warms the backbone up."""
        device = str(paddle.get_device())
        state: dict[str, Any] = {
            "num_frames": num_frames,
            "offload_video_to_cpu": offload_video_to_cpu,
            "offload_state_to_cpu": offload_state_to_cpu,
            "video_height": video_height,
            "video_width": video_width,
            "device": device,
            "storage_device": "cpu" if offload_state_to_cpu else device,
            "point_inputs_per_obj": {},
            "mask_inputs_per_obj": {},
            "cached_features": {} if cached_features is None else cached_features,
            "image_feature_fn": image_feature_fn,
            "constants": {},
            "obj_id_to_idx": OrderedDict(),
            "obj_idx_to_id": OrderedDict(),
            "obj_ids": [],
            "output_dict_per_obj": {},
            "temp_output_dict_per_obj": {},
            "frames_tracked_per_obj": {},
        }
        self._get_image_feature(state, frame_idx=0, batch_size=1)
        return state

    def _obj_id_to_idx(self, inference_state: dict, obj_id: Any) -> int:
        """The model-side index of a client object id; a new id gets the next index (objects
        may be added at any time)."""
        obj_idx = inference_state["obj_id_to_idx"].get(obj_id)
        if obj_idx is not None:
            return obj_idx
        obj_idx = len(inference_state["obj_id_to_idx"])
        inference_state["obj_id_to_idx"][obj_id] = obj_idx
        inference_state["obj_idx_to_id"][obj_idx] = obj_id
        inference_state["obj_ids"] = list(inference_state["obj_id_to_idx"])
        inference_state["point_inputs_per_obj"][obj_idx] = {}
        inference_state["mask_inputs_per_obj"][obj_idx] = {}
        inference_state["output_dict_per_obj"][obj_idx] = _empty_outputs()
        inference_state["temp_output_dict_per_obj"][obj_idx] = _empty_outputs()
        inference_state["frames_tracked_per_obj"][obj_idx] = {}
        return obj_idx

    def _prompt_frame(self, inference_state: dict, obj_idx: int, frame_idx: int):
        """``(is_init_cond_frame, reverse, is_cond, storage_key)`` of a prompt for one object:
        a frame it was not tracked on starts it like SAM on an image; on a tracked frame the
        prompt corrects it, in the direction it was tracked."""
        tracked = inference_state["frames_tracked_per_obj"][obj_idx]
        is_init_cond_frame = frame_idx not in tracked
        reverse = False if is_init_cond_frame else tracked[frame_idx]["reverse"]
        is_cond = is_init_cond_frame or self.add_all_frames_to_correct_as_cond
        key = "cond_frame_outputs" if is_cond else "non_cond_frame_outputs"
        return is_init_cond_frame, reverse, is_cond, key

    # ------------------------------------------------------------------ prompts

    @paddle.no_grad()
    def add_new_points_or_box(  # type: ignore[override]
        self,
        inference_state: dict,
        frame_idx: int,
        obj_id: Any,
        points: Any = None,
        labels: Any = None,
        clear_old_points: bool = True,
        normalize_coords: bool = True,
        box: Any = None,
    ) -> tuple[int, list, paddle.Tensor]:
        """Clicks (``N x 2``, labels 1 / 0) and/or a box (``x0 y0 x1 y1``, before the clicks)
        for an object on a frame, in the video's pixels (``normalize_coords``, upstream's
        default) or the model's -> ``(frame_idx, obj_ids, video_res_masks)``: every object's
        mask logits on that frame, ``O x 1 x H x W``."""
        frame_idx = self._check_frame_idx(inference_state, frame_idx)
        points, labels, box = check_prompt(points, labels, box)
        if box is not None and not clear_old_points:
            raise ValueError(
                "cannot add box without clearing old points, since box prompt must be "
                "provided before any point prompt (please use clear_old_points=True instead)"
            )
        obj_idx = self._obj_id_to_idx(inference_state, obj_id)
        point_inputs_per_frame = inference_state["point_inputs_per_obj"][obj_idx]
        mask_inputs_per_frame = inference_state["mask_inputs_per_obj"][obj_idx]
        if box is not None:
            points = paddle.concat([box, points], axis=1)
            labels = paddle.concat([paddle.to_tensor([[2, 3]], "int32"), labels], axis=1)
        if normalize_coords:
            size = [inference_state["video_width"], inference_state["video_height"]]
            points = points / paddle.to_tensor(size, "float32")
        points = points * self.image_size
        old = None if clear_old_points else point_inputs_per_frame.get(frame_idx)
        point_inputs = concat_points(old, points, labels)
        point_inputs_per_frame[frame_idx] = point_inputs
        mask_inputs_per_frame.pop(frame_idx, None)
        is_init_cond_frame, reverse, is_cond, key = self._prompt_frame(
            inference_state, obj_idx, frame_idx
        )
        obj_output_dict = inference_state["output_dict_per_obj"][obj_idx]
        obj_temp_output_dict = inference_state["temp_output_dict_per_obj"][obj_idx]
        prev_out = obj_temp_output_dict[key].get(frame_idx)
        if prev_out is None:
            prev_out = obj_output_dict["cond_frame_outputs"].get(frame_idx)
            if prev_out is None:
                prev_out = obj_output_dict["non_cond_frame_outputs"].get(frame_idx)
        prev_sam_mask_logits = None
        if prev_out is not None and prev_out["pred_masks"] is not None:
            prev_sam_mask_logits = prev_out["pred_masks"].clip(-32.0, 32.0)
        current_out, _ = self._run_single_frame_inference(
            inference_state=inference_state,
            output_dict=obj_output_dict,
            frame_idx=frame_idx,
            batch_size=1,
            is_init_cond_frame=is_init_cond_frame,
            point_inputs=point_inputs,
            mask_inputs=None,
            reverse=reverse,
            run_mem_encoder=False,
            prev_sam_mask_logits=prev_sam_mask_logits,
        )
        obj_temp_output_dict[key][frame_idx] = current_out
        return (
            frame_idx,
            inference_state["obj_ids"],
            self._frame_masks(inference_state, frame_idx, is_cond),
        )

    def add_new_points(self, *args: Any, **kwargs: Any):
        """Deprecated upstream: :meth:`add_new_points_or_box`."""
        return self.add_new_points_or_box(*args, **kwargs)

    @paddle.no_grad()
    def add_new_mask(  # type: ignore[override]
        self, inference_state: dict, frame_idx: int, obj_id: Any, mask: Any
    ) -> tuple[int, list, paddle.Tensor]:
        """A mask prompt (``H x W``, bool or 0..1, any size) for an object on a frame ->
        ``(frame_idx, obj_ids, video_res_masks)``. As upstream, a mask of another size is
        resized (antialiased bilinear) to the model's input and binarised at 0.5, and the
        object's output on the frame is the mask itself (logits +-10)."""
        frame_idx = self._check_frame_idx(inference_state, frame_idx)
        mask = _as_array(mask, "mask")
        if mask.ndim != 2:
            raise ValueError(f"mask must be H x W, got shape {list(mask.shape)}")
        obj_idx = self._obj_id_to_idx(inference_state, obj_id)
        mask_inputs = paddle.to_tensor(mask.astype(bool).astype(np.float32))[None, None]
        size = (self.image_size, self.image_size)
        if tuple(mask.shape) != size:
            mask_inputs = (resize_antialias(mask_inputs, size) >= 0.5).astype("float32")
        inference_state["mask_inputs_per_obj"][obj_idx][frame_idx] = mask_inputs
        inference_state["point_inputs_per_obj"][obj_idx].pop(frame_idx, None)
        is_init_cond_frame, reverse, is_cond, key = self._prompt_frame(
            inference_state, obj_idx, frame_idx
        )
        current_out, _ = self._run_single_frame_inference(
            inference_state=inference_state,
            output_dict=inference_state["output_dict_per_obj"][obj_idx],
            frame_idx=frame_idx,
            batch_size=1,
            is_init_cond_frame=is_init_cond_frame,
            point_inputs=None,
            mask_inputs=mask_inputs,
            reverse=reverse,
            run_mem_encoder=False,
        )
        inference_state["temp_output_dict_per_obj"][obj_idx][key][frame_idx] = current_out
        return (
            frame_idx,
            inference_state["obj_ids"],
            self._frame_masks(inference_state, frame_idx, is_cond),
        )

    def _frame_masks(self, inference_state: dict, frame_idx: int, is_cond: bool) -> paddle.Tensor:
        """Every object's mask logits on a frame at the video's resolution."""
        out = self._consolidate_temp_output_across_obj(
            inference_state, frame_idx, is_cond=is_cond, consolidate_at_video_res=True
        )
        return self._get_orig_video_res_output(inference_state, out["pred_masks_video_res"])[1]

    # ------------------------------------------------------------------ outputs

    def _get_orig_video_res_output(self, inference_state: dict, any_res_masks: paddle.Tensor):
        """The masks at the video's resolution (bilinear), objects kept apart if asked."""
        size = (inference_state["video_height"], inference_state["video_width"])
        video_res_masks = any_res_masks
        if tuple(any_res_masks.shape[-2:]) != size:
            video_res_masks = resize_bilinear(any_res_masks, size)
        if self.non_overlap_masks:
            video_res_masks = self._apply_non_overlapping_constraints(video_res_masks)
        return any_res_masks, video_res_masks

    def _consolidate_temp_output_across_obj(  # type: ignore[override]
        self,
        inference_state: dict,
        frame_idx: int,
        is_cond: bool,
        consolidate_at_video_res: bool = False,
    ) -> dict[str, Any]:
        """All objects' masks on a frame in one batch: each object's temporary output, else
        its stored one, else the no-object score."""
        n = self._get_obj_num(inference_state)
        key = "cond_frame_outputs" if is_cond else "non_cond_frame_outputs"
        if consolidate_at_video_res:
            h, w = inference_state["video_height"], inference_state["video_width"]
            mask_key = "pred_masks_video_res"
        else:
            h = w = self.image_size // 4
            mask_key = "pred_masks"
        masks = [paddle.full([1, 1, h, w], NO_OBJ_SCORE, "float32") for _ in range(n)]
        for obj_idx in range(n):
            out = inference_state["temp_output_dict_per_obj"][obj_idx][key].get(frame_idx)
            obj_output_dict = inference_state["output_dict_per_obj"][obj_idx]
            if out is None:
                out = obj_output_dict["cond_frame_outputs"].get(frame_idx)
            if out is None:
                out = obj_output_dict["non_cond_frame_outputs"].get(frame_idx)
            if out is None:
                continue
            obj_mask = out["pred_masks"]
            if tuple(obj_mask.shape[-2:]) != (h, w):
                obj_mask = resize_bilinear(obj_mask, (h, w))
            masks[obj_idx] = obj_mask
        return {mask_key: paddle.concat(masks, axis=0)}

    # ------------------------------------------------------------------ propagation

    @paddle.no_grad()
    def propagate_in_video_preflight(self, inference_state: dict) -> None:  # type: ignore[override]
        """Move each object's prompted frames into its memory bank, their memory encoded
        (binarised masks when ``binarize_mask_from_pts_for_mem_enc``)."""
        n = self._get_obj_num(inference_state)
        if n == 0:
            raise RuntimeError(
                "No input points or masks are provided for any object; please add inputs first."
            )
        for obj_idx in range(n):
            obj_output_dict = inference_state["output_dict_per_obj"][obj_idx]
            obj_temp_output_dict = inference_state["temp_output_dict_per_obj"][obj_idx]
            for is_cond in (False, True):
                key = "cond_frame_outputs" if is_cond else "non_cond_frame_outputs"
                for frame_idx, out in obj_temp_output_dict[key].items():
                    if out["maskmem_features"] is None:
                        high_res_masks = resize_bilinear(
                            out["pred_masks"], (self.image_size, self.image_size)
                        )
                        feats, pos = self._run_memory_encoder(
                            inference_state,
                            frame_idx,
                            1,
                            high_res_masks,
                            out["object_score_logits"],
                            is_mask_from_pts=True,
                        )
                        out["maskmem_features"], out["maskmem_pos_enc"] = feats, pos
                    obj_output_dict[key][frame_idx] = out
                    if self.clear_non_cond_mem_around_input:
                        self._clear_obj_non_cond_mem_around_input(
                            inference_state, frame_idx, obj_idx
                        )
                obj_temp_output_dict[key].clear()
            if not obj_output_dict["cond_frame_outputs"]:
                obj_id = self._obj_idx_to_id(inference_state, obj_idx)
                raise RuntimeError(
                    f"No input points or masks are provided for object id {obj_id}; please "
                    "add inputs first."
                )
            for frame_idx in obj_output_dict["cond_frame_outputs"]:
                obj_output_dict["non_cond_frame_outputs"].pop(frame_idx, None)

    @paddle.no_grad()
    def propagate_in_video(  # type: ignore[override]
        self,
        inference_state: dict,
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[int, list, paddle.Tensor]]:
        """Track every object frame by frame (each from its own memory); yields upstream's
        ``(frame_idx, obj_ids, video_res_masks)``, masks ``O x 1 x H x W`` logits."""
        self.propagate_in_video_preflight(inference_state)
        if start_frame_idx is not None:
            start_frame_idx = self._check_frame_idx(inference_state, start_frame_idx, "start frame")
        if max_frame_num_to_track is not None and (
            isinstance(max_frame_num_to_track, bool)
            or not isinstance(max_frame_num_to_track, int | np.integer)
            or max_frame_num_to_track < 0
        ):
            raise ValueError(
                "max_frame_num_to_track must be a non-negative integer, got "
                f"{max_frame_num_to_track!r}"
            )
        obj_ids = inference_state["obj_ids"]
        num_frames = inference_state["num_frames"]
        n = self._get_obj_num(inference_state)
        if start_frame_idx is None:
            start_frame_idx = min(
                t
                for obj_output_dict in inference_state["output_dict_per_obj"].values()
                for t in obj_output_dict["cond_frame_outputs"]
            )
        if max_frame_num_to_track is None:
            max_frame_num_to_track = num_frames
        if reverse:
            end = max(start_frame_idx - max_frame_num_to_track, 0)
            order = range(start_frame_idx, end - 1, -1) if start_frame_idx > 0 else []
        else:
            end = min(start_frame_idx + max_frame_num_to_track, num_frames - 1)
            order = range(start_frame_idx, end + 1)
        for frame_idx in order:
            pred_masks_per_obj = []
            for obj_idx in range(n):
                obj_output_dict = inference_state["output_dict_per_obj"][obj_idx]
                if frame_idx in obj_output_dict["cond_frame_outputs"]:
                    pred_masks = obj_output_dict["cond_frame_outputs"][frame_idx]["pred_masks"]
                    if self.clear_non_cond_mem_around_input:
                        self._clear_obj_non_cond_mem_around_input(
                            inference_state, frame_idx, obj_idx
                        )
                else:
                    current_out, pred_masks = self._run_single_frame_inference(
                        inference_state=inference_state,
                        output_dict=obj_output_dict,
                        frame_idx=frame_idx,
                        batch_size=1,
                        is_init_cond_frame=False,
                        point_inputs=None,
                        mask_inputs=None,
                        reverse=reverse,
                        run_mem_encoder=True,
                    )
                    obj_output_dict["non_cond_frame_outputs"][frame_idx] = current_out
                inference_state["frames_tracked_per_obj"][obj_idx][frame_idx] = {"reverse": reverse}
                pred_masks_per_obj.append(pred_masks)
            all_masks = (
                paddle.concat(pred_masks_per_obj, axis=0) if n > 1 else pred_masks_per_obj[0]
            )
            _, video_res_masks = self._get_orig_video_res_output(inference_state, all_masks)
            yield frame_idx, obj_ids, video_res_masks

    # ------------------------------------------------------------------ one frame

    def _run_single_frame_inference(  # type: ignore[override]
        self,
        inference_state: dict,
        output_dict: dict,
        frame_idx: int,
        batch_size: int,
        is_init_cond_frame: bool,
        point_inputs: dict | None,
        mask_inputs: paddle.Tensor | None,
        reverse: bool,
        run_mem_encoder: bool,
        prev_sam_mask_logits: paddle.Tensor | None = None,
    ) -> tuple[dict[str, Any], paddle.Tensor]:
        """track_step on a frame -> (compact output with bfloat16 memory features, masks),
        holes filled (``fill_hole_area``) in both."""
        compact_out, _ = Sam3TrackerPredictor._run_single_frame_inference(
            self,
            inference_state,
            output_dict,
            frame_idx,
            batch_size,
            is_init_cond_frame,
            point_inputs,
            mask_inputs,
            reverse,
            run_mem_encoder,
            prev_sam_mask_logits,
        )
        if self.fill_hole_area > 0:
            compact_out["pred_masks"] = fill_holes_in_mask_scores(
                compact_out["pred_masks"], self.fill_hole_area, remove_sprinkles=False
            )
        return compact_out, compact_out["pred_masks"]

    # ------------------------------------------------------------------ clearing

    @paddle.no_grad()
    def clear_all_prompts_in_frame(
        self, inference_state: dict, frame_idx: int, obj_id: Any, need_output: bool = True
    ):
        """Remove an object's prompts on a frame -> ``(frame_idx, obj_ids, video_res_masks)``
        (None with ``need_output=False``)."""
        obj_idx = self._obj_id_to_idx(inference_state, obj_id)
        inference_state["point_inputs_per_obj"][obj_idx].pop(frame_idx, None)
        inference_state["mask_inputs_per_obj"][obj_idx].pop(frame_idx, None)
        temp = inference_state["temp_output_dict_per_obj"]
        temp[obj_idx]["cond_frame_outputs"].pop(frame_idx, None)
        temp[obj_idx]["non_cond_frame_outputs"].pop(frame_idx, None)
        obj_output_dict = inference_state["output_dict_per_obj"][obj_idx]
        out = obj_output_dict["cond_frame_outputs"].pop(frame_idx, None)
        if out is not None:
            obj_output_dict["non_cond_frame_outputs"][frame_idx] = out
            inference_state["frames_tracked_per_obj"][obj_idx].pop(frame_idx, None)
        if not need_output:
            return None
        is_cond = any(frame_idx in d["cond_frame_outputs"] for d in temp.values())
        return (
            frame_idx,
            inference_state["obj_ids"],
            self._frame_masks(inference_state, frame_idx, is_cond),
        )

    clear_all_points_in_frame = clear_all_prompts_in_frame  # the older name

    @paddle.no_grad()
    def reset_state(self, inference_state: dict) -> None:
        """Remove every object, prompt and result (the features stay)."""
        self._reset_tracking_results(inference_state)
        for key in (
            "obj_id_to_idx",
            "obj_idx_to_id",
            "obj_ids",
            "point_inputs_per_obj",
            "mask_inputs_per_obj",
            "output_dict_per_obj",
            "temp_output_dict_per_obj",
            "frames_tracked_per_obj",
        ):
            inference_state[key].clear()

    def _reset_tracking_results(self, inference_state: dict) -> None:
        for key in ("point_inputs_per_obj", "mask_inputs_per_obj", "frames_tracked_per_obj"):
            for v in inference_state[key].values():
                v.clear()
        for key in ("output_dict_per_obj", "temp_output_dict_per_obj"):
            for v in inference_state[key].values():
                v["cond_frame_outputs"].clear()
                v["non_cond_frame_outputs"].clear()

    @paddle.no_grad()
    def remove_object(
        self, inference_state: dict, obj_id: Any, strict: bool = False, need_output: bool = True
    ):
        """Remove an object -> ``(obj_ids, [(frame_idx, video_res_masks)])`` for the frames
        it had prompts on."""
        old_idx = inference_state["obj_id_to_idx"].get(obj_id)
        updated_frames: list = []
        if old_idx is None:
            if not strict:
                return inference_state["obj_ids"], updated_frames
            raise RuntimeError(
                f"Cannot remove object id {obj_id} as it doesn't exist. "
                f"All existing object ids: {inference_state['obj_ids']}."
            )
        if len(inference_state["obj_id_to_idx"]) == 1:
            self.reset_state(inference_state)
            return inference_state["obj_ids"], updated_frames
        input_frames = set(inference_state["point_inputs_per_obj"][old_idx])
        input_frames.update(inference_state["mask_inputs_per_obj"][old_idx])
        for frame_idx in input_frames:
            self.clear_all_prompts_in_frame(inference_state, frame_idx, obj_id, need_output=False)
        old_ids = inference_state["obj_ids"]
        remain = [i for i in range(len(old_ids)) if i != old_idx]
        new_ids = [old_ids[i] for i in remain]
        old_to_new = {old: new for new, old in enumerate(remain)}
        inference_state["obj_id_to_idx"] = OrderedDict((o, i) for i, o in enumerate(new_ids))
        inference_state["obj_idx_to_id"] = OrderedDict(enumerate(new_ids))
        inference_state["obj_ids"] = new_ids
        for key in (
            "point_inputs_per_obj",
            "mask_inputs_per_obj",
            "output_dict_per_obj",
            "temp_output_dict_per_obj",
            "frames_tracked_per_obj",
        ):
            container = inference_state[key]
            kept = [
                (old_to_new[k], container.pop(k)) for k in range(len(old_ids)) if k in old_to_new
            ]
            container.pop(old_idx, None)
            container.update(kept)
        if need_output:
            temp = inference_state["temp_output_dict_per_obj"]
            for frame_idx in input_frames:
                is_cond = any(frame_idx in d["cond_frame_outputs"] for d in temp.values())
                updated_frames.append(
                    (frame_idx, self._frame_masks(inference_state, frame_idx, is_cond))
                )
        return inference_state["obj_ids"], updated_frames

    def _clear_obj_non_cond_mem_around_input(
        self, inference_state: dict, frame_idx: int, obj_idx: int
    ) -> None:
        """Drop one object's non-conditioning memories within ``num_maskmem`` strides of a
        frame (upstream calls this method without defining it)."""
        r = self.memory_temporal_stride_for_eval
        non_cond = inference_state["output_dict_per_obj"][obj_idx]["non_cond_frame_outputs"]
        for t in range(frame_idx - r * self.num_maskmem, frame_idx + r * self.num_maskmem + 1):
            non_cond.pop(t, None)


__all__ = ["SAM2VideoPredictorBase"]
