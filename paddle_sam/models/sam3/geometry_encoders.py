"""Geometric prompt encoder: points, boxes and exemplar boxes pooled from the image.

Upstream: sam3/model/geometry_encoders.py. Sequences are sequence-first (``N x B x C``), masks
batch-first (``B x N``, True = padding), boxes normalised cx, cy, w, h, points normalised x, y.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.vision.ops import roi_align

from ..common import Linear
from .box_ops import box_cxcywh_to_xyxy
from .model_misc import get_clones, is_static_size


def concat_padded_sequences(
    seq1: paddle.Tensor,
    mask1: paddle.Tensor,
    seq2: paddle.Tensor,
    mask2: paddle.Tensor,
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Concatenate two right-padded sequences into one right-padded sequence.

    seq1 ``L1 x B x C``, mask1 ``B x L1``, seq2 ``L2 x B x C``, mask2 ``B x L2`` ->
    ``(L1 + L2) x B x C`` and its ``B x (L1 + L2)`` padding mask. The valid elements of seq2 are
    moved right after the valid elements of seq1 of the same batch entry.
    """
    l1, b, c = seq1.shape
    l2 = seq2.shape[0]
    if paddle.in_dynamic_mode() and (
        seq2.shape[1] != b or mask1.shape != [b, l1] or mask2.shape != [b, l2]
    ):
        raise ValueError(
            f"inconsistent shapes: seq1 {seq1.shape}, mask1 {mask1.shape}, seq2 {seq2.shape}, "
            f"mask2 {mask2.shape}"
        )
    len1 = (~mask1).astype("int64").sum(-1)
    len2 = (~mask2).astype("int64").sum(-1)
    mask = paddle.arange(l1 + l2, dtype="int64").unsqueeze(0) >= (len1 + len2).unsqueeze(1)
    out = paddle.concat([seq1.astype(seq2.dtype), paddle.zeros([l2, b, c], seq2.dtype)], axis=0)
    if is_static_size(l2) and l2 == 0:
        return out, mask
    index = paddle.arange(l2, dtype="int64").unsqueeze(1) + len1.unsqueeze(0)  # L2 x B
    index = index.unsqueeze(-1).expand([l2, b, c])
    return paddle.put_along_axis(out, index, seq2, axis=0), mask


