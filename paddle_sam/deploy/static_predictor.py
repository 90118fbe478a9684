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

from .._runtime import cpu_count
from ..export.sam_v1 import EXPORT_FORMAT, MANIFEST, PROGRAMS
from ..models.sam import preprocess_image
from ..predict.predictor import PredictorBase
from ..predict.transforms import ResizeLongestSide


class ExportFormatError(ValueError):
    """An export folder is missing files or holds something else."""


def read_manifest(export_dir: str | os.PathLike) -> dict:
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
    if manifest.get("format") != EXPORT_FORMAT:
        raise ExportFormatError(
            f"{path}: format {manifest.get('format')!r}, expected {EXPORT_FORMAT!r}"
        )
    for prog in PROGRAMS:
        for ext in ("json", "pdiparams"):
            f = d / f"{prog}.{ext}"
            if not f.is_file() or f.stat().st_size == 0:
                raise ExportFormatError(f"{d}: {f.name} is missing or empty")
    return manifest


def _onednn_supported() -> bool:
    """Paddle Inference 3.3.x + oneDNN + PIR fails on bilinear interpolate (DESIGN.md s4)."""
    major_minor = tuple(int(v) for v in paddle.__version__.split(".")[:2] if v.isdigit())
    return major_minor != (3, 3)


class StaticSamPredictor(PredictorBase):
    def __init__(
        self,
        export_dir: str | os.PathLike,
        device: str = "cpu",
        threads: int | None = None,
        backend: str = "paddle",
        *,
        ir_optim: bool = True,
        memory_optim: bool = False,
        onednn: bool | None = None,
        gpu_memory_mb: int = 1024,
        device_id: int = 0,
        max_points: int = 64,
    ) -> None:
        """Load an export folder.

        device: "cpu" or "gpu"; backend: "paddle" or "tensorrt" (GPU only, FP16, dynamic
        point count 1..max_points); onednn: None = on where it works (not Paddle 3.3.x).
        """
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        if backend not in ("paddle", "tensorrt"):
            raise ValueError(f"backend must be 'paddle' or 'tensorrt', got {backend!r}")
        if backend == "tensorrt" and device != "gpu":
            raise ValueError("backend='tensorrt' needs device='gpu'")
        self.export_dir = Path(export_dir)
        self.manifest = read_manifest(self.export_dir)
        size = int(self.manifest["image_size"])
        grid = size // int(self.manifest["spec"]["vit_patch_size"])
        self.transform = ResizeLongestSide(size)
        self.mask_input_size = (4 * grid, 4 * grid)
        self.mask_threshold = float(self.manifest["mask_threshold"])
        self._mean = paddle.to_tensor(self.manifest["pixel_mean"], dtype="float32").reshape(
            [3, 1, 1]
        )
        self._std = paddle.to_tensor(self.manifest["pixel_std"], dtype="float32").reshape([3, 1, 1])
        if onednn is None:
            onednn = device == "cpu" and _onednn_supported()
        elif onednn and not _onednn_supported():
            warnings.warn(
                f"oneDNN disabled: Paddle Inference {paddle.__version__} with oneDNN fails on "
                "this model's bilinear resize (PIR attribute conversion); running without it",
                stacklevel=2,
            )
            onednn = False
        opts = dict(
            device=device,
            threads=threads,
            backend=backend,
            ir_optim=ir_optim,
            memory_optim=memory_optim,
            onednn=onednn,
            gpu_memory_mb=gpu_memory_mb,
            device_id=device_id,
            max_points=max_points,
        )
        self.options = opts
        self._encoder = self._create("image_encoder", opts)
        self._decoder = self._create("prompt_decoder", opts)
        self.reset_image()

    def _create(self, prog: str, opts: dict):
        """A Paddle Inference predictor for one program, configured from ``opts``."""
        cfg = inference.Config(
            str(self.export_dir / f"{prog}.json"), str(self.export_dir / f"{prog}.pdiparams")
        )
        cfg.switch_ir_optim(opts["ir_optim"])
        if opts["device"] == "cpu":
            cfg.disable_gpu()
            cfg.set_cpu_math_library_num_threads(int(opts["threads"] or cpu_count()))
            if opts["onednn"]:
                cfg.enable_mkldnn()
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
                if prog == "prompt_decoder":
                    self._set_trt_shapes(cfg, opts["max_points"])
        if opts["memory_optim"]:
            cfg.enable_memory_optim()
        try:
            return inference.create_predictor(cfg)
        except Exception as exc:  # paddle raises ValueError/RuntimeError for config problems
            if opts["memory_optim"]:
                warnings.warn(
                    f"memory optimisation unavailable ({exc}); running without it", stacklevel=3
                )
                opts["memory_optim"] = False  # recorded, so the next program does not retry
                return self._create(prog, opts)
            raise ExportFormatError(f"cannot load {self.export_dir / prog}.json: {exc}") from exc

    def _set_trt_shapes(self, cfg, max_points: int) -> None:
        grid = self.mask_input_size[0] // 4
        c = int(self.manifest["spec"]["prompt_embed_dim"])
        fixed = {
            "image_embeddings": [1, c, grid, grid],
            "mask_input": [1, 1, 4 * grid, 4 * grid],
            "has_mask_input": [1],
            "orig_im_size": [2],
        }
        lo = {**fixed, "point_coords": [1, 1, 2], "point_labels": [1, 1]}
        hi = {**fixed, "point_coords": [1, max_points, 2], "point_labels": [1, max_points]}
        opt = {**fixed, "point_coords": [1, 2, 2], "point_labels": [1, 2]}
        cfg.set_trt_dynamic_shape_info(lo, hi, opt)

    @staticmethod
    def _run(predictor, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        for name in predictor.get_input_names():
            h = predictor.get_input_handle(name)
            arr = np.ascontiguousarray(inputs[name])
            h.reshape(list(arr.shape))
            h.copy_from_cpu(arr)
        predictor.run()
        return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]

    def _embed(self, input_image: np.ndarray, original_size: tuple[int, int]) -> None:
        self.reset_image()
        x = paddle.to_tensor(input_image).transpose([2, 0, 1]).unsqueeze(0)
        x = preprocess_image(x, self._mean, self._std, self.transform.target_length)
        (self.features,) = self._run(self._encoder, {"image": x.numpy()})
        self.original_size = tuple(int(v) for v in original_size)
        self.input_size = tuple(int(v) for v in input_image.shape[:2])
        self.is_image_set = True

    def _decode(self, coords, labels, box, mask_input, multimask_output, return_logits):
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
            raise ValueError("StaticSamPredictor needs at least one point or a box")
        has_mask = mask_input is not None
        if not has_mask:
            mask_input = np.zeros((1, *self.mask_input_size), np.float32)
        masks, iou, low_res = self._run(
            self._decoder,
            {
                "image_embeddings": self.features,
                "point_coords": np.concatenate(pts)[None],
                "point_labels": np.concatenate(lbl)[None],
                "mask_input": np.asarray(mask_input, np.float32)[None],
                "has_mask_input": np.array([1.0 if has_mask else 0.0], np.float32),
                "orig_im_size": np.array(self.original_size, np.int64),
            },
        )
        sl = slice(1, None) if multimask_output else slice(0, 1)
        masks, iou, low_res = masks[0, sl], iou[0, sl], low_res[0, sl]
        if not return_logits:
            masks = masks > self.mask_threshold
        return masks, iou, low_res

    def get_image_embedding(self) -> np.ndarray:
        """The current image's embedding as numpy: 1 x C x H x W."""
        self._require_image()
        return self.features
