"""ONNX export of SAM v1 through paddle2onnx (the optional ``onnx`` extra), with upstream's
ONNX interface.

``prompt_decoder.onnx`` is :class:`SamOnnxModel` (prompt encoder, mask decoder and mask
postprocessing), the graph upstream's ``scripts/export_onnx_model.py`` writes: the same input
names and dtypes (all float32, ``orig_im_size`` included), a dynamic number of points
(``num_points``), outputs ``masks``, ``iou_predictions``, ``low_res_masks`` and upstream's
options (``return_single_mask``, ``use_stability_score``, ``return_extra_metrics``, tanh GELU),
so upstream's onnxruntime recipe and web demo run it unchanged. ``image_encoder.onnx`` takes
the preprocessed image (``image``: 1 x 3 x S x S, or a dynamic batch) and returns
``image_embeddings``, the decoder's first input. ``export.json`` records both interfaces and
the options; optionally int8 variants (``*.quant.onnx``, onnxruntime's dynamic quantisation,
as upstream's ``--quantize-out``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.static import InputSpec

from ..models.sam_v1.sam import Sam, preprocess_image
from ..predict.sam_v1.amg_utils import calculate_stability_score
from ..predict.sam_v1.transforms import ResizeLongestSide
from .sam_v1 import (
    MANIFEST,
    PROGRAMS,
    check_outputs,
    decoder_formulation,
    point_input_spec,
    sam_fields,
    write_manifest,
)

ONNX_FORMAT = "paddle-sam/sam_v1-onnx"
# versioned apart from the PIR export's FORMAT_VERSION (a change to the PIR programs leaves
# ONNX exports valid); 3 is what ONNX exports carried while the two shared one number;
# 4: upstream's decoder interface (float32 orig_im_size, named outputs, options) and the
# encoder's output named image_embeddings
ONNX_FORMAT_VERSION = 4
DEFAULT_OPSET = 17
MIN_OPSET = 11  # upstream's floor for the decoder graph
ENCODER_INPUT = "image"
ENCODER_OUTPUT = "image_embeddings"
DECODER_INPUTS = (
    "image_embeddings",
    "point_coords",
    "point_labels",
    "mask_input",
    "has_mask_input",
    "orig_im_size",
)
DECODER_OUTPUTS = ("masks", "iou_predictions", "low_res_masks")
EXTRA_METRICS_OUTPUTS = (
    "masks",
    "iou_predictions",
    "stability_scores",
    "areas",
    "low_res_masks",
)
QUANTIZE_CHOICES = ("int8",)
INT8_SUFFIX = ".int8"  # OpenVINO int8 models: <program>.int8.xml / .bin
ENCODER_INT8 = "image_encoder_int8"  # the manifest's program of the int8 image encoder
QUANT_SUFFIX = ".quant.onnx"


def int8_files(program: str) -> tuple[str, str]:
    """The OpenVINO model of ``program`` with int8 weights: ``<program>.int8.xml`` and
    its ``.bin``."""
    return (f"{program}{INT8_SUFFIX}.xml", f"{program}{INT8_SUFFIX}.bin")


class SamOnnxModel(nn.Layer):
    """A SAM v1 model's prompt encoder, mask decoder and mask postprocessing as one layer
    with upstream's ONNX interface, for export (``export_onnx``); it runs in dygraph too.

    Inputs, all float32: image_embeddings 1 x C x h x w; point_coords 1 x N x 2 (pixels of
    the resized image, ``ResizeLongestSide.apply_coords``); point_labels 1 x N (1 foreground,
    0 background, -1 padding, 2 / 3 box corners); mask_input 1 x 1 x 4h x 4w (low-res logits
    of a previous prediction); has_mask_input 1 (1 uses mask_input, 0 ignores it);
    orig_im_size 2 (H, W of the original image).

    Outputs: masks 1 x M x H x W (logits at the original size), iou_predictions 1 x M,
    low_res_masks 1 x M x 4h x 4w, with M every mask token (the single-mask output first,
    then the multimask outputs), or M = 1 with ``return_single_mask``: the best multimask
    output for at most two points (one click and its padding point, or a box alone), else
    the single-mask output. ``use_stability_score``: scores are the stability scores of the
    low-res masks (offset 1.0) instead of the predicted IoU. ``return_extra_metrics``: five
    outputs, masks, scores, stability scores and areas (pixels above the threshold) of the
    upscaled masks, low-res masks. Batch 1.
    """

    def __init__(
        self,
        model: Sam,
        return_single_mask: bool,
        use_stability_score: bool = False,
        return_extra_metrics: bool = False,
    ) -> None:
        super().__init__()
        self.prompt_encoder = model.prompt_encoder
        self.mask_decoder = model.mask_decoder
        self.img_size = int(model.image_encoder.img_size)
        self.mask_threshold = float(model.mask_threshold)
        self.return_single_mask = bool(return_single_mask)
        self.use_stability_score = bool(use_stability_score)
        self.stability_score_offset = 1.0
        self.return_extra_metrics = bool(return_extra_metrics)
        n = self.mask_decoder.num_mask_tokens
        with paddle.no_grad():
            # constants of the graph: the grid's positional encoding and the single-mask
            # output's weight in the mask selection
            self.register_buffer("dense_pe", self.prompt_encoder.get_dense_pe().detach())
            reweight = paddle.to_tensor([[1000.0] + [0.0] * (n - 1)], dtype="float32")
            self.register_buffer("score_reweight", reweight)

    @staticmethod
    def resize_longest_image_size(
        input_image_size: paddle.Tensor, longest_side: int
    ) -> paddle.Tensor:
        """(H, W) -> the size of the image resized to ``longest_side`` (int64), in float32."""
        size = input_image_size.astype("float32")
        scale = longest_side / paddle.max(size)
        return paddle.floor(scale * size + 0.5).astype("int64")

    def _embed_points(self, point_coords: paddle.Tensor, point_labels: paddle.Tensor):
        """1 x N x 2, 1 x N -> 1 x N x C; no padding point is added (the caller gives it)."""
        return self.prompt_encoder._embed_points(point_coords, point_labels, pad=False)

    def _embed_masks(self, input_mask: paddle.Tensor, has_mask_input: paddle.Tensor):
        """The mask input's embedding weighted by has_mask_input, the no-mask embedding by
        its complement: 1 x C x h x w."""
        pe = self.prompt_encoder
        embedding = has_mask_input * pe.mask_downscaling(input_mask)
        no_mask = pe.no_mask_embed.weight.reshape([1, -1, 1, 1])
        return embedding + (1 - has_mask_input) * no_mask

    def mask_postprocessing(
        self, masks: paddle.Tensor, orig_im_size: paddle.Tensor
    ) -> paddle.Tensor:
        """Low-res logits -> logits at the original size: upscale to the padded input, crop
        the padding, resize to ``orig_im_size`` (bilinear throughout)."""
        size = self.img_size
        masks = F.interpolate(masks, size=[size, size], mode="bilinear", align_corners=False)
        prepadded = self.resize_longest_image_size(orig_im_size, size)
        masks = paddle.slice(masks, axes=[2, 3], starts=[0, 0], ends=[prepadded[0], prepadded[1]])
        hw = orig_im_size.astype("int64")
        return F.interpolate(masks, size=[hw[0], hw[1]], mode="bilinear", align_corners=False)

    def select_masks(
        self, masks: paddle.Tensor, iou_preds: paddle.Tensor, num_points: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """The mask with the best score, the single-mask output's score moved by 1000 per
        point above 2.5 (no control flow in the graph): the single-mask output from three
        points on, the best multimask output below. -> 1 x 1 x h x w, 1 x 1."""
        shift = num_points.astype("float32") - 2.5
        score = iou_preds + shift * self.score_reweight
        best = paddle.argmax(score, axis=1)
        masks = paddle.index_select(masks, best, axis=1)
        iou_preds = paddle.index_select(iou_preds, best, axis=1)
        return masks, iou_preds

    def forward(
        self,
        image_embeddings: paddle.Tensor,
        point_coords: paddle.Tensor,
        point_labels: paddle.Tensor,
        mask_input: paddle.Tensor,
        has_mask_input: paddle.Tensor,
        orig_im_size: paddle.Tensor,
    ) -> tuple[paddle.Tensor, ...]:
        sparse = self._embed_points(point_coords, point_labels)
        dense = self._embed_masks(mask_input, has_mask_input)
        masks, scores = self.mask_decoder.predict_masks(
            image_embeddings, self.dense_pe, sparse, dense
        )
        if self.use_stability_score:
            scores = calculate_stability_score(
                masks, self.mask_threshold, self.stability_score_offset, float64=False
            )
        if self.return_single_mask:
            masks, scores = self.select_masks(masks, scores, paddle.shape(point_coords)[1])
        upscaled = self.mask_postprocessing(masks, orig_im_size)
        if self.return_extra_metrics:
            stability = calculate_stability_score(
                upscaled, self.mask_threshold, self.stability_score_offset, float64=False
            )
            areas = (upscaled > self.mask_threshold).astype("int64").sum(axis=[-2, -1])
            return upscaled, scores, stability, areas, masks
        return upscaled, scores, masks


class TanhGELU(nn.Layer):
    """GELU's tanh approximation written out, ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715
    x^3)))``: paddle2onnx 2.1.0 converts Paddle's ``gelu(approximate=True)`` to the exact
    erf form, so the export spells the approximation with elementary ops."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1.0 + paddle.tanh(inner))


