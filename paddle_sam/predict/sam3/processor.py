"""``Sam3Processor``: the official SAM 3 image inference API (upstream: sam3_image_processor.py).

The image goes through the backbone once (``set_image``); text and box prompts then rerun only
the heads. Results land in the ``state`` dict under upstream's keys, as paddle tensors:
``masks`` (``K x 1 x H x W`` bool), ``masks_logits`` (``K x 1 x H x W`` probabilities, as
upstream names them), ``boxes`` (``K x 4`` xyxy pixels), ``scores`` (``K``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from ...models.common import can_be_inplace, resize_bilinear
from ...models.sam3.box_ops import box_cxcywh_to_xyxy
from ...models.sam3.geometry_encoders import Prompt
from ...models.sam3.sam3_image import PIXEL_DECODER_TERMS, FindStage, Sam3Image
from ..sam_v1.predictor import check_image


def _aa_bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Integer taps of torch's antialiased bilinear resize of uint8 images (its int16 path).

    Returns tap start indices ``[out]``, int64 weights ``[out, K]`` and the fixed-point
    precision: output = clip((sum(w * x) + 2^(p-1)) >> p, 0, 255).
    """
    scale = in_size / out_size
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    starts, rows = [], []
    for i in range(out_size):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        w = np.maximum(0.0, 1.0 - np.abs((np.arange(lo, hi) - center + 0.5) * invscale))
        total = w.sum()
        starts.append(lo)
        rows.append(w / total if total != 0 else w)
    wmax = max(r.max() for r in rows)
    prec = 0
    while prec < 22 and int(0.5 + wmax * (1 << (prec + 1))) < (1 << 15):
        prec += 1
    k = max(len(r) for r in rows)
    weights = np.zeros((out_size, k), np.int64)
    for i, r in enumerate(rows):
        weights[i, : len(r)] = np.floor(r * (1 << prec) + 0.5)
    return np.asarray(starts), weights, prec


