"""SAM 3 on the CPU: paddle_sam's ``Sam3Processor`` (dygraph) and ``StaticSam3Processor``
(the PIR export on Paddle Inference) against the official PyTorch ``sam3`` ``Sam3Processor``,
same full-size random weights.

    python benchmarks/bench_sam3.py [--repeats 2] [--prompts 3] [--rounds 2] [--threads N]
        [--impl paddle,static,openvino,openvino-bf16,openvino-int8,openvino-int8-static,torch]
        [--out benchmarks/results]

The parent process has a worker write one set of weights: the official full-size image model
built by sam3's builder, every Linear redrawn from N(0, 1/fan_in) and every tensor perturbed
(as tests/models/test_full_size_sam3.py; upstream's bare init leaves the text encoder's
``torch.empty`` tensors uninitialised), saved in the released layout (``{"model":
{"detector.*": ...}}``) and converted to ``.pdparams`` with paddle_sam's converter, which
``static`` exports (``export_sam3``, its defaults). Then each
implementation runs in its own subprocess (``--worker paddle|static|torch``), interleaved for
``--rounds`` rounds; the median per implementation is reported, warm-up calls excluded. Each
worker prints one JSON line.

This is a measurement, not a test: it has no thresholds and exits 0 whatever the ratios. The
machine description, CSV number format and child-process plumbing are bench_sam_v1's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers.sam3_ref (torch side)

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import bench_sam_v1 as v1  # noqa: E402  (keeps the environment as it was: v1._BASE_ENV)
import numpy as np  # noqa: E402

IMPLS = (
    "paddle",
    "static",
    "openvino",
    "openvino-bf16",
    "openvino-int8",
    "openvino-int8-static",
    "samexporter",
    "torch",
)
# the export (``export --format onnx``, with ``--quantize int8`` where an impl is int8, and
# ``--calibration`` for the static one) each OpenVINO impl runs, and its precision
OPENVINO = {
    "openvino": "fp32",
    "openvino-bf16": "bf16",
    "openvino-int8": "int8",
    "openvino-int8-static": "int8",
}
CALIBRATION_IMAGES = 4  # the static int8 export's: the benchmark scene shifted and noised
IMAGE_HW = (768, 1024)
TEXTS = ("a yellow school bus", "the dog on the left", "a red car", "person", "traffic light")
BOXES = ((0.45, 0.5, 0.3, 0.4), (0.3, 0.3, 0.2, 0.25), (0.6, 0.7, 0.25, 0.2))  # cx, cy, w, h
Metric = v1.Metric
METRICS = (
    Metric("import_s", "import framework + package (s)", digits=2),
    Metric("load_s", "model load: build + weights (s)", digits=2),
    Metric("set_image_first_s", "set_image, first call (s)", digits=2),
    Metric("set_image_s", f"set_image {IMAGE_HW[0]}x{IMAGE_HW[1]} (s)", digits=2),
    Metric("text_s", "text prompt, threshold 0.5 (s)", digits=3),
    Metric("text_all_s", "text prompt, all 200 queries (s)", digits=3),
    Metric("box_s", "box prompt, threshold 0.5 (s)", digits=3),
    Metric("peak_rss_mb", "peak RSS (MB)", digits=0),
)


# --------------------------------------------------------------------------------- workers


#: (metric key, prompt kind, confidence threshold) of the timed prompts, in run order
PROMPT_RUNS = (("text_s", "text", 0.5), ("text_all_s", "text", 0.0), ("box_s", "box", 0.5))


def prompt_timings(
    first: float,
    set_times: list[float],
    prompts: int,
    prompt: Callable[[str, int, float], tuple[float, int]],
) -> dict[str, Any]:
    """What every worker reports: ``set_image``'s first call and repeats, then for each of
    :data:`PROMPT_RUNS` a warm-up and ``prompts`` timed calls of ``prompt(kind, i,
    threshold)`` (seconds, instances kept), the median and the last call's instances."""
    out: dict[str, Any] = {
        "set_image_first_s": first,
        "set_image_s": statistics.median(set_times),
        "set_image_all_s": set_times,
    }
    for key, kind, threshold in PROMPT_RUNS:
        prompt(kind, 0, threshold)  # warm-up, excluded
        runs = [prompt(kind, i, threshold) for i in range(1, prompts + 1)]
        out[key] = statistics.median(t for t, _ in runs)
        out[key + "_all"] = [t for t, _ in runs]
        out[key + "_kept"] = runs[-1][1]
    return out