@contextmanager
def approximate_gelu(layer: nn.Layer, enabled: bool = True) -> Iterator[None]:
    """Within the block, every ``nn.GELU`` under ``layer`` is a :class:`TanhGELU`
    (upstream's ``--gelu-approximate``, for runtimes with a slow or missing erf); the
    layers are put back on exit."""
    swapped = []
    if enabled:
        for parent in layer.sublayers(include_self=True):
            for name, child in parent._sub_layers.items():
                if isinstance(child, nn.GELU):
                    swapped.append((parent, name, child))
    try:
        for parent, name, _ in swapped:
            parent._sub_layers[name] = TanhGELU()
        yield
    finally:
        for parent, name, child in swapped:
            parent._sub_layers[name] = child


def decoder_input_spec(sam: Sam) -> list[InputSpec]:
    """Upstream's decoder inputs (all float32, a dynamic number of points, batch 1)."""
    grid, c = sam.spec.image_embedding_size, sam.spec.prompt_embed_dim
    return [
        InputSpec([1, c, grid, grid], "float32", "image_embeddings"),
        *point_input_spec(),
        InputSpec([1, 1, 4 * grid, 4 * grid], "float32", "mask_input"),
        InputSpec([1], "float32", "has_mask_input"),
        InputSpec([2], "float32", "orig_im_size"),
    ]


