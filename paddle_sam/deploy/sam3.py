"""``StaticSam3Processor``: ``Sam3Processor``'s API over the exported SAM 3 PIR programs.

Runs the three programs of ``paddle-sam export --model-type sam3`` with Paddle Inference.
Preprocessing, the tokenizer, the prompt bookkeeping and the post-processing (upscaling,
sigmoid, threshold) are the dynamic processor's own code (``Sam3ProcessorBase``,
``postprocess_grounding``); only the three networks run as programs. The backbone output is
kept in the state per image; a new text prompt reruns the text encoder (its features are
cached per prompt) and the decoder only.

Devices: the CPU path is tested. The GPU path is written against the Paddle 3 inference API
but has NOT been run: no Paddle 3 GPU build could be installed here. TensorRT is not offered.
An export with Paddle's fused CPU attention kernel (manifest ``cpu_fused_attention``, the
default on machines with AVX-512) runs on such CPUs only: anything else is refused here,
before Paddle could fail on a missing kernel or an illegal instruction.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import paddle
from paddle import nn

from ..export.sam3 import (
    DECODER_OUTPUTS,
    EXPORT_FORMAT,
    FORMAT_VERSION,
    ONNX_FORMAT,
    ONNX_FORMAT_VERSION,
    PROGRAMS,
    VISION,
)
from ..models.common import as_tensor
from ..models.sam3.model_misc import fused_attention_available
from ..models.sam3.text_encoder import VETextEncoder
from ..predict.sam3.processor import Sam3ProcessorBase
from ..predict.sam3.tokenizer import SimpleTokenizer
from .openvino import OpenVinoProgram
from .sam_v1 import create_predictor, inference_options, read_manifest, run_predictor

# oneDNN runs the text encoder only. Measured on Paddle Inference 3.3.1: there it matches
# Paddle's own kernels (2e-6). The prompt decoder builds with oneDNN but fails when run
# (nearest interpolate: ConvertPirAttribute2RuntimeAttribute, the 3.3.x regression of
# docs/design.md section 3); the backbone is kept off it like SAM v1's ViT image encoder
# (``deploy.sam_v1.ONEDNN_PROGRAMS``), which fails with it.
ONEDNN_PROGRAMS = ("text_encoder",)


def check_fused_attention(export_dir: Path, device: str) -> None:
    """Refuse an export with the fused CPU attention kernel where that kernel cannot run."""
    why = None
    if device != "cpu":
        why = f"device={device!r}: the kernel exists for the CPU only"
    elif not fused_attention_available():
        why = "this CPU lacks AVX-512F (or this Paddle lacks the kernel)"
    if why is not None:
        raise ValueError(
            f"{export_dir} was exported with Paddle's fused CPU attention kernel "
            f"(export.json: cpu_fused_attention) and cannot run here: {why}; export it again "
            f"with 'paddle-sam export --no-fused-attention' (export_sam3(fused_attention=False))"
        )


class _Boxes:
    """The geometric prompt of the static runtime: boxes ``N x 4`` (cx, cy, w, h) + labels."""

    def __init__(self) -> None:
        self.boxes = np.zeros((0, 4), np.float32)
        self.labels = np.zeros((0,), np.int64)

    def append(self, box: np.ndarray, label: bool) -> _Boxes:
        self.boxes = np.concatenate([self.boxes, box.reshape(1, 4).astype(np.float32)])
        self.labels = np.concatenate([self.labels, np.array([int(bool(label))], np.int64)])
        return self


class StaticSam3Processor(Sam3ProcessorBase):
    """``Sam3Processor``'s API (``set_image``, ``set_image_batch``, ``set_text_prompt``,
    ``add_geometric_prompt``, ``reset_all_prompts``, ``set_confidence_threshold``; results in
    ``state["masks"]``, ``["masks_logits"]``, ``["boxes"]``, ``["scores"]``) over a
    ``paddle-sam export --model-type sam3`` folder, on Paddle Inference."""

    def __init__(
        self,
        export_dir: str | os.PathLike,
        device: str = "cpu",
        threads: int | None = None,
        *,
        confidence_threshold: float = 0.5,
        bpe_path: str | os.PathLike | None = None,
        ir_optim: bool = True,
        memory_optim: bool = False,
        onednn: bool = True,
        gpu_memory_mb: int = 1024,
        device_id: int = 0,
        text_cache_size: int = 32,
        verbose: bool = False,
    ) -> None:
        """Load an export folder.

        bpe_path: the tokenizer's vocabulary (default: the copy shipped with paddle-sam);
        onednn: run the text encoder with oneDNN on the CPU (the backbone and the prompt
        decoder never, see ``ONEDNN_PROGRAMS``); if Paddle refuses, it falls back to its own
        kernels with a warning;
        text_cache_size: text prompts whose features are kept; verbose: keep Paddle
        Inference's own log.
        """
        self.export_dir = Path(export_dir)
        self.manifest = read_manifest(
            export_dir, EXPORT_FORMAT, version=FORMAT_VERSION, programs=PROGRAMS
        )
        self.options = inference_options(
            PROGRAMS,
            ONEDNN_PROGRAMS if onednn else (),
            device=device,
            threads=threads,
            backend="paddle",
            ir_optim=ir_optim,
            memory_optim=memory_optim,
            gpu_memory_mb=gpu_memory_mb,
            device_id=device_id,
            verbose=verbose,
        )
        if self.manifest.get("cpu_fused_attention"):
            check_fused_attention(self.export_dir, device)
        self.resolution = int(self.manifest["image_size"])
        self.context_length = int(self.manifest["context_length"])
        self.confidence_threshold = confidence_threshold
        self.tokenizer = SimpleTokenizer(bpe_path=bpe_path)
        self._predictors = {p: create_predictor(self.export_dir, p, self.options) for p in PROGRAMS}
        self._text_cache: OrderedDict[str, dict] = OrderedDict()
        self.text_cache_size = text_cache_size

    def _run_backbone(self, images: np.ndarray) -> dict:
        # the program takes one image: a batch runs image by image
        per_image = [
            run_predictor(self._predictors["backbone"], {"image": images[i : i + 1]})
            for i in range(len(images))
        ]
        levels = [np.concatenate(level) for level in zip(*per_image, strict=True)]
        return {"backbone_fpn": levels}

    def _encode_text(self, prompt: str) -> dict:
        cached = self._text_cache.get(prompt)
        if cached is None:
            ids = np.asarray(self.tokenizer([prompt], context_length=self.context_length))
            features, mask = run_predictor(
                self._predictors["text_encoder"], {"token_ids": ids.astype(np.int64)}
            )
            cached = {"language_features": features, "language_mask": mask.astype(bool)}
            self._text_cache[prompt] = cached
            while len(self._text_cache) > self.text_cache_size:
                self._text_cache.popitem(last=False)
        self._text_cache.move_to_end(prompt)
        return dict(cached)

    def _empty_prompt(self) -> _Boxes:
        return _Boxes()

    def _append_box(self, prompt: _Boxes, box: np.ndarray, label: bool) -> _Boxes:
        return prompt.append(box, label)

    def decoder_feeds(self, state: dict) -> dict[str, np.ndarray]:
        """The decoder program's inputs for ``state``. No box is one masked-out padding box
        (the manifest's ``pad_box``): the program's box count is >= 1."""
        backbone_out = state["backbone_out"]
        prompt = state["geometric_prompt"]
        boxes, labels = prompt.boxes, prompt.labels
        mask = np.zeros((1, len(boxes)), bool)
        if len(boxes) == 0:
            boxes = np.asarray([self.manifest["pad_box"]], np.float32)
            labels = np.zeros((1,), np.int64)
            mask = np.ones((1, 1), bool)
        feeds = {f"backbone_fpn_{i}": f for i, f in enumerate(backbone_out["backbone_fpn"])}
        feeds.update(
            language_features=backbone_out["language_features"],
            language_mask=backbone_out["language_mask"],
            boxes=boxes[None],
            box_labels=labels[None],
            box_mask=mask,
        )
        return feeds

    def _run_heads(self, state: dict) -> dict:
        outputs = run_predictor(self._predictors["prompt_decoder"], self.decoder_feeds(state))
        return {k: paddle.to_tensor(v) for k, v in zip(DECODER_OUTPUTS, outputs, strict=True)}

    def release_memory(self) -> None:
        """Drop the programs' intermediate tensors and shrink Paddle Inference's memory pool;
        the state's image features and the text cache are kept."""
        for predictor in self._predictors.values():
            predictor.clear_intermediate_tensor()
            predictor.try_shrink_memory()


def read_sam3_onnx_manifest(export_dir: str | os.PathLike) -> dict:
    """``export.json`` of a SAM 3 ONNX export folder (``export --format onnx``), every file it
    lists checked."""
    return read_manifest(
        export_dir, ONNX_FORMAT, version=ONNX_FORMAT_VERSION, programs=(VISION, "weights")
    )


class OpenVinoVisionBackbone(nn.Layer):
    """``backbone.vision_backbone`` of a SAM 3 model (the ViT trunk and its necks), computed by
    OpenVINO from ``vision_backbone.onnx``: the same call and the same four lists (detector
    neck's maps and positions, second neck's or None), so the image model, the interactive
    predictor and the video model above it run unchanged.

    ``position_encoding``: the neck's (no weights: a function of the maps' shapes).
    ``levels``: the manifest's ``{"sam3": [[d, h, w], ...], "sam2": [...]}``.
    ``precision``: ``fp32``, ``bf16`` (CPUs with avx512_bf16 or AMX, detected here) or
    ``int8`` (``onnx_path`` then the int8 file of ``export --quantize int8``: int8 weights,
    and activations too with ``--calibration``);
    ``threads``: OpenVINO's inference threads (default: the process's Paddle thread count).
    """

    def __init__(
        self,
        onnx_path: str | os.PathLike,
        position_encoding: nn.Layer,
        levels: dict[str, list[list[int]]],
        *,
        precision: str = "fp32",
        threads: int | None = None,
    ) -> None:
        super().__init__()
        self.num_sam3 = len(levels["sam3"])
        shapes = [*levels["sam3"], *levels.get("sam2", [])]
        # called once an image, its buffers hundreds of MB at 1008 px: handed back after each
        # call, so that the heads' and masks' memory can reuse them
        self.program = OpenVinoProgram(
            onnx_path, shapes, precision=precision, threads=threads, release_after_call=True
        )
        self.precision = precision
        self.has_sam2_neck = len(shapes) > self.num_sam3
        self.position_encoding = position_encoding

    def forward(self, images: paddle.Tensor) -> tuple:
        maps = [as_tensor(m) for m in self.program(images.numpy())]
        sam3, sam2 = maps[: self.num_sam3], maps[self.num_sam3 :]
        sam3_pos = [self.position_encoding(f).astype(f.dtype) for f in sam3]
        if not self.has_sam2_neck:
            return sam3, sam3_pos, None, None
        return sam3, sam3_pos, sam2, [self.position_encoding(f).astype(f.dtype) for f in sam2]


class OpenVinoTextEncoder(VETextEncoder):
    """``backbone.language_backbone`` of a SAM 3 model computed by OpenVINO from the
    ``text_encoder.int8.xml`` of ``export --quantize int8`` (int8 weights): the same calls
    (:meth:`forward` on strings, :meth:`encode_tokens` on token ids) and outputs as the
    dynamic text encoder, whose tokenizer it keeps. Approximate, as the int8 backbone is.

    ``context_length``: the file's token count (the manifest's); ``threads``: OpenVINO's
    inference threads (default: the process's Paddle thread count)."""

    def __init__(
        self,
        path: str | os.PathLike,
        tokenizer: SimpleTokenizer | None,
        context_length: int,
        d_model: int,
        width: int,
        *,
        threads: int | None = None,
    ) -> None:
        # the dynamic encoder's API without its weights: nn.Layer's init, not VETextEncoder's
        nn.Layer.__init__(self)
        self.tokenizer = tokenizer
        self.context_length = int(context_length)
        shapes = [[self.context_length, int(d_model)], [self.context_length, int(width)]]
        self.program = OpenVinoProgram(path, shapes, precision="int8", threads=threads)

    def encode_tokens(
        self, tokenized: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        ids = np.asarray(tokenized.numpy(), np.int64)
        if ids.ndim != 2 or ids.shape[1] != self.context_length:
            raise ValueError(f"token ids must be B x {self.context_length}, got {list(ids.shape)}")
        memory, embeds = (as_tensor(a) for a in self.program(ids))
        padding = paddle.to_tensor(ids == 0)
        return padding, memory.transpose([1, 0, 2]), embeds.transpose([1, 0, 2])
