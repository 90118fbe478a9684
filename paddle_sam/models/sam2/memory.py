"""SAM 2's memory encoder and memory attention (upstream: sam2/modeling/memory_encoder.py and
memory_attention.py).

Both are SAM 3's tracker modules under SAM 2's names: SAM 3 copied them (memory encoder:
``SimpleMaskEncoder`` and its parts; memory attention: a pre-norm ``TransformerDecoderLayerv2``
stack), so the layers and their parameter names are shared, not ported twice. What differs is
the call: :class:`MemoryAttention` takes upstream SAM 2's arguments and returns the tokens.
"""

from __future__ import annotations

from typing import Any

import paddle
from paddle import nn

from ..sam3.memory import CXBlock
from ..sam3.memory import SimpleFuser as Fuser
from ..sam3.memory import SimpleMaskDownSampler as MaskDownSampler
from ..sam3.memory import SimpleMaskEncoder as MemoryEncoder
from ..sam3.memory_attention import (
    RoPEAttention,
    TransformerDecoderLayerv2,
    TransformerEncoderCrossAttention,
)


class MemoryAttentionLayer(TransformerDecoderLayerv2):
    """Pre-norm self-attention over the frame's tokens, cross-attention to the memories, FFN
    (``self_attn``, ``cross_attn_image``, ``linear1``/``linear2``, ``norm1..3``)."""

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
        self_attention: nn.Layer,
    ) -> None:
        super().__init__(
            cross_attention_first=False,
            activation=activation,
            cross_attention=cross_attention,
            d_model=d_model,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            pos_enc_at_attn=pos_enc_at_attn,
            pos_enc_at_cross_attn_keys=pos_enc_at_cross_attn_keys,
            pos_enc_at_cross_attn_queries=pos_enc_at_cross_attn_queries,
            pre_norm=True,
            self_attention=self_attention,
        )


class MemoryAttention(TransformerEncoderCrossAttention):
    """``num_layers`` copies of ``layer`` and a final LayerNorm (``layers``, ``norm``).

    Sequence-first inputs as upstream: ``curr`` ``HW x B x C`` (or a one-item list),
    ``memory`` ``M x B x mem_dim``; ``curr_pos`` is added (x 0.1) to the input when
    ``pos_enc_at_input``. The last ``num_obj_ptr_tokens`` memory tokens (object pointers) are
    not rotated by RoPE. Returns ``HW x B x C``."""

    def __init__(
        self,
        d_model: int,
        pos_enc_at_input: bool,
        layer: nn.Layer,
        num_layers: int,
        batch_first: bool = True,
    ) -> None:
        super().__init__(
            d_model=d_model,
            frozen=False,
            pos_enc_at_input=pos_enc_at_input,
            layer=layer,
            num_layers=num_layers,
            batch_first=batch_first,
        )

    def forward(  # type: ignore[override]
        self,
        curr: paddle.Tensor | list[paddle.Tensor],
        memory: paddle.Tensor,
        curr_pos: paddle.Tensor | list[paddle.Tensor] | None = None,
        memory_pos: paddle.Tensor | None = None,
        num_obj_ptr_tokens: int = 0,
    ) -> paddle.Tensor:
        padding: Any = [None] if isinstance(curr, list) else None
        out = super().forward(
            src=curr,
            prompt=memory,
            src_key_padding_mask=padding,
            src_pos=curr_pos,
            prompt_pos=memory_pos,
            num_obj_ptr_tokens=num_obj_ptr_tokens,
        )
        return out["memory"]


__all__ = [
    "CXBlock",
    "Fuser",
    "MaskDownSampler",
    "MemoryAttention",
    "MemoryAttentionLayer",
    "MemoryEncoder",
    "RoPEAttention",
]
