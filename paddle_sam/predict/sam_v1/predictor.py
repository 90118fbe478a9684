"""Drop-in ``SamPredictor``: same calls, arguments, defaults and returns as segment-anything's.

The image embedding is computed once by :meth:`SamPredictor.set_image` and reused by every
:meth:`SamPredictor.predict` call. ``predict_torch`` / ``set_torch_image`` are upstream's names
for the Paddle versions, and also take PyTorch tensors, so ported code runs unchanged.
"""

from __future__ import annotations

import numpy as np
import paddle

from ...models.common import worker_pool
from ...models.sam_v1.sam import (
    Sam,
    as_paddle,
    decode_from_image_terms,
    decoder_formulation,
    decoder_image_terms,
    few_tokens_max,
    postprocess_masks,
)
from .transforms import ResizeLongestSide


def check_image(image: np.ndarray, name: str = "image") -> None:
    """Raise a ValueError unless ``image`` is an H x W x 3 uint8 array."""
    if not isinstance(image, np.ndarray):
        raise TypeError(
            f"{name} must be a numpy array (H x W x 3 uint8), got {type(image).__name__}"
        )
    if image.ndim != 3 or image.shape[2] != 3:
        hint = ""
        if image.ndim == 2:
            hint = " (grayscale: stack it to 3 channels or use PIL's .convert('RGB'))"
        elif image.ndim == 3 and image.shape[2] == 4:
            hint = " (RGBA: drop or composite the alpha channel, e.g. PIL's .convert('RGB'))"
        raise ValueError(f"{name} must have shape H x W x 3, got {tuple(image.shape)}{hint}")
    if image.dtype != np.uint8:
        raise ValueError(
            f"{name} must be uint8 (0..255), got dtype {image.dtype}; scale 16-bit or float "
            "images to 8 bits first"
        )
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"{name} is empty: shape {tuple(image.shape)}")


def check_resizable(shape: tuple[int, ...], long_side: int, name: str = "image") -> None:
    """Raise a ValueError if resizing ``shape`` (H, W) so its longer side is ``long_side``
    leaves the other side under one pixel (an extreme aspect ratio, e.g. 1 x 100000)."""
    h, w = (int(v) for v in shape[:2])
    new_h, new_w = ResizeLongestSide.get_preprocess_shape(h, w, long_side)
    if min(new_h, new_w) < 1:
        raise ValueError(
            f"{name} of shape {h} x {w} (H x W) is too elongated: resized to {long_side} "
            f"pixels on its longer side, the shorter one would be 0 pixels; the longer side "
            f"may be at most {2 * long_side} times the shorter"
        )


