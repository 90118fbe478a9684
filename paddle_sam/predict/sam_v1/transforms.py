"""Resize images and prompts so the longest side matches the encoder input
(upstream: segment_anything/utils/transforms.py).

Images are resized with PIL's bilinear filter, exactly as upstream does through
torchvision's ``resize`` on a PIL image; the static export reuses this code. The ``*_torch``
methods are upstream's names for the ``*_paddle`` ones and also take PyTorch tensors.
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
from PIL import Image

from ...models.sam_v1.sam import as_paddle


class ResizeLongestSide:
    def __init__(self, target_length: int) -> None:
        self.target_length = int(target_length)

    def apply_image(self, image: np.ndarray) -> np.ndarray:
        """H x W x C uint8 -> h x w x C uint8 with max(h, w) == target_length."""
        h, w = self.get_preprocess_shape(image.shape[0], image.shape[1], self.target_length)
        # a writable copy, as upstream returns (PIL hands out a read-only buffer)
        return np.array(Image.fromarray(image).resize((w, h), Image.BILINEAR))

    def apply_coords(self, coords: np.ndarray, original_size: tuple[int, ...]) -> np.ndarray:
        """... x 2 (x, y) pixel coordinates in the original image -> the resized frame."""
        old_h, old_w = original_size
        new_h, new_w = self.get_preprocess_shape(old_h, old_w, self.target_length)
        coords = np.array(coords, dtype=float)  # a copy; float64 as upstream
        coords[..., 0] = coords[..., 0] * (new_w / old_w)
        coords[..., 1] = coords[..., 1] * (new_h / old_h)
        return coords

    def apply_boxes(self, boxes: np.ndarray, original_size: tuple[int, ...]) -> np.ndarray:
        """B x 4 (or 4) xyxy boxes -> B x 4 in the resized frame."""
        boxes = self.apply_coords(np.asarray(boxes).reshape(-1, 2, 2), original_size)
        return boxes.reshape(-1, 4)

    # The tensor forms. ``*_torch`` are the same methods under upstream's names: they take
    # paddle Tensors or, from ported code, PyTorch tensors (converted through numpy; torch is
    # never imported) and return paddle Tensors.

    def apply_image_paddle(self, image: paddle.Tensor) -> paddle.Tensor:
        """B x 3 x H x W float tensor -> resized with bilinear interpolation (antialias off).

        Not bit-identical to :meth:`apply_image` (PIL filters with antialiasing); upstream's
        ``apply_image_torch`` has the same difference.
        """
        image = as_paddle(image)
        h, w = self.get_preprocess_shape(image.shape[2], image.shape[3], self.target_length)
        return F.interpolate(image, size=[h, w], mode="bilinear", align_corners=False)

    def apply_coords_paddle(
        self, coords: paddle.Tensor, original_size: tuple[int, ...]
    ) -> paddle.Tensor:
        """... x 2 (x, y) pixel coordinates in the original image -> the resized frame, float32."""
        coords = as_paddle(coords)
        old_h, old_w = original_size
        new_h, new_w = self.get_preprocess_shape(old_h, old_w, self.target_length)
        scale = paddle.to_tensor(
            [new_w / old_w, new_h / old_h], dtype="float32", place=coords.place
        )
        return coords.astype("float32") * scale

    def apply_boxes_paddle(
        self, boxes: paddle.Tensor, original_size: tuple[int, ...]
    ) -> paddle.Tensor:
        """B x 4 xyxy boxes -> B x 4 in the resized frame, float32."""
        boxes = as_paddle(boxes).reshape([-1, 2, 2])
        return self.apply_coords_paddle(boxes, original_size).reshape([-1, 4])

    apply_image_torch = apply_image_paddle
    apply_coords_torch = apply_coords_paddle
    apply_boxes_torch = apply_boxes_paddle

    @staticmethod
    def get_preprocess_shape(oldh: int, oldw: int, long_side_length: int) -> tuple[int, int]:
        """Output (h, w) for an input of (oldh, oldw) and the target long side length."""
        scale = long_side_length * 1.0 / max(oldh, oldw)
        newh, neww = oldh * scale, oldw * scale
        return int(newh + 0.5), int(neww + 0.5)
