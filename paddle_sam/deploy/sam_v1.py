"""``StaticSamPredictor``: ``SamPredictor``'s API over the exported PIR programs.

Runs the two programs of ``paddle-sam export`` with Paddle Inference. Image resizing and
normalisation are the dynamic predictor's own code (``ResizeLongestSide``,
``preprocess_image``); prompts are checked by the same ``PredictorBase``.

Devices: the CPU path is tested. The GPU and TensorRT FP16 paths are written against the
Paddle 3 inference API but have NOT been run: no Paddle 3 GPU build could be installed here.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import paddle
from paddle import inference

from .._runtime import bf16_refusal, cpu_count
from ..export.sam_v1 import (
    EXPORT_FORMAT,
    FEW_TOKENS_PROGRAM,
    FORMAT_VERSION,
    IMAGE_TERMS,
    IMAGE_TERMS_PROGRAM,
    MANIFEST,
    PROGRAMS,
)
from ..models.sam_v1.sam import postprocess_masks, preprocess_image
from ..predict.sam_v1.predictor import PredictorBase
from ..predict.sam_v1.transforms import ResizeLongestSide


class ExportFormatError(ValueError):
    """An export folder is missing files or holds something else."""


def read_manifest(
    export_dir: str | os.PathLike,
    fmt: str = EXPORT_FORMAT,
    *,
    version: int = FORMAT_VERSION,
    programs: tuple[str, ...] = PROGRAMS,
) -> dict:
    """``export.json`` of an export folder in format ``fmt`` and ``version``, every file it
    lists for ``programs`` checked."""
    d = Path(export_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"export folder not found: {d}")
    path = d / MANIFEST
    if not path.is_file():
        raise ExportFormatError(f"{d} has no {MANIFEST}; is it a 'paddle-sam export' folder?")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ExportFormatError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise ExportFormatError(f"{path}: format {got!r}, expected {fmt!r}")
    if manifest.get("format_version") != version:
        raise ExportFormatError(
            f"{path}: export format version {manifest.get('format_version')!r}, this "
            f"paddle-sam reads version {version}; export the model again"
        )
    listed = manifest.get("programs") or {}
    for prog in [*programs, *(p for p in listed if p not in programs)]:
        for name in listed.get(prog) or [f"{prog} (not listed)"]:
            f = d / name
            if not f.is_file() or f.stat().st_size == 0:
                raise ExportFormatError(f"{d}: {f.name} is missing or empty")
    return manifest


def inference_options(
    programs: tuple[str, ...],
    onednn_programs: tuple[str, ...],
    *,
    device: str,
    threads: int | None,
    backend: str,
    ir_optim: bool,
    memory_optim: bool,
    gpu_memory_mb: int,
    device_id: int,
    verbose: bool,
    **extra,
) -> dict:
    """Checked options for :func:`create_predictor`; oneDNN for ``onednn_programs`` on the
    CPU only."""
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    if backend not in ("paddle", "tensorrt"):
        raise ValueError(f"backend must be 'paddle' or 'tensorrt', got {backend!r}")
    if backend == "tensorrt" and device != "gpu":
        raise ValueError("backend='tensorrt' needs device='gpu'")
    return dict(
        device=device,
        threads=threads,
        backend=backend,
        ir_optim=ir_optim,
        memory_optim=memory_optim,
        onednn={p: device == "cpu" and p in onednn_programs for p in programs},
        gpu_memory_mb=gpu_memory_mb,
        device_id=device_id,
        verbose=verbose,
        **extra,
    )


def create_predictor(export_dir: Path, prog: str, opts: dict, trt_shapes=None):
    """A Paddle Inference predictor for ``export_dir / prog``, configured from ``opts``
    (device, threads, backend, ir_optim, memory_optim, onednn: {program: bool},
    gpu_memory_mb, device_id, verbose). ``trt_shapes(config)`` sets TensorRT's dynamic shapes.
    A refused oneDNN or memory optimisation falls back with a warning and is recorded in
    ``opts``, so the next program does not retry it."""
    cfg = inference.Config(str(export_dir / f"{prog}.json"), str(export_dir / f"{prog}.pdiparams"))
    cfg.switch_ir_optim(opts["ir_optim"])
    if not opts["verbose"]:
        cfg.disable_glog_info()
    if opts["device"] == "cpu":
        cfg.disable_gpu()
        cfg.set_cpu_math_library_num_threads(int(opts["threads"] or cpu_count()))
        if opts["onednn"][prog]:
            cfg.enable_mkldnn()
            for name in ONEDNN_SKIPPED_PASSES.get(prog, ()):
                cfg.delete_pass(name)
            if opts.get("precision") == "bf16":
                cfg.enable_mkldnn_bfloat16()
        else:
            cfg.disable_mkldnn()
    else:  # unverified on hardware, see the module docstring
        cfg.enable_use_gpu(opts["gpu_memory_mb"], opts["device_id"])
        if opts["backend"] == "tensorrt":
            cfg.enable_tensorrt_engine(
                workspace_size=1 << 30,
                max_batch_size=1,
                min_subgraph_size=3,
                precision_mode=inference.PrecisionType.Half,
                use_static=False,
                use_calib_mode=False,
            )
            if trt_shapes is not None:
                trt_shapes(cfg)
    if opts["memory_optim"]:
        cfg.enable_memory_optim()
    try:
        return inference.create_predictor(cfg)
    except Exception as exc:  # paddle raises ValueError/RuntimeError for config problems
        if opts["device"] == "cpu" and opts["onednn"][prog]:
            warnings.warn(
                f"oneDNN failed on {prog} ({str(exc).splitlines()[0][:200]}); "
                "running it without oneDNN",
                stacklevel=4,
            )
            opts["onednn"][prog] = False
            return create_predictor(export_dir, prog, opts, trt_shapes)
        if opts["memory_optim"]:
            warnings.warn(
                f"memory optimisation unavailable ({exc}); running without it", stacklevel=4
            )
            opts["memory_optim"] = False
            return create_predictor(export_dir, prog, opts, trt_shapes)
        raise ExportFormatError(f"cannot load {export_dir / prog}.json: {exc}") from exc


def run_predictor(predictor, inputs: dict) -> list[np.ndarray]:
    """Feed ``inputs`` by name, run, return the outputs in the program's order. Arrays are
    copied in; a ``paddle.Tensor`` (on the predictor's device) is read in place, so the caller
    must keep it alive and unchanged until the run returns."""
    for name in predictor.get_input_names():
        h = predictor.get_input_handle(name)
        value = inputs[name]
        if isinstance(value, paddle.Tensor):
            h.share_external_data(value)
            continue
        arr = np.ascontiguousarray(value)
        h.reshape(list(arr.shape))
        h.copy_from_cpu(arr)
    predictor.run()
    return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]


# oneDNN runs the prompt decoder only. Measured on Paddle Inference 3.3.1: oneDNN + PIR fails
# on bilinear interpolate (docs/design.md section 3), which is why the decoder program has
# none; on the image encoder its fusion passes fail to build the program, and with the failing
# pass removed it crashed, so the encoder always runs on Paddle's own CPU kernels.
ONEDNN_PROGRAMS = ("prompt_decoder", IMAGE_TERMS_PROGRAM, FEW_TOKENS_PROGRAM)
# Paddle Inference 3.3.1's oneDNN fusion of a reshape into the op before it mis-types the
# windowed attention's relative-position terms (B x 196 x 14 against B x 14 x 14 x 14) and
# refuses the image encoder; without that one pass the encoder runs under oneDNN and matches
# the plain program (tests/export/test_export.py)
ONEDNN_SKIPPED_PASSES = {"image_encoder": ("operator_reshape_onednn_fuse_pass",)}
PRECISIONS = ("fp32", "bf16")


class ExportedSamPredictor(PredictorBase):
    """What the runtimes of exported programs share: the manifest, the dynamic predictor's
    own resizing and normalisation, prompt packing (boxes as points labelled 2 and 3)."""

    def __init__(self, export_dir: str | os.PathLike, manifest: dict) -> None:
        self.export_dir = Path(export_dir)
        self.manifest = manifest
        size = int(manifest["image_size"])
        grid = size // int(manifest["spec"]["vit_patch_size"])
        self.image_size = size
        self.transform = ResizeLongestSide(size)
        self.mask_input_size = (4 * grid, 4 * grid)
        self.mask_threshold = float(manifest["mask_threshold"])
        self._mean = paddle.to_tensor(manifest["pixel_mean"], dtype="float32").reshape([3, 1, 1])
        self._std = paddle.to_tensor(manifest["pixel_std"], dtype="float32").reshape([3, 1, 1])
        self.reset_image()

    def _run_encoder(self, image: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _run_decoder(
        self, feeds: dict[str, np.ndarray], multimask_output: bool
    ) -> tuple[paddle.Tensor, np.ndarray, np.ndarray]:
        """-> mask logits at the original size (C x H x W), IoU (C), low-res logits (C x h x w)."""
        raise NotImplementedError

    def _embed(self, input_image: np.ndarray, original_size: tuple[int, int]) -> None:
        self.reset_image()
        x = paddle.to_tensor(input_image).transpose([2, 0, 1]).unsqueeze(0)
        x = preprocess_image(x, self._mean, self._std, self.image_size)
        self.features = self._run_encoder(x.numpy())
        self.original_size = tuple(int(v) for v in original_size)
        self.input_size = tuple(int(v) for v in input_image.shape[:2])
        self.is_image_set = True

    def _feeds(self, coords, labels, box, mask_input) -> dict[str, np.ndarray]:
        """The decoder programs' inputs for one prompt (resized frame)."""
        pts, lbl = [], []
        if coords is not None:
            pts.append(np.asarray(coords, np.float32).reshape(-1, 2))
            lbl.append(np.asarray(labels, np.float32).reshape(-1))
        if box is not None:
            pts.append(np.asarray(box, np.float32).reshape(2, 2))
            lbl.append(np.array([2, 3], np.float32))
        elif coords is not None:  # upstream pads point-only prompts with a "not a point"
            pts.append(np.zeros((1, 2), np.float32))
            lbl.append(np.array([-1], np.float32))
        if not pts:
            raise ValueError(f"{type(self).__name__} needs at least one point or a box")
        has_mask = mask_input is not None
        if not has_mask:
            mask_input = np.zeros((1, *self.mask_input_size), np.float32)
        return {
            "image_embeddings": self.features,
            "point_coords": np.concatenate(pts)[None],
            "point_labels": np.concatenate(lbl)[None],
            "mask_input": np.asarray(mask_input, np.float32)[None],
            "has_mask_input": np.array([1.0 if has_mask else 0.0], np.float32),
        }

    def _decode(self, coords, labels, box, mask_input, multimask_output, return_logits):
        feeds = self._feeds(coords, labels, box, mask_input)
        masks, iou, low_res = self._run_decoder(feeds, multimask_output)
        if not return_logits:
            masks = masks > self.mask_threshold
        return np.asarray(masks), iou, low_res

    def get_image_embedding(self) -> np.ndarray:
        """The current image's embedding as numpy: 1 x C x H x W."""
        self._require_image()
        return self.features


class StaticSamPredictor(ExportedSamPredictor):
    """``SamPredictor``'s API over a ``paddle-sam export`` folder, on Paddle Inference.

    Per image it holds ``features`` (the embedding) and ``image_terms`` (the decoder's
    per-image terms, ``IMAGE_TERMS_PROGRAM``'s outputs by name, or None without that program;
    never changed in place, so a session's state can be shared);
    ``session_state_keys`` names the attributes that make up an image's state, for a service
    that swaps images between calls."""

    session_state_keys = ("features", "original_size", "input_size", "image_terms")

    def __init__(
        self,
        export_dir: str | os.PathLike,
        device: str = "cpu",
        threads: int | None = None,
        backend: str = "paddle",
        *,
        ir_optim: bool = True,
        memory_optim: bool = False,
        onednn: bool = True,
        gpu_memory_mb: int = 1024,
        device_id: int = 0,
        max_points: int = 64,
        verbose: bool = False,
        precision: str = "fp32",
        onednn_encoder: bool = False,
    ) -> None:
        """Load an export folder.

        device: "cpu" or "gpu"; backend: "paddle" or "tensorrt" (GPU only, FP16, dynamic
        point count 1..max_points); onednn: run the prompt decoder with oneDNN on the CPU
        (the image encoder never uses it, see ``ONEDNN_PROGRAMS``); if Paddle refuses, it
        falls back to its own kernels with a warning. verbose: keep Paddle Inference's own
        log (every optimisation pass it runs); quiet by default.

        precision: "fp32" (default) or "bf16": every program on oneDNN with its bf16 kernels
        (``Config.enable_mkldnn_bfloat16``), on CPUs with ``avx512_bf16`` or AMX only,
        detected at run time (a ValueError saying so elsewhere). onednn_encoder: run the
        image encoder on oneDNN in fp32 too (off by default: no faster on an AVX2 CPU here).
        """
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if precision == "bf16":
            if device != "cpu":
                raise ValueError(
                    "precision='bf16' is the CPU's oneDNN path; on a GPU use "
                    "backend='tensorrt' (FP16)"
                )
            refusal = bf16_refusal()
            if refusal is not None:
                raise ValueError(refusal)
        onednn_programs = ONEDNN_PROGRAMS if onednn else ()
        if precision == "bf16":
            onednn_programs = (*PROGRAMS, *ONEDNN_PROGRAMS)  # every program
        elif onednn_encoder:
            onednn_programs = (*onednn_programs, "image_encoder")
        opts = inference_options(
            (*PROGRAMS, IMAGE_TERMS_PROGRAM, FEW_TOKENS_PROGRAM),
            onednn_programs,
            precision=precision,
            device=device,
            threads=threads,
            backend=backend,
            ir_optim=ir_optim,
            memory_optim=memory_optim,
            gpu_memory_mb=gpu_memory_mb,
            device_id=device_id,
            verbose=verbose,
            max_points=max_points,
        )
        self.options = opts
        super().__init__(export_dir, read_manifest(export_dir))
        self._encoder = self._create("image_encoder", opts)
        self._decoder = self._create("prompt_decoder", opts)
        # prompts of at most few_tokens_max tokens and no mask input run the few-token decoder
        # on the image terms computed once per image, if exported
        self._few_tokens_max = int(self.manifest.get("few_tokens_max") or 0)
        few = all(p in self.manifest["programs"] for p in (IMAGE_TERMS_PROGRAM, FEW_TOKENS_PROGRAM))
        if few and not isinstance(self.manifest.get("image_terms"), dict):
            raise ExportFormatError(
                f"{self.export_dir / MANIFEST} lists {FEW_TOKENS_PROGRAM} but not the shapes of "
                "its image terms ('image_terms'); export the model again"
            )
        self._image_terms_program = self._create(IMAGE_TERMS_PROGRAM, opts) if few else None
        self._decoder_few = self._create(FEW_TOKENS_PROGRAM, opts) if few else None
        self.image_terms: dict | None = None  # name -> tensor (CPU) or array

    def _create(self, prog: str, opts: dict):
        """A Paddle Inference predictor for one program, configured from ``opts``."""

        def trt_shapes(cfg) -> None:
            if prog not in ("image_encoder", IMAGE_TERMS_PROGRAM):  # fixed shapes
                self._set_trt_shapes(cfg, prog, opts["max_points"])

        return create_predictor(self.export_dir, prog, opts, trt_shapes)

    def _set_trt_shapes(self, cfg, prog: str, max_points: int) -> None:
        grid = self.mask_input_size[0] // 4
        c = int(self.manifest["spec"]["prompt_embed_dim"])
        if prog == FEW_TOKENS_PROGRAM:  # image terms, no mask input; few_tokens_max tokens
            fixed = dict(self.manifest["image_terms"])
            max_points = min(max_points, self._few_tokens_max)
        else:
            fixed = {
                "image_embeddings": [1, c, grid, grid],
                "mask_input": [1, 1, 4 * grid, 4 * grid],
                "has_mask_input": [1],
            }
        lo = {**fixed, "point_coords": [1, 1, 2], "point_labels": [1, 1]}
        hi = {**fixed, "point_coords": [1, max_points, 2], "point_labels": [1, max_points]}
        opt = {**fixed, "point_coords": [1, 2, 2], "point_labels": [1, 2]}
        cfg.set_trt_dynamic_shape_info(lo, hi, opt)

    def _run_encoder(self, image: np.ndarray) -> np.ndarray:
        features = run_predictor(self._encoder, {"image": image})[0]
        if self._image_terms_program is not None:
            self.image_terms = self._compute_image_terms(features)
        return features

    def _compute_image_terms(self, features: np.ndarray) -> dict:
        """``IMAGE_TERMS_PROGRAM``'s outputs for this image, by name, shapes checked. On the
        CPU as tensors the few-token program reads in place (10 MB for ViT-B, copied into it
        for every prompt otherwise); elsewhere as arrays."""
        out = run_predictor(self._image_terms_program, {"image_embeddings": features})
        expected = self.manifest["image_terms"]
        terms = dict(zip(IMAGE_TERMS, out, strict=True))
        for name, value in terms.items():
            if list(value.shape) != list(expected[name]):
                raise ExportFormatError(
                    f"{self.export_dir}: {IMAGE_TERMS_PROGRAM} returned {name} of shape "
                    f"{list(value.shape)}, the manifest says {expected[name]}"
                )
        if self.options["device"] == "cpu":
            terms = {k: paddle.to_tensor(v, place=paddle.CPUPlace()) for k, v in terms.items()}
        return terms

    def reset_image(self) -> None:
        super().reset_image()
        self.image_terms = None

    def release_memory(self) -> None:
        """Drop every program's intermediate tensors and shrink Paddle Inference's memory pool
        (on a GPU, its cached blocks); the next call allocates afresh. For long-running
        services between bursts of work; the embedding of the current image is kept."""
        programs = (self._encoder, self._decoder, self._image_terms_program, self._decoder_few)
        for predictor in programs:
            if predictor is None:
                continue
            predictor.clear_intermediate_tensor()
            predictor.try_shrink_memory()

    def _run_low_res(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """IoU predictions 1 x M and low-res logits 1 x M x h x w of all M mask tokens."""
        tokens = 1 + int(self.manifest["num_mask_tokens"]) + feeds["point_labels"].shape[1]
        few = (
            self.image_terms is not None
            and tokens <= self._few_tokens_max
            and not feeds["has_mask_input"][0]
        )
        if few:
            feeds = {**self.image_terms, **feeds}
        iou, low_res = run_predictor(self._decoder_few if few else self._decoder, feeds)
        return iou, low_res

    def _run_decoder(self, feeds, multimask_output):
        iou, low_res = self._run_low_res(feeds)
        sl = slice(1, None) if multimask_output else slice(0, 1)
        iou, low_res = iou[0, sl], low_res[:, sl]
        # the dynamic model's own upscaling, on the masks kept only
        masks = postprocess_masks(low_res, self.input_size, self.original_size, self.image_size)
        return masks[0], iou, low_res[0]

    def predict_point_grid(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``SamPredictor.predict_point_grid``: one positive point per prompt (N x 2, resized
        frame) -> IoU N x 3 and low-res logits N x 3 x h x w of the multimask outputs, not
        upscaled; one program run per point (the few-token program when exported)."""
        self._require_image()
        pts = np.asarray(points, np.float32).reshape(-1, 2)
        ious, lows = [], []
        for point in pts:
            iou, low_res = self._run_low_res(
                self._feeds(point[None], np.ones(1, np.float32), None, None)
            )
            ious.append(iou[0, 1:])
            lows.append(low_res[0, 1:])
        h, w = self.mask_input_size
        if not ious:
            return np.zeros((0, 3), np.float32), np.zeros((0, 3, h, w), np.float32)
        return np.stack(ious), np.stack(lows)