class Prompt:
    """Geometric prompts of a batch: boxes ``N x B x 4``, points ``N x B x 2``.

    Labels are ``N x B`` (1 positive, 0 negative), masks ``B x N`` (True = padding). Missing
    parts are empty (``0 x B x ...``). Mask prompts are not supported.
    """

    def __init__(
        self,
        box_embeddings: paddle.Tensor | None = None,
        box_mask: paddle.Tensor | None = None,
        point_embeddings: paddle.Tensor | None = None,
        point_mask: paddle.Tensor | None = None,
        box_labels: paddle.Tensor | None = None,
        point_labels: paddle.Tensor | None = None,
    ) -> None:
        if box_embeddings is None and point_embeddings is None:
            self.box_embeddings = self.box_labels = self.box_mask = None
            self.point_embeddings = self.point_labels = self.point_mask = None
            return
        bs = (box_embeddings if box_embeddings is not None else point_embeddings).shape[1]
        self.box_embeddings, self.box_labels, self.box_mask = self._init(
            box_embeddings, box_labels, box_mask, bs, 4, "box"
        )
        self.point_embeddings, self.point_labels, self.point_mask = self._init(
            point_embeddings, point_labels, point_mask, bs, 2, "point"
        )

    @staticmethod
    def _init(
        emb: paddle.Tensor | None,
        labels: paddle.Tensor | None,
        mask: paddle.Tensor | None,
        bs: int,
        dim: int,
        what: str,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        if emb is None:
            emb = paddle.zeros([0, bs, dim], "float32")
        n = emb.shape[0]
        if emb.ndim != 3 or emb.shape[1:] != [bs, dim]:
            raise ValueError(f"{what} embeddings must be N x {bs} x {dim}, got {emb.shape}")
        labels = paddle.ones([n, bs], "int64") if labels is None else labels.astype("int64")
        mask = paddle.zeros([bs, n], "bool") if mask is None else mask.astype("bool")
        if paddle.in_dynamic_mode():  # a static graph's dynamic N is a tensor, not comparable
            if labels.shape != [n, bs]:
                raise ValueError(f"{what} labels must be {[n, bs]}, got {labels.shape}")
            if mask.shape != [bs, n]:
                raise ValueError(f"{what} mask must be {[bs, n]}, got {mask.shape}")
        return emb, labels, mask

    def _append(self, kind: str, emb: paddle.Tensor, labels: paddle.Tensor, mask) -> None:
        old = getattr(self, f"{kind}_embeddings")
        labels = labels.astype("int64")
        if old is None:
            bs = emb.shape[1]
            mask = paddle.zeros([bs, emb.shape[0]], "bool") if mask is None else mask
            setattr(self, f"{kind}_embeddings", emb)
            setattr(self, f"{kind}_labels", labels)
            setattr(self, f"{kind}_mask", mask)
            return
        bs = old.shape[1]
        if emb.shape[1] != bs or labels.shape != emb.shape[:2]:
            raise ValueError(
                f"{kind}s {emb.shape} / labels {labels.shape} do not match batch size {bs}"
            )
        if mask is None:
            mask = paddle.zeros([bs, emb.shape[0]], "bool")
        old_mask = getattr(self, f"{kind}_mask")
        new_labels, _ = concat_padded_sequences(
            getattr(self, f"{kind}_labels").unsqueeze(-1), old_mask, labels.unsqueeze(-1), mask
        )
        new_emb, new_mask = concat_padded_sequences(old, old_mask, emb, mask)
        setattr(self, f"{kind}_labels", new_labels.squeeze(-1))
        setattr(self, f"{kind}_embeddings", new_emb)
        setattr(self, f"{kind}_mask", new_mask)

    def append_boxes(
        self, boxes: paddle.Tensor, labels: paddle.Tensor, mask: paddle.Tensor | None = None
    ) -> None:
        """Append boxes ``N x B x 4`` with labels ``N x B`` (and padding mask ``B x N``)."""
        self._append("box", boxes, labels, mask)

    def append_points(
        self, points: paddle.Tensor, labels: paddle.Tensor, mask: paddle.Tensor | None = None
    ) -> None:
        """Append points ``N x B x 2`` with labels ``N x B`` (and padding mask ``B x N``)."""
        self._append("point", points, labels, mask)

    def clone(self) -> Prompt:
        def c(t: paddle.Tensor | None) -> paddle.Tensor | None:
            return None if t is None else t.clone()

        return Prompt(
            box_embeddings=c(self.box_embeddings),
            box_mask=c(self.box_mask),
            point_embeddings=c(self.point_embeddings),
            point_mask=c(self.point_mask),
            box_labels=c(self.box_labels),
            point_labels=c(self.point_labels),
        )


class SequenceGeometryEncoder(nn.Layer):
    """Encodes points and boxes into a prompt sequence (plus a CLS token).

    Each point / box is the sum of the enabled encodings: a direct linear projection of its
    coordinates, features pooled from the image (grid sample for points, 7x7 ROI align for boxes)
    and a projection of its sine position encoding; plus a label embedding. The sequence is then
    refined by ``num_layers`` transformer layers attending to the image features.
    """

    def __init__(
        self,
        encode_boxes_as_points: bool,
        points_direct_project: bool,
        points_pool: bool,
        points_pos_enc: bool,
        boxes_direct_project: bool,
        boxes_pool: bool,
        boxes_pos_enc: bool,
        d_model: int,
        pos_enc: nn.Layer,
        num_layers: int,
        layer: nn.Layer,
        roi_size: int = 7,
        add_cls: bool = True,
        add_post_encode_proj: bool = True,
        mask_encoder: nn.Layer | None = None,
        add_mask_label: bool = False,
        use_act_ckpt: bool = False,
    ) -> None:
        super().__init__()
        if encode_boxes_as_points:
            raise NotImplementedError("encode_boxes_as_points is not supported (unused by SAM 3)")
        if mask_encoder is not None or add_mask_label:
            raise NotImplementedError("mask prompts are not supported (unused by SAM 3 image)")
        if not (points_direct_project or points_pos_enc or points_pool):
            raise ValueError("need at least one way to encode points")
        if not (boxes_direct_project or boxes_pos_enc or boxes_pool):
            raise ValueError("need at least one way to encode boxes")
        if num_layers > 0 and not add_cls:
            raise ValueError("a CLS token is required when encoding with transformer layers")
        self.d_model = d_model
        self.pos_enc = pos_enc
        self.encode_boxes_as_points = encode_boxes_as_points
        self.roi_size = roi_size
        self.label_embed = nn.Embedding(2, d_model)
        self.cls_embed = nn.Embedding(1, d_model) if add_cls else None

        self.points_direct_project = Linear(2, d_model) if points_direct_project else None
        self.points_pool_project = Linear(d_model, d_model) if points_pool else None
        self.points_pos_enc_project = Linear(d_model, d_model) if points_pos_enc else None
        self.boxes_direct_project = Linear(4, d_model) if boxes_direct_project else None
        self.boxes_pool_project = nn.Conv2D(d_model, d_model, roi_size) if boxes_pool else None
        self.boxes_pos_enc_project = Linear(d_model + 2, d_model) if boxes_pos_enc else None

        self.final_proj = None
        if add_post_encode_proj:
            self.final_proj = Linear(d_model, d_model)
            self.norm = nn.LayerNorm(d_model)
        self.img_pre_norm = nn.LayerNorm(d_model) if (points_pool or boxes_pool) else nn.Identity()
        self.encode = None
        if num_layers > 0:
            self.encode = get_clones(layer, num_layers)
            self.encode_norm = nn.LayerNorm(d_model)
        self.mask_encoder = None

    def _encode_points(
        self,
        points: paddle.Tensor,
        labels: paddle.Tensor,
        img_feats: paddle.Tensor | None,
    ) -> paddle.Tensor:
        n, bs = points.shape[:2]
        if is_static_size(n) and n == 0:
            return paddle.zeros([0, bs, self.d_model], points.dtype)
        embed = None
        if self.points_direct_project is not None:
            embed = self.points_direct_project(points)
        if self.points_pool_project is not None:
            grid = points.transpose([1, 0, 2]).unsqueeze(2) * 2 - 1  # B x N x 1 x 2 in [-1, 1]
            sampled = F.grid_sample(img_feats, grid, mode="bilinear", align_corners=False)
            proj = self.points_pool_project(sampled.squeeze(-1).transpose([2, 0, 1]))
            embed = proj if embed is None else embed + proj
        if self.points_pos_enc_project is not None:
            x, y = points.unbind(-1)
            enc_x, enc_y = self.pos_enc._encode_xy(x.flatten(), y.flatten())
            enc = paddle.concat([enc_x.reshape([n, bs, -1]), enc_y.reshape([n, bs, -1])], axis=-1)
            proj = self.points_pos_enc_project(enc)
            embed = proj if embed is None else embed + proj
        return self.label_embed(labels) + embed

    def _encode_boxes(
        self,
        boxes: paddle.Tensor,
        labels: paddle.Tensor,
        img_feats: paddle.Tensor | None,
    ) -> paddle.Tensor:
        n, bs = boxes.shape[:2]
        if is_static_size(n) and n == 0:
            return paddle.zeros([0, bs, self.d_model], boxes.dtype)
        embed = None
        if self.boxes_direct_project is not None:
            embed = self.boxes_direct_project(boxes)
        if self.boxes_pool_project is not None:
            h, w = img_feats.shape[-2:]
            scale = paddle.to_tensor([w, h, w, h], dtype=boxes.dtype)
            xyxy = (box_cxcywh_to_xyxy(boxes) * scale).transpose([1, 0, 2]).reshape([-1, 4])
            # torchvision.ops.roi_align defaults: aligned=False, sampling_ratio=-1
            sampled = roi_align(
                img_feats,
                xyxy,
                paddle.full([bs], n, "int32"),
                self.roi_size,
                spatial_scale=1.0,
                sampling_ratio=-1,
                aligned=False,
            )
            proj = self.boxes_pool_project(sampled).reshape([bs, n, self.d_model])
            proj = proj.transpose([1, 0, 2])
            embed = proj if embed is None else embed + proj
        if self.boxes_pos_enc_project is not None:
            cx, cy, bw, bh = boxes.unbind(-1)
            enc = self.pos_enc.encode_boxes(cx.flatten(), cy.flatten(), bw.flatten(), bh.flatten())
            proj = self.boxes_pos_enc_project(enc.reshape([n, bs, -1]))
            embed = proj if embed is None else embed + proj
        return self.label_embed(labels) + embed

    def forward(
        self,
        geo_prompt: Prompt,
        img_feats: list[paddle.Tensor],
        img_sizes: list[tuple[int, int]],
        img_pos_embeds: list[paddle.Tensor] | None = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """img_feats / img_pos_embeds: per level ``HW x B x C``; img_sizes: per level (H, W).

        Returns the prompt sequence ``N x B x C`` and its padding mask ``B x N``.
        """
        if geo_prompt.box_embeddings is None:
            raise ValueError("the prompt holds no points and no boxes (build it with Prompt(...))")
        feats = img_feats[-1]
        pos = img_pos_embeds[-1] if img_pos_embeds is not None else paddle.zeros_like(feats)
        pooled_feats = None
        if self.points_pool_project is not None or self.boxes_pool_project is not None:
            if len(img_feats) != len(img_sizes):
                raise ValueError("img_feats and img_sizes must have the same length")
            h, w = img_sizes[-1]
            if feats.shape[0] != h * w:
                raise ValueError(f"image features have {feats.shape[0]} tokens, not {h}x{w}")
            x = self.img_pre_norm(feats)
            pooled_feats = x.transpose([1, 2, 0]).reshape([x.shape[1], x.shape[2], h, w])

        embeds = self._encode_points(
            geo_prompt.point_embeddings, geo_prompt.point_labels, pooled_feats
        )
        box_embeds = self._encode_boxes(
            geo_prompt.box_embeddings, geo_prompt.box_labels, pooled_feats
        )
        embeds, mask = concat_padded_sequences(
            embeds, geo_prompt.point_mask, box_embeds, geo_prompt.box_mask
        )
        bs = embeds.shape[1]
        if self.cls_embed is not None:
            cls = self.cls_embed.weight.reshape([1, 1, self.d_model]).expand([1, bs, self.d_model])
            embeds, mask = concat_padded_sequences(embeds, mask, cls, paddle.zeros([bs, 1], "bool"))
        if self.final_proj is not None:
            embeds = self.norm(self.final_proj(embeds))
        if self.encode is not None:
            for layer in self.encode:
                embeds = layer(tgt=embeds, memory=feats, tgt_key_padding_mask=mask, pos=pos)
            embeds = self.encode_norm(embeds)
        return embeds, mask
