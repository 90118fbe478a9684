"""Drop-in ``SAM2AutomaticMaskGenerator`` (upstream: sam2/automatic_mask_generator.py of sam2
1.1.0): a grid of single-point prompts over the image (and optionally over crops), masks
filtered by predicted IoU and stability, deduplicated by box NMS, returned as records in
upstream's format and order.

Upstream's generator is SAM v1's with another predictor, so everything but the decoding of a
batch of points is SAM v1's ``SamAutomaticMaskGenerator``'s (crops, NMS, records, the RLE
helpers of :mod:`paddle_sam.utils.amg`). What differs, as
upstream: SAM 2's defaults (``pred_iou_thresh`` 0.8), ``mask_threshold``,
``multimask_output`` and ``use_m2m`` (each mask refined once from its own low-res logits), and
``min_mask_region_area`` handed to the predictor as ``max_hole_area`` / ``max_sprinkle_area``
(holes and specks of the low-res masks), not applied to the final masks.

Upstream's results with less memory: a mask's IoU prediction does not depend on its resizing,
so the IoU filter runs before the masks are resized to the image and only those that pass it
are resized (each on its own, as upstream's batch does).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from ...models.sam2.sam2_base import SAM2Base
from ..sam_v1.amg_utils import (
    MaskData,
    batch_iterator,
    batched_mask_to_box,
    calculate_stability_score,
    is_box_near_crop_edge,
    mask_to_rle_paddle,
    uncrop_masks,
)
from ..sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator, check_generator_args
from .predictor import SAM2ImagePredictor


class SAM2AutomaticMaskGenerator(SamAutomaticMaskGenerator):
    postprocess_small_regions_in_generate = False  # the predictor's job (max_hole_area ...)

    def __init__(
        self,
        model: SAM2Base | SAM2ImagePredictor,
        points_per_side: int | None = 32,
        points_per_batch: int = 64,
        pred_iou_thresh: float = 0.8,
        stability_score_thresh: float = 0.95,
        stability_score_offset: float = 1.0,
        mask_threshold: float = 0.0,
        box_nms_thresh: float = 0.7,
        crop_n_layers: int = 0,
        crop_nms_thresh: float = 0.7,
        crop_overlap_ratio: float = 512 / 1500,
        crop_n_points_downscale_factor: int = 1,
        point_grids: list[np.ndarray] | None = None,
        min_mask_region_area: int = 0,
        output_mode: str = "binary_mask",
        use_m2m: bool = False,
        multimask_output: bool = True,
        progress: bool = False,
        **kwargs: Any,
    ) -> None:
        """Generate masks for a whole image with a SAM 2 model.

        Arguments (as upstream; the SAM v1 generator's, plus):
          model: the SAM 2 model (``build_sam2``), or a ``SAM2ImagePredictor`` around one
            (its own hole and speck settings are then used).
          mask_threshold: the logit above which a pixel is in the mask.
          min_mask_region_area: if > 0, the predictor fills holes and removes specks of at
            most this many low-res pixels (upstream's ``max_hole_area`` and
            ``max_sprinkle_area``).
          use_m2m: refine every mask once with its own low-res logits as mask input.
          multimask_output: three masks per grid point (else one).
          progress: a tqdm progress bar over point batches (not in upstream).
        Other keyword arguments are ignored, as upstream's constructor ignores them.
        """
        del kwargs
        self.point_grids = check_generator_args(
            points_per_side,
            point_grids,
            points_per_batch,
            crop_n_layers,
            crop_n_points_downscale_factor,
            output_mode,
        )
        if output_mode == "coco_rle":
            from pycocotools import mask as mask_utils  # noqa: F401
        if isinstance(model, SAM2ImagePredictor):
            self.predictor = model
        elif isinstance(model, SAM2Base):
            self.predictor = SAM2ImagePredictor(
                model, max_hole_area=min_mask_region_area, max_sprinkle_area=min_mask_region_area
            )
        elif hasattr(model, "_predict") and hasattr(model, "_decode"):  # a stand-in predictor
            self.predictor = model
        else:
            raise TypeError(
                "SAM2AutomaticMaskGenerator needs a SAM 2 model (build_sam2) or a "
                f"SAM2ImagePredictor, got {type(model).__name__}"
            )
        self.points_per_batch = int(points_per_batch)
        self.pred_iou_thresh = pred_iou_thresh
        self.stability_score_thresh = stability_score_thresh
        self.stability_score_offset = stability_score_offset
        self.mask_threshold = float(mask_threshold)
        self.box_nms_thresh = box_nms_thresh
        self.crop_n_layers = crop_n_layers
        self.crop_nms_thresh = crop_nms_thresh
        self.crop_overlap_ratio = crop_overlap_ratio
        self.crop_n_points_downscale_factor = crop_n_points_downscale_factor
        self.min_mask_region_area = min_mask_region_area
        self.output_mode = output_mode
        self.use_m2m = use_m2m
        self.multimask_output = multimask_output
        self.progress = progress
        self.last_stats: dict[str, float] = {}

    @classmethod
    def from_pretrained(cls, model_id: str, **kwargs: Any) -> SAM2AutomaticMaskGenerator:
        raise ValueError(
            f"paddle-sam never downloads weights ({model_id!r}): build the model from a local "
            "checkpoint, build_sam2(config, ckpt_path) from paddle_sam.loading.sam2, and pass "
            "it to SAM2AutomaticMaskGenerator"
        )

    def _reset_predictor(self) -> None:
        self.predictor.reset_predictor()

    def _process_batch(
        self,
        points: np.ndarray,
        im_size: tuple[int, ...],
        crop_box: list[int],
        orig_size: tuple[int, ...],
    ) -> MaskData:
        """Run one batch of N x 2 points (crop pixels) and keep the good masks as RLEs."""
        orig_h, orig_w = orig_size
        p = self.predictor
        points = np.asarray(points, dtype=np.float32)  # upstream makes them float32 tensors
        in_points = p._transform_coords(paddle.to_tensor(points), True, tuple(im_size))
        in_labels = paddle.ones([in_points.shape[0]], dtype="int32")
        low_res, iou_preds = p._decode(
            in_points[:, None, :], in_labels[:, None], multimask_output=self.multimask_output
        )
        n, c = iou_preds.shape
        low_res = low_res.reshape([n * c, 1, *low_res.shape[2:]])
        iou_preds = iou_preds.reshape([n * c])
        points = np.repeat(points, c, axis=0)

        stats = self.last_stats
        stats["candidates"] += n * c
        if self.use_m2m:
            # every candidate refined once from its own (clipped) low-res logits, one mask each,
            # in batches of points_per_batch as upstream
            refined, ious = [], []
            labels = paddle.ones([n * c], dtype="int32")
            coords = p._transform_coords(paddle.to_tensor(points), True, tuple(im_size))
            mask_inputs = low_res.clip(-32.0, 32.0)
            for cur_points, cur_labels, cur_masks in batch_iterator(
                self.points_per_batch, coords, labels, mask_inputs
            ):
                lr, iou = p._decode(
                    cur_points[:, None, :],
                    cur_labels[:, None],
                    mask_input=cur_masks,
                    multimask_output=False,
                )
                refined.append(lr)
                ious.append(iou)
            low_res = paddle.concat(refined, axis=0)
            iou_preds = paddle.concat(ious, axis=0).reshape([-1])
        iou_np = iou_preds.astype("float32").numpy()
        stats["best_iou"] = max(stats["best_iou"], float(np.max(iou_np, initial=0.0)))
        if self.pred_iou_thresh > 0.0:
            keep = np.flatnonzero(iou_np > self.pred_iou_thresh)
            low_res = paddle.gather(low_res, paddle.to_tensor(keep, dtype="int64"))
            iou_preds, points = iou_preds[paddle.to_tensor(keep, dtype="int64")], points[keep]
        stats["passed_iou"] += len(points)
        if len(points):
            masks = p._postprocess_masks(low_res, p._orig_hw[-1])[:, 0]
        else:
            masks = paddle.zeros([0, *im_size], dtype="float32")
        del low_res
        stability = calculate_stability_score(
            masks, self.mask_threshold, self.stability_score_offset
        )
        best = float(np.max(np.asarray(stability), initial=0.0))
        stats["best_stability"] = max(stats["best_stability"], best)
        data = MaskData(
            masks=masks,
            iou_preds=iou_preds,
            points=points,
            stability_score=stability,
        )
        del masks
        if self.stability_score_thresh > 0.0:
            data.filter(data["stability_score"] >= self.stability_score_thresh)
        stats["passed_stability"] += len(data["iou_preds"])

        data["masks"] = data["masks"] > self.mask_threshold
        data["boxes"] = batched_mask_to_box(data["masks"])

        # Drop masks touching a crop edge that is not an image edge.
        keep = ~is_box_near_crop_edge(data["boxes"], crop_box, [0, 0, orig_w, orig_h])
        if not bool(paddle.all(keep)):
            data.filter(keep)

        data["masks"] = uncrop_masks(data["masks"], crop_box, orig_h, orig_w)
        data["rles"] = mask_to_rle_paddle(data["masks"])
        del data["masks"]
        return data


__all__ = ["SAM2AutomaticMaskGenerator"]
