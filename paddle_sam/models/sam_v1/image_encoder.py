"""ViT image encoder with windowed attention and decomposed relative position bias.

Weight-compatible with ``segment_anything.modeling.image_encoder``. Tensors inside the trunk
are channels-last (``B x H x W x C``) as upstream; the neck returns ``B x out_chans x H x W``.
Reshapes keep the batch axis as ``-1`` so the static export can leave it dynamic.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

from ..common import LayerNorm2d, Linear, MLPBlock, can_be_inplace


class ImageEncoderViT(nn.Layer):
    def __init__(
        self,
        img_size: int = 1024,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        out_chans: int = 256,
        qkv_bias: bool = True,
        norm_eps: float = 1e-6,
        act_layer: type[nn.Layer] = nn.GELU,
        use_abs_pos: bool = True,
        use_rel_pos: bool = False,
        window_size: int = 0,
        global_attn_indexes: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.img_size = img_size
        self.patch_embed = PatchEmbed(
            kernel_size=(patch_size, patch_size),
            stride=(patch_size, patch_size),
            in_chans=in_chans,
            embed_dim=embed_dim,
        )
        grid = img_size // patch_size
        self.pos_embed = None
        if use_abs_pos:
            self.pos_embed = self.create_parameter(
                [1, grid, grid, embed_dim], default_initializer=nn.initializer.Constant(0.0)
            )
        self.blocks = nn.LayerList(
            Block(
                dim=embed_dim,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                norm_eps=norm_eps,
                act_layer=act_layer,
                use_rel_pos=use_rel_pos,
                window_size=window_size if i not in global_attn_indexes else 0,
                input_size=(grid, grid),
            )
            for i in range(depth)
        )
        self.neck = nn.Sequential(
            nn.Conv2D(embed_dim, out_chans, kernel_size=1, bias_attr=False),
            LayerNorm2d(out_chans),
            nn.Conv2D(out_chans, out_chans, kernel_size=3, padding=1, bias_attr=False),
            LayerNorm2d(out_chans),
        )

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """B x 3 x img_size x img_size (normalised, padded) -> B x out_chans x H/16 x W/16."""
        x = self.patch_embed(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.neck(x.transpose([0, 3, 1, 2]))


class Block(nn.Layer):
    """Transformer block; ``window_size == 0`` means global attention."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        norm_eps: float = 1e-6,
        act_layer: type[nn.Layer] = nn.GELU,
        use_rel_pos: bool = False,
        window_size: int = 0,
        input_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, epsilon=norm_eps)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            use_rel_pos=use_rel_pos,
            input_size=input_size if window_size == 0 else (window_size, window_size),
        )
        self.norm2 = nn.LayerNorm(dim, epsilon=norm_eps)
        self.mlp = MLPBlock(embedding_dim=dim, mlp_dim=int(dim * mlp_ratio), act=act_layer)
        self.window_size = window_size

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.window_size > 0:
            H, W = x.shape[1], x.shape[2]
            x, pad_hw = window_partition(x, self.window_size)
        x = self.attn(x)
        if self.window_size > 0:
            x = window_unpartition(x, self.window_size, pad_hw, (H, W))
        x = shortcut + x
        return x + self.mlp(self.norm2(x))


