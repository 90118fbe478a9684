"""CPU runtimes for the heavy image encoders, measured side by side: dynamic Paddle, Paddle
Inference on the exported PIR program (oneDNN off / on / bf16), ONNX Runtime on paddle2onnx's
export (fp32, dynamic and static int8), OpenVINO on the same ONNX (fp32, bf16, int8 weights,
int8 weights and activations through NNCF) and the official PyTorch code (eager fp32, the
reference for the ratios).

    python benchmarks/bench_runtimes.py --model sam_v1|sam3 [--candidates a,b,...]
        [--repeats 3] [--threads 1] [--rounds 1] [--workdir DIR] [--ov-python PATH]
        [--out benchmarks/results]

``sam_v1``: the ViT-B image encoder (1 x 3 x 1024 x 1024 -> 1 x 256 x 64 x 64), the official
segment-anything model's random init saved as a ``.pth`` and converted. ``sam3``: the image
backbone (ViT + FPN neck, 1 x 3 x 1008 x 1008 -> the FPN levels the heads read), full-size
random weights in the released layout (as bench_sam3). The input is the fixed benchmark image
(bench_sam_v1.make_image) preprocessed by paddle_sam's own code, the same array for everyone.

A ``prepare`` child writes the weights, the PIR program, the ONNX file and its ONNX Runtime
int8 variants into the work folder; a second one, in the Python that has OpenVINO and NNCF
(``--ov-python``: a throw-away venv, as neither is a dependency of the project), writes the
NNCF variants. Then every candidate runs in its own process (interleaved over ``--rounds``),
each on ``--threads`` threads: one load, one warm-up call, ``--repeats`` timed calls (median),
peak RSS of the process. The parent compares every candidate's output with dynamic Paddle's
(max abs difference, cosine) and, for SAM v1, decodes a few clicks from each embedding with
paddle_sam's dynamic decoder (mask pixels equal, IoU, score difference against the masks from
dynamic Paddle's embedding).

This is a measurement, not a test: it has no thresholds and exits 0 whatever the ratios.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers (torch side)

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import bench_sam_v1 as v1  # noqa: E402  (keeps the environment as it was: v1._BASE_ENV)
import numpy as np  # noqa: E402

MODELS = ("sam_v1", "sam3")
# name -> (framework, what it runs); the order is the run order within a round
CANDIDATES = {
    "paddle": ("paddle", "dynamic Paddle fp32 (today's default)"),
    "pi": ("paddle", "Paddle Inference, PIR program, Paddle's own kernels"),
    "pi-onednn": ("paddle", "Paddle Inference, PIR program, oneDNN fp32"),
    "pi-onednn-bf16": ("paddle", "Paddle Inference, PIR program, oneDNN bf16"),
    "ort": ("onnxruntime", "ONNX Runtime fp32 (paddle2onnx export)"),
    "ort-int8-dyn": ("onnxruntime", "ONNX Runtime int8 dynamic (s8 weights per channel)"),
    "ort-int8-dyn-u8": ("onnxruntime", "ONNX Runtime int8 dynamic (u8 weights per tensor)"),
    "ort-int8-static": ("onnxruntime", "ONNX Runtime int8 static QDQ (calibrated)"),
    "ov": ("openvino", "OpenVINO fp32 (ONNX read directly)"),
    "ov-bf16": ("openvino", "OpenVINO bf16 (INFERENCE_PRECISION_HINT)"),
    "ov-int8w": ("openvino", "OpenVINO, int8 weights (export --quantize int8), f32 compute"),
    "ov-int8": ("openvino", "OpenVINO, int8 weights + activations (export --calibration)"),
    "torch": ("torch", "PyTorch eager fp32 (official code)"),
}
REFERENCE = "paddle"  # the accuracy reference
RATIO_BASE = "torch"  # the speed reference
ORT_INT8 = {
    "ort-int8-dyn": "encoder.int8-dyn.onnx",
    "ort-int8-dyn-u8": "encoder.int8-dyn-u8.onnx",
    "ort-int8-static": "encoder.int8-static.onnx",
}
OV_INT8 = {"ov-int8w": "ov_int8w.xml", "ov-int8": "ov_int8.xml"}
CALIBRATION_IMAGES = 2
CLICKS = 5
SIZES = {"sam_v1": 1024, "sam3": 1008}
PIXEL_MEAN, PIXEL_STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)  # SAM v1's
RESULT_PREFIX = v1.RESULT_PREFIX


# --------------------------------------------------------------------------------- inputs


def image_input(model: str, seed: int = v1.SEED) -> np.ndarray:
    """The benchmark image (another random one for ``seed != SEED``), preprocessed by
    paddle_sam's code: 1 x 3 x S x S float32."""
    image = v1.make_image(v1.IMAGE_HW)
    if seed != v1.SEED:
        rng = np.random.default_rng(seed)
        image = np.ascontiguousarray(np.roll(image, rng.integers(50, 400), axis=1)[:, ::-1])
        noise = rng.normal(0, 12, image.shape)
        image = np.clip(image.astype(np.float64) + noise, 0, 255).astype(np.uint8)
    if model == "sam3":
        from paddle_sam.predict.sam3.processor import preprocess_sam3_image

        return np.ascontiguousarray(preprocess_sam3_image(image, SIZES[model])[None], np.float32)
    import paddle

    from paddle_sam.models.sam_v1.sam import preprocess_image
    from paddle_sam.predict.sam_v1.transforms import ResizeLongestSide

    resized = ResizeLongestSide(SIZES[model]).apply_image(image)
    x = paddle.to_tensor(resized.astype(np.float32)).transpose([2, 0, 1]).unsqueeze(0)
    mean = paddle.to_tensor(PIXEL_MEAN, dtype="float32").reshape([-1, 1, 1])
    std = paddle.to_tensor(PIXEL_STD, dtype="float32").reshape([-1, 1, 1])
    return np.ascontiguousarray(preprocess_image(x, mean, std, SIZES[model]).numpy(), np.float32)


