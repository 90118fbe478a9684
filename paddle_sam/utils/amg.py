"""``segment_anything.utils.amg`` under paddle-sam: the automatic mask generator's helpers,
under upstream's names.

Upstream's tensor helpers take torch tensors; these take paddle Tensors (and
``mask_to_rle_pytorch`` also a PyTorch tensor). Two extras: ``mask_to_rle_paddle``, and
``batched_nms``, torchvision's NMS, which upstream's generator imports from torchvision.
"""

from ..predict.sam_v1.amg_utils import (
    MaskData,
    area_from_rle,
    batch_iterator,
    batched_mask_to_box,
    batched_nms,
    box_xyxy_to_xywh,
    build_all_layer_point_grids,
    build_point_grid,
    calculate_stability_score,
    coco_encode_rle,
    generate_crop_boxes,
    is_box_near_crop_edge,
    mask_to_rle_paddle,
    mask_to_rle_pytorch,
    remove_small_regions,
    rle_to_mask,
    uncrop_boxes_xyxy,
    uncrop_masks,
    uncrop_points,
)

__all__ = [
    "MaskData",
    "area_from_rle",
    "batch_iterator",
    "batched_mask_to_box",
    "batched_nms",
    "box_xyxy_to_xywh",
    "build_all_layer_point_grids",
    "build_point_grid",
    "calculate_stability_score",
    "coco_encode_rle",
    "generate_crop_boxes",
    "is_box_near_crop_edge",
    "mask_to_rle_paddle",
    "mask_to_rle_pytorch",
    "remove_small_regions",
    "rle_to_mask",
    "uncrop_boxes_xyxy",
    "uncrop_masks",
    "uncrop_points",
]