class Attention(nn.Layer):
    """Multi-head attention over a ``B x H x W x C`` grid with optional decomposed rel-pos bias."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        use_rel_pos: bool = False,
        input_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = Linear(dim, dim * 3, bias_attr=None if qkv_bias else False)
        self.proj = Linear(dim, dim)
        self.use_rel_pos = use_rel_pos
        if use_rel_pos:
            if input_size is None:
                raise ValueError("input_size is required when use_rel_pos=True")
            zeros = nn.initializer.Constant(0.0)
            self.rel_pos_h = self.create_parameter(
                [2 * input_size[0] - 1, self.head_dim], default_initializer=zeros
            )
            self.rel_pos_w = self.create_parameter(
                [2 * input_size[1] - 1, self.head_dim], default_initializer=zeros
            )

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        _, H, W, C = x.shape
        nh, hd = self.num_heads, self.head_dim
        # q, k, v: (B * nh) x (H * W) x hd. Split first: Paddle's 4-D transpose is several
        # times faster than the equivalent 5-D one on CPU.
        q, k, v = (
            t.reshape([-1, H * W, nh, hd]).transpose([0, 2, 1, 3]).reshape([-1, H * W, hd])
            for t in paddle.split(self.qkv(x), 3, axis=-1)
        )
        if self.use_rel_pos:
            q_aug, k_aug = decomposed_rel_pos_qk(
                q, k, self.scale, self.rel_pos_h, self.rel_pos_w, (H, W), (H, W)
            )
            attn = paddle.matmul(q_aug, k_aug, transpose_y=True)
        else:
            attn = paddle.matmul(q * self.scale, k, transpose_y=True)
        # in place when no gradient is needed: saves a pass over the largest tensor
        attn = F.softmax_(attn, axis=-1) if can_be_inplace(attn) else F.softmax(attn, axis=-1)
        x = paddle.matmul(attn, v).reshape([-1, nh, H * W, hd]).transpose([0, 2, 1, 3])
        return self.proj(x.reshape([-1, H, W, C]))


def window_partition(x: paddle.Tensor, window_size: int) -> tuple[paddle.Tensor, tuple[int, int]]:
    """B x H x W x C -> (B * num_windows) x ws x ws x C, zero-padding H and W up to ws multiples."""
    _, H, W, C = x.shape
    pad_h = (window_size - H % window_size) % window_size
    pad_w = (window_size - W % window_size) % window_size
    # zeros concatenated rather than F.pad: the same values, and a program with Paddle's pad
    # op crashes under oneDNN in Paddle Inference 3.3.1 (a segfault in its pad kernel)
    # (zeros shaped from x itself: the batch is dynamic in exported programs)
    if pad_h > 0:
        zeros = paddle.tile(paddle.zeros_like(x[:, :1]), [1, pad_h, 1, 1])
        x = paddle.concat([x, zeros], axis=1)
    if pad_w > 0:
        zeros = paddle.tile(paddle.zeros_like(x[:, :, :1]), [1, 1, pad_w, 1])
        x = paddle.concat([x, zeros], axis=2)
    Hp, Wp = H + pad_h, W + pad_w
    ws = window_size
    # (B * nH) x ws x nW x (ws * C) -> (B * nH) x nW x ws x (ws * C): one 4-D transpose
    x = x.reshape([-1, ws, Wp // ws, ws * C]).transpose([0, 2, 1, 3])
    return x.reshape([-1, ws, ws, C]), (Hp, Wp)


def window_unpartition(
    windows: paddle.Tensor, window_size: int, pad_hw: tuple[int, int], hw: tuple[int, int]
) -> paddle.Tensor:
    """Inverse of :func:`window_partition`, dropping the padding: -> B x H x W x C."""
    Hp, Wp = pad_hw
    H, W = hw
    C = windows.shape[-1]
    ws = window_size
    x = windows.reshape([-1, Wp // ws, ws, ws * C]).transpose([0, 2, 1, 3])
    x = x.reshape([-1, Hp, Wp, C])
    if Hp > H or Wp > W:
        x = x[:, :H, :W, :]
    return x


def get_rel_pos(q_size: int, k_size: int, rel_pos: paddle.Tensor) -> paddle.Tensor:
    """Relative positional embeddings for every (query, key) pair: q_size x k_size x C."""
    max_rel_dist = int(2 * max(q_size, k_size) - 1)
    if rel_pos.shape[0] != max_rel_dist:
        # Checkpoints trained at another resolution: resample linearly along the offset axis.
        resized = F.interpolate(
            rel_pos.reshape([1, rel_pos.shape[0], -1]).transpose([0, 2, 1]),
            size=[max_rel_dist],
            mode="linear",
            align_corners=False,
            data_format="NCW",
        )
        rel_pos = resized.reshape([-1, max_rel_dist]).transpose([1, 0])
    q_coords = paddle.arange(q_size, dtype="float32")[:, None] * max(k_size / q_size, 1.0)
    k_coords = paddle.arange(k_size, dtype="float32")[None, :] * max(q_size / k_size, 1.0)
    relative = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    index = relative.astype("int64").reshape([-1])
    return paddle.index_select(rel_pos, index, axis=0).reshape([q_size, k_size, -1])


def decomposed_rel_pos_qk(
    q: paddle.Tensor,
    k: paddle.Tensor,
    scale: float,
    rel_pos_h: paddle.Tensor,
    rel_pos_w: paddle.Tensor,
    q_size: tuple[int, int],
    k_size: tuple[int, int],
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Queries and keys whose product is the attention logits with MViTv2's decomposed bias.

    Upstream computes ``attn = (q * scale) @ k^T`` and then adds ``rel_h[b, q, kh]`` and
    ``rel_w[b, q, kw]`` broadcast over the key grid: two passes over the largest tensor of
    the model (B x 4096 x 4096 in a global block), and slow broadcasts on Paddle's CPU
    kernels. The same sum comes out of one matmul if each query carries its two bias rows
    and each key the one-hot codes of its row and column:

        [q * scale, rel_h, rel_w] @ [k, onehot(row), onehot(col)]^T

    q, k: B x (h * w) x C (q unscaled, as upstream's bias uses it). Returns
    B x (q_h * q_w) x (C + k_h + k_w) and B x (k_h * k_w) x (C + k_h + k_w).
    """
    q_h, q_w = q_size
    k_h, k_w = k_size
    Rh = get_rel_pos(q_h, k_h, rel_pos_h)  # q_h x k_h x C
    Rw = get_rel_pos(q_w, k_w, rel_pos_w)  # q_w x k_w x C
    C = q.shape[-1]
    r_q = q.reshape([-1, q_h, q_w, C])
    # rel_h[b, h, w, j] = sum_c r_q[b, h, w, c] * Rh[h, j, c]: a batched matmul over h
    rq_h = r_q.transpose([1, 0, 2, 3]).reshape([q_h, -1, C])
    rel_h = paddle.matmul(rq_h, Rh, transpose_y=True).reshape([q_h, -1, q_w, k_h])
    rel_h = rel_h.transpose([1, 0, 2, 3]).reshape([-1, q_h * q_w, k_h])
    # rel_w[b, h, w, j] = sum_c r_q[b, h, w, c] * Rw[w, j, c]: a batched matmul over w
    rq_w = r_q.transpose([2, 0, 1, 3]).reshape([q_w, -1, C])
    rel_w = paddle.matmul(rq_w, Rw, transpose_y=True).reshape([q_w, -1, q_h, k_w])
    rel_w = rel_w.transpose([1, 2, 0, 3]).reshape([-1, q_h * q_w, k_w])
    q_aug = paddle.concat([q * scale, rel_h, rel_w], axis=-1)

    key = paddle.arange(k_h * k_w, dtype="int64")
    codes = paddle.concat([F.one_hot(key // k_w, k_h), F.one_hot(key % k_w, k_w)], axis=-1).astype(
        k.dtype
    )
    k_aug = paddle.concat([k, codes.unsqueeze(0).expand([k.shape[0], -1, -1])], axis=-1)
    return q_aug, k_aug


class PatchEmbed(nn.Layer):
    """Image to patch embedding: B x C x H x W -> B x H' x W' x embed_dim."""

    def __init__(
        self,
        kernel_size: tuple[int, int] = (16, 16),
        stride: tuple[int, int] = (16, 16),
        padding: tuple[int, int] = (0, 0),
        in_chans: int = 3,
        embed_dim: int = 768,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.proj = nn.Conv2D(
            in_chans,
            embed_dim,
            kernel_size=kernel_size,
            stride=stride,
            padding=padding,
            bias_attr=None if bias else False,
        )

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.proj(x).transpose([0, 2, 3, 1])