# --------------------------------------------------------------------------------- prepare


def write_paddle_side(model: str, work: Path, wanted: Sequence[str]) -> dict:
    """Weights, PIR programs, ONNX and its ONNX Runtime int8 variants, inputs; what each
    candidate loads goes into ``work`` (existing files are kept)."""
    info: dict[str, Any] = {}
    np.save(work / "input.npy", image_input(model))
    for i in range(CALIBRATION_IMAGES):
        np.save(work / f"calib_{i}.npy", image_input(model, seed=100 + i))
    net = build_paddle(model, work, write=True)
    from paddle import jit
    from paddle.static import InputSpec

    spec = [InputSpec([1, 3, SIZES[model], SIZES[model]], "float32", "image")]
    if any(c.startswith("pi") for c in wanted) and not (work / "pir" / "encoder.json").is_file():
        t0 = time.perf_counter()
        with fused_attention(net, model, True):
            jit.save(encoder_layer(net, model), str(work / "pir" / "encoder"), input_spec=spec)
        info["pir_export_s"] = time.perf_counter() - t0
    needs_onnx = any(c.startswith(("ort", "ov")) for c in wanted)
    onnx_path, raw = work / "encoder.onnx", work / "encoder.p2o.onnx"
    if needs_onnx and not onnx_path.is_file():
        import paddle2onnx

        t0 = time.perf_counter()
        with fused_attention(net, model, False):  # the fused kernel has no ONNX form
            jit.save(encoder_layer(net, model), str(work / "pir_plain" / "encoder"), spec)
        info["pir_plain_export_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        paddle2onnx.export(
            str(work / "pir_plain" / "encoder.json"),
            str(work / "pir_plain" / "encoder.pdiparams"),
            save_file=str(raw),
            opset_version=17,
            auto_upgrade_opset=False,
            optimize_tool="onnxoptimizer",
        )
        info["paddle2onnx_s"] = time.perf_counter() - t0
        if not raw.is_file():
            raise RuntimeError("paddle2onnx wrote no file (see its log above)")
        t0 = time.perf_counter()
        info["constants_moved"] = constants_to_initializers(raw, onnx_path, model == "sam3")
        info["onnx_preprocess_s"] = time.perf_counter() - t0
    del net
    for cand, name in ORT_INT8.items():
        if cand in wanted and not (work / name).is_file():
            t0 = time.perf_counter()
            quantize_ort(cand, model, onnx_path, work / name, work)
            info[f"{cand}_quantize_s"] = time.perf_counter() - t0
    return info