def time_processor(processor: Any, to_numpy: Callable[[Any], np.ndarray], args) -> dict:
    """The same calls on both processors: set_image, then text and box prompts."""
    from PIL import Image

    image = Image.fromarray(v1.make_image(IMAGE_HW))  # upstream takes PIL (or a CHW tensor)
    state: dict = {}

    def set_image() -> None:
        processor.set_image(image, state)
        to_numpy(state["backbone_out"]["backbone_fpn"][-1])

    first = v1._timed(set_image)
    set_times = [v1._timed(set_image) for _ in range(args.repeats)]

    def prompt(kind: str, i: int, threshold: float) -> tuple[float, int]:
        processor.set_confidence_threshold(threshold)

        def call() -> None:
            processor.reset_all_prompts(state)
            if kind == "box":
                processor.add_geometric_prompt(list(BOXES[i % len(BOXES)]), True, state)
            else:
                processor.set_text_prompt(TEXTS[i % len(TEXTS)], state)
            to_numpy(state["scores"])

        return v1._timed(call), int(to_numpy(state["scores"]).shape[0])

    out = prompt_timings(first, set_times, args.prompts, prompt)
    processor.set_confidence_threshold(0.0)
    processor.reset_all_prompts(state)
    processor.set_text_prompt(TEXTS[0], state)
    scores = to_numpy(state["scores"])
    out["check_scores"] = [float(scores.mean()), float(scores.std()), float(scores.max())]
    out["check_boxes_mean"] = float(to_numpy(state["boxes"]).mean())
    return out


def run_paddle_worker(args) -> dict:
    """``--worker paddle`` (dygraph ``Sam3Processor`` on the .pdparams), ``static``
    (``StaticSam3Processor`` on the PIR export folder) or ``openvino[-bf16|-int8]`` (the dynamic
    model with its vision backbone on OpenVINO, from the ONNX export folder)."""
    t0 = time.perf_counter()
    import paddle_sam  # first: it applies its CPU defaults before paddle loads

    paddle_sam.tune_process()  # the settings the CLI runs with

    import_s = time.perf_counter() - t0
    import paddle

    from paddle_sam._runtime import cpu_count, get_num_threads

    paddle.set_device("cpu")
    if args.threads:
        paddle_sam.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if args.worker == "static":
        from paddle_sam.deploy import StaticSam3Processor

        processor = StaticSam3Processor(args.checkpoint, threads=args.threads)
        to_numpy: Callable[[Any], np.ndarray] = np.asarray
    elif args.worker in OPENVINO:
        from paddle_sam.loading.sam3 import load_sam3_export

        model = load_sam3_export(args.checkpoint, precision=OPENVINO[args.worker])
        processor = paddle_sam.Sam3Processor(model)
        to_numpy = lambda t: t.numpy()  # noqa: E731
    else:
        model = paddle_sam.build_sam3_image_model(checkpoint_path=args.checkpoint)
        processor = paddle_sam.Sam3Processor(model)
        to_numpy = lambda t: t.numpy()  # noqa: E731
    load_s = time.perf_counter() - t0
    with paddle.no_grad():
        result = time_processor(processor, to_numpy, args)
    return {
        "impl": args.worker,
        "version": paddle.__version__,
        # the static runtime's default is every available core (inference_options)
        "threads": args.threads or (cpu_count() if args.worker == "static" else get_num_threads()),
        "import_s": import_s,
        "load_s": load_s,
        **result,
    }


