"""Helpers for the automatic mask generator (counterparts of ``segment_anything.utils.amg``).

Tensor-valued helpers take and return ``paddle.Tensor`` so that the heavy per-pixel work
(stability scores, thresholding, boxes, run-length change points) stays on the model's device.
Everything that upstream does in numpy (RLE decoding, crop geometry, small-region removal) is numpy
here too. ``batched_nms`` is an exact numpy port of torchvision's greedy NMS, and
``remove_small_regions`` replaces OpenCV's connected components with a run-based labelling.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterator, Sequence
from copy import deepcopy
from itertools import product
from typing import Any

import numpy as np
import paddle

from ...models.common import connected_components
from ...models.sam_v1.sam import as_paddle

ArrayLike = np.ndarray | paddle.Tensor


def _is_tensor(x: Any) -> bool:
    return isinstance(x, paddle.Tensor)


def _keep_to_numpy(keep: Any) -> np.ndarray:
    """A boolean mask or an index list as a numpy array (bool or int64)."""
    if _is_tensor(keep):
        keep = keep.numpy()
    keep = np.asarray(keep)
    if keep.dtype != np.bool_:
        keep = keep.astype(np.int64).reshape(-1)
    return keep


class MaskData:
    """Batched per-mask records (lists, numpy arrays or paddle Tensors, first axis = mask).

    Supports filtering every field with one boolean mask / index array and concatenating batches.
    """

    _types = (list, np.ndarray, paddle.Tensor)

    def __init__(self, **kwargs: Any) -> None:
        for v in kwargs.values():
            self._check(v)
        self._stats: dict[str, Any] = dict(**kwargs)

    @classmethod
    def _check(cls, item: Any) -> None:
        if not isinstance(item, cls._types):
            raise TypeError(
                f"MaskData only supports lists, numpy arrays and paddle Tensors, got {type(item)}."
            )

    def __setitem__(self, key: str, item: Any) -> None:
        self._check(item)
        self._stats[key] = item

    def __delitem__(self, key: str) -> None:
        del self._stats[key]

    def __getitem__(self, key: str) -> Any:
        return self._stats[key]

    def __contains__(self, key: str) -> bool:
        return key in self._stats

    def items(self) -> ItemsView[str, Any]:
        return self._stats.items()

    def filter(self, keep: Any) -> None:
        """Keep the entries selected by ``keep`` (N bool mask, or indices in the order given)."""
        keep_np = _keep_to_numpy(keep)
        idx = np.flatnonzero(keep_np) if keep_np.dtype == np.bool_ else keep_np
        for k, v in self._stats.items():
            if v is None:
                continue
            if _is_tensor(v):
                index = paddle.to_tensor(idx, dtype="int64", place=v.place)
                self._stats[k] = paddle.index_select(v, index, axis=0)
            elif isinstance(v, np.ndarray):
                self._stats[k] = v[idx]
            elif isinstance(v, list):
                self._stats[k] = [v[i] for i in idx.tolist()]
            else:
                raise TypeError(f"MaskData key {k} has an unsupported type {type(v)}.")

    def cat(self, new_stats: MaskData) -> None:
        """Append the entries of ``new_stats`` along the first axis.

        Containers are copied, list items (e.g. RLE dicts) are shared, not deep-copied: upstream's
        deep copy of every RLE dominated the generator's run time.
        """
        for k, v in new_stats.items():
            if k not in self._stats or self._stats[k] is None:
                self._stats[k] = (
                    v.clone() if _is_tensor(v) else (list(v) if isinstance(v, list) else v.copy())
                )
            elif _is_tensor(v):
                self._stats[k] = paddle.concat([self._stats[k], v], axis=0)
            elif isinstance(v, np.ndarray):
                self._stats[k] = np.concatenate([self._stats[k], v], axis=0)
            elif isinstance(v, list):
                self._stats[k] = self._stats[k] + list(v)
            else:
                raise TypeError(f"MaskData key {k} has an unsupported type {type(v)}.")

    def to_numpy(self) -> None:
        """Move every paddle Tensor field to a numpy array."""
        for k, v in self._stats.items():
            if _is_tensor(v):
                self._stats[k] = v.numpy()


def is_box_near_crop_edge(
    boxes: paddle.Tensor, crop_box: Sequence[int], orig_box: Sequence[int], atol: float = 20.0
) -> paddle.Tensor:
    """Flag boxes touching a crop edge that is not also an edge of the original image.

    ``boxes``: N x 4 XYXY in crop coordinates. Returns an N bool Tensor.
    """
    crop = paddle.to_tensor([list(crop_box)], dtype="float32", place=boxes.place)
    orig = paddle.to_tensor([list(orig_box)], dtype="float32", place=boxes.place)
    boxes = uncrop_boxes_xyxy(boxes, crop_box).astype("float32")
    near_crop_edge = paddle.isclose(boxes, crop.expand_as(boxes), rtol=0.0, atol=atol)
    near_image_edge = paddle.isclose(boxes, orig.expand_as(boxes), rtol=0.0, atol=atol)
    return paddle.any(paddle.logical_and(near_crop_edge, ~near_image_edge), axis=1)


def box_xyxy_to_xywh(box_xyxy: Any) -> Any:
    """XYXY -> XYWH for a single box (4, or 4 x ... leading axis), Tensor, array or list."""
    box = box_xyxy.clone() if _is_tensor(box_xyxy) else deepcopy(box_xyxy)
    box[2] = box[2] - box[0]
    box[3] = box[3] - box[1]
    return box


def batch_iterator(batch_size: int, *args: Any) -> Iterator[list[Any]]:
    """Yield ``[arg[i:i + batch_size] for arg in args]`` over equally long sequences."""
    if len(args) == 0 or any(len(a) != len(args[0]) for a in args):
        raise ValueError("Batched iteration must have inputs of all the same size.")
    n = len(args[0])
    n_batches = n // batch_size + int(n % batch_size != 0)
    for b in range(n_batches):
        yield [arg[b * batch_size : (b + 1) * batch_size] for arg in args]


def mask_to_rle_paddle(tensor: paddle.Tensor) -> list[dict[str, Any]]:
    """Encode B x H x W binary masks as uncompressed RLEs in pycocotools' (column-major) layout.

    Each RLE is ``{"size": [h, w], "counts": [...]}`` where counts alternate runs of 0 and 1 over
    the Fortran-ordered pixels, starting with a (possibly empty) run of zeros.
    """
    b, h, w = tensor.shape
    if tensor.dtype != paddle.bool:
        tensor = tensor.astype("bool")
    flat = tensor.transpose([0, 2, 1]).reshape([b, h * w])
    first = flat[:, 0].numpy() if h * w > 0 else np.zeros(b, dtype=bool)
    if h * w > 1 and b > 0:
        diff = paddle.bitwise_xor(flat[:, 1:], flat[:, :-1])
        change = paddle.nonzero(diff).numpy()  # M x 2, row-major: sorted by mask then position
    else:
        change = np.zeros((0, 2), dtype=np.int64)
    # Slice the sorted change list per mask instead of masking it B times.
    bounds = np.searchsorted(change[:, 0], np.arange(b + 1), side="left")
    out = []
    for i in range(b):
        idxs = change[bounds[i] : bounds[i + 1], 1] + 1
        edges = np.concatenate([[0], idxs, [h * w]]).astype(np.int64)
        counts = [] if not first[i] else [0]
        counts.extend(np.diff(edges).tolist())
        out.append({"size": [h, w], "counts": counts})
    return out


def mask_to_rle_pytorch(tensor: Any) -> list[dict[str, Any]]:
    """Upstream's name for :func:`mask_to_rle_paddle`; the masks may also be a PyTorch tensor."""
    return mask_to_rle_paddle(as_paddle(tensor))