def _paddle2onnx():
    try:
        import paddle2onnx
    except ImportError as exc:
        raise ImportError("ONNX export needs paddle2onnx: pip install 'paddle-sam[onnx]'") from exc
    return paddle2onnx


def _quantizer():
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        missing = getattr(exc, "name", None) or "onnxruntime"
        raise ImportError(
            f"quantize='int8' needs onnxruntime's quantization tools ({missing} is missing): "
            "pip install 'paddle-sam[onnx]'"
        ) from exc
    return quantize_dynamic, QuantType


def _int8_tools():
    """``(nncf, openvino)``, or an ImportError naming the extras to install."""
    try:
        import nncf
        import openvino
    except ImportError as exc:
        raise ImportError(
            f"int8 weights for OpenVINO need NNCF and OpenVINO ({exc.name} is missing): "
            "pip install 'paddle-sam[openvino,int8]'"
        ) from exc
    return nncf, openvino


def quantize_int8(
    onnx_path: str | os.PathLike,
    xml_path: str | os.PathLike,
    calibration: Sequence[np.ndarray] | None = None,
) -> dict:
    """``onnx_path``'s graph written as an OpenVINO model (``xml_path`` and the ``.bin`` beside
    it) with int8 weights; returns what the manifest records.

    Without ``calibration``: NNCF's weight compression (MatMul, convolution and embedding
    weights asymmetric int8, one scale and zero point per output channel), activations stay
    float, OpenVINO dequantising each weight as it computes. With ``calibration`` (the
    graph's input for each calibration image, preprocessed as the runtime does): NNCF's
    post-training quantisation, weights and activations int8 (static scales from these
    inputs, SmoothQuant for the MatMuls; NNCF's transformer preset, which leaves softmax,
    normalisations and GELU in float; the attention products stay float too; weights in 7
    bits, exact on CPUs without VNNI too). Either way
    the file and the memory the weights take shrink to about a quarter."""
    nncf, ov = _int8_tools()
    model = ov.Core().read_model(str(onnx_path))
    if calibration is None:
        with quiet_logger("nncf"):
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
        method = "weights only, int8 asymmetric per output channel (NNCF compress_weights)"
        extra = {"weight_bits": 8}
    else:
        data = [np.ascontiguousarray(x, np.float32) for x in calibration]
        if not data:
            raise ValueError("calibration: no images; give at least one")
        # INFO: one line per layer it leaves float
        with quiet_logger("nncf"), statistics_outputs_first():
            model = nncf.quantize(
                model,
                nncf.Dataset(data),
                subset_size=len(data),
                model_type=nncf.ModelType.TRANSFORMER,
                # weights in 7 bits for every layer (NNCF's default: the first only): a CPU
                # without VNNI multiplies int8 pairs into saturating 16-bit sums, which 8-bit
                # weights overflow (a small SAM 3 backbone on an AVX2 EPYC: cosine 0.975 to fp32);
                # with 7 bits the sums are exact there, so the file answers the same on every CPU
                advanced_parameters=nncf.AdvancedQuantizationParameters(
                    overflow_fix=nncf.OverflowFix.ENABLE
                ),
                # float: the attention products (calibrating them has NNCF fetch every attention
                # matrix of an image: SAM 3's backbone ran out of 23 GB) and the table lookups of
                # the position tables (NNCF 3.4's quantiser propagation fails on SAM v1's Gather)
                ignored_scope=nncf.IgnoredScope(
                    names=activation_matmuls(model), types=["Gather"], validate=False
                ),
            )
        method = (
            "weights and activations int8, static scales from calibration images "
            "(NNCF quantize, transformer preset, weights in 7 bits)"
        )
        extra = {"calibration_images": len(data), "weight_bits": 7}
    ov.save_model(model, str(xml_path), compress_to_fp16=False)
    return {"method": method, **extra, "nncf": nncf.__version__, "openvino": ov.__version__}


