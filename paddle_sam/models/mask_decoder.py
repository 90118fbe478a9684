"""Mask decoder: two-way transformer, hypernetwork MLPs and IoU head (upstream: mask_decoder.py)."""

from __future__ import annotations

import paddle
from paddle import nn

from .common import MLP, LayerNorm2d


class MaskDecoder(nn.Layer):
    def __init__(
        self,
        *,
        transformer_dim: int,
        transformer: nn.Layer,
        num_multimask_outputs: int = 3,
        activation: type[nn.Layer] = nn.GELU,
        iou_head_depth: int = 3,
        iou_head_hidden_dim: int = 256,
    ) -> None:
        super().__init__()
        self.transformer_dim = transformer_dim
        self.transformer = transformer
        self.num_multimask_outputs = num_multimask_outputs
        self.iou_token = nn.Embedding(1, transformer_dim)
        self.num_mask_tokens = num_multimask_outputs + 1
        self.mask_tokens = nn.Embedding(self.num_mask_tokens, transformer_dim)
        self.output_upscaling = nn.Sequential(
            nn.Conv2DTranspose(transformer_dim, transformer_dim // 4, kernel_size=2, stride=2),
            LayerNorm2d(transformer_dim // 4),
            activation(),
            nn.Conv2DTranspose(transformer_dim // 4, transformer_dim // 8, kernel_size=2, stride=2),
            activation(),
        )
        self.output_hypernetworks_mlps = nn.LayerList(
            MLP(transformer_dim, transformer_dim, transformer_dim // 8, 3)
            for _ in range(self.num_mask_tokens)
        )
        self.iou_prediction_head = MLP(
            transformer_dim, iou_head_hidden_dim, self.num_mask_tokens, iou_head_depth
        )

    def forward(
        self,
        image_embeddings: paddle.Tensor,
        image_pe: paddle.Tensor,
        sparse_prompt_embeddings: paddle.Tensor,
        dense_prompt_embeddings: paddle.Tensor,
        multimask_output: bool,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Masks (B x C x 4H x 4W logits) and IoU predictions (B x C); C = 3 or 1.

        image_embeddings: 1 x D x H x W (shared by the B prompts) or B x D x H x W.
        """
        masks, iou_pred = self.predict_masks(
            image_embeddings, image_pe, sparse_prompt_embeddings, dense_prompt_embeddings
        )
        if multimask_output:
            return masks[:, 1:, :, :], iou_pred[:, 1:]
        return masks[:, 0:1, :, :], iou_pred[:, 0:1]

    def predict_masks(
        self,
        image_embeddings: paddle.Tensor,
        image_pe: paddle.Tensor,
        sparse_prompt_embeddings: paddle.Tensor,
        dense_prompt_embeddings: paddle.Tensor,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """All ``num_mask_tokens`` masks and IoU predictions."""
        output_tokens = paddle.concat([self.iou_token.weight, self.mask_tokens.weight], axis=0)
        n = sparse_prompt_embeddings.shape[0]
        output_tokens = output_tokens.unsqueeze(0).expand([n, -1, -1])
        tokens = paddle.concat([output_tokens, sparse_prompt_embeddings], axis=1)

        # one copy of the image embedding per prompt (upstream: repeat_interleave of a batch of 1)
        src = image_embeddings.expand([n, -1, -1, -1]) + dense_prompt_embeddings
        pos_src = image_pe.expand([n, -1, -1, -1])
        b, c, h, w = src.shape

        hs, src = self.transformer(src, pos_src, tokens)
        iou_token_out = hs[:, 0, :]
        mask_tokens_out = hs[:, 1 : 1 + self.num_mask_tokens, :]

        src = src.transpose([0, 2, 1]).reshape([b, c, h, w])
        upscaled = self.output_upscaling(src)
        hyper_in = paddle.stack(
            [mlp(mask_tokens_out[:, i, :]) for i, mlp in enumerate(self.output_hypernetworks_mlps)],
            axis=1,
        )
        b, c, h, w = upscaled.shape
        masks = paddle.matmul(hyper_in, upscaled.reshape([b, c, h * w])).reshape([b, -1, h, w])
        return masks, self.iou_prediction_head(iou_token_out)
