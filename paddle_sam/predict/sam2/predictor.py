"""Drop-in ``SAM2ImagePredictor``: same calls, arguments, defaults and returns as upstream's
(sam2/sam2_image_predictor.py with the transforms of sam2/utils/transforms.py).

``set_image`` runs the image encoder once (RGB ``H x W x 3`` array or PIL image: scaled to
[0, 1], resized to ``image_size`` square with antialiased bilinear filtering as torchvision's
``Resize`` on a tensor, normalised with ImageNet's mean and std); ``predict`` answers points,
boxes and a previous mask's logits from the cached features, numpy in, numpy out. The SAM heads
are SAM 3's interactive predictor's, which is SAM 2's with other names.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
from PIL import Image

from ...models.sam2.sam2_base import SAM2Base
from ...models.sam3.interactive import SAM3InteractiveImagePredictor
from ...models.sam3.memory import antialias_bilinear_weights

#: ImageNet statistics, as upstream's SAM2Transforms
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)


def _as_float_image(image: Any, name: str = "image") -> np.ndarray:
    """``H x W x 3`` float32 in [0, 1] from an RGB uint8 array (scaled by 1/255, as
    torchvision's ``ToTensor``), a float array (kept as it is, as ``ToTensor``) or a PIL
    image; anything else is a ValueError naming the problem."""
    return _to_float(_checked_image(image, name))


def _checked_image(image: Any, name: str = "image") -> np.ndarray:
    """The ``H x W x 3`` uint8 or float array of an RGB array or PIL image (as it is: not
    copied); anything else is a ValueError naming the problem."""
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
    if not (image.dtype == np.uint8 or np.issubdtype(image.dtype, np.floating)):
        raise ValueError(f"{name} must be uint8 (0..255) or float (0..1), got dtype {image.dtype}")
    return image


def _to_float(image: np.ndarray) -> np.ndarray:
    """A new float32 array: uint8 scaled by 1/255, floats as they are."""
    if image.dtype == np.uint8:
        out = image.astype(np.float32)
        out /= np.float32(255.0)
        return out
    return image.astype(np.float32)


@functools.cache
def _resize_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The antialiased bilinear resize of one axis (:func:`antialias_bilinear_weights`) as
    ``k`` taps per output: input indices and weights, ``out_size x k`` each (weight 0 where an
    output's support is shorter)."""
    w = antialias_bilinear_weights(in_size, out_size)
    nonzero = w != 0
    first = nonzero.argmax(axis=1)
    last = in_size - 1 - nonzero[:, ::-1].argmax(axis=1)
    idx = first[:, None] + np.arange(int((last - first).max()) + 1)
    inside = idx < in_size
    idx = np.minimum(idx, in_size - 1)
    return idx, np.where(inside, np.take_along_axis(w, idx, axis=1), np.float32(0.0))


def _resize_axis(x: np.ndarray, axis: int, out_size: int) -> np.ndarray:
    """Antialiased bilinear resize (torch's ``antialias=True``) of ``x`` along ``axis``, tap by
    tap in torch's order: the same products and sums as the weight matrix, without its
    zeros (a 768 -> 1024 resize of an RGB image: 2 taps, where the matrix product cost 5x)."""
    if x.shape[axis] == out_size:
        return x
    idx, weight = _resize_taps(x.shape[axis], out_size)
    shape = [1] * x.ndim
    shape[axis] = out_size
    out = np.take(x, idx[:, 0], axis=axis)
    out *= weight[:, 0].reshape(shape)
    for t in range(1, idx.shape[1]):
        out += np.take(x, idx[:, t], axis=axis) * weight[:, t].reshape(shape)
    return out


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
        """An image -> ``3 x S x S`` float32, resized and normalised (upstream's order: to
        [0, 1], resize along the width then the height, minus the mean, over the std)."""
        # channels first before the float conversion: the transposed copy moves bytes
        x = _to_float(np.ascontiguousarray(_checked_image(image).transpose(2, 0, 1)))
        x = _resize_axis(x, 2, self.resolution)
        x = _resize_axis(x, 1, self.resolution)
        for c in range(3):
            x[c] -= np.float32(PIXEL_MEAN[c])
            x[c] /= np.float32(PIXEL_STD[c])
        return paddle.to_tensor(x)

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


class Sam2Predictor:
    """SAM 2 as the image predictor of the CLI, the service and the labeller
    (:class:`~paddle_sam.predict.base.InteractivePredictor`): a :class:`SAM2ImagePredictor`
    inside (``predictor``), its answers with bool masks, and one image's features
    (``image_state``) kept apart so that the service can swap them between sessions.

    ``model``: a ``SAM2Base`` (``kwargs`` go to the :class:`SAM2ImagePredictor` built around
    it) or a :class:`SAM2ImagePredictor`. ``model_type``: the name reported (default: the
    released size whose spec the model has, else ``"sam2"``)."""

    takes_text = False
    takes_points = True
    takes_mask_input = True
    returns_instances = False
    everything_refusal: str | None = None
    mask_refusal: str | None = None
    session_state_keys = ("image_state",)

    def __init__(self, model: Any, model_type: str | None = None, **kwargs: Any) -> None:
        if isinstance(model, SAM2ImagePredictor):
            if kwargs:
                raise TypeError(f"a SAM2ImagePredictor has its settings: {sorted(kwargs)}")
            predictor = model
        else:
            predictor = SAM2ImagePredictor(model, **kwargs)
        self.predictor = predictor
        self.model = predictor.model
        self.model_type = model_type or _released_name(self.model)
        self.image_state: dict[str, Any] | None = None
        self.is_image_set = False

    @staticmethod
    def is_interactive(text: str | None, has_points: bool, has_mask: bool) -> bool:
        """Every request is answered with candidate masks of one object."""
        return True

    @property
    def mask_input_size(self) -> tuple[int, int]:
        """The side of the low-res logits (``mask_input``): a quarter of the model's input."""
        side = self.model.image_size // 4
        return side, side

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Compute the features of an ``H x W x 3`` uint8 image (RGB, or BGR when said)."""
        from ..sam_v1.predictor import check_image

        if image_format not in ("RGB", "BGR"):
            raise ValueError(f"image_format must be 'RGB' or 'BGR', got {image_format!r}")
        check_image(image)
        if image_format == "BGR":
            image = np.ascontiguousarray(image[..., ::-1])
        self.predictor.set_image(image)
        self.image_state = {
            "features": self.predictor._features,
            "orig_hw": list(self.predictor._orig_hw),
        }
        self.is_image_set = True

    def activate(self) -> SAM2ImagePredictor:
        """The inner predictor with this wrapper's image state put back into it."""
        if not self.is_image_set or self.image_state is None:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")
        p = self.predictor
        p._features = self.image_state["features"]
        p._orig_hw = list(self.image_state["orig_hw"])
        p._is_image_set = True
        p._is_batch = False
        return p

    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        mask_input: np.ndarray | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`SAM2ImagePredictor.predict` on the current image; masks ``C x H x W`` bool
        (logits with ``return_logits``), scores ``C``, low-res logits ``C x h x w``."""
        p = self.activate()
        if mask_input is not None:
            mask_input = np.asarray(mask_input, dtype=np.float32)
            side = self.mask_input_size
            if mask_input.shape not in ((1, *side), (1, 1, *side)):
                raise ValueError(
                    f"mask_input must be 1 x {side[0]} x {side[1]} (low-res logits of a "
                    f"previous answer), got shape {tuple(mask_input.shape)}"
                )
        masks, scores, low_res = p.predict(
            point_coords,
            point_labels,
            box,
            mask_input,
            multimask_output=multimask_output,
            return_logits=return_logits,
        )
        return (masks if return_logits else masks > 0.5), scores, low_res

    def reset_image(self) -> None:
        self.image_state = None
        self.is_image_set = False
        self.predictor.reset_predictor()


def _released_name(model: SAM2Base) -> str:
    from ...models.sam2.build_sam import SAM2_SPECS

    spec = getattr(model, "spec", None)
    return next((name for name, s in SAM2_SPECS.items() if s == spec), "sam2")


def _image_hw(image: Any) -> tuple[int, int]:
    if isinstance(image, np.ndarray):
        return image.shape[0], image.shape[1]
    w, h = image.size  # PIL
    return h, w


__all__ = ["PIXEL_MEAN", "PIXEL_STD", "SAM2ImagePredictor", "SAM2Transforms", "Sam2Predictor"]
