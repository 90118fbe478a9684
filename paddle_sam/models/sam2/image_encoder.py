"""SAM 2's image encoder: the Hiera trunk and an FPN neck (upstream:
sam2/modeling/backbones/image_encoder.py).

The neck projects each trunk stage to ``d_model`` channels (1 x 1 convs) and adds the
nearest-upsampled coarser level to the levels in ``fpn_top_down_levels``; each output level
gets a sine position encoding. ``scalp`` drops the coarsest levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import paddle
import paddle.nn.functional as F
from paddle import nn


class ImageEncoder(nn.Layer):
    """``trunk`` then ``neck``; returns ``vision_features`` (the coarsest kept level),
    ``vision_pos_enc`` and ``backbone_fpn`` (kept levels, finest first)."""

    def __init__(self, trunk: nn.Layer, neck: nn.Layer, scalp: int = 0) -> None:
        super().__init__()
        self.trunk = trunk
        self.neck = neck
        self.scalp = scalp
        if list(trunk.channel_list) != list(neck.backbone_channel_list):
            raise ValueError(
                f"Channel dims of trunk and neck do not match. Trunk: {trunk.channel_list}, "
                f"neck: {neck.backbone_channel_list}"
            )

    def forward(self, sample: paddle.Tensor) -> dict[str, Any]:
        features, pos = self.neck(self.trunk(sample))
        if self.scalp > 0:
            features, pos = features[: -self.scalp], pos[: -self.scalp]
        return {"vision_features": features[-1], "vision_pos_enc": pos, "backbone_fpn": features}


class FpnNeck(nn.Layer):
    """FPN without output convs: lateral 1 x 1 convs (``convs.<i>.conv``, coarsest first) and a
    top-down path (``fpn_interp_model`` upsampling by 2, summed or averaged)."""

    def __init__(
        self,
        position_encoding: nn.Layer,
        d_model: int,
        backbone_channel_list: Sequence[int],
        kernel_size: int = 1,
        stride: int = 1,
        padding: int = 0,
        fpn_interp_model: str = "bilinear",
        fuse_type: str = "sum",
        fpn_top_down_levels: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.position_encoding = position_encoding
        self.backbone_channel_list = list(backbone_channel_list)
        self.d_model = d_model
        convs = []
        for dim in backbone_channel_list:
            current = nn.Sequential()
            current.add_sublayer(
                "conv",
                nn.Conv2D(dim, d_model, kernel_size=kernel_size, stride=stride, padding=padding),
            )
            convs.append(current)
        self.convs = nn.LayerList(convs)
        self.fpn_interp_model = fpn_interp_model
        if fuse_type not in ("sum", "avg"):
            raise ValueError(f"fuse_type must be 'sum' or 'avg', got {fuse_type!r}")
        self.fuse_type = fuse_type
        if fpn_top_down_levels is None:
            fpn_top_down_levels = range(len(self.convs))
        self.fpn_top_down_levels = list(fpn_top_down_levels)

    def forward(self, xs: list[paddle.Tensor]) -> tuple[list[paddle.Tensor], list[paddle.Tensor]]:
        n = len(self.convs) - 1
        if len(xs) != n + 1:
            raise ValueError(f"{len(xs)} trunk levels for a neck of {n + 1}")
        out: list[Any] = [None] * (n + 1)
        pos: list[Any] = [None] * (n + 1)
        prev = None
        for i in range(n, -1, -1):  # coarse to fine
            lateral = self.convs[n - i](xs[i])
            if i in self.fpn_top_down_levels and prev is not None:
                mode = self.fpn_interp_model
                extra = {} if mode == "nearest" else {"align_corners": False}
                if mode == "nearest" and not paddle.in_dynamic_mode():
                    top_down = _nearest_2x(prev.astype("float32"))
                else:
                    top_down = F.interpolate(
                        prev.astype("float32"), scale_factor=2.0, mode=mode, **extra
                    )
                prev = lateral + top_down
                if self.fuse_type == "avg":
                    prev = prev / 2
            else:
                prev = lateral
            out[i] = prev
            pos[i] = self.position_encoding(prev).astype(prev.dtype)
        return out, pos


def _nearest_2x(x: paddle.Tensor) -> paddle.Tensor:
    """Nearest 2x upsampling of ``B x C x H x W`` as a broadcast and a reshape: the same values
    as ``F.interpolate(scale_factor=2, mode="nearest")``, in ops oneDNN runs under a PIR program
    (its resize takes no array attribute in Paddle 3.3)."""
    b, c, h, w = x.shape
    x = x.reshape([b, c, h, 1, w, 1]).expand([b, c, h, 2, w, 2])
    return x.reshape([b, c, h * 2, w * 2])
