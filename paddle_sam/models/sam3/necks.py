"""Simple-FPN neck over the ViT trunk, optionally doubled for the SAM 2 style tracker
(upstream: sam3/model/necks.py)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import paddle
from paddle import nn


def _fpn_level(dim: int, d_model: int, scale: float) -> nn.Sequential:
    """One pyramid level: resample by ``scale`` (4, 2, 1 or 0.5), then 1x1 and 3x3 convs."""
    layers: list[tuple[str, nn.Layer]] = []
    if scale == 4.0:
        layers += [
            ("dconv_2x2_0", nn.Conv2DTranspose(dim, dim // 2, kernel_size=2, stride=2)),
            ("gelu", nn.GELU()),
            ("dconv_2x2_1", nn.Conv2DTranspose(dim // 2, dim // 4, kernel_size=2, stride=2)),
        ]
        out_dim = dim // 4
    elif scale == 2.0:
        layers.append(("dconv_2x2", nn.Conv2DTranspose(dim, dim // 2, kernel_size=2, stride=2)))
        out_dim = dim // 2
    elif scale == 1.0:
        out_dim = dim
    elif scale == 0.5:
        layers.append(("maxpool_2x2", nn.MaxPool2D(kernel_size=2, stride=2)))
        out_dim = dim
    else:
        raise ValueError(f"scale factor {scale} is not supported (4.0, 2.0, 1.0 or 0.5)")
    layers += [
        ("conv_1x1", nn.Conv2D(out_dim, d_model, kernel_size=1)),
        ("conv_3x3", nn.Conv2D(d_model, d_model, kernel_size=3, padding=1)),
    ]
    return nn.Sequential(*layers)


class Sam3DualViTDetNeck(nn.Layer):
    """ViT trunk + one FPN (``convs``) and, with ``add_sam2_neck``, a second one with its own
    weights (``sam2_convs``) for the interactive predictor.

    ``forward(images)`` returns ``(sam3_features, sam3_pos, sam2_features, sam2_pos)``: lists
    of ``B x d_model x h_i x w_i`` maps, one per scale factor (sam2 ones are None without the
    second neck); positions come from ``position_encoding``.
    """

    def __init__(
        self,
        trunk: nn.Layer,
        position_encoding: nn.Layer,
        d_model: int,
        scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
        add_sam2_neck: bool = False,
    ) -> None:
        super().__init__()
        self.trunk = trunk
        self.position_encoding = position_encoding
        self.scale_factors = tuple(scale_factors)
        dim = trunk.channel_list[-1]
        self.convs = nn.LayerList(_fpn_level(dim, d_model, s) for s in self.scale_factors)
        self.sam2_convs = copy.deepcopy(self.convs) if add_sam2_neck else None

    @property
    def has_sam2_neck(self) -> bool:
        """Whether the second neck (clicks and video) is there."""
        return self.sam2_convs is not None

    def forward(
        self, images: paddle.Tensor
    ) -> tuple[
        list[paddle.Tensor],
        list[paddle.Tensor],
        list[paddle.Tensor] | None,
        list[paddle.Tensor] | None,
    ]:
        x = self.trunk(images)[-1]
        sam3_out, sam3_pos = self._pyramid(self.convs, x)
        sam2_out = sam2_pos = None
        if self.sam2_convs is not None:
            sam2_out, sam2_pos = self._pyramid(self.sam2_convs, x)
        return sam3_out, sam3_pos, sam2_out, sam2_pos

    def _pyramid(
        self, convs: nn.LayerList, x: paddle.Tensor
    ) -> tuple[list[paddle.Tensor], list[paddle.Tensor]]:
        feats = [conv(x) for conv in convs]
        pos = [self.position_encoding(f).astype(f.dtype) for f in feats]
        return feats, pos
