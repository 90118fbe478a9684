"""Two-way transformer of the mask decoder (upstream: modeling/transformer.py).

Its LayerNorms use torch's default eps (1e-5), unlike the image encoder's 1e-6.
"""

from __future__ import annotations

import math

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from ..common import Linear, MLPBlock


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
        return self._final_attention(queries, keys, point_embedding, image_pe)

    def _final_attention(
        self,
        queries: paddle.Tensor,
        keys: paddle.Tensor,
        point_embedding: paddle.Tensor,
        key_pe: paddle.Tensor,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        q = queries + point_embedding
        k = keys + key_pe
        queries = queries + self.final_attn_token_to_image(q=q, k=k, v=keys)
        return self.norm_final_attn(queries), keys

    # One image, many prompts: the first block's keys are the image tokens themselves, so what
    # it computes from them alone (their projections in both cross-attentions) can be computed
    # once per image. The prompt decoder of the static runtime does this (``export/sam_v1.py``).

    def image_terms(
        self, image_embedding: paddle.Tensor, image_pe: paddle.Tensor
    ) -> list[paddle.Tensor]:
        """The prompt-independent inputs of :meth:`forward_from_image_terms`: the image tokens
        (B x HW x C) and the first block's projections of them
        (:meth:`TwoWayAttentionBlock.image_terms`)."""
        keys = image_embedding.flatten(2).transpose([0, 2, 1])
        key_pe = image_pe.flatten(2).transpose([0, 2, 1])
        return [keys, *self.layers[0].image_terms(keys, key_pe)]

    def forward_from_image_terms(
        self,
        image_terms: list[paddle.Tensor],
        key_pe: paddle.Tensor,
        point_embedding: paddle.Tensor,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """:meth:`forward` from :meth:`image_terms` of the image; key_pe is the image PE as
        tokens (B x HW x C). Same outputs."""
        keys, *first = image_terms
        queries, keys = self.layers[0].forward_from_image_terms(
            point_embedding, keys, point_embedding, first
        )
        for layer in self.layers[1:]:
            queries, keys = layer(queries, keys, query_pe=point_embedding, key_pe=key_pe)
        return self._final_attention(queries, keys, point_embedding, key_pe)


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
        queries = self._self_attention(queries, query_pe)
        q = queries + query_pe
        k = keys + key_pe
        queries = self.norm2(queries + self.cross_attn_token_to_image(q=q, k=k, v=keys))

        queries = self.norm3(queries + self.mlp(queries))

        q = queries + query_pe  # k = keys + key_pe: keys have not changed since
        keys = self.norm4(keys + self.cross_attn_image_to_token(q=k, k=q, v=queries))
        return queries, keys

    def _self_attention(self, queries: paddle.Tensor, query_pe: paddle.Tensor) -> paddle.Tensor:
        if self.skip_first_layer_pe:
            queries = self.self_attn(q=queries, k=queries, v=queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q=q, k=q, v=queries)
        return self.norm1(queries)

    def image_terms(self, keys: paddle.Tensor, key_pe: paddle.Tensor) -> list[paddle.Tensor]:
        """What this block computes from its keys alone (keys: B x HW x C): the token->image
        keys (B x h x c x HW) and values (B x h x HW x c), the image->token queries
        (B x h x c x HW), per head, biases included."""
        k = keys + key_pe
        t2i, i2t = self.cross_attn_token_to_image, self.cross_attn_image_to_token
        return [
            t2i._separate_heads(t2i.k_proj(k)).transpose([0, 1, 3, 2]),
            t2i._separate_heads(t2i.v_proj(keys)),
            i2t._separate_heads(i2t.q_proj(k)).transpose([0, 1, 3, 2]),
        ]

    def forward_from_image_terms(
        self, queries: paddle.Tensor, keys: paddle.Tensor, query_pe: paddle.Tensor, terms
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """:meth:`forward` with the keys' projections given (:meth:`image_terms`); keys are
        needed only for the residual."""
        t2i_k, t2i_v, i2t_q = terms
        queries = self._self_attention(queries, query_pe)
        attn = self.cross_attn_token_to_image.attend_projected_keys(
            queries + query_pe, t2i_k, t2i_v
        )
        queries = self.norm2(queries + attn)
        queries = self.norm3(queries + self.mlp(queries))
        q = queries + query_pe
        attn = self.cross_attn_image_to_token.attend_projected_queries(i2t_q, q, queries)
        return queries, self.norm4(keys + attn)


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
        self._head_masks: dict[tuple[str, str], paddle.Tensor] = {}

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

    def _head_mask(self, like: paddle.Tensor) -> paddle.Tensor:
        """h x 1 x I, a constant of ``like``'s dtype: 1 on head h's own channels, 0
        elsewhere (kept between dygraph calls: building it took a fifth of a millisecond,
        seven times a prompt; a traced program holds it as its own constant)."""
        dynamic = paddle.in_dynamic_mode()
        key = (str(like.dtype), str(like.place)) if dynamic else None
        if key in self._head_masks:
            return self._head_masks[key]
        h, c = self.num_heads, self.internal_dim // self.num_heads
        mask = np.kron(np.eye(h), np.ones((1, c))).reshape(h, 1, -1)
        if not dynamic:
            return paddle.to_tensor(mask, dtype=like.dtype)
        self._head_masks[key] = paddle.to_tensor(mask, dtype=like.dtype, place=like.place)
        return self._head_masks[key]

    def _per_head(self, x: paddle.Tensor) -> paddle.Tensor:
        """B x N x I -> B x hN x I: one copy per head h, zero outside h's channels."""
        blocks = x.unsqueeze(1) * self._head_mask(x)  # B x h x N x I
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
        r = r.reshape([b, h, n, self.internal_dim]) * self._head_mask(r)
        out = r.sum(axis=1) + self.v_proj.bias
        return self.out_proj(out)

    def _few_keys(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        """Many queries (B x L x D), few keys and values (B x N x D)."""
        b, length = q.shape[0], q.shape[1]
        h, c = self.num_heads, self.internal_dim // self.num_heads
        kh = self._per_head(self.k_proj(k) / math.sqrt(c))  # B x hN x I
        # (q W_q,h + b_q,h) k_h^T = (W_q,h k_h^T)^T q^T + b_q,h k_h^T, heads stacked; scores
        # as B x h x N x L: the softmax over the N keys (axis 2) then vectorises along the
        # long contiguous L axis (oneDNN's softmax over a last axis of N ~ 7 was 2.5x slower)
        m = paddle.matmul(kh, self.q_proj.weight, transpose_y=True)  # B x hN x D
        bias = paddle.matmul(kh, self.q_proj.bias).unsqueeze(-1)  # B x hN x 1
        scores = paddle.matmul(m, q, transpose_y=True) + bias  # B x hN x L
        return self._image_query_output(scores.reshape([b, h, -1, length]), v)

    def _image_query_output(self, scores: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        """Softmax over the few keys of scores (B x h x N x L) and the output (B x L x D)."""
        b, h, length = scores.shape[0], self.num_heads, scores.shape[-1]
        attn = F.softmax(scores, axis=2).reshape([b, -1, length])  # B x hN x L
        # concat_h(attn_h v_h) W_o + b_o = sum_h attn_h (v_h W_o,h + b_o / h): each head's
        # weights sum to one, so the bias rides in the small factor (no L x D add)
        p = paddle.matmul(self._per_head(self.v_proj(v)), self.out_proj.weight)  # B x hN x D
        return paddle.matmul(attn, p + self.out_proj.bias / h, transpose_x=True)

    # The same attention with the image side projected beforehand (per head, biases included;
    # ``TwoWayAttentionBlock.image_terms``): only the few tokens are projected per call.

    def attend_projected_keys(
        self, q: paddle.Tensor, keys_t: paddle.Tensor, values: paddle.Tensor
    ) -> paddle.Tensor:
        """Few queries (B x N x D) over keys and values already projected: keys_t
        B x h x c x L, values B x h x L x c. Returns B x N x D."""
        c = self.internal_dim // self.num_heads
        qh = self._separate_heads(self.q_proj(q) / math.sqrt(c))  # B x h x N x c
        attn = F.softmax(paddle.matmul(qh, keys_t), axis=-1)  # B x h x N x L
        return self.out_proj(self._recombine_heads(paddle.matmul(attn, values)))

    def attend_projected_queries(
        self, queries_t: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor
    ) -> paddle.Tensor:
        """Queries already projected (B x h x c x L) over few keys and values (B x N x D).
        Returns B x L x D."""
        c = self.internal_dim // self.num_heads
        kh = self._separate_heads(self.k_proj(k) / math.sqrt(c))  # B x h x N x c
        return self._image_query_output(paddle.matmul(kh, queries_t), v)  # scores B x h x N x L
