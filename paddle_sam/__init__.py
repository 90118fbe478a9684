"""paddle-sam: Segment Anything in PaddlePaddle 3.

``from paddle_sam import sam_model_registry, SamPredictor, SamAutomaticMaskGenerator`` is a
drop-in for ``segment_anything``; ``from paddle_sam import build_sam2, SAM2ImagePredictor,
SAM2AutomaticMaskGenerator, build_sam2_video_predictor, SAM2VideoPredictor`` for ``sam2``.

Importing the package sets only what is safe in any host process, unless the user set it:
Paddle's CPU thread count (all CPUs), MKL's fast code path on AMD processors and Paddle's serial
executor on CPU-only builds. ``paddle_sam.tune_process()`` applies the process-wide rest (Paddle
2.x copy semantics for views, glibc keeping freed memory): ``paddle-sam`` and its service call
it; a program that only runs paddle-sam models calls it once, early, for their full CPU speed.
What each setting does and what it was measured to give: ``paddle_sam._runtime``.
"""

from __future__ import annotations

import warnings

from ._runtime import apply_import_defaults, set_num_threads, tune_process
from ._version import __version__

with warnings.catch_warnings():
    # paddle warns about a missing ccache on import; it only matters for C++ extensions
    warnings.filterwarnings("ignore", message="No ccache found")
    apply_import_defaults()
    import paddle  # noqa: F401

from .loading.sam_v1 import build_sam, sam_model_registry  # noqa: E402
from .models.sam_v1 import SAM_SPECS, Sam, SamSpec  # noqa: E402
from .predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator  # noqa: E402
from .predict.sam_v1.predictor import SamPredictor  # noqa: E402

__all__ = [
    "SAM2AutomaticMaskGenerator",
    "SAM2ImagePredictor",
    "SAM2VideoPredictor",
    "SAM_SPECS",
    "Sam",
    "Sam3Processor",
    "Sam3Spec",
    "SamAutomaticMaskGenerator",
    "SamPredictor",
    "SamSpec",
    "__version__",
    "build_sam",
    "build_sam2",
    "build_sam2_video_predictor",
    "build_sam3_image_model",
    "build_sam3_video_model",
    "build_sam3_video_predictor",
    "load_sam3_tracker",
    "sam_model_registry",
    "set_num_threads",
    "tune_process",
]

# SAM 2 and SAM 3 are imported on first use, so that ``import paddle_sam`` stays as fast as
# for SAM v1.
_LAZY = {
    "build_sam2": ".loading.sam2",
    "build_sam2_video_predictor": ".loading.sam2",
    "SAM2ImagePredictor": ".predict.sam2.predictor",
    "SAM2AutomaticMaskGenerator": ".predict.sam2.automatic_mask_generator",
    "SAM2VideoPredictor": ".predict.sam2.video_predictor",
    "build_sam3_image_model": ".loading.sam3",
    "build_sam3_video_model": ".loading.sam3",
    "build_sam3_video_predictor": ".loading.sam3",
    "load_sam3_tracker": ".loading.sam3",
    "Sam3Processor": ".predict.sam3.processor",
    "Sam3Spec": ".models.sam3.build_sam3",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'paddle_sam' has no attribute {name!r}")
