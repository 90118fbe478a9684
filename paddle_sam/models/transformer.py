"""Two-way transformer of the mask decoder (upstream: modeling/transformer.py).

Its LayerNorms use torch's default eps (1e-5), unlike the image encoder's 1e-6.
"""

from __future__ import annotations

import math

import paddle
import paddle.nn.functional as F
from paddle import nn

from .common import Linear, MLPBlock


class TwoWayTransformer(nn.Layer):
    def __init__(
        self,
        depth: int,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int,
        activation: type[nn.Layer] = nn.ReLU,
        attention_downsample_rate: int = 2,
    ) -> None:
        super().__init__()
        self.depth = depth
        self.embedding_dim = embedding_dim
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.layers = nn.LayerList(
            TwoWayAttentionBlock(
                embedding_dim=embedding_dim,
                num_heads=num_heads,
                mlp_dim=mlp_dim,
                activation=activation,
                attention_downsample_rate=attention_downsample_rate,
                skip_first_layer_pe=(i == 0),
            )
            for i in range(depth)
        )
        self.final_attn_token_to_image = Attention(
            embedding_dim, num_heads, downsample_rate=attention_downsample_rate
        )
        self.norm_final_attn = nn.LayerNorm(embedding_dim, epsilon=1e-5)

    def forward(
        self,
        image_embedding: paddle.Tensor,
        image_pe: paddle.Tensor,
        point_embedding: paddle.Tensor,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Image B x C x H x W, its PE (same shape), tokens B x N x C.

        Returns the updated tokens (B x N x C) and image (B x HW x C).
        """
        image_embedding = image_embedding.flatten(2).transpose([0, 2, 1])
        image_pe = image_pe.flatten(2).transpose([0, 2, 1])
        queries, keys = point_embedding, image_embedding
        for layer in self.layers:
            queries, keys = layer(queries, keys, query_pe=point_embedding, key_pe=image_pe)
        q = queries + point_embedding
        k = keys + image_pe
        queries = queries + self.final_attn_token_to_image(q=q, k=k, v=keys)
        return self.norm_final_attn(queries), keys


class TwoWayAttentionBlock(nn.Layer):
    """Self-attention of tokens, then token->image and image->token cross-attention."""

    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int = 2048,
        activation: type[nn.Layer] = nn.ReLU,
        attention_downsample_rate: int = 2,
        skip_first_layer_pe: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(embedding_dim, num_heads)
        self.norm1 = nn.LayerNorm(embedding_dim, epsilon=1e-5)
        self.cross_attn_token_to_image = Attention(
            embedding_dim, num_heads, downsample_rate=attention_downsample_rate
        )
        self.norm2 = nn.LayerNorm(embedding_dim, epsilon=1e-5)
        self.mlp = MLPBlock(embedding_dim, mlp_dim, activation)
        self.norm3 = nn.LayerNorm(embedding_dim, epsilon=1e-5)
        self.norm4 = nn.LayerNorm(embedding_dim, epsilon=1e-5)
        self.cross_attn_image_to_token = Attention(
            embedding_dim, num_heads, downsample_rate=attention_downsample_rate
        )
        self.skip_first_layer_pe = skip_first_layer_pe

    def forward(
        self,
        queries: paddle.Tensor,
        keys: paddle.Tensor,
        query_pe: paddle.Tensor,
        key_pe: paddle.Tensor,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        if self.skip_first_layer_pe:
            queries = self.self_attn(q=queries, k=queries, v=queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q=q, k=q, v=queries)
        queries = self.norm1(queries)

        q = queries + query_pe
        k = keys + key_pe
        queries = self.norm2(queries + self.cross_attn_token_to_image(q=q, k=k, v=keys))

        queries = self.norm3(queries + self.mlp(queries))

        q = queries + query_pe
        k = keys + key_pe
        keys = self.norm4(keys + self.cross_attn_image_to_token(q=k, k=q, v=queries))
        return queries, keys


class Attention(nn.Layer):
    """Attention with an optional down-projection of the embedding size for q, k and v."""

    def __init__(self, embedding_dim: int, num_heads: int, downsample_rate: int = 1) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.internal_dim = embedding_dim // downsample_rate
        self.num_heads = num_heads
        if self.internal_dim % num_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must divide embedding_dim // downsample_rate "
                f"({self.internal_dim})"
            )
        self.q_proj = Linear(embedding_dim, self.internal_dim)
        self.k_proj = Linear(embedding_dim, self.internal_dim)
        self.v_proj = Linear(embedding_dim, self.internal_dim)
        self.out_proj = Linear(self.internal_dim, embedding_dim)

    def _separate_heads(self, x: paddle.Tensor) -> paddle.Tensor:
        """B x N x C -> B x heads x N x C/heads."""
        return x.reshape([0, 0, self.num_heads, self.internal_dim // self.num_heads]).transpose(
            [0, 2, 1, 3]
        )

    def _recombine_heads(self, x: paddle.Tensor) -> paddle.Tensor:
        """B x heads x N x C/heads -> B x N x C."""
        return x.transpose([0, 2, 1, 3]).reshape([0, 0, self.internal_dim])

    def forward(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        q = self._separate_heads(self.q_proj(q))
        k = self._separate_heads(self.k_proj(k))
        v = self._separate_heads(self.v_proj(v))
        c_per_head = self.internal_dim // self.num_heads
        attn = paddle.matmul(q, k, transpose_y=True) / math.sqrt(c_per_head)
        attn = F.softmax(attn, axis=-1)
        return self.out_proj(self._recombine_heads(paddle.matmul(attn, v)))