def run_torch_worker(args) -> dict:
    t0 = time.perf_counter()
    import torch
    from sam3 import model_builder
    from sam3.model.sam3_image_processor import Sam3Processor

    import_s = time.perf_counter() - t0
    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
    from tests.helpers.sam3_ref import (
        cpu_patches,  # sam3 0.1.4's three CUDA-only spots (docs/design.md section 1)
    )

    if args.threads:
        torch.set_num_threads(args.threads)
    with cpu_patches(), torch.inference_mode():
        t0 = time.perf_counter()
        model = model_builder.build_sam3_image_model(
            bpe_path=str(DEFAULT_BPE_PATH),
            device="cpu",
            checkpoint_path=args.checkpoint,
            load_from_HF=False,
        )
        load_s = time.perf_counter() - t0
        processor = Sam3Processor(model, device="cpu")
        result = time_processor(processor, lambda t: t.float().numpy(), args)
    return {
        "impl": "torch",
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "import_s": import_s,
        "load_s": load_s,
        **result,
    }


def run_samexporter_worker(args) -> dict:
    """samexporter's ``SegmentAnything3ONNX`` (ONNX Runtime, its default providers and
    threads) on its own export of the official model (:func:`samexporter_export`): the image
    encoder for ``set_image``, the language encoder and decoder for a text prompt, the decoder
    for a box, each result thresholded without NMS (as upstream's processor)."""
    t0 = time.perf_counter()
    import onnxruntime
    from samexporter import sam3_onnx

    import_s = time.perf_counter() - t0
    folder = Path(args.checkpoint)
    t0 = time.perf_counter()
    if not (folder / "sam3_decoder.onnx").is_file():  # its export failed: the encoders alone
        return {
            "impl": "samexporter",
            "version": onnxruntime.__version__,
            "threads": os.cpu_count(),
            "import_s": import_s,
            **samexporter_encoders_only(sam3_onnx, folder, t0, args),
        }
    model = sam3_onnx.SegmentAnything3ONNX(
        str(folder / "sam3_image_encoder.onnx"),
        str(folder / "sam3_decoder.onnx"),
        str(folder / "sam3_language_encoder.onnx"),
    )
    load_s = time.perf_counter() - t0
    bgr = np.ascontiguousarray(v1.make_image(IMAGE_HW)[:, :, ::-1])
    h, w = IMAGE_HW
    embedding = model.encode(bgr, "visual")

    def set_image() -> None:  # the image encoder alone (encode() runs the text one too)
        outs = model.image_encoder(bgr)
        embedding.update({f"vision_pos_enc_{i}": outs[i] for i in range(3)})
        embedding.update({f"backbone_fpn_{i}": outs[3 + i] for i in range(3)})

    first = v1._timed(set_image)
    set_times = [v1._timed(set_image) for _ in range(args.repeats)]
    kept: dict[str, int] = {}

    def prompt(kind: str, i: int, threshold: float) -> tuple[float, int]:
        def call() -> None:
            if kind == "box":
                cx, cy, bw, bh = BOXES[i % len(BOXES)]
                box = [(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h]
                marks = [{"type": "rectangle", "data": box}]
                text = "visual"
            else:
                marks, text = [], TEXTS[i % len(TEXTS)]
            lang = model.language_encoder(text)
            embedding.update(
                language_mask=lang[0], language_features=lang[1], language_embeds=lang[2]
            )
            masks = model.predict_masks(
                embedding, marks, confidence_threshold=threshold, nms_threshold=None
            )
            kept[kind] = int(masks.shape[0])

        return v1._timed(call), kept[kind]

    out = prompt_timings(first, set_times, args.prompts, prompt)
    # the check: every query's score and box for the first text, as the other workers report
    lang = model.language_encoder(TEXTS[0])
    embedding.update(language_mask=lang[0], language_features=lang[1], language_embeds=lang[2])
    slots = model.decoder.geometric_prompt_capacity or 1
    _, scores, boxes = model.decoder(
        (h, w),
        *(embedding[f"vision_pos_enc_{i}"] for i in range(3)),
        *(embedding[f"backbone_fpn_{i}"] for i in range(3)),
        embedding["language_mask"],
        embedding["language_features"],
        embedding["language_embeds"],
        np.zeros((slots, 1, 4), np.float32),
        np.ones((slots, 1), np.int64),
        np.ones((1, slots), np.bool_),
    )
    scores = np.asarray(scores, np.float64)
    out["check_scores"] = [float(scores.mean()), float(scores.std()), float(scores.max())]
    out["check_boxes_mean"] = float(np.asarray(boxes, np.float64).mean())
    return {
        "impl": "samexporter",
        "version": onnxruntime.__version__,
        "threads": os.cpu_count(),  # ONNX Runtime's default: the machine's cores
        "import_s": import_s,
        "load_s": load_s,
        **out,
    }


def samexporter_encoders_only(sam3_onnx: Any, folder: Path, t0: float, args) -> dict:
    """samexporter's image and language encoders where its decoder could not be exported:
    ``set_image`` and a text's encoding timed, the prompts' metrics left out."""
    image_encoder = sam3_onnx.SAM3ImageEncoder(str(folder / "sam3_image_encoder.onnx"))
    text_encoder = sam3_onnx.SAM3LanguageEncoder(str(folder / "sam3_language_encoder.onnx"))
    load_s = time.perf_counter() - t0
    bgr = np.ascontiguousarray(v1.make_image(IMAGE_HW)[:, :, ::-1])
    first = v1._timed(lambda: image_encoder(bgr))
    set_times = [v1._timed(lambda: image_encoder(bgr)) for _ in range(args.repeats)]
    text_encoder(TEXTS[0])  # warm-up
    texts = [v1._timed(lambda i=i: text_encoder(TEXTS[i % len(TEXTS)])) for i in range(3)]
    return {
        "load_s": load_s,
        "set_image_first_s": first,
        "set_image_s": statistics.median(set_times),
        "set_image_all_s": set_times,
        "text_encoder_s": statistics.median(texts),
        "missing": (folder / "decoder_export_error.txt").read_text().strip()
        if (folder / "decoder_export_error.txt").is_file()
        else "no sam3_decoder.onnx",
    }


def samexporter_export(pt: Path, out: Path) -> None:
    """samexporter's own export (``samexporter.export_sam3``) of the official model in
    ``pt``, run against sam3 0.1.4 on the CPU: the official builder given the BPE file and a
    CPU processor, and the ViT's rotary encoding through sam3's own real-valued rotation
    (``sam3.sam.rope.apply_rotary_enc_real``, the same values) instead of ``view_as_complex``,
    which torch.onnx cannot export (samexporter expects a later sam3 whose ViT has that switch).
    Its decoder export (torch.onnx's dynamo path) needs ``onnxscript``."""
    import functools
    from unittest import mock

    from sam3.model import vitdet
    from sam3.sam.rope import apply_rotary_enc_real
    from samexporter import export_sam3 as sx

    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH
    from tests.helpers.sam3_ref import cpu_patches

    def apply_rope_real(self, q, k):
        if not self.use_rope:
            return q, k
        q2, k2 = apply_rotary_enc_real(q, k, self.freqs_cis_real, self.freqs_cis_imag)
        return q2.type_as(q), k2.type_as(k)

    build = functools.partial(sx.build_sam3_image_model, bpe_path=str(DEFAULT_BPE_PATH))
    with (
        cpu_patches(),
        mock.patch.object(vitdet.Attention, "_apply_rope", apply_rope_real),
        mock.patch.object(sx, "build_sam3_image_model", build),
        mock.patch.object(sx, "Sam3Processor", functools.partial(sx.Sam3Processor, device="cpu")),
    ):
        try:
            sx.export_sam3(str(out), checkpoint_path=str(pt), device="cpu")
        except Exception as exc:  # noqa: BLE001  the encoders written before it are measured
            if not (out / "sam3_language_encoder.onnx").is_file():
                raise
            root = exc.__cause__ or exc  # torch.onnx wraps the error that stopped it
            why = f"samexporter's decoder export failed: {type(root).__name__}: {root}"
            (out / "decoder_export_error.txt").write_text(why.splitlines()[0][:300] + "\n")
            print(f"  {why.splitlines()[0][:300]}", flush=True)


def worker_main(args) -> None:
    run = {"torch": run_torch_worker, "samexporter": run_samexporter_worker}.get(
        args.worker, run_paddle_worker
    )
    result = run(args)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB
    print(v1.RESULT_PREFIX + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------- weights


def write_weights(impls: Sequence[str], tmp: Path) -> dict[str, Path]:
    """One set of full-size weights, as the file (or export folder) each implementation
    loads: {impl: path}."""
    from paddle_sam.convert import sam3 as conv
    from paddle_sam.convert.checkpoint import convert_checkpoint
    from paddle_sam.convert.core import save_pdparams

    pdparams = tmp / "sam3.pdparams"
    paths: dict[str, Path] = {}
    if "torch" not in impls and "samexporter" not in impls:  # random, the released layout
        state = conv.convert_state_dict(conv.random_released_state_dict(seed=v1.SEED))
        save_pdparams(state, pdparams, {"model_type": "sam3"})
    else:
        import torch
        from sam3 import model_builder

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
            pt = tmp / "sam3.pt"
            torch.save({"model": {f"detector.{k}": v for k, v in ref.state_dict().items()}}, pt)
        del ref
        paths["torch"] = pt
        convert_checkpoint(pt, pdparams, progress=False)
    if "samexporter" in impls:
        t0 = time.perf_counter()
        samexporter_export(pt, tmp / "samexporter")
        print(f"  samexporter's export: {time.perf_counter() - t0:.0f} s", flush=True)
        paths["samexporter"] = tmp / "samexporter"
    if "paddle" in impls:
        paths["paddle"] = pdparams
    if "static" in impls:
        from paddle_sam.export.sam3 import export_sam3
        from paddle_sam.loading.sam3 import load_sam3

        export_sam3(load_sam3(pdparams), tmp / "export")
        paths["static"] = tmp / "export"
    if any(i in OPENVINO for i in impls):
        from paddle_sam.export.sam3 import export_sam3_onnx
        from paddle_sam.loading.sam3 import load_sam3

        t0 = time.perf_counter()
        int8 = "int8" if "openvino-int8" in impls else None
        model = load_sam3(pdparams)
        export_sam3_onnx(model, tmp / "onnx", quantize=int8)
        print(f"  ONNX export for OpenVINO: {time.perf_counter() - t0:.0f} s", flush=True)
        for impl in OPENVINO:
            paths[impl] = tmp / "onnx"
        if "openvino-int8-static" in impls:
            # fp32 here; calibrated by the parent's `--worker quantize` (quantize_static)
            export_sam3_onnx(model, tmp / "onnx_static")
            paths["openvino-int8-static"] = tmp / "onnx_static"
    return paths


def quantize_static(folder: Path) -> dict:
    """``--worker quantize``: the calibrated int8 files of an fp32 ONNX export ``folder``, from
    the folder alone in a fresh process, as ``paddle-sam export`` does once the model is freed
    (calibrating the full-size backbone peaks at 21-23 GB; the prepare worker, which holds the
    model, torch and samexporter's export, was killed for memory doing it on a 23.5 GB
    machine)."""
    from paddle_sam.export.sam3 import quantize_sam3_export

    images = [calibration_image(i) for i in range(CALIBRATION_IMAGES)]
    quantize_sam3_export(folder, images, overwrite=True)
    return {"folder": str(folder)}


def calibration_image(i: int) -> np.ndarray:
    """The benchmark scene rolled, mirrored and noised: images like the timed one, not it."""
    rng = np.random.default_rng(100 + i)
    image = np.roll(v1.make_image(IMAGE_HW), int(rng.integers(50, 400)), axis=1)[:, ::-1]
    noisy = image.astype(np.float64) + rng.normal(0, 12, image.shape)
    return np.ascontiguousarray(np.clip(noisy, 0, 255).astype(np.uint8))


# --------------------------------------------------------------------------------- parent


def run_child(argv: list[str], label: str) -> dict:
    return v1.run_child(argv, label, script=__file__)


def collect(args, weights: dict[str, Path]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {impl: [] for impl in args.impl}
    for r in range(1, args.rounds + 1):
        for impl in args.impl:
            argv = ["--worker", impl, "--checkpoint", str(weights[impl])]
            argv += ["--repeats", str(args.repeats), "--prompts", str(args.prompts)]
            if args.threads:
                argv += ["--threads", str(args.threads)]
            load_before = os.getloadavg()[0]
            result = run_child(argv, f"round {r}/{args.rounds} {impl}")
            runs[impl].append({**result, "load_avg_1min_before": load_before})
    return runs


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    return {
        m.key: {
            impl: statistics.median(r[m.key] for r in rs) * m.scale
            for impl, rs in runs.items()
            if rs and all(r.get(m.key) is not None for r in rs)
        }
        for m in METRICS
    }


def ratio(values: dict[str, float], impl: str = "paddle") -> float | None:
    if impl in values and values.get("torch", 0) > 0:
        return values[impl] / values["torch"]
    return None


RATIOS = IMPLS[:-1]  # each over torch


def table_rows(summary: dict[str, dict[str, float]]) -> list[list[str]]:
    rows = []
    for m in METRICS:
        vals = summary[m.key]
        rs = [ratio(vals, impl) for impl in RATIOS]
        rows.append(
            [m.label]
            + [f"{vals[i]:.{m.digits}f}" if i in vals else "-" for i in IMPLS]
            + ["-" if r is None else f"{r:.2f}" for r in rs]
        )
    return rows


TABLE_HEADER = [
    "metric",
    "paddle_sam",
    "paddle_sam static",
    "OpenVINO fp32",
    "OpenVINO bf16",
    "OpenVINO int8 weights",
    "OpenVINO int8 static",
    "samexporter (ORT)",
    "torch (official sam3)",
    "paddle/torch",
    "static/torch",
    "ov fp32/torch",
    "ov bf16/torch",
    "ov int8/torch",
    "ov int8 static/torch",
    "samexporter/torch",
]
assert len(TABLE_HEADER) == 1 + len(IMPLS) + len(RATIOS)


def format_table(rows: list[list[str]], markdown: bool) -> str:
    return v1.format_table(rows, markdown, header=TABLE_HEADER)


def machine_info(args, runs: dict[str, list[dict]], started: dt.datetime) -> list[tuple[str, str]]:
    threads = ", ".join(f"{impl} {rs[0].get('threads')}" for impl, rs in runs.items() if rs) + (
        " (--threads)" if args.threads else " (each framework's default)"
    )
    return [
        ("date", started.isoformat(timespec="seconds")),
        ("cpu", v1._cpu_model()),
        ("cores (affinity)", str(len(os.sched_getaffinity(0)))),
        ("ram", v1._ram_gib()),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("python", platform.python_version()),
        ("paddlepaddle", v1._version("paddlepaddle")),
        ("paddle-sam", v1._version("paddle-sam")),
        ("torch", v1._version("torch")),
        ("sam3", v1._version("sam3")),
        ("threads", threads),
        (
            "settings",
            f"SAM 3 image model, full size, random weights; image {IMAGE_HW[0]}x{IMAGE_HW[1]}, "
            f"repeats {args.repeats}, prompts {args.prompts}, rounds {args.rounds} "
            "(median of rounds)",
        ),
    ]


def notes(runs: dict[str, list[dict]]) -> list[str]:
    out = []
    for impl in RATIOS:
        if not (runs.get("torch") and runs.get(impl)):
            continue
        p, t = runs[impl][0], runs["torch"][0]
        if "check_scores" not in p:
            continue
        out.append(
            f"output check {impl} vs torch (same weights, text prompt, all queries): scores "
            f"mean/std/max {'/'.join(f'{v:.5f}' for v in p['check_scores'])} vs "
            f"{'/'.join(f'{v:.5f}' for v in t['check_scores'])}; mean box "
            f"{p['check_boxes_mean']:.2f} vs {t['check_boxes_mean']:.2f} px; instances kept at "
            f"0.5: text {p['text_s_kept']} vs {t['text_s_kept']}, box {p['box_s_kept']} vs "
            f"{t['box_s_kept']}"
        )
    for impl, rs in runs.items():
        for i, r in enumerate(rs, 1):
            if r.get("text_s") is None:
                out.append(
                    f"{impl} round {i}: load {r['load_s']:.1f} s, set_image "
                    f"{' / '.join(f'{v:.1f}' for v in r['set_image_all_s'])} s, text encoder "
                    f"{r['text_encoder_s']:.3f} s, peak RSS {r['peak_rss_mb']:.0f} MB; "
                    f"{r['missing']}"
                )
                continue
            out.append(
                f"{impl} round {i}: load {r['load_s']:.1f} s, set_image "
                f"{' / '.join(f'{v:.1f}' for v in r['set_image_all_s'])} s, text "
                f"{' / '.join(f'{v:.2f}' for v in r['text_s_all'])} s, text (all) "
                f"{' / '.join(f'{v:.2f}' for v in r['text_all_s_all'])} s, box "
                f"{' / '.join(f'{v:.2f}' for v in r['box_s_all'])} s, peak RSS "
                f"{r['peak_rss_mb']:.0f} MB (1-min load average before: "
                f"{r['load_avg_1min_before']:.2f})"
            )
    return out


def write_outputs(out_dir: Path, stem: str, summary, info, rows, lines) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.md"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "label", *IMPLS, *(f"ratio_{i}_over_torch" for i in RATIOS)])
        for m in METRICS:
            vals = summary[m.key]
            w.writerow(
                [m.key, m.label]
                + [v1._csv_num(vals.get(i)) for i in IMPLS]
                + [v1._csv_num(ratio(vals, i)) for i in RATIOS]
            )
    md = [f"# SAM 3 CPU benchmark: {stem}", ""]
    md += [f"- **{k}**: {v}" for k, v in info]
    md += ["", format_table(rows, markdown=True), "", "Ratio < 1: paddle_sam is faster / smaller."]
    md += ["", *[f"- {n}" for n in lines]]
    md_path.write_text("\n".join(md) + "\n")
    return csv_path, md_path


def parent_main(args) -> None:
    started = dt.datetime.now().astimezone()
    with tempfile.TemporaryDirectory(prefix="bench_sam3_") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        prepare = ["--impl", ",".join(args.impl)]
        weights = {k: Path(v) for k, v in v1.prepared_weights(work, prepare, __file__).items()}
        static = weights.get("openvino-int8-static")
        if static is not None and not (static / "vision_backbone.int8.xml").is_file():
            run_child(["--worker", "quantize", "--checkpoint", str(static)], "calibrated int8")
        runs = collect(args, weights)
    stem = f"sam3_{started.strftime('%Y%m%d-%H%M%S')}"
    raw = Path(args.out) / f"{stem}_runs.json"  # first: a failure below loses no measurement
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(runs, indent=1) + "\n")
    summary = summarise(runs)
    info = machine_info(args, runs, started)
    rows = table_rows(summary)
    lines = notes(runs)
    print()
    print("\n".join(f"{k:>22}: {v}" for k, v in info))
    print()
    print(format_table(rows, markdown=False))
    print("\nratio < 1: paddle_sam is faster / smaller")
    print("\n".join(lines))
    csv_path, md_path = write_outputs(Path(args.out), stem, summary, info, rows, lines)
    print(f"\nwrote {csv_path}\nwrote {md_path}")


def parse_impls(text: str) -> tuple[str, ...]:
    impls = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not impls or any(i not in IMPLS for i in impls):
        raise argparse.ArgumentTypeError(
            f"--impl takes a comma list of {','.join(IMPLS)}: {text!r}"
        )
    return impls


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=v1.positive, default=2, help="timed set_image calls")
    p.add_argument("--prompts", type=v1.positive, default=3, help="timed calls per prompt kind")
    p.add_argument("--rounds", type=v1.positive, default=2, help="interleaved runs per impl")
    p.add_argument("--threads", type=v1.positive, default=None, help="CPU threads for each")
    p.add_argument("--impl", type=parse_impls, default=IMPLS, help=f"comma list: {','.join(IMPLS)}")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument(
        "--workdir",
        default=None,
        help="keep the prepared weights here (weights.json lists them) and reuse them later",
    )
    p.add_argument("--worker", choices=(*IMPLS, "prepare", "quantize"), help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker == "prepare":
        paths = write_weights(args.impl, Path(args.checkpoint))
        print(v1.RESULT_PREFIX + json.dumps({k: str(v) for k, v in paths.items()}), flush=True)
    elif args.worker == "quantize":
        print(v1.RESULT_PREFIX + json.dumps(quantize_static(Path(args.checkpoint))), flush=True)
    elif args.worker:
        worker_main(args)
    else:
        parent_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
