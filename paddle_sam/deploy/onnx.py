"""``OnnxSamPredictor``: ``SamPredictor``'s API over a ``paddle-sam export --format onnx``
folder, on onnxruntime (the optional ``onnx`` extra). Mostly a check of the ONNX files and a
reference for other ONNX runtimes (onnxruntime-web in a browser runs the same decoder).
"""

from __future__ import annotations

import os

import numpy as np

from .._runtime import cpu_count
from ..export.onnx import ONNX_FORMAT, ONNX_FORMAT_VERSION
from ..export.sam_v1 import PROGRAMS
from .sam_v1 import ExportedSamPredictor, ExportFormatError, read_manifest


class OnnxSamPredictor(ExportedSamPredictor):
    def __init__(
        self,
        export_dir: str | os.PathLike,
        threads: int | None = None,
        providers: list[str] | None = None,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ImportError(
                "OnnxSamPredictor needs onnxruntime: pip install 'paddle-sam[onnx]'"
            ) from exc
        super().__init__(
            export_dir, read_manifest(export_dir, ONNX_FORMAT, version=ONNX_FORMAT_VERSION)
        )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads or cpu_count())
        opts.log_severity_level = 3  # errors only: unused-initializer notices are noise
        self._sessions = {}
        for prog in PROGRAMS:
            path = self.export_dir / f"{prog}.onnx"
            try:
                self._sessions[prog] = ort.InferenceSession(
                    str(path), opts, providers=providers or ["CPUExecutionProvider"]
                )
            except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
                raise ExportFormatError(f"cannot load {path}: {exc}") from exc

    def _run_encoder(self, image: np.ndarray) -> np.ndarray:
        return self._sessions["image_encoder"].run(None, {"image": image})[0]

    def _run_decoder(self, feeds, multimask_output):
        feeds = {**feeds, "orig_im_size": np.array(self.original_size, np.int64)}
        masks, iou, low_res = self._sessions["prompt_decoder"].run(None, feeds)
        sl = slice(1, None) if multimask_output else slice(0, 1)
        return masks[0, sl], iou[0, sl], low_res[0, sl]
