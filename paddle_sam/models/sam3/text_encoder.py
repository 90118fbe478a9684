"""Causal text transformer of SAM 3 (upstream: sam3/model/text_encoder_ve.py).

A CLIP-style text tower: token + position embeddings, pre-norm residual attention blocks
with a causal mask, a final LayerNorm; ``VETextEncoder`` adds the tokenizer and a Linear
``resizer`` to the detector's width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import paddle
from paddle import nn

from ..common import Linear
from .model_misc import LayerScale, MultiheadAttention


class ResidualAttentionBlock(nn.Layer):
    """``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``, on ``B x L x d_model``."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        mlp_ratio: float = 4.0,
        ls_init_value: float | None = None,
        act_layer: type[nn.Layer] = nn.GELU,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.attn = MultiheadAttention(d_model, n_head, batch_first=True)
        self.ln_1 = nn.LayerNorm(d_model, epsilon=norm_eps)
        self.ln_2 = nn.LayerNorm(d_model, epsilon=norm_eps)
        self.ls_1 = LayerScale(d_model, ls_init_value) if ls_init_value is not None else None
        self.ls_2 = LayerScale(d_model, ls_init_value) if ls_init_value is not None else None
        width = int(d_model * mlp_ratio)
        self.mlp = nn.Sequential(
            ("c_fc", Linear(d_model, width)),
            ("gelu", act_layer()),
            ("c_proj", Linear(width, d_model)),
        )

    def forward(self, x: paddle.Tensor, attn_mask: paddle.Tensor | None = None) -> paddle.Tensor:
        h = self.ln_1(x)
        h = self.attn(h, h, h, need_weights=False, attn_mask=attn_mask)[0]
        x = x + (self.ls_1(h) if self.ls_1 is not None else h)
        h = self.mlp(self.ln_2(x))
        return x + (self.ls_2(h) if self.ls_2 is not None else h)


