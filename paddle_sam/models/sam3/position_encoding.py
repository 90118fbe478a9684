"""Sine position encoding of feature maps, points and boxes (upstream: position_encoding.py)."""

from __future__ import annotations

import math

import paddle
from paddle import nn


class PositionEmbeddingSine(nn.Layer):
    """DETR's 2-D sine/cosine encoding with ``num_pos_feats`` channels (half for y, half for x).

    Within each half, channel ``2i`` is ``sin(p / T^(2i/n))`` and ``2i+1`` is
    ``cos(p / T^(2i/n))``, ``n = num_pos_feats / 2``; positions are 1-based and, with
    ``normalize``, divided by the last one (+1e-6) and multiplied by ``scale`` (2 pi).
    ``precompute_resolution`` is accepted for signature compatibility: upstream fills a cache
    with it; here maps are computed on first use per size (same values) and cached in dygraph.
    """

    def __init__(
        self,
        num_pos_feats: int,
        temperature: int = 10000,
        normalize: bool = True,
        scale: float | None = None,
        precompute_resolution: int | None = None,
    ) -> None:
        super().__init__()
        if num_pos_feats % 2 != 0:
            raise ValueError(f"num_pos_feats must be even, got {num_pos_feats}")
        if scale is not None and not normalize:
            raise ValueError("normalize should be True if scale is passed")
        self.num_pos_feats = num_pos_feats // 2
        self.temperature = temperature
        self.normalize = normalize
        self.scale = 2 * math.pi if scale is None else scale
        self.precompute_resolution = precompute_resolution
        self._cache: dict[tuple[int, int], paddle.Tensor] = {}

    def _dim_t(self) -> paddle.Tensor:
        dim_t = paddle.arange(self.num_pos_feats, dtype="float32")
        return self.temperature ** (2 * paddle.floor(dim_t / 2) / self.num_pos_feats)

    def _sin_cos(self, pos: paddle.Tensor) -> paddle.Tensor:
        """``... x n`` angles -> ``... x n``: sin of the even channels, cos of the odd ones."""
        out = paddle.stack((pos[..., 0::2].sin(), pos[..., 1::2].cos()), axis=-1)
        return out.flatten(-2)

    def _encode_xy(self, x: paddle.Tensor, y: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Normalised coordinates ``N`` and ``N`` -> encodings ``N x n`` each (x, y)."""
        if x.ndim != 1 or y.ndim != 1 or (paddle.in_dynamic_mode() and x.shape[0] != y.shape[0]):
            raise ValueError(f"x and y must be 1-D of one length, got {x.shape} and {y.shape}")
        dim_t = self._dim_t()
        pos_x = self._sin_cos((x * self.scale).unsqueeze(-1) / dim_t)
        pos_y = self._sin_cos((y * self.scale).unsqueeze(-1) / dim_t)
        return pos_x, pos_y

    def encode_boxes(
        self, x: paddle.Tensor, y: paddle.Tensor, w: paddle.Tensor, h: paddle.Tensor
    ) -> paddle.Tensor:
        """Box centres and sizes, each ``N`` -> ``N x (2n + 2)``: [y, x, h, w]."""
        pos_x, pos_y = self._encode_xy(x, y)
        return paddle.concat((pos_y, pos_x, h.unsqueeze(-1), w.unsqueeze(-1)), axis=1).detach()

    encode = encode_boxes

    def encode_points(
        self, x: paddle.Tensor, y: paddle.Tensor, labels: paddle.Tensor
    ) -> paddle.Tensor:
        """Points ``B x N`` (x, y, label) -> ``B x N x (2n + 1)``: [y, x, label]."""
        if x.shape != y.shape or x.shape != labels.shape or x.ndim != 2:
            raise ValueError(
                f"x, y and labels must be B x N of one shape: {x.shape}, {y.shape}, {labels.shape}"
            )
        b, n = x.shape
        pos_x, pos_y = self._encode_xy(x.flatten(), y.flatten())
        pos_x, pos_y = pos_x.reshape([b, n, -1]), pos_y.reshape([b, n, -1])
        labels = labels.astype(pos_x.dtype).unsqueeze(-1)
        return paddle.concat((pos_y, pos_x, labels), axis=2).detach()

    def _map(self, h: int, w: int) -> paddle.Tensor:
        """``num_pos_feats x h x w`` encoding of an ``h x w`` grid."""
        y = paddle.arange(1, h + 1, dtype="float32")
        x = paddle.arange(1, w + 1, dtype="float32")
        if self.normalize:
            eps = 1e-6
            y = y / (y[-1:] + eps) * self.scale
            x = x / (x[-1:] + eps) * self.scale
        dim_t = self._dim_t()
        pos_y = self._sin_cos(y.unsqueeze(-1) / dim_t)  # h x n
        pos_x = self._sin_cos(x.unsqueeze(-1) / dim_t)  # w x n
        n = self.num_pos_feats
        pos_y = pos_y.transpose([1, 0]).unsqueeze(-1).expand([n, h, w])
        pos_x = pos_x.transpose([1, 0]).unsqueeze(1).expand([n, h, w])
        return paddle.concat((pos_y, pos_x), axis=0)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """Feature map ``B x C x H x W`` (only its shape is used) -> float32
        ``B x num_pos_feats x H x W``."""
        h, w = int(x.shape[-2]), int(x.shape[-1])
        pos = self._cache.get((h, w)) if paddle.in_dynamic_mode() else None
        if pos is None:
            pos = self._map(h, w).detach()
            if paddle.in_dynamic_mode():
                self._cache[(h, w)] = pos
        if paddle.in_dynamic_mode() and x.shape[0] == 1:
            # the cached map itself (nothing writes into it): SAM 3's 288 x 288 level is
            # 81 MB an image per neck that a copy would add
            return pos.unsqueeze(0)
        return pos.unsqueeze(0).expand([x.shape[0], -1, -1, -1])
