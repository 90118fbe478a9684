"""Hiera, SAM 2's hierarchical image trunk (upstream: sam2/modeling/backbones/hieradet.py and
backbones/utils.py).

Four stages of transformer blocks at strides 4, 8, 16 and 32; the first block of each later
stage halves the grid by max-pooling its queries (``q_pool``) and doubles the width and the
heads. Blocks attend within windows (``window_spec``, one size per stage) except the
``global_att_blocks``. The position embedding is a background embedding resized (bicubic) to
the grid plus a window embedding tiled over it. Module and parameter names are upstream's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from ..common import MLP, Linear, can_be_inplace
from ..sam3.model_misc import (
    ALL_ROWS,
    attend_in_row_blocks,
    fused_self_attention,
    use_fused_attention,
)


def window_partition(
    x: paddle.Tensor, window_size: int, fill: paddle.Tensor | None = None
) -> tuple[paddle.Tensor, tuple[int, int]]:
    """``B x H x W x C`` -> windows ``(B * nW) x ws x ws x C`` (padded to whole windows with
    zeros, or with ``fill``, a ``C`` vector) and the padded size ``(Hp, Wp)``."""
    b, h, w, c = x.shape
    pad_h = (window_size - h % window_size) % window_size
    pad_w = (window_size - w % window_size) % window_size
    if (pad_h > 0 or pad_w > 0) and fill is None and paddle.in_dynamic_mode():
        x = F.pad(x, [0, pad_w, 0, pad_h], data_format="NHWC")  # W, then H
    elif pad_h > 0 or pad_w > 0:  # oneDNN under a PIR program fails on an NHWC pad
        fill = paddle.zeros([1, 1, 1, c], x.dtype) if fill is None else fill.reshape([1, 1, 1, c])
        if pad_h > 0:
            x = paddle.concat([x, fill.expand([b, pad_h, w, c])], axis=1)
        if pad_w > 0:
            x = paddle.concat([x, fill.expand([b, h + pad_h, pad_w, c])], axis=2)
    hp, wp = h + pad_h, w + pad_w
    x = x.reshape([b, hp // window_size, window_size, wp // window_size, window_size, c])
    windows = x.transpose([0, 1, 3, 2, 4, 5]).reshape([-1, window_size, window_size, c])
    return windows, (hp, wp)


def window_unpartition(
    windows: paddle.Tensor, window_size: int, pad_hw: tuple[int, int], hw: tuple[int, int]
) -> paddle.Tensor:
    """Windows ``(B * nW) x ws x ws x C`` -> ``B x H x W x C`` (padding removed)."""
    hp, wp = pad_hw
    h, w = hw
    b = windows.shape[0] // (hp * wp // window_size // window_size)
    x = windows.reshape([b, hp // window_size, wp // window_size, window_size, window_size, -1])
    x = x.transpose([0, 1, 3, 2, 4, 5]).reshape([b, hp, wp, -1])
    if hp > h or wp > w:
        x = x[:, :h, :w, :]
    return x


class PatchEmbed(nn.Layer):
    """Image ``B x 3 x H x W`` -> patches ``B x H/4 x W/4 x C`` (a 7 x 7 stride-4 conv)."""

    def __init__(
        self,
        kernel_size: Sequence[int] = (7, 7),
        stride: Sequence[int] = (4, 4),
        padding: Sequence[int] = (3, 3),
        in_chans: int = 3,
        embed_dim: int = 768,
    ) -> None:
        super().__init__()
        self.proj = nn.Conv2D(
            in_chans, embed_dim, kernel_size=kernel_size, stride=stride, padding=padding
        )

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.proj(x).transpose([0, 2, 3, 1])


def do_pool(x: paddle.Tensor, pool: nn.Layer | None, norm: nn.Layer | None = None) -> paddle.Tensor:
    """``pool`` (upstream's channels-first max pool, no padding, floor mode) of a
    ``B x H x W x C`` map. In dygraph inference the same maxima are taken channels last (a
    reshape into ``k x k`` cells and a max over them): no transposes around the pool, 0.03 s of
    Hiera tiny's 1024 px pools on two Zen 4 cores. Traced, upstream's pool: OpenVINO ran the
    6-D max on its reference kernel (0.28 s)."""
    if pool is None:
        return x
    cells = _pool_cells(pool)
    if cells is None or _wants_gradients(x) or not paddle.in_dynamic_mode():
        x = pool(x.transpose([0, 3, 1, 2])).transpose([0, 2, 3, 1])
    else:
        kh, kw = cells
        b, h, w, c = x.shape
        if h % kh or w % kw:
            x = x[:, : h - h % kh, : w - w % kw]
        x = x.reshape([b, h // kh, kh, w // kw, kw, c]).max(axis=[2, 4])
    if norm:
        x = norm(x)
    return x


def _wants_gradients(x: paddle.Tensor) -> bool:
    """Training (gradients wanted): upstream's operations as they are."""
    return paddle.in_dynamic_mode() and paddle.is_grad_enabled() and not x.stop_gradient


def _pool_cells(pool: nn.Layer) -> tuple[int, int] | None:
    """``(kh, kw)`` of a max pool over whole ``kh x kw`` cells (stride = kernel, no padding,
    floor mode), else None."""
    if not isinstance(pool, nn.MaxPool2D) or pool.padding or pool.ceil_mode:
        return None
    kernel = pool.ksize
    stride = pool.stride or kernel
    pair = [
        (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1])) for v in (kernel, stride)
    ]
    return pair[0] if pair[0] == pair[1] else None


