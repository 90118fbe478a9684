"""DETR-style decoder with box refinement, box relative-position bias and a presence token.

Upstream: sam3/model/decoder.py (TransformerDecoderLayer, TransformerDecoder; inference path:
no divide-and-conquer o2m queries, which upstream only uses in training). Sequence-first.
"""

from __future__ import annotations

import math

import paddle
from paddle import nn

from ..common import Linear
from .box_ops import box_cxcywh_to_xyxy
from .model_misc import (
    MLP,
    MultiheadAttention,
    gen_sineembed_for_position,
    get_activation_fn,
    get_clones,
    inverse_sigmoid,
)


class TransformerDecoderLayer(nn.Layer):
    """Self-attention (with the presence token), text cross-attention, image cross-attention
    with the box bias, FFN; post-norm."""

    def __init__(
        self,
        activation: str,
        d_model: int,
        dim_feedforward: int,
        dropout: float,
        cross_attention: nn.Layer,
        n_heads: int,
        use_text_cross_attention: bool = False,
    ) -> None:
        super().__init__()
        self.cross_attn = cross_attention
        self.dropout1 = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.norm1 = nn.LayerNorm(d_model)
        self.use_text_cross_attention = use_text_cross_attention
        if use_text_cross_attention:
            self.ca_text = MultiheadAttention(d_model, n_heads, dropout=dropout)
            self.catext_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.catext_norm = nn.LayerNorm(d_model)
        self.self_attn = MultiheadAttention(d_model, n_heads, dropout=dropout)
        self.dropout2 = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = Linear(d_model, dim_feedforward)
        self.activation = get_activation_fn(activation)
        self.dropout3 = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.linear2 = Linear(dim_feedforward, d_model)
        self.dropout4 = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.norm3 = nn.LayerNorm(d_model)

    def forward(
        self,
        tgt: paddle.Tensor,
        tgt_query_pos: paddle.Tensor,
        memory_text: paddle.Tensor | None,
        text_attention_mask: paddle.Tensor | None,
        memory: paddle.Tensor,
        memory_key_padding_mask: paddle.Tensor | None = None,
        memory_pos: paddle.Tensor | None = None,
        self_attn_mask: paddle.Tensor | None = None,
        cross_attn_mask: paddle.Tensor | None = None,
        presence_token: paddle.Tensor | None = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        """tgt, tgt_query_pos: ``Q x B x C``; memory, memory_pos: ``HW x B x C``;
        cross_attn_mask: ``(B * heads) x Q x HW`` additive; presence_token ``1 x B x C``."""
        if presence_token is not None:
            tgt = paddle.concat([presence_token, tgt], axis=0)
            tgt_query_pos = paddle.concat([paddle.zeros_like(presence_token), tgt_query_pos], 0)
        q = tgt + tgt_query_pos
        tgt2 = self.self_attn(q, q, tgt, attn_mask=self_attn_mask)[0]
        tgt = self.norm2(tgt + self.dropout2(tgt2))

        if self.use_text_cross_attention:
            tgt2 = self.ca_text(
                tgt + tgt_query_pos, memory_text, memory_text, key_padding_mask=text_attention_mask
            )[0]
            tgt = self.catext_norm(tgt + self.catext_dropout(tgt2))

        if presence_token is not None and cross_attn_mask is not None:
            zeros = paddle.zeros_like(cross_attn_mask[:, :1, :])
            cross_attn_mask = paddle.concat([zeros, cross_attn_mask], axis=1)
        tgt2 = self.cross_attn(
            tgt + tgt_query_pos,
            memory + memory_pos if memory_pos is not None else memory,
            memory,
            attn_mask=cross_attn_mask,
            key_padding_mask=(
                memory_key_padding_mask.transpose([1, 0])
                if memory_key_padding_mask is not None
                else None
            ),
        )[0]
        tgt = self.norm1(tgt + self.dropout1(tgt2))
        tgt2 = self.linear2(self.dropout3(self.activation(self.linear1(tgt))))
        tgt = self.norm3(tgt + self.dropout4(tgt2))
        if presence_token is not None:
            return tgt[1:], tgt[:1]
        return tgt, None


class TransformerDecoder(nn.Layer):
    """``num_layers`` decoder layers over ``num_queries`` learned queries, refining a box per
    query after each layer; optional presence token scored by a small MLP."""

    def __init__(
        self,
        d_model: int,
        frozen: bool,
        interaction_layer: nn.Layer | None,
        layer: nn.Layer,
        num_layers: int,
        num_queries: int,
        return_intermediate: bool,
        box_refine: bool = False,
        num_o2m_queries: int = 0,
        dac: bool = False,
        boxRPB: str = "none",  # noqa: N803 - upstream name
        instance_query: bool = False,
        num_instances: int = 1,
        dac_use_selfatt_ln: bool = True,
        use_act_checkpoint: bool = False,
        compile_mode: str | None = None,
        presence_token: bool = False,
        clamp_presence_logits: bool = True,
        clamp_presence_logit_max_val: float = 10.0,
        use_normed_output_consistently: bool = True,
        separate_box_head_instance: bool = False,
        separate_norm_instance: bool = False,
        resolution: int | None = None,
        stride: int | None = None,
    ) -> None:
        super().__init__()
        if interaction_layer is not None or instance_query:
            raise NotImplementedError("interaction layers and instance queries are not supported")
        if not (return_intermediate and box_refine):
            raise NotImplementedError("only return_intermediate=True, box_refine=True")
        if boxRPB not in ("none", "log", "linear", "both"):
            raise ValueError(f"boxRPB must be none/log/linear/both, got {boxRPB!r}")
        if not use_normed_output_consistently:
            raise NotImplementedError("only use_normed_output_consistently=True")
        self.d_model = d_model
        self.layers = get_clones(layer, num_layers)
        self.num_layers = num_layers
        self.num_queries = num_queries
        self.dac = dac
        self.num_o2m_queries = num_queries if dac else num_o2m_queries
        tot_num_queries = num_queries if dac else num_queries + num_o2m_queries
        self.norm = nn.LayerNorm(d_model)
        self.bbox_embed = MLP(d_model, d_model, 4, 3)
        self.query_embed = nn.Embedding(tot_num_queries, d_model)
        self.reference_points = nn.Embedding(num_queries, 4)
        self.box_refine = box_refine
        self.boxRPB = boxRPB
        if boxRPB != "none":
            nheads = layer.cross_attn.num_heads
            n_input = 4 if boxRPB == "both" else 2
            self.boxRPB_embed_x = MLP(n_input, d_model, nheads, 2)
            self.boxRPB_embed_y = MLP(n_input, d_model, nheads, 2)
        self.presence_token = None
        # Upstream's clamp of the presence logits is not in place and its result is dropped,
        # so the logits are never clamped; these two are kept for the signature only.
        self.clamp_presence_logits = clamp_presence_logits
        self.clamp_presence_logit_max_val = clamp_presence_logit_max_val
        if presence_token:
            self.presence_token = nn.Embedding(1, d_model)
            self.presence_token_head = MLP(d_model, d_model, 1, 3)
            self.presence_token_out_norm = nn.LayerNorm(d_model)
        self.ref_point_head = MLP(2 * d_model, d_model, d_model, 2)

    def _get_rpb_matrix(self, reference_boxes: paddle.Tensor, h: int, w: int) -> paddle.Tensor:
        """Box relative-position bias: reference boxes ``Q x B x 4`` -> ``B x heads x Q x HW``."""
        boxes = box_cxcywh_to_xyxy(reference_boxes).transpose([1, 0, 2])
        bs, nq = boxes.shape[:2]
        flat = boxes.reshape([-1, 1, 4])
        coords_h = paddle.arange(h, dtype="float32") / h
        coords_w = paddle.arange(w, dtype="float32") / w
        deltas_y = (coords_h.reshape([1, -1, 1]) - flat[:, :, 1:4:2]).reshape([bs, nq, h, 2])
        deltas_x = (coords_w.reshape([1, -1, 1]) - flat[:, :, 0:3:2]).reshape([bs, nq, w, 2])
        if self.boxRPB in ("log", "both"):

            def log_scale(d: paddle.Tensor) -> paddle.Tensor:
                d = d * 8  # to [-8, 8]
                return paddle.sign(d) * paddle.log2(paddle.abs(d) + 1.0) / math.log2(8)

            if self.boxRPB == "log":
                deltas_x, deltas_y = log_scale(deltas_x), log_scale(deltas_y)
            else:
                deltas_x = paddle.concat([deltas_x, log_scale(deltas_x)], axis=-1)
                deltas_y = paddle.concat([deltas_y, log_scale(deltas_y)], axis=-1)
        bias_x = self.boxRPB_embed_x(deltas_x).transpose([0, 3, 1, 2])  # B x heads x Q x W
        bias_y = self.boxRPB_embed_y(deltas_y).transpose([0, 3, 1, 2])  # B x heads x Q x H
        # bias_y[..., :, None] + bias_x[..., None, :] as upstream (the same sums: addition
        # commutes exactly), built in its final layout as one expand and an add whose second
        # operand broadcasts along the last axis. Paddle's CPU add is slow when both operands
        # broadcast or the first one does: 97 / 52 ms per layer against 6 ms so.
        heads = bias_x.shape[1]
        rows = bias_x.unsqueeze(3).expand([bs, heads, nq, h, w])
        return (rows + bias_y.unsqueeze(4)).reshape([bs, heads, nq, h * w])

    def forward(
        self,
        tgt: paddle.Tensor,
        memory: paddle.Tensor,
        tgt_mask: paddle.Tensor | None = None,
        memory_mask: paddle.Tensor | None = None,
        memory_key_padding_mask: paddle.Tensor | None = None,
        pos: paddle.Tensor | None = None,
        reference_boxes: paddle.Tensor | None = None,
        spatial_shapes: paddle.Tensor | list[tuple[int, int]] | None = None,
        valid_ratios: paddle.Tensor | None = None,
        memory_text: paddle.Tensor | None = None,
        text_attention_mask: paddle.Tensor | None = None,
        **unused: object,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor | None, paddle.Tensor | None]:
        """tgt ``Q x B x C``; memory, pos ``HW x B x C``; memory_text ``S x B x C``.

        Returns normed outputs per layer ``L x Q x B x C``, the reference boxes each layer used
        ``L x Q x B x 4`` (cx, cy, w, h in [0, 1]), presence logits ``L x 1 x B`` (or None) and
        the last presence token ``1 x B x C``.
        """
        if memory_mask is not None and self.boxRPB != "none":
            raise ValueError("memory_mask cannot be combined with the box relative-position bias")
        bs = tgt.shape[1]
        if reference_boxes is None:
            ref = self.reference_points.weight.unsqueeze(1)
            reference_boxes = ref.expand([ref.shape[0], bs, 4]).sigmoid()
        ref_boxes = [reference_boxes]
        if valid_ratios is None:
            valid_ratios = paddle.ones([bs, 1, 2], "float32")
        scale = paddle.concat([valid_ratios, valid_ratios], axis=-1).unsqueeze(0)
        presence_out = None
        if self.presence_token is not None:
            presence_out = self.presence_token.weight.unsqueeze(1).expand([1, bs, self.d_model])

        intermediate, presence_logits = [], []
        output = tgt
        for layer_idx, layer in enumerate(self.layers):
            ref_input = reference_boxes.unsqueeze(2) * scale  # Q x B x levels x 4
            query_pos = self.ref_point_head(
                gen_sineembed_for_position(ref_input[:, :, 0, :], self.d_model)
            )
            if self.boxRPB != "none":
                if len(spatial_shapes) != 1:
                    raise NotImplementedError("box bias supports a single feature level only")
                h, w = (int(v) for v in spatial_shapes[0])
                memory_mask = self._get_rpb_matrix(reference_boxes, h, w).flatten(0, 1)
            output, presence_out = layer(
                tgt=output,
                tgt_query_pos=query_pos,
                memory_text=memory_text,
                text_attention_mask=text_attention_mask,
                memory=memory,
                memory_key_padding_mask=memory_key_padding_mask,
                memory_pos=pos,
                self_attn_mask=tgt_mask,
                cross_attn_mask=memory_mask,
                presence_token=presence_out,
            )
            normed = self.norm(output)
            new_ref = (self.bbox_embed(normed) + inverse_sigmoid(reference_boxes)).sigmoid()
            reference_boxes = new_ref.detach()
            if layer_idx != self.num_layers - 1:
                ref_boxes.append(new_ref)
            intermediate.append(normed)
            if self.presence_token is not None:
                logits = self.presence_token_head(self.presence_token_out_norm(presence_out))
                presence_logits.append(logits.squeeze(-1))

        return (
            paddle.stack(intermediate),
            paddle.stack(ref_boxes),
            paddle.stack(presence_logits) if self.presence_token is not None else None,
            presence_out,
        )
