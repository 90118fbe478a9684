"""Export the SAM 3 image model to three PIR static programs and a manifest.

``backbone.{json,pdiparams}``: preprocessed image (1 x 3 x R x R, as ``Sam3Processor``
prepares it) -> the FPN levels the heads use (``backbone_fpn_i``, 1 x d x h_i x w_i).
``text_encoder.{json,pdiparams}``: token ids (1 x context length; the tokenizer stays in
Python, shared with the dynamic path) -> ``language_features`` (L x 1 x d) and
``language_mask`` (1 x L, True = padding). ``prompt_decoder.{json,pdiparams}``: FPN levels +
text features + boxes (1 x N x 4, normalised cx, cy, w, h; labels 1 x N; padding mask 1 x N)
-> ``pred_logits`` (1 x Q x 1), ``pred_boxes`` (1 x Q x 4), ``presence_logit_dec`` (1 x 1),
``pred_masks`` (1 x Q x h0 x w0 low-res logits). The number of boxes is dynamic; "no box" is
one padding box (mask True), which is exactly the dynamic model's empty prompt: a padded
token is masked out of every attention and every pooling (tests/export/test_export_sam3.py
checks it).
The vision position encoding is a constant of the grid: stored in the decoder program.
Upscaling, sigmoid and thresholding stay in the runtime (``postprocess_grounding``, shared
with ``Sam3Processor``).

``fused_attention`` (default: when the exporting machine can run it) puts Paddle's fused CPU
attention kernel (``self_dp_attention``, AVX-512) into the programs for the long
self-attentions (the ViT's global blocks, the fusion encoder's 72 x 72 image tokens), as the
dynamic model uses it on such CPUs (``models/sam3/model_misc.py``). That kernel exists for the
CPU only, so the manifest records it (``cpu_fused_attention``) and the runtime refuses such
an export on a GPU or on a CPU without AVX-512, naming the option that exports without it.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from paddle import nn
from paddle.static import InputSpec

from ..models.sam3.build_sam3 import Sam3Spec
from ..models.sam3.geometry_encoders import Prompt
from ..models.sam3.model_misc import fused_attention_available
from ..models.sam3.sam3_image import FindStage, Sam3Image
from .onnx import int8_files
from .sam_v1 import MANIFEST, check_outputs, save_manifest, write_manifest

EXPORT_FORMAT = "paddle-sam/sam3-static"
FORMAT_VERSION = 1
PROGRAMS = ("backbone", "text_encoder", "prompt_decoder")
DECODER_OUTPUTS = ("pred_logits", "pred_boxes", "presence_logit_dec", "pred_masks")
# the box fed for "no box": any finite box, masked out (its value never reaches an output)
PAD_BOX = (0.5, 0.5, 1.0, 1.0)
FUSED_KERNEL = "self_dp_attention"  # the op name of Paddle's fused CPU attention

# the ONNX export for OpenVINO (export_sam3_onnx): the vision backbone as ONNX, the rest as
# weights for the dynamic model
ONNX_FORMAT = "paddle-sam/sam3-onnx"
ONNX_FORMAT_VERSION = 1
VISION = "vision_backbone"
VISION_INT8 = "vision_backbone_int8"  # the manifest's program of --quantize int8
INT8_FILES = int8_files(VISION)
WEIGHTS = "model.pdparams"
VISION_PREFIX = "backbone.vision_backbone."
# --quantize int8 also writes the text encoder with int8 weights (its fp32 weights stay in
# model.pdparams for the fp32 and bf16 runs)
TEXT_INT8 = "text_encoder_int8"
TEXT_INT8_FILES = int8_files("text_encoder")
TEXT_PREFIX = "backbone.language_backbone."
#: the ONNX opset (paddle2onnx's default, read by OpenVINO and ONNX Runtime)
OPSET = 17


def fpn_shapes(model: Sam3Image) -> list[list[int]]:
    """``[d, h, w]`` of each FPN level the backbone returns (after the scalp)."""
    neck = model.backbone.vision_backbone
    size = neck.trunk.img_size
    grid = size // neck.trunk.patch_size
    scales = neck.scale_factors[: len(neck.scale_factors) - model.backbone.scalp]
    d = model.hidden_dim
    return [[d, int(grid * s), int(grid * s)] for s in scales]


class Backbone(nn.Layer):
    """Image -> the backbone's FPN levels (``backbone.forward_image``'s ``backbone_fpn``)."""

    def __init__(self, model: Sam3Image) -> None:
        super().__init__()
        self.backbone = model.backbone

    def forward(self, image: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        return tuple(self.backbone.forward_image(image)["backbone_fpn"])


def vision_levels(model: Sam3Image) -> dict[str, list[list[int]]]:
    """``[d, h, w]`` of every level the vision backbone computes (all scale factors, before
    the scalp): ``sam3`` (the detector's neck) and ``sam2`` (the second neck, for clicks and
    video; empty without it)."""
    neck = model.backbone.vision_backbone
    grid = neck.trunk.img_size // neck.trunk.patch_size
    d = model.hidden_dim
    levels = [[d, int(grid * s), int(grid * s)] for s in neck.scale_factors]
    return {"sam3": levels, "sam2": list(levels) if neck.has_sam2_neck else []}


class VisionBackbone(nn.Layer):
    """Image -> the vision backbone's feature maps: the detector neck's levels, then the
    second neck's (if any); the position encodings (a function of the shapes) are not
    outputs."""

    def __init__(self, model: Sam3Image) -> None:
        super().__init__()
        self.vision_backbone = model.backbone.vision_backbone

    def forward(self, image: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        sam3_feats, _, sam2_feats, _ = self.vision_backbone(image)
        return (*sam3_feats, *(sam2_feats or ()))


class TextEncoder(nn.Layer):
    """Token ids ``B x L`` -> (``language_features`` ``L x B x d``, ``language_mask`` ``B x L``),
    what ``backbone.forward_text`` puts in ``backbone_out`` for the heads."""

    def __init__(self, model: Sam3Image) -> None:
        super().__init__()
        self.text = model.backbone.language_backbone

    def forward(self, token_ids: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        mask, memory, _ = self.text.encode_tokens(token_ids)
        return memory, mask


class TextFeatures(nn.Layer):
    """Token ids ``B x L`` -> (``B x L x d_model`` features, ``B x L x width`` token
    embeddings): ``encode_tokens`` batch first, for a runtime that splits batches on their
    first axis; the padding mask (token id 0) is the caller's to compute."""

    def __init__(self, text: nn.Layer) -> None:
        super().__init__()
        self.text = text

    def forward(self, token_ids: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        _, memory, embeds = self.text.encode_tokens(token_ids)
        return memory.transpose([1, 0, 2]), embeds.transpose([1, 0, 2])


def ground_one(model: Sam3Image, backbone_out: dict, prompt: Prompt) -> dict:
    """``model.forward_grounding`` of one image and one text (both at index 0), as the
    exported decoders compute it."""
    zero = paddle.zeros([1], "int64")
    return model.forward_grounding(
        backbone_out=backbone_out,
        find_input=FindStage(img_ids=zero, text_ids=zero),
        geometric_prompt=prompt,
    )


class PromptDecoder(nn.Layer):
    """``Sam3Image.forward_grounding`` on one image with one text and N >= 1 boxes.

    Inputs: FPN levels ``1 x d x h_i x w_i``; language_features ``L x 1 x d``; language_mask
    ``1 x L`` bool; boxes ``1 x N x 4`` (cx, cy, w, h in [0, 1]); box_labels ``1 x N`` int64
    (1 positive, 0 negative); box_mask ``1 x N`` bool (True = padding, right-padded).
    """

    def __init__(self, model: Sam3Image) -> None:
        super().__init__()
        self.model = model
        self.num_levels = len(fpn_shapes(model))
        pos_enc = model.backbone.vision_backbone.position_encoding
        with paddle.no_grad():
            for i, (d, h, w) in enumerate(fpn_shapes(model)):
                pos = pos_enc(paddle.zeros([1, d, h, w], "float32")).detach()
                self.register_buffer(f"vision_pos_enc_{i}", pos)

    def forward(
        self,
        backbone_fpn: list[paddle.Tensor],
        language_features: paddle.Tensor,
        language_mask: paddle.Tensor,
        boxes: paddle.Tensor,
        box_labels: paddle.Tensor,
        box_mask: paddle.Tensor,
    ) -> tuple[paddle.Tensor, ...]:
        n = self.num_levels
        backbone_out = {
            "backbone_fpn": list(backbone_fpn),
            "vision_pos_enc": [getattr(self, f"vision_pos_enc_{i}") for i in range(n)],
            "language_features": language_features,
            "language_mask": language_mask,
        }
        prompt = Prompt(
            box_embeddings=boxes.transpose([1, 0, 2]),
            box_mask=box_mask,
            box_labels=box_labels.transpose([1, 0]),
        )
        out = ground_one(self.model, backbone_out, prompt)
        return tuple(out[k] for k in DECODER_OUTPUTS)


def input_specs(model: Sam3Image) -> dict[str, list[InputSpec]]:
    """The inputs of each program: batch 1, a dynamic number of boxes."""
    size = model.backbone.vision_backbone.trunk.img_size
    ctx = model.backbone.language_backbone.context_length
    d = model.hidden_dim
    fpn = [
        InputSpec([1, *shape], "float32", f"backbone_fpn_{i}")
        for i, shape in enumerate(fpn_shapes(model))
    ]
    return {
        "backbone": [InputSpec([1, 3, size, size], "float32", "image")],
        "text_encoder": [InputSpec([1, ctx], "int64", "token_ids")],
        "prompt_decoder": [
            fpn,
            InputSpec([ctx, 1, d], "float32", "language_features"),
            InputSpec([1, ctx], "bool", "language_mask"),
            InputSpec([1, None, 4], "float32", "boxes"),
            InputSpec([1, None], "int64", "box_labels"),
            InputSpec([1, None], "bool", "box_mask"),
        ],
    }


@contextmanager
def attention_kernel(model: Sam3Image, fused: bool) -> Iterator[None]:
    """Within the block, every attention layer of ``model`` that can use Paddle's fused CPU
    attention kernel takes it when it applies (``fused``) or never; restored on exit."""
    layers = [m for m in model.sublayers(include_self=True) if hasattr(m, "fused_attention")]
    saved = [m.fused_attention for m in layers]
    try:
        for m in layers:
            m.fused_attention = fused
        yield
    finally:
        for m, old in zip(layers, saved, strict=True):
            m.fused_attention = old


def save_programs(model: Sam3Image, out: Path, *, fused_attention: bool = False) -> None:
    """``paddle.jit.save`` the three programs (PIR) into ``out``; with ``fused_attention``,
    the long self-attentions through Paddle's fused CPU kernel (CPU-only programs)."""
    model.eval()
    specs = input_specs(model)
    layers = {
        "backbone": Backbone(model),
        "text_encoder": TextEncoder(model),
        "prompt_decoder": PromptDecoder(model),
    }
    with attention_kernel(model, fused_attention):
        for name in PROGRAMS:
            paddle.jit.save(layers[name], str(out / name), input_spec=specs[name])


def export_sam3(
    model: Sam3Image,
    out_dir: str | os.PathLike,
    *,
    source_sha256: str | None = None,
    overwrite: bool = False,
    spec: Sam3Spec | None = None,
    fused_attention: bool | None = None,
) -> dict:
    """Write ``backbone.*``, ``text_encoder.*``, ``prompt_decoder.*`` and ``export.json``.

    ``spec`` (the model's sizes; default: the spec the builder attached to the model) is
    recorded in the manifest; the runtime needs only the sizes the manifest always holds.
    ``fused_attention``: programs with Paddle's fused CPU attention kernel, which run on CPUs
    with AVX-512 only (default: when this machine can run it); False for GPU deployment.
    """
    if fused_attention is None:
        fused_attention = fused_attention_available()
    if spec is None:
        spec = getattr(model, "spec", None)
    if model.inst_interactive_predictor is not None:
        # the SAM 1 style heads (predict_inst) are not part of this export; the programs
        # would carry their unused weights
        raise ValueError("export a model built without enable_inst_interactivity")
    out = Path(out_dir)
    programs = {p: [f"{p}.json", f"{p}.pdiparams"] for p in PROGRAMS}
    check_outputs(out, [f for names in programs.values() for f in names] + [MANIFEST], overwrite)
    out.mkdir(parents=True, exist_ok=True)
    save_programs(model, out, fused_attention=fused_attention)
    # what the programs hold, not what was asked: a small model has no attention long
    # enough for the kernel, and its programs run anywhere
    uses_kernel = any(FUSED_KERNEL in (out / f"{p}.json").read_text() for p in PROGRAMS)
    text = model.backbone.language_backbone
    return write_manifest(
        out,
        EXPORT_FORMAT,
        programs,
        format_version=FORMAT_VERSION,
        model_type="sam3",
        source_sha256=source_sha256,
        spec=spec.to_dict() if spec is not None else None,
        image_size=int(model.backbone.vision_backbone.trunk.img_size),
        pixel_mean=[0.5, 0.5, 0.5],
        pixel_std=[0.5, 0.5, 0.5],
        context_length=int(text.context_length),
        fpn_shapes=fpn_shapes(model),
        decoder_outputs=list(DECODER_OUTPUTS),
        pad_box=list(PAD_BOX),
        cpu_fused_attention=uses_kernel,
    )


def export_sam3_onnx(
    model: Sam3Image,
    out_dir: str | os.PathLike,
    *,
    state: dict[str, np.ndarray] | None = None,
    source_sha256: str | None = None,
    overwrite: bool = False,
    spec: Sam3Spec | None = None,
    quantize: str | None = None,
    calibration: Iterable[np.ndarray] | None = None,
) -> dict:
    """Write the vision backbone (ViT trunk and both necks: about four fifths of an image's
    time) as ``vision_backbone.onnx`` (its weights in ``vision_backbone.onnx.data``, over
    protobuf's 2 GB at full size), every other weight as ``model.pdparams`` (+ sidecar) and
    ``export.json``. OpenVINO runs the ONNX file in the dynamic model's place
    (:func:`paddle_sam.loading.sam3.load_sam3_export`); the text encoder, the heads and the
    video tracker stay the dynamic model's.

    ``state``: the converted weights to store (default: ``model``'s); pass a whole converted
    checkpoint to keep its video tracker (``tracker.*``). The vision backbone's keys are
    left out either way. A model with the second neck (built with clicks) exports it too:
    clicks and video need it.

    ``quantize="int8"``: also ``vision_backbone.int8.xml`` / ``.bin``, the backbone for
    OpenVINO with int8 weights (and ``text_encoder.int8.*``, the text encoder's), and with
    ``calibration`` (H x W x 3 uint8 RGB images) int8 activations too, calibrated on them
    (:func:`quantize_sam3_export`; ``precision="int8"`` at load time runs it). Approximate:
    its cost is measured, not assumed (docs/performance.md)."""
    from ..convert.core import save_pdparams, sidecar_meta, sidecar_path
    from .onnx import _int8_tools, _paddle2onnx

    spec = spec if spec is not None else getattr(model, "spec", None)
    if spec is None:
        raise ValueError("model has no .spec; build it with build_sam3_image_model or load_sam3")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be 'int8' or None, got {quantize!r}")
    if calibration is not None and not quantize:
        raise ValueError("calibration images are for quantize='int8'")
    if quantize:  # a missing extra is named before any work
        _int8_tools()
    p2o = _paddle2onnx()  # a missing extra is named before any work
    out = Path(out_dir)
    onnx_name = f"{VISION}.onnx"
    data_name = f"{onnx_name}.data"
    sidecar = sidecar_path(WEIGHTS).name
    int8_names = [*INT8_FILES, *TEXT_INT8_FILES] if quantize else []
    check_outputs(out, [onnx_name, data_name, *int8_names, WEIGHTS, sidecar, MANIFEST], overwrite)
    size = int(model.backbone.vision_backbone.trunk.img_size)
    if calibration is not None:
        calibration = calibration_inputs(calibration, size)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    levels = vision_levels(model)
    names = tuple(f"sam3_fpn_{i}" for i in range(len(levels["sam3"])))
    names += tuple(f"sam2_fpn_{i}" for i in range(len(levels["sam2"])))
    with (
        tempfile.TemporaryDirectory(prefix="paddle-sam-sam3-") as tmp,
        attention_kernel(model, False),  # ONNX has no form of Paddle's fused CPU kernel
    ):
        spec_in = [InputSpec([1, 3, size, size], "float32", "image")]
        trace_to_onnx(
            p2o,
            VisionBackbone(model),
            spec_in,
            Path(tmp),
            VISION,
            names,
            {},
            dst=out / onnx_name,
            external=data_name,
        )
    if state is None:
        state = {k: np.asarray(v.numpy(), np.float32) for k, v in model.state_dict().items()}
    kept = {k: v for k, v in state.items() if not k.startswith(VISION_PREFIX)}
    interactive = model.inst_interactive_predictor is not None or bool(levels["sam2"])
    source = {"sha256": source_sha256, "layout": "export", "without": VISION_PREFIX[:-1]}
    meta = sidecar_meta("sam3", "sam3", spec, source, interactive=interactive)
    save_pdparams(kept, out / WEIGHTS, meta)
    text = model.backbone.language_backbone
    manifest = write_manifest(
        out,
        ONNX_FORMAT,
        {VISION: [onnx_name, data_name], "weights": [WEIGHTS, sidecar]},
        format_version=ONNX_FORMAT_VERSION,
        model_type="sam3",
        source_sha256=source_sha256,
        spec=spec.to_dict(),
        image_size=size,
        context_length=int(text.context_length) if text is not None else None,
        levels=levels,
        opset=OPSET,
        quantized={},
    )
    if quantize:  # the names were checked above
        return quantize_sam3_export(out, calibration, overwrite=True, preprocessed=True)
    return manifest


def calibration_inputs(images: Iterable[np.ndarray], size: int) -> list[np.ndarray]:
    """The backbone's input (1 x 3 x size x size float32) for each H x W x 3 uint8 RGB image."""
    from ..predict.sam3.processor import preprocess_sam3_image
    from .onnx import checked_rgb

    inputs = [
        preprocess_sam3_image(checked_rgb(image, f"calibration image {i}"), size)[None]
        for i, image in enumerate(images)
    ]
    if not inputs:
        raise ValueError("calibration: no images; give at least one")
    return inputs


def quantize_sam3_export(
    out_dir: str | os.PathLike,
    calibration: Iterable[np.ndarray] | None = None,
    *,
    overwrite: bool = False,
    preprocessed: bool = False,
) -> dict:
    """Add ``vision_backbone.int8.xml`` / ``.bin`` to a :func:`export_sam3_onnx` folder: the
    backbone for OpenVINO with int8 weights, and with ``calibration`` (H x W x 3 uint8 RGB
    images; ``preprocessed``: already the backbone's inputs) int8 activations too,
    calibrated on them (:func:`~paddle_sam.export.onnx.quantize_int8`; ``precision="int8"``
    at load time runs it). Also ``text_encoder.int8.xml`` / ``.bin``
    (:func:`quantize_text_encoder`) when the folder's weights have a text encoder. Reads only
    the folder: call it once the model that was exported is freed, calibration takes memory
    (8.1 GB peak for the full-size backbone, docs/export.md). Returns the updated manifest."""
    from .onnx import _int8_tools, quantize_int8

    _int8_tools()
    out = Path(out_dir)
    manifest = json.loads((out / MANIFEST).read_text())
    if manifest.get("format") != ONNX_FORMAT:
        raise ValueError(f"{out / MANIFEST}: not a SAM 3 ONNX export ({ONNX_FORMAT})")
    check_outputs(out, [*INT8_FILES, *TEXT_INT8_FILES], overwrite)
    if calibration is not None and not preprocessed:
        calibration = calibration_inputs(calibration, int(manifest["image_size"]))
    if calibration is not None and (note := calibration_memory_note(out, manifest)) is not None:
        warnings.warn(note, stacklevel=2)
    quantized = {}
    text_info = quantize_text_encoder(out, Sam3Spec.from_dict(manifest["spec"]))
    if text_info is not None:  # first: the vision backbone's calibration needs the memory
        manifest["programs"][TEXT_INT8] = list(TEXT_INT8_FILES)
        quantized["text_int8"] = text_info
    info = quantize_int8(out / manifest["programs"][VISION][0], out / INT8_FILES[0], calibration)
    manifest["programs"][VISION_INT8] = list(INT8_FILES)
    manifest["quantized"] = {"int8": info, **quantized}
    return save_manifest(out, manifest)


#: calibrating the full-size backbone (1.84 GB of fp32 weights, 4 images, NNCF 3.4) peaked at
#: 8.1 GB resident with NNCF's statistics computed in graph order
#: (:func:`~paddle_sam.export.onnx.statistics_outputs_first`; 21.3-22.6 GB without), about 4.4
#: times its weights: 5 leaves room
CALIBRATION_MEMORY_PER_WEIGHT = 5


def calibration_memory_note(out: Path, manifest: dict) -> str | None:
    """A sentence when this machine has less memory available than calibrating the folder's
    backbone took where it was measured, or None (enough, or not known)."""
    from .._runtime import available_memory

    weights = sum(
        (out / name).stat().st_size
        for name in manifest["programs"][VISION]
        if (out / name).is_file()
    )
    need, have = weights * CALIBRATION_MEMORY_PER_WEIGHT, available_memory()
    if have is None or have >= need:
        return None
    return (
        f"calibrating the int8 backbone of {out} ({weights / 1e9:.2f} GB of fp32 weights) needs "
        f"about {need / 1e9:.1f} GB of memory (the full-size backbone peaked at 8.1 GB), and "
        f"{have / 1e9:.1f} GB are available: the process may be killed for memory. int8 weights "
        "alone (without --calibration) need less: no calibration run"
    )


def quantize_text_encoder(out_dir: str | os.PathLike, spec: Sam3Spec) -> dict | None:
    """``text_encoder.int8.xml`` / ``.bin`` in an export folder: the text encoder of its
    ``model.pdparams`` (``spec``'s sizes) for OpenVINO with int8 weights, weights only (a
    prompt is 32 tokens: the weights, 1.35 GB in fp32 at full size, are the cost, not the
    arithmetic). Returns what the manifest records, or None when the weights have no text
    encoder."""
    from ..convert.core import load_state_strict, read_pdparams
    from ..models.sam3.build_sam3 import build_text_encoder
    from .onnx import _paddle2onnx, quantize_int8

    out = Path(out_dir)
    state = read_pdparams(out / WEIGHTS)
    text_state = {k[len(TEXT_PREFIX) :]: v for k, v in state.items() if k.startswith(TEXT_PREFIX)}
    del state
    if not text_state:
        return None
    p2o = _paddle2onnx()
    text = build_text_encoder(spec, tokenizer=None)
    load_state_strict(text, text_state, where=f"{out / WEIGHTS} ({TEXT_PREFIX}*): ")
    with tempfile.TemporaryDirectory(prefix="paddle-sam-sam3-text-") as tmp:
        onnx_path = Path(tmp) / "text_encoder.final.onnx"
        with attention_kernel(text, False):  # ONNX has no form of Paddle's fused CPU kernel
            spec_in = [InputSpec([1, int(text.context_length)], "int64", "token_ids")]
            trace_to_onnx(
                p2o,
                TextFeatures(text),
                spec_in,
                Path(tmp),
                "text_encoder",
                ("language_features", "language_embeds"),
                {},
                dst=onnx_path,
                external=f"{onnx_path.name}.data",
            )
        del text  # not needed past the trace
        return quantize_int8(onnx_path, out / TEXT_INT8_FILES[0], None)


def trace_to_onnx(
    p2o: Any,
    layer: nn.Layer,
    spec_in: list,
    tmp: Path,
    name: str,
    outputs: tuple[str, ...],
    dims: dict[str, dict[int, str]],
    *,
    dst: Path,
    external: str | None = None,
) -> None:
    """``layer`` (in eval mode) traced as a PIR program ``tmp/name`` for ``spec_in``,
    converted by paddle2onnx (``p2o``) and finished as ``dst``: the outputs named
    ``outputs``, the dynamic axes ``dims``, the weights as initializers (in ``external``
    beside the graph, if given; :func:`~paddle_sam.export.onnx._finish_graph`)."""
    from .onnx import _convert, _finish_graph

    layer.eval()
    paddle.jit.save(layer, str(tmp / name), input_spec=spec_in)
    raw = tmp / f"{name}.onnx"
    _convert(p2o, tmp, name, raw, OPSET)
    _finish_graph(raw, name, outputs, dims, dst=dst, external=external)


# samexporter's layout (export_sam3_samexporter): three ONNX files whose names, inputs and
# outputs are those the samexporter package's SegmentAnything3ONNX client reads
SAMEXPORTER_FILES = {
    "image_encoder": "sam3_image_encoder.onnx",
    "language_encoder": "sam3_language_encoder.onnx",
    "decoder": "sam3_decoder.onnx",
}
SAMEXPORTER_ENCODER_OUTPUTS = (
    "vision_pos_enc_0",
    "vision_pos_enc_1",
    "vision_pos_enc_2",
    "backbone_fpn_0",
    "backbone_fpn_1",
    "backbone_fpn_2",
)
SAMEXPORTER_LANGUAGE_OUTPUTS = ("text_attention_mask", "text_memory", "text_embeds")
SAMEXPORTER_DECODER_OUTPUTS = ("pred_boxes", "pred_logits", "pred_masks", "presence_logit_dec")


class UInt8ImageEncoder(nn.Layer):
    """``3 x R x R`` uint8 RGB -> the three position encodings, then the three FPN levels
    (``backbone.forward_image``), the normalisation ((x / 255 - 0.5) / 0.5) inside."""

    def __init__(self, model: Sam3Image) -> None:
        super().__init__()
        self.backbone = model.backbone

    def forward(self, image: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        x = (image.astype("float32") / 255.0 - 0.5) / 0.5
        out = self.backbone.forward_image(x.unsqueeze(0))
        return (*out["vision_pos_enc"], *out["backbone_fpn"])


class LanguageEncoder(nn.Layer):
    """Token ids ``1 x L`` -> (padding mask ``1 x L``, ``L x 1 x d`` features, ``L x 1 x
    width`` token embeddings): ``encode_tokens``."""

    def __init__(self, model: Sam3Image) -> None:
        super().__init__()
        self.text = model.backbone.language_backbone

    def forward(self, tokens: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        return tuple(self.text.encode_tokens(tokens))


class SeqFirstDecoder(nn.Layer):
    """``forward_grounding`` with the inputs in samexporter's order and layout: position
    encodings and FPN levels ``1 x d x h_i x w_i``, the text's mask and features, boxes
    sequence first (``N x 1 x 4`` normalised cx, cy, w, h; labels ``N x 1``; padding mask
    ``1 x N``, True = padding). Only the levels' position encodings the heads read are
    inputs (the last ``num_feature_levels``: the others would be inputs of no output)."""

    def __init__(self, model: Sam3Image) -> None:
        super().__init__()
        self.model = model
        self.unused_pos = len(fpn_shapes(model)) - int(model.num_feature_levels)

    def forward(
        self,
        vision_pos_enc: list[paddle.Tensor],
        backbone_fpn: list[paddle.Tensor],
        language_mask: paddle.Tensor,
        language_features: paddle.Tensor,
        box_coords: paddle.Tensor,
        box_labels: paddle.Tensor,
        box_masks: paddle.Tensor,
    ) -> tuple[paddle.Tensor, ...]:
        backbone_out = {
            "backbone_fpn": list(backbone_fpn),
            "vision_pos_enc": [None] * self.unused_pos + list(vision_pos_enc),
            "language_features": language_features,
            "language_mask": language_mask,
        }
        prompt = Prompt(box_embeddings=box_coords, box_mask=box_masks, box_labels=box_labels)
        out = ground_one(self.model, backbone_out, prompt)
        return tuple(out[k] for k in SAMEXPORTER_DECODER_OUTPUTS)


def export_sam3_samexporter(
    model: Sam3Image, out_dir: str | os.PathLike, *, overwrite: bool = False
) -> dict[str, Path]:
    """Write the image model as samexporter's three ONNX files (:data:`SAMEXPORTER_FILES`),
    with its input and output names and layouts, so that its ``SegmentAnything3ONNX`` (and
    the tools reading the same files) run them on ONNX Runtime: the image encoder takes a
    ``3 x R x R`` uint8 RGB image; the language encoder 1 x 32 token ids (samexporter's
    tokenizer pads to 32: the model's context length must be 32); the decoder returns the raw
    heads, which the client thresholds and resizes. The number of boxes is dynamic. Weights
    over protobuf's 2 GB (the full-size image encoder) go to a ``.data`` file beside their
    graph. Returns the written graphs by part."""
    from .onnx import _paddle2onnx

    text = model.backbone.language_backbone
    if text is None or int(text.context_length) != 32:
        got = None if text is None else int(text.context_length)
        raise ValueError(
            f"samexporter's layout needs a text encoder of context length 32 (its tokenizer "
            f"pads to 32); this model's is {got}"
        )
    levels = fpn_shapes(model)
    if len(levels) != 3:
        raise ValueError(f"samexporter's layout has three FPN levels; this model has {len(levels)}")
    p2o = _paddle2onnx()
    out = Path(out_dir)
    files = {part: out / name for part, name in SAMEXPORTER_FILES.items()}
    check_outputs(
        out, [*SAMEXPORTER_FILES.values(), f"{files['image_encoder'].name}.data"], overwrite
    )
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    size = int(model.backbone.vision_backbone.trunk.img_size)
    ctx, d = int(text.context_length), int(model.hidden_dim)
    # over protobuf's 2 GB with the graph: the full-size backbone (about 1.8 GB of weights)
    weight_bytes = sum(4 * int(p.numel()) for p in model.backbone.vision_backbone.parameters())
    big = weight_bytes > 1_000_000_000
    fpn = [InputSpec([1, *s], "float32", f"backbone_fpn_{i}") for i, s in enumerate(levels)]
    used = range(len(levels) - int(model.num_feature_levels), len(levels))
    pos = [InputSpec([1, *levels[i]], "float32", f"vision_pos_enc_{i}") for i in used]
    parts = {
        "image_encoder": (
            UInt8ImageEncoder(model),
            [InputSpec([3, size, size], "uint8", "image")],
            SAMEXPORTER_ENCODER_OUTPUTS,
            {},
        ),
        "language_encoder": (
            LanguageEncoder(model),
            [InputSpec([1, ctx], "int64", "tokens")],
            SAMEXPORTER_LANGUAGE_OUTPUTS,
            {},
        ),
        "decoder": (
            SeqFirstDecoder(model),
            [
                pos,
                fpn,
                InputSpec([1, ctx], "bool", "language_mask"),
                InputSpec([ctx, 1, d], "float32", "language_features"),
                InputSpec([None, 1, 4], "float32", "box_coords"),
                InputSpec([None, 1], "int64", "box_labels"),
                InputSpec([1, None], "bool", "box_masks"),
            ],
            SAMEXPORTER_DECODER_OUTPUTS,
            {"box_coords": {0: "boxes"}, "box_labels": {0: "boxes"}, "box_masks": {1: "boxes"}},
        ),
    }
    with (
        tempfile.TemporaryDirectory(prefix="paddle-sam-samexporter-") as tmp,
        attention_kernel(
            model,
            False,  # ONNX has no form of Paddle's fused CPU kernel
        ),
    ):
        for part, (layer, spec_in, names, dims) in parts.items():
            external = f"{files[part].name}.data" if part == "image_encoder" and big else None
            trace_to_onnx(
                p2o,
                layer,
                spec_in,
                Path(tmp),
                part,
                names,
                dims,
                dst=files[part],
                external=external,
            )
    return files
