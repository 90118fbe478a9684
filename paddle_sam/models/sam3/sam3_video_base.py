"""SAM 3's dense video inference, the model half: detect every instance of a concept on each
frame, track the instances with the SAM 2 style tracker, and match detections to tracks
(upstream: sam3/model/sam3_video_base.py, ``Sam3VideoBase``).

One process: upstream shards the tracker's objects over GPUs (``RANK`` / ``WORLD_SIZE``) and
all-gathers or broadcasts between them; here the process is rank 0 of 1, the collective
operations are gone and the per-GPU metadata (``obj_ids_per_gpu``, ``num_obj_per_gpu``) keeps
upstream's layout with one entry. What the distributed path implies for the numbers is kept:
the detector hands the tracker the SAM 2 neck's features rounded to bfloat16 (upstream casts
them for its all-gather, with one process too).

The detector is a :class:`~paddle_sam.models.sam3.sam3_image.Sam3Image` (its
``forward_video_grounding_multigpu``), the tracker a
:class:`~paddle_sam.models.sam3.sam3_tracking_predictor.Sam3TrackerPredictor`, both in their
upstream inference-state API.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from copy import deepcopy
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import paddle
from paddle import nn

from ..common import resize_bilinear
from .perflib.masks_ops import fast_diag_box_iou, mask_iou, mask_to_box
from .sam3_tracker_utils import fill_holes_in_mask_scores

logger = logging.getLogger(__name__)


class MaskletConfirmationStatus(Enum):
    """Upstream ``MaskletConfirmationStatus``."""

    UNCONFIRMED = 1  # newly added masklet, not confirmed by any detection yet
    CONFIRMED = 2  # confirmed by at least one detection


@dataclass
class BatchedDatapoint:
    """The inference fields of upstream's ``BatchedDatapoint`` (sam3/model/data_misc.py) that
    the video model reads: the frames (``img_batch``: ``T x 3 x H x W`` or a list of
    ``3 x H x W``), the texts of the prompts (``find_text_batch``) and one ``FindStage`` per
    frame (``find_inputs``)."""

    img_batch: Any
    find_text_batch: list[str]
    find_inputs: list[Any]
    find_targets: list[Any] = field(default_factory=list)
    find_metadatas: list[Any] = field(default_factory=list)


def _index(x: paddle.Tensor, inds: Any) -> paddle.Tensor:
    """``x[inds]`` along the first axis for integer indices (a NumPy array or list)."""
    inds = np.asarray(inds, dtype=np.int64).reshape(-1)
    if inds.size == 0:
        return paddle.zeros([0, *x.shape[1:]], dtype=x.dtype)
    return paddle.gather(x, paddle.to_tensor(inds), axis=0)


def _resize(x: paddle.Tensor, size: tuple[int, int] | list[int]) -> paddle.Tensor:
    """``F.interpolate(x, size, mode="bilinear", align_corners=False)`` of ``B x C x h x w``
    (a batch of none included)."""
    if x.shape[0] == 0:
        return paddle.zeros([0, x.shape[1], int(size[0]), int(size[1])], dtype=x.dtype)
    return resize_bilinear(x, size)


def _suppress_shrinked_masks(
    pred_masks: paddle.Tensor, new_pred_masks: paddle.Tensor, shrink_threshold: float = 0.3
) -> paddle.Tensor:
    """Upstream ``Sam3TrackerPredictor._suppress_shrinked_masks``: masks that keep less than
    ``shrink_threshold`` of their area in ``new_pred_masks`` clamped to at most -10."""
    area_before = (pred_masks > 0).astype("float32").sum(axis=[-1, -2])
    area_after = (new_pred_masks > 0).astype("float32").sum(axis=[-1, -2])
    area_ratio = area_after / area_before.clip(min=1.0)
    keep = area_ratio >= shrink_threshold
    keep_mask = keep.unsqueeze(-1).unsqueeze(-1).expand_as(pred_masks)
    return paddle.where(keep_mask, pred_masks, pred_masks.clip(max=-10.0))


def _suppress_object_pw_area_shrinkage(tracker: Any, pred_masks: paddle.Tensor) -> paddle.Tensor:
    """Upstream ``Sam3TrackerPredictor._suppress_object_pw_area_shrinkage``: the masks that
    shrink a lot under the pixel-wise non-overlapping constraint are suppressed (the output
    may still overlap). Our tracker does not carry this helper; it is computed here from its
    ``_apply_non_overlapping_constraints``."""
    pixel_level_non_overlapping_masks = tracker._apply_non_overlapping_constraints(pred_masks)
    return _suppress_shrinked_masks(pred_masks, pixel_level_non_overlapping_masks)


class Sam3VideoBase(nn.Layer):
    """Upstream ``Sam3VideoBase``: per-frame detection, tracking, association and the
    heuristics that add, remove and suppress masklets (hot-start, keep-alive, occlusion,
    reconditioning, confirmation). The constructor's arguments and defaults are upstream's."""

    def __init__(
        self,
        detector: nn.Layer,
        tracker: nn.Layer,
        score_threshold_detection: float = 0.5,
        det_nms_thresh: float = 0.0,
        assoc_iou_thresh: float = 0.5,
        trk_assoc_iou_thresh: float = 0.5,
        new_det_thresh: float = 0.0,
        hotstart_delay: int = 0,
        hotstart_unmatch_thresh: int = 3,
        hotstart_dup_thresh: int = 3,
        suppress_unmatched_only_within_hotstart: bool = True,
        init_trk_keep_alive: int = 0,
        max_trk_keep_alive: int = 8,
        min_trk_keep_alive: int = -4,
        suppress_overlapping_based_on_recent_occlusion_threshold: float = 0.0,
        decrease_trk_keep_alive_for_empty_masklets: bool = False,
        o2o_matching_masklets_enable: bool = False,
        suppress_det_close_to_boundary: bool = False,
        fill_hole_area: int = 16,
        max_num_objects: int = -1,
        recondition_every_nth_frame: int = -1,
        masklet_confirmation_enable: bool = False,
        masklet_confirmation_consecutive_det_thresh: int = 3,
        reconstruction_bbox_iou_thresh: float = 0.0,
        reconstruction_bbox_det_score: float = 0.0,
    ) -> None:
        super().__init__()
        self.detector = detector
        self.tracker = tracker
        self.score_threshold_detection = score_threshold_detection
        self.det_nms_thresh = det_nms_thresh
        self.assoc_iou_thresh = assoc_iou_thresh
        self.trk_assoc_iou_thresh = trk_assoc_iou_thresh
        self.new_det_thresh = new_det_thresh

        if hotstart_delay > 0:
            if hotstart_unmatch_thresh > hotstart_delay:
                raise ValueError("hotstart_unmatch_thresh must be <= hotstart_delay")
            if hotstart_dup_thresh > hotstart_delay:
                raise ValueError("hotstart_dup_thresh must be <= hotstart_delay")
        self.hotstart_delay = hotstart_delay
        self.hotstart_unmatch_thresh = hotstart_unmatch_thresh
        self.hotstart_dup_thresh = hotstart_dup_thresh
        self.suppress_unmatched_only_within_hotstart = suppress_unmatched_only_within_hotstart
        self.init_trk_keep_alive = init_trk_keep_alive
        self.max_trk_keep_alive = max_trk_keep_alive
        self.min_trk_keep_alive = min_trk_keep_alive
        self.suppress_overlapping_based_on_recent_occlusion_threshold = (
            suppress_overlapping_based_on_recent_occlusion_threshold
        )
        self.suppress_det_close_to_boundary = suppress_det_close_to_boundary
        self.decrease_trk_keep_alive_for_empty_masklets = decrease_trk_keep_alive_for_empty_masklets
        self.o2o_matching_masklets_enable = o2o_matching_masklets_enable
        self.fill_hole_area = fill_hole_area
        self.eval()
        # one process: rank 0 of 1 (upstream reads RANK and WORLD_SIZE)
        self.rank = 0
        self.world_size = 1

        if max_num_objects > 0:
            num_obj_for_compile = math.ceil(max_num_objects / self.world_size)
        else:
            max_num_objects = 10000  # no limit
            num_obj_for_compile = 16
        self.max_num_objects = max_num_objects
        self.num_obj_for_compile = num_obj_for_compile
        self.recondition_every_nth_frame = recondition_every_nth_frame
        self.masklet_confirmation_enable = masklet_confirmation_enable
        self.masklet_confirmation_consecutive_det_thresh = (
            masklet_confirmation_consecutive_det_thresh
        )
        self.reconstruction_bbox_iou_thresh = reconstruction_bbox_iou_thresh
        self.reconstruction_bbox_det_score = reconstruction_bbox_det_score

    def _warm_up_is_complete(self) -> bool:
        """Upstream's ``not hasattr(self, "_warm_up_complete") or self._warm_up_complete``."""
        return getattr(self, "_warm_up_complete", True)

    # ------------------------------------------------------------------ one frame

    @paddle.no_grad()
    def _det_track_one_frame(
        self,
        frame_idx: int,
        num_frames: int,
        reverse: bool,
        input_batch: Any,
        geometric_prompt: Any,
        tracker_states_local: list[Any],
        tracker_metadata_prev: dict[str, Any],
        feature_cache: dict,
        orig_vid_height: int,
        orig_vid_width: int,
        is_image_only: bool = False,
        allow_new_detections: bool = True,
    ):
        """One frame of detection + tracking (upstream ``_det_track_one_frame``): detect,
        propagate the masklets, plan the updates (association and heuristics, memory
        encoding), execute them (add and remove objects) and build the outputs.

        Returns ``(obj_id_to_mask, obj_id_to_score, tracker_states_local_new,
        tracker_metadata_new, frame_stats, tracker_obj_scores_global)``: masks are bool
        ``1 x H_video x W_video``; the last item is the tracker's per-object probabilities as
        a list (or an empty tensor when no masklet existed before this frame)."""
        # Step 1: run the backbone and the detector; the SAM 2 features go to `feature_cache`
        det_out = self.run_backbone_and_detection(
            frame_idx=frame_idx,
            num_frames=num_frames,
            reverse=reverse,
            input_batch=input_batch,
            geometric_prompt=geometric_prompt,
            feature_cache=feature_cache,
            allow_new_detections=allow_new_detections,
        )

        # Step 2: propagate the masklets (memory encoding deferred to the planning phase)
        if tracker_metadata_prev == {}:
            tracker_metadata_prev.update(self._initialize_metadata())
        tracker_low_res_masks_global, tracker_obj_scores_global = self.run_tracker_propagation(
            frame_idx=frame_idx,
            num_frames=num_frames,
            reverse=reverse,
            tracker_states_local=tracker_states_local,
            tracker_metadata_prev=tracker_metadata_prev,
        )

        # Step 3: plan the masklet updates (all heuristics) and encode the memories
        tracker_update_plan, tracker_metadata_new = self.run_tracker_update_planning_phase(
            frame_idx=frame_idx,
            num_frames=num_frames,
            reverse=reverse,
            det_out=det_out,
            tracker_low_res_masks_global=tracker_low_res_masks_global,
            tracker_obj_scores_global=tracker_obj_scores_global,
            tracker_metadata_prev=tracker_metadata_prev,
            tracker_states_local=tracker_states_local,
            is_image_only=is_image_only,
        )

        reconditioned_obj_ids = tracker_update_plan.get("reconditioned_obj_ids", set())
        det_to_matched_trk_obj_ids = tracker_update_plan.get("det_to_matched_trk_obj_ids", {})

        # Step 4: execute the plan on the tracker's inference states
        tracker_states_local_new = self.run_tracker_update_execution_phase(
            frame_idx=frame_idx,
            num_frames=num_frames,
            reverse=reverse,
            det_out=det_out,
            tracker_states_local=tracker_states_local,
            tracker_update_plan=tracker_update_plan,
            orig_vid_height=orig_vid_height,
            orig_vid_width=orig_vid_width,
            feature_cache=feature_cache,
        )

        # Step 5: the outputs of this frame
        obj_id_to_mask = self.build_outputs(
            frame_idx=frame_idx,
            num_frames=num_frames,
            reverse=reverse,
            det_out=det_out,
            tracker_low_res_masks_global=tracker_low_res_masks_global,
            tracker_obj_scores_global=tracker_obj_scores_global,
            tracker_metadata_prev=tracker_metadata_prev,
            tracker_update_plan=tracker_update_plan,
            orig_vid_height=orig_vid_height,
            orig_vid_width=orig_vid_width,
            reconditioned_obj_ids=reconditioned_obj_ids,
            det_to_matched_trk_obj_ids=det_to_matched_trk_obj_ids,
        )
        obj_id_to_score = tracker_metadata_new["obj_id_to_score"]
        frame_stats = {
            "num_obj_tracked": np.sum(tracker_metadata_new["num_obj_per_gpu"]),
            "num_obj_dropped": tracker_update_plan["num_obj_dropped_due_to_limit"],
        }
        # the tracker's scores (as probabilities) of the masklets propagated on this frame
        if tracker_obj_scores_global.shape[0] > 0:
            tracker_obj_scores_global = tracker_obj_scores_global.sigmoid().tolist()
            tracker_obj_ids = tracker_metadata_prev["obj_ids_all_gpu"]
            tracker_metadata_new["obj_id_to_tracker_score_frame_wise"][frame_idx].update(
                dict(zip(tracker_obj_ids, tracker_obj_scores_global, strict=True))
            )
        return (
            obj_id_to_mask,
            obj_id_to_score,
            tracker_states_local_new,
            tracker_metadata_new,
            frame_stats,
            tracker_obj_scores_global,
        )

    def _suppress_detections_close_to_boundary(
        self, boxes: paddle.Tensor, margin: float = 0.025
    ) -> paddle.Tensor:
        """Which of the normalized ``N x 4`` xyxy ``boxes`` have their centre at least
        ``margin`` inside the image (upstream ``_suppress_detections_close_to_boundary``)."""
        x_min, y_min, x_max, y_max = boxes.unbind(-1)
        x_c = (x_min + x_max) / 2
        y_c = (y_min + y_max) / 2
        return (x_c > margin) & (x_c < 1.0 - margin) & (y_c > margin) & (y_c < 1.0 - margin)

    @paddle.no_grad()
    def run_backbone_and_detection(
        self,
        frame_idx: int,
        num_frames: int,
        input_batch: Any,
        geometric_prompt: Any,
        feature_cache: dict,
        reverse: bool,
        allow_new_detections: bool,
    ) -> dict[str, paddle.Tensor]:
        """The detector on a frame (upstream ``run_backbone_and_detection``) -> ``det_out``
        (``bbox`` xyxy normalized, ``mask`` low-res logits, ``scores`` probabilities) of the
        detections above ``score_threshold_detection`` after NMS. Caches the text features
        and the tracker's backbone features of the frame in ``feature_cache`` (evicting the
        previous frame's)."""
        # Step 1: the text features, cached for the most recent prompt
        text_batch_key = tuple(input_batch.find_text_batch)
        if "text" not in feature_cache or text_batch_key not in feature_cache["text"]:
            text_outputs = self.detector.backbone.forward_text(input_batch.find_text_batch)
            feature_cache["text"] = {text_batch_key: text_outputs}
        else:
            text_outputs = feature_cache["text"][text_batch_key]

        # Step 2: backbone, detector and NMS
        if "multigpu_buffer" not in feature_cache:
            feature_cache["multigpu_buffer"] = {}
        tracking_bounds = feature_cache.get("tracking_bounds", {})
        max_frame_num_to_track = tracking_bounds.get("max_frame_num_to_track")
        start_frame_idx = tracking_bounds.get("propagate_in_video_start_frame_idx")

        sam3_image_out, _ = self.detector.forward_video_grounding_multigpu(
            backbone_out={"img_batch_all_stages": input_batch.img_batch, **text_outputs},
            find_inputs=input_batch.find_inputs,
            geometric_prompt=geometric_prompt,
            frame_idx=frame_idx,
            num_frames=num_frames,
            multigpu_buffer=feature_cache["multigpu_buffer"],
            track_in_reverse=reverse,
            return_tracker_backbone_feats=True,
            run_nms=self.det_nms_thresh > 0.0,
            nms_prob_thresh=self.score_threshold_detection,
            nms_iou_thresh=self.det_nms_thresh,
            max_frame_num_to_track=max_frame_num_to_track,
            propagate_in_video_start_frame_idx=start_frame_idx,
        )
        pred_probs = sam3_image_out["pred_logits"].squeeze(-1).sigmoid()
        if not allow_new_detections:
            pred_probs = pred_probs - 1e8  # make sure no detections are kept
        pred_boxes_xyxy = sam3_image_out["pred_boxes_xyxy"]
        pred_masks = sam3_image_out["pred_masks"]
        # the positive detections, in row-major order of (prompt, query) as torch.where
        thresh = paddle.full_like(pred_probs, self.score_threshold_detection)
        pos = np.nonzero((pred_probs > thresh).numpy())
        flat = pos[0] * pred_probs.shape[1] + pos[1]
        num_queries = pred_probs.shape[0] * pred_probs.shape[1]
        det_out = {
            "bbox": _index(pred_boxes_xyxy.reshape([num_queries, 4]), flat),
            "mask": _index(pred_masks.reshape([num_queries, *pred_masks.shape[2:]]), flat),
            "scores": _index(pred_probs.reshape([num_queries]), flat),
        }

        # Step 3: the tracker's backbone features, cached per frame. Upstream applies
        # conv_s0 / conv_s1 to the bfloat16 features under CUDA autocast; in float32 they
        # are cast back first (their values stay those rounded to bfloat16).
        sam_mask_decoder = self.tracker.sam_mask_decoder
        tracker_backbone_fpn = [
            sam_mask_decoder.conv_s0(sam3_image_out["tracker_backbone_fpn_0"].astype("float32")),
            sam_mask_decoder.conv_s1(sam3_image_out["tracker_backbone_fpn_1"].astype("float32")),
            sam3_image_out["tracker_backbone_fpn_2"].astype("float32"),  # no conv
        ]
        tracker_backbone_out = {
            "vision_features": tracker_backbone_fpn[-1],
            "vision_pos_enc": sam3_image_out["tracker_backbone_pos_enc"],
            "backbone_fpn": tracker_backbone_fpn,
        }
        feature_cache[frame_idx] = (
            input_batch.img_batch[frame_idx],
            {"tracker_backbone_out": tracker_backbone_out},
        )
        # remove the previous frame's features
        feature_cache.pop(frame_idx - 1 if not reverse else frame_idx + 1, None)
        return det_out

    def run_tracker_propagation(
        self,
        frame_idx: int,
        num_frames: int,
        reverse: bool,
        tracker_states_local: list[Any],
        tracker_metadata_prev: dict[str, Any],
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """The masklets propagated to ``frame_idx`` (upstream ``run_tracker_propagation``)
        -> ``(low_res_masks N x H x W, object score logits N)``, in the order of
        ``obj_ids_all_gpu``; no memory is encoded yet."""
        obj_ids_local, low_res_masks_local, obj_scores_local = (
            self._propogate_tracker_one_frame_local_gpu(
                tracker_states_local, frame_idx=frame_idx, reverse=reverse
            )
        )
        expected = tracker_metadata_prev["obj_ids_per_gpu"][self.rank]
        if len(obj_ids_local) != len(expected) or not np.all(np.asarray(obj_ids_local) == expected):
            raise RuntimeError(f"tracked objects {obj_ids_local} != metadata {expected}")
        # one process: the local masklets are the global ones (no all-gather)
        return low_res_masks_local, obj_scores_local

    def _recondition_masklets(
        self,
        frame_idx: int,
        det_out: dict[str, paddle.Tensor],
        trk_id_to_max_iou_high_conf_det: dict[int, int],
        tracker_states_local: list[Any],
        tracker_metadata: dict[str, Any],
        tracker_obj_scores_global: paddle.Tensor,
    ) -> list[Any]:
        """Re-prompt confident masklets with their matched detection's mask (upstream
        ``_recondition_masklets``)."""
        for trk_obj_id, det_idx in trk_id_to_max_iou_high_conf_det.items():
            new_mask = det_out["mask"][det_idx : det_idx + 1]
            input_mask_res = self.tracker.input_mask_size
            size = (input_mask_res, input_mask_res)
            new_mask_binary = resize_bilinear(new_mask.unsqueeze(1), size).squeeze(1)[0] > 0
            HIGH_CONF_THRESH = 0.8
            reconditioned_states_idx = set()
            obj_idx = np.where(tracker_metadata["obj_ids_all_gpu"] == trk_obj_id)[0].item()
            obj_score = float(tracker_obj_scores_global[obj_idx])
            for state_idx, inference_state in enumerate(tracker_states_local):
                if trk_obj_id in inference_state["obj_ids"] and obj_score > HIGH_CONF_THRESH:
                    logger.debug(
                        f"Adding new mask for track {trk_obj_id} at frame {frame_idx}. Objects "
                        f"{inference_state['obj_ids']} are all reconditioned."
                    )
                    self.tracker.add_new_mask(
                        inference_state=inference_state,
                        frame_idx=frame_idx,
                        obj_id=trk_obj_id,
                        mask=new_mask_binary,
                    )
                    reconditioned_states_idx.add(state_idx)
            for idx in reconditioned_states_idx:
                self.tracker.propagate_in_video_preflight(
                    tracker_states_local[idx], run_mem_encoder=True
                )
        return tracker_states_local

    def run_tracker_update_planning_phase(
        self,
        frame_idx: int,
        num_frames: int,
        reverse: bool,
        det_out: dict[str, paddle.Tensor],
        tracker_low_res_masks_global: paddle.Tensor,
        tracker_obj_scores_global: paddle.Tensor,
        tracker_metadata_prev: dict[str, Any],
        tracker_states_local: list[Any],
        is_image_only: bool = False,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Decide which objects to add, remove and suppress, recondition masklets if due,
        and encode the memories of the propagated masklets (upstream
        ``run_tracker_update_planning_phase``) -> ``(tracker_update_plan,
        tracker_metadata_new)``."""
        tracker_metadata_new = {
            "obj_ids_per_gpu": deepcopy(tracker_metadata_prev["obj_ids_per_gpu"]),
            "obj_ids_all_gpu": None,  # will be filled later
            "num_obj_per_gpu": deepcopy(tracker_metadata_prev["num_obj_per_gpu"]),
            "obj_id_to_score": deepcopy(tracker_metadata_prev["obj_id_to_score"]),
            "obj_id_to_tracker_score_frame_wise": deepcopy(
                tracker_metadata_prev["obj_id_to_tracker_score_frame_wise"]
            ),
            "obj_id_to_last_occluded": {},  # will be filled later
            "max_obj_id": deepcopy(tracker_metadata_prev["max_obj_id"]),
        }
        reconditioned_obj_ids: set = set()

        # Step 1: the update plan and its heuristics
        det_mask_preds: paddle.Tensor = det_out["mask"]  # low-res mask logits
        det_scores_np: np.ndarray = det_out["scores"].astype("float32").numpy()
        det_bbox_xyxy: paddle.Tensor = det_out["bbox"]
        # a) match detector and tracker masks and find new objects
        (
            new_det_fa_inds,
            unmatched_trk_obj_ids,
            det_to_matched_trk_obj_ids,
            trk_id_to_max_iou_high_conf_det,
            empty_trk_obj_ids,
        ) = self._associate_det_trk(
            det_masks=det_mask_preds,
            det_scores_np=det_scores_np,
            trk_masks=tracker_low_res_masks_global,
            trk_obj_ids=tracker_metadata_prev["obj_ids_all_gpu"],
        )
        if self.suppress_det_close_to_boundary and len(new_det_fa_inds) > 0:
            keep = self._suppress_detections_close_to_boundary(
                _index(det_bbox_xyxy, new_det_fa_inds)
            )
            new_det_fa_inds = new_det_fa_inds[keep.numpy()]

        # the maximum number of objects: drop the lowest-scoring new detections beyond it
        prev_obj_num = np.sum(tracker_metadata_prev["num_obj_per_gpu"])
        new_det_num = len(new_det_fa_inds)
        num_obj_dropped_due_to_limit = 0
        if not is_image_only and prev_obj_num + new_det_num > self.max_num_objects:
            logger.warning(
                f"hitting {self.max_num_objects=} with {new_det_num=} and {prev_obj_num=}"
            )
            new_det_num_to_keep = self.max_num_objects - prev_obj_num
            num_obj_dropped_due_to_limit = new_det_num - new_det_num_to_keep
            new_det_fa_inds = self._drop_new_det_with_obj_limit(
                new_det_fa_inds, det_scores_np, new_det_num_to_keep
            )
            new_det_num = len(new_det_fa_inds)

        # object ids of the new detections (and their "GPU": always rank 0 here)
        new_det_start_obj_id = tracker_metadata_prev["max_obj_id"] + 1
        new_det_obj_ids = new_det_start_obj_id + np.arange(new_det_num)
        prev_workload_per_gpu = tracker_metadata_prev["num_obj_per_gpu"]
        new_det_gpu_ids = self._assign_new_det_to_gpus(
            new_det_num=new_det_num, prev_workload_per_gpu=prev_workload_per_gpu
        )

        # b) hot-start heuristics to remove objects
        rank0_metadata_new = deepcopy(tracker_metadata_prev["rank0_metadata"])
        if self._warm_up_is_complete():
            obj_ids_newly_removed, rank0_metadata_new = self._process_hotstart(
                frame_idx=frame_idx,
                num_frames=num_frames,
                reverse=reverse,
                det_to_matched_trk_obj_ids=det_to_matched_trk_obj_ids,
                new_det_obj_ids=new_det_obj_ids,
                empty_trk_obj_ids=empty_trk_obj_ids,
                unmatched_trk_obj_ids=unmatched_trk_obj_ids,
                rank0_metadata=rank0_metadata_new,
                tracker_metadata=tracker_metadata_prev,
            )
        else:
            obj_ids_newly_removed = set()
        tracker_metadata_new["rank0_metadata"] = rank0_metadata_new

        # Step 2 (upstream: broadcast the plan to the other GPUs): one process, nothing to do
        tracker_update_plan = {
            "new_det_fa_inds": new_det_fa_inds,
            "new_det_obj_ids": new_det_obj_ids,
            "new_det_gpu_ids": new_det_gpu_ids,
            "unmatched_trk_obj_ids": unmatched_trk_obj_ids,
            "det_to_matched_trk_obj_ids": det_to_matched_trk_obj_ids,
            "obj_ids_newly_removed": obj_ids_newly_removed,
            "num_obj_dropped_due_to_limit": num_obj_dropped_due_to_limit,
            "trk_id_to_max_iou_high_conf_det": trk_id_to_max_iou_high_conf_det,
            "reconditioned_obj_ids": reconditioned_obj_ids,
        }

        # Step 3 (optional): recondition masklets on confident detections, before memory
        # encoding; first those whose box disagrees with their matched detection's
        should_recondition_iou = False
        if self.reconstruction_bbox_iou_thresh > 0 and len(trk_id_to_max_iou_high_conf_det) > 0:
            for trk_obj_id, det_idx in trk_id_to_max_iou_high_conf_det.items():
                det_box = det_out["bbox"][det_idx]
                det_score = float(det_out["scores"][det_idx])
                try:
                    trk_idx = list(tracker_metadata_prev["obj_ids_all_gpu"]).index(trk_obj_id)
                except ValueError:
                    continue  # skip if the tracklet is not found
                tracker_mask = tracker_low_res_masks_global[trk_idx]
                mask_binary = tracker_mask > 0
                if int(mask_binary.astype("int64").sum()) == 0:
                    continue  # skip tracklets with zero mask area
                tracker_box_pixels = mask_to_box(mask_binary.unsqueeze(0).unsqueeze(0))[0, 0]
                mask_height, mask_width = tracker_mask.shape[-2:]
                scale = paddle.to_tensor(
                    [mask_width, mask_height, mask_width, mask_height], "float32"
                )
                tracker_box_normalized = tracker_box_pixels.astype("float32") / scale
                iou = float(
                    fast_diag_box_iou(det_box.unsqueeze(0), tracker_box_normalized.unsqueeze(0))[0]
                )
                if (
                    iou < self.reconstruction_bbox_iou_thresh
                    and det_score >= self.reconstruction_bbox_det_score
                ):
                    should_recondition_iou = True
                    reconditioned_obj_ids.add(trk_obj_id)

        should_recondition_periodic = (
            self.recondition_every_nth_frame > 0
            and frame_idx % self.recondition_every_nth_frame == 0
            and len(trk_id_to_max_iou_high_conf_det) > 0
        )
        if should_recondition_periodic or should_recondition_iou:
            self._recondition_masklets(
                frame_idx,
                det_out,
                trk_id_to_max_iou_high_conf_det,
                tracker_states_local,
                tracker_metadata_prev,
                tracker_obj_scores_global,
            )

        # Step 4: encode the memories of the current frame's propagated masks
        batch_size = tracker_low_res_masks_global.shape[0]
        if batch_size > 0:
            if (
                self._warm_up_is_complete()
                and self.suppress_overlapping_based_on_recent_occlusion_threshold > 0.0
            ):
                # NOTE: tracker_low_res_masks_global is updated in place, then returned
                tracker_low_res_masks_global = self._suppress_overlapping_based_on_recent_occlusion(
                    frame_idx,
                    tracker_low_res_masks_global,
                    tracker_metadata_prev,
                    tracker_metadata_new,
                    obj_ids_newly_removed,
                    reverse,
                )
            self._tracker_update_memories(
                tracker_states_local,
                frame_idx,
                tracker_metadata=tracker_metadata_prev,
                low_res_masks=tracker_low_res_masks_global,
            )

        # Step 5: the new metadata
        for rank in range(self.world_size):
            new_det_obj_ids_this_gpu = new_det_obj_ids[new_det_gpu_ids == rank]
            updated_obj_ids_this_gpu = tracker_metadata_new["obj_ids_per_gpu"][rank]
            if len(new_det_obj_ids_this_gpu) > 0:
                updated_obj_ids_this_gpu = np.concatenate(
                    [updated_obj_ids_this_gpu, new_det_obj_ids_this_gpu]
                )
            if len(obj_ids_newly_removed) > 0:
                is_removed = np.isin(updated_obj_ids_this_gpu, list(obj_ids_newly_removed))
                updated_obj_ids_this_gpu = updated_obj_ids_this_gpu[~is_removed]
            tracker_metadata_new["obj_ids_per_gpu"][rank] = updated_obj_ids_this_gpu
            tracker_metadata_new["num_obj_per_gpu"][rank] = len(updated_obj_ids_this_gpu)
        tracker_metadata_new["obj_ids_all_gpu"] = np.concatenate(
            tracker_metadata_new["obj_ids_per_gpu"]
        )
        # the scores of new objects and the maximum object id so far
        if len(new_det_obj_ids) > 0:
            tracker_metadata_new["obj_id_to_score"].update(
                zip(new_det_obj_ids, det_scores_np[new_det_fa_inds], strict=True)
            )
            # no tracker score for new objects: their detection score instead
            tracker_metadata_new["obj_id_to_tracker_score_frame_wise"][frame_idx].update(
                zip(new_det_obj_ids, det_scores_np[new_det_fa_inds], strict=True)
            )
            tracker_metadata_new["max_obj_id"] = max(
                tracker_metadata_new["max_obj_id"], np.max(new_det_obj_ids)
            )
        # removed objects keep a very low score (-1e4)
        for obj_id in obj_ids_newly_removed:
            tracker_metadata_new["obj_id_to_score"][obj_id] = -1e4
            tracker_metadata_new["obj_id_to_tracker_score_frame_wise"][frame_idx][obj_id] = -1e4
            tracker_metadata_new["obj_id_to_last_occluded"].pop(obj_id, None)
        if self.masklet_confirmation_enable:
            rank0_metadata = self.update_masklet_confirmation_status(
                rank0_metadata=tracker_metadata_new["rank0_metadata"],
                obj_ids_all_gpu_prev=tracker_metadata_prev["obj_ids_all_gpu"],
                obj_ids_all_gpu_updated=tracker_metadata_new["obj_ids_all_gpu"],
                det_to_matched_trk_obj_ids=det_to_matched_trk_obj_ids,
                new_det_obj_ids=new_det_obj_ids,
            )
            tracker_metadata_new["rank0_metadata"] = rank0_metadata
        return tracker_update_plan, tracker_metadata_new

    def _suppress_overlapping_based_on_recent_occlusion(
        self,
        frame_idx: int,
        tracker_low_res_masks_global: paddle.Tensor,
        tracker_metadata_prev: dict[str, Any],
        tracker_metadata_new: dict[str, Any],
        obj_ids_newly_removed: set[int],
        reverse: bool = False,
    ) -> paddle.Tensor:
        """Of two overlapping masklets, suppress the one occluded most recently (an object
        removed by hot-start always); records each object's last occluded frame in
        ``tracker_metadata_new`` (upstream ``_suppress_overlapping_based_on_recent_occlusion``).
        The suppressed masks are set to -10 in ``tracker_low_res_masks_global`` in place."""
        obj_ids_global = tracker_metadata_prev["obj_ids_all_gpu"]
        binary_tracker_low_res_masks_global = tracker_low_res_masks_global > 0
        batch_size = tracker_low_res_masks_global.shape[0]
        if batch_size > 0:
            if len(obj_ids_global) != batch_size:
                raise RuntimeError(
                    f"Mismatch in number of objects: {len(obj_ids_global)} vs {batch_size}"
                )
            NEVER_OCCLUDED = -1
            ALWAYS_OCCLUDED = 100000  # larger than any frame index: removed by hot-start
            last_occluded_prev = paddle.concat(
                [
                    tracker_metadata_prev["obj_id_to_last_occluded"].get(
                        obj_id,
                        paddle.full(
                            [1],
                            NEVER_OCCLUDED
                            if obj_id not in obj_ids_newly_removed
                            else ALWAYS_OCCLUDED,
                            dtype="int64",
                        ),
                    )
                    for obj_id in obj_ids_global
                ],
                axis=0,
            )
            to_suppress = self._get_objects_to_suppress_based_on_most_recently_occluded(
                binary_tracker_low_res_masks_global,
                last_occluded_prev,
                obj_ids_global,
                frame_idx,
                reverse,
            )
            # the occlusion information
            is_obj_occluded = ~(binary_tracker_low_res_masks_global.any(axis=[-1, -2]))
            is_obj_occluded_or_suppressed = is_obj_occluded | to_suppress
            last_occluded_new = paddle.where(
                is_obj_occluded_or_suppressed,
                paddle.full_like(last_occluded_prev, frame_idx),
                last_occluded_prev,
            )
            tracker_metadata_new["obj_id_to_last_occluded"] = {
                obj_id: last_occluded_new[obj_idx : obj_idx + 1]
                for obj_idx, obj_id in enumerate(obj_ids_global)
            }
            # suppressed masks set to "no object" before memory encoding (in place)
            NO_OBJ_LOGIT = -10
            if bool(to_suppress.any()):
                tracker_low_res_masks_global[to_suppress] = float(NO_OBJ_LOGIT)
        return tracker_low_res_masks_global

    def run_tracker_update_execution_phase(
        self,
        frame_idx: int,
        num_frames: int,
        reverse: bool,
        det_out: dict[str, paddle.Tensor],
        tracker_states_local: list[Any],
        tracker_update_plan: dict[str, Any],
        orig_vid_height: int,
        orig_vid_width: int,
        feature_cache: dict,
    ) -> list[Any]:
        """Add the new detections to the tracker (one new inference state for this frame's
        objects) and remove the objects the heuristics removed (upstream
        ``run_tracker_update_execution_phase``) -> the updated inference states."""
        new_det_fa_inds: np.ndarray = tracker_update_plan["new_det_fa_inds"]
        new_det_obj_ids: np.ndarray = tracker_update_plan["new_det_obj_ids"]
        new_det_gpu_ids: np.ndarray = tracker_update_plan["new_det_gpu_ids"]
        is_on_this_gpu: np.ndarray = new_det_gpu_ids == self.rank
        new_det_obj_ids_local: np.ndarray = new_det_obj_ids[is_on_this_gpu]
        new_det_fa_inds_local: np.ndarray = new_det_fa_inds[is_on_this_gpu]
        obj_ids_newly_removed: set[int] = tracker_update_plan["obj_ids_newly_removed"]

        # Step 1: add new objects from the detector to the tracker
        if len(new_det_fa_inds_local) > 0:
            new_det_masks = _index(det_out["mask"], new_det_fa_inds_local)
            tracker_states_local = self._tracker_add_new_objects(
                frame_idx=frame_idx,
                num_frames=num_frames,
                new_obj_ids=new_det_obj_ids_local,
                new_obj_masks=new_det_masks,
                tracker_states_local=tracker_states_local,
                orig_vid_height=orig_vid_height,
                orig_vid_width=orig_vid_width,
                feature_cache=feature_cache,
            )

        # Step 2: remove the objects removed by the heuristics
        if len(obj_ids_newly_removed) > 0:
            self._tracker_remove_objects(tracker_states_local, obj_ids_newly_removed)
        return tracker_states_local

    def build_outputs(
        self,
        frame_idx: int,
        num_frames: int,
        reverse: bool,
        det_out: dict[str, paddle.Tensor],
        tracker_low_res_masks_global: paddle.Tensor,
        tracker_obj_scores_global: paddle.Tensor,
        tracker_metadata_prev: dict[str, Any],
        tracker_update_plan: dict[str, Any],
        orig_vid_height: int,
        orig_vid_width: int,
        reconditioned_obj_ids: set | None = None,
        det_to_matched_trk_obj_ids: dict | None = None,
    ) -> dict[Any, paddle.Tensor]:
        """``obj_id -> bool 1 x H_video x W_video`` masks of the frame (upstream
        ``build_outputs``): the propagated masklets, the new detections (holes filled) and,
        for reconditioned masklets, their detection's mask."""
        new_det_fa_inds: np.ndarray = tracker_update_plan["new_det_fa_inds"]
        new_det_obj_ids: np.ndarray = tracker_update_plan["new_det_obj_ids"]
        obj_id_to_mask = {}
        video_size = (orig_vid_height, orig_vid_width)

        # Part 1: masks from the tracker's propagation
        existing_masklet_obj_ids = tracker_metadata_prev["obj_ids_all_gpu"]
        existing_masklet_video_res_masks = _resize(
            tracker_low_res_masks_global.unsqueeze(1), video_size
        )
        existing_masklet_binary = existing_masklet_video_res_masks > 0
        if len(existing_masklet_obj_ids) != existing_masklet_binary.shape[0]:
            raise RuntimeError("masklets and object ids differ in number")
        for i, obj_id in enumerate(existing_masklet_obj_ids):
            obj_id_to_mask[obj_id] = existing_masklet_binary[i]

        # Part 2: masks from new detections
        new_det_low_res_masks = _index(det_out["mask"], new_det_fa_inds).unsqueeze(1)
        if new_det_low_res_masks.shape[0] > 0:
            new_det_low_res_masks = fill_holes_in_mask_scores(
                new_det_low_res_masks,
                max_area=self.fill_hole_area,
                fill_holes=True,
                remove_sprinkles=True,
            )
        new_masklet_binary = _resize(new_det_low_res_masks, video_size) > 0
        if len(new_det_obj_ids) != new_masklet_binary.shape[0]:
            raise RuntimeError("new masklets and object ids differ in number")
        for i, obj_id in enumerate(new_det_obj_ids):
            obj_id_to_mask[obj_id] = new_masklet_binary[i]

        # Part 3: reconditioned objects take their detection's mask
        if reconditioned_obj_ids is not None and len(reconditioned_obj_ids) > 0:
            trk_id_to_max_iou_high_conf_det = tracker_update_plan.get(
                "trk_id_to_max_iou_high_conf_det", {}
            )
            for obj_id in reconditioned_obj_ids:
                det_idx = trk_id_to_max_iou_high_conf_det.get(obj_id)
                if det_idx is not None:
                    det_mask = det_out["mask"][det_idx].unsqueeze(0).unsqueeze(0)
                    det_mask_resized = _resize(det_mask.astype("float32"), video_size) > 0
                    obj_id_to_mask[obj_id] = det_mask_resized.squeeze(0)
        return obj_id_to_mask

    def _get_objects_to_suppress_based_on_most_recently_occluded(
        self,
        binary_low_res_masks: paddle.Tensor,
        last_occluded: paddle.Tensor,
        obj_ids: Any,
        frame_idx: int | None = None,
        reverse: bool = False,
    ) -> paddle.Tensor:
        """Which of the overlapping masklets (mask IoU at least
        ``suppress_overlapping_based_on_recent_occlusion_threshold``) to suppress: of each
        pair, the one occluded more recently, if the other was ever occluded (upstream
        ``_get_objects_to_suppress_based_on_most_recently_occluded``)."""
        if binary_low_res_masks.dtype != paddle.bool:
            raise TypeError(f"Expected boolean tensor, got {binary_low_res_masks.dtype}")
        n = binary_low_res_masks.shape[0]
        to_suppress = paddle.zeros([n], dtype="bool")
        if len(obj_ids) <= 1:
            return to_suppress

        iou = mask_iou(binary_low_res_masks, binary_low_res_masks)  # [N, N]
        mask_iou_thresh = iou >= self.suppress_overlapping_based_on_recent_occlusion_threshold
        overlapping_pairs = paddle.triu(mask_iou_thresh.astype("int32"), diagonal=1).astype("bool")
        last_occ_expanded_i = last_occluded.unsqueeze(1)  # (N, 1)
        last_occ_expanded_j = last_occluded.unsqueeze(0)  # (1, N)
        # suppress the most recently occluded
        cmp_op = paddle.greater_than if not reverse else paddle.less_than
        suppress_i_mask = (
            overlapping_pairs
            & cmp_op(last_occ_expanded_i, last_occ_expanded_j)
            & (last_occ_expanded_j > -1)  # j can suppress i only if i was previously occluded
        )
        suppress_j_mask = (
            overlapping_pairs
            & cmp_op(last_occ_expanded_j, last_occ_expanded_i)
            & (last_occ_expanded_i > -1)  # i can suppress j only if j was previously occluded
        )
        to_suppress = suppress_i_mask.any(axis=1) | suppress_j_mask.any(axis=0)

        if logger.isEnabledFor(logging.DEBUG) and frame_idx is not None:
            si, sj = suppress_i_mask.numpy(), suppress_j_mask.numpy()
            occ = last_occluded.numpy()
            for i, j in zip(*np.nonzero(si), strict=True):
                logger.debug(
                    f"{frame_idx=}: Suppressing obj {obj_ids[i]} last occluded {occ[i]} in "
                    f"favor of {obj_ids[j]} last occluded {occ[j]}"
                )
            for i, j in zip(*np.nonzero(sj), strict=True):
                logger.debug(
                    f"{frame_idx=}: Suppressing obj {obj_ids[j]} last occluded {occ[j]} in "
                    f"favor of {obj_ids[i]} last occluded {occ[i]}"
                )
        return to_suppress

    def _propogate_tracker_one_frame_local_gpu(
        self,
        inference_states: list[Any],
        frame_idx: int,
        reverse: bool,
        run_mem_encoder: bool = False,
    ) -> tuple[list, paddle.Tensor, paddle.Tensor]:
        """Propagate every inference state by one frame (upstream
        ``_propogate_tracker_one_frame_local_gpu``, its spelling kept) -> ``(obj_ids,
        low_res_masks N x H x W with holes filled, object score logits N)``."""
        obj_ids_local = []
        low_res_masks_list = []
        obj_scores_list = []
        for inference_state in inference_states:
            if len(inference_state["obj_ids"]) == 0:
                continue  # skip propagation on empty inference states
            num_frames_propagated = 0
            for out in self.tracker.propagate_in_video(
                inference_state,
                start_frame_idx=frame_idx,
                # end frame = start + 0: one frame (the end is inclusive)
                max_frame_num_to_track=0,
                reverse=reverse,
                tqdm_disable=True,
                run_mem_encoder=run_mem_encoder,
            ):
                out_frame_idx, out_obj_ids, out_low_res_masks, _, out_obj_scores = out
                num_frames_propagated += 1
            if num_frames_propagated != 1 or out_frame_idx != frame_idx:
                raise RuntimeError(
                    f"num_frames_propagated: {num_frames_propagated}, out_frame_idx: "
                    f"{out_frame_idx}, frame_idx: {frame_idx}"
                )
            obj_ids_local.extend(out_obj_ids)
            low_res_masks_list.append(out_low_res_masks.squeeze(1))
            obj_scores_list.append(out_obj_scores.squeeze(1))

        H_mask = W_mask = self.tracker.low_res_mask_size
        if len(low_res_masks_list) > 0:
            low_res_masks_local = paddle.concat(low_res_masks_list, axis=0)
            obj_scores_local = paddle.concat(obj_scores_list, axis=0)
            if tuple(low_res_masks_local.shape[1:]) != (H_mask, W_mask):
                raise RuntimeError(f"unexpected mask size {low_res_masks_local.shape}")
            low_res_masks_local = fill_holes_in_mask_scores(
                low_res_masks_local.unsqueeze(1),
                max_area=self.fill_hole_area,
                fill_holes=True,
                remove_sprinkles=True,
            ).squeeze(1)
        else:
            low_res_masks_local = paddle.zeros([0, H_mask, W_mask], dtype="float32")
            obj_scores_local = paddle.zeros([0], dtype="float32")
        return obj_ids_local, low_res_masks_local, obj_scores_local

    def _associate_det_trk(
        self,
        det_masks: paddle.Tensor,
        det_scores_np: np.ndarray,
        trk_masks: paddle.Tensor,
        trk_obj_ids: np.ndarray,
    ):
        """Match this frame's detections with the masklets by mask IoU (upstream
        ``_associate_det_trk``).

        ``det_masks`` ``N x H x W`` and ``trk_masks`` ``M x H x W`` are mask logits (not
        binarized); ``det_scores_np`` ``(N,)``; ``trk_obj_ids`` ``(M,)``. Returns
        ``(new_det_fa_inds, unmatched_trk_obj_ids, det_to_matched_trk_obj_ids,
        trk_id_to_max_iou_high_conf_det, empty_trk_obj_ids)``: the indices of the new
        detections, the non-empty masklets no detection matches, detection index -> the
        masklets it matches, masklet -> the one confident detection matching it closely, and
        the masklets with an empty mask. With ``o2o_matching_masklets_enable`` masklets are
        matched one-to-one by Hungarian matching (``scipy.optimize.linear_sum_assignment``,
        imported then only, as upstream)."""
        iou_threshold = self.assoc_iou_thresh
        iou_threshold_trk = self.trk_assoc_iou_thresh
        new_det_thresh = self.new_det_thresh

        if not det_masks.is_floating_point() or not trk_masks.is_floating_point():
            raise TypeError("float tensor expected (do not binarize)")
        if trk_masks.shape[0] != len(trk_obj_ids):
            raise ValueError(
                "trk_masks and trk_obj_ids should have the same length, "
                f"{trk_masks.shape[0]} vs {len(trk_obj_ids)}"
            )
        if trk_masks.shape[0] == 0:
            # all detections are new
            return (
                np.arange(det_masks.shape[0]),
                np.array([], np.int64),
                {},
                {},
                np.array([], np.int64),
            )
        elif det_masks.shape[0] == 0:
            # all previous tracklets are unmatched if they have a non-zero area
            trk_is_nonempty = (trk_masks > 0).any(axis=[1, 2]).numpy()
            return (
                np.array([], np.int64),
                trk_obj_ids[trk_is_nonempty],
                {},
                {},
                trk_obj_ids[~trk_is_nonempty],
            )

        if tuple(det_masks.shape[-2:]) != tuple(trk_masks.shape[-2:]):
            # resize to the smaller size
            if np.prod(det_masks.shape[-2:]) < np.prod(trk_masks.shape[-2:]):
                trk_masks = resize_bilinear(trk_masks.unsqueeze(1), det_masks.shape[-2:]).squeeze(1)
            else:
                det_masks = resize_bilinear(det_masks.unsqueeze(1), trk_masks.shape[-2:]).squeeze(1)

        det_masks_binary = det_masks > 0
        trk_masks_binary = trk_masks > 0
        ious = mask_iou(det_masks_binary, trk_masks_binary)  # (N, M)

        ious_np = ious.numpy()
        if self.o2o_matching_masklets_enable:
            from scipy.optimize import linear_sum_assignment

            # Hungarian matching for tracks (each track matches at most one detection)
            cost_matrix = 1 - ious_np
            row_ind, col_ind = linear_sum_assignment(cost_matrix)
            trk_is_matched = np.zeros(trk_masks.shape[0], dtype=bool)
            for d, t in zip(row_ind, col_ind, strict=True):
                if ious_np[d, t] >= iou_threshold_trk:
                    trk_is_matched[t] = True
        else:
            trk_is_matched = (ious_np >= iou_threshold_trk).any(axis=0)
        # non-empty tracks not matched above the threshold are unmatched
        trk_is_nonempty = trk_masks_binary.any(axis=[1, 2]).numpy()
        trk_is_unmatched = np.logical_and(trk_is_nonempty, ~trk_is_matched)
        unmatched_trk_obj_ids = trk_obj_ids[trk_is_unmatched]
        empty_trk_obj_ids = trk_obj_ids[~trk_is_nonempty]

        # a detection is new if it matches no track above the threshold (many-to-one)
        is_new_det = np.logical_and(
            det_scores_np >= new_det_thresh,
            np.logical_not(np.any(ious_np >= iou_threshold, axis=1)),
        )
        new_det_fa_inds = np.nonzero(is_new_det)[0]

        det_to_matched_trk_obj_ids = {}
        trk_id_to_max_iou_high_conf_det = {}  # trk id --> exactly one detection idx
        HIGH_CONF_THRESH = 0.8
        HIGH_IOU_THRESH = 0.8
        det_to_max_iou_trk_idx = np.argmax(ious_np, axis=1)
        det_is_high_conf = (det_scores_np >= HIGH_CONF_THRESH) & ~is_new_det
        det_is_high_iou = np.max(ious_np, axis=1) >= HIGH_IOU_THRESH
        det_is_high_conf_and_iou = set(np.nonzero(det_is_high_conf & det_is_high_iou)[0])
        for d in range(det_masks.shape[0]):
            det_to_matched_trk_obj_ids[d] = trk_obj_ids[ious_np[d, :] >= iou_threshold]
            if d in det_is_high_conf_and_iou:
                trk_obj_id = trk_obj_ids[det_to_max_iou_trk_idx[d]].item()
                trk_id_to_max_iou_high_conf_det[trk_obj_id] = d

        return (
            new_det_fa_inds,
            unmatched_trk_obj_ids,
            det_to_matched_trk_obj_ids,
            trk_id_to_max_iou_high_conf_det,
            empty_trk_obj_ids,
        )

    def _assign_new_det_to_gpus(
        self, new_det_num: int, prev_workload_per_gpu: np.ndarray
    ) -> np.ndarray:
        """The least-loaded GPU for each new object (upstream ``_assign_new_det_to_gpus``;
        all zeros with one process)."""
        workload_per_gpu: np.ndarray = prev_workload_per_gpu.copy()
        new_det_gpu_ids = np.zeros(new_det_num, np.int64)
        for i in range(len(new_det_gpu_ids)):
            min_gpu = np.argmin(workload_per_gpu)
            new_det_gpu_ids[i] = min_gpu
            workload_per_gpu[min_gpu] += 1
        return new_det_gpu_ids

    def _process_hotstart(
        self,
        frame_idx: int,
        num_frames: int,
        reverse: bool,
        det_to_matched_trk_obj_ids: dict[int, np.ndarray],
        new_det_obj_ids: np.ndarray,
        empty_trk_obj_ids: np.ndarray,
        unmatched_trk_obj_ids: np.ndarray,
        rank0_metadata: dict[str, Any],
        tracker_metadata: dict[str, Any],
    ) -> tuple[set, dict[str, Any]]:
        """Hot-start heuristics (upstream ``_process_hotstart``): remove masklets that start
        within the hot-start window and stay unmatched, or duplicate an earlier masklet, for
        too many frames; update the keep-alive counters (suppressing long-unmatched
        masklets when ``suppress_unmatched_only_within_hotstart`` is off)."""
        obj_first_frame_idx = rank0_metadata["obj_first_frame_idx"]
        unmatched_frame_inds = rank0_metadata["unmatched_frame_inds"]
        trk_keep_alive = rank0_metadata["trk_keep_alive"]
        overlap_pair_to_frame_inds = rank0_metadata["overlap_pair_to_frame_inds"]
        removed_obj_ids = rank0_metadata["removed_obj_ids"]
        suppressed_obj_ids = rank0_metadata["suppressed_obj_ids"][frame_idx]

        obj_ids_newly_removed = set()
        hotstart_diff = (
            frame_idx - self.hotstart_delay if not reverse else frame_idx + self.hotstart_delay
        )

        # Step 1: the frame where each object first appears, and the keep-alive counters
        for obj_id in new_det_obj_ids:
            if obj_id not in obj_first_frame_idx:
                obj_first_frame_idx[obj_id] = frame_idx
            if obj_id in trk_keep_alive:
                raise RuntimeError(f"new object {obj_id} already has a keep-alive counter")
            trk_keep_alive[obj_id] = self.init_trk_keep_alive

        matched_trks = set()
        for matched_trks_per_det in det_to_matched_trk_obj_ids.values():
            matched_trks.update(matched_trks_per_det)
        for obj_id in matched_trks:
            trk_keep_alive[obj_id] = min(self.max_trk_keep_alive, trk_keep_alive[obj_id] + 1)
        for obj_id in unmatched_trk_obj_ids:
            unmatched_frame_inds[obj_id].append(frame_idx)
            trk_keep_alive[obj_id] = max(self.min_trk_keep_alive, trk_keep_alive[obj_id] - 1)
        if self.decrease_trk_keep_alive_for_empty_masklets:
            for obj_id in empty_trk_obj_ids:
                trk_keep_alive[obj_id] = max(self.min_trk_keep_alive, trk_keep_alive[obj_id] - 1)

        # Step 2: remove tracks unmatched for `hotstart_unmatch_thresh` frames within hot-start
        for obj_id, frame_indices in unmatched_frame_inds.items():
            if obj_id in removed_obj_ids or obj_id in obj_ids_newly_removed:
                continue  # skip if the object is already removed
            if len(frame_indices) >= self.hotstart_unmatch_thresh:
                is_within_hotstart = (
                    obj_first_frame_idx[obj_id] > hotstart_diff and not reverse
                ) or (obj_first_frame_idx[obj_id] < hotstart_diff and reverse)
                if is_within_hotstart:
                    obj_ids_newly_removed.add(obj_id)
                    logger.debug(
                        f"Removing object {obj_id} at frame {frame_idx} "
                        f"since it is unmatched for frames: {frame_indices}"
                    )
            if (
                trk_keep_alive[obj_id] <= 0  # not matched for too long
                and not self.suppress_unmatched_only_within_hotstart
                and obj_id not in removed_obj_ids
                and obj_id not in obj_ids_newly_removed
            ):
                logger.debug(
                    f"Suppressing object {obj_id} at frame {frame_idx}, due to being unmatched"
                )
                suppressed_obj_ids.add(obj_id)

        # Step 3: remove tracks overlapping another track for `hotstart_dup_thresh` frames
        # a) overlapping tracks: those matched to the same detection
        for _, matched_trk_obj_ids in det_to_matched_trk_obj_ids.items():
            if len(matched_trk_obj_ids) < 2:
                continue  # only detections matched to several masklets
            first_appear_obj_id = (
                min(matched_trk_obj_ids, key=lambda x: obj_first_frame_idx[x])
                if not reverse
                else max(matched_trk_obj_ids, key=lambda x: obj_first_frame_idx[x])
            )
            for obj_id in matched_trk_obj_ids:
                if obj_id != first_appear_obj_id:
                    key = (first_appear_obj_id, obj_id)
                    overlap_pair_to_frame_inds[key].append(frame_idx)

        # b) remove a masklet that starts within hot-start and overlaps an earlier one
        for (first_obj_id, obj_id), frame_indices in overlap_pair_to_frame_inds.items():
            if obj_id in removed_obj_ids or obj_id in obj_ids_newly_removed:
                continue  # skip if the object is already removed
            if (obj_first_frame_idx[obj_id] > hotstart_diff and not reverse) or (
                obj_first_frame_idx[obj_id] < hotstart_diff and reverse
            ):
                if len(frame_indices) >= self.hotstart_dup_thresh:
                    obj_ids_newly_removed.add(obj_id)
                    logger.debug(
                        f"Removing object {obj_id} at frame {frame_idx} since it overlaps "
                        f"with another track {first_obj_id} at frames: {frame_indices}"
                    )

        removed_obj_ids.update(obj_ids_newly_removed)
        return obj_ids_newly_removed, rank0_metadata

    def _tracker_update_memories(
        self,
        tracker_inference_states: list[Any],
        frame_idx: int,
        tracker_metadata: dict[str, Any],
        low_res_masks: paddle.Tensor,
    ) -> None:
        """Encode the memories of the frame's propagated masks, after the pixel-wise area
        shrinkage suppression across all masklets (upstream ``_tracker_update_memories``)."""
        if len(tracker_inference_states) == 0:
            return
        high_res_H, high_res_W = self.tracker.maskmem_backbone.mask_downsampler.interpol_size
        high_res_masks = resize_bilinear(low_res_masks.unsqueeze(1), (high_res_H, high_res_W))
        if self._warm_up_is_complete():
            high_res_masks = _suppress_object_pw_area_shrinkage(self.tracker, high_res_masks)
        # instead of the predicted object scores, whether the mask is non-empty
        is_nonempty = (high_res_masks > 0).any(axis=[-1, -2])
        object_score_logits = paddle.where(
            is_nonempty,
            paddle.full(is_nonempty.shape, 10.0, "float32"),
            paddle.full(is_nonempty.shape, -10.0, "float32"),
        )

        start_idx_gpu = sum(tracker_metadata["num_obj_per_gpu"][: self.rank])
        start_idx_state = start_idx_gpu
        for tracker_state in tracker_inference_states:
            num_obj_per_state = len(tracker_state["obj_ids"])
            if num_obj_per_state == 0:
                continue
            end_idx_state = start_idx_state + num_obj_per_state
            local_high_res_masks = high_res_masks[start_idx_state:end_idx_state]
            local_object_score_logits = object_score_logits[start_idx_state:end_idx_state]
            local_batch_size = local_high_res_masks.shape[0]
            encoded_mem = self.tracker._run_memory_encoder(
                tracker_state,
                frame_idx,
                local_batch_size,
                local_high_res_masks,
                local_object_score_logits,
                is_mask_from_pts=False,
            )
            local_maskmem_features, local_maskmem_pos_enc = encoded_mem
            output_dict = tracker_state["output_dict"]
            for storage_key in ["cond_frame_outputs", "non_cond_frame_outputs"]:
                if frame_idx not in output_dict[storage_key]:
                    continue
                output_dict[storage_key][frame_idx]["maskmem_features"] = local_maskmem_features
                output_dict[storage_key][frame_idx]["maskmem_pos_enc"] = list(local_maskmem_pos_enc)
                # per-object memory slices, for instance interactivity
                self.tracker._add_output_per_object(
                    inference_state=tracker_state,
                    frame_idx=frame_idx,
                    current_out=output_dict[storage_key][frame_idx],
                    storage_key=storage_key,
                )
            start_idx_state += num_obj_per_state

    def _tracker_add_new_objects(
        self,
        frame_idx: int,
        num_frames: int,
        new_obj_ids: Any,
        new_obj_masks: paddle.Tensor,
        tracker_states_local: list[Any],
        orig_vid_height: int,
        orig_vid_width: int,
        feature_cache: dict,
    ) -> list[Any]:
        """Start the new objects (mask prompts from their detections) in one new inference
        state over ``feature_cache`` (upstream ``_tracker_add_new_objects``)."""
        prev_tracker_state = tracker_states_local[0] if len(tracker_states_local) > 0 else None
        new_tracker_state = self.tracker.init_state(
            cached_features=feature_cache,
            video_height=orig_vid_height,
            video_width=orig_vid_width,
            num_frames=num_frames,
        )
        new_tracker_state["backbone_out"] = (
            prev_tracker_state.get("backbone_out", None) if prev_tracker_state is not None else None
        )

        if len(new_obj_ids) != new_obj_masks.shape[0]:
            raise ValueError("one mask per new object expected")
        if not new_obj_masks.is_floating_point():
            raise TypeError("float mask logits expected")
        input_mask_res = self.tracker.input_mask_size
        new_obj_masks = resize_bilinear(
            new_obj_masks.unsqueeze(1), (input_mask_res, input_mask_res)
        ).squeeze(1)
        new_obj_masks = new_obj_masks > 0

        for i, new_obj_id in enumerate(new_obj_ids):
            self.tracker.add_new_mask(
                inference_state=new_tracker_state,
                frame_idx=frame_idx,
                obj_id=new_obj_id,
                mask=new_obj_masks[i],
                add_mask_to_memory=True,
            )
        # the non-overlapping constraint is not enforced globally when adding objects
        self.tracker.propagate_in_video_preflight(new_tracker_state, run_mem_encoder=True)
        tracker_states_local.append(new_tracker_state)
        return tracker_states_local

    def _tracker_remove_object(self, tracker_states_local: list[Any], obj_id: int) -> None:
        """Remove an object from every inference state, on all frames; drop the states
        left empty (upstream ``_tracker_remove_object``)."""
        tracker_states_local_before_removal = tracker_states_local.copy()
        tracker_states_local.clear()
        for tracker_inference_state in tracker_states_local_before_removal:
            new_obj_ids, _ = self.tracker.remove_object(
                tracker_inference_state, obj_id, strict=False, need_output=False
            )
            if len(new_obj_ids) > 0:
                tracker_states_local.append(tracker_inference_state)

    def _tracker_remove_objects(self, tracker_states_local: list[Any], obj_ids: Any) -> None:
        """:meth:`_tracker_remove_object` for each of ``obj_ids`` (upstream
        ``_tracker_remove_objects``)."""
        for obj_id in obj_ids:
            self._tracker_remove_object(tracker_states_local, obj_id)

    def _initialize_metadata(self) -> dict[str, Any]:
        """Empty masklet metadata (upstream ``_initialize_metadata``)."""
        tracker_metadata = {
            "obj_ids_per_gpu": [np.array([], np.int64) for _ in range(self.world_size)],
            "obj_ids_all_gpu": np.array([], np.int64),
            "num_obj_per_gpu": np.zeros(self.world_size, np.int64),
            "max_obj_id": -1,
            "obj_id_to_score": {},
            "obj_id_to_tracker_score_frame_wise": defaultdict(dict),
            "obj_id_to_last_occluded": {},
        }
        # upstream keeps these on rank 0 only:
        # - obj_first_frame_idx: obj_id --> first frame index where the object was detected
        # - unmatched_frame_inds: obj_id --> [unmatched frame indices]
        # - trk_keep_alive: obj_id --> keep-alive counter (for suppression, not removal)
        # - overlap_pair_to_frame_inds: (first_appear_obj_id, obj_id) --> [overlap frames]
        # - removed_obj_ids: object ids removed via hot-start
        # - suppressed_obj_ids: frame_idx --> objects whose outputs are suppressed there
        rank0_metadata = {
            "obj_first_frame_idx": {},
            "unmatched_frame_inds": defaultdict(list),
            "trk_keep_alive": defaultdict(int),
            "overlap_pair_to_frame_inds": defaultdict(list),
            "removed_obj_ids": set(),
            "suppressed_obj_ids": defaultdict(set),
        }
        if self.masklet_confirmation_enable:
            rank0_metadata["masklet_confirmation"] = {
                "status": np.array([], np.int64),
                "consecutive_det_num": np.array([], np.int64),
            }
        tracker_metadata["rank0_metadata"] = rank0_metadata
        return tracker_metadata

    def update_masklet_confirmation_status(
        self,
        rank0_metadata: dict[str, Any],
        obj_ids_all_gpu_prev: np.ndarray,
        obj_ids_all_gpu_updated: np.ndarray,
        det_to_matched_trk_obj_ids: dict[int, np.ndarray],
        new_det_obj_ids: np.ndarray,
    ) -> dict[str, Any]:
        """A masklet is confirmed once matched to a detection on
        ``masklet_confirmation_consecutive_det_thresh`` consecutive frames (upstream
        ``update_masklet_confirmation_status``)."""
        confirmation_data = rank0_metadata["masklet_confirmation"]

        # a) extend the data to the masklets added on this frame
        status_prev = confirmation_data["status"]
        consecutive_det_num_prev = confirmation_data["consecutive_det_num"]
        if status_prev.shape != obj_ids_all_gpu_prev.shape:
            raise RuntimeError(f"Got {status_prev.shape} vs {obj_ids_all_gpu_prev.shape}")

        obj_id_to_updated_idx = {obj_id: idx for idx, obj_id in enumerate(obj_ids_all_gpu_updated)}
        prev_elem_is_in_updated = np.isin(obj_ids_all_gpu_prev, obj_ids_all_gpu_updated)
        prev_elem_obj_ids_in_updated = obj_ids_all_gpu_prev[prev_elem_is_in_updated]
        prev_elem_inds_in_updated = np.array(
            [obj_id_to_updated_idx[obj_id] for obj_id in prev_elem_obj_ids_in_updated],
            dtype=np.int64,
        )
        unconfirmed_val = MaskletConfirmationStatus.UNCONFIRMED.value
        status = np.full_like(obj_ids_all_gpu_updated, fill_value=unconfirmed_val)
        status[prev_elem_inds_in_updated] = status_prev[prev_elem_is_in_updated]
        consecutive_det_num = np.zeros_like(obj_ids_all_gpu_updated)
        consecutive_det_num[prev_elem_inds_in_updated] = consecutive_det_num_prev[
            prev_elem_is_in_updated
        ]

        # b) the confirmation status after this frame
        is_matched = np.isin(obj_ids_all_gpu_updated, new_det_obj_ids)
        for matched_trk_obj_ids in det_to_matched_trk_obj_ids.values():
            is_matched |= np.isin(obj_ids_all_gpu_updated, matched_trk_obj_ids)
        consecutive_det_num = np.where(is_matched, consecutive_det_num + 1, 0)
        change_to_confirmed = (
            consecutive_det_num >= self.masklet_confirmation_consecutive_det_thresh
        )
        status[change_to_confirmed] = MaskletConfirmationStatus.CONFIRMED.value

        confirmation_data["status"] = status
        confirmation_data["consecutive_det_num"] = consecutive_det_num
        return rank0_metadata

    def forward(self, *args: Any, **kwargs: Any):
        """Upstream ``forward``: evaluation outside the demo is not implemented there."""
        raise NotImplementedError("Evaluation outside demo is not implemented yet")

    def _encode_prompt(self, **kwargs: Any):
        """The detector's ``_encode_prompt`` (upstream ``_encode_prompt``)."""
        return self.detector._encode_prompt(**kwargs)

    def _drop_new_det_with_obj_limit(
        self, new_det_fa_inds: np.ndarray, det_scores_np: np.ndarray, num_to_keep: int
    ) -> np.ndarray:
        """The ``num_to_keep`` highest-scoring new detections (upstream
        ``_drop_new_det_with_obj_limit``)."""
        if not 0 <= num_to_keep <= len(new_det_fa_inds):
            raise ValueError(f"cannot keep {num_to_keep} of {len(new_det_fa_inds)} detections")
        if num_to_keep == 0:
            return np.array([], np.int64)  # keep none
        if num_to_keep == len(new_det_fa_inds):
            return new_det_fa_inds  # keep all
        score_order = np.argsort(det_scores_np[new_det_fa_inds])[::-1]
        return new_det_fa_inds[score_order[:num_to_keep]]


__all__ = ["BatchedDatapoint", "MaskletConfirmationStatus", "Sam3VideoBase"]
