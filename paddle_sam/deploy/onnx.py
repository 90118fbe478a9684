"""``OnnxSamPredictor``: ``SamPredictor``'s API over a ``paddle-sam export --format onnx``
folder, on onnxruntime (the optional ``onnx`` extra; the encoder optionally on OpenVINO).
Mostly a check of the ONNX files and a reference for other ONNX runtimes: it feeds the decoder
exactly as upstream's onnxruntime recipe does (float32 inputs, the padding point, the original
size as ``orig_im_size``).
"""

from __future__ import annotations

import os

import numpy as np

from .._runtime import cpu_count
from ..export.onnx import DECODER_OUTPUTS, ENCODER_INT8, ONNX_FORMAT, ONNX_FORMAT_VERSION
from ..export.sam_v1 import MANIFEST, PROGRAMS
from .openvino import compile_onnx
from .sam_v1 import ExportedSamPredictor, ExportFormatError, read_manifest


class OnnxSamPredictor(ExportedSamPredictor):
    """``SamPredictor``'s API over an ONNX export folder, on onnxruntime.

    threads: onnxruntime's intra-op threads (default: this machine's CPUs); providers:
    onnxruntime execution providers (default: the CPU); quantized: run the int8 variants
    (``*.quant.onnx``, an export with ``quantize="int8"``). encoder_runtime: ``"openvino"``
    runs the image encoder on OpenVINO (the ``openvino`` extra; faster on the CPUs measured,
    docs/performance.md), in ``precision`` fp32, bf16 (CPUs with avx512_bf16 or AMX;
    approximate) or int8 (the calibrated int8 encoder of an export with ``calibration``
    images, ``--quantize int8 --calibration DIR``; approximate); the decoder stays on
    onnxruntime in fp32.

    The decoder's options come from the manifest. An export with ``return_single_mask``
    answers every prompt with one mask, the one upstream's rule picks (the best multimask
    output for one click or a box alone, the single-mask output for more points), whatever
    ``multimask_output`` says; with ``use_stability_score`` the scores are stability scores.
    """

    def __init__(
        self,
        export_dir: str | os.PathLike,
        threads: int | None = None,
        providers: list[str] | None = None,
        *,
        quantized: bool = False,
        encoder_runtime: str = "onnxruntime",
        precision: str = "fp32",
    ) -> None:
        if encoder_runtime not in ("onnxruntime", "openvino"):
            raise ValueError(
                f"encoder_runtime must be 'onnxruntime' or 'openvino', got {encoder_runtime!r}"
            )
        if precision != "fp32" and encoder_runtime != "openvino":
            raise ValueError(
                f"precision {precision!r} runs the encoder on OpenVINO (encoder_runtime="
                "'openvino'); onnxruntime computes in fp32"
            )
        if encoder_runtime == "openvino" and quantized:
            raise ValueError("quantized runs the int8 files on onnxruntime, not on OpenVINO")
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ImportError(
                "OnnxSamPredictor needs onnxruntime: pip install 'paddle-sam[onnx]'"
            ) from exc
        manifest = read_manifest(export_dir, ONNX_FORMAT, version=ONNX_FORMAT_VERSION)
        super().__init__(export_dir, manifest)
        decoder = manifest.get("decoder")
        if not isinstance(decoder, dict):
            raise ExportFormatError(
                f"{self.export_dir / MANIFEST} has no 'decoder' section; export the model again"
            )
        self.return_single_mask = bool(decoder.get("return_single_mask"))
        self.quantized = bool(quantized)
        files = {p: f"{p}.onnx" for p in PROGRAMS}
        if quantized:
            listed = manifest.get("quantized")
            if not isinstance(listed, dict) or any(p not in listed for p in PROGRAMS):
                raise ExportFormatError(
                    f"{self.export_dir} holds no int8 variant; export it with quantize='int8' "
                    "(--quantize int8)"
                )
            files = {p: str(listed[p]) for p in PROGRAMS}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads or cpu_count())
        opts.log_severity_level = 3  # errors only: unused-initializer notices are noise
        self._sessions = {}
        for prog, name in files.items():
            path = self.export_dir / name
            if not path.is_file():
                raise ExportFormatError(f"{self.export_dir}: {name} is missing")
            try:
                self._sessions[prog] = ort.InferenceSession(
                    str(path), opts, providers=providers or ["CPUExecutionProvider"]
                )
            except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
                raise ExportFormatError(f"cannot load {path}: {exc}") from exc
        self._encoder_input = self._sessions["image_encoder"].get_inputs()[0].name
        self.encoder_runtime, self.precision = encoder_runtime, precision
        self._openvino = None
        if encoder_runtime == "openvino":
            encoder = self.export_dir / files["image_encoder"]
            if precision == "int8":
                int8 = (manifest.get("programs") or {}).get(ENCODER_INT8)
                if not int8:
                    raise ExportFormatError(
                        f"precision int8 on OpenVINO: {self.export_dir} has no calibrated int8 "
                        "encoder; export it with quantize='int8' and calibration images "
                        "(--quantize int8 --calibration DIR)"
                    )
                encoder = self.export_dir / int8[0]
            compiled = compile_onnx(encoder, precision, threads)
            self._openvino = (compiled, compiled.create_infer_request())
            del self._sessions["image_encoder"]  # one copy of the encoder's weights
        names = {o.name for o in self._sessions["prompt_decoder"].get_outputs()}
        missing = [n for n in DECODER_OUTPUTS if n not in names]
        if missing:
            raise ExportFormatError(
                f"{self.export_dir / files['prompt_decoder']} has no output "
                f"{', '.join(missing)} (outputs: {sorted(names)}); export the model again"
            )

    def _run_encoder(self, image: np.ndarray) -> np.ndarray:
        if self._openvino is not None:
            compiled, request = self._openvino
            return np.array(request.infer({0: image})[compiled.outputs[0]])
        return self._sessions["image_encoder"].run(None, {self._encoder_input: image})[0]

    def _run_decoder(self, feeds, multimask_output):
        feeds = {**feeds, "orig_im_size": np.array(self.original_size, np.float32)}
        session = self._sessions["prompt_decoder"]
        masks, iou, low_res = session.run(list(DECODER_OUTPUTS), feeds)
        if self.return_single_mask:
            sl = slice(None)
        else:
            sl = slice(1, None) if multimask_output else slice(0, 1)
        return masks[0, sl], iou[0, sl], low_res[0, sl]