def _resize_axis(x: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    in_size = x.shape[axis]
    starts, weights, prec = _aa_bilinear_taps(in_size, out_size)
    # int32 is exact: weights sum to ~2^prec <= 2^15 and pixels are < 2^8
    weights = weights.astype(np.int32)
    shape = [1] * x.ndim
    shape[axis] = out_size
    acc = None
    for t in range(weights.shape[1]):
        idx = np.minimum(starts + t, in_size - 1)  # zero weights beyond each row's taps
        term = np.take(x, idx, axis=axis).astype(np.int32) * weights[:, t].reshape(shape)
        acc = term if acc is None else acc + term
    acc += np.int32(1 << (prec - 1))
    return np.clip(acc >> prec, 0, 255).astype(np.uint8)


def resize_uint8_antialias(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``H x W x C`` uint8 -> ``height x width x C`` uint8, bit-exact with torchvision's
    ``v2.Resize`` (bilinear, antialias) on a uint8 tensor: horizontal pass, then vertical."""
    x = image
    if x.shape[1] != width:
        x = _resize_axis(x, width, axis=1)
    if x.shape[0] != height:
        x = _resize_axis(x, height, axis=0)
    return x


def _as_rgb_array(image: Any) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        Image = None  # noqa: N806
    if Image is not None and isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    if isinstance(image, np.ndarray):
        check_image(image)
        return image
    raise TypeError(
        f"image must be a PIL image or an H x W x 3 uint8 numpy array, got {type(image).__name__}"
    )


def preprocess_sam3_image(image: np.ndarray, resolution: int) -> np.ndarray:
    """``H x W x 3`` uint8 -> ``3 x R x R`` float32 in [-1, 1] (mean = std = 0.5)."""
    x = resize_uint8_antialias(image, resolution, resolution)
    x = x.transpose(2, 0, 1).astype(np.float32) / 255.0
    return (x - 0.5) / 0.5


class Sam3ProcessorBase:
    """Upstream's ``Sam3Processor`` API over four steps a runtime provides: the backbone on
    an image batch, the text encoder on one prompt, appending a box to the geometric prompt,
    and the heads on a state. ``Sam3Processor`` runs the dynamic model;
    ``paddle_sam.deploy.StaticSam3Processor`` the exported programs."""

    resolution: int
    confidence_threshold: float

    def _run_backbone(self, images: np.ndarray) -> dict:
        """``B x 3 x R x R`` preprocessed images -> ``backbone_out``."""
        raise NotImplementedError

    def _encode_text(self, prompt: str) -> dict:
        """-> ``language_features`` and ``language_mask`` (and what else the runtime keeps)."""
        raise NotImplementedError

    def _empty_prompt(self) -> Any:
        raise NotImplementedError

    def _append_box(self, prompt: Any, box: np.ndarray, label: bool) -> Any:
        """``box``: 4 float32 (cx, cy, w, h); returns the prompt with the box appended."""
        raise NotImplementedError

    def _run_heads(self, state: dict) -> dict:
        """-> ``pred_logits``, ``pred_boxes``, ``presence_logit_dec``, ``pred_masks``."""
        raise NotImplementedError

    def _preprocess(self, image: np.ndarray) -> np.ndarray:
        return preprocess_sam3_image(image, self.resolution)

    @paddle.no_grad()
    def set_image(self, image: Any, state: dict | None = None) -> dict:
        """Run the backbone on one image (PIL or ``H x W x 3`` uint8 RGB) and cache it in state."""
        state = {} if state is None else state
        array = _as_rgb_array(image)
        # the previous image's features go before the new ones are computed, not after (a
        # second copy of the maps at the peak: 0.2-0.3 GB for SAM 3 at 1008 px)
        state.pop("backbone_out", None)
        state["original_height"], state["original_width"] = array.shape[:2]
        state["backbone_out"] = self._run_backbone(self._preprocess(array)[None])
        return state

    @paddle.no_grad()
    def set_image_batch(self, images: list, state: dict | None = None) -> dict:
        """Run the backbone on a list of images (PIL or ``H x W x 3`` uint8 RGB)."""
        state = {} if state is None else state
        if not isinstance(images, list) or not images:
            raise ValueError("images must be a non-empty list of PIL images or arrays")
        arrays = [_as_rgb_array(im) for im in images]
        state.pop("backbone_out", None)  # before the new features, as in set_image
        state["original_heights"] = [a.shape[0] for a in arrays]
        state["original_widths"] = [a.shape[1] for a in arrays]
        state["backbone_out"] = self._run_backbone(np.stack([self._preprocess(a) for a in arrays]))
        return state

    @paddle.no_grad()
    def set_text_prompt(self, prompt: str, state: dict) -> dict:
        """Set (replace) the text prompt and run the heads."""
        if "backbone_out" not in state:
            raise ValueError("You must call set_image before set_text_prompt")
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
        state["backbone_out"].update(self._encode_text(prompt))
        if "geometric_prompt" not in state:
            state["geometric_prompt"] = self._empty_prompt()
        return self._forward_grounding(state)

    @paddle.no_grad()
    def add_geometric_prompt(self, box: Any, label: bool, state: dict) -> dict:
        """Add a box ``[cx, cy, w, h]`` normalised to [0, 1]; label True = positive."""
        if "backbone_out" not in state:
            raise ValueError("You must call set_image before add_geometric_prompt")
        box = np.asarray(box, dtype=np.float32)
        if box.shape != (4,) or not np.isfinite(box).all():
            raise ValueError(f"box must be 4 finite numbers [cx, cy, w, h], got {box.tolist()}")
        if "language_features" not in state["backbone_out"]:
            # no text yet: upstream prompts the text encoder with "visual"
            state["backbone_out"].update(self._encode_text("visual"))
        if "geometric_prompt" not in state:
            state["geometric_prompt"] = self._empty_prompt()
        state["geometric_prompt"] = self._append_box(state["geometric_prompt"], box, label)
        return self._forward_grounding(state)

    def reset_all_prompts(self, state: dict) -> None:
        """Remove every prompt and result; the image features stay."""
        for key in ("language_features", "language_mask", "language_embeds"):
            state.get("backbone_out", {}).pop(key, None)
        for key in ("geometric_prompt", "boxes", "masks", "masks_logits", "scores"):
            state.pop(key, None)

    @paddle.no_grad()
    def set_confidence_threshold(self, threshold: float, state: dict | None = None) -> dict | None:
        """Change the threshold; reruns the heads when state already holds results."""
        self.confidence_threshold = threshold
        if state is not None and "boxes" in state:
            return self._forward_grounding(state)
        return state

    @paddle.no_grad()
    def _forward_grounding(self, state: dict) -> dict:
        if "original_height" not in state:
            raise ValueError("prompts need an image set with set_image (not set_image_batch)")
        out = self._run_heads(state)
        state.update(postprocess_grounding(out, state, self.confidence_threshold))
        return state


class Sam3Processor(Sam3ProcessorBase):
    """Text / box prompted segmentation with a SAM 3 image model, upstream's API."""

    def __init__(
        self,
        model: Sam3Image,
        resolution: int = 1008,
        device: str | None = None,
        confidence_threshold: float = 0.5,
    ) -> None:
        if device is not None:
            paddle.set_device(device)
        self.model = model
        self.resolution = resolution
        self.device = device
        self.confidence_threshold = confidence_threshold
        self.find_stage = FindStage(
            img_ids=paddle.to_tensor([0], dtype="int64"),
            text_ids=paddle.to_tensor([0], dtype="int64"),
        )

    def _run_backbone(self, images: np.ndarray) -> dict:
        backbone_out = self.model.backbone.forward_image(paddle.to_tensor(images))
        self._project_sam2_features(backbone_out)
        head = self.model.segmentation_head
        if head is not None:
            # the pixel decoder's convolutions of the image's own FPN levels, once per image:
            # each prompt then convolves only its upsampled part (PixelDecoder.forward);
            # measured here: +0.8 s per image, -0.45 s per prompt (2 threads)
            terms = head.pixel_decoder.image_terms(backbone_out["backbone_fpn"])
            backbone_out[PIXEL_DECODER_TERMS] = terms
        return backbone_out

    def _project_sam2_features(self, backbone_out: dict) -> None:
        """With the interactive predictor, run its decoder's 1x1 projections of the two finest
        second-neck levels once per image (upstream does it here too)."""
        sam2 = backbone_out.get("sam2_backbone_out")
        if self.model.inst_interactive_predictor is None or sam2 is None:
            return
        decoder = self.model.inst_interactive_predictor.model.sam_mask_decoder
        sam2["backbone_fpn"][0] = decoder.conv_s0(sam2["backbone_fpn"][0])
        sam2["backbone_fpn"][1] = decoder.conv_s1(sam2["backbone_fpn"][1])

    def _encode_text(self, prompt: str) -> dict:
        return self.model.backbone.forward_text([prompt])

    def _empty_prompt(self) -> Prompt:
        return self.model._get_dummy_prompt()

    def _append_box(self, prompt: Prompt, box: np.ndarray, label: bool) -> Prompt:
        prompt.append_boxes(
            paddle.to_tensor(box).reshape([1, 1, 4]),
            paddle.to_tensor([[int(bool(label))]], dtype="int64"),
        )
        return prompt

    def _run_heads(self, state: dict) -> dict:
        return self.model.forward_grounding(
            backbone_out=state["backbone_out"],
            find_input=self.find_stage,
            geometric_prompt=state["geometric_prompt"],
            find_target=None,
        )


@paddle.no_grad()
def postprocess_grounding(out: dict, state: dict, threshold: float) -> dict:
    """The heads' outputs -> the results ``Sam3Processor`` puts in its state.

    ``out``: ``pred_logits`` ``1 x Q x 1``, ``presence_logit_dec`` ``1 x 1``, ``pred_boxes``
    ``1 x Q x 4`` (cx, cy, w, h in [0, 1]), ``pred_masks`` ``1 x Q x h x w`` low-res logits
    (paddle tensors). Queries scoring above ``threshold`` are kept; their masks are upscaled
    to the image of ``state`` (``original_height`` / ``original_width``). Returns ``masks``
    (``K x 1 x H x W`` bool), ``masks_logits`` (probabilities), ``boxes`` (``K x 4`` xyxy
    pixels), ``scores`` (``K``). Shared by the dynamic and the exported runtimes.
    """
    probs = F.sigmoid(out["pred_logits"]) * F.sigmoid(out["presence_logit_dec"]).unsqueeze(1)
    probs = probs.squeeze(-1)  # 1 x Q
    keep = paddle.nonzero(probs > threshold)  # K x 2
    img_h, img_w = state["original_height"], state["original_width"]
    if keep.shape[0] == 0:
        return {
            "masks_logits": paddle.zeros([0, 1, img_h, img_w], "float32"),
            "masks": paddle.zeros([0, 1, img_h, img_w], "bool"),
            "boxes": paddle.zeros([0, 4], "float32"),
            "scores": paddle.zeros([0], "float32"),
        }
    scores = paddle.gather_nd(probs, keep)
    boxes = box_cxcywh_to_xyxy(paddle.gather_nd(out["pred_boxes"], keep))
    boxes = boxes * paddle.to_tensor([img_w, img_h, img_w, img_h], dtype=boxes.dtype)
    masks = paddle.gather_nd(out["pred_masks"], keep).unsqueeze(1)
    masks = upscaled_probabilities(masks, (img_h, img_w))
    return {"masks_logits": masks, "masks": masks > 0.5, "boxes": boxes, "scores": scores}


#: from this many values (64 MB of float32) the upscaled masks' sigmoid is computed in place
SIGMOID_IN_PLACE_FROM = 16 * 2**20


def upscaled_probabilities(masks: paddle.Tensor, size: tuple[int, int]) -> paddle.Tensor:
    """``sigmoid(resize_bilinear(masks, size))``. Large results (all 200 queries of a full-size
    image: 0.6 GB) take the sigmoid in place, ``1 / (1 + exp(-x))`` op by op on the upscaled
    buffer, the formula of Paddle's CPU kernel (the same values; twice its time, a second
    0.6 GB not allocated)."""
    up = resize_bilinear(masks, size)
    if int(up.numel()) < SIGMOID_IN_PLACE_FROM or not can_be_inplace(up):
        return F.sigmoid(up)
    up.scale_(-1.0)
    up.exp_()
    up.scale_(1.0, 1.0)
    return up.reciprocal_()
