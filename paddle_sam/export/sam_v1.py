"""Export SAM v1 to PIR static programs and a manifest.

``image_encoder.{json,pdiparams}``: preprocessed image (B x 3 x S x S, dynamic batch) ->
image embedding. ``prompt_decoder.{json,pdiparams}``: prompt encoder + mask decoder, with a
dynamic number of points; boxes travel as two points labelled 2 and 3 (as in upstream's ONNX
export), an optional mask input with a has-mask flag; it returns IoU predictions and low-res
logits, and the runtime upscales the masks it keeps with the dynamic model's own
``postprocess_masks``. ``export.json`` records what a runtime needs (sizes, normalisation,
versions, source checksum). The ONNX export (``export/onnx.py``) keeps the upscaling in the
decoder graph, with the original image size as an input, as upstream's ONNX model does.
Preprocessing is not in the graph: the static runtime reuses :class:`ResizeLongestSide` and
``Sam.preprocess`` exactly as the dynamic predictor does.

The PIR decoder programs compute the mask decoder in faster forms of the same function
(:func:`decoder_formulation`): output upscaling as per-token GEMMs, and a pair of programs
for prompts without a mask input and with at most ``few_tokens_max`` tokens (vit_b: 16, i.e.
up to 10 points, or a box and 9 points), which the runtime picks for such prompts:
``decoder_image_terms`` runs once per image (after the encoder) and computes what the
decoder derives from the image alone (the image tokens with the no-mask embedding added and
the first transformer block's projections of them, ``TwoWayTransformer.image_terms``);
``prompt_decoder_few`` takes those and the points, with the later cross-attentions
reassociated for few prompt tokens and the hypernetwork MLPs batched. Parity with the
dynamic model is tested like the rest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.static import InputSpec

from ..convert.source import EXPORT_MANIFEST
from ..models.sam_v1.sam import (  # noqa: F401 (decoder_formulation, few_tokens_max: export API)
    Sam,
    decode_from_image_terms,
    decoder_formulation,
    decoder_image_terms,
    few_tokens_max,
)
from ..predict.outputs import check_targets, claim

EXPORT_FORMAT = "paddle-sam/sam_v1-static"
# 2: the Paddle Inference decoder returns low-res logits; the runtime upscales what it keeps
# 3: prompt_decoder_few takes the image terms of decoder_image_terms instead of the embedding
FORMAT_VERSION = 3
MANIFEST = EXPORT_MANIFEST  # the file sniff() reads an export folder by
PROGRAMS = ("image_encoder", "prompt_decoder")
# The prompt decoder for few prompt tokens and no mask input (see ``FewTokenDecoder``) and the
# per-image program whose outputs it takes: used by the runtime when the token count allows;
# optional, an export without them runs ``prompt_decoder`` for every prompt.
FEW_TOKENS_PROGRAM = "prompt_decoder_few"
IMAGE_TERMS_PROGRAM = "decoder_image_terms"
IMAGE_TERMS = (
    "image_tokens",
    "token_to_image_keys",
    "token_to_image_values",
    "image_to_token_queries",
)


class _WithGemmWeights(nn.Layer):
    """An exported decoder layer that stores the mask decoder's output-head weights in their
    GEMM layouts (``MaskDecoder.gemm_weights``) as constants, instead of computing them from
    the parameters in every call."""

    def _store_gemm_weights(self, mask_decoder) -> None:
        self._gemm_names: dict[str, list[str]] = {}
        with paddle.no_grad():
            for key, tensors in mask_decoder.gemm_weights().items():
                self._gemm_names[key] = [f"{key}_{i}" for i in range(len(tensors))]
                for name, value in zip(self._gemm_names[key], tensors, strict=True):
                    self.register_buffer(name, value.detach())

    def _gemm_weights(self) -> dict[str, list[paddle.Tensor]]:
        return {k: [getattr(self, n) for n in names] for k, names in self._gemm_names.items()}


class PromptDecoder(_WithGemmWeights):
    """Prompt encoder + mask decoder as one exportable layer.

    Inputs: image_embeddings 1 x C x h x w; point_coords 1 x N x 2 (resized frame);
    point_labels 1 x N (float: 1 fg, 0 bg, -1 padding, 2 / 3 box corners); mask_input
    1 x 1 x 4h x 4w; has_mask_input 1 (0 or 1); with ``upscale``, also orig_im_size 2 (int64
    H, W). Outputs: iou_predictions 1 x M, low_res_masks 1 x M x 4h x 4w, with M = all mask
    tokens (single mask first, then the multimask outputs); with ``upscale``, first masks
    1 x M x H x W (logits at the original size), as upstream's ONNX model does.

    Without ``upscale`` (the Paddle Inference program) the graph has no bilinear resize, so
    oneDNN can run it on Paddle 3.3.x, and the runtime upscales only the masks it returns.
    The dense positional encoding is a constant of the grid: stored, not recomputed per call;
    with ``gemm_weights``, so are the output heads' GEMM weights (``_WithGemmWeights``).
    """

    def __init__(self, sam: Sam, upscale: bool = False, gemm_weights: bool = False) -> None:
        super().__init__()
        self.prompt_encoder = sam.prompt_encoder
        self.mask_decoder = sam.mask_decoder
        self.img_size = sam.image_encoder.img_size
        self.upscale = upscale
        self.stored_gemm_weights = gemm_weights
        if gemm_weights:
            self._store_gemm_weights(self.mask_decoder)
        with paddle.no_grad():
            self.register_buffer("dense_pe", self.prompt_encoder.get_dense_pe().detach())

    def forward(
        self,
        image_embeddings: paddle.Tensor,
        point_coords: paddle.Tensor,
        point_labels: paddle.Tensor,
        mask_input: paddle.Tensor,
        has_mask_input: paddle.Tensor,
        orig_im_size: paddle.Tensor | None = None,
    ) -> tuple[paddle.Tensor, ...]:
        pe = self.prompt_encoder
        sparse = pe._embed_points(point_coords, point_labels, pad=False)
        h, w = pe.image_embedding_size
        no_mask = pe.no_mask_embed.weight.reshape([1, -1, 1, 1]).expand([1, -1, h, w])
        has_mask = has_mask_input.reshape([1, 1, 1, 1]) > 0.5
        dense = paddle.where(has_mask, pe._embed_masks(mask_input), no_mask)
        md = self.mask_decoder
        weights = self._gemm_weights() if self.stored_gemm_weights else None
        low_res, iou = md.predict_masks(image_embeddings, self.dense_pe, sparse, dense, weights)
        if not self.upscale:
            return iou, low_res
        return self.postprocess(low_res, orig_im_size), iou, low_res

    def postprocess(self, masks: paddle.Tensor, orig_im_size: paddle.Tensor) -> paddle.Tensor:
        """``postprocess_masks`` with the sizes as graph tensors (for the ONNX program)."""
        size = self.img_size
        masks = F.interpolate(masks, size=[size, size], mode="bilinear", align_corners=False)
        # ResizeLongestSide.get_preprocess_shape, in float64 like the Python original
        orig = orig_im_size.astype("float64")
        scale = float(size) / paddle.max(orig)
        input_hw = paddle.floor(orig * scale + 0.5).astype("int64")
        masks = paddle.slice(masks, axes=[2, 3], starts=[0, 0], ends=[input_hw[0], input_hw[1]])
        out_hw = orig_im_size.astype("int64")
        return F.interpolate(
            masks, size=[out_hw[0], out_hw[1]], mode="bilinear", align_corners=False
        )


class DecoderImageTerms(nn.Layer):
    """The mask decoder's per-image terms of a prompt without mask input: input
    image_embeddings 1 x C x h x w; outputs ``IMAGE_TERMS`` (``image_terms_shapes``)."""

    def __init__(self, sam: Sam) -> None:
        super().__init__()
        self.prompt_encoder = sam.prompt_encoder
        self.mask_decoder = sam.mask_decoder
        with paddle.no_grad():
            self.register_buffer("dense_pe", self.prompt_encoder.get_dense_pe().detach())

    def forward(self, image_embeddings: paddle.Tensor) -> list[paddle.Tensor]:
        return decoder_image_terms(
            self.prompt_encoder, self.mask_decoder, image_embeddings, self.dense_pe
        )


class FewTokenDecoder(_WithGemmWeights):
    """``PromptDecoder`` without mask input, from the image terms of ``DecoderImageTerms``:
    inputs ``IMAGE_TERMS``, point_coords 1 x N x 2, point_labels 1 x N; outputs
    iou_predictions 1 x M, low_res_masks 1 x M x 4h x 4w. Export it inside
    :func:`decoder_formulation` with ``few_tokens=True``. The image PE (as tokens) and the
    output heads' GEMM weights are constants of the model: stored, not recomputed per call.
    """

    def __init__(self, sam: Sam) -> None:
        super().__init__()
        self.prompt_encoder = sam.prompt_encoder
        self.mask_decoder = sam.mask_decoder
        with paddle.no_grad():
            pe = self.prompt_encoder.get_dense_pe().flatten(2).transpose([0, 2, 1])
            self.register_buffer("key_pe", pe.detach())
        self._store_gemm_weights(self.mask_decoder)

    def forward(
        self,
        image_tokens: paddle.Tensor,
        token_to_image_keys: paddle.Tensor,
        token_to_image_values: paddle.Tensor,
        image_to_token_queries: paddle.Tensor,
        point_coords: paddle.Tensor,
        point_labels: paddle.Tensor,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        terms = [image_tokens, token_to_image_keys, token_to_image_values, image_to_token_queries]
        return decode_from_image_terms(
            self.prompt_encoder,
            self.mask_decoder,
            terms,
            self.key_pe,
            point_coords,
            point_labels,
            self._gemm_weights(),
        )


def image_terms_shapes(sam: Sam) -> dict[str, list[int]]:
    """Shapes of the ``IMAGE_TERMS`` (batch 1): image tokens 1 x hw x C, per-head projections
    1 x heads x c x hw (keys, queries: transposed) and 1 x heads x hw x c (values)."""
    h, w = sam.prompt_encoder.image_embedding_size
    attn = sam.mask_decoder.transformer.layers[0].cross_attn_token_to_image
    heads, c = attn.num_heads, attn.internal_dim // attn.num_heads
    hw, dim = h * w, sam.mask_decoder.transformer_dim
    shapes = [[1, hw, dim], [1, heads, c, hw], [1, heads, hw, c], [1, heads, c, hw]]
    return dict(zip(IMAGE_TERMS, shapes, strict=True))


def point_input_spec() -> list[InputSpec]:
    """The point inputs of both decoder programs: a dynamic number of points, batch 1."""
    return [
        InputSpec([1, None, 2], "float32", "point_coords"),
        InputSpec([1, None], "float32", "point_labels"),
    ]


def decoder_input_spec(spec, upscale: bool) -> list[InputSpec]:
    """Inputs of the prompt decoder program: a dynamic number of points, batch 1."""
    grid, c = spec.image_embedding_size, spec.prompt_embed_dim
    inputs = [
        InputSpec([1, c, grid, grid], "float32", "image_embeddings"),
        *point_input_spec(),
        InputSpec([1, 1, 4 * grid, 4 * grid], "float32", "mask_input"),
        InputSpec([1], "float32", "has_mask_input"),
    ]
    if upscale:
        inputs.append(InputSpec([2], "int64", "orig_im_size"))
    return inputs


def save_programs(sam: Sam, out: Path, *, upscale: bool, fast: bool = False) -> None:
    """``paddle.jit.save`` the image encoder and the prompt decoder (PIR) into ``out``; with
    ``fast``, the decoder in its faster forms (same function), plus ``IMAGE_TERMS_PROGRAM``
    and ``FEW_TOKENS_PROGRAM``."""
    size = sam.spec.image_size
    sam.eval()
    paddle.jit.save(
        sam.image_encoder,
        str(out / "image_encoder"),
        input_spec=[InputSpec([None, 3, size, size], "float32", "image")],
    )
    with decoder_formulation(sam, few_tokens=False, channels_last=fast):
        paddle.jit.save(
            PromptDecoder(sam, upscale=upscale, gemm_weights=fast),
            str(out / "prompt_decoder"),
            input_spec=decoder_input_spec(sam.spec, upscale),
        )
    if not fast:
        return
    grid, c = sam.spec.image_embedding_size, sam.spec.prompt_embed_dim
    paddle.jit.save(
        DecoderImageTerms(sam),
        str(out / IMAGE_TERMS_PROGRAM),
        input_spec=[InputSpec([1, c, grid, grid], "float32", "image_embeddings")],
    )
    terms = [InputSpec(shape, "float32", name) for name, shape in image_terms_shapes(sam).items()]
    with decoder_formulation(sam, few_tokens=True, channels_last=True):
        paddle.jit.save(
            FewTokenDecoder(sam),
            str(out / FEW_TOKENS_PROGRAM),
            input_spec=terms + point_input_spec(),
        )


def check_outputs(out: Path, files: list[str], overwrite: bool) -> None:
    """paddle-sam's rule for outputs (:mod:`paddle_sam.predict.outputs`): a file paddle-sam
    did not write is never replaced, one it wrote only with ``overwrite``; then the files are
    recorded as the export's."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output {out} exists and is not a folder")
    check_targets(out, files, replace=overwrite, flag="overwrite=True (--overwrite)")
    claim(out, files, "export")


