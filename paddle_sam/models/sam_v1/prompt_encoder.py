"""Prompt encoder: points, boxes and a dense mask (upstream: modeling/prompt_encoder.py).

Point labels: 1 foreground, 0 background, -1 padding ("not a point"), and, as in upstream's
ONNX export, 2 / 3 for the top-left / bottom-right corners of a box given as two points.
The label embeddings are selected arithmetically (no boolean indexing) so the same code
exports to a static graph with a dynamic number of points.
"""

from __future__ import annotations

import math

import paddle
from paddle import nn

from ..common import LayerNorm2d


class PromptEncoder(nn.Layer):
    def __init__(
        self,
        embed_dim: int,
        image_embedding_size: tuple[int, int],
        input_image_size: tuple[int, int],
        mask_in_chans: int,
        activation: type[nn.Layer] = nn.GELU,
    ) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.input_image_size = tuple(input_image_size)
        self.image_embedding_size = tuple(image_embedding_size)
        self.pe_layer = PositionEmbeddingRandom(embed_dim // 2)

        self.num_point_embeddings: int = 4  # pos/neg point + 2 box corners
        self.point_embeddings = nn.LayerList(
            nn.Embedding(1, embed_dim) for _ in range(self.num_point_embeddings)
        )
        self.not_a_point_embed = nn.Embedding(1, embed_dim)

        self.mask_input_size = (4 * image_embedding_size[0], 4 * image_embedding_size[1])
        self.mask_downscaling = nn.Sequential(
            nn.Conv2D(1, mask_in_chans // 4, kernel_size=2, stride=2),
            LayerNorm2d(mask_in_chans // 4),
            activation(),
            nn.Conv2D(mask_in_chans // 4, mask_in_chans, kernel_size=2, stride=2),
            LayerNorm2d(mask_in_chans),
            activation(),
            nn.Conv2D(mask_in_chans, embed_dim, kernel_size=1),
        )
        self.no_mask_embed = nn.Embedding(1, embed_dim)

    def get_dense_pe(self) -> paddle.Tensor:
        """Positional encoding of the image embedding grid: 1 x embed_dim x H x W."""
        return self.pe_layer(self.image_embedding_size).unsqueeze(0)

    def _embed_points(
        self, points: paddle.Tensor, labels: paddle.Tensor, pad: bool
    ) -> paddle.Tensor:
        """B x N x 2 (input-frame pixels), B x N -> B x N(+1) x embed_dim."""
        points = points + 0.5  # shift to the centre of the pixel
        if pad:
            points = paddle.concat([points, paddle.zeros_like(points[:, :1, :])], axis=1)
            labels = paddle.concat([labels, paddle.full_like(labels[:, :1], -1)], axis=1)
        pe = self.pe_layer.forward_with_coords(points, self.input_image_size)
        # one-hot over the labels -1 .. 3 (all zero for any other value, which then gets no
        # label embedding, as upstream) times the table of the five embeddings: the same sums
        # as adding each embedding where its label matches, in a few ops instead of 25
        codes = paddle.arange(-1, self.num_point_embeddings, dtype=labels.dtype)
        one_hot = (labels.unsqueeze(-1) == codes).astype(pe.dtype)  # B x N x 5
        table = paddle.concat(
            [self.not_a_point_embed.weight] + [e.weight for e in self.point_embeddings]
        )
        return pe * (1.0 - one_hot[:, :, :1]) + paddle.matmul(one_hot, table)

    def _embed_boxes(self, boxes: paddle.Tensor) -> paddle.Tensor:
        """B x 4 (xyxy, input-frame pixels) -> B x 2 x embed_dim."""
        boxes = boxes + 0.5
        coords = boxes.reshape([-1, 2, 2])
        corner = self.pe_layer.forward_with_coords(coords, self.input_image_size)
        return paddle.concat(
            [
                corner[:, :1, :] + self.point_embeddings[2].weight,
                corner[:, 1:, :] + self.point_embeddings[3].weight,
            ],
            axis=1,
        )

    def _embed_masks(self, masks: paddle.Tensor) -> paddle.Tensor:
        """B x 1 x 4H x 4W mask logits -> B x embed_dim x H x W."""
        return self.mask_downscaling(masks)

    @staticmethod
    def _get_batch_size(points, boxes, masks) -> int:
        if points is not None:
            return points[0].shape[0]
        if boxes is not None:
            return boxes.shape[0]
        if masks is not None:
            return masks.shape[0]
        return 1

    def forward(
        self,
        points: tuple[paddle.Tensor, paddle.Tensor] | None,
        boxes: paddle.Tensor | None,
        masks: paddle.Tensor | None,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Sparse (B x N x embed_dim) and dense (B x embed_dim x H x W) prompt embeddings."""
        bs = self._get_batch_size(points, boxes, masks)
        sparse = []
        if points is not None:
            coords, labels = points
            sparse.append(self._embed_points(coords, labels, pad=boxes is None))
        if boxes is not None:
            sparse.append(self._embed_boxes(boxes))
        if sparse:
            sparse_embeddings = paddle.concat(sparse, axis=1) if len(sparse) > 1 else sparse[0]
        else:
            sparse_embeddings = paddle.zeros([bs, 0, self.embed_dim])
        if masks is not None:
            dense_embeddings = self._embed_masks(masks)
        else:
            h, w = self.image_embedding_size
            dense_embeddings = self.no_mask_embed.weight.reshape([1, -1, 1, 1]).expand(
                [bs, -1, h, w]
            )
        return sparse_embeddings, dense_embeddings


class PositionEmbeddingRandom(nn.Layer):
    """Positional encoding with random spatial frequencies (Fourier features)."""

    def __init__(self, num_pos_feats: int = 64, scale: float | None = None) -> None:
        super().__init__()
        if scale is None or scale <= 0.0:
            scale = 1.0
        self.register_buffer(
            "positional_encoding_gaussian_matrix",
            scale * paddle.randn([2, num_pos_feats], dtype="float32"),
            persistable=True,
        )

    def _pe_encoding(self, coords: paddle.Tensor) -> paddle.Tensor:
        """... x 2 coordinates normalised to [0, 1] -> ... x 2 * num_pos_feats."""
        coords = 2 * coords - 1
        coords = paddle.matmul(coords, self.positional_encoding_gaussian_matrix)
        coords = 2 * math.pi * coords
        return paddle.concat([paddle.sin(coords), paddle.cos(coords)], axis=-1)

    def forward(self, size: tuple[int, int]) -> paddle.Tensor:
        """Encoding of an h x w grid of pixel centres: C x h x w."""
        h, w = size
        grid = paddle.ones([h, w], dtype="float32")
        y_embed = (grid.cumsum(0) - 0.5) / h
        x_embed = (grid.cumsum(1) - 0.5) / w
        pe = self._pe_encoding(paddle.stack([x_embed, y_embed], axis=-1))
        return pe.transpose([2, 0, 1])

    def forward_with_coords(
        self, coords_input: paddle.Tensor, image_size: tuple[int, int]
    ) -> paddle.Tensor:
        """B x N x 2 pixel coordinates (x, y) in an image of ``image_size`` (h, w)."""
        size_wh = paddle.to_tensor([image_size[1], image_size[0]], dtype="float32")
        return self._pe_encoding(coords_input.astype("float32") / size_wh)