def constants_to_initializers(src: Path, dst: Path, external: bool) -> int:
    """The export's own move of paddle2onnx's Constant weights into the initializers
    (``paddle_sam.export.onnx.constants_to_initializers``), then onnxruntime's quantisation
    pre-processing (shape inference, graph optimisation: the rest of the Identity chains and
    the weight transposes fold away). Returns the number moved."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from paddle_sam.export.onnx import constants_to_initializers as move

    m = onnx.load(str(src))
    moved = move(m.graph)
    mid = dst.with_suffix(".init.onnx")
    data = {"all_tensors_to_one_file": True}
    onnx.save(m, str(mid), save_as_external_data=external, location=mid.name + ".data", **data)
    del m
    quant_pre_process(
        str(mid),
        str(dst),
        skip_symbolic_shape=True,
        save_as_external_data=external,
        external_data_location=dst.name + ".data",
        **data,
    )
    return moved


def build_paddle(model: str, work: Path, write: bool = False):
    """The dynamic paddle_sam model (SAM v1: the whole Sam; SAM 3: Sam3Image); with
    ``write``, first the random weights (and the torch file the reference loads)."""
    if model == "sam_v1":
        from paddle_sam.loading.sam_v1 import load_sam

        pdparams = work / "sam_vit_b.pdparams"
        if write and not pdparams.is_file():
            import segment_anything
            import torch

            from paddle_sam.convert.checkpoint import convert_checkpoint

            torch.manual_seed(v1.SEED)
            pth = work / "sam_vit_b.pth"
            torch.save(segment_anything.sam_model_registry["vit_b"]().state_dict(), pth)
            convert_checkpoint(pth, pdparams, "vit_b", progress=False)
        return load_sam(pdparams, "vit_b")
    from paddle_sam.loading.sam3 import load_sam3

    pdparams = work / "sam3.pdparams"
    if write and not pdparams.is_file():
        import torch
        from sam3 import model_builder

        from paddle_sam.convert.checkpoint import convert_checkpoint
        from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
        from tests.helpers.sam3_ref import cpu_patches, fan_in_init_, perturb_module_

        with cpu_patches(), torch.no_grad():
            torch.manual_seed(v1.SEED)
            ref = model_builder.build_sam3_image_model(
                bpe_path=str(DEFAULT_BPE_PATH),
                device="cpu",
                checkpoint_path=None,
                load_from_HF=False,
            )
            perturb_module_(fan_in_init_(ref, seed=v1.SEED), seed=v1.SEED, scale=0.02)
            pt = work / "sam3.pt"
            torch.save({"model": {f"detector.{k}": v for k, v in ref.state_dict().items()}}, pt)
        del ref
        convert_checkpoint(pt, pdparams, progress=False)
    return load_sam3(pdparams)


def encoder_layer(net, model: str):
    """The layer each runtime runs: SAM v1's image encoder, SAM 3's backbone (image -> FPN)."""
    if model == "sam_v1":
        return net.image_encoder
    from paddle_sam.export.sam3 import Backbone

    return Backbone(net)


def fused_attention(net, model: str, fused: bool):
    """SAM 3: every attention on Paddle's fused CPU kernel where it applies (``fused``) or
    never; SAM v1 has no such switch."""
    import contextlib

    if model != "sam3":
        return contextlib.nullcontext()
    from paddle_sam.export.sam3 import attention_kernel

    return attention_kernel(net, fused)


def quantize_ort(cand: str, model: str, src: Path, dst: Path, work: Path) -> None:
    """onnxruntime.quantization: dynamic (weights int8, activations quantised at run time)
    or static QDQ (weights int8 per channel, activations u8 from calibration ranges)."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    external = model == "sam3"  # over protobuf's 2 GB as fp32 intermediates
    import onnx

    nodes = [n.name for n in weight_layers(onnx.load(str(src), load_external_data=False).graph)]
    if cand == "ort-int8-dyn":
        quantize_dynamic(
            str(src),
            str(dst),
            per_channel=True,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=nodes,
            use_external_data_format=external,
        )
    elif cand == "ort-int8-dyn-u8":  # what `paddle-sam export --format onnx --quantize` writes
        quantize_dynamic(
            str(src),
            str(dst),
            per_channel=False,
            weight_type=QuantType.QUInt8,
            use_external_data_format=external,
        )
    else:
        nodes, cache = calibrate_ort(src, work, external)  # the same nodes
        quantize_static(
            str(src),
            str(dst),
            None,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul", "Gemm", "Conv"],
            nodes_to_quantize=nodes,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            calibration_cache_path=str(cache),
            use_external_data_format=external,
        )


