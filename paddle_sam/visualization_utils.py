"""``sam3.visualization_utils`` under paddle-sam: the plotting helpers of the SAM 3 example
notebooks, under upstream's import path. They live in
:mod:`paddle_sam.predict.sam3.visualization_utils`; this module re-exports them.

``COLORS`` is the implementation's palette: made on first read, and a palette assigned here is
the one the helpers draw with, as upstream's ``COLORS = ...`` is.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .predict.sam3 import visualization_utils as _impl
from .predict.sam3.visualization_utils import (
    VIZ_INSTALL_HINT,
    bitget,
    convert_coco_to_masklet_format,
    draw_box_on_image,
    draw_masks_to_frame,
    generate_colors,
    get_all_annotations_for_frame,
    get_annot_df,
    get_annot_dfs,
    get_media_dir,
    load_frame,
    normalize_bbox,
    pascal_color_map,
    plot_bbox,
    plot_mask,
    plot_results,
    prepare_masks_for_visualization,
    render_masklet_frame,
    save_masklet_image,
    save_masklet_video,
    save_side_by_side_visualization,
    show_box,
    show_img_tensor,
    show_mask,
    show_points,
    single_visualization,
    visualize_formatted_frame_output,
    visualize_frame_output,
    visualize_prompt_overlay,
)

__all__ = [
    "COLORS",  # noqa: F822 (made on first read, by __getattr__)
    "VIZ_INSTALL_HINT",
    "bitget",
    "convert_coco_to_masklet_format",
    "draw_box_on_image",
    "draw_masks_to_frame",
    "generate_colors",
    "get_all_annotations_for_frame",
    "get_annot_df",
    "get_annot_dfs",
    "get_media_dir",
    "load_frame",
    "normalize_bbox",
    "pascal_color_map",
    "plot_bbox",
    "plot_mask",
    "plot_results",
    "prepare_masks_for_visualization",
    "render_masklet_frame",
    "save_masklet_image",
    "save_masklet_video",
    "save_side_by_side_visualization",
    "show_box",
    "show_img_tensor",
    "show_mask",
    "show_points",
    "single_visualization",
    "visualize_formatted_frame_output",
    "visualize_frame_output",
    "visualize_prompt_overlay",
]


def __getattr__(name: str) -> Any:
    if name == "COLORS":
        return _impl.COLORS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Mirror(types.ModuleType):
    """Assigning ``COLORS`` here sets the implementation's palette; deleting it there makes
    the default palette again on the next read."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "COLORS":
            setattr(_impl, name, value)
        else:
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name == "COLORS":
            delattr(_impl, name)
        else:
            super().__delattr__(name)


sys.modules[__name__].__class__ = _Mirror
