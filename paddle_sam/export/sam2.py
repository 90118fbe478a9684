"""Export SAM 2's image encoder, memory attention and memory encoder to ONNX for OpenVINO, with
the rest of the model's weights.

The image encoder (Hiera trunk and FPN neck, about nine tenths of a ``set_image`` and half of
a tracked frame), the memory attention (most of the other half) and the memory encoder are the
parts a CPU runtime speeds up; the prompt encoder and the mask decoder stay the dynamic model's
(a few percent of the time; the video tracker's control flow is Python). So an export folder
holds:

- ``image_encoder.onnx``: normalised image ``1 x 3 x S x S`` -> the kept FPN levels
  ``backbone_fpn_i`` (finest first, ``1 x 256 x h_i x w_i``; a batch runs image by image),
  what ``ImageEncoder`` returns as ``backbone_fpn`` before the decoder's ``conv_s0`` /
  ``conv_s1``; written from the PIR program by paddle2onnx (the ``onnx`` extra);
- ``model.pdparams``: every other weight, Paddle layout, strictly loaded by the runtime;
- ``memory_attention.onnx``: the video tracker's memory attention for one object, the frame's
  tokens and position encoding (``HW x 1 x d``) and the memory bank's (``M x 1 x mem_dim``, ``M``
  any length) with how many of its tokens are object pointers (an int64 scalar) -> the
  conditioned tokens; run on OpenVINO in fp32 (bf16 moved its outputs by up to 5.8), where
  it took 0.70-0.82 of the official module's time against 0.74-0.87 for the dynamic one;
- ``memory_encoder.onnx``: the video tracker's memory encoder, the frame's features
  (``B x d x h x w``) and the objects' mask probabilities (``B x 1 x S x S``, ``B`` any number
  of objects) -> their memory features (``B x mem_dim x h x w``); run on OpenVINO in fp32
  (Paddle's CPU depthwise convolutions took 35 ms each, two per memory, of its 0.13-0.18 s a
  frame);
- ``export.json``: the format, the sizes (``spec``) and the level shapes;
- with ``quantize="int8"``, ``image_encoder.int8.xml`` / ``.bin``: the encoder for OpenVINO
  with int8 weights (NNCF's weight compression; activations stay float), which
  ``precision="int8"`` runs at load time. Approximate: its cost is measured
  (docs/performance.md), not assumed.

The trunk's position embedding (a bicubic resize of a parameter, fixed for the image size) is
stored in the program as a constant; the neck's nearest upsampling and the windows' padding are
written in plain ops in a traced program (``models/sam2``), so the program has no resize and
runs under oneDNN too (Paddle 3.3's oneDNN under PIR refuses both ops).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import paddle
from paddle import nn
from paddle.static import InputSpec

from ..convert.core import save_pdparams, sidecar_meta, sidecar_path
from ..models.sam2.sam2_base import SAM2Base
from .onnx import ENCODER_INT8, int8_files
from .sam_v1 import MANIFEST, check_outputs, write_manifest

EXPORT_FORMAT = "paddle-sam/sam2-onnx"
FORMAT_VERSION = 1
ENCODER = "image_encoder"
MEMORY_ATTENTION = "memory_attention"
MEMORY_ENCODER = "memory_encoder"
WEIGHTS = "model.pdparams"
INT8_FILES = int8_files(ENCODER)
#: the ONNX opset of the encoder (paddle2onnx's default, read by OpenVINO and ONNX Runtime)
OPSET = 17


def level_shapes(model: SAM2Base) -> list[list[int]]:
    """``[d, h, w]`` of each FPN level the image encoder keeps, finest first."""
    encoder = model.image_encoder
    d = int(encoder.neck.d_model)
    side = int(model.image_size) // 4  # the trunk's first stage: stride 4
    levels = len(encoder.neck.backbone_channel_list) - encoder.scalp
    return [[d, side >> i, side >> i] for i in range(levels)]


class ImageEncoder(nn.Layer):
    """Normalised image -> the kept FPN levels (``image_encoder(x)["backbone_fpn"]``), the
    trunk's position embedding a stored constant."""

    def __init__(self, model: SAM2Base) -> None:
        super().__init__()
        self.encoder = model.image_encoder
        trunk = self.encoder.trunk
        side = int(model.image_size) // 4
        with paddle.no_grad():
            pos = trunk._get_pos_embed((side, side)).detach()
        self.register_buffer("trunk_pos_embed", pos)

    def forward(self, image: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        trunk = self.encoder.trunk
        get_pos_embed = trunk._get_pos_embed
        trunk._get_pos_embed = lambda hw: self.trunk_pos_embed
        try:
            return tuple(self.encoder(image)["backbone_fpn"])
        finally:
            trunk._get_pos_embed = get_pos_embed


class MemoryAttentionProgram(nn.Layer):
    """``memory_attention`` of one object (batch 1): the frame's tokens and their position
    encoding, the memory bank's tokens and theirs (any number), and how many of the bank's
    last tokens are object pointers -> the conditioned frame tokens."""

    def __init__(self, model: SAM2Base) -> None:
        super().__init__()
        self.memory_attention = model.memory_attention

    def forward(
        self,
        curr: paddle.Tensor,
        curr_pos: paddle.Tensor,
        memory: paddle.Tensor,
        memory_pos: paddle.Tensor,
        num_obj_ptr_tokens: paddle.Tensor,
    ) -> paddle.Tensor:
        return self.memory_attention(
            curr=curr,
            curr_pos=curr_pos,
            memory=memory,
            memory_pos=memory_pos,
            num_obj_ptr_tokens=num_obj_ptr_tokens,
        )


class MemoryEncoderProgram(nn.Layer):
    """``memory_encoder`` of any number of objects: the frame's features and the objects'
    mask probabilities -> their memory features (the position encoding, a sine of the shape,
    is the runtime's)."""

    def __init__(self, model: SAM2Base) -> None:
        super().__init__()
        self.memory_encoder = model.memory_encoder

    def forward(self, pix_feat: paddle.Tensor, masks: paddle.Tensor) -> paddle.Tensor:
        return self.memory_encoder(pix_feat, masks, skip_mask_sigmoid=True)["vision_features"]


def memory_encoder_specs(model: SAM2Base) -> list[InputSpec]:
    """The memory encoder program's inputs (the number of objects dynamic)."""
    size = int(model.image_size)
    side = size // int(model.backbone_stride)
    return [
        InputSpec([None, int(model.hidden_dim), side, side], "float32", "pix_feat"),
        InputSpec([None, 1, size, size], "float32", "masks"),
    ]


def memory_attention_specs(model: SAM2Base) -> list[InputSpec]:
    """The memory attention program's inputs (the memory bank's length dynamic)."""
    tokens = (int(model.image_size) // int(model.backbone_stride)) ** 2
    d, mem = int(model.hidden_dim), int(model.mem_dim)
    return [
        InputSpec([tokens, 1, d], "float32", "curr"),
        InputSpec([tokens, 1, d], "float32", "curr_pos"),
        InputSpec([None, 1, mem], "float32", "memory"),
        InputSpec([None, 1, mem], "float32", "memory_pos"),
        InputSpec([], "int64", "num_obj_ptr_tokens"),
    ]


def export_sam2(
    model: SAM2Base,
    out_dir: str | os.PathLike,
    *,
    model_type: str | None = None,
    source_sha256: str | None = None,
    overwrite: bool = False,
    quantize: str | None = None,
) -> dict:
    """Write ``image_encoder.onnx``, ``memory_attention.onnx``, ``memory_encoder.onnx``,
    ``model.pdparams`` (+ its sidecar) and ``export.json`` into ``out_dir``; returns the
    manifest. ``model``: a SAM 2 image or video model (the
    video modules' weights are part of ``model.pdparams`` either way). ``quantize="int8"``:
    also ``image_encoder.int8.xml`` / ``.bin``, int8 weights for OpenVINO (weights only:
    calibrated int8 activations were measured less accurate and little faster here)."""
    from .onnx import _convert, _finish_graph, _int8_tools, _paddle2onnx, quantize_int8

    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError("model has no .spec; build it with build_sam2 or load_sam2")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be 'int8' or None, got {quantize!r}")
    if quantize:
        _int8_tools()  # a missing extra is named before any work
    p2o = _paddle2onnx()  # a missing extra is named before any work
    out = Path(out_dir)
    onnx_name = f"{ENCODER}.onnx"
    sidecar = sidecar_path(WEIGHTS).name
    memory_name = f"{MEMORY_ATTENTION}.onnx"
    encoder_name = f"{MEMORY_ENCODER}.onnx"
    files = [onnx_name, memory_name, encoder_name, WEIGHTS, sidecar, MANIFEST]
    files += INT8_FILES if quantize else []
    check_outputs(out, files, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    size = int(model.image_size)
    # traced, the attention takes the plain ops (Paddle's fused CPU kernel is a dygraph
    # choice: ONNX has no such op)
    layer = ImageEncoder(model)
    layer.eval()
    spec_in = [InputSpec([1, 3, size, size], "float32", "image")]
    memory = MemoryAttentionProgram(model)
    memory.eval()
    memory_encoder = MemoryEncoderProgram(model)
    memory_encoder.eval()
    with tempfile.TemporaryDirectory(prefix="paddle-sam-sam2-") as tmp:
        for prog, traced, specs, dst in (
            (ENCODER, layer, spec_in, out / onnx_name),
            (MEMORY_ATTENTION, memory, memory_attention_specs(model), out / memory_name),
            (MEMORY_ENCODER, memory_encoder, memory_encoder_specs(model), out / encoder_name),
        ):
            static = paddle.jit.to_static(traced, input_spec=specs, full_graph=True)
            paddle.jit.save(static, str(Path(tmp) / prog))
            _convert(p2o, Path(tmp), prog, dst, OPSET)
    # the outputs named backbone_fpn_i, the weights as initializers (where quantisers look)
    levels = level_shapes(model)
    names = tuple(f"backbone_fpn_{i}" for i in range(len(levels)))
    _finish_graph(out / onnx_name, ENCODER, names, {})
    _finish_graph(out / memory_name, MEMORY_ATTENTION, ("memory_out",), {"memory": {0: "tokens"}})
    objects = {"pix_feat": {0: "objects"}, "masks": {0: "objects"}}
    _finish_graph(out / encoder_name, MEMORY_ENCODER, ("maskmem_features",), objects)
    programs = {
        ENCODER: [onnx_name],
        MEMORY_ATTENTION: [memory_name],
        MEMORY_ENCODER: [encoder_name],
        "weights": [WEIGHTS, sidecar],
    }
    quantized = {}
    if quantize:
        quantized["int8"] = quantize_int8(out / onnx_name, out / INT8_FILES[0], None)
        programs[ENCODER_INT8] = list(INT8_FILES)
    state = {
        k: np.asarray(v.numpy(), dtype=np.float32)
        for k, v in model.state_dict().items()
        if not k.startswith("image_encoder.")
    }
    source = {"sha256": source_sha256, "layout": "export", "without": "image_encoder"}
    save_pdparams(state, out / WEIGHTS, sidecar_meta("sam2", model_type or "custom", spec, source))
    return write_manifest(
        out,
        EXPORT_FORMAT,
        programs,
        format_version=FORMAT_VERSION,
        model_type=model_type,
        source_sha256=source_sha256,
        spec=spec.to_dict(),
        image_size=size,
        levels=levels,
        opset=OPSET,
        quantized=quantized,
    )