def weight_layers(graph) -> list:
    """The nodes that hold weights: Gemm, Conv, and MatMul by a 2-D initializer (SAM v1's
    relative-position tables are 3-D MatMul operands: per-channel int8 refuses them, and they
    are small)."""
    dims = {t.name: len(t.dims) for t in graph.initializer}
    return [
        n
        for n in graph.node
        if (n.op_type in ("Gemm", "Conv") and n.input[1] in dims)
        or (n.op_type == "MatMul" and dims.get(n.input[1]) == 2)
    ]


def calibrate_ort(src: Path, work: Path, external: bool) -> tuple[list[str], Path]:
    """Min / max of the activations entering and leaving the layers with weights (MatMul,
    Gemm, Conv), over the calibration images, written as onnxruntime's calibration cache;
    returns (those nodes, the cache). onnxruntime's own calibrator also keeps the attention
    products (12 x 4096 x 4096 per global block of ViT-B) of every image: killed at 23 GB."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData, save_tensors_data

    m = onnx.load(str(src))
    g = m.graph
    layers = weight_layers(g)
    names = list(dict.fromkeys(t for n in layers for t in (n.input[0], n.output[0])))
    outputs = {o.name for o in g.output}
    for t in names:
        if t not in outputs:
            g.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    augmented = work / "calibration.onnx"
    onnx.save(
        m,
        str(augmented),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=augmented.name + ".data",
    )
    del m, g
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(augmented), opts, providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0].name
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for i in range(CALIBRATION_IMAGES):
        got = session.run(names, {feed: np.load(work / f"calib_{i}.npy")})
        for t, v in zip(names, got, strict=True):
            lo[t] = min(lo.get(t, np.inf), float(v.min()))
            hi[t] = max(hi.get(t, -np.inf), float(v.max()))
    del session
    data = {t: (np.array(lo[t], np.float32), np.array(hi[t], np.float32)) for t in names}
    cache = work / "calibration.json"
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), cache)
    return [n.name for n in layers], cache


def write_ov_side(model: str, work: Path, wanted: Sequence[str]) -> dict:
    """NNCF's int8 variants of the ONNX file (OpenVINO IR), in the Python that has them (NNCF
    is needed only when such a variant is wanted)."""
    import openvino as ov

    info: dict[str, Any] = {"openvino": ov.__version__}
    if not any(cand in wanted for cand in OV_INT8):
        return info
    import nncf

    from paddle_sam.export.onnx import quantize_int8

    info["nncf"] = nncf.__version__
    for cand, name in OV_INT8.items():
        if cand not in wanted or (work / name).is_file():
            continue
        t0 = time.perf_counter()
        # what `paddle-sam export --quantize int8 [--calibration]` writes
        data = None
        if cand == "ov-int8":
            data = [np.load(work / f"calib_{i}.npy") for i in range(CALIBRATION_IMAGES)]
        quantize_int8(work / "encoder.onnx", work / name, data)
        info[f"{cand}_quantize_s"] = time.perf_counter() - t0
    return info


# --------------------------------------------------------------------------------- workers


def load_runner(cand: str, model: str, work: Path, threads: int) -> tuple[Callable, dict]:
    """``(run, extra)``: ``run(x)`` -> list of float32 arrays (the encoder's outputs)."""
    framework = CANDIDATES[cand][0]
    if framework == "paddle":
        import paddle_sam  # first: it applies its CPU defaults before paddle loads

        paddle_sam.tune_process()  # the settings the CLI runs with
        paddle_sam.set_num_threads(threads)
    if cand == "paddle":
        import paddle

        net = build_paddle(model, work)
        net.eval()
        layer = encoder_layer(net, model)

        def run(x: np.ndarray) -> list[np.ndarray]:
            with paddle.no_grad():
                out = layer(paddle.to_tensor(x))
            return [t.numpy() for t in (out if isinstance(out, tuple | list) else [out])]

        return run, {"version": paddle.__version__}
    if framework == "paddle":
        from paddle import inference

        from paddle_sam.deploy.sam_v1 import ONEDNN_SKIPPED_PASSES

        extra: dict[str, Any] = {}
        d = work / "pir"
        cfg = inference.Config(str(d / "encoder.json"), str(d / "encoder.pdiparams"))
        cfg.disable_gpu()
        cfg.disable_glog_info()
        cfg.set_cpu_math_library_num_threads(threads)
        if cand == "pi":
            cfg.disable_mkldnn()
        else:
            cfg.enable_mkldnn()
            if model == "sam_v1":
                for name in ONEDNN_SKIPPED_PASSES["image_encoder"]:
                    cfg.delete_pass(name)
            blacklist = os.environ.get("FLAGS_pir_onednn_kernel_blacklist")
            extra["onednn_kernel_blacklist"] = blacklist
            if cand.endswith("bf16"):
                cfg.enable_mkldnn_bfloat16()
        predictor = inference.create_predictor(cfg)
        name = predictor.get_input_names()[0]

        def run(x: np.ndarray) -> list[np.ndarray]:
            h = predictor.get_input_handle(name)
            h.reshape(list(x.shape))
            h.copy_from_cpu(x)
            predictor.run()
            outs = predictor.get_output_names()
            return [predictor.get_output_handle(n).copy_to_cpu() for n in outs]

        import paddle

        return run, {"version": paddle.__version__, **extra}
    if framework == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        path = work / ORT_INT8.get(cand, "encoder.onnx")
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x}), {"version": ort.__version__}
    if framework == "openvino":
        import openvino as ov

        core = ov.Core()
        path = work / OV_INT8.get(cand, "encoder.onnx")
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "bf16" if cand == "ov-bf16" else "f32",
        }
        compiled = core.compile_model(str(path), "CPU", config)
        request = compiled.create_infer_request()
        got = compiled.get_property("INFERENCE_PRECISION_HINT")

        def run(x: np.ndarray) -> list[np.ndarray]:
            request.infer({0: x})
            return [
                np.array(request.get_output_tensor(i).data) for i in range(len(compiled.outputs))
            ]

        return run, {"version": ov.__version__, "precision": str(got)}
    import torch

    torch.set_num_threads(threads)
    ref = torch_reference(model, work)

    def run(x: np.ndarray) -> list[np.ndarray]:
        with torch.inference_mode():
            out = ref(torch.from_numpy(x))
        return [t.float().numpy() for t in (out if isinstance(out, tuple | list) else [out])]

    return run, {"version": torch.__version__}


