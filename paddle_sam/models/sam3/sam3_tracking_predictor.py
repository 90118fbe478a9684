"""The inference state of SAM 3's video tracker: objects and their clicks or boxes per frame,
the memory bank, consolidation across objects and propagation through the video.

Upstream: sam3/model/sam3_tracking_predictor.py (``Sam3TrackerPredictor``). The model layer
stays pure: no video decoding and no backbone here. A state is made over the frames' backbone
outputs, given as ``cached_features`` (frame index -> ``backbone_out`` or upstream's
``(image, backbone_out)``) and/or an ``image_feature_fn(frame_idx) -> backbone_out`` that a
predictor outside ``models/`` provides (running the image encoder on demand). A
``backbone_out`` holds ``backbone_fpn`` and ``vision_pos_enc`` (``1 x C x H x W`` per level,
finest first) with the two finest levels already through ``conv_s0`` / ``conv_s1``, as
upstream's ``forward_image`` returns them; :meth:`Sam3TrackerPredictor.prepare_backbone_out`
applies those two convolutions to the neck's raw outputs.

As upstream, stored memory features are bfloat16. Not ported: CPU/GPU offloading of the state
(the ``offload_*`` and device entries are kept for parity, and ignored: on a CPU there is
nothing to offload to) and the object-wise overlap helpers that the tracker itself does not
call.
"""

from __future__ import annotations

import logging
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import paddle

from ..common import resize_bilinear
from .memory import resize_antialias
from .sam3_tracker_base import NO_OBJ_SCORE, Sam3TrackerBase, concat_points
from .sam3_tracker_utils import fill_holes_in_mask_scores

BackboneOut = dict[str, Any]


def _flat(x: paddle.Tensor, batch_size: int) -> paddle.Tensor:
    """``1 x C x H x W`` -> ``HW x batch_size x C``."""
    x = x.flatten(2).transpose([2, 0, 1])
    return x if batch_size == 1 else x.expand([-1, batch_size, -1])


def _same_tensors(a: list[paddle.Tensor], b: list[paddle.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x is y or (x.shape == y.shape and x.dtype == y.dtype and bool(paddle.equal_all(x, y)))
        for x, y in zip(a, b, strict=True)
    )


def _empty_outputs() -> dict[str, dict]:
    return {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}


def _as_array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, paddle.Tensor):
        value = value.numpy()
    elif hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor from ported code
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numbers, got {type(value).__name__}") from exc
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite numbers")
    return arr


def check_prompt(points: Any, labels: Any, box: Any):
    """Clicks ``[1 x] N x 2`` with labels ``[1 x] N`` and/or a box of 4 numbers, checked ->
    ``(1 x N x 2 float32, 1 x N int32, 1 x 2 x 2 float32 or None)`` paddle tensors."""
    if (points is not None) != (labels is not None):
        raise ValueError("points and labels must be provided together")
    if points is None and box is None:
        raise ValueError("at least one of points or box must be provided as input")
    if points is None:
        pts, lab = np.zeros((1, 0, 2)), np.zeros((1, 0))
    else:
        pts, lab = _as_array(points, "points"), _as_array(labels, "labels")
        if pts.ndim == 2:
            pts = pts[None]
        if lab.ndim == 1:
            lab = lab[None]
        if pts.ndim != 3 or pts.shape[0] != 1 or pts.shape[2] != 2:
            raise ValueError(f"points must be N x 2 (x, y), got shape {list(pts.shape)}")
        if lab.shape != pts.shape[:2]:
            raise ValueError(
                f"labels must be one per point ({pts.shape[1]}), got shape {list(lab.shape)}"
            )
        if not np.isin(lab, (-1, 0, 1, 2, 3)).all():
            raise ValueError("point labels must be 1 (object) or 0 (background)")
    out_box = None
    if box is not None:
        b = _as_array(box, "box")
        if b.size != 4:
            raise ValueError(f"box must be 4 numbers (x0, y0, x1, y1), got shape {list(b.shape)}")
        b = b.reshape(2, 2)
        if (b[1] < b[0]).any():
            raise ValueError(f"box must have x0 <= x1 and y0 <= y1, got {b.reshape(-1).tolist()}")
        out_box = paddle.to_tensor(b[None], "float32")
    return paddle.to_tensor(pts, "float32"), paddle.to_tensor(lab, "int32"), out_box


