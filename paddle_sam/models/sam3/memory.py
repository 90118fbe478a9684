"""Memory encoder of the SAM 3 tracker (upstream: sam3/model/memory.py).

A predicted mask is squashed (sigmoid), resized to ``interpol_size``, downsampled by strided
convs to the image-feature grid, added to the projected image features, fused by ConvNeXt
blocks and projected to the memory width; a sine position encoding of the result goes with it.
Module and parameter names are upstream's, so checkpoint keys load as they are (Linear weights
transposed by the converter).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import paddle
from paddle import nn

from ..common import LayerNorm2d, Linear, depthwise_conv2d
from .model_misc import get_clones, is_static_size
from .vitdet import DropPath


@functools.cache
def antialias_bilinear_weights(in_size: int, out_size: int) -> np.ndarray:
    """``out_size x in_size`` float32 matrix of torch's antialiased bilinear resize along one
    axis (``F.interpolate(mode="bilinear", align_corners=False, antialias=True)``).

    Output ``i`` is centred at ``scale * (i + 0.5)`` in the input, ``scale = in / out``; a
    triangle filter of support ``max(scale, 1)`` (stretched by ``max(scale, 1)``) over the
    input pixels it covers, each row normalised to sum 1. Computed in float32 step by step as
    torch's ``_compute_index_ranges_weights`` does for float32 inputs: weights from exact
    arithmetic differ from torch's by up to ~2e-6 relative, these agree to ~1e-7. When
    upsampling this is plain half-pixel bilinear with edge clamping.
    """
    f = np.float32
    scale = f(in_size) / f(out_size)
    support = scale if scale >= 1.0 else f(1.0)
    invscale = f(1.0) / scale if scale >= 1.0 else f(1.0)
    w = np.zeros((out_size, in_size), np.float32)
    for i in range(out_size):
        center = scale * f(i + 0.5)
        xmin = max(int(center - support + f(0.5)), 0)
        xmax = min(int(center + support + f(0.5)), in_size)
        row, total = [], f(0.0)
        for j in range(xmin, xmax):
            t = np.abs((f(j) - center + f(0.5)) * invscale)
            v = f(1.0) - t if t < 1.0 else f(0.0)
            row.append(v)
            total = f(total + v)
        for j, v in enumerate(row):
            w[i, xmin + j] = v / total if total != 0 else v
    return w


def resize_antialias(x: paddle.Tensor, size: Sequence[int]) -> paddle.Tensor:
    """Antialiased bilinear resize of the last two axes of ``... x H x W`` float32 (torch's
    ``antialias=True``), as two matmuls with :func:`antialias_bilinear_weights` (width, then
    height, torch's order). Needs static input sizes (always so in dygraph)."""
    h, w = x.shape[-2], x.shape[-1]
    if not (is_static_size(h) and is_static_size(w)):
        raise ValueError("resize_antialias needs the input size fixed at export")
    out_h, out_w = int(size[0]), int(size[1])
    if w != out_w:
        ww = paddle.to_tensor(antialias_bilinear_weights(int(w), out_w), dtype=x.dtype)
        x = paddle.matmul(x, ww, transpose_y=True)
    if h != out_h:
        wh = paddle.to_tensor(antialias_bilinear_weights(int(h), out_h), dtype=x.dtype)
        x = paddle.matmul(wh, x)
    return x


class SimpleMaskDownSampler(nn.Layer):
    """Progressively downsample a mask by ``total_stride``, ``stride`` at a time (conv,
    LayerNorm2d, activation), channels growing by ``stride**2`` each time; a final 1x1 conv to
    ``embed_dim``. With ``interpol_size`` the mask is first resized there (antialiased
    bilinear, half-pixel centres, as upstream)."""

    def __init__(
        self,
        embed_dim: int = 256,
        kernel_size: int = 4,
        stride: int = 4,
        padding: int = 0,
        total_stride: int = 16,
        activation: type[nn.Layer] = nn.GELU,
        interpol_size: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        num_layers = int(math.log2(total_stride) // math.log2(stride))
        if stride**num_layers != total_stride:
            raise ValueError(f"total_stride {total_stride} is not a power of stride {stride}")
        layers: list[nn.Layer] = []
        mask_in_chans, mask_out_chans = 1, 1
        for _ in range(num_layers):
            mask_out_chans = mask_in_chans * (stride**2)
            layers.append(
                nn.Conv2D(
                    mask_in_chans,
                    mask_out_chans,
                    kernel_size=kernel_size,
                    stride=stride,
                    padding=padding,
                )
            )
            layers.append(LayerNorm2d(mask_out_chans))
            layers.append(activation())
            mask_in_chans = mask_out_chans
        layers.append(nn.Conv2D(mask_out_chans, embed_dim, kernel_size=1))
        self.encoder = nn.Sequential(*layers)
        self.interpol_size = None
        if interpol_size is not None:
            if not isinstance(interpol_size, (list, tuple)) or len(interpol_size) != 2:
                raise ValueError(
                    f"interpol_size should be a list or tuple of 2, not {interpol_size}"
                )
            self.interpol_size = [int(s) for s in interpol_size]

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if self.interpol_size is not None and self.interpol_size != list(x.shape[-2:]):
            x = resize_antialias(x.astype("float32"), self.interpol_size)
        return self.encoder(x)


class CXBlock(nn.Layer):
    """ConvNeXt block: depthwise conv, LayerNorm2d, pointwise MLP (as Linear layers, channels
    last), layer scale ``gamma``, residual."""

    def __init__(
        self,
        dim: int,
        kernel_size: int = 7,
        padding: int = 3,
        drop_path: float = 0.0,
        layer_scale_init_value: float = 1e-6,
        use_dwconv: bool = True,
    ) -> None:
        super().__init__()
        self.dwconv = nn.Conv2D(
            dim, dim, kernel_size=kernel_size, padding=padding, groups=dim if use_dwconv else 1
        )
        self.depthwise, self.padding = use_dwconv and dim > 1, padding
        self.norm = LayerNorm2d(dim, eps=1e-6)
        self.pwconv1 = Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = Linear(4 * dim, dim)
        self.gamma = (
            self.create_parameter(
                [dim], default_initializer=nn.initializer.Constant(layer_scale_init_value)
            )
            if layer_scale_init_value > 0
            else None
        )
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        inp = x
        if self.depthwise:  # a faster CPU path than Paddle's grouped conv
            x = depthwise_conv2d(x, self.dwconv.weight, self.dwconv.bias, self.padding)
        else:
            x = self.dwconv(x)
        x = self.norm(x)
        x = x.transpose([0, 2, 3, 1])  # N x C x H x W -> N x H x W x C
        x = self.pwconv2(self.act(self.pwconv1(x)))
        if self.gamma is not None:
            x = self.gamma * x
        x = x.transpose([0, 3, 1, 2])
        return inp + self.drop_path(x)


class SimpleFuser(nn.Layer):
    """Optional 1x1 input projection, then ``num_layers`` copies of ``layer``."""

    def __init__(
        self,
        layer: nn.Layer,
        num_layers: int,
        dim: int | None = None,
        input_projection: bool = False,
    ) -> None:
        super().__init__()
        self.proj = nn.Identity()
        self.layers = get_clones(layer, num_layers)
        if input_projection:
            if dim is None:
                raise ValueError("dim is required with input_projection")
            self.proj = nn.Conv2D(dim, dim, kernel_size=1)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = self.proj(x)
        for layer in self.layers:
            x = layer(x)
        return x


class SimpleMaskEncoder(nn.Layer):
    """Memory of one frame: ``pix_feat_proj(pix_feat) + mask_downsampler(sigmoid(masks))``,
    fused, projected to ``out_dim``; with its position encoding."""

    def __init__(
        self,
        out_dim: int,
        mask_downsampler: nn.Layer,
        fuser: nn.Layer,
        position_encoding: nn.Layer,
        in_dim: int = 256,
    ) -> None:
        super().__init__()
        self.mask_downsampler = mask_downsampler
        self.pix_feat_proj = nn.Conv2D(in_dim, in_dim, kernel_size=1)
        self.fuser = fuser
        self.position_encoding = position_encoding
        self.out_proj = nn.Identity()
        if out_dim != in_dim:
            self.out_proj = nn.Conv2D(in_dim, out_dim, kernel_size=1)

    def forward(
        self, pix_feat: paddle.Tensor, masks: paddle.Tensor, skip_mask_sigmoid: bool = False
    ) -> dict[str, paddle.Tensor | list[paddle.Tensor]]:
        """``pix_feat``: ``B x in_dim x H x W``; ``masks``: ``B x 1 x h x w`` logits (or
        probabilities with ``skip_mask_sigmoid``) -> ``{"vision_features": B x out_dim x H x W,
        "vision_pos_enc": [B x P x H x W]}``."""
        if not skip_mask_sigmoid:
            masks = nn.functional.sigmoid(masks)
        masks = self.mask_downsampler(masks)
        x = self.pix_feat_proj(pix_feat) + masks
        x = self.out_proj(self.fuser(x))
        pos = self.position_encoding(x).astype(x.dtype)
        return {"vision_features": x, "vision_pos_enc": [pos]}


def build_tracker_maskmem_backbone(
    image_size: int = 1008, backbone_stride: int = 14
) -> SimpleMaskEncoder:
    """The released tracker's memory encoder (upstream ``_create_tracker_maskmem_backbone``):
    1008 px masks resized to 1152, four stride-2 3x3 convs to 72 x 72, two ConvNeXt blocks
    over 256 channels, 64-channel memories with a 64-channel sine position encoding. Other
    image sizes keep the ratios: masks resized to 16 x the feature side."""
    side = image_size // backbone_stride
    from .position_encoding import PositionEmbeddingSine

    position_encoding = PositionEmbeddingSine(
        num_pos_feats=64,
        normalize=True,
        scale=None,
        temperature=10000,
        precompute_resolution=image_size,
    )
    mask_downsampler = SimpleMaskDownSampler(
        kernel_size=3, stride=2, padding=1, interpol_size=[16 * side, 16 * side]
    )
    cx_block_layer = CXBlock(
        dim=256, kernel_size=7, padding=3, layer_scale_init_value=1.0e-06, use_dwconv=True
    )
    fuser = SimpleFuser(layer=cx_block_layer, num_layers=2)
    return SimpleMaskEncoder(
        out_dim=64,
        position_encoding=position_encoding,
        mask_downsampler=mask_downsampler,
        fuser=fuser,
    )