def rle_to_mask(rle: dict[str, Any]) -> np.ndarray:
    """Decode an uncompressed RLE into an H x W bool mask."""
    h, w = rle["size"]
    counts = np.asarray(rle["counts"], dtype=np.int64)
    values = np.arange(len(counts)) % 2 == 1  # runs alternate 0, 1, 0, ...
    flat = np.repeat(values, counts)
    if flat.size != h * w:
        raise ValueError(f"RLE counts sum to {flat.size}, expected {h} * {w} = {h * w}.")
    return flat.reshape(w, h).transpose()  # Fortran order -> H x W


def area_from_rle(rle: dict[str, Any]) -> int:
    """Number of foreground pixels of an uncompressed RLE."""
    return int(sum(rle["counts"][1::2]))


def calculate_stability_score(
    masks: ArrayLike, mask_threshold: float, threshold_offset: float, float64: bool = True
) -> ArrayLike:
    """IoU between the masks binarised at ``threshold +- offset`` (... x H x W logits -> ...).

    The high-threshold mask is always inside the low-threshold one, so IoU is a ratio of counts.
    Paddle's vectorised float32 division on CPU is not correctly rounded (1-ulp differences
    from torch); dividing in float64 and rounding once to float32 matches torch bit for bit.
    ``float64=False`` divides in float32 (exported graphs: browser runtimes lack float64).
    A numpy array is scored with numpy (returned as numpy): the counts per mask by
    ``np.count_nonzero``, 0.9 s -> 0.1 s for 60 masks of 768 x 1024 where Paddle's CPU sum
    runs on one thread.
    """
    if isinstance(masks, np.ndarray):
        flat = masks.reshape(-1, *masks.shape[-2:])
        hi, lo = mask_threshold + threshold_offset, mask_threshold - threshold_offset
        high = np.array([np.count_nonzero(m > hi) for m in flat], np.float64)
        low = np.array([np.count_nonzero(m > lo) for m in flat], np.float64)
        dtype = np.float64 if float64 else np.float32
        with np.errstate(divide="ignore", invalid="ignore"):  # an empty mask: nan, as torch
            score = high.astype(dtype) / low.astype(dtype)
        return score.astype(np.float32).reshape(masks.shape[:-2])
    high = (masks > (mask_threshold + threshold_offset)).astype("int32").sum(axis=[-2, -1])
    low = (masks > (mask_threshold - threshold_offset)).astype("int32").sum(axis=[-2, -1])
    dtype = "float64" if float64 else "float32"
    return (high.astype(dtype) / low.astype(dtype)).astype("float32")


