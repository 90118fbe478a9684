"""The core of SAM 3's video tracker: SAM heads with object pointers, the memory encoder of each
frame's prediction, and the memory attention that conditions a frame on its memory bank.

Upstream: sam3/model/sam3_tracker_base.py (``Sam3TrackerBase``) and the helpers it uses from
sam3/model/sam3_tracker_utils.py (``select_closest_cond_frames``, ``get_1d_sine_pe``).
Inference only (``self.training`` paths, correction-click sampling,
``trim_past_non_cond_mem_for_eval`` and CPU offloading are not ported). The parameters and
sublayers carry upstream's names, so the state dict is the checkpoint's ``tracker.*`` rows
with that prefix removed.

Memory features that upstream's predictor keeps in its inference state are stored as bfloat16
(``maskmem_features.to(torch.bfloat16)``); :func:`round_to_bfloat16` mirrors that rounding
for callers that keep such a state.
"""

from __future__ import annotations

from typing import Any

import paddle
from paddle import nn

from ..common import MLP, Linear, resize_bilinear
from .interactive import Sam3TrackerHeads
from .memory import resize_antialias
from .model_misc import TransformerWrapper

# a large negative value as a placeholder score for missing objects
NO_OBJ_SCORE = -1024.0


def round_to_bfloat16(x: paddle.Tensor) -> paddle.Tensor:
    """``x`` rounded to bfloat16 (round to nearest even, as torch) and cast back to its dtype."""
    return x.astype("bfloat16").astype(x.dtype)


def get_1d_sine_pe(pos_inds: paddle.Tensor, dim: int, temperature: float = 10000) -> paddle.Tensor:
    """1-D sine/cosine embedding of positions ``pos_inds`` (``N``) -> ``N x dim``: sines of
    ``pos / T^(2 (i // 2) / (dim / 2))`` then cosines of the same."""
    pe_dim = dim // 2
    dim_t = paddle.arange(pe_dim, dtype="float32")
    dim_t = temperature ** (2 * paddle.floor(dim_t / 2) / pe_dim)
    pos_embed = pos_inds.astype("float32").unsqueeze(-1) / dim_t
    return paddle.concat([pos_embed.sin(), pos_embed.cos()], axis=-1)


def select_closest_cond_frames(
    frame_idx: int,
    cond_frame_outputs: dict[int, Any],
    max_cond_frame_num: int,
    keep_first_cond_frame: bool = False,
) -> tuple[dict[int, Any], dict[int, Any]]:
    """Up to ``max_cond_frame_num`` conditioning frames temporally closest to ``frame_idx``
    (the closest before, the closest at or after, then the nearest others; optionally the first
    one kept), and the unselected ones."""
    if max_cond_frame_num == -1 or len(cond_frame_outputs) <= max_cond_frame_num:
        return cond_frame_outputs, {}
    if max_cond_frame_num < 2:
        raise ValueError("we should allow using 2+ conditioning frames")
    selected: dict[int, Any] = {}
    if keep_first_cond_frame:
        idx_first = min((t for t in cond_frame_outputs if t < frame_idx), default=None)
        if idx_first is None:  # maybe tracking in reverse
            idx_first = max((t for t in cond_frame_outputs if t > frame_idx), default=None)
        if idx_first is not None:
            selected[idx_first] = cond_frame_outputs[idx_first]
    idx_before = max((t for t in cond_frame_outputs if t < frame_idx), default=None)
    if idx_before is not None:
        selected[idx_before] = cond_frame_outputs[idx_before]
    idx_after = min((t for t in cond_frame_outputs if t >= frame_idx), default=None)
    if idx_after is not None:
        selected[idx_after] = cond_frame_outputs[idx_after]
    num_remain = max_cond_frame_num - len(selected)
    inds_remain = sorted(
        (t for t in cond_frame_outputs if t not in selected), key=lambda x: abs(x - frame_idx)
    )[:num_remain]
    selected.update((t, cond_frame_outputs[t]) for t in inds_remain)
    unselected = {t: v for t, v in cond_frame_outputs.items() if t not in selected}
    return selected, unselected


def _seq_to_map(x: paddle.Tensor, size: tuple[int, int]) -> paddle.Tensor:
    """``HW x B x C`` -> ``B x C x H x W``."""
    return x.transpose([1, 2, 0]).reshape([x.shape[1], x.shape[2], *size])