class Transformer(nn.Layer):
    def __init__(
        self,
        width: int,
        layers: int,
        heads: int,
        mlp_ratio: float = 4.0,
        ls_init_value: float | None = None,
        act_layer: type[nn.Layer] = nn.GELU,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.width = width
        self.layers = layers
        self.resblocks = nn.LayerList(
            ResidualAttentionBlock(width, heads, mlp_ratio, ls_init_value, act_layer, norm_eps)
            for _ in range(layers)
        )

    def forward(self, x: paddle.Tensor, attn_mask: paddle.Tensor | None = None) -> paddle.Tensor:
        for block in self.resblocks:
            x = block(x, attn_mask=attn_mask)
        return x


def causal_mask(n: int) -> paddle.Tensor:
    """``n x n`` additive mask: 0 on and below the diagonal, -inf above."""
    return paddle.triu(paddle.full([n, n], float("-inf"), "float32"), diagonal=1)


class TextTransformer(nn.Layer):
    """Token ids ``B x L`` -> ``(pooled, tokens)``; ``tokens`` is ``B x L x width`` after
    ``ln_final``; ``pooled`` is pooled by ``pool_type`` ("none": every token) and projected
    by ``text_projection`` (a ``width x output_dim`` matrix, or a Linear with ``proj_bias``)."""

    def __init__(
        self,
        context_length: int = 77,
        vocab_size: int = 49408,
        width: int = 512,
        heads: int = 8,
        layers: int = 12,
        mlp_ratio: float = 4.0,
        ls_init_value: float | None = None,
        output_dim: int = 512,
        no_causal_mask: bool = False,
        pool_type: str = "none",
        proj_bias: bool = False,
        act_layer: type[nn.Layer] = nn.GELU,
        norm_eps: float = 1e-5,
        output_tokens: bool = False,
        use_ln_post: bool = True,
    ) -> None:
        super().__init__()
        if pool_type not in ("first", "last", "argmax", "none"):
            raise ValueError(f"unknown pool_type {pool_type!r}")
        self.output_tokens = output_tokens
        self.num_pos = self.context_length = context_length
        self.vocab_size = vocab_size
        self.width = width
        self.output_dim = output_dim
        self.heads = heads
        self.pool_type = pool_type
        self.no_causal_mask = no_causal_mask
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = self.create_parameter(
            [context_length, width], default_initializer=nn.initializer.Normal(std=0.01)
        )
        self.transformer = Transformer(
            width, layers, heads, mlp_ratio, ls_init_value, act_layer, norm_eps
        )
        self.ln_final = nn.LayerNorm(width, epsilon=norm_eps) if use_ln_post else nn.Identity()
        if proj_bias:
            self.text_projection = Linear(width, output_dim)
        else:
            self.text_projection = self.create_parameter(
                [width, output_dim], default_initializer=nn.initializer.Normal(std=width**-0.5)
            )

    def forward(self, text: paddle.Tensor) -> paddle.Tensor | tuple[paddle.Tensor, paddle.Tensor]:
        if text.ndim != 2:
            raise ValueError(f"expected B x L token ids, got shape {text.shape}")
        seq_len = text.shape[1]
        if seq_len > self.num_pos:
            raise ValueError(f"{seq_len} tokens exceed the context length {self.num_pos}")
        x = self.token_embedding(text) + self.positional_embedding[:seq_len]
        mask = None if self.no_causal_mask else causal_mask(seq_len).astype(x.dtype)
        x = self.ln_final(self.transformer(x, attn_mask=mask))
        if self.pool_type == "first":
            pooled, tokens = x[:, 0], x[:, 1:]
        elif self.pool_type == "last":
            pooled, tokens = x[:, -1], x[:, :-1]
        elif self.pool_type == "argmax":
            # the end-of-text token has the largest id in each row
            index = paddle.stack([paddle.arange(x.shape[0]), text.argmax(axis=-1)], axis=-1)
            pooled, tokens = paddle.gather_nd(x, index), x
        else:
            pooled = tokens = x
        if isinstance(self.text_projection, nn.Layer):
            pooled = self.text_projection(pooled)
        else:
            pooled = paddle.matmul(pooled, self.text_projection)
        return (pooled, tokens) if self.output_tokens else pooled


class VETextEncoder(nn.Layer):
    """Text prompts -> ``(padding mask B x L, memory L x B x d_model, embeds L x B x width)``.

    ``forward`` tokenizes a list of strings with ``tokenizer`` (padding mask: True where the
    token id is 0) or passes an already encoded ``(mask, memory, {"inputs_embeds": ...})``
    through; :meth:`encode_tokens` is the tensor-only path (token ids in), used for export.
    """

    def __init__(
        self,
        d_model: int,
        tokenizer: Callable[..., object] | None,
        width: int = 1024,
        heads: int = 16,
        layers: int = 24,
        context_length: int = 32,
        vocab_size: int = 49408,
        use_ln_post: bool = True,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.use_ln_post = use_ln_post
        self.tokenizer = tokenizer
        self.encoder = TextTransformer(
            context_length=context_length,
            vocab_size=vocab_size,
            width=width,
            heads=heads,
            layers=layers,
            output_tokens=True,
            use_ln_post=use_ln_post,
        )
        self.resizer = Linear(width, d_model)

    def tokenize(self, text: Sequence[str]) -> paddle.Tensor:
        if self.tokenizer is None:
            raise ValueError("this text encoder has no tokenizer; pass token ids to encode_tokens")
        ids = self.tokenizer(list(text), context_length=self.context_length)
        return paddle.to_tensor(ids, dtype="int64")

    def encode_tokens(
        self, tokenized: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """Token ids ``B x L`` -> (padding mask ``B x L`` bool, ``L x B x d_model``,
        ``L x B x width`` token embeddings before the transformer)."""
        inputs_embeds = self.encoder.token_embedding(tokenized)
        _, text_memory = self.encoder(tokenized)
        padding = tokenized == 0
        memory = self.resizer(text_memory.transpose([1, 0, 2]))
        return padding, memory, inputs_embeds.transpose([1, 0, 2])

    def forward(
        self,
        text: Sequence[str] | tuple[paddle.Tensor, paddle.Tensor, dict],
        input_boxes: Sequence | None = None,
        device: object = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        if isinstance(text, str):
            raise TypeError("text must be a list of strings, not a single string")
        if len(text) == 0:
            raise ValueError("no text to encode")
        if isinstance(text[0], str):
            if input_boxes is not None and len(input_boxes) > 0:
                raise ValueError("boxes inside the text prompt are not supported")
            return self.encode_tokens(self.tokenize(text))
        if input_boxes is not None and len(input_boxes) > 0:
            raise ValueError("cannot replace boxes in text that is already encoded")
        mask, memory, tokenized = text
        return mask, memory, tokenized["inputs_embeds"].transpose([1, 0, 2])
