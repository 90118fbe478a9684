"""Box format conversions (upstream: sam3/model/box_ops.py)."""

from __future__ import annotations

import paddle


def box_cxcywh_to_xyxy(x: paddle.Tensor) -> paddle.Tensor:
    """``... x 4`` (cx, cy, w, h) -> ``... x 4`` (x0, y0, x1, y1)."""
    cx, cy, w, h = x.unbind(-1)
    return paddle.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], axis=-1)


def box_xyxy_to_cxcywh(x: paddle.Tensor) -> paddle.Tensor:
    """``... x 4`` (x0, y0, x1, y1) -> ``... x 4`` (cx, cy, w, h)."""
    x0, y0, x1, y1 = x.unbind(-1)
    return paddle.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], axis=-1)