class Sam3TrackerBase(Sam3TrackerHeads):
    """Upstream ``Sam3TrackerBase`` for inference: :class:`Sam3TrackerHeads` (prompt encoder,
    mask decoder, ``no_mem_embed``) plus the memory encoder (``maskmem_backbone``), the memory
    attention (``transformer.encoder``), the object-pointer heads and the memory embeddings.

    ``transformer``: a :class:`TransformerWrapper` without decoder (or the bare memory
    attention, which is wrapped); ``maskmem_backbone``: a ``SimpleMaskEncoder``.
    """

    def __init__(
        self,
        transformer: nn.Layer,
        maskmem_backbone: nn.Layer,
        num_maskmem: int = 7,
        image_size: int = 1008,
        backbone_stride: int = 14,
        max_cond_frames_in_attn: int = -1,
        keep_first_cond_frame: bool = False,
        multimask_output_in_sam: bool = False,
        multimask_min_pt_num: int = 1,
        multimask_max_pt_num: int = 1,
        multimask_output_for_tracking: bool = False,
        memory_temporal_stride_for_eval: int = 1,
        non_overlap_masks_for_mem_enc: bool = False,
        max_obj_ptrs_in_encoder: int = 16,
        sam_mask_decoder_extra_args: dict[str, Any] | None = None,
        use_memory_selection: bool = False,
        mf_threshold: float = 0.01,
    ) -> None:
        if not hasattr(transformer, "encoder"):
            transformer = TransformerWrapper(transformer, None, d_model=transformer.d_model)
        if transformer.decoder is not None:
            raise ValueError("transformer should be encoder-only")
        hidden_dim = transformer.d_model
        super().__init__(
            image_size=image_size,
            backbone_stride=backbone_stride,
            hidden_dim=hidden_dim,
            sam_mask_decoder_extra_args=sam_mask_decoder_extra_args,
        )
        self.max_obj_ptrs_in_encoder = max_obj_ptrs_in_encoder
        self.mask_downsample = nn.Conv2D(1, 1, kernel_size=4, stride=4)
        self.transformer = transformer
        self.maskmem_backbone = maskmem_backbone
        self.mem_dim = hidden_dim
        out_proj = getattr(maskmem_backbone, "out_proj", None)
        if getattr(out_proj, "weight", None) is not None:
            self.mem_dim = out_proj.weight.shape[0]  # Conv2D weight: out x in x 1 x 1
        self.num_maskmem = num_maskmem

        def param(shape: list[int]) -> paddle.Tensor:
            return self.create_parameter(
                shape, default_initializer=nn.initializer.TruncatedNormal(std=0.02)
            )

        self.maskmem_tpos_enc = param([num_maskmem, 1, 1, self.mem_dim])
        self.no_mem_pos_enc = param([1, 1, hidden_dim])
        self.sigmoid_scale_for_mem_enc = 20.0
        self.sigmoid_bias_for_mem_enc = -10.0
        self.binarize_mask_from_pts_for_mem_enc = True  # masks from clicks: binarised
        self.non_overlap_masks_for_mem_enc = non_overlap_masks_for_mem_enc
        self.memory_temporal_stride_for_eval = memory_temporal_stride_for_eval
        self.multimask_output_in_sam = multimask_output_in_sam
        self.multimask_min_pt_num = multimask_min_pt_num
        self.multimask_max_pt_num = multimask_max_pt_num
        self.multimask_output_for_tracking = multimask_output_for_tracking
        self.low_res_mask_size = image_size // backbone_stride * 4
        self.input_mask_size = self.low_res_mask_size * 4
        self.sam_prompt_embed_dim = hidden_dim
        self.no_obj_ptr = param([1, hidden_dim])
        self.no_obj_embed_spatial = param([1, self.mem_dim])
        self.obj_ptr_proj = MLP(hidden_dim, hidden_dim, hidden_dim, 3)
        self.obj_ptr_tpos_proj = Linear(hidden_dim, self.mem_dim)
        self.max_cond_frames_in_attn = max_cond_frames_in_attn
        self.keep_first_cond_frame = keep_first_cond_frame
        self.use_memory_selection = use_memory_selection
        self.mf_threshold = mf_threshold

    # ------------------------------------------------------------------ SAM heads

    def _get_tpos_enc(self, rel_pos_list: list[int], max_abs_pos: int | None = None):
        t_diff_max = max_abs_pos - 1 if max_abs_pos is not None else 1
        pos = paddle.to_tensor(list(rel_pos_list), dtype="float32") / t_diff_max
        pos_enc = get_1d_sine_pe(pos, dim=self.hidden_dim)
        return self.obj_ptr_tpos_proj(pos_enc.astype(self.obj_ptr_tpos_proj.weight.dtype))

    def _forward_sam_heads(
        self,
        backbone_features: paddle.Tensor,
        point_inputs: dict[str, paddle.Tensor] | None = None,
        mask_inputs: paddle.Tensor | None = None,
        high_res_features: list[paddle.Tensor] | None = None,
        multimask_output: bool = False,
    ) -> tuple[paddle.Tensor, ...]:
        """Prompt encoder and mask decoder on ``B x C x H x W`` features -> (low-res multimasks,
        high-res multimasks, IoUs, best low-res mask, best high-res mask, object pointer
        ``B x C``, object-score logits ``B x 1``); masks of absent objects are -1024."""
        b = backbone_features.shape[0]
        size = self.sam_image_embedding_size
        if list(backbone_features.shape[1:]) != [self.sam_prompt_embed_dim, size, size]:
            raise ValueError(f"backbone features {backbone_features.shape}, want C={size}x{size}")
        if point_inputs is not None:
            coords = point_inputs["point_coords"]
            labels = point_inputs["point_labels"]
            if coords.shape[0] != b or labels.shape[0] != b:
                raise ValueError("point inputs and features differ in batch size")
        else:  # an empty point (label -1)
            coords = paddle.zeros([b, 1, 2], dtype="float32")
            labels = -paddle.ones([b, 1], dtype="int32")
        sam_mask_prompt = None
        if mask_inputs is not None:
            if mask_inputs.ndim != 4 or list(mask_inputs.shape[:2]) != [b, 1]:
                raise ValueError(f"mask inputs must be B x 1 x H x W, got {mask_inputs.shape}")
            sam_mask_prompt = mask_inputs
            want = list(self.sam_prompt_encoder.mask_input_size)
            if list(mask_inputs.shape[-2:]) != want:
                sam_mask_prompt = resize_antialias(mask_inputs.astype("float32"), want)
        sparse, dense = self.sam_prompt_encoder(
            points=(coords, labels.astype("int32")), boxes=None, masks=sam_mask_prompt
        )
        low_res_multimasks, ious, sam_output_tokens, object_score_logits = self.sam_mask_decoder(
            image_embeddings=backbone_features,
            image_pe=self.sam_prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=multimask_output,
            repeat_image=False,
            high_res_features=high_res_features,
        )
        is_obj_appearing = object_score_logits > 0  # B x 1
        low_res_multimasks = paddle.where(
            is_obj_appearing.unsqueeze(-1).unsqueeze(-1),
            low_res_multimasks,
            paddle.full_like(low_res_multimasks, NO_OBJ_SCORE),
        ).astype("float32")
        high_res_multimasks = resize_bilinear(low_res_multimasks, (self.image_size,) * 2)
        sam_output_token = sam_output_tokens[:, 0]
        if multimask_output:
            best = paddle.argmax(ious, axis=-1)
            index = paddle.stack([paddle.arange(b, dtype=best.dtype), best], axis=-1)
            low_res_masks = paddle.gather_nd(low_res_multimasks, index).unsqueeze(1)
            high_res_masks = paddle.gather_nd(high_res_multimasks, index).unsqueeze(1)
            if sam_output_tokens.shape[1] > 1:
                sam_output_token = paddle.gather_nd(sam_output_tokens, index)
        else:
            low_res_masks, high_res_masks = low_res_multimasks, high_res_multimasks
        obj_ptr = self.obj_ptr_proj(sam_output_token)
        lam = is_obj_appearing.astype(obj_ptr.dtype)
        obj_ptr = lam * obj_ptr + (1 - lam) * self.no_obj_ptr
        return (
            low_res_multimasks,
            high_res_multimasks,
            ious,
            low_res_masks,
            high_res_masks,
            obj_ptr,
            object_score_logits,
        )

    def _use_mask_as_output(
        self,
        backbone_features: paddle.Tensor,
        high_res_features: list[paddle.Tensor] | None,
        mask_inputs: paddle.Tensor,
    ) -> tuple[paddle.Tensor, ...]:
        """A binary mask input as the output (logits +-10), with an object pointer from the
        SAM heads fed the 4x-downsampled mask."""
        out_scale, out_bias = 20.0, -10.0
        mask_float = mask_inputs.astype("float32")
        high_res_masks = mask_float * out_scale + out_bias
        h, w = high_res_masks.shape[-2:]
        low_res_masks = resize_antialias(
            high_res_masks, [h // self.backbone_stride * 4, w // self.backbone_stride * 4]
        )
        ious = paddle.ones([mask_inputs.shape[0], 1], dtype="float32")
        obj_ptr = self._forward_sam_heads(
            backbone_features=backbone_features,
            mask_inputs=self.mask_downsample(mask_float),
            high_res_features=high_res_features,
        )[5]
        is_obj_appearing = (mask_float.flatten(1) > 0).any(axis=1, keepdim=True)
        lam = is_obj_appearing.astype("float32")
        object_score_logits = out_scale * lam + out_bias
        obj_ptr = lam * obj_ptr + (1 - lam) * self.no_obj_ptr
        return (
            low_res_masks,
            high_res_masks,
            ious,
            low_res_masks,
            high_res_masks,
            obj_ptr,
            object_score_logits,
        )

    # ------------------------------------------------------------------ memory

    @staticmethod
    def cal_mem_score(object_score_logits: paddle.Tensor, iou_score: paddle.Tensor):
        norm = paddle.where(
            object_score_logits > 0,
            nn.functional.sigmoid(object_score_logits) * 2 - 1,
            paddle.zeros_like(object_score_logits),
        )
        return (norm * iou_score).mean()

    def frame_filter(
        self, output_dict: dict, track_in_reverse: bool, frame_idx: int, num_frames: int, r: int
    ) -> list[int]:
        """Memory selection (SAM2Long): past non-conditioning frames whose ``eff_iou_score``
        exceeds ``mf_threshold``, plus the adjacent frame."""
        if (frame_idx == 0 and not track_in_reverse) or (
            frame_idx == num_frames - 1 and track_in_reverse
        ):
            return []
        max_num = min(num_frames, self.max_obj_ptrs_in_encoder)
        if not track_in_reverse:
            start, end, step, must_include = frame_idx - 1, 0, -r, frame_idx - 1
        else:
            start, end, step, must_include = frame_idx + 1, num_frames, r, frame_idx + 1
        valid: list[int] = []
        non_cond = output_dict["non_cond_frame_outputs"]
        for i in range(start, end, step):
            if i not in non_cond or "eff_iou_score" not in non_cond[i]:
                continue
            if float(non_cond[i]["eff_iou_score"]) > self.mf_threshold:
                valid.insert(0, i)
            if len(valid) >= max_num - 1:
                break
        if must_include not in valid:
            valid.append(must_include)
        return valid

    def _prepare_memory_conditioned_features(
        self,
        frame_idx: int,
        is_init_cond_frame: bool,
        current_vision_feats: list[paddle.Tensor],
        current_vision_pos_embeds: list[paddle.Tensor],
        feat_sizes: list[tuple[int, int]],
        output_dict: dict,
        num_frames: int,
        track_in_reverse: bool = False,
        use_prev_mem_frame: bool = True,
    ) -> paddle.Tensor:
        """The current frame's top-level features (``HW x B x C``) attended to the memory bank
        of ``output_dict`` -> ``B x C x H x W``; on an initial conditioning frame, features plus
        ``no_mem_embed``."""
        b = current_vision_feats[-1].shape[1]
        c = self.hidden_dim
        h, w = feat_sizes[-1]
        if self.num_maskmem == 0:
            return _seq_to_map(current_vision_feats[-1], (h, w))
        if is_init_cond_frame or not use_prev_mem_frame:
            return _seq_to_map(current_vision_feats[-1] + self.no_mem_embed, (h, w))

        sign = -1 if track_in_reverse else 1
        prompts, prompt_pos = [], []
        cond_outputs = output_dict["cond_frame_outputs"]
        if not cond_outputs:
            raise ValueError("tracking a frame needs at least one conditioning frame")
        selected, unselected = select_closest_cond_frames(
            frame_idx, cond_outputs, self.max_cond_frames_in_attn, self.keep_first_cond_frame
        )
        t_pos_and_prevs = [((frame_idx - t) * sign, out, True) for t, out in selected.items()]
        r = self.memory_temporal_stride_for_eval
        valid_indices: list[int] = []
        if self.use_memory_selection:
            valid_indices = self.frame_filter(
                output_dict, track_in_reverse, frame_idx, num_frames, r
            )
        for t_pos in range(1, self.num_maskmem):
            t_rel = self.num_maskmem - t_pos  # how many frames before the current one
            if self.use_memory_selection:
                if t_rel > len(valid_indices):
                    continue
                prev_frame_idx = valid_indices[-t_rel]
            elif t_rel == 1:
                prev_frame_idx = frame_idx + t_rel if track_in_reverse else frame_idx - t_rel
            elif not track_in_reverse:
                prev_frame_idx = ((frame_idx - 2) // r) * r - (t_rel - 2) * r
            else:
                prev_frame_idx = -(-(frame_idx + 2) // r) * r + (t_rel - 2) * r
            out = output_dict["non_cond_frame_outputs"].get(prev_frame_idx)
            if out is None:
                out = unselected.get(prev_frame_idx)
            t_pos_and_prevs.append((t_pos, out, False))

        for t_pos, prev, is_selected_cond in t_pos_and_prevs:
            if prev is None:
                continue
            feats = prev["maskmem_features"].astype("float32")
            prompts.append(feats.flatten(2).transpose([2, 0, 1]))
            enc = prev["maskmem_pos_enc"][-1]  # may be stored at batch 1 (shared)
            if enc.shape[0] != feats.shape[0]:
                enc = enc.expand([feats.shape[0], -1, -1, -1])
            enc = enc.flatten(2).transpose([2, 0, 1])
            t = 0 if is_selected_cond else t_pos
            prompt_pos.append(enc + self.maskmem_tpos_enc[self.num_maskmem - t - 1])

        max_ptrs = min(num_frames, self.max_obj_ptrs_in_encoder)
        ptr_cond = {
            t: out
            for t, out in selected.items()
            if (t >= frame_idx if track_in_reverse else t <= frame_idx)
        }
        pos_and_ptrs = [((frame_idx - t) * sign, out["obj_ptr"]) for t, out in ptr_cond.items()]
        for t_diff in range(1, max_ptrs):
            if not self.use_memory_selection:
                t = frame_idx + t_diff if track_in_reverse else frame_idx - t_diff
                if t < 0 or (num_frames is not None and t >= num_frames):
                    break
            else:
                if -t_diff <= -len(valid_indices):
                    break
                t = valid_indices[-t_diff]
            out = output_dict["non_cond_frame_outputs"].get(t, unselected.get(t))
            if out is not None:
                pos_and_ptrs.append((t_diff, out["obj_ptr"]))

        num_obj_ptr_tokens = 0
        if pos_and_ptrs:
            pos_list = [p for p, _ in pos_and_ptrs]
            obj_ptrs = paddle.stack([ptr for _, ptr in pos_and_ptrs], axis=0)  # P x B x C
            obj_pos = self._get_tpos_enc(pos_list, max_abs_pos=max_ptrs)
            obj_pos = obj_pos.unsqueeze(1).expand([-1, b, -1])
            if self.mem_dim < c:  # a pointer as C / mem_dim tokens of mem_dim
                k = c // self.mem_dim
                obj_ptrs = obj_ptrs.reshape([-1, b, k, self.mem_dim]).transpose([0, 2, 1, 3])
                obj_ptrs = obj_ptrs.reshape([-1, b, self.mem_dim])
                obj_pos = paddle.repeat_interleave(obj_pos, k, axis=0)
            prompts.append(obj_ptrs)
            prompt_pos.append(obj_pos)
            num_obj_ptr_tokens = obj_ptrs.shape[0]

        out = self._attend_memory(
            current_vision_feats,
            current_vision_pos_embeds,
            paddle.concat(prompts, axis=0),
            paddle.concat(prompt_pos, axis=0),
            feat_sizes,
            num_obj_ptr_tokens,
        )
        return _seq_to_map(out, (h, w))

    def _attend_memory(
        self,
        curr: list[paddle.Tensor],
        curr_pos: list[paddle.Tensor],
        memory: paddle.Tensor,
        memory_pos: paddle.Tensor,
        feat_sizes: list[tuple[int, int]],
        num_obj_ptr_tokens: int,
    ) -> paddle.Tensor:
        """The memory attention (``transformer.encoder``): the current frame's tokens
        (``[HW x B x C]``) attended to the memory bank ``M x B x mem_dim`` (its last
        ``num_obj_ptr_tokens`` tokens object pointers) -> ``HW x B x C``."""
        out = self.transformer.encoder(
            src=curr,
            src_key_padding_mask=[None],
            src_pos=curr_pos,
            prompt=memory,
            prompt_pos=memory_pos,
            prompt_key_padding_mask=None,
            feat_sizes=feat_sizes,
            num_obj_ptr_tokens=num_obj_ptr_tokens,
        )
        return out["memory"]

    def _encode_memory(self, pix_feat: paddle.Tensor, mask_for_mem: paddle.Tensor) -> dict:
        """The memory encoder (``maskmem_backbone``) of features and a mask already squashed,
        scaled and shifted -> ``vision_features`` and ``vision_pos_enc``."""
        return self.maskmem_backbone(pix_feat, mask_for_mem, skip_mask_sigmoid=True)

    def _apply_non_overlapping_constraints(self, pred_masks: paddle.Tensor) -> paddle.Tensor:
        """Keep, at each pixel, only the highest-scoring object; others clamped to <= -10."""
        n = pred_masks.shape[0]
        if n == 1:
            return pred_masks
        max_obj = paddle.argmax(pred_masks, axis=0, keepdim=True)
        keep = max_obj == paddle.arange(n, dtype=max_obj.dtype).reshape([n, 1, 1, 1])
        return paddle.where(keep, pred_masks, pred_masks.clip(max=-10.0))

    def _encode_new_memory(
        self,
        current_vision_feats: list[paddle.Tensor],
        feat_sizes: list[tuple[int, int]],
        pred_masks_high_res: paddle.Tensor,
        object_score_logits: paddle.Tensor,
        is_mask_from_pts: bool,
    ) -> tuple[paddle.Tensor, list[paddle.Tensor]]:
        """Memory features ``B x mem_dim x H x W`` and their position encodings of the current
        frame and its predicted high-res mask logits (binarised when they come from clicks)."""
        pix_feat = _seq_to_map(current_vision_feats[-1], feat_sizes[-1])
        if self.non_overlap_masks_for_mem_enc:
            pred_masks_high_res = self._apply_non_overlapping_constraints(pred_masks_high_res)
        if is_mask_from_pts and self.binarize_mask_from_pts_for_mem_enc:
            mask_for_mem = (pred_masks_high_res > 0).astype("float32")
        else:
            mask_for_mem = nn.functional.sigmoid(pred_masks_high_res)
        if self.sigmoid_scale_for_mem_enc != 1.0:
            mask_for_mem = mask_for_mem * self.sigmoid_scale_for_mem_enc
        if self.sigmoid_bias_for_mem_enc != 0.0:
            mask_for_mem = mask_for_mem + self.sigmoid_bias_for_mem_enc
        out = self._encode_memory(pix_feat, mask_for_mem)
        feats = out["vision_features"]
        if self.no_obj_embed_spatial is not None:  # None: SAM 2.0
            absent = 1 - (object_score_logits > 0).astype(feats.dtype)  # B x 1
            no_obj = self.no_obj_embed_spatial.unsqueeze(-1).unsqueeze(-1)
            feats = feats + absent.unsqueeze(-1).unsqueeze(-1) * no_obj
        return feats, list(out["vision_pos_enc"])

    # ------------------------------------------------------------------ one frame

    def _use_multimask(self, is_init_cond_frame: bool, point_inputs: dict | None) -> bool:
        num_pts = 0 if point_inputs is None else point_inputs["point_labels"].shape[1]
        return bool(
            self.multimask_output_in_sam
            and (is_init_cond_frame or self.multimask_output_for_tracking)
            and (self.multimask_min_pt_num <= num_pts <= self.multimask_max_pt_num)
        )

    def track_step(
        self,
        frame_idx: int,
        is_init_cond_frame: bool,
        current_vision_feats: list[paddle.Tensor],
        current_vision_pos_embeds: list[paddle.Tensor],
        feat_sizes: list[tuple[int, int]],
        point_inputs: dict[str, paddle.Tensor] | None,
        mask_inputs: paddle.Tensor | None,
        output_dict: dict,
        num_frames: int,
        track_in_reverse: bool = False,
        run_mem_encoder: bool = True,
        prev_sam_mask_logits: paddle.Tensor | None = None,
        use_prev_mem_frame: bool = True,
    ) -> dict[str, Any]:
        """One frame: features (``HW x B x C`` per level, high-res levels already through
        ``conv_s0``/``conv_s1``), its prompts and the memory bank ``output_dict``
        (``cond_frame_outputs`` / ``non_cond_frame_outputs``: frame index -> output) ->
        ``pred_masks``, ``pred_masks_high_res``, ``obj_ptr``, ``object_score_logits``,
        ``maskmem_features``, ``maskmem_pos_enc`` (float32; upstream's predictor stores the
        memory features as bfloat16, see :func:`round_to_bfloat16`)."""
        current_out: dict[str, Any] = {"point_inputs": point_inputs, "mask_inputs": mask_inputs}
        high_res_features = None
        if len(current_vision_feats) > 1:
            high_res_features = [
                _seq_to_map(x, s)
                for x, s in zip(current_vision_feats[:-1], feat_sizes[:-1], strict=True)
            ]
        if mask_inputs is not None:
            pix_feat = _seq_to_map(current_vision_feats[-1], feat_sizes[-1])
            sam_outputs = self._use_mask_as_output(pix_feat, high_res_features, mask_inputs)
        else:
            pix_feat_with_mem = self._prepare_memory_conditioned_features(
                frame_idx=frame_idx,
                is_init_cond_frame=is_init_cond_frame,
                current_vision_feats=current_vision_feats[-1:],
                current_vision_pos_embeds=current_vision_pos_embeds[-1:],
                feat_sizes=feat_sizes[-1:],
                output_dict=output_dict,
                num_frames=num_frames,
                track_in_reverse=track_in_reverse,
                use_prev_mem_frame=use_prev_mem_frame,
            )
            if prev_sam_mask_logits is not None:
                if point_inputs is None:
                    raise ValueError("prev_sam_mask_logits go with point inputs")
                mask_inputs = prev_sam_mask_logits
            sam_outputs = self._forward_sam_heads(
                backbone_features=pix_feat_with_mem,
                point_inputs=point_inputs,
                mask_inputs=mask_inputs,
                high_res_features=high_res_features,
                multimask_output=self._use_multimask(is_init_cond_frame, point_inputs),
            )
        (
            _,
            high_res_multimasks,
            ious,
            low_res_masks,
            high_res_masks,
            obj_ptr,
            object_score_logits,
        ) = sam_outputs
        # every output of the decoder and its IoU predictions, for training's loss
        current_out["multimasks_high_res"] = high_res_multimasks
        current_out["ious"] = ious
        current_out["pred_masks"] = low_res_masks
        current_out["pred_masks_high_res"] = high_res_masks
        current_out["obj_ptr"] = obj_ptr
        if self.use_memory_selection:
            iou_score = ious.max(-1)
            current_out["iou_score"] = iou_score
            current_out["eff_iou_score"] = self.cal_mem_score(object_score_logits, iou_score)
        current_out["object_score_logits"] = object_score_logits
        if run_mem_encoder and self.num_maskmem > 0:
            feats, pos = self._encode_new_memory(
                current_vision_feats=current_vision_feats,
                feat_sizes=feat_sizes,
                pred_masks_high_res=high_res_masks,
                object_score_logits=object_score_logits,
                is_mask_from_pts=point_inputs is not None,
            )
            current_out["maskmem_features"] = feats
            current_out["maskmem_pos_enc"] = pos
        else:
            current_out["maskmem_features"] = None
            current_out["maskmem_pos_enc"] = None
        return current_out


def concat_points(
    old_point_inputs: dict[str, paddle.Tensor] | None,
    new_points: paddle.Tensor,
    new_labels: paddle.Tensor,
) -> dict[str, paddle.Tensor]:
    """Add new points and labels after the previous ones."""
    if old_point_inputs is None:
        return {"point_coords": new_points, "point_labels": new_labels}
    return {
        "point_coords": paddle.concat([old_point_inputs["point_coords"], new_points], axis=1),
        "point_labels": paddle.concat([old_point_inputs["point_labels"], new_labels], axis=1),
    }
