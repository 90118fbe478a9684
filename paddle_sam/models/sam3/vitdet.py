"""Perception-Encoder ViT backbone of SAM 3 (upstream: sam3/model/vitdet.py).

A plain ViT over 14 x 14 patches with windowed attention in most blocks, global attention in
a few, 2-D axial RoPE on queries and keys, and a pretraining-size absolute position
embedding tiled over the grid. Tensors are channels-last (``B x H x W x C``) inside the trunk.

Upstream writes RoPE with complex numbers (``view_as_complex`` over adjacent channel pairs).
Here the same rotation is written with real cos/sin over the same pairs, so the model exports
to PIR and TensorRT; the tables are non-persistent buffers computed from the configuration
(the checkpoint's complex ``freqs_cis`` buffers are dropped by the converter).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from ..common import Linear
from ..sam_v1.image_encoder import PatchEmbed, window_partition, window_unpartition
from .model_misc import (
    LayerScale,
    attend_in_row_blocks,
    fused_self_attention,
    use_fused_attention,
)

# attention scores computed at once (256 MB in float32): one block for the 9 x 16 windows of
# 24 x 24 tokens, 7 row blocks for a 72 x 72 global block
_ATTN_BLOCK = 1 << 26


def axial_rope_angles(
    dim: int, end_x: int, end_y: int, theta: float = 10000.0, scale_pos: float = 1.0
) -> np.ndarray:
    """Rotation angles of 2-D axial RoPE: ``(end_x * end_y) x (dim / 2)`` float32.

    Token ``t`` sits at column ``t % end_x`` and row ``t // end_x`` (times ``scale_pos``).
    Channel pair ``i < dim/4`` turns by ``col * f_i``, pair ``dim/4 + i`` by ``row * f_i``, with
    ``f_i = theta^(-4i/dim)``. Computed in float32 as upstream.
    """
    exps = np.arange(0, dim, 4, dtype=np.float32)[: dim // 4] / np.float32(dim)
    freqs = np.float32(1.0) / np.power(np.float32(theta), exps, dtype=np.float32)
    t = np.arange(end_x * end_y, dtype=np.float32)
    t_x = (t % end_x).astype(np.float32) * np.float32(scale_pos)
    t_y = np.floor(t / np.float32(end_x)).astype(np.float32) * np.float32(scale_pos)
    return np.concatenate([np.outer(t_x, freqs), np.outer(t_y, freqs)], axis=-1).astype(np.float32)


def rope_tables(angles: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tables of :func:`apply_rope` for ``L x D/2`` angles: cos and sin of each angle for
    both channels of its pair (``L x D``), and the ``D x D`` matrix taking each channel pair
    ``(a, b)`` to ``(-b, a)``."""
    dim = 2 * angles.shape[-1]
    swap = np.zeros((dim, dim), np.float32)
    pair = np.arange(0, dim, 2)
    swap[pair + 1, pair] = -1.0
    swap[pair, pair + 1] = 1.0
    return np.repeat(np.cos(angles), 2, -1), np.repeat(np.sin(angles), 2, -1), swap


def apply_rope(
    x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, swap: paddle.Tensor
) -> paddle.Tensor:
    """Rotate adjacent channel pairs ``(x[2i], x[2i+1])`` of ``... x L x D`` by their angles
    (tables from :func:`rope_tables`, broadcast against ``x``): the real form of
    ``x_complex * exp(i * angle)``, ``(a cos - b sin, a sin + b cos)``, computed as
    ``x * cos + (x @ swap) * sin``. The same products and sums as the pairwise form (the
    swap only moves and negates values), without its strided copies: 11 ms against 28 for
    one windowed block's queries here."""
    return x * cos + paddle.matmul(x, swap) * sin