def write_manifest(
    out: Path, fmt: str, programs: dict, *, format_version: int = FORMAT_VERSION, **fields
) -> dict:
    """``export.json``: the format, what a runtime needs (``fields``: sizes, normalisation,
    checksum), the Paddle version and the program files; returns it as read back."""
    manifest = {
        "format": fmt,
        "format_version": format_version,
        **fields,
        "paddle_version": paddle.__version__,
        "programs": programs,
    }
    return save_manifest(out, manifest)


def save_manifest(out: Path, manifest: dict) -> dict:
    """``manifest`` written as ``out/export.json``; returns it as read back."""
    text = json.dumps(manifest, indent=2)
    (out / MANIFEST).write_text(text + "\n")
    return json.loads(text)


def sam_fields(sam: Sam) -> dict:
    """The manifest fields of a SAM v1 model (sizes, normalisation, mask threshold)."""
    return {
        "spec": sam.spec.to_dict(),
        "image_size": sam.spec.image_size,
        "pixel_mean": [float(v) for v in sam.pixel_mean.numpy().ravel()],
        "pixel_std": [float(v) for v in sam.pixel_std.numpy().ravel()],
        "mask_threshold": float(sam.mask_threshold),
        "num_mask_tokens": int(sam.mask_decoder.num_mask_tokens),
    }


def export_sam(
    sam: Sam,
    out_dir: str | os.PathLike,
    *,
    model_type: str | None = None,
    source_sha256: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Write ``image_encoder.*``, ``prompt_decoder.*`` and ``export.json`` to ``out_dir``."""
    out = Path(out_dir)
    every = (*PROGRAMS, IMAGE_TERMS_PROGRAM, FEW_TOKENS_PROGRAM)
    programs = {p: [f"{p}.json", f"{p}.pdiparams"] for p in every}
    check_outputs(out, [f for names in programs.values() for f in names] + [MANIFEST], overwrite)
    out.mkdir(parents=True, exist_ok=True)
    save_programs(sam, out, upscale=False, fast=True)
    return write_manifest(
        out,
        EXPORT_FORMAT,
        programs,
        model_type=model_type,
        source_sha256=source_sha256,
        few_tokens_max=few_tokens_max(sam),
        image_terms=image_terms_shapes(sam),
        **sam_fields(sam),
    )