@contextmanager
def statistics_outputs_first() -> Iterator[bool]:
    """For the block, NNCF's statistics models list their statistics outputs first, in the
    order the graph computes them, and the model's own outputs last; yields whether it could
    (it replaces NNCF's private ``OVModelTransformer._insert_outputs``, as in the pinned NNCF
    3.4, for the block only).

    Why: OpenVINO's CPU plugin computes a graph in the order of its outputs (measured: 64 mean
    statistics on SAM 3's backbone added after its outputs raised one inference's peak from
    4.3 to 9.2 GB, listed first in graph order to 5.9 GB). In NNCF's order, statistics last,
    every activation a statistic reads stays allocated until the whole model has run:
    calibrating SAM 3's full-size backbone peaked at 21-23 GB resident, and at 8.1 GB in this
    order. The statistics themselves do not change: the weights file written is the same byte
    for byte."""
    try:
        import openvino
        from nncf.openvino.graph.model_transformer import OVModelTransformer
        from nncf.openvino.graph.model_utils import copy_rt_info
    except ImportError:
        yield False
        return
    insert = OVModelTransformer.__dict__.get("_insert_outputs")
    if not isinstance(insert, staticmethod):
        yield False
        return

    def insert_outputs_first(model, outputs):
        with_outputs = insert.__func__(model, outputs)
        results = list(with_outputs.get_results())
        own, extra = results[: len(model.get_results())], results[len(model.get_results()) :]
        position = {op.get_friendly_name(): i for i, op in enumerate(model.get_ordered_ops())}

        def computed_at(result) -> int:  # the model's own node the statistic reads
            node = result.input_value(0).get_node()
            while node.get_friendly_name() not in position and node.get_input_size():
                node = node.input_value(0).get_node()
            return position.get(node.get_friendly_name(), len(position))

        reordered = openvino.Model(
            results=sorted(extra, key=computed_at) + own,
            sinks=with_outputs.get_sinks(),
            parameters=with_outputs.get_parameters(),
            name=with_outputs.friendly_name,
        )
        copy_rt_info(with_outputs, reordered, path=["nncf"])
        return reordered

    OVModelTransformer._insert_outputs = staticmethod(insert_outputs_first)
    try:
        yield True
    finally:
        OVModelTransformer._insert_outputs = insert