def build_point_grid(n_per_side: int) -> np.ndarray:
    """An (n*n) x 2 grid of (x, y) points evenly spaced inside [0, 1] x [0, 1], x fastest."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs, ys = np.meshgrid(side, side, indexing="xy")
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def build_all_layer_point_grids(
    n_per_side: int, n_layers: int, scale_per_layer: int
) -> list[np.ndarray]:
    """Point grids for crop layers 0..n_layers, layer i with n_per_side / scale**i points a side."""
    return [build_point_grid(int(n_per_side / (scale_per_layer**i))) for i in range(n_layers + 1)]


def generate_crop_boxes(
    im_size: Sequence[int], n_layers: int, overlap_ratio: float
) -> tuple[list[list[int]], list[int]]:
    """Crop boxes (XYXY) for the full image plus layer i's (2**i) ** 2 overlapping crops.

    Returns the boxes and the layer index of each box.
    """
    im_h, im_w = im_size
    short_side = min(im_h, im_w)
    crop_boxes: list[list[int]] = [[0, 0, im_w, im_h]]
    layer_idxs = [0]

    def crop_len(orig_len: int, n_crops: int, overlap: int) -> int:
        return int(math.ceil((overlap * (n_crops - 1) + orig_len) / n_crops))

    for i_layer in range(n_layers):
        n_per_side = 2 ** (i_layer + 1)
        overlap = int(overlap_ratio * short_side * (2 / n_per_side))
        crop_w = crop_len(im_w, n_per_side, overlap)
        crop_h = crop_len(im_h, n_per_side, overlap)
        x0s = [int((crop_w - overlap) * i) for i in range(n_per_side)]
        y0s = [int((crop_h - overlap) * i) for i in range(n_per_side)]
        for x0, y0 in product(x0s, y0s):
            crop_boxes.append([x0, y0, min(x0 + crop_w, im_w), min(y0 + crop_h, im_h)])
            layer_idxs.append(i_layer + 1)
    return crop_boxes, layer_idxs


def _offset_like(x: ArrayLike, values: list[int]) -> ArrayLike:
    """A 1 x K (or 1 x 1 x K for 3-d input) offset in x's kind, dtype and place."""
    shape = [1, 1, len(values)] if len(x.shape) == 3 else [1, len(values)]
    if _is_tensor(x):
        return paddle.to_tensor(values, dtype=x.dtype, place=x.place).reshape(shape)
    return np.asarray(values).astype(np.result_type(x.dtype, np.int64)).reshape(shape)