class Sam3TrackerPredictor(Sam3TrackerBase):
    """:class:`Sam3TrackerBase` with upstream's interactive, multi-object inference state."""

    def __init__(
        self,
        clear_non_cond_mem_around_input: bool = False,
        clear_non_cond_mem_for_multi_obj: bool = False,
        fill_hole_area: int = 0,
        always_start_from_first_ann_frame: bool = False,
        max_point_num_in_prompt_enc: int = 16,
        non_overlap_masks_for_output: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.clear_non_cond_mem_around_input = clear_non_cond_mem_around_input
        self.clear_non_cond_mem_for_multi_obj = clear_non_cond_mem_for_multi_obj
        self.fill_hole_area = fill_hole_area
        self.always_start_from_first_ann_frame = always_start_from_first_ann_frame
        self.max_point_num_in_prompt_enc = max_point_num_in_prompt_enc
        self.non_overlap_masks_for_output = non_overlap_masks_for_output
        self.iter_use_prev_mask_pred = True
        self.add_all_frames_to_correct_as_cond = True

    # ------------------------------------------------------------------ features

    def prepare_backbone_out(self, backbone_out: BackboneOut) -> BackboneOut:
        """The neck's ``backbone_fpn`` / ``vision_pos_enc`` with ``conv_s0`` / ``conv_s1``
        applied to the two finest levels (upstream's ``forward_image`` after the backbone)."""
        fpn = list(backbone_out["backbone_fpn"])
        fpn[0] = self.sam_mask_decoder.conv_s0(fpn[0])
        fpn[1] = self.sam_mask_decoder.conv_s1(fpn[1])
        return {"backbone_fpn": fpn, "vision_pos_enc": list(backbone_out["vision_pos_enc"])}

    def _get_image_feature(self, inference_state: dict, frame_idx: int, batch_size: int):
        """``(None, backbone_out, feats, pos, sizes)`` of a frame, expanded to ``batch_size``."""
        cached = inference_state["cached_features"].get(frame_idx)
        if isinstance(cached, tuple):
            cached = cached[1]
        backbone_out = cached
        if backbone_out is None:
            fn = inference_state.get("image_feature_fn")
            if fn is None:
                raise RuntimeError(
                    f"Image features for frame {frame_idx} are not cached and the state has no "
                    "image_feature_fn."
                )
            backbone_out = fn(frame_idx)
            inference_state["cached_features"] = {frame_idx: (None, backbone_out)}
        if "tracker_backbone_out" in backbone_out:
            backbone_out = backbone_out["tracker_backbone_out"]
        # Flattened (HW x B x C) at batch 1, then repeated for the objects: Paddle's expand
        # copies, so flatten first. Only the lowest-resolution level's position encoding is
        # used (by the memory attention; the high-resolution features go to the mask decoder
        # without one): the others are None, not flattened and copied per object (85 MB per
        # object at 288 x 288 x 256). The encodings are the same on every frame (sine
        # encodings of the sizes): the flattened copy is kept and reused while the frame's
        # encoding equals the one it was made from; upstream's views cost nothing.
        levels = slice(-self.num_feature_levels, None)
        feats = [_flat(x, batch_size) for x in backbone_out["backbone_fpn"][levels]]
        pos_src = list(backbone_out["vision_pos_enc"][levels])
        sizes = [tuple(x.shape[-2:]) for x in pos_src]
        cached = inference_state["constants"].get(("flat_vision_pos_enc", batch_size))
        if cached is not None and _same_tensors(cached[0], pos_src[-1:]):
            last = cached[1]
        else:
            last = _flat(pos_src[-1], batch_size)
            inference_state["constants"][("flat_vision_pos_enc", batch_size)] = (
                pos_src[-1:],
                last,
            )
        pos = [None] * (len(pos_src) - 1) + [last]
        return None, dict(backbone_out), feats, pos, sizes

    # ------------------------------------------------------------------ state

    @paddle.no_grad()
    def init_state(
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
        video_width`` (the size of the output masks)."""
        device = str(paddle.get_device())
        state: dict[str, Any] = {
            "offload_video_to_cpu": offload_video_to_cpu,
            "offload_state_to_cpu": offload_state_to_cpu,
            "device": device,
            "storage_device": "cpu" if offload_state_to_cpu else device,
            "video_height": video_height,
            "video_width": video_width,
            "num_frames": num_frames,
            "point_inputs_per_obj": {},
            "mask_inputs_per_obj": {},
            "cached_features": {} if cached_features is None else cached_features,
            "image_feature_fn": image_feature_fn,
            "constants": {},
            "obj_id_to_idx": OrderedDict(),
            "obj_idx_to_id": OrderedDict(),
            "obj_ids": [],
            "output_dict": _empty_outputs(),
            "first_ann_frame_idx": None,
            "output_dict_per_obj": {},
            "temp_output_dict_per_obj": {},
            "consolidated_frame_inds": {
                "cond_frame_outputs": set(),
                "non_cond_frame_outputs": set(),
            },
            "tracking_has_started": False,
            "frames_already_tracked": {},
        }
        self.clear_all_points_in_video(state)
        return state

    def reset_state(self, inference_state: dict) -> None:
        """Remove every object, input and result (the features stay)."""
        self.clear_all_points_in_video(inference_state)

    def _obj_id_to_idx(self, inference_state: dict, obj_id: Any) -> int:
        obj_idx = inference_state["obj_id_to_idx"].get(obj_id)
        if obj_idx is not None:
            return obj_idx
        if inference_state["tracking_has_started"]:
            raise RuntimeError(
                f"Cannot add new object id {obj_id} after tracking starts. "
                f"All existing object ids: {inference_state['obj_ids']}."
            )
        obj_idx = len(inference_state["obj_id_to_idx"])
        inference_state["obj_id_to_idx"][obj_id] = obj_idx
        inference_state["obj_idx_to_id"][obj_idx] = obj_id
        inference_state["obj_ids"] = list(inference_state["obj_id_to_idx"])
        inference_state["point_inputs_per_obj"][obj_idx] = {}
        inference_state["mask_inputs_per_obj"][obj_idx] = {}
        inference_state["output_dict_per_obj"][obj_idx] = _empty_outputs()
        inference_state["temp_output_dict_per_obj"][obj_idx] = _empty_outputs()
        return obj_idx

    def _obj_idx_to_id(self, inference_state: dict, obj_idx: int) -> Any:
        return inference_state["obj_idx_to_id"][obj_idx]

    def _get_obj_num(self, inference_state: dict) -> int:
        return len(inference_state["obj_idx_to_id"])

    # ------------------------------------------------------------------ prompts

    @paddle.no_grad()
    def add_new_points_or_box(
        self,
        inference_state: dict,
        frame_idx: int,
        obj_id: Any,
        points: Any = None,
        labels: Any = None,
        clear_old_points: bool = True,
        rel_coordinates: bool = True,
        use_prev_mem_frame: bool = False,
        normalize_coords: bool = True,
        box: Any = None,
    ):
        """Clicks (``N x 2``, labels 1 / 0) and/or a box (``x0 y0 x1 y1``) on a frame for an
        object, relative to the image (``rel_coordinates``, upstream's default) or in model
        pixels -> ``(frame_idx, obj_ids, None, video_res_masks)``. ``normalize_coords`` is
        accepted and unused, as upstream."""
        del normalize_coords
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
        if rel_coordinates:
            points = points * self.image_size
            if box is not None:
                box = box * self.image_size
        if box is not None:
            points = paddle.concat([box.reshape([1, 2, 2]), points], axis=1)
            labels = paddle.concat([paddle.to_tensor([[2, 3]], "int32"), labels], axis=1)

        old = None if clear_old_points else point_inputs_per_frame.get(frame_idx)
        point_inputs = concat_points(old, points, labels)
        point_inputs_per_frame[frame_idx] = point_inputs
        mask_inputs_per_frame.pop(frame_idx, None)
        is_init_cond_frame, reverse, is_cond, storage_key = self._prompt_frame(
            inference_state, frame_idx
        )
        obj_output_dict = inference_state["output_dict_per_obj"][obj_idx]
        obj_temp_output_dict = inference_state["temp_output_dict_per_obj"][obj_idx]

        num_points = point_inputs["point_coords"].shape[1]
        if num_points > self.max_point_num_in_prompt_enc > 0:
            num_first = self.max_point_num_in_prompt_enc // 2
            num_last = self.max_point_num_in_prompt_enc - num_first
            for key in ("point_coords", "point_labels"):
                v = point_inputs[key]
                point_inputs[key] = paddle.concat([v[:, :num_first], v[:, -num_last:]], axis=1)
            logging.warning(
                f"Too many points ({num_points}) are provided on frame {frame_idx}. Only "
                f"the first {num_first} points and the last {num_last} points will be used."
            )
        prev_sam_mask_logits = None
        if self.iter_use_prev_mask_pred:
            prev_out = obj_temp_output_dict[storage_key].get(frame_idx)
            if prev_out is None:
                prev_out = obj_output_dict["cond_frame_outputs"].get(frame_idx)
                if prev_out is None:
                    prev_out = obj_output_dict["non_cond_frame_outputs"].get(frame_idx)
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
            use_prev_mem_frame=use_prev_mem_frame,
        )
        obj_temp_output_dict[storage_key][frame_idx] = current_out
        video_res_masks = self._video_res_masks(inference_state, frame_idx, is_cond)
        return frame_idx, inference_state["obj_ids"], None, video_res_masks

    def _video_res_masks(
        self, inference_state: dict, frame_idx: int, is_cond: bool
    ) -> paddle.Tensor:
        """Every object's mask logits on ``frame_idx`` at the video's resolution, consolidated
        from the per-object temporary outputs (no memory encoding)."""
        consolidated_out = self._consolidate_temp_output_across_obj(
            inference_state,
            frame_idx,
            is_cond=is_cond,
            run_mem_encoder=False,
            consolidate_at_video_res=True,
        )
        _, video_res_masks = self._get_orig_video_res_output(
            inference_state, consolidated_out["pred_masks_video_res"]
        )
        return video_res_masks

    @paddle.no_grad()
    def add_new_mask(
        self,
        inference_state: dict,
        frame_idx: int,
        obj_id: Any,
        mask: Any,
        add_mask_to_memory: bool = False,
    ):
        """A mask prompt (``H x W``, bool or 0..1, any size) for an object on a frame ->
        ``(frame_idx, obj_ids, None, video_res_masks)``. As upstream, the frame's output is
        the given mask itself at the video's resolution (thresholded at 0.5 after an
        antialiased resize) and it removes the other objects' prompt masks under it;
        ``add_mask_to_memory`` is accepted and unused, as upstream."""
        del add_mask_to_memory
        frame_idx = self._check_frame_idx(inference_state, frame_idx)
        mask = paddle.to_tensor(mask)
        if mask.ndim != 2:
            raise ValueError(f"mask must be H x W, got shape {list(mask.shape)}")
        obj_idx = self._obj_id_to_idx(inference_state, obj_id)
        point_inputs_per_frame = inference_state["point_inputs_per_obj"][obj_idx]
        mask_inputs_per_frame = inference_state["mask_inputs_per_obj"][obj_idx]
        mask_orig = mask.astype("float32")[None, None]
        size = self.input_mask_size
        mask_inputs = mask_orig
        if tuple(mask_orig.shape[-2:]) != (size, size):
            mask_inputs = resize_antialias(mask_orig, (size, size))
        video_size = (inference_state["video_height"], inference_state["video_width"])
        mask_video_res = mask_orig
        if tuple(mask_orig.shape[-2:]) != video_size:
            mask_video_res = resize_antialias(mask_orig, video_size)
        mask_video_res = mask_video_res > 0.5

        mask_inputs_per_frame[frame_idx] = mask_video_res
        point_inputs_per_frame.pop(frame_idx, None)
        is_init_cond_frame, reverse, is_cond, storage_key = self._prompt_frame(
            inference_state, frame_idx
        )
        obj_output_dict = inference_state["output_dict_per_obj"][obj_idx]
        obj_temp_output_dict = inference_state["temp_output_dict_per_obj"][obj_idx]
        current_out, _ = self._run_single_frame_inference(
            inference_state=inference_state,
            output_dict=obj_output_dict,
            frame_idx=frame_idx,
            batch_size=1,
            is_init_cond_frame=is_init_cond_frame,
            point_inputs=None,
            mask_inputs=mask_inputs,
            reverse=reverse,
            run_mem_encoder=False,
        )
        fg = paddle.full(mask_video_res.shape, -NO_OBJ_SCORE, "float32")
        bg = paddle.full(mask_video_res.shape, NO_OBJ_SCORE, "float32")
        current_out["pred_masks"] = None
        current_out["pred_masks_video_res"] = paddle.where(mask_video_res, fg, bg)
        obj_temp_output_dict[storage_key][frame_idx] = current_out
        for obj_idx2, obj_temp_output_dict2 in inference_state["temp_output_dict_per_obj"].items():
            if obj_idx2 == obj_idx:
                continue
            current_out2 = obj_temp_output_dict2[storage_key].get(frame_idx)
            if current_out2 is not None and "pred_masks_video_res" in current_out2:
                current_out2["pred_masks_video_res"] = paddle.where(
                    mask_video_res, bg, current_out2["pred_masks_video_res"]
                )
        video_res_masks = self._video_res_masks(inference_state, frame_idx, is_cond)
        return frame_idx, inference_state["obj_ids"], None, video_res_masks

    def _prompt_frame(self, inference_state: dict, frame_idx: int) -> tuple[bool, bool, bool, str]:
        """How a prompt on ``frame_idx`` is stored: ``(is_init_cond_frame, reverse, is_cond,
        storage_key)``. A frame not tracked yet starts the object like SAM on an image; on a
        tracked frame the prompt corrects it, in the direction it was tracked."""
        is_init_cond_frame = frame_idx not in inference_state["frames_already_tracked"]
        reverse = (
            False
            if is_init_cond_frame
            else inference_state["frames_already_tracked"][frame_idx]["reverse"]
        )
        is_cond = is_init_cond_frame or self.add_all_frames_to_correct_as_cond
        return (
            is_init_cond_frame,
            reverse,
            is_cond,
            ("cond_frame_outputs" if is_cond else "non_cond_frame_outputs"),
        )

    @staticmethod
    def _check_frame_idx(inference_state: dict, frame_idx: Any, name: str = "frame") -> int:
        """``frame_idx`` as an int, or a clear error if it is not one in ``[0, num_frames)``."""
        num_frames = inference_state["num_frames"]
        try:
            if isinstance(frame_idx, bool):
                raise TypeError
            frame_idx = operator.index(frame_idx)
        except TypeError:
            raise TypeError(
                f"{name} index must be an integer, got {type(frame_idx).__name__}"
            ) from None
        if not 0 <= frame_idx < num_frames:
            raise IndexError(
                f"{name} index {frame_idx} out of range: the video has {num_frames} frames "
                f"(0-{num_frames - 1})"
            )
        return frame_idx

    def add_new_points(self, *args: Any, **kwargs: Any):
        """Deprecated upstream: :meth:`add_new_points_or_box`."""
        return self.add_new_points_or_box(*args, **kwargs)

    # ------------------------------------------------------------------ outputs

    def _get_orig_video_res_output(self, inference_state: dict, any_res_masks: paddle.Tensor):
        """The masks at video resolution, objects kept apart if asked."""
        size = (inference_state["video_height"], inference_state["video_width"])
        if tuple(any_res_masks.shape[-2:]) == size:
            video_res_masks = any_res_masks
        else:
            video_res_masks = resize_bilinear(any_res_masks, size)
        if self.non_overlap_masks_for_output:
            video_res_masks = self._apply_non_overlapping_constraints(video_res_masks)
        if self.fill_hole_area > 0:
            video_res_masks = fill_holes_in_mask_scores(video_res_masks, self.fill_hole_area)
        return any_res_masks, video_res_masks

    def _consolidate_temp_output_across_obj(
        self,
        inference_state: dict,
        frame_idx: int,
        is_cond: bool,
        run_mem_encoder: bool,
        consolidate_at_video_res: bool = False,
    ) -> dict[str, Any]:
        """All objects' outputs on a frame in one batch (temporary outputs first, then stored
        ones, else placeholders); optionally their memory re-encoded after the non-overlap
        constraint."""
        batch_size = self._get_obj_num(inference_state)
        storage_key = "cond_frame_outputs" if is_cond else "non_cond_frame_outputs"
        if consolidate_at_video_res:
            if run_mem_encoder:
                raise ValueError("memory encoder cannot run at video resolution")
            h, w = inference_state["video_height"], inference_state["video_width"]
            mask_key = "pred_masks_video_res"
        else:
            h = w = self.low_res_mask_size
            mask_key = "pred_masks"
        masks = [paddle.full([1, 1, h, w], NO_OBJ_SCORE, "float32") for _ in range(batch_size)]
        ptrs = [paddle.full([1, self.hidden_dim], NO_OBJ_SCORE, "float32")] * batch_size
        scores = [paddle.full([1, 1], 10.0, "float32")] * batch_size
        ious = [paddle.full([1, 1], 0.0, "float32")] * batch_size
        empty_mask_ptr = None
        for obj_idx in range(batch_size):
            out = inference_state["temp_output_dict_per_obj"][obj_idx][storage_key].get(frame_idx)
            obj_output_dict = inference_state["output_dict_per_obj"][obj_idx]
            if out is None:
                out = obj_output_dict["cond_frame_outputs"].get(frame_idx)
            if out is None:
                out = obj_output_dict["non_cond_frame_outputs"].get(frame_idx)
            if out is None:
                if run_mem_encoder:
                    if empty_mask_ptr is None:
                        empty_mask_ptr = self._get_empty_mask_ptr(inference_state, frame_idx)
                    ptrs[obj_idx] = empty_mask_ptr
                continue
            obj_mask = out.get("pred_masks_video_res", out["pred_masks"])
            if tuple(obj_mask.shape[-2:]) != (h, w):
                if "pred_masks_video_res" in out:  # a mask prompt, antialiased as upstream
                    obj_mask = resize_antialias(obj_mask.astype("float32"), (h, w))
                else:
                    obj_mask = resize_bilinear(obj_mask, (h, w))
            masks[obj_idx] = obj_mask
            ptrs[obj_idx] = out["obj_ptr"]
            scores[obj_idx] = out["object_score_logits"]
            if self.use_memory_selection:
                ious[obj_idx] = out["iou_score"].reshape([1, 1])
        consolidated_out: dict[str, Any] = {
            "maskmem_features": None,
            "maskmem_pos_enc": None,
            mask_key: paddle.concat(masks, axis=0),
            "obj_ptr": paddle.concat(ptrs, axis=0),
            "object_score_logits": paddle.concat(scores, axis=0),
        }
        if self.use_memory_selection:
            consolidated_out["iou_score"] = paddle.concat(ious, axis=0)
        if run_mem_encoder:
            high_res_masks = resize_bilinear(
                consolidated_out["pred_masks"], (self.image_size, self.image_size)
            )
            high_res_masks = self._apply_non_overlapping_constraints(high_res_masks)
            feats, pos = self._run_memory_encoder(
                inference_state,
                frame_idx,
                batch_size,
                high_res_masks,
                consolidated_out["object_score_logits"],
                is_mask_from_pts=True,
            )
            consolidated_out["maskmem_features"] = feats
            consolidated_out["maskmem_pos_enc"] = pos
        return consolidated_out

    def _get_empty_mask_ptr(self, inference_state: dict, frame_idx: int) -> paddle.Tensor:
        """An object pointer from an empty mask on the frame (for objects without output)."""
        _, _, feats, pos, sizes = self._get_image_feature(inference_state, frame_idx, 1)
        out = self.track_step(
            frame_idx=frame_idx,
            is_init_cond_frame=True,
            current_vision_feats=feats,
            current_vision_pos_embeds=pos,
            feat_sizes=sizes,
            point_inputs=None,
            mask_inputs=paddle.zeros([1, 1, self.image_size, self.image_size]),
            output_dict=_empty_outputs(),
            num_frames=inference_state["num_frames"],
            track_in_reverse=False,
            run_mem_encoder=False,
        )
        return out["obj_ptr"]

    # ------------------------------------------------------------------ propagation

    @paddle.no_grad()
    def propagate_in_video_preflight(
        self, inference_state: dict, run_mem_encoder: bool = True
    ) -> None:
        """Merge the frames that got prompts into the memory bank (all objects together,
        memory encoded after the non-overlap constraint)."""
        inference_state["tracking_has_started"] = True
        batch_size = self._get_obj_num(inference_state)
        temp_output_dict_per_obj = inference_state["temp_output_dict_per_obj"]
        output_dict = inference_state["output_dict"]
        consolidated_frame_inds = inference_state["consolidated_frame_inds"]
        for is_cond in (False, True):
            storage_key = "cond_frame_outputs" if is_cond else "non_cond_frame_outputs"
            temp_frame_inds: set[int] = set()
            for obj_temp_output_dict in temp_output_dict_per_obj.values():
                temp_frame_inds.update(obj_temp_output_dict[storage_key].keys())
            consolidated_frame_inds[storage_key].update(temp_frame_inds)
            for frame_idx in temp_frame_inds:
                consolidated_out = self._consolidate_temp_output_across_obj(
                    inference_state, frame_idx, is_cond=is_cond, run_mem_encoder=run_mem_encoder
                )
                output_dict[storage_key][frame_idx] = consolidated_out
                self._add_output_per_object(
                    inference_state, frame_idx, consolidated_out, storage_key
                )
                if self.clear_non_cond_mem_around_input and (
                    self.clear_non_cond_mem_for_multi_obj or batch_size <= 1
                ):
                    self._clear_non_cond_mem_around_input(inference_state, frame_idx)
            for obj_temp_output_dict in temp_output_dict_per_obj.values():
                obj_temp_output_dict[storage_key].clear()

        for frame_idx in output_dict["cond_frame_outputs"]:
            output_dict["non_cond_frame_outputs"].pop(frame_idx, None)
        for obj_output_dict in inference_state["output_dict_per_obj"].values():
            for frame_idx in obj_output_dict["cond_frame_outputs"]:
                obj_output_dict["non_cond_frame_outputs"].pop(frame_idx, None)
        for frame_idx in consolidated_frame_inds["cond_frame_outputs"]:
            if frame_idx not in output_dict["cond_frame_outputs"]:
                raise RuntimeError(f"frame {frame_idx} lost its conditioning output")
            consolidated_frame_inds["non_cond_frame_outputs"].discard(frame_idx)

        all_consolidated = (
            consolidated_frame_inds["cond_frame_outputs"]
            | consolidated_frame_inds["non_cond_frame_outputs"]
        )
        input_frames_inds: set[int] = set()
        for per_frame in inference_state["point_inputs_per_obj"].values():
            input_frames_inds.update(per_frame.keys())
        for per_frame in inference_state["mask_inputs_per_obj"].values():
            input_frames_inds.update(per_frame.keys())
        if all_consolidated != input_frames_inds:
            raise RuntimeError("consolidated frames differ from the frames with inputs")
        if inference_state["first_ann_frame_idx"] is None:
            inference_state["first_ann_frame_idx"] = min(input_frames_inds, default=None)
        if inference_state["first_ann_frame_idx"] not in output_dict["cond_frame_outputs"]:
            inference_state["first_ann_frame_idx"] = min(
                output_dict["cond_frame_outputs"], default=None
            )

    def _get_processing_order(
        self,
        inference_state: dict,
        start_frame_idx: int | None,
        max_frame_num_to_track: int | None,
        reverse: bool,
    ):
        num_frames = inference_state["num_frames"]
        if self.always_start_from_first_ann_frame:
            start_frame_idx = inference_state["first_ann_frame_idx"]
        if start_frame_idx is None:
            start_frame_idx = min(inference_state["output_dict"]["cond_frame_outputs"])
        if max_frame_num_to_track is None:
            max_frame_num_to_track = num_frames
        if reverse:
            end_frame_idx = max(start_frame_idx - max_frame_num_to_track, 0)
            if start_frame_idx > 0:
                return range(start_frame_idx, end_frame_idx - 1, -1)
            return [0]
        end_frame_idx = min(start_frame_idx + max_frame_num_to_track, num_frames - 1)
        return range(start_frame_idx, end_frame_idx + 1)

    @paddle.no_grad()
    def propagate_in_video(
        self,
        inference_state: dict,
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
        tqdm_disable: bool = False,
        obj_ids: Any = None,
        run_mem_encoder: bool = True,
        propagate_preflight: bool = False,
    ) -> Iterator[tuple]:
        """Track all objects frame by frame; yields upstream's ``(frame_idx, obj_ids,
        low_res_masks, video_res_masks, obj_scores)``. As upstream, call
        :meth:`propagate_in_video_preflight` first (or pass ``propagate_preflight=True``).
        ``tqdm_disable`` is accepted for upstream's signature: the model draws no progress
        bar (the CLI does)."""
        del tqdm_disable
        if start_frame_idx is not None:
            start_frame_idx = self._check_frame_idx(inference_state, start_frame_idx, "start frame")
        if max_frame_num_to_track is not None and (
            isinstance(max_frame_num_to_track, bool)
            or not isinstance(max_frame_num_to_track, int | np.integer)
            or max_frame_num_to_track < 0
        ):
            raise ValueError(
                f"max_frame_num_to_track must be a non-negative integer, got "
                f"{max_frame_num_to_track!r}"
            )
        if propagate_preflight:
            self.propagate_in_video_preflight(inference_state)
        output_dict = inference_state["output_dict"]
        consolidated_frame_inds = inference_state["consolidated_frame_inds"]
        if obj_ids is not None:
            raise NotImplementedError("per-object tracking is not implemented (as upstream)")
        obj_ids = inference_state["obj_ids"]
        batch_size = self._get_obj_num(inference_state)
        if len(output_dict["cond_frame_outputs"]) == 0:
            raise RuntimeError("No points are provided; please add points first")
        clear_non_cond_mem = self.clear_non_cond_mem_around_input and (
            self.clear_non_cond_mem_for_multi_obj or batch_size <= 1
        )
        order = self._get_processing_order(
            inference_state, start_frame_idx, max_frame_num_to_track, reverse
        )
        for frame_idx in order:
            if frame_idx in consolidated_frame_inds["cond_frame_outputs"]:
                storage_key = "cond_frame_outputs"
                current_out = output_dict[storage_key][frame_idx]
                pred_masks = current_out["pred_masks"]
                if clear_non_cond_mem:
                    self._clear_non_cond_mem_around_input(inference_state, frame_idx)
            elif frame_idx in consolidated_frame_inds["non_cond_frame_outputs"]:
                storage_key = "non_cond_frame_outputs"
                current_out = output_dict[storage_key][frame_idx]
                pred_masks = current_out["pred_masks"]
            else:
                storage_key = "non_cond_frame_outputs"
                current_out, pred_masks = self._run_single_frame_inference(
                    inference_state=inference_state,
                    output_dict=output_dict,
                    frame_idx=frame_idx,
                    batch_size=batch_size,
                    is_init_cond_frame=False,
                    point_inputs=None,
                    mask_inputs=None,
                    reverse=reverse,
                    run_mem_encoder=run_mem_encoder,
                )
                output_dict[storage_key][frame_idx] = current_out
            obj_scores = current_out["object_score_logits"]
            self._add_output_per_object(inference_state, frame_idx, current_out, storage_key)
            inference_state["frames_already_tracked"][frame_idx] = {"reverse": reverse}
            low_res_masks, video_res_masks = self._get_orig_video_res_output(
                inference_state, pred_masks
            )
            yield frame_idx, obj_ids, low_res_masks, video_res_masks, obj_scores

    def _add_output_per_object(
        self, inference_state: dict, frame_idx: int, current_out: dict, storage_key: str
    ) -> None:
        """Per-object slices of a multi-object output into ``output_dict_per_obj``."""
        maskmem_features = current_out["maskmem_features"]
        maskmem_pos_enc = current_out["maskmem_pos_enc"]
        for obj_idx, obj_output_dict in inference_state["output_dict_per_obj"].items():
            s = slice(obj_idx, obj_idx + 1)
            obj_out = {
                "maskmem_features": None,
                "maskmem_pos_enc": None,
                "pred_masks": current_out["pred_masks"][s],
                "obj_ptr": current_out["obj_ptr"][s],
                "object_score_logits": current_out["object_score_logits"][s],
            }
            if self.use_memory_selection:
                obj_out["iou_score"] = current_out["iou_score"][s]
            if maskmem_features is not None:
                obj_out["maskmem_features"] = maskmem_features[s]
            if maskmem_pos_enc is not None:
                obj_out["maskmem_pos_enc"] = maskmem_pos_enc  # batch 1, shared
            obj_output_dict[storage_key][frame_idx] = obj_out

    # ------------------------------------------------------------------ clearing

    @paddle.no_grad()
    def clear_all_points_in_frame(
        self, inference_state: dict, frame_idx: int, obj_id: Any, need_output: bool = True
    ):
        """Remove an object's inputs on a frame (the frame may become non-conditioning)."""
        obj_idx = self._obj_id_to_idx(inference_state, obj_id)
        inference_state["point_inputs_per_obj"][obj_idx].pop(frame_idx, None)
        inference_state["mask_inputs_per_obj"][obj_idx].pop(frame_idx, None)
        temp_output_dict_per_obj = inference_state["temp_output_dict_per_obj"]
        temp_output_dict_per_obj[obj_idx]["cond_frame_outputs"].pop(frame_idx, None)
        temp_output_dict_per_obj[obj_idx]["non_cond_frame_outputs"].pop(frame_idx, None)
        batch_size = self._get_obj_num(inference_state)
        frame_has_input = any(
            frame_idx in inference_state["point_inputs_per_obj"][i]
            or frame_idx in inference_state["mask_inputs_per_obj"][i]
            for i in range(batch_size)
        )
        if not frame_has_input:
            output_dict = inference_state["output_dict"]
            consolidated_frame_inds = inference_state["consolidated_frame_inds"]
            consolidated_frame_inds["cond_frame_outputs"].discard(frame_idx)
            consolidated_frame_inds["non_cond_frame_outputs"].discard(frame_idx)
            out = output_dict["cond_frame_outputs"].pop(frame_idx, None)
            if out is not None:
                output_dict["non_cond_frame_outputs"][frame_idx] = out
                inference_state["frames_already_tracked"].pop(frame_idx, None)
            for i in range(batch_size):
                obj_output_dict = inference_state["output_dict_per_obj"][i]
                obj_out = obj_output_dict["cond_frame_outputs"].pop(frame_idx, None)
                if obj_out is not None:
                    obj_output_dict["non_cond_frame_outputs"][frame_idx] = obj_out
            if len(output_dict["cond_frame_outputs"]) == 0:
                self._reset_tracking_results(inference_state)
        if not need_output:
            return None
        is_cond = any(
            frame_idx in d["cond_frame_outputs"] for d in temp_output_dict_per_obj.values()
        )
        video_res_masks = self._video_res_masks(inference_state, frame_idx, is_cond)
        return frame_idx, inference_state["obj_ids"], None, video_res_masks

    @paddle.no_grad()
    def clear_all_points_in_video(self, inference_state: dict) -> None:
        """Remove all inputs, results and object ids."""
        self._reset_tracking_results(inference_state)
        inference_state["obj_id_to_idx"].clear()
        inference_state["obj_idx_to_id"].clear()
        inference_state["obj_ids"].clear()
        inference_state["point_inputs_per_obj"].clear()
        inference_state["mask_inputs_per_obj"].clear()
        inference_state["output_dict_per_obj"].clear()
        inference_state["temp_output_dict_per_obj"].clear()

    def _reset_tracking_results(self, inference_state: dict) -> None:
        for key in ("point_inputs_per_obj", "mask_inputs_per_obj"):
            for v in inference_state[key].values():
                v.clear()
        for key in ("output_dict_per_obj", "temp_output_dict_per_obj"):
            for v in inference_state[key].values():
                v["cond_frame_outputs"].clear()
                v["non_cond_frame_outputs"].clear()
        for key in ("output_dict", "consolidated_frame_inds"):
            inference_state[key]["cond_frame_outputs"].clear()
            inference_state[key]["non_cond_frame_outputs"].clear()
        inference_state["tracking_has_started"] = False
        inference_state["frames_already_tracked"].clear()
        inference_state["first_ann_frame_idx"] = None

    # ------------------------------------------------------------------ one frame

    def _run_single_frame_inference(
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
        use_prev_mem_frame: bool = True,
    ) -> tuple[dict[str, Any], paddle.Tensor]:
        """track_step on a frame -> (compact output, memory features in bfloat16; masks)."""
        _, _, feats, pos, sizes = self._get_image_feature(inference_state, frame_idx, batch_size)
        if point_inputs is not None and mask_inputs is not None:
            raise ValueError("points and a mask on the same frame")
        current_out = self.track_step(
            frame_idx=frame_idx,
            is_init_cond_frame=is_init_cond_frame,
            current_vision_feats=feats,
            current_vision_pos_embeds=pos,
            feat_sizes=sizes,
            point_inputs=point_inputs,
            mask_inputs=mask_inputs,
            output_dict=output_dict,
            num_frames=inference_state["num_frames"],
            track_in_reverse=reverse,
            run_mem_encoder=run_mem_encoder,
            prev_sam_mask_logits=prev_sam_mask_logits,
            use_prev_mem_frame=use_prev_mem_frame,
        )
        maskmem_features = current_out["maskmem_features"]
        if maskmem_features is not None:
            maskmem_features = maskmem_features.astype("bfloat16")
        pred_masks = current_out["pred_masks"]
        compact_out = {
            "maskmem_features": maskmem_features,
            "maskmem_pos_enc": self._get_maskmem_pos_enc(inference_state, current_out),
            "pred_masks": pred_masks,
            "obj_ptr": current_out["obj_ptr"],
            "object_score_logits": current_out["object_score_logits"],
        }
        if self.use_memory_selection:
            compact_out["iou_score"] = current_out["iou_score"]
            compact_out["eff_iou_score"] = current_out["eff_iou_score"]
        return compact_out, pred_masks

    def _run_memory_encoder(
        self,
        inference_state: dict,
        frame_idx: int,
        batch_size: int,
        high_res_masks: paddle.Tensor,
        object_score_logits: paddle.Tensor,
        is_mask_from_pts: bool,
    ) -> tuple[paddle.Tensor, list[paddle.Tensor]]:
        """Memory of a frame re-encoded from given masks (bfloat16 features)."""
        _, _, feats, _, sizes = self._get_image_feature(inference_state, frame_idx, batch_size)
        maskmem_features, maskmem_pos_enc = self._encode_new_memory(
            current_vision_feats=feats,
            feat_sizes=sizes,
            pred_masks_high_res=high_res_masks,
            object_score_logits=object_score_logits,
            is_mask_from_pts=is_mask_from_pts,
        )
        pos = self._get_maskmem_pos_enc(inference_state, {"maskmem_pos_enc": maskmem_pos_enc})
        return maskmem_features.astype("bfloat16"), pos

    def _get_maskmem_pos_enc(self, inference_state: dict, current_out: dict):
        """The memory position encoding (the same on every frame): one copy kept in the
        state's constants."""
        out_pos = current_out["maskmem_pos_enc"]
        if out_pos is None:
            return None
        constants = inference_state["constants"]
        if "maskmem_pos_enc" not in constants:
            constants["maskmem_pos_enc"] = [x[0:1].clone() for x in out_pos]
        # batch 1, shared by every frame and object (the memory attention expands it):
        # upstream stores expanded views, which Paddle's expand would turn into copies
        return constants["maskmem_pos_enc"]

    @paddle.no_grad()
    def remove_object(
        self, inference_state: dict, obj_id: Any, strict: bool = False, need_output: bool = True
    ):
        """Remove an object from the state -> ``(obj_ids, [(frame_idx, video_res_masks)])``."""
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
            self.clear_all_points_in_video(inference_state)
            return inference_state["obj_ids"], updated_frames

        input_frames: set[int] = set()
        input_frames.update(inference_state["point_inputs_per_obj"][old_idx])
        input_frames.update(inference_state["mask_inputs_per_obj"][old_idx])
        for frame_idx in input_frames:
            self.clear_all_points_in_frame(inference_state, frame_idx, obj_id, need_output=False)

        old_obj_ids = inference_state["obj_ids"]
        old_inds = list(range(len(old_obj_ids)))
        remain = [i for i in old_inds if i != old_idx]
        new_obj_ids = [old_obj_ids[i] for i in remain]
        old_to_new = {old: new for new, old in enumerate(remain)}
        inference_state["obj_id_to_idx"] = {oid: i for i, oid in enumerate(new_obj_ids)}
        inference_state["obj_idx_to_id"] = dict(enumerate(new_obj_ids))
        inference_state["obj_ids"] = new_obj_ids

        for key in (
            "point_inputs_per_obj",
            "mask_inputs_per_obj",
            "output_dict_per_obj",
            "temp_output_dict_per_obj",
        ):
            container = inference_state[key]
            kept = [(old_to_new[k], container.pop(k)) for k in old_inds if k in old_to_new]
            container.pop(old_idx, None)
            container.update(kept)

        index = paddle.to_tensor(remain, "int64")
        for storage_key in ("cond_frame_outputs", "non_cond_frame_outputs"):
            for frame_idx, out in inference_state["output_dict"][storage_key].items():
                feats = out["maskmem_features"]
                out["maskmem_features"] = paddle.gather(feats.astype("float32"), index).astype(
                    feats.dtype
                )
                out["maskmem_pos_enc"] = self._get_maskmem_pos_enc(inference_state, out)
                for key in ("pred_masks", "obj_ptr", "object_score_logits"):
                    out[key] = paddle.gather(out[key], index)
                if self.use_memory_selection:
                    out["iou_score"] = paddle.gather(out["iou_score"], index)
                    out["eff_iou_score"] = self.cal_mem_score(
                        out["object_score_logits"], out["iou_score"]
                    )
                self._add_output_per_object(inference_state, frame_idx, out, storage_key)

        if need_output:
            temp = inference_state["temp_output_dict_per_obj"]
            for frame_idx in input_frames:
                is_cond = any(frame_idx in d["cond_frame_outputs"] for d in temp.values())
                video_res_masks = self._video_res_masks(inference_state, frame_idx, is_cond)
                updated_frames.append((frame_idx, video_res_masks))
        return inference_state["obj_ids"], updated_frames

    def _clear_non_cond_mem_around_input(self, inference_state: dict, frame_idx: int) -> None:
        """Drop the non-conditioning memories within ``num_maskmem`` strides of a frame."""
        r = self.memory_temporal_stride_for_eval
        begin, end = frame_idx - r * self.num_maskmem, frame_idx + r * self.num_maskmem
        for obj_idx in range(self._get_obj_num(inference_state)):
            non_cond = inference_state["output_dict_per_obj"][obj_idx]["non_cond_frame_outputs"]
            for t in range(begin, end + 1):
                non_cond.pop(t, None)
