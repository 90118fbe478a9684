"""Two-way transformer of the mask decoder (upstream: modeling/transformer.py).

Its LayerNorms use torch's default eps (1e-5), unlike the image encoder's 1e-6.
"""

from __future__ import annotations

import math

import numpy as np
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

        q = queries + query_pe  # k = keys + key_pe: keys have not changed since
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
        # Which side has few tokens, to compute the same attention in the reassociated form
        # (see ``_few_queries`` / ``_few_keys``); None = upstream's form. Set by the export.
        self.few_tokens: str | None = None

    def _separate_heads(self, x: paddle.Tensor) -> paddle.Tensor:
        """B x N x C -> B x heads x N x C/heads."""
        return x.reshape([0, 0, self.num_heads, self.internal_dim // self.num_heads]).transpose(
            [0, 2, 1, 3]
        )

    def _recombine_heads(self, x: paddle.Tensor) -> paddle.Tensor:
        """B x heads x N x C/heads -> B x N x C."""
        return x.transpose([0, 2, 1, 3]).reshape([0, 0, self.internal_dim])

    def forward(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        if self.few_tokens == "query":
            return self._few_queries(q, k, v)
        if self.few_tokens == "key":
            return self._few_keys(q, k, v)
        q = self._separate_heads(self.q_proj(q))
        k = self._separate_heads(self.k_proj(k))
        v = self._separate_heads(self.v_proj(v))
        c_per_head = self.internal_dim // self.num_heads
        attn = paddle.matmul(q, k, transpose_y=True) / math.sqrt(c_per_head)
        attn = F.softmax(attn, axis=-1)
        return self.out_proj(self._recombine_heads(paddle.matmul(attn, v)))

    # The reassociated forms. With N prompt tokens, L image tokens, D = embedding_dim, h heads
    # of c channels (h * c = internal_dim = I): upstream projects the L image tokens (L x D x I
    # per projection); here the projection matrices meet the N tokens instead, one copy per
    # head with the other heads' channels zeroed (h N x I, tiny), and the image tokens meet
    # the result in one GEMM of L x D x hN. The same attention with another summation order;
    # fewer operations while h * N < I (vit_b: 16 tokens, i.e. up to 11 prompt points): 43 %
    # less work per prompt at 7 tokens. Every weight stays 2-D (oneDNN on Paddle 3.3 fails on
    # the batched per-head weight products of the direct way of writing this).

    def _head_mask(self, dtype: str) -> paddle.Tensor:
        """h x 1 x I, a constant: 1 on head h's own channels, 0 elsewhere."""
        h, c = self.num_heads, self.internal_dim // self.num_heads
        return paddle.to_tensor(np.kron(np.eye(h), np.ones((1, c))).reshape(h, 1, -1), dtype=dtype)

    def _per_head(self, x: paddle.Tensor) -> paddle.Tensor:
        """B x N x I -> B x hN x I: one copy per head h, zero outside h's channels."""
        blocks = x.unsqueeze(1) * self._head_mask(x.dtype)  # B x h x N x I
        return blocks.reshape([x.shape[0], -1, self.internal_dim])

    def _few_queries(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        """Few queries (B x N x D), many keys and values (B x L x D)."""
        b, n = q.shape[0], q.shape[1]
        h, c = self.num_heads, self.internal_dim // self.num_heads
        qh = self._per_head(self.q_proj(q) / math.sqrt(c))  # B x hN x I
        # q_h . (W_k,h^T k + b_k,h): the bias term is the same for every key, and softmax
        # ignores a per-row constant, so it is left out
        g = paddle.matmul(qh, self.k_proj.weight, transpose_y=True)  # B x hN x D
        attn = F.softmax(paddle.matmul(g, k, transpose_y=True), axis=-1)  # B x hN x L
        # attn (v W_v + b_v) = (attn v) W_v + b_v: every row of attn sums to one; of the
        # h N x I product only each head's own channels are kept
        r = paddle.matmul(paddle.matmul(attn, v), self.v_proj.weight)  # B x hN x I
        r = r.reshape([b, h, n, self.internal_dim]) * self._head_mask(r.dtype)
        out = r.sum(axis=1) + self.v_proj.bias
        return self.out_proj(out)

    def _few_keys(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        """Many queries (B x L x D), few keys and values (B x N x D)."""
        b, n = k.shape[0], k.shape[1]
        h, c = self.num_heads, self.internal_dim // self.num_heads
        kh = self._per_head(self.k_proj(k) / math.sqrt(c))  # B x hN x I
        # (q W_q,h + b_q,h) k_h^T = q (W_q,h k_h^T) + b_q,h k_h^T, heads side by side
        m = paddle.matmul(kh, self.q_proj.weight, transpose_y=True)  # B x hN x D
        bias = paddle.matmul(kh, self.q_proj.bias).unsqueeze(1)  # B x 1 x hN
        scores = paddle.matmul(q, m, transpose_y=True) + bias
        attn = F.softmax(scores.reshape([b, -1, h, n]), axis=-1).reshape([b, -1, h * n])
        # concat_h(attn_h v_h) W_o + b_o = sum_h attn_h (v_h W_o,h + b_o / h): each head's
        # weights sum to one, so the bias rides in the small factor (no L x D add)
        p = paddle.matmul(self._per_head(self.v_proj(v)), self.out_proj.weight)  # B x hN x D
        return paddle.matmul(attn, p + self.out_proj.bias / h)