def uncrop_boxes_xyxy(boxes: ArrayLike, crop_box: Sequence[int]) -> ArrayLike:
    """Shift ... x 4 XYXY boxes from crop to image coordinates."""
    x0, y0 = int(crop_box[0]), int(crop_box[1])
    return boxes + _offset_like(boxes, [x0, y0, x0, y0])


def uncrop_points(points: ArrayLike, crop_box: Sequence[int]) -> ArrayLike:
    """Shift ... x 2 (x, y) points from crop to image coordinates."""
    x0, y0 = int(crop_box[0]), int(crop_box[1])
    return points + _offset_like(points, [x0, y0])


def uncrop_masks(
    masks: paddle.Tensor, crop_box: Sequence[int], orig_h: int, orig_w: int
) -> paddle.Tensor:
    """Zero-pad ... x h x w crop masks into ... x orig_h x orig_w image masks."""
    x0, y0, x1, y1 = (int(v) for v in crop_box)
    if x0 == 0 and y0 == 0 and x1 == orig_w and y1 == orig_h:
        return masks
    out = paddle.zeros([*masks.shape[:-2], orig_h, orig_w], dtype=masks.dtype)
    out[..., y0:y1, x0:x1] = masks
    return out


def remove_small_regions(
    mask: np.ndarray, area_thresh: float, mode: str
) -> tuple[np.ndarray, bool]:
    """Fill holes (``mode="holes"``) or drop islands (``"islands"``) smaller than ``area_thresh``.

    ``mask``: H x W bool. Returns the new mask and whether it changed. In islands mode, when every
    island is small the largest one is kept.
    """
    if mode not in ("holes", "islands"):
        raise ValueError(f"mode must be 'holes' or 'islands', got {mode!r}.")
    correct_holes = mode == "holes"
    working = np.logical_xor(correct_holes, mask)
    n_labels, regions, areas = connected_components(working)
    sizes = areas[1:]
    small = np.flatnonzero(sizes < area_thresh) + 1
    if small.size == 0:
        return mask, False
    fill = np.zeros(n_labels, dtype=bool)  # labels that end up True in the new mask
    fill[0] = True
    fill[small] = True
    if not correct_holes:
        fill = ~fill  # keep the large islands; background and small islands become False
        if not fill.any():  # every island is small: keep the largest
            fill[int(np.argmax(sizes)) + 1] = True
    return fill[regions], True


def coco_encode_rle(uncompressed_rle: dict[str, Any]) -> dict[str, Any]:
    """Compress an uncompressed RLE with pycocotools; ``counts`` becomes a JSON-safe str."""
    from pycocotools import mask as mask_utils

    h, w = uncompressed_rle["size"]
    rle = mask_utils.frPyObjects(uncompressed_rle, h, w)
    rle["counts"] = rle["counts"].decode("utf-8")
    return rle


