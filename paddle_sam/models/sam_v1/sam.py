"""The SAM model: image encoder + prompt encoder + mask decoder (upstream: modeling/sam.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from ..common import resize_bilinear, resize_bilinear_np
from .image_encoder import ImageEncoderViT
from .mask_decoder import MaskDecoder
from .prompt_encoder import PromptEncoder

# the entries of a ``Sam.forward`` record that hold tensors
_RECORD_TENSORS = ("image", "point_coords", "point_labels", "boxes", "mask_inputs")


def is_torch_tensor(x: Any) -> bool:
    """Whether ``x`` is a PyTorch tensor, recognised by its type's module (torch is never
    imported here: code ported from ``segment_anything`` may still hand one over)."""
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def as_paddle(x: Any, place: Any = None) -> Any:
    """A PyTorch tensor or numpy array as a paddle Tensor (through numpy, same dtype) on
    ``place`` (default: Paddle's current device); paddle Tensors, None and other values are
    returned as they are."""
    if is_torch_tensor(x):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return paddle.to_tensor(np.ascontiguousarray(x), place=place)
    return x


def device_name(place: Any) -> str:
    """A Paddle place as a device string in PyTorch's spelling: ``"cpu"``, ``"cuda:0"``.

    Paddle reads ``"cuda:N"`` as ``"gpu:N"``, so the string works for ``paddle.to_tensor(...,
    place=...)`` and for ``torch.tensor(..., device=...)`` alike; other places keep Paddle's
    name (``"xpu:0"``).
    """
    name = str(place)
    if name.startswith("Place(") and name.endswith(")"):
        name = name[len("Place(") : -1]
    if name.startswith("gpu:"):
        name = "cuda:" + name[len("gpu:") :]
    return name


def check_device(device: Any) -> Any:
    """Validate a device given to :meth:`Sam.to` and return it in a form Paddle takes.

    Strings as PyTorch or Paddle spell them (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"gpu"``,
    ``"gpu:0"``) and ``torch.device`` objects are accepted; a GPU device on a PaddlePaddle
    build without CUDA raises a ValueError saying so.
    """
    if type(device).__module__.split(".")[0] == "torch":  # torch.device("cuda:0")
        device = str(device)
    if not isinstance(device, str):
        return device  # a paddle Place, or None: Paddle checks it
    name = device.strip().lower()
    if name == "cuda" or name.startswith("cuda:"):
        name = "gpu" + name[len("cuda") :]
    if name == "gpu" or name.startswith("gpu:"):
        if not paddle.is_compiled_with_cuda():
            raise ValueError(
                f"device {device!r} needs a GPU build of PaddlePaddle, but this one is CPU-only "
                "(paddle.is_compiled_with_cuda() is False); use device='cpu'"
            )
        if name != "gpu" and not name[len("gpu:") :].isdigit():
            raise ValueError(f"device {device!r}: the GPU index must be a number, e.g. 'cuda:0'")
        return name  # "gpu": Paddle's current GPU, as "cuda" is PyTorch's
    if name != "cpu":
        return device  # xpu, custom devices: Paddle checks them
    return name


class Sam(nn.Layer):
    mask_threshold: float = 0.0
    image_format: str = "RGB"

    def __init__(
        self,
        image_encoder: ImageEncoderViT,
        prompt_encoder: PromptEncoder,
        mask_decoder: MaskDecoder,
        pixel_mean: tuple[float, float, float] = (123.675, 116.28, 103.53),
        pixel_std: tuple[float, float, float] = (58.395, 57.12, 57.375),
    ) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.prompt_encoder = prompt_encoder
        self.mask_decoder = mask_decoder
        # not part of the checkpoint (upstream registers them as non-persistent buffers)
        self.register_buffer(
            "pixel_mean",
            paddle.to_tensor(pixel_mean, dtype="float32").reshape([-1, 1, 1]),
            persistable=False,
        )
        self.register_buffer(
            "pixel_std",
            paddle.to_tensor(pixel_std, dtype="float32").reshape([-1, 1, 1]),
            persistable=False,
        )

    @property
    def device(self) -> str:
        """Where the weights are, spelled as PyTorch does (``"cpu"``, ``"cuda:0"``); both
        ``paddle.to_tensor(..., place=sam.device)`` and ``torch.tensor(..., device=sam.device)``
        take it."""
        return device_name(self.pixel_mean.place)

    def to(
        self,
        device: Any = None,
        dtype: Any = None,
        blocking: bool | None = None,
        non_blocking: bool | None = None,
    ) -> Sam:
        """Move (and/or cast) the weights, as ``paddle.nn.Layer.to``; returns the model.

        ``device`` may also be spelled as for PyTorch (``"cuda"``, ``"cuda:0"``, a
        ``torch.device``), so ``sam.to(device=device)`` from ``segment_anything`` code runs
        unchanged. A GPU device on a CPU-only PaddlePaddle build is a clear ValueError.
        """
        return super().to(
            device=check_device(device), dtype=dtype, blocking=blocking, non_blocking=non_blocking
        )

    @paddle.no_grad()
    def forward(
        self, batched_input: list[dict[str, Any]], multimask_output: bool
    ) -> list[dict[str, paddle.Tensor]]:
        """End-to-end prediction for a list of images, as upstream's ``Sam.forward``.

        Each input dict has ``image`` (3 x H x W, already resized to the longest side),
        ``original_size`` (H, W) and optionally ``point_coords`` (B x N x 2),
        ``point_labels`` (B x N), ``boxes`` (B x 4) and ``mask_inputs`` (B x 1 x 256 x 256),
        all in the resized frame. Tensors may be paddle Tensors, numpy arrays or PyTorch
        tensors (as ``segment_anything`` code builds them); they are used on the model's
        device. Returns dicts with ``masks`` (bool), ``iou_predictions`` and
        ``low_res_logits``.
        """
        batched_input = [self._record(x, i) for i, x in enumerate(batched_input)]
        input_images = paddle.stack([self.preprocess(x["image"]) for x in batched_input], axis=0)
        image_embeddings = self.image_encoder(input_images)
        outputs = []
        for record, emb in zip(batched_input, image_embeddings, strict=True):
            points = None
            if "point_coords" in record:
                points = (record["point_coords"], record["point_labels"])
            sparse, dense = self.prompt_encoder(
                points=points, boxes=record.get("boxes"), masks=record.get("mask_inputs")
            )
            low_res_masks, iou_predictions = self.mask_decoder(
                image_embeddings=emb.unsqueeze(0),
                image_pe=self.prompt_encoder.get_dense_pe(),
                sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense,
                multimask_output=multimask_output,
            )
            masks = self.postprocess_masks(
                low_res_masks,
                input_size=tuple(record["image"].shape[-2:]),
                original_size=record["original_size"],
            )
            outputs.append(
                {
                    "masks": masks > self.mask_threshold,
                    "iou_predictions": iou_predictions,
                    "low_res_logits": low_res_masks,
                }
            )
        return outputs

    def _record(self, record: Any, index: int) -> dict[str, Any]:
        """One ``batched_input`` entry checked, with its tensors as paddle Tensors."""
        if not isinstance(record, dict):
            raise TypeError(
                f"batched_input[{index}] must be a dict with 'image' and 'original_size', "
                f"got {type(record).__name__}"
            )
        missing = [k for k in ("image", "original_size") if k not in record]
        if missing:
            raise ValueError(f"batched_input[{index}] has no {' or '.join(map(repr, missing))}")
        if ("point_coords" in record) != ("point_labels" in record):
            raise ValueError(
                f"batched_input[{index}]: 'point_coords' and 'point_labels' go together"
            )
        place = self.pixel_mean.place
        out = dict(record)
        for key in _RECORD_TENSORS:
            if key in out:
                out[key] = as_paddle(out[key], place)
        image = out["image"]
        if not isinstance(image, paddle.Tensor) or image.ndim != 3 or image.shape[0] != 3:
            shape = list(getattr(image, "shape", []))
            raise ValueError(
                f"batched_input[{index}]['image'] must be a 3 x H x W tensor (resized with "
                f"ResizeLongestSide, channels first), got {type(image).__name__} {shape}"
            )
        return out

    def postprocess_masks(
        self,
        masks: paddle.Tensor,
        input_size: tuple[int, ...],
        original_size: tuple[int, ...],
    ) -> paddle.Tensor:
        """Low-res logits (B x C x h x w) -> logits at the original image size (B x C x H x W)."""
        return postprocess_masks(masks, input_size, original_size, self.image_encoder.img_size)

    def preprocess(self, x: paddle.Tensor) -> paddle.Tensor:
        """Normalise a (B x) 3 x h x w resized image and pad it bottom-right to img_size."""
        return preprocess_image(x, self.pixel_mean, self.pixel_std, self.image_encoder.img_size)


def preprocess_image(
    x: paddle.Tensor, pixel_mean: paddle.Tensor, pixel_std: paddle.Tensor, size: int
) -> paddle.Tensor:
    """(x - mean) / std, zero-padded bottom-right to size x size (shared with the static
    runtime, so both paths preprocess identically). mean, std: 3 x 1 x 1."""
    x = (x.astype("float32") - pixel_mean) / pixel_std
    h, w = x.shape[-2:]
    if h > size or w > size:
        raise ValueError(
            f"image of size {h}x{w} is larger than the encoder input {size}x{size}; "
            "resize it to the longest side first (ResizeLongestSide)"
        )
    if h < size or w < size:
        # full-rank pad spec: (before, after) for every axis, first axis first
        x = F.pad(x, [0, 0] * (x.ndim - 2) + [0, size - h, 0, size - w], value=0.0)
    return x


def postprocess_masks(
    masks: paddle.Tensor | np.ndarray,
    input_size: tuple[int, ...],
    original_size: tuple[int, ...],
    size: int,
) -> paddle.Tensor | np.ndarray:
    """Upscale low-res logits to the padded size x size input, crop the padding, resize to the
    original image size (shared with the static runtime, which upscales only the masks it
    keeps, as numpy). ``B x C x h x w`` paddle tensor or numpy array, returned as given.
    """
    resize = resize_bilinear_np if isinstance(masks, np.ndarray) else resize_bilinear
    masks = resize(masks, [size, size])
    masks = masks[..., : int(input_size[0]), : int(input_size[1])]
    if tuple(original_size) == tuple(masks.shape[-2:]):
        return masks  # bilinear resampling to the same size is the identity
    return resize(masks, original_size)


# -- the mask decoder from per-image terms (the same function, less work per prompt) --


def decoder_image_terms(
    prompt_encoder: PromptEncoder,
    mask_decoder: MaskDecoder,
    image_embeddings: paddle.Tensor,
    dense_pe: paddle.Tensor,
) -> list[paddle.Tensor]:
    """What the mask decoder derives from the image alone for a prompt without mask input
    (1 x C x h x w embedding, its dense PE): the image tokens with the no-mask embedding
    added and the first transformer block's projections of them
    (``TwoWayTransformer.image_terms``); the input of :func:`decode_from_image_terms`."""
    no_mask = prompt_encoder.no_mask_embed.weight.reshape([1, -1, 1, 1])
    return mask_decoder.transformer.image_terms(image_embeddings + no_mask, dense_pe)


def decode_from_image_terms(
    prompt_encoder: PromptEncoder,
    mask_decoder: MaskDecoder,
    image_terms: list[paddle.Tensor],
    key_pe: paddle.Tensor,
    point_coords: paddle.Tensor,
    point_labels: paddle.Tensor,
    gemm_weights: dict[str, list[paddle.Tensor]] | None = None,
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The prompt encoder and mask decoder for points only (B x N x 2 in the resized frame,
    padding included; labels B x N) from :func:`decoder_image_terms`; key_pe: the dense PE as
    tokens (1 x hw x C). Returns IoU predictions B x M and low-res logits B x M x 4h x 4w for
    all M mask tokens (the single mask first). Inside :func:`decoder_formulation` with
    ``few_tokens=True`` the attention runs reassociated for the few tokens."""
    sparse = prompt_encoder._embed_points(point_coords, point_labels, pad=False)
    tokens = mask_decoder.prompt_tokens(sparse)
    hs, src = mask_decoder.transformer.forward_from_image_terms(image_terms, key_pe, tokens)
    h, w = prompt_encoder.image_embedding_size
    low_res, iou = mask_decoder.output_heads(hs, src, h, w, gemm_weights)
    return iou, low_res


@contextmanager
def decoder_formulation(sam: Sam, *, few_tokens: bool, channels_last: bool) -> Iterator[None]:
    """Within the block, ``sam``'s mask decoder computes the same function in the faster
    forms: cross-attention reassociated for few prompt tokens, output upscaling as per-token
    GEMMs (``MaskDecoder._masks_channels_last``). Restored on exit. It sets attributes of the
    model's layers: other threads using the same model meanwhile compute in these forms too
    (the same function, rounded differently)."""
    md = sam.mask_decoder
    t = md.transformer
    sides = [(layer.cross_attn_token_to_image, "query") for layer in t.layers]
    sides += [(layer.cross_attn_image_to_token, "key") for layer in t.layers]
    sides.append((t.final_attn_token_to_image, "query"))
    saved = [a.few_tokens for a, _ in sides], md.channels_last_upscaling
    try:
        for attn, side in sides:
            attn.few_tokens = side if few_tokens else None
        md.channels_last_upscaling = channels_last
        yield
    finally:
        for (attn, _), old in zip(sides, saved[0], strict=True):
            attn.few_tokens = old
        md.channels_last_upscaling = saved[1]


def few_tokens_max(sam: Sam) -> int:
    """Most tokens (output tokens + prompt points) for which the reassociated attention does
    less work: h * N <= internal_dim, i.e. N <= channels per head."""
    attn = sam.mask_decoder.transformer.final_attn_token_to_image
    return attn.internal_dim // attn.num_heads