class PredictorBase:
    """What every predictor shares: image checks and resizing, prompt checks, the numpy API.

    Subclasses embed a resized image (:meth:`_embed`) and decode prompts given in the
    resized frame (:meth:`_decode`); ``mask_input_size`` and ``image_format`` describe the
    model.
    """

    image_format: str = "RGB"
    mask_input_size: tuple[int, int]

    # what the service reads (``predict.base.InteractivePredictor``): SAM v1 takes points, a
    # box and a previous mask, and answers with candidate masks of one object
    session_state_keys: tuple[str, ...] = ("features", "original_size", "input_size")
    takes_text = False
    takes_points = True
    takes_mask_input = True
    returns_instances = False
    model_type: str | None = None
    everything_refusal: str | None = None
    mask_refusal: str | None = None
    is_image_set = False

    @staticmethod
    def is_interactive(text: str | None, has_points: bool, has_mask: bool) -> bool:
        """Every request is answered with candidate masks of one object."""
        return True

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Compute and keep the embedding of an H x W x 3 uint8 image."""
        if image_format not in ("RGB", "BGR"):
            raise ValueError(f"image_format must be 'RGB' or 'BGR', got {image_format!r}")
        check_image(image)
        check_resizable(image.shape[:2], self.transform.target_length)
        if image_format != self.image_format:
            image = image[..., ::-1]
        input_image = self.transform.apply_image(np.ascontiguousarray(image))
        self._embed(input_image, image.shape[:2])

    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        mask_input: np.ndarray | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks for the prompts on the current image.

        point_coords: N x 2 (x, y) pixels of the original image; point_labels: N (1
        foreground, 0 background); box: 4 (x0, y0, x1, y1); mask_input: 1 x 256 x 256
        low-res logits from a previous call. Returns masks (C x H x W, bool unless
        ``return_logits``), IoU predictions (C) and low-res logits (C x 256 x 256), C = 3
        with ``multimask_output`` else 1.
        """
        self._require_image()
        coords = labels = None
        if point_coords is not None or point_labels is not None:
            coords, labels = self._check_points(point_coords, point_labels)
            coords = self.transform.apply_coords(coords, self.original_size)
        if box is not None:
            box = self.transform.apply_boxes(self._check_box(box), self.original_size)
        if mask_input is not None:
            mask_input = self._check_mask_input(mask_input)
        return self._decode(coords, labels, box, mask_input, multimask_output, return_logits)

    def reset_image(self) -> None:
        self.is_image_set = False
        self.features = None
        self.original_size = self.input_size = None

    # -- input checks: clear errors instead of tracebacks from inside Paddle --

    def _require_image(self) -> None:
        if not self.is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")

    def _check_points(self, coords, labels) -> tuple[np.ndarray, np.ndarray]:
        if coords is None or labels is None:
            raise ValueError(
                "point_labels must be supplied if point_coords is supplied (and vice versa)"
            )
        coords = np.asarray(coords, dtype=np.float64)
        labels = np.asarray(labels)
        if coords.ndim != 2 or coords.shape[1] != 2:
            raise ValueError(f"point_coords must have shape N x 2, got {coords.shape}")
        if coords.shape[0] == 0:
            raise ValueError("point_coords is empty; pass None for no points")
        if labels.shape != (coords.shape[0],):
            raise ValueError(
                f"point_labels must have shape ({coords.shape[0]},) to match point_coords, "
                f"got {labels.shape}"
            )
        if not np.isin(labels, (-1, 0, 1)).all():
            raise ValueError(
                f"point_labels must be 1 (foreground), 0 (background) or -1 (padding), "
                f"got {sorted(set(labels.ravel().tolist()))}"
            )
        self._check_in_image(coords, "point_coords")
        return coords, labels.astype(np.int32)

    def _check_box(self, box) -> np.ndarray:
        box = np.asarray(box, dtype=np.float64)
        if box.shape not in ((4,), (1, 4)):
            raise ValueError(
                f"box must have shape (4,) as x0, y0, x1, y1 (use predict_paddle for several "
                f"boxes), got {box.shape}"
            )
        box = box.reshape(4)
        if box[2] < box[0] or box[3] < box[1]:
            raise ValueError(
                f"box must be x0, y0, x1, y1 with x0 <= x1 and y0 <= y1, got {box.tolist()}"
            )
        self._check_in_image(box.reshape(2, 2), "box")
        return box

    def _check_in_image(self, xy: np.ndarray, name: str) -> None:
        if not np.isfinite(xy).all():
            raise ValueError(f"{name} contains NaN or infinite values")
        h, w = self.original_size
        outside = (xy[:, 0] < 0) | (xy[:, 0] > w) | (xy[:, 1] < 0) | (xy[:, 1] > h)
        if outside.any():
            raise ValueError(
                f"{name} {xy[outside].tolist()} lie outside the image (width {w}, height {h})"
            )

    def _check_mask_input(self, mask_input) -> np.ndarray:
        mask_input = np.asarray(mask_input, dtype=np.float32)
        size = tuple(self.mask_input_size)
        if mask_input.shape != (1, *size):
            raise ValueError(
                f"mask_input must have shape 1 x {size[0]} x {size[1]} (low-res logits of a "
                f"previous prediction), got {mask_input.shape}"
            )
        if not np.isfinite(mask_input).all():
            raise ValueError("mask_input contains NaN or infinite values")
        return mask_input