@contextmanager
def quiet_logger(name: str, level: int = logging.WARNING) -> Iterator[None]:
    """The ``name`` logger raised to ``level`` for the block (its INFO chatter is not for
    users), set back afterwards."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def activation_matmuls(model) -> list[str]:
    """The names of an OpenVINO model's MatMuls of two activations (neither input computed
    from constants alone): attention scores and their products with the values."""
    constant: dict[str, bool] = {}

    def is_constant(node) -> bool:
        key = node.get_friendly_name()
        if key not in constant:
            kind = node.get_type_name()
            ins = [i.get_source_output().get_node() for i in node.inputs()]
            constant[key] = kind == "Constant" or (
                kind != "Parameter" and bool(ins) and all(is_constant(n) for n in ins)
            )
        return constant[key]

    return [
        op.get_friendly_name()
        for op in model.get_ordered_ops()  # inputs first: the recursion stays shallow
        if op.get_type_name() == "MatMul"
        and not any(is_constant(i.get_source_output().get_node()) for i in op.inputs())
    ]


def check_onnx_options(opset: int, quantize: str | None) -> None:
    """Clear errors for an opset below ``MIN_OPSET`` or an unknown quantisation."""
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < MIN_OPSET:
        raise ValueError(f"opset must be an integer >= {MIN_OPSET}, got {opset!r}")
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ValueError(
            f"quantize must be one of {list(QUANTIZE_CHOICES)} or None, got {quantize!r}"
        )


def _rename_values(graph, renames: dict[str, str]) -> None:
    """Rename the values ``renames`` maps everywhere in ``graph`` (node inputs and outputs,
    graph outputs, value infos)."""
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in [*graph.output, *graph.value_info]:
        value.name = renames.get(value.name, value.name)


def _name_dims(values, names: dict[str, dict[int, str]]) -> None:
    """Give the listed axes of the graph inputs / outputs ``values`` symbolic names."""
    for value in values:
        for axis, dim_name in names.get(value.name, {}).items():
            dim = value.type.tensor_type.shape.dim[axis]
            dim.dim_param = dim_name


def constants_to_initializers(graph) -> int:
    """paddle2onnx 2.1.0 writes every weight as a ``Constant`` node, often behind an
    ``Identity``: tools that look for weights among the initializers (onnxruntime's quantiser
    above all, which then leaves every MatMul and Conv in fp32) do not see them. Each such
    tensor becomes an initializer under the Constant's output name, and an ``Identity`` of an
    initializer is bypassed (its consumers read the initializer). The same values; returns the
    number of tensors moved."""
    from onnx import numpy_helper

    keep, moved = [], 0
    for node in graph.node:
        value = next((a for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None and len(node.attribute) == 1:
            graph.initializer.append(
                numpy_helper.from_array(numpy_helper.to_array(value.t), node.output[0])
            )
            moved += 1
        else:
            keep.append(node)
    weights = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    alias = {
        n.output[0]: n.input[0]
        for n in keep
        if n.op_type == "Identity" and n.input[0] in weights and n.output[0] not in outputs
    }
    nodes = [n for n in keep if not (n.op_type == "Identity" and n.output and n.output[0] in alias)]
    for n in nodes:
        for i, name in enumerate(n.input):
            if name in alias:
                n.input[i] = alias[name]
    del graph.node[:]
    graph.node.extend(nodes)
    return moved


def _finish_graph(
    path: Path,
    prog: str,
    outputs: tuple[str, ...],
    dims: dict[str, dict[int, str]],
    *,
    dst: Path | None = None,
    external: str | None = None,
) -> None:
    """Name the graph outputs ``outputs`` (paddle2onnx numbers them) and the dynamic axes
    ``dims``, put the weights among the initializers (:func:`constants_to_initializers`),
    check the model and save it to ``dst`` (default: back to ``path``). ``external``: the
    weights go to that file beside it (ONNX's external data; a graph over protobuf's 2 GB
    must)."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    constants_to_initializers(graph)
    _roi_align_unaligned(graph)
    got = [o.name for o in graph.output]
    if len(got) != len(outputs):
        raise RuntimeError(
            f"paddle2onnx wrote the {prog} program with {len(got)} outputs {got}, "
            f"expected {len(outputs)} ({', '.join(outputs)})"
        )
    renames = dict(zip(got, outputs, strict=True))
    taken = {v.name for v in [*graph.input, *graph.initializer]}
    taken |= {n for node in graph.node for n in [*node.input, *node.output]}
    clash = sorted((taken - set(renames)) & set(outputs))
    if clash:
        raise RuntimeError(f"the {prog} graph already has values named {clash}")
    _rename_values(graph, renames)
    _name_dims([*graph.input, *graph.output], dims)
    # constants paddle2onnx leaves unused (runtimes warn about each one on loading)
    used = {n for node in graph.node for n in node.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name not in used]
    for t in unused:
        graph.initializer.remove(t)
    dst = path if dst is None else dst
    if external is None:
        onnx.checker.check_model(model)
        onnx.save(model, str(dst))
        return
    (dst.parent / external).unlink(missing_ok=True)  # onnx appends to an existing one
    onnx.save(
        model,
        str(dst),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=external,
        size_threshold=0,
    )
    onnx.checker.check_model(str(dst))  # by path: the weights are read from the file