def get_abs_pos(
    abs_pos: paddle.Tensor, has_cls_token: bool, hw: tuple[int, int], tiling: bool = True
) -> paddle.Tensor:
    """``1 x N(+1) x C`` pretraining position embedding -> ``1 x h x w x C`` for an h x w grid.

    The cls entry is dropped; a different grid size is tiled (``tiling``) or resized bicubic.
    """
    h, w = hw
    if has_cls_token:
        abs_pos = abs_pos[:, 1:]
    n = abs_pos.shape[1]
    size = math.isqrt(n)
    if size * size != n:
        raise ValueError(f"position embedding has {n} entries, not a square grid")
    if size == h and size == w:
        return abs_pos.reshape([1, h, w, -1])
    grid = abs_pos.reshape([1, size, size, -1])
    if tiling:  # as concatenations: a traced tile's repeats reach ONNX with an unknown length
        grid = paddle.concat([grid] * (h // size + 1), axis=1)
        grid = paddle.concat([grid] * (w // size + 1), axis=2)
        return grid[:, :h, :w, :]
    grid = F.interpolate(
        grid.transpose([0, 3, 1, 2]), size=[h, w], mode="bicubic", align_corners=False
    )
    return grid.transpose([0, 2, 3, 1])


class Attention(nn.Layer):
    """Multi-head self-attention over a ``B x H x W x C`` grid with optional 2-D RoPE.

    ``input_size`` is the grid (the window for windowed blocks); RoPE angles are scaled by
    ``rope_pt_size / input_size`` when ``rope_interp``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        use_rel_pos: bool = False,
        input_size: tuple[int, int] | None = None,
        cls_token: bool = False,
        use_rope: bool = False,
        rope_theta: float = 10000.0,
        rope_pt_size: tuple[int, int] | None = None,
        rope_interp: bool = False,
    ) -> None:
        super().__init__()
        if use_rel_pos or cls_token:
            raise NotImplementedError(
                "relative position embeddings and a retained cls token are not used by SAM 3 "
                "and not implemented"
            )
        if dim % num_heads != 0:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        # see model_misc.use_fused_attention (None: Paddle's fused CPU kernel when it applies)
        self.fused_attention: bool | None = None
        self.qkv = Linear(dim, dim * 3, bias_attr=None if qkv_bias else False)
        self.proj = Linear(dim, dim)
        self.use_rel_pos = use_rel_pos
        self.input_size = input_size
        self.use_rope = use_rope
        if use_rope:
            if input_size is None:
                raise ValueError("input_size is required when use_rope=True")
            if self.head_dim % 4 != 0:
                raise ValueError(f"2-D RoPE needs head_dim divisible by 4, got {self.head_dim}")
            pt = rope_pt_size or input_size
            scale_pos = pt[0] / input_size[0] if rope_interp else 1.0
            angles = axial_rope_angles(
                self.head_dim, input_size[0], input_size[1], rope_theta, scale_pos
            )
            for name, table in zip(
                ("rope_cos", "rope_sin", "rope_swap"), rope_tables(angles), strict=True
            ):
                self.register_buffer(name, paddle.to_tensor(table), persistable=False)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        _, H, W, C = x.shape
        L, nh, hd = H * W, self.num_heads, self.head_dim
        if self.use_rope and self.rope_cos.shape[0] != L:
            raise ValueError(
                f"RoPE tables are for {self.rope_cos.shape[0]} tokens, the input has {L}: "
                f"build the model for this image size"
            )
        qkv = self.qkv(x)
        if use_fused_attention(self.fused_attention, qkv, L, L):
            qkv = qkv.reshape([-1, L, 3, nh, hd])
            if self.use_rope:  # q and k at once, tables expanded to L x 2 x nh x hd:
                # Paddle's CPU multiply is ~10x slower when the table broadcasts along the
                # middle axes (80 against 6 ms for a windowed block here)
                cos, sin = (
                    t.unsqueeze([1, 2]).expand([L, 2, nh, hd])
                    for t in (self.rope_cos, self.rope_sin)
                )
                qk = apply_rope(qkv[:, :, :2], cos, sin, self.rope_swap)
                qkv = paddle.concat([qk, qkv[:, :, 2:]], axis=2)
            return self.proj(fused_self_attention(qkv, self.scale).reshape([-1, H, W, C]))
        q, k, v = (
            t.reshape([-1, L, nh, hd]).transpose([0, 2, 1, 3]).reshape([-1, L, hd])
            for t in paddle.split(qkv, 3, axis=-1)
        )
        if self.use_rope:
            q = apply_rope(q, self.rope_cos, self.rope_sin, self.rope_swap)
            k = apply_rope(k, self.rope_cos, self.rope_sin, self.rope_swap)
        # query rows in blocks of at most _ATTN_BLOCK scores: the global blocks' 16 x 5184 x
        # 5184 matrix (1.7 GB) is never materialised, and the blocks stay in a warm working
        # set (measured: 4.0 s -> 1.6 s per global block on 2 cores)
        x = attend_in_row_blocks(q * self.scale, k, v, block=_ATTN_BLOCK, threads=False)
        x = x.reshape([-1, nh, L, hd]).transpose([0, 2, 1, 3])
        return self.proj(x.reshape([-1, H, W, C]))


class Mlp(nn.Layer):
    """``fc2(act(fc1(x)))`` (timm's Mlp, as upstream uses it)."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        act_layer: type[nn.Layer] = nn.GELU,
        drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.fc1 = Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()
        self.fc2 = Linear(hidden_features, in_features)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))


class DropPath(nn.Layer):
    """Stochastic depth: drops whole samples' residual branches in training."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        keep = 1.0 - self.drop_prob
        mask = paddle.bernoulli(paddle.full([x.shape[0]] + [1] * (x.ndim - 1), keep, x.dtype))
        return x * mask / keep


class Block(nn.Layer):
    """Pre-norm transformer block; ``window_size == 0`` means global attention."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path: float = 0.0,
        norm_eps: float = 1e-5,
        act_layer: type[nn.Layer] = nn.GELU,
        window_size: int = 0,
        input_size: tuple[int, int] | None = None,
        use_rope: bool = False,
        rope_pt_size: tuple[int, int] | None = None,
        rope_interp: bool = False,
        dropout: float = 0.0,
        init_values: float | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, epsilon=norm_eps)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            input_size=input_size if window_size == 0 else (window_size, window_size),
            use_rope=use_rope,
            rope_pt_size=rope_pt_size,
            rope_interp=rope_interp,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, epsilon=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=dropout)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.window_size = window_size

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.window_size > 0:
            H, W = x.shape[1], x.shape[2]
            x, pad_hw = window_partition(x, self.window_size)
        x = self.ls1(self.attn(x))
        if self.window_size > 0:
            x = window_unpartition(x, self.window_size, pad_hw, (H, W))
        x = shortcut + self.dropout(self.drop_path(x))
        return x + self.dropout(self.drop_path(self.ls2(self.mlp(self.norm2(x)))))


class ConvStem(nn.Layer):
    """3 x 3 convolutions, each followed by batch norm and ReLU, run before the patch projection
    (not in upstream; Xiao et al. 2021, "Early convolutions help transformers see better"). A
    small ViT trained from scratch learns shapes slowly through its single linear patch
    projection; a few convolutions give it that prior. ``layers``: ``(width, stride)`` of each
    convolution. Input ``B x C x H x W``, output ``B x layers[-1][0] x H / S x W / S`` with
    ``S`` the product of the strides."""

    def __init__(self, in_chans: int, layers: Sequence[tuple[int, int]]) -> None:
        super().__init__()
        seq: list[nn.Layer] = []
        for width, stride in layers:
            seq += [
                nn.Conv2D(in_chans, width, 3, stride=stride, padding=1, bias_attr=False),
                nn.BatchNorm2D(width),
                nn.ReLU(),
            ]
            in_chans = width
        self.layers = nn.Sequential(*seq)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.layers(x)


class ViT(nn.Layer):
    """ViTDet-style plain ViT; defaults are SAM 3's released backbone (PE, 1008 input).

    ``forward`` takes ``B x 3 x img_size x img_size`` and returns a list with the
    ``B x embed_dim x H/patch x W/patch`` features after the last global block (after every
    global block with ``return_interm_layers``).
    """

    def __init__(
        self,
        img_size: int = 1008,
        patch_size: int = 14,
        in_chans: int = 3,
        embed_dim: int = 1024,
        depth: int = 32,
        num_heads: int = 16,
        mlp_ratio: float = 4.625,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.1,
        norm_eps: float = 1e-5,
        act_layer: type[nn.Layer] = nn.GELU,
        use_abs_pos: bool = True,
        tile_abs_pos: bool = True,
        rel_pos_blocks: Sequence[int] | bool = (),
        window_size: int = 24,
        global_att_blocks: Sequence[int] = (7, 15, 23, 31),
        use_rope: bool = True,
        rope_pt_size: int | None = None,
        use_interp_rope: bool = True,
        pretrain_img_size: int = 336,
        pretrain_use_cls_token: bool = True,
        retain_cls_token: bool = False,
        dropout: float = 0.0,
        return_interm_layers: bool = False,
        init_values: float | None = None,
        ln_pre: bool = True,
        ln_post: bool = False,
        bias_patch_embed: bool = False,
        conv_stem: Sequence[tuple[int, int]] = (),
    ) -> None:
        super().__init__()
        if rel_pos_blocks or retain_cls_token:
            raise NotImplementedError(
                "rel_pos_blocks and retain_cls_token are not used by SAM 3 and not implemented"
            )
        if not global_att_blocks or max(global_att_blocks) >= depth:
            raise ValueError(
                f"global_att_blocks {global_att_blocks} must index into {depth} blocks"
            )
        if tile_abs_pos and not use_abs_pos:
            raise ValueError("tile_abs_pos needs use_abs_pos")
        self.img_size = img_size
        self.patch_size = patch_size
        self.pretrain_use_cls_token = pretrain_use_cls_token
        self.full_attn_ids = list(global_att_blocks)
        self.tile_abs_pos = tile_abs_pos
        self.return_interm_layers = return_interm_layers
        # conv_stem: (width, stride) of convolutions before the patch projection (not in
        # upstream); the projection then covers what is left of the patch
        self.stem = None
        kernel = patch_size
        if conv_stem:
            stride = math.prod(s for _, s in conv_stem)
            if patch_size % stride:
                raise ValueError(
                    f"conv_stem's strides (product {stride}) do not divide the patch size "
                    f"{patch_size}"
                )
            self.stem = ConvStem(in_chans, conv_stem)
            kernel, in_chans = patch_size // stride, conv_stem[-1][0]
        self.patch_embed = PatchEmbed(
            kernel_size=(kernel, kernel),
            stride=(kernel, kernel),
            in_chans=in_chans,
            embed_dim=embed_dim,
            bias=bias_patch_embed,
        )
        self.pos_embed = None
        if use_abs_pos:
            n = (pretrain_img_size // patch_size) ** 2 + int(pretrain_use_cls_token)
            self.pos_embed = self.create_parameter(
                [1, n, embed_dim], default_initializer=nn.initializer.TruncatedNormal(std=0.02)
            )
        grid = img_size // patch_size
        rope_pt = (window_size, window_size) if rope_pt_size is None else (rope_pt_size,) * 2
        dpr = np.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.LayerList(
            Block(
                dim=embed_dim,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                drop_path=dpr[i],
                norm_eps=norm_eps,
                act_layer=act_layer,
                window_size=0 if i in self.full_attn_ids else window_size,
                input_size=(grid, grid),
                use_rope=use_rope,
                rope_pt_size=rope_pt,
                rope_interp=use_interp_rope,
                dropout=dropout,
                init_values=init_values,
            )
            for i in range(depth)
        )
        n_out = len(self.full_attn_ids) if return_interm_layers else 1
        self.channel_list = [embed_dim] * n_out
        self.ln_pre = nn.LayerNorm(embed_dim, epsilon=norm_eps) if ln_pre else nn.Identity()
        self.ln_post = nn.LayerNorm(embed_dim, epsilon=norm_eps) if ln_post else nn.Identity()

    def forward(self, x: paddle.Tensor) -> list[paddle.Tensor]:
        if x.ndim != 4:
            raise ValueError(f"expected a B x C x H x W image batch, got shape {x.shape}")
        if self.stem is not None:
            x = self.stem(x)
        x = self.patch_embed(x)
        if self.pos_embed is not None:
            x = x + get_abs_pos(
                self.pos_embed,
                self.pretrain_use_cls_token,
                (x.shape[1], x.shape[2]),
                tiling=self.tile_abs_pos,
            )
        x = self.ln_pre(x)
        outputs = []
        last = self.full_attn_ids[-1]
        for i, blk in enumerate(self.blocks[: last + 1]):
            x = blk(x)
            if i == last:
                x = self.ln_post(x)
            if i == last or (self.return_interm_layers and i in self.full_attn_ids):
                outputs.append(x.transpose([0, 3, 1, 2]))
        return outputs
