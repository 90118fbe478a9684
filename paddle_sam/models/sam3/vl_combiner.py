"""Vision and language backbones side by side, without fusion (upstream: vl_combiner.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import paddle
from paddle import nn

from .necks import Sam3DualViTDetNeck


class SAM3VLBackbone(nn.Layer):
    """Runs the vision neck on images and the text encoder on captions.

    ``scalp`` drops that many of the lowest-resolution pyramid levels. Outputs use upstream's
    keys: ``vision_features`` (last kept level), ``vision_pos_enc``, ``backbone_fpn``,
    ``sam2_backbone_out`` (None without the second neck); ``language_features``
    (``L x B x d``), ``language_mask`` (``B x L``, True = padding), ``language_embeds``.
    """

    def __init__(self, visual: Sam3DualViTDetNeck, text: nn.Layer | None, scalp: int = 0) -> None:
        super().__init__()
        self.vision_backbone = visual
        self.language_backbone = text
        self.scalp = scalp

    def forward(
        self,
        samples: paddle.Tensor,
        captions: Sequence[str],
        input_boxes: Any = None,
        additional_text: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        output = self.forward_image(samples)
        output.update(self.forward_text(captions, input_boxes, additional_text))
        return output

    def forward_image(self, samples: paddle.Tensor) -> dict[str, Any]:
        sam3_feats, sam3_pos, sam2_feats, sam2_pos = self.vision_backbone(samples)
        if self.scalp > 0:
            sam3_feats, sam3_pos = sam3_feats[: -self.scalp], sam3_pos[: -self.scalp]
            if sam2_feats is not None and sam2_pos is not None:
                sam2_feats, sam2_pos = sam2_feats[: -self.scalp], sam2_pos[: -self.scalp]
        sam2_output = None
        if sam2_feats is not None and sam2_pos is not None:
            sam2_output = {
                "vision_features": sam2_feats[-1],
                "vision_pos_enc": sam2_pos,
                "backbone_fpn": sam2_feats,
            }
        return {
            "vision_features": sam3_feats[-1],
            "vision_pos_enc": sam3_pos,
            "backbone_fpn": sam3_feats,
            "sam2_backbone_out": sam2_output,
        }

    def forward_text(
        self,
        captions: Sequence[str],
        input_boxes: Any = None,
        additional_text: Sequence[str] | None = None,
        device: object = None,
    ) -> dict[str, Any]:
        if self.language_backbone is None:
            raise ValueError("this backbone has no text encoder")
        texts = list(captions) + list(additional_text or [])
        mask, memory, embeds = self.language_backbone(texts, input_boxes, device=device)
        n = len(captions)
        output: dict[str, Any] = {}
        if additional_text is not None:
            k = len(additional_text)
            output["additional_text_features"] = memory[:, n:] if k else memory[:, :0]
            output["additional_text_mask"] = mask[n:] if k else mask[:0]
        output["language_features"] = memory[:, :n]
        output["language_mask"] = mask[:n]
        output["language_embeds"] = embeds[:, :n]
        return output
