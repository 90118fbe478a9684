"""The assembled SAM 3 image model (upstream: sam3/model/sam3_image.py, inference path).

``forward_grounding`` goes from backbone features + text features + geometric prompts to
per-query scores, boxes and masks: geometry encoder -> fusion encoder -> decoder ->
dot-product scoring -> segmentation head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import paddle
from paddle import nn

from .box_ops import box_cxcywh_to_xyxy
from .geometry_encoders import Prompt
from .model_misc import inverse_sigmoid

# backbone_out key of the pixel decoder's image-only convolutions, when a processor has
# precomputed them per image (PixelDecoder.image_terms); absent: computed per prompt
PIXEL_DECODER_TERMS = "pixel_decoder_image_terms"


@dataclass
class FindStage:
    """Which image (``img_ids``) and which text (``text_ids``) each prompt uses, int64 ``[N]``."""

    img_ids: paddle.Tensor
    text_ids: paddle.Tensor
    input_boxes: paddle.Tensor | None = None
    input_boxes_mask: paddle.Tensor | None = None
    input_boxes_label: paddle.Tensor | None = None
    input_points: paddle.Tensor | None = None
    input_points_mask: paddle.Tensor | None = None


class Sam3Image(nn.Layer):
    """SAM 3 detector: finds, boxes and segments every instance of a text / exemplar prompt."""

    TEXT_ID_FOR_TEXT = 0
    TEXT_ID_FOR_VISUAL = 1
    TEXT_ID_FOR_GEOMETRIC = 2

    def __init__(
        self,
        backbone: nn.Layer,
        transformer: nn.Layer,
        input_geometry_encoder: nn.Layer,
        segmentation_head: nn.Layer | None = None,
        num_feature_levels: int = 1,
        o2m_mask_predict: bool = True,
        dot_prod_scoring: nn.Layer | None = None,
        use_instance_query: bool = True,
        multimask_output: bool = True,
        use_dot_prod_scoring: bool = True,
        supervise_joint_box_scores: bool = False,
        inst_interactive_predictor: Any = None,
        **unused: Any,
    ) -> None:
        super().__init__()
        if use_dot_prod_scoring and dot_prod_scoring is None:
            raise ValueError("use_dot_prod_scoring needs a dot_prod_scoring module")
        self.backbone = backbone
        self.geometry_encoder = input_geometry_encoder
        self.transformer = transformer
        self.hidden_dim = transformer.d_model
        self.num_feature_levels = num_feature_levels
        self.segmentation_head = segmentation_head
        self.o2m_mask_predict = o2m_mask_predict
        self.use_dot_prod_scoring = use_dot_prod_scoring
        if use_dot_prod_scoring:
            self.dot_prod_scoring = dot_prod_scoring
        else:
            from ..common import Linear

            self.class_embed = Linear(self.hidden_dim, 1)
        self.supervise_joint_box_scores = supervise_joint_box_scores
        self.use_instance_query = use_instance_query
        self.multimask_output = multimask_output
        self.inst_interactive_predictor = inst_interactive_predictor

    # ---- pieces of forward_grounding ----

    def _get_img_feats(
        self, backbone_out: dict[str, Any], img_ids: paddle.Tensor
    ) -> tuple[list[paddle.Tensor], list[paddle.Tensor], list[tuple[int, int]]]:
        if "backbone_fpn" not in backbone_out:
            raise ValueError("backbone_out holds no image features: run backbone.forward_image")
        feats = backbone_out["backbone_fpn"][-self.num_feature_levels :]
        pos = backbone_out["vision_pos_enc"][-self.num_feature_levels :]
        sizes = [tuple(x.shape[-2:]) for x in pos]

        def seq_first(x: paddle.Tensor) -> paddle.Tensor:  # N x C x H x W -> HW x N x C
            return paddle.gather(x, img_ids, axis=0).flatten(2).transpose([2, 0, 1])

        return [seq_first(x) for x in feats], [seq_first(x) for x in pos], sizes

    def _encode_prompt(
        self,
        backbone_out: dict[str, Any],
        find_input: FindStage,
        geometric_prompt: Prompt,
        encode_text: bool = True,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        img_feats, img_pos, sizes = self._get_img_feats(backbone_out, find_input.img_ids)
        geo_feats, geo_masks = self.geometry_encoder(
            geo_prompt=geometric_prompt,
            img_feats=img_feats,
            img_sizes=sizes,
            img_pos_embeds=img_pos,
        )
        if not encode_text:
            return geo_feats, geo_masks
        txt_feats = paddle.gather(backbone_out["language_features"], find_input.text_ids, axis=1)
        txt_masks = paddle.gather(backbone_out["language_mask"], find_input.text_ids, axis=0)
        prompt = paddle.concat([txt_feats, geo_feats], axis=0)
        prompt_mask = paddle.concat([txt_masks.astype("bool"), geo_masks], axis=1)
        return prompt, prompt_mask

    def _run_encoder(
        self,
        backbone_out: dict[str, Any],
        find_input: FindStage,
        prompt: paddle.Tensor,
        prompt_mask: paddle.Tensor,
    ) -> dict[str, Any]:
        img_feats, img_pos, sizes = self._get_img_feats(backbone_out, find_input.img_ids)
        memory = self.transformer.encoder(
            src=img_feats,
            src_key_padding_mask=None,
            src_pos=img_pos,
            prompt=prompt,
            prompt_key_padding_mask=prompt_mask,
            feat_sizes=sizes,
        )
        return {
            "encoder_hidden_states": memory["memory"],
            "pos_embed": memory["pos_embed"],
            "padding_mask": memory["padding_mask"],
            "level_start_index": memory["level_start_index"],
            "spatial_shapes": sizes,
            "valid_ratios": memory["valid_ratios"],
            "vis_feat_sizes": sizes,
            "prompt_before_enc": prompt,
            "prompt_after_enc": memory.get("memory_text", prompt),
            "prompt_mask": prompt_mask,
        }

    def _run_decoder(
        self,
        encoder_out: dict[str, Any],
        out: dict[str, Any],
        prompt: paddle.Tensor,
        prompt_mask: paddle.Tensor,
    ) -> paddle.Tensor:
        memory = encoder_out["encoder_hidden_states"]
        bs = memory.shape[1]
        decoder = self.transformer.decoder
        query = decoder.query_embed.weight.unsqueeze(1)
        hs, reference_boxes, presence, presence_feats = decoder(
            tgt=query.expand([query.shape[0], bs, query.shape[2]]),
            memory=memory,
            memory_key_padding_mask=encoder_out["padding_mask"],
            pos=encoder_out["pos_embed"],
            spatial_shapes=encoder_out["spatial_shapes"],
            valid_ratios=encoder_out["valid_ratios"],
            memory_text=prompt,
            text_attention_mask=prompt_mask,
        )
        hs = hs.transpose([0, 2, 1, 3])  # L x B x Q x C
        reference_boxes = reference_boxes.transpose([0, 2, 1, 3])
        if presence is not None:
            presence = presence.transpose([0, 2, 1])  # L x B x 1
        out["presence_feats"] = presence_feats
        self._update_scores_and_boxes(out, hs, reference_boxes, prompt, prompt_mask, presence)
        return hs

    def _update_scores_and_boxes(
        self,
        out: dict[str, Any],
        hs: paddle.Tensor,
        reference_boxes: paddle.Tensor,
        prompt: paddle.Tensor,
        prompt_mask: paddle.Tensor,
        dec_presence_out: paddle.Tensor | None = None,
    ) -> None:
        out["queries"] = hs[-1]
        if self.use_dot_prod_scoring:
            outputs_class = self.dot_prod_scoring(hs, prompt, prompt_mask)
        else:
            outputs_class = self.class_embed(hs)
        offsets = self.transformer.decoder.bbox_embed(hs)
        outputs_coord = (inverse_sigmoid(reference_boxes) + offsets).sigmoid()
        if dec_presence_out is not None:
            out["presence_logit_dec"] = dec_presence_out[-1]
        if self.supervise_joint_box_scores:
            if dec_presence_out is None:
                raise ValueError("supervise_joint_box_scores needs the presence token")
            joint = outputs_class.sigmoid() * dec_presence_out.sigmoid().unsqueeze(2)
            outputs_class = inverse_sigmoid(joint).clip(-10.0, 10.0)
        out["pred_logits"] = outputs_class[-1]
        out["pred_boxes"] = outputs_coord[-1]
        out["pred_boxes_xyxy"] = box_cxcywh_to_xyxy(outputs_coord[-1])

    def _run_segmentation_heads(
        self,
        out: dict[str, Any],
        backbone_out: dict[str, Any],
        img_ids: paddle.Tensor,
        encoder_hidden_states: paddle.Tensor,
        prompt: paddle.Tensor,
        prompt_mask: paddle.Tensor,
        hs: paddle.Tensor,
    ) -> None:
        if self.segmentation_head is None:
            return
        seg = self.segmentation_head(
            backbone_feats=backbone_out["backbone_fpn"],
            obj_queries=hs,
            image_ids=img_ids,
            encoder_hidden_states=encoder_hidden_states,
            prompt=prompt,
            prompt_mask=prompt_mask,
            image_terms=backbone_out.get(PIXEL_DECODER_TERMS),
        )
        out.update(seg)

    # ---- public API ----

    def forward_grounding(
        self,
        backbone_out: dict[str, Any],
        find_input: FindStage,
        find_target: Any = None,
        geometric_prompt: Prompt | None = None,
    ) -> dict[str, Any]:
        """Prompts (text features in ``backbone_out`` + ``geometric_prompt``) -> predictions.

        Returns ``pred_logits`` ``N x Q x 1``, ``pred_boxes`` ``N x Q x 4`` (cx, cy, w, h in
        [0, 1]), ``pred_boxes_xyxy``, ``presence_logit_dec`` ``N x 1``, ``pred_masks``
        ``N x Q x H x W`` (logits at 4x the backbone stride), ``semantic_seg`` ``N x 1 x H x W``,
        ``encoder_hidden_states`` and ``queries``.
        """
        if "language_features" not in backbone_out:
            raise ValueError("backbone_out holds no text features: run backbone.forward_text")
        if geometric_prompt is None:
            geometric_prompt = self._get_dummy_prompt(int(find_input.img_ids.shape[0]))
        prompt, prompt_mask = self._encode_prompt(backbone_out, find_input, geometric_prompt)
        encoder_out = self._run_encoder(backbone_out, find_input, prompt, prompt_mask)
        out: dict[str, Any] = {"encoder_hidden_states": encoder_out["encoder_hidden_states"]}
        hs = self._run_decoder(encoder_out, out, prompt, prompt_mask)
        self._run_segmentation_heads(
            out,
            backbone_out,
            find_input.img_ids,
            out["encoder_hidden_states"],
            prompt,
            prompt_mask,
            hs,
        )
        return out

    def predict_inst(self, inference_state: dict[str, Any], **kwargs: Any):
        """SAM 1 style prediction (points, boxes, mask input) on the image of
        ``inference_state`` (from ``Sam3Processor.set_image``); ``kwargs`` are those of
        ``SAM3InteractiveImagePredictor.predict``. Returns ``(masks, ious, low_res_logits)``."""
        predictor = self.inst_interactive_predictor
        if predictor is None:
            raise ValueError(
                "this model has no interactive predictor: build it with "
                "enable_inst_interactivity=True"
            )
        backbone_out = inference_state.get("backbone_out", {}).get("sam2_backbone_out")
        if backbone_out is None or "original_height" not in inference_state:
            raise ValueError("predict_inst needs a state from Sam3Processor.set_image")
        hw = (inference_state["original_height"], inference_state["original_width"])
        predictor.set_features(backbone_out, [hw])
        try:
            return predictor.predict(**kwargs)
        finally:
            predictor.reset_predictor()

    def _get_dummy_prompt(self, num_prompts: int = 1) -> Prompt:
        return Prompt(
            box_embeddings=paddle.zeros([0, num_prompts, 4], "float32"),
            box_mask=paddle.zeros([num_prompts, 0], "bool"),
        )