class SamPredictor(PredictorBase):
    # prompts of few points / a box and no mask input run the mask decoder in its faster form
    # (see _decode_few); False runs upstream's modules one by one, as `paddle-sam align` needs
    fast_decoder: bool = True

    def __init__(self, sam_model: Sam) -> None:
        """Predict masks for one image at a time from prompts, reusing its embedding."""
        self.model = sam_model
        self.transform = ResizeLongestSide(sam_model.image_encoder.img_size)
        self.image_format = sam_model.image_format
        self.mask_input_size = tuple(sam_model.prompt_encoder.mask_input_size)
        self.reset_image()

    @property
    def device(self) -> str:
        """The model's device, spelled as PyTorch does (``"cpu"``, ``"cuda:0"``): as upstream,
        ``torch.tensor(..., device=predictor.device)`` works, and so does
        ``paddle.to_tensor(..., place=predictor.device)``."""
        return self.model.device

    def _embed(self, input_image: np.ndarray, original_size: tuple[int, int]) -> None:
        tensor = paddle.to_tensor(input_image).transpose([2, 0, 1]).unsqueeze(0)
        self.set_paddle_image(tensor, original_size)

    @paddle.no_grad()
    def set_paddle_image(
        self, transformed_image: paddle.Tensor, original_image_size: tuple[int, ...]
    ) -> None:
        """Embed a 1 x 3 x h x w image already resized with :class:`ResizeLongestSide`.

        ``set_torch_image`` is the same method under upstream's name: the image may also be a
        PyTorch tensor (or a numpy array), moved to the model's device.
        """
        transformed_image = as_paddle(transformed_image, self.model.pixel_mean.place)
        size = self.model.image_encoder.img_size
        shape = tuple(transformed_image.shape)
        if len(shape) != 4 or shape[0] != 1 or shape[1] != 3 or max(shape[2:]) != size:
            raise ValueError(
                f"set_paddle_image expects a 1 x 3 x h x w tensor with long side {size}, "
                f"got {list(shape)}"
            )
        self.reset_image()
        self.original_size = tuple(int(v) for v in original_image_size)
        self.input_size = tuple(int(v) for v in shape[-2:])
        input_image = self.model.preprocess(transformed_image)
        self.features = self.model.image_encoder(input_image)
        # depends only on the weights; computed here once instead of on every prompt
        self.dense_pe = self.model.prompt_encoder.get_dense_pe()
        self.is_image_set = True

    set_torch_image = set_paddle_image

    def _decode(self, coords, labels, box, mask_input, multimask_output, return_logits):
        coords_t = labels_t = box_t = mask_t = None
        place = self.model.pixel_mean.place
        if coords is not None:
            coords_t = paddle.to_tensor(coords[None], dtype="float32", place=place)
            labels_t = paddle.to_tensor(labels[None], dtype="int32", place=place)
        if box is not None:
            box_t = paddle.to_tensor(box[None], dtype="float32", place=place)
        if mask_input is not None:
            mask_t = paddle.to_tensor(mask_input[None], dtype="float32", place=place)
        if not place.is_cpu_place():  # upscaled on the device
            out = self.predict_paddle(
                coords_t, labels_t, box_t, mask_t, multimask_output, return_logits
            )
            return tuple(x[0].numpy() for x in out)
        # on the CPU the upscaling runs in numpy (OpenCV) anyway: the arrays stay numpy, not
        # copied into Paddle tensors of the full image size and back
        iou, low_res = self._predict_low_res(coords_t, labels_t, box_t, mask_t, multimask_output)
        low = low_res.numpy()[0]
        size = self.model.image_encoder.img_size
        masks = postprocess_masks(low[None], self.input_size, self.original_size, size)[0]
        masks = np.ascontiguousarray(masks) if return_logits else masks > self.model.mask_threshold
        return masks, iou.numpy()[0], low

    @paddle.no_grad()
    def predict_paddle(
        self,
        point_coords: paddle.Tensor | None,
        point_labels: paddle.Tensor | None,
        boxes: paddle.Tensor | None = None,
        mask_input: paddle.Tensor | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """Batched prediction with prompts already in the resized frame.

        point_coords: B x N x 2, point_labels: B x N, boxes: B x 4, mask_input:
        B x 1 x 256 x 256. Returns masks B x C x H x W, IoU B x C, low-res B x C x 256 x 256.

        ``predict_torch`` is the same method under upstream's name: the prompts may also be
        PyTorch tensors (or numpy arrays), moved to the model's device; the results are paddle
        Tensors, which have the ``.cpu().numpy()`` that upstream's callers use.
        """
        self._require_image()
        place = self.model.pixel_mean.place
        point_coords, point_labels, boxes, mask_input = (
            as_paddle(x, place) for x in (point_coords, point_labels, boxes, mask_input)
        )
        iou_predictions, low_res_masks = self._predict_low_res(
            point_coords, point_labels, boxes, mask_input, multimask_output
        )
        masks = self.model.postprocess_masks(low_res_masks, self.input_size, self.original_size)
        if not return_logits:
            masks = masks > self.model.mask_threshold
        return masks, iou_predictions, low_res_masks

    predict_torch = predict_paddle

    @paddle.no_grad()
    def _predict_low_res(
        self,
        point_coords: paddle.Tensor | None,
        point_labels: paddle.Tensor | None,
        boxes: paddle.Tensor | None,
        mask_input: paddle.Tensor | None,
        multimask_output: bool,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """IoU predictions B x C and low-res logits B x C x h x w of :meth:`predict_paddle`."""
        if (point_coords is None) != (point_labels is None):
            raise ValueError("point_coords and point_labels must be given together")
        few = None
        if self.fast_decoder and mask_input is None:
            few = self._few_token_prompt(point_coords, point_labels, boxes)
        if few is not None:  # the decoder's faster form, as the exported runtime's
            iou_predictions, low_res_masks = self._decode_few(*few)
            keep = slice(1, None) if multimask_output else slice(0, 1)
            iou_predictions, low_res_masks = iou_predictions[:, keep], low_res_masks[:, keep]
        else:
            points = (point_coords, point_labels) if point_coords is not None else None
            sparse, dense = self.model.prompt_encoder(points=points, boxes=boxes, masks=mask_input)
            low_res_masks, iou_predictions = self.model.mask_decoder(
                image_embeddings=self.features,
                image_pe=self.dense_pe,
                sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense,
                multimask_output=multimask_output,
            )
        return iou_predictions, low_res_masks

    def _few_token_prompt(
        self,
        point_coords: paddle.Tensor | None,
        point_labels: paddle.Tensor | None,
        boxes: paddle.Tensor | None,
    ) -> tuple[paddle.Tensor, paddle.Tensor] | None:
        """Points and box packed as upstream's prompt encoder orders its tokens (the points,
        then the box corners labelled 2 and 3, or the padding point labelled -1 without a box),
        when they are few enough for the reassociated attention to do less work; else None."""
        parts, labels = [], []
        if point_coords is not None:
            if point_coords.ndim != 3 or point_labels.shape != point_coords.shape[:2]:
                return None  # the general path names the problem
            parts.append(point_coords.astype("float32"))
            labels.append(point_labels.astype("float32"))
        if boxes is not None:
            corners = boxes.astype("float32").reshape([-1, 2, 2])
            parts.append(corners)
            labels.append(
                paddle.to_tensor([[2.0, 3.0]], place=corners.place).tile([len(corners), 1])
            )
        elif parts:
            pad = paddle.zeros_like(parts[0][:, :1])
            parts.append(pad)
            labels.append(paddle.full([pad.shape[0], 1], -1.0, "float32"))
        if not parts or len({int(p.shape[0]) for p in parts}) != 1:
            return None
        coords, codes = paddle.concat(parts, axis=1), paddle.concat(labels, axis=1)
        md = self.model.mask_decoder
        if 1 + md.num_mask_tokens + coords.shape[1] > few_tokens_max(self.model):
            return None
        return coords, codes

    def _decode_few(self, coords: paddle.Tensor, labels: paddle.Tensor):
        """IoU B x M and low-res logits B x M x h x w of all M mask tokens for packed points
        (:meth:`_few_token_prompt`): the image's own decoder terms once per image, the
        attention reassociated for the few tokens, the upscaling as per-token GEMMs; the same
        function as the mask decoder's, rounded differently (~1e-7)."""
        sam = self.model
        terms, key_pe, gemm = self._image_terms()
        with decoder_formulation(sam, few_tokens=True, channels_last=True):
            return decode_from_image_terms(
                sam.prompt_encoder, sam.mask_decoder, terms, key_pe, coords, labels, gemm
            )

    @paddle.no_grad()
    def predict_point_grid(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One positive point per prompt, as the automatic mask generator asks: points N x 2
        in the resized frame -> IoU predictions N x 3 and low-res logits N x 3 x h x w
        (numpy) of the three multimask outputs, not upscaled (the generator upscales only
        the masks it keeps).

        The same function as ``predict_paddle(points[:, None], ones, multimask_output=True)``
        (rounded differently, ~1e-7), in the decoder's faster forms, as the exported runtime
        computes it: the image's own terms once per image, the attention reassociated for
        the few tokens, the upscaling as per-token GEMMs. On the CPU the prompts run one at
        a time on each of Paddle's threads: its elementwise CPU kernels use one thread each,
        and one prompt's tensors stay in cache (a batch of 64 ran 1.6x slower per prompt).
        """
        self._require_image()
        pts = np.asarray(points, np.float32).reshape(-1, 2)
        sam, n = self.model, len(pts)
        place = sam.pixel_mean.place
        md, pe = sam.mask_decoder, sam.prompt_encoder
        if 1 + md.num_mask_tokens + 2 > few_tokens_max(sam):  # more tokens than pay off
            coords = paddle.to_tensor(pts[:, None], place=place)
            masks, iou, low_res = self.predict_paddle(
                coords, paddle.ones([n, 1], "int32"), multimask_output=True, return_logits=True
            )
            return iou.numpy(), low_res.numpy()
        terms, key_pe, gemm = self._image_terms()
        # the point and upstream's padding point (label -1) of a prompt without a box
        coords = np.stack([pts, np.zeros_like(pts)], axis=1)
        coords_t = paddle.to_tensor(coords, place=place)
        labels_t = paddle.to_tensor(np.tile(np.float32([1, -1]), (n, 1)), place=place)

        def run(begin: int, end: int, step: int) -> list[tuple[paddle.Tensor, paddle.Tensor]]:
            with paddle.no_grad():
                return [
                    decode_from_image_terms(
                        pe, md, terms, key_pe, coords_t[i : i + step], labels_t[i : i + step], gemm
                    )
                    for i in range(begin, end, step)
                ]

        from ..._runtime import get_num_threads

        workers = min(n, get_num_threads() or 1) if place.is_cpu_place() else 1
        with decoder_formulation(sam, few_tokens=True, channels_last=True):
            if workers <= 1:
                outs = run(0, n, 1 if place.is_cpu_place() else n)
            else:
                bounds = np.linspace(0, n, workers + 1).round().astype(int)
                futures = [
                    worker_pool(workers).submit(run, int(a), int(b), 1)
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)
                ]
                outs = [out for f in futures for out in f.result()]
        iou = paddle.concat([o[0] for o in outs])[:, 1:]
        low_res = paddle.concat([o[1] for o in outs])[:, 1:]
        return iou.numpy(), low_res.numpy()

    def _image_terms(self) -> tuple[list[paddle.Tensor], paddle.Tensor, dict]:
        """The decoder's per-image terms of the current image (kept while its embedding is
        the same object), the image PE as tokens and the output heads' GEMM weights."""
        cached = self._grid_terms
        if cached is None or cached[0] is not self.features:
            sam = self.model
            terms = decoder_image_terms(
                sam.prompt_encoder, sam.mask_decoder, self.features, self.dense_pe
            )
            key_pe = self.dense_pe.flatten(2).transpose([0, 2, 1])
            cached = (self.features, terms, key_pe, sam.mask_decoder.gemm_weights())
            self._grid_terms = cached
        return cached[1], cached[2], cached[3]

    def get_image_embedding(self) -> paddle.Tensor:
        """The current image's embedding: 1 x C x H x W (C = 256, H = W = 64 for SAM)."""
        self._require_image()
        return self.features

    def reset_image(self) -> None:
        super().reset_image()
        self.dense_pe = None
        self._grid_terms = None
        if self.device.startswith("cuda"):
            # long-running processes: hand the previous image's blocks back to the device
            paddle.device.cuda.empty_cache()
