"""SAM 2's exported image encoder on OpenVINO (the ``openvino`` extra), in the model's place.

:class:`OpenVinoImageEncoder` takes the place of ``SAM2Base.image_encoder``: it answers the same
call with the same dict (``vision_features``, ``vision_pos_enc``, ``backbone_fpn``), so the image
predictor, the video predictor and everything above them run unchanged on a model whose image
encoder is ``paddle-sam export``'s ``image_encoder.onnx`` (:mod:`paddle_sam.export.sam2`).

Why OpenVINO: measured on the CPUs this project runs on (docs/performance.md), it runs the
Hiera encoder faster than Paddle's dygraph kernels and than Paddle Inference with oneDNN, and
on CPUs with ``avx512_bf16`` or AMX it computes in bf16 at about half the fp32 time. The fp32
path agrees with the dynamic model to about 1e-5; bf16 is approximate (its cost is measured).
OpenVINO picks bf16 by itself on such CPUs, so the precision is always set explicitly here.
``int8`` runs ``image_encoder.int8.xml`` (``export --quantize int8``: int8 weights, float
activations) on any CPU; approximate too.
"""

from __future__ import annotations

import os
from typing import Any

import paddle
from paddle import nn

from ..export.sam2 import ENCODER, EXPORT_FORMAT, FORMAT_VERSION
from ..models.common import as_tensor
from .openvino import OpenVinoProgram
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
