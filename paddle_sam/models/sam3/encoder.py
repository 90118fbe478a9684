"""Fusion encoder: image tokens attend to themselves and to the prompt (upstream encoder.py)."""

from __future__ import annotations

import paddle
from paddle import nn

from ..common import Linear
from .model_misc import get_activation_fn, get_clones


class TransformerEncoderLayer(nn.Layer):
    """Self-attention, cross-attention to ``memory``, FFN; pre-norm or post-norm.

    The layout (sequence- or batch-first) is whatever the attention layers were built with.
    """

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
        self.self_attn = self_attention
        self.cross_attn_image = cross_attention
        self.linear1 = Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.activation = get_activation_fn(activation)
        self.pre_norm = pre_norm
        self.pos_enc_at_attn = pos_enc_at_attn
        self.pos_enc_at_cross_attn_queries = pos_enc_at_cross_attn_queries
        self.pos_enc_at_cross_attn_keys = pos_enc_at_cross_attn_keys

    def forward(
        self,
        tgt: paddle.Tensor,
        memory: paddle.Tensor,
        tgt_mask: paddle.Tensor | None = None,
        memory_mask: paddle.Tensor | None = None,
        tgt_key_padding_mask: paddle.Tensor | None = None,
        memory_key_padding_mask: paddle.Tensor | None = None,
        pos: paddle.Tensor | None = None,
        query_pos: paddle.Tensor | None = None,
    ) -> paddle.Tensor:
        """tgt: queries; memory: keys/values; pos: memory position; query_pos: tgt position."""
        if self.pre_norm:
            tgt2 = self.norm1(tgt)
            q = tgt2 + query_pos if self.pos_enc_at_attn else tgt2
            tgt2 = self.self_attn(
                q, q, tgt2, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask
            )[0]
            tgt = tgt + self.dropout1(tgt2)
            tgt2 = self.norm2(tgt)
            tgt2 = self.cross_attn_image(
                tgt2 + query_pos if self.pos_enc_at_cross_attn_queries else tgt2,
                memory + pos if self.pos_enc_at_cross_attn_keys else memory,
                memory,
                attn_mask=memory_mask,
                key_padding_mask=memory_key_padding_mask,
            )[0]
            tgt = tgt + self.dropout2(tgt2)
            tgt2 = self.linear2(self.dropout(self.activation(self.linear1(self.norm3(tgt)))))
            return tgt + self.dropout3(tgt2)

        q = tgt + query_pos if self.pos_enc_at_attn else tgt
        tgt2 = self.self_attn(q, q, tgt, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask)[
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
        tgt2 = self.linear2(self.dropout(self.activation(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout3(tgt2))


def pool_text_feat(
    prompt: paddle.Tensor, prompt_mask: paddle.Tensor | None, pool_with_mask: bool
) -> paddle.Tensor:
    """Mean of ``S x B x C`` over S (valid tokens only when ``pool_with_mask``) -> ``B x C``."""
    if not pool_with_mask:
        return prompt.mean(axis=0)
    is_valid = (~prompt_mask).astype(prompt.dtype).transpose([1, 0]).unsqueeze(-1)
    num_valid = is_valid.sum(axis=0).clip(min=1.0)
    return (prompt * is_valid).sum(axis=0) / num_valid


class TransformerEncoderFusion(nn.Layer):
    """Stack of encoder layers over flattened image tokens, cross-attending to the prompt.

    Upstream TransformerEncoder + TransformerEncoderFusion (inference path).
    """

    def __init__(
        self,
        layer: nn.Layer,
        num_layers: int,
        d_model: int,
        num_feature_levels: int,
        add_pooled_text_to_img_feat: bool = True,
        pool_text_with_mask: bool = False,
        frozen: bool = False,
        use_act_checkpoint: bool = False,
    ) -> None:
        super().__init__()
        self.layers = get_clones(layer, num_layers)
        self.num_layers = num_layers
        self.num_feature_levels = num_feature_levels
        self.level_embed = None
        if num_feature_levels > 1:
            self.level_embed = self.create_parameter([num_feature_levels, d_model])
        self.add_pooled_text_to_img_feat = add_pooled_text_to_img_feat
        if add_pooled_text_to_img_feat:
            self.text_pooling_proj = Linear(d_model, d_model)
        self.pool_text_with_mask = pool_text_with_mask

    def forward(
        self,
        src: list[paddle.Tensor],
        prompt: paddle.Tensor,
        src_key_padding_mask: list[paddle.Tensor | None] | None = None,
        src_pos: list[paddle.Tensor] | None = None,
        prompt_key_padding_mask: paddle.Tensor | None = None,
        prompt_pos: paddle.Tensor | None = None,
        feat_sizes: list[tuple[int, int]] | None = None,
    ) -> dict[str, paddle.Tensor | None]:
        """src / src_pos: per level ``HW x B x C`` (with feat_sizes) or ``B x C x H x W``;
        prompt ``S x B x C`` with padding mask ``B x S``.

        Returns ``memory`` and ``pos_embed`` as ``sum(HW) x B x C``, plus level bookkeeping.
        """
        if len(src) != self.num_feature_levels or len(src_pos) != len(src):
            raise ValueError(
                f"expected {self.num_feature_levels} feature levels and positions, got "
                f"{len(src)} and {len(src_pos)}"
            )
        bs = src[0].shape[1] if feat_sizes is not None else src[0].shape[0]
        masks = list(src_key_padding_mask) if src_key_padding_mask else [None] * len(src)
        flat, flat_pos, flat_mask, shapes = [], [], [], []
        for lvl, (x, p) in enumerate(zip(src, src_pos)):  # noqa: B905 - lengths checked above
            if feat_sizes is not None:
                h, w = feat_sizes[lvl]
                x = x.transpose([1, 0, 2])  # B x HW x C
                p = p.transpose([1, 0, 2])
                if masks[lvl] is not None:
                    masks[lvl] = masks[lvl].reshape([h, w, bs]).transpose([2, 0, 1])
            else:
                h, w = x.shape[-2:]
                x = x.flatten(2).transpose([0, 2, 1])
                p = p.flatten(2).transpose([0, 2, 1])
            if self.add_pooled_text_to_img_feat:
                pooled = pool_text_feat(prompt, prompt_key_padding_mask, self.pool_text_with_mask)
                x = x + self.text_pooling_proj(pooled).unsqueeze(1)
            if self.level_embed is not None:
                p = p + self.level_embed[lvl].reshape([1, 1, -1])
            shapes.append((h, w))
            flat.append(x)
            flat_pos.append(p)
            if masks[lvl] is not None:
                flat_mask.append(masks[lvl].flatten(1))
        output = paddle.concat(flat, axis=1)
        pos = paddle.concat(flat_pos, axis=1)
        mask = paddle.concat(flat_mask, axis=1) if flat_mask else None
        if mask is not None and len(flat_mask) != len(flat):
            raise ValueError("padding masks must be given for every level or none")

        memory = prompt.transpose([1, 0, 2])
        for layer in self.layers:
            output = layer(
                tgt=output,
                memory=memory,
                tgt_key_padding_mask=mask,
                memory_key_padding_mask=prompt_key_padding_mask,
                query_pos=pos,
            )
        spatial_shapes = paddle.to_tensor(shapes, dtype="int64")
        sizes = spatial_shapes.prod(1)
        level_start_index = paddle.concat([paddle.zeros([1], "int64"), sizes.cumsum(0)[:-1]])
        return {
            "memory": output.transpose([1, 0, 2]),
            "padding_mask": mask.transpose([1, 0]) if mask is not None else None,
            "pos_embed": pos.transpose([1, 0, 2]),
            "memory_text": prompt,
            "level_start_index": level_start_index,
            "spatial_shapes": spatial_shapes,
            "valid_ratios": paddle.ones([bs, self.num_feature_levels, 2], "float32"),
        }
