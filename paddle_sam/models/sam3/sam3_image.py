"""The assembled SAM 3 image model (upstream: sam3/model/sam3_image.py, inference path).

``forward_grounding`` goes from backbone features + text features + geometric prompts to
per-query scores, boxes and masks: geometry encoder -> fusion encoder -> decoder ->
dot-product scoring -> segmentation head. ``forward_video_grounding_multigpu`` runs it on the
frames of a video one by one, with a per-frame cache, mask NMS and the SAM 2 neck's features
for the tracker (upstream ``Sam3ImageOnVideoMultiGPU``, in one process).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
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


def _float32_frame(frame: Any) -> paddle.Tensor:
    """A ``3 x H x W`` frame (NumPy array or tensor, any float type) as a float32 tensor."""
    if isinstance(frame, paddle.Tensor):
        return frame.astype("float32")
    return paddle.to_tensor(np.asarray(frame, dtype=np.float32))


class Sam3Image(nn.Layer):
    """SAM 3 detector: finds, boxes and segments every instance of a text / exemplar prompt."""

    TEXT_ID_FOR_TEXT = 0
    TEXT_ID_FOR_VISUAL = 1
    TEXT_ID_FOR_GEOMETRIC = 2

    # video grounding (upstream ``Sam3ImageOnVideoMultiGPU``), in one process: rank 0 of 1
    rank = 0
    world_size = 1
    # cast the SAM 2 neck's features to bfloat16 as upstream does for its all-gather; None:
    # upstream's default, on when the backbone is a ``SAM3VLBackbone``
    gather_backbone_out: bool | None = None

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

    # ---- video grounding (upstream: Sam3ImageOnVideoMultiGPU) ----

    def _get_img_feats_on_the_fly(
        self, backbone_out: dict[str, Any], find_input: FindStage
    ) -> tuple[dict[str, Any], FindStage]:
        """Upstream ``Sam3Image._get_img_feats`` where ``backbone_out`` holds the frames
        (``img_batch_all_stages``: a ``T x 3 x H x W`` tensor or a list of ``3 x H x W``
        tensors) instead of their features: the backbone runs on the prompts' unique images
        only, and ``find_input``'s image ids are mapped to rows of the new features
        (upstream's ``id_mapping``). Returns ``(backbone_out with the features, find_input
        with mapped ids)``; a ``backbone_out`` that already holds features is returned as is
        (its ``id_mapping``, if any, applied)."""
        ids = np.asarray(find_input.img_ids.numpy(), dtype=np.int64).reshape(-1)
        if "backbone_fpn" not in backbone_out:
            img_batch = backbone_out["img_batch_all_stages"]
            unique_ids = np.unique(ids) if ids.size > 1 else ids
            if isinstance(img_batch, paddle.Tensor):
                image = paddle.gather(img_batch, paddle.to_tensor(unique_ids), axis=0)
            else:  # frames may be float16 (upstream's storage): float32 before any op
                image = paddle.stack([_float32_frame(img_batch[int(i)]) for i in unique_ids])
            id_mapping = np.full(len(img_batch), -1, dtype=np.int64)
            id_mapping[unique_ids] = np.arange(len(unique_ids))
            backbone_out = {
                **backbone_out,
                **self.backbone.forward_image(image.astype("float32")),
                "id_mapping": paddle.to_tensor(id_mapping),
            }
        id_mapping = backbone_out.get("id_mapping")
        if id_mapping is not None:
            ids = np.asarray(id_mapping.numpy())[ids]
            if (ids < 0).any():
                raise ValueError("find_input asks for an image whose features were not computed")
            find_input = dataclasses.replace(find_input, img_ids=paddle.to_tensor(ids))
        return backbone_out, find_input

    @paddle.no_grad()
    def forward_video_grounding_multigpu(
        self,
        backbone_out: dict[str, Any],
        find_inputs: list[FindStage],
        geometric_prompt: Prompt,
        frame_idx: int,
        num_frames: int,
        multigpu_buffer: dict[int, dict[str, Any]],
        track_in_reverse: bool = False,
        return_sam2_backbone_feats: bool = False,
        run_nms: bool = False,
        nms_prob_thresh: float | None = None,
        nms_iou_thresh: float | None = None,
        **kwargs: Any,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The detector's outputs on frame ``frame_idx`` of a video (upstream
        ``Sam3ImageOnVideoMultiGPU.forward_video_grounding_multigpu``, in one process).

        ``backbone_out`` holds the text features and ``img_batch_all_stages`` (the frames);
        ``find_inputs`` one :class:`FindStage` per frame. ``multigpu_buffer`` (a dict the
        caller keeps between calls) caches per-frame outputs: as upstream with one process,
        the chunk of the current frame is computed if missing, the previous frame's entry is
        evicted and the next frame's (in the tracking direction) computed ahead. Returns
        ``(out, backbone_out)``: ``out`` holds ``pred_logits`` (those removed by the mask NMS
        lowered by 1e4 when ``run_nms``), ``pred_boxes``, ``pred_boxes_xyxy``, ``pred_masks``
        and, when :attr:`gather_backbone_out`, the SAM 2 neck's features for the tracker in
        bfloat16 (``tracker_backbone_fpn_0/1/2``) and their position encodings
        (``tracker_backbone_pos_enc``). Other ``kwargs`` are accepted and unused, as upstream.
        """
        del kwargs
        # Step 1: fetch the detector outputs in the current chunk from buffer
        frame_idx_curr_b = frame_idx - frame_idx % self.world_size
        frame_idx_curr_e = min(frame_idx_curr_b + self.world_size, num_frames)
        if frame_idx not in multigpu_buffer:
            self._build_multigpu_buffer_next_chunk(
                backbone_out=backbone_out,
                find_inputs=find_inputs,
                geometric_prompt=geometric_prompt,
                frame_idx_begin=frame_idx_curr_b,
                frame_idx_end=frame_idx_curr_e,
                num_frames=num_frames,
                multigpu_buffer=multigpu_buffer,
                run_nms=run_nms,
                nms_prob_thresh=nms_prob_thresh,
                nms_iou_thresh=nms_iou_thresh,
            )
        out = {}
        for k, v in multigpu_buffer[frame_idx].items():
            # upstream's filter (its keys never start with "sam2_backbone_")
            if k.startswith("sam2_backbone_") and not return_sam2_backbone_feats:
                continue
            out[k] = v

        # Step 2: remove detection outputs of the previous chunk from cache
        if not track_in_reverse and frame_idx_curr_b - self.world_size >= 0:
            frame_idx_prev_e = frame_idx_curr_b
            frame_idx_prev_b = frame_idx_curr_b - self.world_size
        elif track_in_reverse and frame_idx_curr_e < num_frames:
            frame_idx_prev_b = frame_idx_curr_e
            frame_idx_prev_e = min(frame_idx_prev_b + self.world_size, num_frames)
        else:
            frame_idx_prev_b = frame_idx_prev_e = None
        if frame_idx_prev_b is not None:
            for frame_idx_rm in range(frame_idx_prev_b, frame_idx_prev_e):
                multigpu_buffer.pop(frame_idx_rm, None)

        # Step 3: compute and cache detection outputs of the next chunk ahead of time
        if not track_in_reverse and frame_idx_curr_e < num_frames:
            frame_idx_next_b = frame_idx_curr_e
            frame_idx_next_e = min(frame_idx_next_b + self.world_size, num_frames)
        elif track_in_reverse and frame_idx_curr_b - self.world_size >= 0:
            frame_idx_next_e = frame_idx_curr_b
            frame_idx_next_b = frame_idx_curr_b - self.world_size
        else:
            frame_idx_next_b = frame_idx_next_e = None
        if frame_idx_next_b is not None and frame_idx_next_b not in multigpu_buffer:
            self._build_multigpu_buffer_next_chunk(
                backbone_out=backbone_out,
                find_inputs=find_inputs,
                geometric_prompt=geometric_prompt,
                frame_idx_begin=frame_idx_next_b,
                frame_idx_end=frame_idx_next_e,
                num_frames=num_frames,
                multigpu_buffer=multigpu_buffer,
                run_nms=run_nms,
                nms_prob_thresh=nms_prob_thresh,
                nms_iou_thresh=nms_iou_thresh,
            )
        return out, backbone_out

    def _build_multigpu_buffer_next_chunk(
        self,
        backbone_out: dict[str, Any],
        find_inputs: list[FindStage],
        geometric_prompt: Prompt,
        frame_idx_begin: int,
        frame_idx_end: int,
        num_frames: int,
        multigpu_buffer: dict[int, dict[str, Any]],
        run_nms: bool = False,
        nms_prob_thresh: float | None = None,
        nms_iou_thresh: float | None = None,
    ) -> None:
        """Detector outputs on a chunk of frames (one frame in one process) into
        ``multigpu_buffer`` (upstream ``_build_multigpu_buffer_next_chunk``)."""
        from .perflib.nms import nms_masks
        from .vl_combiner import SAM3VLBackbone

        frame_idx_local_gpu = min(frame_idx_begin + self.rank, frame_idx_end - 1)
        frame_backbone_out, find_input = self._get_img_feats_on_the_fly(
            backbone_out, find_inputs[frame_idx_local_gpu]
        )
        out_local = self.forward_grounding(
            backbone_out=frame_backbone_out,
            find_input=find_input,
            find_target=None,
            geometric_prompt=geometric_prompt,
        )
        if run_nms:
            if nms_prob_thresh is None or nms_iou_thresh is None:
                raise ValueError("run_nms needs nms_prob_thresh and nms_iou_thresh")
            pred_logits = out_local["pred_logits"]
            pred_probs = pred_logits.squeeze(-1).sigmoid()
            pred_masks = out_local["pred_masks"]
            removed = []
            for prompt_idx in range(pred_probs.shape[0]):
                keep = nms_masks(
                    pred_probs=pred_probs[prompt_idx],
                    pred_masks=pred_masks[prompt_idx],
                    prob_threshold=nms_prob_thresh,
                    iou_threshold=nms_iou_thresh,
                )
                removed.append((~keep).astype(pred_logits.dtype))
            # a very low score for those detections removed by NMS
            out_local["pred_logits"] = pred_logits - 1e4 * paddle.stack(removed).unsqueeze(-1)

        gather_backbone_out = self.gather_backbone_out
        if gather_backbone_out is None:
            gather_backbone_out = isinstance(self.backbone, SAM3VLBackbone)
        if gather_backbone_out:
            feats = frame_backbone_out["sam2_backbone_out"]
            if feats is None or len(feats["backbone_fpn"]) != 3:
                raise ValueError("video grounding needs the SAM 2 neck's three feature levels")
            # upstream casts them to bfloat16 for its all-gather, with one process too
            backbone_fpn_bf16 = [x.astype("bfloat16") for x in feats["backbone_fpn"]]
            vision_pos_enc = feats["vision_pos_enc"]

        out_local = {
            "pred_logits": out_local["pred_logits"],
            "pred_boxes": out_local["pred_boxes"],
            "pred_boxes_xyxy": out_local["pred_boxes_xyxy"],
            "pred_masks": out_local["pred_masks"],
        }
        for rank in range(self.world_size):
            frame_idx_to_save = frame_idx_begin + rank
            if frame_idx_to_save >= num_frames:
                continue
            frame_buffer = dict(out_local)
            if gather_backbone_out:
                frame_buffer["tracker_backbone_fpn_0"] = backbone_fpn_bf16[0]
                frame_buffer["tracker_backbone_fpn_1"] = backbone_fpn_bf16[1]
                frame_buffer["tracker_backbone_fpn_2"] = backbone_fpn_bf16[2]
                frame_buffer["tracker_backbone_pos_enc"] = vision_pos_enc
            multigpu_buffer[frame_idx_to_save] = frame_buffer

    def _interactive_predictor(self) -> Any:
        """The SAM 1 style predictor, or a ValueError saying how to build a model with one."""
        if self.inst_interactive_predictor is None:
            raise ValueError(
                "this model has no interactive predictor: build it with "
                "enable_inst_interactivity=True"
            )
        return self.inst_interactive_predictor

    def predict_inst(self, inference_state: dict[str, Any], **kwargs: Any):
        """SAM 1 style prediction (points, boxes, mask input) on the image of
        ``inference_state`` (from ``Sam3Processor.set_image``); ``kwargs`` are those of
        ``SAM3InteractiveImagePredictor.predict``. Returns ``(masks, ious, low_res_logits)``."""
        predictor = self._interactive_predictor()
        backbone_out = inference_state.get("backbone_out", {}).get("sam2_backbone_out")
        if backbone_out is None or "original_height" not in inference_state:
            raise ValueError("predict_inst needs a state from Sam3Processor.set_image")
        hw = (inference_state["original_height"], inference_state["original_width"])
        predictor.set_features(backbone_out, [hw])
        try:
            return predictor.predict(**kwargs)
        finally:
            predictor.reset_predictor()

    def predict_inst_batch(self, inference_state: dict[str, Any], *args: Any, **kwargs: Any):
        """SAM 1 style prediction on each image of ``inference_state`` (from
        ``Sam3Processor.set_image_batch``); ``args`` and ``kwargs`` are those of
        ``SAM3InteractiveImagePredictor.predict_batch`` (``point_coords_batch``,
        ``point_labels_batch``, ``box_batch``, ``mask_input_batch``: one entry per image, or
        None; ``multimask_output``, ``return_logits``, ``normalize_coords``). Returns
        ``(masks, ious, low_res_logits)``, three lists with one entry per image."""
        predictor = self._interactive_predictor()
        backbone_out = inference_state.get("backbone_out", {}).get("sam2_backbone_out")
        if backbone_out is None or "original_heights" not in inference_state:
            raise ValueError("predict_inst_batch needs a state from Sam3Processor.set_image_batch")
        heights = inference_state["original_heights"]
        widths = inference_state["original_widths"]
        batch_size = backbone_out["backbone_fpn"][-1].shape[0]
        if not batch_size == len(heights) == len(widths):
            raise ValueError(
                f"Batch size mismatch in predict_inst_batch: {batch_size} images in the "
                f"features, {len(heights)} original heights, {len(widths)} original widths"
            )
        sizes = list(zip(heights, widths, strict=True))
        predictor.set_features(backbone_out, sizes, is_batch=True)
        try:
            return predictor.predict_batch(*args, **kwargs)
        finally:
            predictor.reset_predictor()

    def _get_dummy_prompt(self, num_prompts: int = 1) -> Prompt:
        return Prompt(
            box_embeddings=paddle.zeros([0, num_prompts, 4], "float32"),
            box_mask=paddle.zeros([num_prompts, 0], "bool"),
        )