def torch_reference(model: str, work: Path):
    """The official image encoder (SAM v1) or backbone (SAM 3) on the same weights."""
    if model == "sam_v1":
        import segment_anything

        sam = segment_anything.sam_model_registry["vit_b"](checkpoint=str(work / "sam_vit_b.pth"))
        return sam.eval().image_encoder
    from sam3 import model_builder

    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
    from tests.helpers.sam3_ref import cpu_patches

    with cpu_patches():
        sam3 = model_builder.build_sam3_image_model(
            bpe_path=str(DEFAULT_BPE_PATH),
            device="cpu",
            checkpoint_path=str(work / "sam3.pt"),
            load_from_HF=False,
        ).eval()
    backbone = sam3.backbone
    return lambda x: list(backbone.forward_image(x)["backbone_fpn"])


def worker_main(args) -> None:
    work = Path(args.workdir)
    x = np.load(work / "input.npy")
    t0 = time.perf_counter()
    run, extra = load_runner(args.worker, args.model, work, args.threads)
    load_s = time.perf_counter() - t0
    first = v1._timed(lambda: run(x))
    times = [v1._timed(lambda: run(x)) for _ in range(args.repeats)]
    outs = run(x)
    np.savez(work / "out" / f"{args.worker}.npz", *[np.asarray(o, np.float32) for o in outs])
    result = {
        "candidate": args.worker,
        "threads": args.threads,
        "load_s": load_s,
        "first_s": first,
        "call_s": statistics.median(times),
        "call_all_s": times,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        **extra,
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def masks_main(args) -> None:
    """SAM v1: decode ``CLICKS`` clicks from every saved embedding with the dynamic decoder;
    mask agreement and score difference against the reference embedding's."""
    import paddle

    import paddle_sam

    paddle_sam.set_num_threads(args.threads)
    work = Path(args.workdir)
    sam = build_paddle("sam_v1", work)
    predictor = paddle_sam.SamPredictor(sam)
    rng = np.random.default_rng(v1.SEED + 5)
    h, w = v1.IMAGE_HW
    clicks = np.stack([rng.uniform(0, w - 1, CLICKS), rng.uniform(0, h - 1, CLICKS)], 1)

    def decode(emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        predictor.reset_image()
        predictor.original_size = v1.IMAGE_HW
        predictor.input_size = ResizeLongestSide.get_preprocess_shape(h, w, SIZES["sam_v1"])
        predictor.features = paddle.to_tensor(emb)
        predictor.dense_pe = sam.prompt_encoder.get_dense_pe()
        predictor.is_image_set = True
        out = [predictor.predict(c[None].astype(np.float32), np.array([1])) for c in clicks]
        return np.stack([m for m, _, _ in out]), np.stack([s for _, s, _ in out])

    from paddle_sam.predict.sam_v1.transforms import ResizeLongestSide

    ref_masks, ref_scores = decode(np.load(work / "out" / f"{REFERENCE}.npz")["arr_0"])
    result = {}
    for f in sorted((work / "out").glob("*.npz")):
        masks, scores = decode(np.load(f)["arr_0"])
        inter = (masks & ref_masks).sum(axis=(-2, -1))
        union = (masks | ref_masks).sum(axis=(-2, -1))
        iou = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        result[f.stem] = {
            "mask_equal": float((masks == ref_masks).mean()),
            "mask_iou_min": float(iou.min()),
            "mask_iou_mean": float(iou.mean()),
            "score_max_diff": float(np.abs(scores - ref_scores).max()),
        }
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------- parent


def run_child(python: str, argv: list[str], label: str, env: dict | None = None) -> dict:
    cmd = [python, os.path.abspath(__file__), *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env or child_env(1), capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        print(f"  {label}: FAILED (exit {proc.returncode})", file=sys.stderr, flush=True)
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:300]}"}
    print(f"  {label}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def child_env(threads: int, extra: dict | None = None) -> dict:
    env = dict(v1._BASE_ENV)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    env.update(extra or {})
    return env


def python_for(cand: str, args) -> str:
    return args.ov_python if CANDIDATES[cand][0] == "openvino" else sys.executable


def compare(work: Path, cands: Sequence[str]) -> dict[str, dict]:
    """Max abs difference and cosine of every candidate's outputs against the reference's."""
    ref_path = work / "out" / f"{REFERENCE}.npz"
    if not ref_path.is_file():
        return {}
    ref = np.load(ref_path)
    ref_flat = np.concatenate([ref[k].ravel() for k in ref.files]).astype(np.float64)
    out = {}
    for cand in cands:
        path = work / "out" / f"{cand}.npz"
        if not path.is_file():
            continue
        got = np.load(path)
        if [got[k].shape for k in got.files] != [ref[k].shape for k in ref.files]:
            out[cand] = {"error": f"shapes {[got[k].shape for k in got.files]}"}
            continue
        flat = np.concatenate([got[k].ravel() for k in got.files]).astype(np.float64)
        cos = flat @ ref_flat / (np.linalg.norm(flat) * np.linalg.norm(ref_flat))
        out[cand] = {
            "max_abs_diff": float(np.abs(flat - ref_flat).max()),
            "ref_max_abs": float(np.abs(ref_flat).max()),
            "cosine": float(cos),
        }
    return out


def file_mb(work: Path, cand: str) -> float | None:
    """Size of what the candidate loads (weights included), MB."""
    fw = CANDIDATES[cand][0]
    if cand == "paddle":
        files = list(work.glob("*.pdparams"))
    elif fw == "paddle":
        files = list((work / "pir").glob("encoder.*"))
    elif cand in ORT_INT8:
        stem = ORT_INT8[cand]
        files = [work / stem] + list(work.glob(stem + ".data"))
    elif cand in OV_INT8:
        files = [work / OV_INT8[cand], work / OV_INT8[cand].replace(".xml", ".bin")]
    elif fw in ("onnxruntime", "openvino"):
        files = [work / "encoder.onnx"] + list(work.glob("encoder.onnx.data"))
    else:
        files = list(work.glob("*.pth")) + list(work.glob("*.pt"))
    files = [f for f in files if f.is_file()]
    return sum(f.stat().st_size for f in files) / 1e6 if files else None


HEADER = [
    "candidate",
    "runtime",
    "s / call",
    "x torch",
    "x paddle",
    "first call (s)",
    "load (s)",
    "peak RSS (MB)",
    "files (MB)",
    "max |diff|",
    "cosine",
    "mask equal",
    "mask IoU min",
    "score diff",
]


def rows_of(summary: dict[str, dict]) -> list[list[str]]:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    base = summary.get(RATIO_BASE, {}).get("call_s")
    ref = summary.get(REFERENCE, {}).get("call_s")
    rows = []
    for cand, s in summary.items():
        if "error" in s:
            rows.append([cand, CANDIDATES[cand][1], "failed: " + s["error"][:80]] + ["-"] * 11)
            continue
        call = s["call_s"]
        rows.append(
            [
                cand,
                CANDIDATES[cand][1],
                num(call, ".2f"),
                num(call / base if base else None, ".2f"),
                num(call / ref if ref else None, ".2f"),
                num(s.get("first_s"), ".2f"),
                num(s.get("load_s"), ".2f"),
                num(s.get("peak_rss_mb"), ".0f"),
                num(s.get("files_mb"), ".0f"),
                num(s.get("max_abs_diff"), ".2e"),
                num(s.get("cosine"), ".6f"),
                num(s.get("mask_equal"), ".5f"),
                num(s.get("mask_iou_min"), ".4f"),
                num(s.get("score_max_diff"), ".2e"),
            ]
        )
    return rows


def parent_main(args) -> None:
    started = dt.datetime.now().astimezone()
    work = Path(args.workdir or f"/tmp/bench_runtimes_{args.model}")
    (work / "out").mkdir(parents=True, exist_ok=True)
    (work / "pir").mkdir(exist_ok=True)
    (work / "pir_plain").mkdir(exist_ok=True)
    cands = list(args.candidates)
    common = ["--model", args.model, "--workdir", str(work)]
    want = ["--candidates", ",".join(cands)]
    prep = run_child(sys.executable, ["--worker", "prepare", *common, *want], "prepare")
    if "error" in prep:
        raise SystemExit("prepare failed")
    if any(CANDIDATES[c][0] == "openvino" for c in cands):
        prep_ov = run_child(args.ov_python, ["--worker", "prepare-ov", *common, *want], "nncf")
        prep.update(prep_ov)
    runs: dict[str, list[dict]] = {c: [] for c in cands}
    for r in range(1, args.rounds + 1):
        for cand in cands:
            argv = ["--worker", cand, *common, "--repeats", str(args.repeats)]
            argv += ["--threads", str(args.threads)]
            extra = {**(ONEDNN_ENV if cand.startswith("pi-onednn") else {}), **ISA_ENV[args.isa]}
            env = child_env(args.threads, extra)
            load_before = os.getloadavg()[0]
            res = run_child(python_for(cand, args), argv, f"round {r} {cand}", env)
            runs[cand].append({**res, "load_avg_1min_before": load_before})
            with open(work / "runs.jsonl", "a") as f:  # each result as it comes
                f.write(json.dumps({"round": r, **runs[cand][-1]}) + "\n")
    summary: dict[str, dict] = {}
    for cand, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            summary[cand] = {"error": rs[0]["error"]}
            continue
        s = {k: statistics.median(r[k] for r in ok) for k in ("load_s", "first_s", "call_s")}
        s["peak_rss_mb"] = max(r["peak_rss_mb"] for r in ok)
        s["files_mb"] = file_mb(work, cand)
        s["version"] = ok[0].get("version")
        s["detail"] = {
            k: v for k, v in ok[0].items() if k in ("precision", "onednn_kernel_blacklist")
        }
        s["calls"] = [t for r in ok for t in r["call_all_s"]]
        s["load_avg"] = [r["load_avg_1min_before"] for r in ok]
        summary[cand] = s
    for cand, acc in compare(work, cands).items():
        summary[cand].update(acc)
    if args.model == "sam_v1" and REFERENCE in cands:
        argv = ["--worker", "masks", *common, "--threads", str(args.threads)]
        for cand, acc in run_child(sys.executable, argv, "mask agreement").items():
            if cand in summary and "error" in acc:
                continue
            if cand in summary:
                summary[cand].update(acc)
    info = [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", v1._cpu_model()),
        ("cpu flags", v1.cpu_flags() + f" amx_int8={'yes' if has_flag('amx_int8') else 'no'}"),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("python", platform.python_version()),
        ("versions", versions(summary, prep)),
        ("threads", f"{args.threads} for every runtime"),
        ("isa", " ".join(f"{k}={v}" for k, v in ISA_ENV[args.isa].items()) or "native"),
        (
            "settings",
            f"{args.model} encoder, repeats {args.repeats} (median) after a warm-up, "
            f"rounds {args.rounds} interleaved, accuracy against {REFERENCE}",
        ),
        ("oneDNN env (pi-onednn*)", " ".join(f"{k}={v}" for k, v in ONEDNN_ENV.items()) or "-"),
        ("prepare", ", ".join(f"{k} {v:.0f} s" for k, v in prep.items() if k.endswith("_s"))),
    ]
    rows = rows_of(summary)
    print()
    print("\n".join(f"{k:>24}: {v}" for k, v in info))
    print()
    print(v1.format_table(rows, markdown=False, header=HEADER))
    for cand, s in summary.items():
        if "calls" in s:
            calls = " / ".join(f"{t:.2f}" for t in s["calls"])
            load = " / ".join(f"{t:.1f}" for t in s["load_avg"])
            print(f"{cand}: calls {calls} s; 1-min load average before: {load}; {s['detail']}")
    isa = "" if args.isa == "native" else f"_{args.isa}"
    stem = f"runtimes_{args.model}{isa}_{started.strftime('%Y%m%d-%H%M%S')}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.writer(f)
        for k, v in info:
            w.writerow([f"# {k}", v])
        w.writerow(HEADER)
        w.writerows(rows)
    print(f"\nwrote {out / f'{stem}.csv'}")


def has_flag(flag: str) -> bool:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return flag in line.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def versions(summary: dict, prep: dict) -> str:
    seen = {}
    for cand, s in summary.items():
        if s.get("version"):
            seen.setdefault(CANDIDATES[cand][0], s["version"])
    if "nncf" in prep:
        seen["nncf"] = prep["nncf"]
    seen["paddle2onnx"] = v1._version("paddle2onnx")
    return ", ".join(f"{k} {v}" for k, v in seen.items())


# oneDNN kernels Paddle 3.3.x cannot run under PIR for these programs, run on Paddle's own
# kernels instead (the flag takes a comma list of op names)
ONEDNN_ENV: dict[str, str] = {}


# --isa avx2: the libraries' own switches to stay below AVX-512 on a CPU that has it (oneDNN,
# which OpenVINO's CPU plugin and Paddle's oneDNN path use; MKL; PyTorch's ATen kernels).
# ONNX Runtime's MLAS has no such switch and Paddle's fused attention kernel checks the CPU
# itself: those two still use AVX-512 (the table says so).
ISA_ENV: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
    },
}


