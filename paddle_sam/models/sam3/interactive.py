"""SAM 1 style clicks and boxes on SAM 3 (``predict_inst``): the tracker's prompt encoder and
SAM 2 style mask decoder over the second neck's features.

Upstream: sam3/sam/mask_decoder.py (MaskDecoder), sam3/model/sam1_task_predictor.py
(SAM3InteractiveImagePredictor) and the parts of sam3_tracker_base.py that they use. The
prompt encoder and the two-way transformer are SAM v1's (same parameters and maths).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
from paddle import nn

from ..common import MLP, LayerNorm2d, Linear, connected_components, resize_bilinear
from ..sam_v1.prompt_encoder import PromptEncoder
from ..sam_v1.transformer import TwoWayTransformer


class MaskDecoder(nn.Layer):
    """SAM 2 mask decoder: SAM's, plus high-resolution skip features (``conv_s0``/``conv_s1``),
    an object-score token and, for single-mask output, a fallback to the best multimask
    output when the single mask is unstable."""

    def __init__(
        self,
        *,
        transformer_dim: int,
        transformer: nn.Layer,
        num_multimask_outputs: int = 3,
        activation: type[nn.Layer] = nn.GELU,
        iou_head_depth: int = 3,
        iou_head_hidden_dim: int = 256,
        use_high_res_features: bool = False,
        iou_prediction_use_sigmoid: bool = False,
        dynamic_multimask_via_stability: bool = False,
        dynamic_multimask_stability_delta: float = 0.05,
        dynamic_multimask_stability_thresh: float = 0.98,
        pred_obj_scores: bool = False,
        pred_obj_scores_mlp: bool = False,
        use_multimask_token_for_obj_ptr: bool = False,
    ) -> None:
        super().__init__()
        d = transformer_dim
        self.transformer_dim = d
        self.transformer = transformer
        self.num_multimask_outputs = num_multimask_outputs
        self.iou_token = nn.Embedding(1, d)
        self.num_mask_tokens = num_multimask_outputs + 1
        self.mask_tokens = nn.Embedding(self.num_mask_tokens, d)
        self.pred_obj_scores = pred_obj_scores
        if pred_obj_scores:
            self.obj_score_token = nn.Embedding(1, d)
        self.use_multimask_token_for_obj_ptr = use_multimask_token_for_obj_ptr
        self.output_upscaling = nn.Sequential(
            nn.Conv2DTranspose(d, d // 4, kernel_size=2, stride=2),
            LayerNorm2d(d // 4),
            activation(),
            nn.Conv2DTranspose(d // 4, d // 8, kernel_size=2, stride=2),
            activation(),
        )
        self.use_high_res_features = use_high_res_features
        if use_high_res_features:
            self.conv_s0 = nn.Conv2D(d, d // 8, kernel_size=1, stride=1)
            self.conv_s1 = nn.Conv2D(d, d // 4, kernel_size=1, stride=1)
        self.output_hypernetworks_mlps = nn.LayerList(
            MLP(d, d, d // 8, 3) for _ in range(self.num_mask_tokens)
        )
        self.iou_prediction_head = MLP(
            d,
            iou_head_hidden_dim,
            self.num_mask_tokens,
            iou_head_depth,
            sigmoid_output=iou_prediction_use_sigmoid,
        )
        if pred_obj_scores:
            self.pred_obj_score_head = MLP(d, d, 1, 3) if pred_obj_scores_mlp else Linear(d, 1)
        self.dynamic_multimask_via_stability = dynamic_multimask_via_stability
        self.dynamic_multimask_stability_delta = dynamic_multimask_stability_delta
        self.dynamic_multimask_stability_thresh = dynamic_multimask_stability_thresh

    def forward(
        self,
        image_embeddings: paddle.Tensor,
        image_pe: paddle.Tensor,
        sparse_prompt_embeddings: paddle.Tensor,
        dense_prompt_embeddings: paddle.Tensor,
        multimask_output: bool,
        repeat_image: bool,
        high_res_features: list[paddle.Tensor] | None = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """Masks ``B x C x 4H x 4W`` (logits), IoU ``B x C`` (C = 3 or 1), SAM output tokens
        and object-score logits ``B x 1``."""
        masks, iou_pred, mask_tokens_out, obj_logits = self.predict_masks(
            image_embeddings,
            image_pe,
            sparse_prompt_embeddings,
            dense_prompt_embeddings,
            repeat_image,
            high_res_features,
        )
        if multimask_output:
            masks, iou_pred = masks[:, 1:], iou_pred[:, 1:]
        elif self.dynamic_multimask_via_stability and not self.training:
            masks, iou_pred = self._dynamic_multimask_via_stability(masks, iou_pred)
        else:
            masks, iou_pred = masks[:, 0:1], iou_pred[:, 0:1]
        if multimask_output and self.use_multimask_token_for_obj_ptr:
            tokens = mask_tokens_out[:, 1:]
        else:
            tokens = mask_tokens_out[:, 0:1]
        return masks, iou_pred, tokens, obj_logits

    def predict_masks(
        self,
        image_embeddings: paddle.Tensor,
        image_pe: paddle.Tensor,
        sparse_prompt_embeddings: paddle.Tensor,
        dense_prompt_embeddings: paddle.Tensor,
        repeat_image: bool,
        high_res_features: list[paddle.Tensor] | None = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        parts = [self.iou_token.weight, self.mask_tokens.weight]
        if self.pred_obj_scores:
            parts.insert(0, self.obj_score_token.weight)
        s = 1 if self.pred_obj_scores else 0
        output_tokens = paddle.concat(parts, axis=0)
        n = sparse_prompt_embeddings.shape[0]
        output_tokens = output_tokens.unsqueeze(0).expand([n, *output_tokens.shape])
        tokens = paddle.concat([output_tokens, sparse_prompt_embeddings], axis=1)
        if repeat_image:
            src = paddle.repeat_interleave(image_embeddings, n, axis=0)
        else:
            if image_embeddings.shape[0] != n:
                raise ValueError(f"{image_embeddings.shape[0]} image embeddings for {n} prompts")
            src = image_embeddings
        src = src + dense_prompt_embeddings
        pos_src = paddle.repeat_interleave(image_pe, n, axis=0)
        b, c, h, w = src.shape
        hs, src = self.transformer(src, pos_src, tokens)
        iou_token_out = hs[:, s, :]
        mask_tokens_out = hs[:, s + 1 : s + 1 + self.num_mask_tokens, :]

        src = src.transpose([0, 2, 1]).reshape([b, c, h, w])
        if not self.use_high_res_features:
            upscaled = self.output_upscaling(src)
        else:
            dc1, ln1, act1, dc2, act2 = (self.output_upscaling[i] for i in range(5))
            feat_s0, feat_s1 = high_res_features
            upscaled = act1(ln1(dc1(src) + feat_s1))
            upscaled = act2(dc2(upscaled) + feat_s0)
        hyper_in = paddle.stack(
            [mlp(mask_tokens_out[:, i, :]) for i, mlp in enumerate(self.output_hypernetworks_mlps)],
            axis=1,
        )
        b, c, h, w = upscaled.shape
        masks = paddle.matmul(hyper_in, upscaled.reshape([b, c, h * w])).reshape([b, -1, h, w])
        iou_pred = self.iou_prediction_head(iou_token_out)
        if self.pred_obj_scores:
            obj_logits = self.pred_obj_score_head(hs[:, 0, :])
        else:
            obj_logits = paddle.full([iou_pred.shape[0], 1], 10.0, iou_pred.dtype)
        return masks, iou_pred, mask_tokens_out, obj_logits

    def _dynamic_multimask_via_stability(
        self, all_mask_logits: paddle.Tensor, all_iou_scores: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        multi_logits, multi_iou = all_mask_logits[:, 1:], all_iou_scores[:, 1:]
        best = paddle.argmax(multi_iou, axis=-1)
        index = paddle.stack([paddle.arange(best.shape[0], dtype=best.dtype), best], axis=-1)
        best_logits = paddle.gather_nd(multi_logits, index).unsqueeze(1)
        best_iou = paddle.gather_nd(multi_iou, index).unsqueeze(1)
        single_logits, single_iou = all_mask_logits[:, 0:1], all_iou_scores[:, 0:1]
        flat = single_logits.flatten(-2)
        delta = self.dynamic_multimask_stability_delta
        area_i = (flat > delta).astype("float32").sum(-1)
        area_u = (flat > -delta).astype("float32").sum(-1)
        stability = paddle.where(
            area_u > 0, area_i / area_u.clip(min=1.0), paddle.ones_like(area_u)
        )
        stable = stability >= self.dynamic_multimask_stability_thresh  # B x 1
        logits = paddle.where(stable.unsqueeze(-1).unsqueeze(-1), single_logits, best_logits)
        iou = paddle.where(stable, single_iou, best_iou)
        return logits, iou


class Sam3TrackerHeads(nn.Layer):
    """What ``predict_inst`` uses of upstream's tracker (``Sam3TrackerBase``): the SAM prompt
    encoder and mask decoder and ``no_mem_embed``. The video memory modules are not ported."""

    def __init__(
        self,
        image_size: int = 1008,
        backbone_stride: int = 14,
        hidden_dim: int = 256,
        num_heads: int = 8,
        mlp_dim: int = 2048,
        sam_mask_decoder_extra_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.image_size = image_size
        self.backbone_stride = backbone_stride
        self.hidden_dim = hidden_dim
        self.num_feature_levels = 3
        self.no_mem_embed = self.create_parameter(
            [1, 1, hidden_dim], default_initializer=nn.initializer.TruncatedNormal(std=0.02)
        )
        size = image_size // backbone_stride
        self.sam_image_embedding_size = size
        self.sam_prompt_encoder = PromptEncoder(
            embed_dim=hidden_dim,
            image_embedding_size=(size, size),
            input_image_size=(image_size, image_size),
            mask_in_chans=16,
        )
        extra = {
            "dynamic_multimask_via_stability": True,
            "dynamic_multimask_stability_delta": 0.05,
            "dynamic_multimask_stability_thresh": 0.98,
        }
        extra.update(sam_mask_decoder_extra_args or {})
        self.sam_mask_decoder = MaskDecoder(
            num_multimask_outputs=3,
            transformer=TwoWayTransformer(
                depth=2, embedding_dim=hidden_dim, mlp_dim=mlp_dim, num_heads=num_heads
            ),
            transformer_dim=hidden_dim,
            iou_head_depth=3,
            iou_head_hidden_dim=256,
            use_high_res_features=True,
            iou_prediction_use_sigmoid=True,
            pred_obj_scores=True,
            pred_obj_scores_mlp=True,
            use_multimask_token_for_obj_ptr=True,
            **extra,
        )

    def _prepare_backbone_features(
        self, backbone_out: dict[str, Any]
    ) -> tuple[dict, list[paddle.Tensor], list[paddle.Tensor], list[tuple[int, int]]]:
        """Last ``num_feature_levels`` levels, flattened ``N x C x H x W -> HW x N x C``."""
        feats = backbone_out["backbone_fpn"][-self.num_feature_levels :]
        pos = backbone_out["vision_pos_enc"][-self.num_feature_levels :]
        sizes = [tuple(x.shape[-2:]) for x in pos]
        flat = [x.flatten(2).transpose([2, 0, 1]) for x in feats]
        flat_pos = [x.flatten(2).transpose([2, 0, 1]) for x in pos]
        return dict(backbone_out), flat, flat_pos, sizes


class SAM3InteractiveImagePredictor(nn.Layer):
    """SAM 1 task (points, boxes, mask input -> masks) on cached SAM 3 features.

    Numpy in, numpy out, as upstream's ``predict``. Point coordinates and boxes are pixels of
    the original image (``normalize_coords=True``) or already in [0, 1].
    """

    def __init__(
        self,
        sam_model: Sam3TrackerHeads,
        mask_threshold: float = 0.0,
        max_hole_area: float = 256.0,
        max_sprinkle_area: float = 0.0,
    ) -> None:
        super().__init__()
        self.model = sam_model
        self.mask_threshold = mask_threshold
        self.max_hole_area = max_hole_area
        self.max_sprinkle_area = max_sprinkle_area
        s = sam_model.image_size // sam_model.backbone_stride
        self._bb_feat_sizes = [(4 * s, 4 * s), (2 * s, 2 * s), (s, s)]
        self.reset_predictor()

    def reset_predictor(self) -> None:
        self._is_image_set = False
        self._features = None
        self._orig_hw = None
        self._is_batch = False

    def _transform_coords(
        self, coords: paddle.Tensor, normalize: bool, orig_hw: tuple[int, int]
    ) -> paddle.Tensor:
        if normalize:
            h, w = orig_hw
            coords = coords / paddle.to_tensor([w, h], dtype=coords.dtype)
        return coords * self.model.image_size

    def _prep_prompts(
        self,
        point_coords: Any,
        point_labels: Any,
        box: Any,
        mask_logits: Any,
        normalize_coords: bool,
        img_idx: int = -1,
    ) -> tuple[Any, Any, Any, Any]:
        coords = labels = boxes = mask_input = None
        orig_hw = self._orig_hw[img_idx]
        if point_coords is not None:
            if point_labels is None:
                raise ValueError("point_labels must be supplied if point_coords is supplied")
            pts = np.asarray(point_coords, dtype=np.float32)
            lab = np.asarray(point_labels, dtype=np.int32)
            if pts.shape[-1] != 2 or pts.shape[:-1] != lab.shape:
                raise ValueError(
                    f"point_coords {pts.shape} must be (..., N, 2) with labels (..., N); "
                    f"labels are {lab.shape}"
                )
            coords = self._transform_coords(paddle.to_tensor(pts), normalize_coords, orig_hw)
            labels = paddle.to_tensor(lab)
            if coords.ndim == 2:
                coords, labels = coords.unsqueeze(0), labels.unsqueeze(0)
        if box is not None:
            b = np.asarray(box, dtype=np.float32)
            if b.shape[-1] != 4:
                raise ValueError(f"box must be x0, y0, x1, y1 (last axis 4), got shape {b.shape}")
            boxes = self._transform_coords(
                paddle.to_tensor(b.reshape(-1, 2, 2)), normalize_coords, orig_hw
            )
        if mask_logits is not None:
            mask_input = paddle.to_tensor(np.asarray(mask_logits, dtype=np.float32))
            if mask_input.ndim == 3:
                mask_input = mask_input.unsqueeze(0)
        return mask_input, coords, labels, boxes

    @paddle.no_grad()
    def predict(
        self,
        point_coords: Any = None,
        point_labels: Any = None,
        box: Any = None,
        mask_input: Any = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks ``C x H x W`` (original size), IoU predictions ``C``, low-res logits
        ``C x 4h x 4w`` (mask_input for a next call). With several boxes, one more leading
        axis. With a batch of images set, the last one is used, as upstream."""
        if not self._is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")
        return self._predict_numpy(
            point_coords,
            point_labels,
            box,
            mask_input,
            multimask_output,
            return_logits,
            normalize_coords,
            img_idx=-1,
        )

    @paddle.no_grad()
    def predict_batch(
        self,
        point_coords_batch: Sequence[Any] | None = None,
        point_labels_batch: Sequence[Any] | None = None,
        box_batch: Sequence[Any] | None = None,
        mask_input_batch: Sequence[Any] | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """:meth:`predict` on each image of a batch (features set with ``is_batch=True``, as
        ``Sam3Image.predict_inst_batch`` does): each ``*_batch`` argument is ``None`` or holds
        one entry per image (itself ``None`` or that image's prompt, in :meth:`predict`'s
        forms, e.g. ``B x N x 2`` points and ``B x N`` labels, or ``B x 4`` boxes, for B
        objects). Returns three lists with one entry per image: masks, IoU predictions and
        low-res logits, each as :meth:`predict` returns them for that image."""
        if not self._is_image_set:
            raise RuntimeError(
                "An image must be set with .set_image_batch(...) before mask prediction."
            )
        if not self._is_batch:
            raise RuntimeError(
                "predict_batch needs a batch of images (set_image_batch / predict_inst_batch); "
                "for one image use predict"
            )
        num_images = self._features["image_embed"].shape[0]
        per_image = {
            "point_coords_batch": point_coords_batch,
            "point_labels_batch": point_labels_batch,
            "box_batch": box_batch,
            "mask_input_batch": mask_input_batch,
        }
        for name, value in per_image.items():
            if value is not None and len(value) != num_images:
                raise ValueError(
                    f"{name} must hold one entry per image: {len(value)} entries for "
                    f"{num_images} images"
                )
        all_masks, all_ious, all_low_res = [], [], []
        for i in range(num_images):
            prompts = [None if v is None else v[i] for v in per_image.values()]
            masks, ious, low_res = self._predict_numpy(
                *prompts, multimask_output, return_logits, normalize_coords, img_idx=i
            )
            all_masks.append(masks)
            all_ious.append(ious)
            all_low_res.append(low_res)
        return all_masks, all_ious, all_low_res

    def _predict_numpy(
        self,
        point_coords: Any,
        point_labels: Any,
        box: Any,
        mask_input: Any,
        multimask_output: bool,
        return_logits: bool,
        normalize_coords: bool,
        img_idx: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mask_input, coords, labels, boxes = self._prep_prompts(
            point_coords, point_labels, box, mask_input, normalize_coords, img_idx=img_idx
        )
        masks, iou, low_res = self._predict(
            coords, labels, boxes, mask_input, multimask_output, return_logits, img_idx=img_idx
        )
        return (
            masks.squeeze(0).astype("float32").numpy(),
            iou.squeeze(0).astype("float32").numpy(),
            low_res.squeeze(0).astype("float32").numpy(),
        )

    def get_image_embedding(self) -> paddle.Tensor:
        """The cached lowest-resolution image embeddings ``B x C x h x w`` (B images set)."""
        if not self._is_image_set:
            raise RuntimeError(
                "An image must be set with .set_image(...) to generate an embedding."
            )
        return self._features["image_embed"]

    @paddle.no_grad()
    def _predict(
        self,
        point_coords: paddle.Tensor | None,
        point_labels: paddle.Tensor | None,
        boxes: paddle.Tensor | None = None,
        mask_input: paddle.Tensor | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        img_idx: int = -1,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        low_res, iou = self._decode(
            point_coords, point_labels, boxes, mask_input, multimask_output, img_idx
        )
        masks = self._postprocess_masks(low_res, self._orig_hw[img_idx])
        low_res = low_res.clip(-32.0, 32.0)
        if not return_logits:
            masks = masks > self.mask_threshold
        return masks, iou, low_res

    def _decode(
        self,
        point_coords: paddle.Tensor | None,
        point_labels: paddle.Tensor | None,
        boxes: paddle.Tensor | None = None,
        mask_input: paddle.Tensor | None = None,
        multimask_output: bool = True,
        img_idx: int = -1,
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """The mask decoder's raw low-res logits and IoU predictions of :meth:`_predict`, before
        any resizing (each mask is resized on its own, so a caller may keep only some)."""
        points = None
        if point_coords is not None:
            points = (point_coords, point_labels.astype("int32"))
        if boxes is not None:
            box_coords = boxes.reshape([-1, 2, 2])
            box_labels = paddle.to_tensor([[2, 3]], dtype="int32").tile([box_coords.shape[0], 1])
            if points is not None:
                points = (
                    paddle.concat([box_coords, points[0]], axis=1),
                    paddle.concat([box_labels, points[1]], axis=1),
                )
            else:
                points = (box_coords, box_labels)
        sparse, dense = self.model.sam_prompt_encoder(points=points, boxes=None, masks=mask_input)
        batched = points is not None and points[0].shape[0] > 1
        high_res = [f[img_idx].unsqueeze(0) for f in self._features["high_res_feats"]]
        low_res, iou, _, _ = self.model.sam_mask_decoder(
            image_embeddings=self._features["image_embed"][img_idx].unsqueeze(0),
            image_pe=self.model.sam_prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=multimask_output,
            repeat_image=batched,
            high_res_features=high_res,
        )
        return low_res, iou

    def _postprocess_masks(self, masks: paddle.Tensor, orig_hw: tuple[int, int]) -> paddle.Tensor:
        """Optional hole / sprinkle removal, then bilinear resize to the original size.

        Upstream removes components of at most ``max_hole_area`` / ``max_sprinkle_area`` pixels
        (8-connected, as its connected-components backends do) by pushing their logits past
        the threshold; here the labelling is :func:`connected_components` (numpy only).
        """
        masks = masks.astype("float32")
        if self.max_hole_area > 0 or self.max_sprinkle_area > 0:
            masks = self._remove_small_regions(masks)
        return resize_bilinear(masks, orig_hw)

    def _remove_small_regions(self, masks: paddle.Tensor) -> paddle.Tensor:
        m = masks.numpy()
        thr = self.mask_threshold
        out = m.copy()
        for idx in np.ndindex(*m.shape[:2]):
            for area, region, value in (
                (self.max_hole_area, m[idx] <= thr, thr + 10.0),
                (self.max_sprinkle_area, m[idx] > thr, thr - 10.0),
            ):
                if area <= 0:
                    continue
                num, labels, sizes = connected_components(region)
                if num == 1:
                    continue
                small = (labels > 0) & (sizes[labels] <= area)
                out[idx] = np.where(small, value, out[idx])
        return paddle.to_tensor(out)

    def set_features(
        self,
        backbone_out: dict[str, Any],
        orig_hw: Sequence[tuple[int, int]],
        is_batch: bool = False,
    ) -> None:
        """Cache features from the second neck's output (``sam2_backbone_out``), whose two
        finest levels already went through ``conv_s0`` / ``conv_s1``, for the images of
        original sizes ``orig_hw`` (one ``(H, W)`` per image of the batch). ``is_batch``: the
        features are a batch for :meth:`predict_batch` (upstream's batched mode)."""
        # upstream flattens the levels to HW x N x C (with their position encodings) and
        # lays them back out as maps: views in torch, copies here (0.13 s of a SAM 2 tiny
        # set_image), and only layout, so the maps are taken as they are
        maps = list(backbone_out["backbone_fpn"][-self.model.num_feature_levels :])
        n = maps[-1].shape[0]
        if len(orig_hw) != n:
            raise ValueError(f"{n} images in the features but {len(orig_hw)} original sizes")
        sizes = [tuple(m.shape[-2:]) for m in maps]
        if sizes != [tuple(s) for s in self._bb_feat_sizes]:
            raise ValueError(
                f"feature maps of sizes {sizes}, the model's are {self._bb_feat_sizes}"
            )
        maps[-1] = maps[-1] + self.model.no_mem_embed.reshape([1, -1, 1, 1])
        self._features = {"image_embed": maps[-1], "high_res_feats": maps[:-1]}
        self._orig_hw = [(int(h), int(w)) for h, w in orig_hw]
        self._is_image_set = True
        self._is_batch = is_batch
