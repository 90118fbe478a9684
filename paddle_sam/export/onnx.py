"""ONNX export of SAM v1 through paddle2onnx (the optional ``onnx`` extra).

The same two programs as the PIR export, converted to ONNX: ``image_encoder.onnx`` and
``prompt_decoder.onnx``. The decoder keeps the mask upscaling in the graph, with the original
image size as an input (``orig_im_size``), like upstream's ONNX model, so a browser runtime
(onnxruntime-web) gets masks at the image's size straight from it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..models.sam_v1.sam import Sam
from .sam_v1 import MANIFEST, PROGRAMS, check_outputs, sam_fields, save_programs, write_manifest

ONNX_FORMAT = "paddle-sam/sam_v1-onnx"
# versioned apart from the PIR export's FORMAT_VERSION (a change to the PIR programs leaves
# ONNX exports valid); 3 is what ONNX exports carried while the two shared one number
ONNX_FORMAT_VERSION = 3
DEFAULT_OPSET = 17


def _paddle2onnx():
    try:
        import paddle2onnx
    except ImportError as exc:
        raise ImportError("ONNX export needs paddle2onnx: pip install 'paddle-sam[onnx]'") from exc
    return paddle2onnx


def export_onnx(
    sam: Sam,
    out_dir: str | os.PathLike,
    *,
    model_type: str | None = None,
    source_sha256: str | None = None,
    overwrite: bool = False,
    opset: int = DEFAULT_OPSET,
) -> dict:
    """Write ``image_encoder.onnx``, ``prompt_decoder.onnx`` and ``export.json``."""
    p2o = _paddle2onnx()
    out = Path(out_dir)
    programs = {p: [f"{p}.onnx"] for p in PROGRAMS}
    check_outputs(out, [f"{p}.onnx" for p in PROGRAMS] + [MANIFEST], overwrite)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="paddle-sam-onnx-") as tmp:
        tmp = Path(tmp)
        save_programs(sam, tmp, upscale=True)
        for prog in PROGRAMS:
            dst = tmp / f"{prog}.onnx"
            # "onnxoptimizer": the default tool (polygraphy) pip-installs packages at run time
            p2o.export(
                str(tmp / f"{prog}.json"),
                str(tmp / f"{prog}.pdiparams"),
                save_file=str(dst),
                opset_version=opset,
                auto_upgrade_opset=False,
                optimize_tool="onnxoptimizer",
            )
            if not dst.is_file() or dst.stat().st_size == 0:  # paddle2onnx logs, not raises
                raise RuntimeError(f"paddle2onnx could not convert the {prog} program")
        for prog in PROGRAMS:
            shutil.move(str(tmp / f"{prog}.onnx"), out / f"{prog}.onnx")
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
        decoder_outputs=["masks", "iou_predictions", "low_res_masks"],
    )