def _roi_align_unaligned(graph) -> None:
    """Give each ``RoiAlign`` node of ``graph`` the coordinate mode of ``aligned=False``
    (``output_half_pixel``), the only one this package's models use (SAM 3's box pooling, as
    torchvision's default upstream uses). paddle2onnx 2.1.0 writes no mode, and ONNX's
    default since opset 16 is ``half_pixel`` (``aligned=True``): boxes were pooled half a
    cell off, and SAM 3's box prompts scored differently on ONNX Runtime."""
    from onnx import helper

    for node in graph.node:
        if node.op_type != "RoiAlign":
            continue
        if any(a.name == "coordinate_transformation_mode" for a in node.attribute):
            continue
        node.attribute.append(
            helper.make_attribute("coordinate_transformation_mode", "output_half_pixel")
        )


def _convert(p2o, src: Path, prog: str, dst: Path, opset: int) -> None:
    """paddle2onnx one saved PIR program ``src / prog`` into ``dst``."""
    # "onnxoptimizer": the default tool (polygraphy) pip-installs packages at run time
    p2o.export(
        str(src / f"{prog}.json"),
        str(src / f"{prog}.pdiparams"),
        save_file=str(dst),
        opset_version=opset,
        auto_upgrade_opset=False,
        optimize_tool="onnxoptimizer",
    )
    if not dst.is_file() or dst.stat().st_size == 0:  # paddle2onnx logs, not raises
        raise RuntimeError(f"paddle2onnx could not convert the {prog} program (opset {opset})")
    epsilons = _group_norm_epsilons(json.loads((src / f"{prog}.json").read_text()))
    if epsilons:
        import onnx

        model = onnx.load(str(dst))
        _instance_norm_epsilons(model.graph, epsilons, prog)
        onnx.save(model, str(dst))


