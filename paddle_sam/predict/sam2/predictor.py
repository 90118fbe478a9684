"""Drop-in ``SAM2ImagePredictor``: same calls, arguments, defaults and returns as upstream's
(sam2/sam2_image_predictor.py with the transforms of sam2/utils/transforms.py).

``set_image`` runs the image encoder once (RGB ``H x W x 3`` array or PIL image: scaled to
[0, 1], resized to ``image_size`` square with antialiased bilinear filtering as torchvision's
``Resize`` on a tensor, normalised with ImageNet's mean and std); ``predict`` answers points,
boxes and a previous mask's logits from the cached features, numpy in, numpy out. The SAM heads
are SAM 3's interactive predictor's, which is SAM 2's with other names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
from PIL import Image

from ...models.sam2.sam2_base import SAM2Base
from ...models.sam3.interactive import SAM3InteractiveImagePredictor
from ...models.sam3.memory import resize_antialias

#: ImageNet statistics, as upstream's SAM2Transforms
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)


def _as_float_image(image: Any, name: str = "image") -> np.ndarray:
    """``H x W x 3`` float32 in [0, 1] from an RGB uint8 array (scaled by 1/255, as
    torchvision's ``ToTensor``), a float array (kept as it is, as ``ToTensor``) or a PIL
    image; anything else is a ValueError naming the problem."""
    if isinstance(image, Image.Image):
        image = np.asarray(image.convert("RGB") if image.mode != "RGB" else image)
    if not isinstance(image, np.ndarray):
        raise TypeError(
            f"{name} must be a numpy array (H x W x 3, RGB) or a PIL image, got "
            f"{type(image).__name__}"
        )
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{name} must have shape H x W x 3 (RGB), got {tuple(image.shape)}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"{name} is empty: shape {tuple(image.shape)}")
    if image.dtype == np.uint8:
        return image.astype(np.float32) / np.float32(255.0)
    if np.issubdtype(image.dtype, np.floating):
        return image.astype(np.float32)
    raise ValueError(f"{name} must be uint8 (0..255) or float (0..1), got dtype {image.dtype}")


class SAM2Transforms:
    """Upstream's image transform and prompt transforms for a model of ``resolution``."""

    def __init__(
        self,
        resolution: int,
        mask_threshold: float,
        max_hole_area: float = 0.0,
        max_sprinkle_area: float = 0.0,
    ) -> None:
        self.resolution = resolution
        self.mask_threshold = mask_threshold
        self.max_hole_area = max_hole_area
        self.max_sprinkle_area = max_sprinkle_area
        self.mean = paddle.to_tensor(PIXEL_MEAN, dtype="float32").reshape([3, 1, 1])
        self.std = paddle.to_tensor(PIXEL_STD, dtype="float32").reshape([3, 1, 1])

    def __call__(self, image: Any) -> paddle.Tensor:
        """An image -> ``3 x S x S`` float32, resized and normalised."""
        x = paddle.to_tensor(_as_float_image(image).transpose(2, 0, 1))
        x = resize_antialias(x, [self.resolution, self.resolution])
        return (x - self.mean) / self.std

    def forward_batch(self, img_list: Sequence[Any]) -> paddle.Tensor:
        return paddle.stack([self(img) for img in img_list], axis=0)


class SAM2ImagePredictor(SAM3InteractiveImagePredictor):
    """SAM 2 on images: the embedding of an image (or a batch) computed once, then masks for
    any number of prompts. ``max_hole_area`` / ``max_sprinkle_area`` (0: off, upstream's
    default) fill small holes / remove small specks of the low-resolution masks."""

    def __init__(
        self,
        sam_model: SAM2Base,
        mask_threshold: float = 0.0,
        max_hole_area: float = 0.0,
        max_sprinkle_area: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if not isinstance(sam_model, SAM2Base):
            raise TypeError(
                f"SAM2ImagePredictor needs a SAM2Base model (build_sam2), got "
                f"{type(sam_model).__name__}"
            )
        super().__init__(
            sam_model,
            mask_threshold=mask_threshold,
            max_hole_area=max_hole_area,
            max_sprinkle_area=max_sprinkle_area,
        )
        self._transforms = SAM2Transforms(
            resolution=sam_model.image_size,
            mask_threshold=mask_threshold,
            max_hole_area=max_hole_area,
            max_sprinkle_area=max_sprinkle_area,
        )

    @classmethod
    def from_pretrained(cls, model_id: str, **kwargs: Any) -> SAM2ImagePredictor:
        raise ValueError(
            f"paddle-sam never downloads weights ({model_id!r}): build the model from a local "
            "checkpoint, build_sam2(config, ckpt_path) from paddle_sam.loading.sam2, and wrap "
            "it in SAM2ImagePredictor"
        )

    @property
    def device(self) -> str:
        return str(paddle.get_device())

    @paddle.no_grad()
    def set_image(self, image: Any) -> None:
        """Compute the embedding of an RGB image (``H x W x 3`` array, uint8 or float in
        [0, 1], or a PIL image) for :meth:`predict`."""
        self.reset_predictor()
        input_image = self._transforms(image).unsqueeze(0)
        orig_hw = [tuple(int(v) for v in _image_hw(image))]
        self.set_features(self.model.forward_image(input_image), orig_hw)

    @paddle.no_grad()
    def set_image_batch(self, image_list: list[np.ndarray]) -> None:
        """Compute the embeddings of a list of RGB ``H x W x 3`` arrays for
        :meth:`predict_batch`."""
        self.reset_predictor()
        if not isinstance(image_list, list) or not image_list:
            raise ValueError("image_list must be a non-empty list of H x W x 3 RGB arrays")
        for i, image in enumerate(image_list):
            if not isinstance(image, np.ndarray):
                raise TypeError(
                    f"image_list[{i}] must be a numpy array (H x W x 3, RGB), got "
                    f"{type(image).__name__}"
                )
        img_batch = self._transforms.forward_batch(image_list)
        orig_hw = [tuple(int(v) for v in img.shape[:2]) for img in image_list]
        self.set_features(self.model.forward_image(img_batch), orig_hw, is_batch=True)


def _image_hw(image: Any) -> tuple[int, int]:
    if isinstance(image, np.ndarray):
        return image.shape[0], image.shape[1]
    w, h = image.size  # PIL
    return h, w


__all__ = ["PIXEL_MEAN", "PIXEL_STD", "SAM2ImagePredictor", "SAM2Transforms"]
