"""Memory attention of the SAM 3 tracker: the current frame's features attend to themselves
and to the memory bank (past frames' memories and object pointers).

Upstream: ``RoPEAttention`` (sam3/sam/transformer.py, with its ``Attention`` base) and
``TransformerEncoderCrossAttention``, ``TransformerDecoderLayerv1``/``v2``
(sam3/model/decoder.py). Module and parameter names are upstream's (Linear weights
``[in, out]``), so the checkpoint's ``tracker.transformer.encoder.*`` keys load as they are.

Upstream writes the 2-D axial RoPE with complex numbers; here it is the same rotation of
adjacent channel pairs with real cos/sin tables (:func:`.vitdet.apply_rope`), so the layers
export to static graphs. The tables are non-persistent buffers (upstream keeps them as plain
attributes: the checkpoint has none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
from paddle import nn

from ..common import Linear
from .model_misc import (
    attend_in_row_blocks,
    fused_self_attention,
    get_activation_fn,
    get_clones,
    is_static_size,
    use_fused_attention,
)
from .vitdet import apply_rope, axial_rope_angles, rope_tables


def _dropout(p: float) -> nn.Layer:
    return nn.Dropout(p) if p > 0 else nn.Identity()


class Attention(nn.Layer):
    """Multi-head attention with separate q/k/v projections, optionally to a smaller internal
    width (``downsample_rate``) and from ``kv_in_dim`` keys/values. Inputs ``B x N x C``."""

    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        downsample_rate: int = 1,
        dropout: float = 0.0,
        kv_in_dim: int | None = None,
        use_fa3: bool = False,
    ) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.kv_in_dim = kv_in_dim if kv_in_dim is not None else embedding_dim
        self.internal_dim = embedding_dim // downsample_rate
        self.num_heads = num_heads
        self.use_fa3 = use_fa3  # accepted for signature compatibility (a CUDA kernel upstream)
        if self.internal_dim % num_heads != 0:
            raise ValueError("num_heads must divide embedding_dim.")
        self.q_proj = Linear(embedding_dim, self.internal_dim)
        self.k_proj = Linear(self.kv_in_dim, self.internal_dim)
        self.v_proj = Linear(self.kv_in_dim, self.internal_dim)
        self.out_proj = Linear(self.internal_dim, embedding_dim)
        self.dropout_p = dropout
        # see model_misc.use_fused_attention (None: Paddle's fused CPU kernel when it applies)
        self.fused_attention: bool | None = None

    def _separate_heads(self, x: paddle.Tensor) -> paddle.Tensor:
        b, n, c = x.shape
        h = self.num_heads
        return x.reshape([b, n, h, c // h]).transpose([0, 2, 1, 3])  # B x h x N x d

    def _recombine_heads(self, x: paddle.Tensor) -> paddle.Tensor:
        b, h, n, d = x.shape
        return x.transpose([0, 2, 1, 3]).reshape([b, n, h * d])

    def _fold_values(self, q: paddle.Tensor, n_q: object, n_k: object) -> bool:
        """Whether ``v_proj`` is applied after the attention instead of before it.

        With one head, ``softmax(s) (x W + b) = (softmax(s) x) W + b`` (the weights of a row
        sum to 1), so the values can be averaged at ``kv_in_dim`` channels and projected once
        per query: the memory cross-attention's weights (4096 x ~25k) then multiply 64-channel
        memories instead of 256-channel values, a quarter of that product, and ``v_proj`` runs
        on 4096 rows instead of ~25k. The same values to rounding (tested against the
        projected form); not with dropout on the weights (training), whose rows do not sum
        to 1, nor where the fused kernel (equal lengths) runs."""
        if self.num_heads != 1 or self.kv_in_dim >= self.internal_dim:
            return False
        if self.training and self.dropout_p > 0:
            return False
        return not use_fused_attention(self.fused_attention, q, n_q, n_k)

    def _attend(
        self,
        q: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
        v_proj: nn.Layer | None = None,
    ) -> paddle.Tensor:
        """``softmax(q k^T / sqrt(d)) v`` of ``B x h x N x d`` tensors -> ``B x N x h*d``
        (then ``out_proj``), in query-row blocks (:func:`.model_misc.attend_in_row_blocks`):
        the memory cross-attention's 5184 x ~36k matrix is never materialised at once.
        ``v_proj``: the values are unprojected and this projects the result
        (:meth:`_fold_values`)."""
        b, h, n_q, d = q.shape
        n_k = k.shape[2]
        dropout = self.training and self.dropout_p > 0
        scale = 1.0 / math.sqrt(d)
        if (
            v_proj is None
            and not dropout
            and use_fused_attention(self.fused_attention, q, n_q, n_k)
        ):
            qkv = paddle.stack([t.transpose([0, 2, 1, 3]) for t in (q, k, v)], axis=2)
            out = fused_self_attention(qkv, scale).reshape([b, n_q, h * d])
            return self.out_proj(out)
        out = attend_in_row_blocks(q * scale, k, v, dropout_p=self.dropout_p if dropout else 0.0)
        out = self._recombine_heads(out)
        return self.out_proj(out if v_proj is None else v_proj(out))

    def _project(
        self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, nn.Layer | None]:
        """Heads of the projected q and k, and v: projected, or (one head, see
        :meth:`_fold_values`) as given, with ``v_proj`` returned to apply after the attention."""
        q = self._separate_heads(self.q_proj(q))
        k = self._separate_heads(self.k_proj(k))
        if self._fold_values(q, q.shape[2], k.shape[2]):
            return q, k, v.unsqueeze(1), self.v_proj
        return q, k, self._separate_heads(self.v_proj(v)), None

    def forward(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        q, k, v, v_proj = self._project(q, k, v)
        return self._attend(q, k, v, v_proj)


class RoPEAttention(Attention):
    """Attention with 2-D axial rotary position encoding on queries and keys.

    The queries are a square ``w x w`` grid (tables built for ``feat_sizes``, recomputed for
    another square size as upstream). With ``rope_k_repeat`` the keys may be several grids
    of the query size in a row (memories of past frames), each rotated like the queries;
    the last ``num_k_exclude_rope`` keys (object pointers) are not rotated.
    """

    def __init__(
        self,
        *args: Any,
        rope_theta: float = 10000.0,
        rope_k_repeat: bool = False,
        feat_sizes: Sequence[int] = (64, 64),
        use_rope_real: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.use_rope_real = use_rope_real  # same rotation either way here
        self.rope_theta = rope_theta
        self.rope_k_repeat = rope_k_repeat
        self.head_dim = self.internal_dim // self.num_heads
        end_x, end_y = int(feat_sizes[0]), int(feat_sizes[1])
        cos, sin, swap = self._tables(end_x, end_y)
        self.register_buffer("rope_cos", paddle.to_tensor(cos), persistable=False)
        self.register_buffer("rope_sin", paddle.to_tensor(sin), persistable=False)
        self.register_buffer("rope_swap", paddle.to_tensor(swap), persistable=False)
        self._table_cache: dict[int, tuple[paddle.Tensor, paddle.Tensor]] = {}

    def _tables(self, end_x: int, end_y: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        angles = axial_rope_angles(self.head_dim, end_x, end_y, self.rope_theta)
        return rope_tables(angles)

    def _cos_sin(self, n: int) -> tuple[paddle.Tensor, paddle.Tensor]:
        """cos/sin tables (``n x head_dim``) for ``n`` query tokens."""
        if self.rope_cos.shape[0] == n:
            return self.rope_cos, self.rope_sin
        if not is_static_size(n):
            raise ValueError("RoPEAttention needs the query length fixed at export")
        if n not in self._table_cache:
            w = math.isqrt(n)
            if w * w != n:
                raise ValueError(f"{n} query tokens are not a square grid")
            cos, sin, _ = self._tables(w, w)
            self._table_cache[n] = (paddle.to_tensor(cos), paddle.to_tensor(sin))
        return self._table_cache[n]

    def forward(
        self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, num_k_exclude_rope: int = 0
    ) -> paddle.Tensor:
        q, k, v, v_proj = self._project(q, k, v)
        n_q, n_k = q.shape[2], k.shape[2]
        if n_q != n_k and not self.rope_k_repeat:
            raise ValueError(f"{n_q} queries and {n_k} keys need rope_k_repeat")
        cos, sin = self._cos_sin(n_q)
        dtype = q.dtype
        q = apply_rope(q.astype("float32"), cos, sin, self.rope_swap).astype(dtype)
        if not (is_static_size(n_k) and is_static_size(num_k_exclude_rope)):
            k = self._rotate_traced_keys(k, cos, sin, num_k_exclude_rope)
            return self._attend(q, k, v, v_proj)
        num_k_rope = n_k - num_k_exclude_rope
        if num_k_rope > 0:
            r = num_k_rope // n_q if self.rope_k_repeat else 1
            if r * n_q != num_k_rope:
                raise ValueError(
                    f"{num_k_rope} rotated keys are not a whole number of {n_q}-token grids"
                )
            if r > 1:
                cos, sin = cos.tile([r, 1]), sin.tile([r, 1])
            k_rope = k if num_k_exclude_rope == 0 else k[:, :, :num_k_rope]
            k_rope = apply_rope(k_rope.astype("float32"), cos, sin, self.rope_swap).astype(dtype)
            k = (
                k_rope
                if num_k_exclude_rope == 0
                else paddle.concat([k_rope, k[:, :, num_k_rope:]], axis=2)
            )
        return self._attend(q, k, v, v_proj)

    def _rotate_traced_keys(
        self, k: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, num_k_exclude_rope: Any
    ) -> paddle.Tensor:
        """The keys rotated in a static graph whose number of keys (memories) and of object
        pointers are known at run time only (the memory attention's export): the rotated
        keys, whole grids of the query size (``rope_k_repeat``), rotated with the tables
        broadcast over the grids; the last ``num_k_exclude_rope`` keys as they are."""
        if not self.rope_k_repeat:
            raise ValueError("keys of a length known at run time need rope_k_repeat")
        shape = paddle.shape(k)
        b, h, d = shape[0], shape[1], k.shape[3]
        num_k_rope = shape[2] - num_k_exclude_rope
        grids = k[:, :, :num_k_rope].reshape([b, h, -1, cos.shape[0], d])
        grids = apply_rope(grids.astype("float32"), cos, sin, self.rope_swap).astype(k.dtype)
        return paddle.concat([grids.reshape([b, h, -1, d]), k[:, :, num_k_rope:]], axis=2)


class TransformerDecoderLayerv1(nn.Layer):
    """Self-attention, image cross-attention, FFN; pre- or post-norm. The attentions here take
    ``torch.nn.MultiheadAttention``'s call (our :class:`.model_misc.MultiheadAttention`)."""

    def __init__(
        self,
        activation: str,
        cross_attention: nn.Layer,
        d_model: int,
        dim_feedforward: int,
        dropout: float,
        pos_enc_at_attn: bool,
        pos_enc_at_cross_attn_keys: bool,
        pos_enc_at_cross_attn_queries: bool,
        pre_norm: bool,
        self_attention: nn.Layer,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.dim_feedforward = dim_feedforward
        self.dropout_value = dropout
        self.self_attn = self_attention
        self.cross_attn_image = cross_attention
        self.linear1 = Linear(d_model, dim_feedforward)
        self.dropout = _dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = _dropout(dropout)
        self.dropout2 = _dropout(dropout)
        self.dropout3 = _dropout(dropout)
        self.activation_str = activation
        self.activation = get_activation_fn(activation)
        self.pre_norm = pre_norm
        self.pos_enc_at_attn = pos_enc_at_attn
        self.pos_enc_at_cross_attn_queries = pos_enc_at_cross_attn_queries
        self.pos_enc_at_cross_attn_keys = pos_enc_at_cross_attn_keys

    def _ffn(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward_post(
        self,
        tgt: paddle.Tensor,
        memory: paddle.Tensor,
        tgt_mask: paddle.Tensor | None = None,
        memory_mask: paddle.Tensor | None = None,
        tgt_key_padding_mask: paddle.Tensor | None = None,
        memory_key_padding_mask: paddle.Tensor | None = None,
        pos: paddle.Tensor | None = None,
        query_pos: paddle.Tensor | None = None,
        **kwargs: Any,
    ) -> paddle.Tensor:
        q = k = tgt + query_pos if self.pos_enc_at_attn else tgt
        tgt2 = self.self_attn(q, k, tgt, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask)[
            0
        ]
        tgt = self.norm1(tgt + self.dropout1(tgt2))
        tgt2 = self.cross_attn_image(
            tgt + query_pos if self.pos_enc_at_cross_attn_queries else tgt,
            memory + pos if self.pos_enc_at_cross_attn_keys else memory,
            memory,
            attn_mask=memory_mask,
            key_padding_mask=memory_key_padding_mask,
        )[0]
        tgt = self.norm2(tgt + self.dropout2(tgt2))
        return self.norm3(tgt + self.dropout3(self._ffn(tgt)))

    def forward_pre(
        self,
        tgt: paddle.Tensor,
        memory: paddle.Tensor,
        dac: bool = False,
        tgt_mask: paddle.Tensor | None = None,
        memory_mask: paddle.Tensor | None = None,
        tgt_key_padding_mask: paddle.Tensor | None = None,
        memory_key_padding_mask: paddle.Tensor | None = None,
        pos: paddle.Tensor | None = None,
        query_pos: paddle.Tensor | None = None,
        attn_bias: paddle.Tensor | None = None,
        **kwargs: Any,
    ) -> paddle.Tensor:
        if dac:  # self-attention over the first half of the queries only
            half = tgt.shape[0] // 2
            other_tgt, tgt = tgt[half:], tgt[:half]
        tgt2 = self.norm1(tgt)
        q = k = tgt2 + query_pos if self.pos_enc_at_attn else tgt2
        tgt2 = self.self_attn(
            q, k, tgt2, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask
        )[0]
        tgt = tgt + self.dropout1(tgt2)
        if dac:
            tgt = paddle.concat((tgt, other_tgt), axis=0)
        tgt2 = self.norm2(tgt)
        extra = {} if attn_bias is None else {"attn_bias": attn_bias}
        tgt2 = self.cross_attn_image(
            tgt2 + query_pos if self.pos_enc_at_cross_attn_queries else tgt2,
            memory + pos if self.pos_enc_at_cross_attn_keys else memory,
            memory,
            attn_mask=memory_mask,
            key_padding_mask=memory_key_padding_mask,
            **extra,
        )[0]
        tgt = tgt + self.dropout2(tgt2)
        return tgt + self.dropout3(self._ffn(self.norm3(tgt)))

    def forward(
        self,
        tgt: paddle.Tensor,
        memory: paddle.Tensor,
        dac: bool = False,
        tgt_mask: paddle.Tensor | None = None,
        memory_mask: paddle.Tensor | None = None,
        tgt_key_padding_mask: paddle.Tensor | None = None,
        memory_key_padding_mask: paddle.Tensor | None = None,
        pos: paddle.Tensor | None = None,
        query_pos: paddle.Tensor | None = None,
        attn_bias: paddle.Tensor | None = None,
        **kwds: Any,
    ) -> paddle.Tensor:
        fwd_fn = self.forward_pre if self.pre_norm else self.forward_post
        return fwd_fn(
            tgt,
            memory,
            dac=dac,
            tgt_mask=tgt_mask,
            memory_mask=memory_mask,
            tgt_key_padding_mask=tgt_key_padding_mask,
            memory_key_padding_mask=memory_key_padding_mask,
            pos=pos,
            query_pos=query_pos,
            attn_bias=attn_bias,
            **kwds,
        )


class TransformerDecoderLayerv2(TransformerDecoderLayerv1):
    """The memory-attention layer: pre-norm self-attention and cross-attention (either order)
    with :class:`RoPEAttention`-style ``(q, k, v)`` attentions, then the FFN. Batch-first
    ``B x N x C``; masks and attention biases are not supported (as upstream)."""

    def __init__(self, cross_attention_first: bool = False, *args: Any, **kwds: Any) -> None:
        super().__init__(*args, **kwds)
        self.cross_attention_first = cross_attention_first

    def _forward_sa(self, tgt: paddle.Tensor, query_pos: paddle.Tensor | None) -> paddle.Tensor:
        tgt2 = self.norm1(tgt)
        q = k = tgt2 + query_pos if self.pos_enc_at_attn else tgt2
        return tgt + self.dropout1(self.self_attn(q, k, tgt2))

    def _forward_ca(
        self,
        tgt: paddle.Tensor,
        memory: paddle.Tensor,
        query_pos: paddle.Tensor | None,
        pos: paddle.Tensor | None,
        num_k_exclude_rope: int = 0,
    ) -> paddle.Tensor:
        if self.cross_attn_image is None:
            return tgt
        kwds = {}
        # a tensor in a static graph traced for any number of object pointers (the export)
        if not is_static_size(num_k_exclude_rope) or num_k_exclude_rope > 0:
            if not isinstance(self.cross_attn_image, RoPEAttention):
                raise TypeError("num_k_exclude_rope needs a RoPEAttention cross-attention")
            kwds = {"num_k_exclude_rope": num_k_exclude_rope}
        tgt2 = self.norm2(tgt)
        tgt2 = self.cross_attn_image(
            tgt2 + query_pos if self.pos_enc_at_cross_attn_queries else tgt2,
            memory + pos if self.pos_enc_at_cross_attn_keys else memory,
            memory,
            **kwds,
        )
        return tgt + self.dropout2(tgt2)

    def forward_pre(
        self,
        tgt: paddle.Tensor,
        memory: paddle.Tensor,
        dac: bool = False,
        tgt_mask: paddle.Tensor | None = None,
        memory_mask: paddle.Tensor | None = None,
        tgt_key_padding_mask: paddle.Tensor | None = None,
        memory_key_padding_mask: paddle.Tensor | None = None,
        pos: paddle.Tensor | None = None,
        query_pos: paddle.Tensor | None = None,
        attn_bias: paddle.Tensor | None = None,
        num_k_exclude_rope: int = 0,
    ) -> paddle.Tensor:
        unsupported = (tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask)
        if dac or attn_bias is not None or any(m is not None for m in unsupported):
            raise ValueError("TransformerDecoderLayerv2 takes no dac, masks or attn_bias")
        if self.cross_attention_first:
            tgt = self._forward_ca(tgt, memory, query_pos, pos, num_k_exclude_rope)
            tgt = self._forward_sa(tgt, query_pos)
        else:
            tgt = self._forward_sa(tgt, query_pos)
            tgt = self._forward_ca(tgt, memory, query_pos, pos, num_k_exclude_rope)
        return tgt + self.dropout3(self._ffn(self.norm3(tgt)))

    def forward(self, *args: Any, **kwds: Any) -> paddle.Tensor:
        if self.pre_norm:
            return self.forward_pre(*args, **kwds)
        raise NotImplementedError("TransformerDecoderLayerv2 is pre-norm only")


class TransformerEncoderCrossAttention(nn.Layer):
    """The memory attention: ``num_layers`` layers of self-attention over the current frame's
    tokens and cross-attention to the memory bank (``prompt``), then a LayerNorm.

    Inputs are sequence-first (``N x B x C``), as upstream; ``batch_first`` says whether the
    layers expect ``B x N x C`` (they do in the tracker). ``src_pos`` is added (x 0.1) to the
    input when ``pos_enc_at_input``. ``num_obj_ptr_tokens``: the last keys of ``prompt`` that
    are object pointers (not rotated by RoPE).
    """

    def __init__(
        self,
        d_model: int,
        frozen: bool,
        pos_enc_at_input: bool,
        layer: nn.Layer,
        num_layers: int,
        use_act_checkpoint: bool = False,
        batch_first: bool = False,
        remove_cross_attention_layers: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.layers = get_clones(layer, num_layers)
        self.num_layers = num_layers
        self.norm = nn.LayerNorm(d_model)
        self.pos_enc_at_input = pos_enc_at_input
        self.use_act_checkpoint = use_act_checkpoint
        if frozen:
            for p in self.parameters():
                p.stop_gradient = True
        self.batch_first = batch_first
        self.remove_cross_attention_layers = [False] * num_layers
        for i in remove_cross_attention_layers or []:
            self.remove_cross_attention_layers[i] = True
        for i, remove in enumerate(self.remove_cross_attention_layers):
            if remove:
                self.layers[i].cross_attn_image = None
                self.layers[i].norm2 = None
                self.layers[i].dropout2 = None

    def forward(
        self,
        src: paddle.Tensor | list[paddle.Tensor],
        prompt: paddle.Tensor,
        src_mask: paddle.Tensor | None = None,
        prompt_mask: paddle.Tensor | None = None,
        src_key_padding_mask: Any = None,
        prompt_key_padding_mask: paddle.Tensor | None = None,
        src_pos: paddle.Tensor | list[paddle.Tensor] | None = None,
        prompt_pos: paddle.Tensor | None = None,
        feat_sizes: list | None = None,
        num_obj_ptr_tokens: int = 0,
    ) -> dict[str, Any]:
        if isinstance(src, list):
            if not (isinstance(src_key_padding_mask, list) and isinstance(src_pos, list)):
                raise ValueError("src, src_key_padding_mask and src_pos are lists together")
            if not len(src) == len(src_key_padding_mask) == len(src_pos) == 1:
                raise ValueError("one level of src is supported")
            src, src_key_padding_mask, src_pos = src[0], src_key_padding_mask[0], src_pos[0]
        if src.shape[1] != prompt.shape[1]:
            raise ValueError("Batch size must be the same for src and prompt")
        output = src
        if self.pos_enc_at_input and src_pos is not None:
            output = output + 0.1 * src_pos
        if self.batch_first:
            output = output.transpose([1, 0, 2])
            src_pos = src_pos.transpose([1, 0, 2])
            prompt = prompt.transpose([1, 0, 2])
            prompt_pos = prompt_pos.transpose([1, 0, 2])
        for layer in self.layers:
            kwds = {}
            if isinstance(layer.cross_attn_image, RoPEAttention):
                kwds = {"num_k_exclude_rope": num_obj_ptr_tokens}
            output = layer(
                tgt=output,
                memory=prompt,
                tgt_mask=src_mask,
                memory_mask=prompt_mask,
                tgt_key_padding_mask=src_key_padding_mask,
                memory_key_padding_mask=prompt_key_padding_mask,
                pos=prompt_pos,
                query_pos=src_pos,
                dac=False,
                attn_bias=None,
                **kwds,
            )
        normed_output = self.norm(output)
        if self.batch_first:
            normed_output = normed_output.transpose([1, 0, 2])
            src_pos = src_pos.transpose([1, 0, 2])
        return {
            "memory": normed_output,
            "pos_embed": src_pos,
            "padding_mask": src_key_padding_mask,
        }


def build_tracker_memory_attention(feat_sizes: Sequence[int] = (72, 72)) -> nn.Layer:
    """The released tracker's memory attention (upstream ``_create_tracker_transformer``'s
    encoder, ``tracker.transformer.encoder`` in the checkpoint): four pre-norm layers of
    single-head RoPE self-attention over the 72 x 72 frame tokens (width 256) and RoPE
    cross-attention to 64-channel memories, FFN 2048."""
    self_attention = RoPEAttention(
        embedding_dim=256,
        num_heads=1,
        downsample_rate=1,
        dropout=0.1,
        rope_theta=10000.0,
        feat_sizes=list(feat_sizes),
    )
    cross_attention = RoPEAttention(
        embedding_dim=256,
        num_heads=1,
        downsample_rate=1,
        dropout=0.1,
        kv_in_dim=64,
        rope_theta=10000.0,
        feat_sizes=list(feat_sizes),
        rope_k_repeat=True,
    )
    encoder_layer = TransformerDecoderLayerv2(
        cross_attention_first=False,
        activation="relu",
        dim_feedforward=2048,
        dropout=0.1,
        pos_enc_at_attn=False,
        pre_norm=True,
        self_attention=self_attention,
        d_model=256,
        pos_enc_at_cross_attn_keys=True,
        pos_enc_at_cross_attn_queries=False,
        cross_attention=cross_attention,
    )
    return TransformerEncoderCrossAttention(
        remove_cross_attention_layers=[],
        batch_first=True,
        d_model=256,
        frozen=False,
        pos_enc_at_input=True,
        layer=encoder_layer,
        num_layers=4,
        use_act_checkpoint=False,
    )