def parse_candidates(text: str) -> tuple[str, ...]:
    cands = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [c for c in cands if c not in CANDIDATES]
    if not cands or bad:
        raise argparse.ArgumentTypeError(
            f"unknown candidate(s) {bad}; choose from {', '.join(CANDIDATES)}"
        )
    return cands


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="sam_v1")
    p.add_argument("--candidates", type=parse_candidates, default=tuple(CANDIDATES))
    p.add_argument("--repeats", type=v1.positive, default=3)
    p.add_argument("--rounds", type=v1.positive, default=1)
    p.add_argument("--threads", type=v1.positive, default=1)
    p.add_argument(
        "--isa",
        choices=tuple(ISA_ENV),
        default="native",
        help="avx2: ask oneDNN, MKL and ATen to stay below AVX-512 (not ONNX Runtime)",
    )
    p.add_argument("--workdir", default=None, help="prepared files (reused when present)")
    p.add_argument(
        "--ov-python",
        default=sys.executable,
        help="a Python with openvino, nncf and paddle-sam's requirements (default: this one)",
    )
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker == "prepare":
        print(
            RESULT_PREFIX
            + json.dumps(write_paddle_side(args.model, Path(args.workdir), args.candidates)),
            flush=True,
        )
    elif args.worker == "prepare-ov":
        print(
            RESULT_PREFIX
            + json.dumps(write_ov_side(args.model, Path(args.workdir), args.candidates)),
            flush=True,
        )
    elif args.worker == "masks":
        masks_main(args)
    elif args.worker:
        worker_main(args)
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
