"""Automatic (whole-image) mask generation, a drop-in for segment_anything's generator.

A grid of single-point prompts is run over the image (and optionally over overlapping crops);
masks are filtered by predicted IoU and stability, deduplicated by box NMS within and across
crops, optionally cleaned of small holes and islands, and returned as records in upstream's
format and order.

Upstream's results with less work: the predicted IoU does not depend on the upscaling, so the
IoU filter runs on the low-res logits and only the masks that pass it are upscaled to the image
(upsampling each mask is independent of the others), and the decoder runs in the faster forms
of the exported runtime (``predict_point_grid``). The model may also be an exported runtime
(``StaticSamPredictor``).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import paddle

from ...models.sam_v1.sam import as_paddle, postprocess_masks
from .amg_utils import (
    MaskData,
    area_from_rle,
    batch_iterator,
    batched_mask_to_box,
    batched_nms,
    box_xyxy_to_xywh,
    build_all_layer_point_grids,
    calculate_stability_score,
    coco_encode_rle,
    generate_crop_boxes,
    is_box_near_crop_edge,
    mask_to_rle_paddle,
    remove_small_regions,
    rle_to_mask,
    uncrop_boxes_xyxy,
    uncrop_masks,
    uncrop_points,
)

OUTPUT_MODES = ("binary_mask", "uncompressed_rle", "coco_rle")


def check_generator_args(
    points_per_side: int | None,
    point_grids: list[np.ndarray] | None,
    points_per_batch: int,
    crop_n_layers: int,
    crop_n_points_downscale_factor: int,
    output_mode: str,
) -> list[np.ndarray]:
    """The point grid of each crop layer, from ``points_per_side`` or the explicit
    ``point_grids``; a ValueError naming any argument that cannot work."""
    if (points_per_side is None) == (point_grids is None):
        raise ValueError(
            "Exactly one of points_per_side or point_grids must be provided, got "
            f"points_per_side={points_per_side!r} and "
            f"point_grids={'None' if point_grids is None else 'a list'}."
        )
    if output_mode not in OUTPUT_MODES:
        raise ValueError(f"Unknown output_mode {output_mode!r}; expected one of {OUTPUT_MODES}.")
    if int(points_per_batch) < 1:
        raise ValueError(f"points_per_batch must be >= 1, got {points_per_batch}.")
    if int(crop_n_layers) < 0:
        raise ValueError(f"crop_n_layers must be >= 0, got {crop_n_layers}.")
    if points_per_side is not None:
        last = int(points_per_side / (crop_n_points_downscale_factor**crop_n_layers))
        if last < 1:
            raise ValueError(
                f"points_per_side={points_per_side} leaves no points in crop layer "
                f"{crop_n_layers} (downscale factor {crop_n_points_downscale_factor})."
            )
        return build_all_layer_point_grids(
            points_per_side, crop_n_layers, crop_n_points_downscale_factor
        )
    grids = [np.asarray(g, dtype=np.float64) for g in point_grids]
    if len(grids) < crop_n_layers + 1:
        raise ValueError(
            f"point_grids has {len(grids)} grids but crop_n_layers={crop_n_layers} "
            f"needs {crop_n_layers + 1} (one per crop layer)."
        )
    for i, g in enumerate(grids):
        if g.ndim != 2 or g.shape[1] != 2:
            raise ValueError(f"point_grids[{i}] must be N x 2, got shape {g.shape}.")
    return grids


class SamAutomaticMaskGenerator:
    #: whether ``generate`` cleans small holes and islands of the kept masks itself
    #: (``min_mask_region_area``); SAM 2's generator leaves that to its predictor
    postprocess_small_regions_in_generate = True

    def __init__(
        self,
        model: Any,
        points_per_side: int | None = 32,
        points_per_batch: int = 64,
        pred_iou_thresh: float = 0.88,
        stability_score_thresh: float = 0.95,
        stability_score_offset: float = 1.0,
        box_nms_thresh: float = 0.7,
        crop_n_layers: int = 0,
        crop_nms_thresh: float = 0.7,
        crop_overlap_ratio: float = 512 / 1500,
        crop_n_points_downscale_factor: int = 1,
        point_grids: list[np.ndarray] | None = None,
        min_mask_region_area: int = 0,
        output_mode: str = "binary_mask",
        progress: bool = False,
    ) -> None:
        """Generate masks for a whole image with a SAM model.

        Arguments (as upstream):
          model: the SAM model (``paddle_sam.models.Sam``), or a predictor that has
            ``predict_point_grid`` (``SamPredictor``, or the exported runtime
            ``paddle_sam.deploy.sam_v1.StaticSamPredictor``).
          points_per_side: points sampled along each side of the image (points_per_side**2 in
            all); None when ``point_grids`` gives the points explicitly.
          points_per_batch: points run through the mask decoder at once.
          pred_iou_thresh: keep masks whose predicted IoU is above this (0 disables).
          stability_score_thresh: keep masks whose stability score is at least this (0 disables).
          stability_score_offset: logit shift used for the stability score.
          box_nms_thresh: box IoU cutoff of the NMS that removes duplicates within a crop.
          crop_n_layers: if > 0, also run on crops; layer i has (2**i)**2 crops.
          crop_nms_thresh: box IoU cutoff of the NMS that removes duplicates across crops.
          crop_overlap_ratio: crop overlap as a fraction of the image side in the first crop
            layer (scaled down in later layers).
          crop_n_points_downscale_factor: points per side in layer i are divided by this ** i.
          point_grids: explicit N x 2 grids in [0, 1], one per crop layer.
          min_mask_region_area: if > 0, fill holes and drop islands smaller than this (pixels).
          output_mode: 'binary_mask', 'uncompressed_rle' or 'coco_rle' (needs pycocotools).
          progress: show a tqdm progress bar over point batches (not in upstream).
        """
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

        from .predictor import SamPredictor

        if hasattr(model, "predict_point_grid"):
            self.predictor = model
        elif hasattr(model, "set_image"):
            raise TypeError(
                f"SamAutomaticMaskGenerator needs a Sam model or a predictor with "
                f"predict_point_grid (SamPredictor, StaticSamPredictor); "
                f"{type(model).__name__} has none"
            )
        else:
            self.predictor = SamPredictor(model)
        threshold = getattr(self.predictor, "mask_threshold", None)  # the exported runtimes'
        if threshold is None:
            threshold = self.predictor.model.mask_threshold
        self.mask_threshold = float(threshold)
        self.points_per_batch = int(points_per_batch)
        self.pred_iou_thresh = pred_iou_thresh
        self.stability_score_thresh = stability_score_thresh
        self.stability_score_offset = stability_score_offset
        self.box_nms_thresh = box_nms_thresh
        self.crop_n_layers = crop_n_layers
        self.crop_nms_thresh = crop_nms_thresh
        self.crop_overlap_ratio = crop_overlap_ratio
        self.crop_n_points_downscale_factor = crop_n_points_downscale_factor
        self.min_mask_region_area = min_mask_region_area
        self.output_mode = output_mode
        self.progress = progress
        # what the filters did in the last ``generate`` (not upstream's): see ``explain_empty``
        self.last_stats: dict[str, float] = {}

    @staticmethod
    def _check_image(image: Any) -> None:
        if not isinstance(image, np.ndarray):
            raise ValueError(f"image must be a numpy array (H x W x 3 uint8), got {type(image)}.")
        if image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"image must be H x W x 3 (RGB), got shape {image.shape}.")
        if image.dtype != np.uint8:
            raise ValueError(
                f"image must be uint8 with values in [0, 255], got dtype {image.dtype}."
            )
        if image.shape[0] == 0 or image.shape[1] == 0:
            raise ValueError(f"image must not be empty, got shape {image.shape}.")

    @paddle.no_grad()
    def generate(self, image: np.ndarray) -> list[dict[str, Any]]:
        """Generate masks for an H x W x 3 uint8 RGB image.

        Returns one record per mask with keys ``segmentation`` (H x W bool array, or an RLE
        dict in the RLE output modes), ``area`` (int), ``bbox`` (XYWH), ``predicted_iou``,
        ``point_coords`` ([[x, y]] prompt that produced it), ``stability_score`` and
        ``crop_box`` (XYWH of the crop it came from).
        """
        self._check_image(image)
        self.last_stats = dict.fromkeys(
            ("candidates", "passed_iou", "passed_stability", "best_iou", "best_stability"), 0
        )
        mask_data = self._generate_masks(image)

        if self.min_mask_region_area > 0 and self.postprocess_small_regions_in_generate:
            mask_data = self.postprocess_small_regions(
                mask_data,
                self.min_mask_region_area,
                max(self.box_nms_thresh, self.crop_nms_thresh),
            )

        if self.output_mode == "coco_rle":
            segmentations = [coco_encode_rle(rle) for rle in mask_data["rles"]]
        elif self.output_mode == "binary_mask":
            segmentations = [rle_to_mask(rle) for rle in mask_data["rles"]]
        else:
            segmentations = mask_data["rles"]

        records = []
        for idx, seg in enumerate(segmentations):
            records.append(
                {
                    "segmentation": seg,
                    "area": area_from_rle(mask_data["rles"][idx]),
                    "bbox": box_xyxy_to_xywh(mask_data["boxes"][idx]).tolist(),
                    "predicted_iou": mask_data["iou_preds"][idx].item(),
                    "point_coords": [mask_data["points"][idx].tolist()],
                    "stability_score": mask_data["stability_score"][idx].item(),
                    "crop_box": box_xyxy_to_xywh(mask_data["crop_boxes"][idx]).tolist(),
                }
            )
        return records

    def _generate_masks(self, image: np.ndarray) -> MaskData:
        orig_size = image.shape[:2]
        crop_boxes, layer_idxs = generate_crop_boxes(
            orig_size, self.crop_n_layers, self.crop_overlap_ratio
        )

        pbar = None
        if self.progress:
            from tqdm.auto import tqdm

            total = sum(-(-len(self.point_grids[i]) // self.points_per_batch) for i in layer_idxs)
            pbar = tqdm(total=total, desc="point batches", unit="batch")
        try:
            data = MaskData()
            for crop_box, layer_idx in zip(crop_boxes, layer_idxs, strict=True):
                data.cat(self._process_crop(image, crop_box, layer_idx, orig_size, pbar=pbar))
        finally:
            if pbar is not None:
                pbar.close()

        if len(crop_boxes) > 1:
            # Remove duplicates between crops, preferring masks from smaller crops.
            crop = data["crop_boxes"]
            area = ((crop[:, 2] - crop[:, 0]) * (crop[:, 3] - crop[:, 1])).astype(np.float32)
            scores = np.float32(1.0) / area
            keep = batched_nms(
                data["boxes"].astype("float32"),
                scores,
                np.zeros(len(scores), dtype=np.int64),
                iou_threshold=self.crop_nms_thresh,
            )
            data.filter(keep)

        data.to_numpy()
        return data

    def _process_crop(
        self,
        image: np.ndarray,
        crop_box: list[int],
        crop_layer_idx: int,
        orig_size: tuple[int, ...],
        pbar: Any = None,
    ) -> MaskData:
        x0, y0, x1, y1 = crop_box
        cropped_im = image[y0:y1, x0:x1, :]
        cropped_im_size = cropped_im.shape[:2]
        self.predictor.set_image(cropped_im)

        points_scale = np.array(cropped_im_size)[None, ::-1]  # (w, h)
        points_for_image = self.point_grids[crop_layer_idx] * points_scale

        data = MaskData()
        for (points,) in batch_iterator(self.points_per_batch, points_for_image):
            data.cat(self._process_batch(points, cropped_im_size, crop_box, orig_size))
            if pbar is not None:
                pbar.update(1)
        self._reset_predictor()

        # Remove duplicates within this crop.
        keep = batched_nms(
            data["boxes"].astype("float32"),
            data["iou_preds"],
            paddle.zeros([data["boxes"].shape[0]], dtype="int64"),
            iou_threshold=self.box_nms_thresh,
        )
        data.filter(keep)

        # Back to the original image frame (boxes and points become numpy here).
        data["boxes"] = uncrop_boxes_xyxy(data["boxes"], crop_box).numpy()
        data["points"] = uncrop_points(data["points"], crop_box)
        data["crop_boxes"] = np.array(
            [list(crop_box) for _ in range(len(data["rles"]))], dtype=np.int64
        ).reshape(-1, 4)
        return data

    def _reset_predictor(self) -> None:
        self.predictor.reset_image()

    def _process_batch(
        self,
        points: np.ndarray,
        im_size: tuple[int, ...],
        crop_box: list[int],
        orig_size: tuple[int, ...],
    ) -> MaskData:
        """Run one batch of N x 2 points (crop pixels) and keep the good masks as RLEs."""
        orig_h, orig_w = orig_size

        transformed = self.predictor.transform.apply_coords(points, im_size)
        iou_preds, low_res = self.predictor.predict_point_grid(transformed)
        n, c = iou_preds.shape
        iou_preds = iou_preds.reshape(n * c)
        low_res = low_res.reshape(n * c, *low_res.shape[2:])
        points = np.repeat(points, c, axis=0)

        stats = self.last_stats
        stats["candidates"] += len(iou_preds)
        stats["best_iou"] = max(stats["best_iou"], float(np.max(iou_preds, initial=0.0)))
        # the IoU filter before the upscaling: only the masks that pass it are upscaled
        if self.pred_iou_thresh > 0.0:
            keep = np.flatnonzero(iou_preds > self.pred_iou_thresh)
            iou_preds, low_res, points = iou_preds[keep], low_res[keep], points[keep]
        stats["passed_iou"] += len(iou_preds)
        masks = self._upscale_masks(low_res)  # numpy on the CPU
        del low_res
        mask_threshold = self.mask_threshold
        stability = calculate_stability_score(masks, mask_threshold, self.stability_score_offset)
        best = float(np.max(np.asarray(stability), initial=0.0))
        stats["best_stability"] = max(stats["best_stability"], best)
        data = MaskData(
            masks=as_paddle(masks),
            iou_preds=paddle.to_tensor(iou_preds),
            points=points,
            stability_score=as_paddle(stability),
        )
        del masks
        if self.stability_score_thresh > 0.0:
            data.filter(data["stability_score"] >= self.stability_score_thresh)
        stats["passed_stability"] += len(data["iou_preds"])

        data["masks"] = data["masks"] > mask_threshold
        data["boxes"] = batched_mask_to_box(data["masks"])

        # Drop masks touching a crop edge that is not an image edge.
        keep = ~is_box_near_crop_edge(data["boxes"], crop_box, [0, 0, orig_w, orig_h])
        if not bool(paddle.all(keep)):
            data.filter(keep)

        data["masks"] = uncrop_masks(data["masks"], crop_box, orig_h, orig_w)
        data["rles"] = mask_to_rle_paddle(data["masks"])
        del data["masks"]
        return data

    def _upscale_masks(self, low_res: np.ndarray) -> np.ndarray | paddle.Tensor:
        """Low-res logits (K x h x w) -> logits at the current image's size (the dynamic
        model's own ``postprocess_masks``): numpy on the CPU, a tensor on the model's GPU."""
        p = self.predictor
        model = getattr(p, "model", None)
        size = p.transform.target_length
        if model is not None and not model.pixel_mean.place.is_cpu_place():
            x = paddle.to_tensor(low_res, place=model.pixel_mean.place)
            return postprocess_masks(x, p.input_size, p.original_size, size)
        return postprocess_masks(low_res, p.input_size, p.original_size, size)

    @staticmethod
    def postprocess_small_regions(
        mask_data: MaskData, min_area: int, nms_thresh: float
    ) -> MaskData:
        """Fill small holes and remove small islands, then rerun box NMS (edits ``mask_data``).

        Unchanged masks score 1 and changed ones 0, so NMS prefers masks that needed no fix.
        """
        if len(mask_data["rles"]) == 0:
            return mask_data

        new_masks = []
        scores = []
        for rle in mask_data["rles"]:
            mask = rle_to_mask(rle)
            mask, changed_holes = remove_small_regions(mask, min_area, mode="holes")
            mask, changed_islands = remove_small_regions(mask, min_area, mode="islands")
            new_masks.append(mask)
            scores.append(float(not (changed_holes or changed_islands)))

        masks = paddle.to_tensor(np.stack(new_masks, axis=0))
        boxes = batched_mask_to_box(masks).numpy()
        keep = batched_nms(
            boxes.astype(np.float32),
            np.asarray(scores, dtype=np.float32),
            np.zeros(len(boxes), dtype=np.int64),
            iou_threshold=nms_thresh,
        )

        # Only re-encode masks that changed.
        for i in keep.tolist():
            if scores[i] == 0.0:
                mask_data["rles"][i] = mask_to_rle_paddle(masks[i : i + 1])[0]
                mask_data["boxes"][i] = boxes[i]
        mask_data.filter(keep)
        return mask_data


#: the options a command or a labelling job may set, by upstream's names
GENERATOR_OPTIONS = (
    "points_per_side",
    "points_per_batch",
    "pred_iou_thresh",
    "stability_score_thresh",
    "box_nms_thresh",
    "crop_n_layers",
    "min_mask_region_area",
)


def generator_defaults(generator: type | None = None) -> dict[str, Any]:
    """The defaults of :data:`GENERATOR_OPTIONS`, read from the signature (upstream's) of
    ``generator`` (default: :class:`SamAutomaticMaskGenerator`), their one home."""
    params = inspect.signature((generator or SamAutomaticMaskGenerator).__init__).parameters
    return {name: params[name].default for name in GENERATOR_OPTIONS}


def explain_empty(generator: SamAutomaticMaskGenerator) -> str:
    """Why the last ``generate`` of ``generator`` kept no mask, and what to change."""
    st = generator.last_stats
    if not st.get("candidates"):
        return "no prompt point was decoded"
    if not st["passed_iou"]:
        return (
            f"all {st['candidates']} candidate masks scored a predicted IoU at most "
            f"{st['best_iou']:.2f}, not above --pred-iou-thresh {generator.pred_iou_thresh}: "
            f"lower it (e.g. --pred-iou-thresh {max(0.0, st['best_iou'] - 0.1):.1f})"
        )
    if not st["passed_stability"]:
        return (
            f"{st['passed_iou']} of {st['candidates']} candidates passed the IoU filter but "
            f"their stability scores reach only {st['best_stability']:.2f}, under "
            f"--stability-score-thresh {generator.stability_score_thresh}: lower it (e.g. "
            f"--stability-score-thresh {max(0.0, st['best_stability'] - 0.1):.1f})"
        )
    return (
        f"{st['passed_stability']} candidates passed the IoU and stability filters but were "
        "dropped at crop edges, as duplicates or by --min-mask-region-area"
    )
