"""Mask decoder: two-way transformer, hypernetwork MLPs and IoU head (upstream: mask_decoder.py)."""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

from ..common import MLP, LayerNorm2d


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
        # Compute output_upscaling as per-token GEMMs (see ``_masks_channels_last``) instead of
        # upstream's two transposed convolutions; off by default, set by the export.
        self.channels_last_upscaling = False

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
        gemm_weights: dict[str, list[paddle.Tensor]] | None = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """All ``num_mask_tokens`` masks and IoU predictions (gemm_weights: see
        :meth:`output_heads`)."""
        tokens = self.prompt_tokens(sparse_prompt_embeddings)
        # the image embedding for every prompt (upstream: repeat_interleave of a batch of 1)
        # (broadcasting over the prompts, which copies nothing for a single prompt)
        src = image_embeddings + dense_prompt_embeddings
        b, c, h, w = src.shape
        hs, src = self.transformer(src, image_pe, tokens)
        return self.output_heads(hs, src, h, w, gemm_weights)

    def prompt_tokens(self, sparse_prompt_embeddings: paddle.Tensor) -> paddle.Tensor:
        """The IoU and mask output tokens followed by the prompt's: B x (1 + M + N) x C."""
        output_tokens = paddle.concat([self.iou_token.weight, self.mask_tokens.weight], axis=0)
        n = sparse_prompt_embeddings.shape[0]
        output_tokens = output_tokens.unsqueeze(0).expand([n, -1, -1])
        return paddle.concat([output_tokens, sparse_prompt_embeddings], axis=1)

    def output_heads(
        self,
        hs: paddle.Tensor,
        src: paddle.Tensor,
        h: int,
        w: int,
        gemm_weights: dict[str, list[paddle.Tensor]] | None = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Masks and IoU predictions from the transformer's tokens (hs, B x T x C) and image
        (src, B x hw x C). gemm_weights: :meth:`gemm_weights`, computed once by the caller;
        with them the M hypernetwork MLPs run as one batched product per layer, and the
        per-token upscaling (``channels_last_upscaling``) takes its GEMM weights as given
        (same function)."""
        iou_token_out = hs[:, 0, :]
        mask_tokens_out = hs[:, 1 : 1 + self.num_mask_tokens, :]
        if gemm_weights is None:
            mlps = self.output_hypernetworks_mlps
            hyper_in = paddle.stack(
                [mlp(mask_tokens_out[:, i, :]) for i, mlp in enumerate(mlps)], axis=1
            )
        else:
            stacked = gemm_weights["hypernetwork"]
            x = mask_tokens_out.transpose([1, 0, 2])  # M x B x C
            last = len(stacked) // 2 - 1
            for i in range(last + 1):
                weight, bias = stacked[2 * i], stacked[2 * i + 1]
                x = paddle.matmul(x, weight) + bias
                x = F.relu(x) if i < last else x
            hyper_in = x.transpose([1, 0, 2])  # B x M x C'
        if self.channels_last_upscaling:
            upscaling = None if gemm_weights is None else gemm_weights["upscaling"]
            masks = self._masks_channels_last(src, hyper_in, h, w, upscaling)
        else:
            b, c = src.shape[0], src.shape[2]
            src = src.transpose([0, 2, 1]).reshape([b, c, h, w])
            upscaled = self.output_upscaling(src)
            b, c, h, w = upscaled.shape
            masks = paddle.matmul(hyper_in, upscaled.reshape([b, c, h * w])).reshape([b, -1, h, w])
        return masks, self.iou_prediction_head(iou_token_out)

    def gemm_weights(self) -> dict[str, list[paddle.Tensor]]:
        """The output heads' weights in the layouts of their GEMM forms, for
        :meth:`output_heads` (the export stores them as constants of the program).

        "hypernetwork": per layer of the M hypernetwork MLPs, their weights stacked
        (M x in x out) and biases (M x 1 x out): [W_1, b_1, W_2, b_2, ...]; "upscaling": per
        transposed convolution, its weight as in x (ky, kx, out) and its bias repeated for the
        4 positions: [W_1, b_1, W_2, b_2]."""
        mlps = self.output_hypernetworks_mlps
        hyper = []
        for i in range(mlps[0].num_layers):
            hyper.append(paddle.stack([m.layers[i].weight for m in mlps]))
            hyper.append(paddle.stack([m.layers[i].bias for m in mlps]).unsqueeze(1))
        up1, _, _, up2, _ = self.output_upscaling
        upscaling = []
        for conv in (up1, up2):
            upscaling += [_conv_t_gemm_weight(conv), paddle.tile(conv.bias, [4])]
        return {"hypernetwork": hyper, "upscaling": upscaling}

    def _masks_channels_last(
        self,
        src: paddle.Tensor,
        hyper_in: paddle.Tensor,
        h: int,
        w: int,
        upscaling: list[paddle.Tensor] | None = None,
    ) -> paddle.Tensor:
        """``output_upscaling`` and the hypernetwork product on tokens (B x hw x C), exactly
        the same function: a 2 x 2 transposed convolution of stride 2 maps every input pixel
        to its own 2 x 2 output block, i.e. a GEMM C -> 4 C' per token; LayerNorm2d is a
        layer_norm over the last axis. Only the M mask logits per pixel are rearranged into an
        image at the end, instead of transposing 32..256 feature channels at every stage.

        upscaling: the GEMM weights of :meth:`gemm_weights`, if the caller holds them."""
        up1, norm, act1, up2, act2 = self.output_upscaling
        b = src.shape[0]
        c1, c2 = up1.weight.shape[1], up2.weight.shape[1]
        if upscaling is None:

            def conv_t(x: paddle.Tensor, conv: nn.Conv2DTranspose) -> paddle.Tensor:
                # bias after the reshape: Paddle Inference 3.3's fc fusion would take the 4-D
                # transposed weight of a matmul + add for its own and refuse the program
                out = paddle.matmul(x, _conv_t_gemm_weight(conv))
                return out.reshape([b, -1, conv.weight.shape[1]]) + conv.bias

            x = act1(F.layer_norm(conv_t(src, up1), [c1], norm.weight, norm.bias, norm.eps))
            x = act2(conv_t(x, up2))  # B x (hw * 16) x C'
        else:  # GEMM + bias (+ activation, elementwise: before the reshape), fusable as one
            w1, b1, w2, b2 = upscaling
            x = (paddle.matmul(src, w1) + b1).reshape([b, -1, c1])
            x = act1(F.layer_norm(x, [c1], norm.weight, norm.bias, norm.eps))
            x = act2(paddle.matmul(x, w2) + b2).reshape([b, -1, c2])
        masks = paddle.matmul(hyper_in, x, transpose_y=True)  # B x M x (hw * 16)
        # columns are (y, x, ky1, kx1, ky2, kx2): output pixel (4y + 2ky1 + ky2,
        # 4x + 2kx1 + kx2); rearranged in two low-rank transposes (Paddle's CPU transpose of
        # the 7-D form took 3.6 ms for one prompt's four masks, these two 0.8 ms)
        m = hyper_in.shape[1]
        masks = masks.reshape([b * m * h, w, 2, 2, 4]).transpose([0, 2, 1, 3, 4])
        masks = masks.reshape([b * m * h * 2, w * 2, 2, 2]).transpose([0, 2, 1, 3])
        return masks.reshape([b, m, 4 * h, 4 * w])


def _conv_t_gemm_weight(conv: nn.Conv2DTranspose) -> paddle.Tensor:
    """A 2 x 2 stride-2 transposed convolution's weight as a GEMM weight: [in, out, 2, 2] ->
    [in, (ky, kx, out)], each input pixel's 2 x 2 output block side by side."""
    cin, cout = conv.weight.shape[:2]
    return conv.weight.transpose([0, 2, 3, 1]).reshape([cin, 4 * cout])