def batched_mask_to_box(masks: paddle.Tensor) -> paddle.Tensor:
    """XYXY int64 boxes (inclusive max) around ... x H x W masks -> ... x 4; [0,0,0,0] if empty."""
    shape = list(masks.shape)
    if math.prod(shape) == 0:
        return paddle.zeros([*shape[:-2], 4], dtype="int64")
    h, w = shape[-2:]
    masks = masks.reshape([-1, h, w]).astype("bool")

    def edges(present: paddle.Tensor, n: int) -> tuple[paddle.Tensor, paddle.Tensor]:
        coords = paddle.arange(n, dtype="int64").unsqueeze(0)
        present = present.astype("int64")
        high = (present * coords).max(axis=-1)
        low = (present * coords + n * (1 - present)).min(axis=-1)
        return low, high

    top, bottom = edges(masks.any(axis=-1), h)
    left, right = edges(masks.any(axis=-2), w)
    empty = paddle.logical_or(right < left, bottom < top)
    out = paddle.stack([left, top, right, bottom], axis=-1)
    out = out * (~empty).astype("int64").unsqueeze(-1)
    return out.reshape([*shape[:-2], 4])


def _nms_numpy(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy NMS exactly as torchvision's CPU kernel (same float arithmetic and tie order)."""
    order = np.argsort(-scores.astype(np.float64), kind="stable")
    x1, y1, x2, y2 = (boxes[:, i] for i in range(4))
    areas = (x2 - x1) * (y2 - y1)
    suppressed = np.zeros(len(boxes), dtype=bool)
    keep = []
    with np.errstate(invalid="ignore", divide="ignore"):
        for pos, i in enumerate(order):
            if suppressed[i]:
                continue
            keep.append(i)
            rest = order[pos + 1 :]
            rest = rest[~suppressed[rest]]
            if rest.size == 0:
                continue
            w = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0)
            h = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0)
            inter = w * h
            iou = inter / (areas[i] + areas[rest] - inter)
            suppressed[rest[iou.astype(np.float64) > iou_threshold]] = True
    return np.asarray(keep, dtype=np.int64)


def batched_nms(
    boxes: ArrayLike, scores: ArrayLike, idxs: ArrayLike, iou_threshold: float
) -> ArrayLike:
    """Class-wise greedy NMS with torchvision's semantics.

    ``boxes``: N x 4 XYXY, ``scores``: N, ``idxs``: N category ids. A box is suppressed by a
    higher-scoring kept box of the same category whose IoU with it is > ``iou_threshold``.
    Returns the kept indices (int64, same kind as ``boxes``) by decreasing score, ties in index
    order.
    """
    as_tensor = _is_tensor(boxes)
    place = boxes.place if as_tensor else None
    b = boxes.numpy() if _is_tensor(boxes) else np.asarray(boxes)
    s = scores.numpy() if _is_tensor(scores) else np.asarray(scores)
    c = idxs.numpy() if _is_tensor(idxs) else np.asarray(idxs)
    if not np.issubdtype(b.dtype, np.floating):
        b = b.astype(np.float32)
    b = b.reshape(-1, 4)
    s = s.reshape(-1)
    c = c.reshape(-1)
    keep_mask = np.zeros(len(b), dtype=bool)
    for cat in np.unique(c):
        members = np.flatnonzero(c == cat)
        keep_mask[members[_nms_numpy(b[members], s[members], iou_threshold)]] = True
    kept = np.flatnonzero(keep_mask)
    keep = kept[np.argsort(-s[kept].astype(np.float64), kind="stable")].astype(np.int64)
    if as_tensor:
        return paddle.to_tensor(keep, dtype="int64", place=place)
    return keep