class MultiScaleAttention(nn.Layer):
    """Multi-head attention over a ``B x H x W x C`` map, queries optionally pooled."""

    def __init__(
        self, dim: int, dim_out: int, num_heads: int, q_pool: nn.Layer | None = None
    ) -> None:
        super().__init__()
        self.dim = dim
        self.dim_out = dim_out
        self.num_heads = num_heads
        self.q_pool = q_pool
        self.qkv = Linear(dim, dim_out * 3)
        self.proj = Linear(dim_out, dim_out)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        b, h, w, _ = x.shape
        heads = self.num_heads
        d = self.dim_out // heads
        scale = 1.0 / math.sqrt(d)
        if self.q_pool is None and use_fused_attention(None, x, h * w, h * w):
            # the packed B x N x 3 x heads x d qkv is the fused kernel's input as it is
            qkv = self.qkv(x).reshape([b, h * w, 3, heads, d])
            return self.proj(fused_self_attention(qkv, scale).reshape([b, h, w, -1]))
        return self.proj(self.attend(*self._project_qkv(x)))

    def attend(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        """The attention of projected ``q``, ``k``, ``v`` (each ``B x H x W x dim_out``, ``q``
        before its pooling) -> ``B x H' x W' x dim_out``, before ``proj``."""
        b, h, w, _ = k.shape
        heads = self.num_heads
        d = self.dim_out // heads
        scale = 1.0 / math.sqrt(d)
        if self.q_pool is not None:
            q = do_pool(q, self.q_pool)
        n_q, n_k = q.shape[1] * q.shape[2], h * w
        h, w = q.shape[1], q.shape[2]
        q, k, v = (_split_heads(t, n, heads, d) for t, n in ((q, n_q), (k, n_k), (v, n_k)))
        # Traced (the export, which OpenVINO runs), the rows are one block: OpenVINO fuses
        # product, softmax and product into one kernel that tiles the rows itself; in blocks
        # of rows base+'s global attention (4096 tokens) took 0.24 s a layer against 0.20 s,
        # the same values
        block = None if paddle.in_dynamic_mode() else ALL_ROWS
        x = attend_in_row_blocks(q * scale, k, v, block=block)  # B x heads x N x d
        if heads > 1:
            x = x.transpose([0, 2, 1, 3])
        return x.reshape([b, h, w, -1])

    def _project_qkv(self, x: paddle.Tensor) -> list[paddle.Tensor]:
        """q, k and v, each from its third of ``qkv``'s weight: three GEMMs that write them
        apart, where one GEMM and an unbind would copy them out of the packed result again
        (the same products; about a fifth of a small-window attention's time). Traced for an
        export too: OpenVINO ran the split with its reference kernel (0.10 of Hiera tiny's
        1.8 s on two Zen 4 cores)."""
        dynamic = paddle.in_dynamic_mode()
        if _wants_gradients(x):
            return list(paddle.unbind(self.qkv(x).reshape([*x.shape[:3], 3, -1]), axis=3))
        c = self.dim_out
        weight, bias = self.qkv.weight, self.qkv.bias
        if not dynamic:
            return [
                F.linear(x, weight[:, i * c : (i + 1) * c], bias[i * c : (i + 1) * c])
                for i in range(3)
            ]
        rows = x.reshape([-1, x.shape[-1]])
        return [
            paddle.addmm(bias[i * c : (i + 1) * c], rows, weight[:, i * c : (i + 1) * c]).reshape(
                [*x.shape[:3], c]
            )
            for i in range(3)
        ]


def _split_heads(t: paddle.Tensor, n: int, heads: int, d: int) -> paddle.Tensor:
    """``B x H x W x (heads * d)`` -> ``B x heads x N x d`` (no copy for one head)."""
    if heads == 1:
        return t.reshape([t.shape[0], 1, n, d])
    return t.reshape([t.shape[0], n, heads, d]).transpose([0, 2, 1, 3])


# The MLP's hidden activations per row chunk in dygraph inference (floats: 2 MB, a core's L2
# cache on current Xeons), for MLPs of at least MLP_CHUNKED_FROM hidden activations (the first
# stage's: 65536 rows of 384 or 448 features at 1024 px). Paddle's CPU GELU (erf form) costs
# about 4x torch's, and there it and the two Linears' outputs fit no cache: measured here
# (Xeon, one thread) 0.33 s -> 0.23 s for that MLP of Hiera tiny, torch 0.22 s. Smaller maps
# gained nothing and lost GEMM efficiency. Per row, the same products and sums.
MLP_CHUNK_HIDDEN = 1 << 19
MLP_CHUNKED_FROM = 1 << 24


class MultiScaleBlock(nn.Layer):
    """Pre-norm block (LayerNorm eps 1e-6): windowed or global attention, with query pooling
    and a projected, pooled shortcut where the width changes; then a GELU MLP."""

    def __init__(
        self,
        dim: int,
        dim_out: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        q_stride: tuple[int, int] | None = None,
        window_size: int = 0,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.dim_out = dim_out
        self.norm1 = nn.LayerNorm(dim, epsilon=1e-6)
        self.window_size = window_size
        self.pool, self.q_stride = None, q_stride
        if self.q_stride:
            self.pool = nn.MaxPool2D(kernel_size=q_stride, stride=q_stride, ceil_mode=False)
        self.attn = MultiScaleAttention(dim, dim_out, num_heads=num_heads, q_pool=self.pool)
        self.norm2 = nn.LayerNorm(dim_out, epsilon=1e-6)
        self.mlp = MLP(dim_out, int(dim_out * mlp_ratio), dim_out, 2, activation=nn.GELU)
        if dim != dim_out:
            self.proj = Linear(dim, dim_out)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        shortcut = x  # B x H x W x C
        x = self.norm1(x)
        if self.dim != self.dim_out:
            shortcut = do_pool(self.proj(x), self.pool)
        window_size = self.window_size
        h, w = x.shape[1], x.shape[2]
        pad_hw = (h, w)
        padded = window_size > 0 and bool(h % window_size or w % window_size)
        project_first = padded and not _wants_gradients(x)
        if project_first:
            # upstream pads the normed map with zeros and projects every window, so the
            # padding tokens' q, k, v are the bias exactly: projected before the padding,
            # padded with the bias and ``proj`` applied after the unpartition, the values are
            # the same without the padding's rows in the two GEMMs (at 1024 px a fifth more
            # rows: 64 -> 70)
            c = self.dim_out
            bias = self.attn.qkv.bias
            (q, _), (k, _), (v, pad_hw) = (
                window_partition(
                    t, window_size, fill=None if bias is None else bias[i * c : (i + 1) * c]
                )
                for i, t in enumerate(self.attn._project_qkv(x))
            )
            x = self.attn.attend(q, k, v)
        else:
            if window_size > 0:
                x, pad_hw = window_partition(x, window_size)
            x = self.attn(x)
        if self.q_stride:  # the grid shrank with the pooled queries
            window_size = self.window_size // self.q_stride[0]
            h, w = shortcut.shape[1], shortcut.shape[2]
            pad_h = (window_size - h % window_size) % window_size if window_size else 0
            pad_w = (window_size - w % window_size) % window_size if window_size else 0
            pad_hw = (h + pad_h, w + pad_w)
        if self.window_size > 0:
            x = window_unpartition(x, window_size, pad_hw, (h, w))
        if project_first:
            x = self.attn.proj(x)
        x = shortcut + x
        return self._norm_mlp(x)

    def _norm_mlp(self, x: paddle.Tensor) -> paddle.Tensor:
        """``x + mlp(norm2(x))``; in dygraph inference on large maps in row chunks whose hidden
        activations stay in the CPU's cache (see ``MLP_CHUNK_HIDDEN``)."""
        c = x.shape[-1]
        rows = int(np.prod(x.shape[:-1]))
        hidden = self.mlp.layers[0].weight.shape[1]
        if rows * hidden < MLP_CHUNKED_FROM or not can_be_inplace(x):
            return x + self.mlp(self.norm2(x))
        step = max(1, MLP_CHUNK_HIDDEN // hidden)
        flat = x.reshape([rows, c])
        sections = [min(step, rows - i) for i in range(0, rows, step)]
        out = [part + self.mlp(self.norm2(part)) for part in paddle.split(flat, sections)]
        return paddle.concat(out).reshape(x.shape)


class Hiera(nn.Layer):
    """The trunk: image ``B x 3 x H x W`` -> one ``B x C_i x H_i x W_i`` map per stage (finest
    first; only the last one without ``return_interm_layers``)."""

    def __init__(
        self,
        embed_dim: int = 96,
        num_heads: int = 1,
        q_pool: int = 3,
        q_stride: tuple[int, int] = (2, 2),
        stages: Sequence[int] = (2, 3, 16, 3),
        dim_mul: float = 2.0,
        head_mul: float = 2.0,
        window_pos_embed_bkg_spatial_size: Sequence[int] = (14, 14),
        window_spec: Sequence[int] = (8, 4, 14, 7),
        global_att_blocks: Sequence[int] | None = (12, 16, 20),
        return_interm_layers: bool = True,
    ) -> None:
        super().__init__()
        if len(stages) != len(window_spec):
            raise ValueError(f"{len(stages)} stages but {len(window_spec)} window sizes")
        self.window_spec = tuple(window_spec)
        depth = sum(stages)
        self.q_stride = tuple(q_stride)
        self.stage_ends = [sum(stages[:i]) - 1 for i in range(1, len(stages) + 1)]
        if not 0 <= q_pool <= len(self.stage_ends[:-1]):
            raise ValueError(f"q_pool {q_pool} outside 0..{len(self.stage_ends) - 1}")
        self.q_pool_blocks = [x + 1 for x in self.stage_ends[:-1]][:q_pool]
        self.return_interm_layers = return_interm_layers
        self.patch_embed = PatchEmbed(embed_dim=embed_dim)
        self.global_att_blocks = tuple(global_att_blocks or ())
        self.window_pos_embed_bkg_spatial_size = tuple(window_pos_embed_bkg_spatial_size)
        zeros = nn.initializer.Constant(0.0)
        self.pos_embed = self.create_parameter(
            [1, embed_dim, *self.window_pos_embed_bkg_spatial_size], default_initializer=zeros
        )
        ws0 = self.window_spec[0]
        self.pos_embed_window = self.create_parameter(
            [1, embed_dim, ws0, ws0], default_initializer=zeros
        )
        cur_stage = 1
        blocks = []
        for i in range(depth):
            dim_out = embed_dim
            # the first block of a stage keeps the previous stage's window size
            window_size = self.window_spec[cur_stage - 1]
            if i in self.global_att_blocks:
                window_size = 0
            if i - 1 in self.stage_ends:
                dim_out = int(embed_dim * dim_mul)
                num_heads = int(num_heads * head_mul)
                cur_stage += 1
            blocks.append(
                MultiScaleBlock(
                    dim=embed_dim,
                    dim_out=dim_out,
                    num_heads=num_heads,
                    q_stride=self.q_stride if i in self.q_pool_blocks else None,
                    window_size=window_size,
                )
            )
            embed_dim = dim_out
        self.blocks = nn.LayerList(blocks)
        self.channel_list = (
            [self.blocks[i].dim_out for i in self.stage_ends[::-1]]
            if return_interm_layers
            else [self.blocks[-1].dim_out]
        )

    def _get_pos_embed(self, hw: tuple[int, int]) -> paddle.Tensor:
        """``1 x H x W x C``: the background embedding resized (bicubic, half-pixel) plus the
        window embedding tiled."""
        h, w = hw
        pos_embed = F.interpolate(self.pos_embed, size=[h, w], mode="bicubic", align_corners=False)
        window = self.pos_embed_window
        # by index, not zip: a traced program (export) takes zip(strict=) as unknown
        reps = [pos_embed.shape[i] // window.shape[i] for i in range(4)]
        pos_embed = pos_embed + window.tile(reps)
        return pos_embed.transpose([0, 2, 3, 1])

    def forward(self, x: paddle.Tensor) -> list[paddle.Tensor]:
        x = self.patch_embed(x)  # B x H x W x C
        x = x + self._get_pos_embed((x.shape[1], x.shape[2]))
        outputs = []
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if i == self.stage_ends[-1] or (i in self.stage_ends and self.return_interm_layers):
                outputs.append(x.transpose([0, 3, 1, 2]))
        return outputs