def _group_norm_epsilons(program: dict) -> list[float]:
    """The ``epsilon`` of every ``group_norm`` op of a saved PIR program, in program order."""
    found: list[float] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if node.get("#", "").endswith(".group_norm"):
                attrs = {a.get("N"): a.get("AT", {}).get("D") for a in node.get("A", [])}
                found.append(float(attrs["epsilon"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(program)
    return found


def _instance_norm_epsilons(graph, epsilons: list[float], prog: str) -> None:
    """Write the GroupNorm epsilons into the ``InstanceNormalization`` nodes paddle2onnx
    converts ``group_norm`` to. paddle2onnx 2.1.0 reads the PIR attribute (a double) as a
    float and fails, leaving the value uninitialised: each export got a different epsilon
    (seen: -3.5e24, 1.4e-45, 5.9e-7), and SAM 3's masks differed between two exports of one
    model. Matched in order: paddle2onnx writes the nodes in the program's order."""
    from onnx import helper

    nodes = [n for n in graph.node if n.op_type == "InstanceNormalization"]
    if len(nodes) != len(epsilons):
        raise RuntimeError(
            f"the {prog} program has {len(epsilons)} group_norm ops, but paddle2onnx wrote "
            f"{len(nodes)} InstanceNormalization nodes: cannot give them their epsilon"
        )
    for node, eps in zip(nodes, epsilons, strict=True):
        kept = [a for a in node.attribute if a.name != "epsilon"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("epsilon", eps)])


def export_onnx(
    sam: Sam,
    out_dir: str | os.PathLike,
    *,
    model_type: str | None = None,
    source_sha256: str | None = None,
    overwrite: bool = False,
    opset: int = DEFAULT_OPSET,
    return_single_mask: bool = False,
    use_stability_score: bool = False,
    return_extra_metrics: bool = False,
    gelu_approximate: bool = False,
    dynamic_batch: bool = False,
    quantize: str | None = None,
    calibration: Iterable[np.ndarray] | None = None,
) -> dict:
    """Write ``image_encoder.onnx``, ``prompt_decoder.onnx`` (:class:`SamOnnxModel`) and
    ``export.json`` to ``out_dir``; returns the manifest.

    return_single_mask, use_stability_score, return_extra_metrics: the decoder's options
    (:class:`SamOnnxModel`); gelu_approximate: the decoder's GELUs as tanh approximations
    (upstream's option; it applies to the decoder only, as upstream's); dynamic_batch: the
    encoder takes any batch (``batch`` axis) instead of 1; quantize="int8": also
    ``image_encoder.quant.onnx`` and ``prompt_decoder.quant.onnx``, dynamically quantised
    by onnxruntime (uint8 weights, per tensor, as upstream's ``--quantize-out``).
    calibration (with quantize="int8"): H x W x 3 uint8 RGB images; also
    ``image_encoder.int8.xml`` / ``.bin``, the encoder for OpenVINO with int8 weights and
    activations calibrated on them (:func:`quantize_int8`; the faster int8 path measured,
    run by ``OnnxSamPredictor(encoder_runtime="openvino", precision="int8")``).
    """
    check_onnx_options(opset, quantize)
    if calibration is not None and not quantize:
        raise ValueError("calibration images are for quantize='int8'")
    p2o = _paddle2onnx()
    quantizer = _quantizer() if quantize else None
    if calibration is not None:
        _int8_tools()  # a missing extra is named before any work
        calibration = list(encoder_inputs(sam, calibration))
        if not calibration:
            raise ValueError("calibration: no images; give at least one")
    out = Path(out_dir)
    programs = {p: [f"{p}.onnx"] + ([f"{p}{QUANT_SUFFIX}"] if quantize else []) for p in PROGRAMS}
    if calibration is not None:
        programs[ENCODER_INT8] = list(int8_files("image_encoder"))
    check_outputs(out, [f for names in programs.values() for f in names] + [MANIFEST], overwrite)
    out.mkdir(parents=True, exist_ok=True)
    size, grid = sam.spec.image_size, sam.spec.image_embedding_size
    channels = sam.spec.prompt_embed_dim
    batch = "batch" if dynamic_batch else 1
    outputs = EXTRA_METRICS_OUTPUTS if return_extra_metrics else DECODER_OUTPUTS
    decoder = SamOnnxModel(sam, return_single_mask, use_stability_score, return_extra_metrics)
    sam.eval()
    decoder.eval()
    image_spec = InputSpec([None if dynamic_batch else 1, 3, size, size], "float32", ENCODER_INPUT)
    with tempfile.TemporaryDirectory(prefix="paddle-sam-onnx-") as tmp:
        tmp = Path(tmp)
        paddle.jit.save(sam.image_encoder, str(tmp / "image_encoder"), input_spec=[image_spec])
        with decoder_formulation(sam, few_tokens=False, channels_last=False):
            with approximate_gelu(decoder, gelu_approximate):
                paddle.jit.save(
                    decoder, str(tmp / "prompt_decoder"), input_spec=decoder_input_spec(sam)
                )
        batch_dims = {ENCODER_INPUT: {0: "batch"}, ENCODER_OUTPUT: {0: "batch"}}
        finish = {
            "image_encoder": ((ENCODER_OUTPUT,), batch_dims if dynamic_batch else {}),
            "prompt_decoder": (
                outputs,
                {"point_coords": {1: "num_points"}, "point_labels": {1: "num_points"}},
            ),
        }
        for prog in PROGRAMS:
            dst = tmp / f"{prog}.onnx"
            _convert(p2o, tmp, prog, dst, opset)
            _finish_graph(dst, prog, *finish[prog])
            if quantizer is not None:
                quantize_dynamic, quant_type = quantizer
                quantize_dynamic(
                    model_input=str(dst),
                    model_output=str(tmp / f"{prog}{QUANT_SUFFIX}"),
                    per_channel=False,
                    reduce_range=False,
                    weight_type=quant_type.QUInt8,
                )
        openvino_int8 = None
        if calibration is not None:
            xml = tmp / programs[ENCODER_INT8][0]
            openvino_int8 = quantize_int8(tmp / "image_encoder.onnx", xml, calibration)
        for names in programs.values():
            for name in names:
                shutil.move(str(tmp / name), out / name)
    return write_manifest(
        out,
        ONNX_FORMAT,
        programs,
        format_version=ONNX_FORMAT_VERSION,
        model_type=model_type,
        source_sha256=source_sha256,
        **sam_fields(sam),
        opset=opset,
        paddle2onnx_version=p2o.__version__,
        encoder={
            "file": "image_encoder.onnx",
            "input": ENCODER_INPUT,
            "input_shape": [batch, 3, size, size],
            "output": ENCODER_OUTPUT,
            "output_shape": [batch, channels, grid, grid],
            "preprocessing": "RGB image resized so its longest side is image_size (bilinear, "
            "ResizeLongestSide), normalised with pixel_mean / pixel_std, padded at the "
            "bottom and right to image_size x image_size, NCHW float32",
            "dynamic_batch": bool(dynamic_batch),
        },
        decoder={
            "file": "prompt_decoder.onnx",
            "inputs": {
                "image_embeddings": [1, channels, grid, grid],
                "point_coords": [1, "num_points", 2],
                "point_labels": [1, "num_points"],
                "mask_input": [1, 1, 4 * grid, 4 * grid],
                "has_mask_input": [1],
                "orig_im_size": [2],
            },
            "input_dtype": "float32",
            "outputs": list(outputs),
            "return_single_mask": bool(return_single_mask),
            "use_stability_score": bool(use_stability_score),
            "return_extra_metrics": bool(return_extra_metrics),
            "gelu_approximate": bool(gelu_approximate),
        },
        quantized=(
            {
                "image_encoder": f"image_encoder{QUANT_SUFFIX}",
                "prompt_decoder": f"prompt_decoder{QUANT_SUFFIX}",
                "method": "onnxruntime quantize_dynamic, uint8 weights per tensor",
                **(
                    {"openvino": {ENCODER_INT8: programs[ENCODER_INT8][0], **openvino_int8}}
                    if openvino_int8
                    else {}
                ),
            }
            if quantize
            else None
        ),
    )


def encoder_inputs(sam: Sam, images: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """The image encoder's input (1 x 3 x S x S float32) for each H x W x 3 uint8 RGB image,
    resized and normalised as the predictors do."""
    size = sam.image_encoder.img_size
    transform = ResizeLongestSide(size)
    for i, image in enumerate(images):
        image = checked_rgb(image, f"calibration image {i}")
        x = paddle.to_tensor(transform.apply_image(image)).transpose([2, 0, 1]).unsqueeze(0)
        yield preprocess_image(x, sam.pixel_mean, sam.pixel_std, size).numpy()


def checked_rgb(image: np.ndarray, what: str) -> np.ndarray:
    """``image`` as an H x W x 3 uint8 array, or a ValueError naming ``what`` and its shape."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(
            f"{what}: expected H x W x 3 uint8 RGB, got {image.dtype} of shape {list(image.shape)}"
        )
    return image
