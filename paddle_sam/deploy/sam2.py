"""SAM 2's exported image encoder, memory attention and memory encoder on OpenVINO (the
``openvino`` extra), in the model's place.

:class:`OpenVinoImageEncoder` takes the place of ``SAM2Base.image_encoder``: it answers the same
call with the same dict (``vision_features``, ``vision_pos_enc``, ``backbone_fpn``), so the image
predictor, the video predictor and everything above them run unchanged on a model whose image
encoder is ``paddle-sam export``'s ``image_encoder.onnx`` (:mod:`paddle_sam.export.sam2`).

Why OpenVINO: measured on the CPUs this project runs on (docs/performance.md), it runs the
Hiera encoder faster than Paddle's dygraph kernels and than Paddle Inference with oneDNN, and
on CPUs with ``avx512_bf16`` or AMX it computes in bf16 at about half the fp32 time. The fp32
path agrees with the dynamic model to about 1e-5; bf16 is approximate (its cost is measured).
:class:`OpenVinoMemoryAttention` takes the place of ``memory_attention`` in the video
predictor (``memory_attention.onnx``) and :class:`OpenVinoMemoryEncoder` that of
``memory_encoder`` (``memory_encoder.onnx``), always in fp32.
OpenVINO picks bf16 by itself on such CPUs, so the precision is always set explicitly here.
``int8`` runs ``image_encoder.int8.xml`` (``export --quantize int8``: int8 weights, float
activations) on any CPU; approximate too.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import paddle
from paddle import nn

from ..export.sam2 import ENCODER, EXPORT_FORMAT, FORMAT_VERSION
from ..models.common import as_tensor
from .openvino import OpenVinoFunction, OpenVinoProgram
from .sam_v1 import read_manifest


def read_sam2_manifest(export_dir: str | os.PathLike) -> dict:
    """``export.json`` of a SAM 2 export folder, every file it lists checked."""
    return read_manifest(
        export_dir, EXPORT_FORMAT, version=FORMAT_VERSION, programs=(ENCODER, "weights")
    )


class OpenVinoImageEncoder(nn.Layer):
    """``image_encoder`` of a SAM 2 model, computed by OpenVINO from ``image_encoder.onnx``.

    ``position_encoding``: the neck's (no weights; it depends on the levels' shapes only).
    ``precision``: ``fp32``, ``bf16`` (CPUs with avx512_bf16 or AMX only, detected here) or
    ``int8`` (``onnx_path`` an int8 file of ``export --quantize int8``).
    ``threads``: OpenVINO's inference threads (default: the process's Paddle thread count).
    """

    def __init__(
        self,
        onnx_path: str | os.PathLike,
        position_encoding: nn.Layer,
        levels: list[list[int]],
        *,
        precision: str = "fp32",
        threads: int | None = None,
    ) -> None:
        super().__init__()
        self.program = OpenVinoProgram(onnx_path, levels, precision=precision, threads=threads)
        self.onnx_path = self.program.path
        self.precision = precision
        self.levels = self.program.shapes
        self.position_encoding = position_encoding

    def forward(self, sample: paddle.Tensor) -> dict[str, Any]:
        fpn = [as_tensor(level) for level in self.program(sample.numpy())]
        pos = [self.position_encoding(f).astype(f.dtype) for f in fpn]
        return {"vision_features": fpn[-1], "vision_pos_enc": pos, "backbone_fpn": fpn}


class OpenVinoMemoryAttention(nn.Layer):
    """``memory_attention`` of a SAM 2 video model, computed by OpenVINO from
    ``memory_attention.onnx``: the same call (``curr``, ``curr_pos`` as ``HW x B x d`` tensors
    or one-item lists, ``memory``, ``memory_pos`` as ``M x B x mem_dim``, ``num_obj_ptr_tokens``)
    and the same ``HW x B x d`` answer, object by object (the file takes one). Always fp32:
    bf16 moved its outputs by up to 5.8 on outputs of magnitude 0.8. ``threads``: OpenVINO's
    inference threads (default: the process's Paddle thread count)."""

    def __init__(self, onnx_path: str | os.PathLike, *, threads: int | None = None) -> None:
        super().__init__()
        self.program = OpenVinoFunction(onnx_path, 5, 1, "a memory attention", threads=threads)
        self.onnx_path = self.program.path

    def forward(
        self,
        curr: paddle.Tensor | list[paddle.Tensor],
        memory: paddle.Tensor,
        curr_pos: paddle.Tensor | list[paddle.Tensor] | None = None,
        memory_pos: paddle.Tensor | None = None,
        num_obj_ptr_tokens: int = 0,
    ) -> paddle.Tensor:
        if isinstance(curr, list):
            curr, curr_pos = curr[0], curr_pos[0]
        arrays = [np.asarray(t.numpy(), np.float32) for t in (curr, curr_pos, memory, memory_pos)]
        count = np.array(int(num_obj_ptr_tokens), np.int64)
        outs = []
        for b in range(arrays[0].shape[1]):
            inputs = [np.ascontiguousarray(a[:, b : b + 1]) for a in arrays]
            outs.append(self.program(*inputs, count)[0])
        return as_tensor(outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1))


class OpenVinoMemoryEncoder(nn.Layer):
    """``memory_encoder`` of a SAM 2 video model, computed by OpenVINO from
    ``memory_encoder.onnx``: the same call (``pix_feat`` ``B x d x h x w``, ``masks``
    ``B x 1 x S x S`` logits, or probabilities with ``skip_mask_sigmoid``) and the same dict
    (``vision_features`` ``B x mem_dim x h x w``, ``vision_pos_enc``), every object in one
    call. ``position_encoding``: the memory encoder's (no weights; it depends on the shape
    only). Always fp32. ``threads``: OpenVINO's inference threads (default: the process's
    Paddle thread count)."""

    def __init__(
        self,
        onnx_path: str | os.PathLike,
        position_encoding: nn.Layer,
        *,
        threads: int | None = None,
    ) -> None:
        super().__init__()
        self.program = OpenVinoFunction(onnx_path, 2, 1, "a memory encoder", threads=threads)
        self.onnx_path = self.program.path
        self.position_encoding = position_encoding

    def forward(
        self, pix_feat: paddle.Tensor, masks: paddle.Tensor, skip_mask_sigmoid: bool = False
    ) -> dict[str, Any]:
        if not skip_mask_sigmoid:
            masks = nn.functional.sigmoid(masks)
        arrays = [np.ascontiguousarray(t.numpy(), np.float32) for t in (pix_feat, masks)]
        feats = as_tensor(self.program(*arrays)[0])
        pos = self.position_encoding(feats).astype(feats.dtype)
        return {"vision_features": feats, "vision_pos_enc": [pos]}
