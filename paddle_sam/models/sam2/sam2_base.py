"""SAM 2 / 2.1 (upstream: sam2/modeling/sam2_base.py, ``SAM2Base``) for inference.

SAM 3's tracker is SAM 2.1's with other module names, so :class:`SAM2Base` inherits its
inference logic from :class:`~..sam3.sam3_tracker_base.Sam3TrackerBase` (SAM heads with the
object-score head and object pointers, the memory bank, one tracking step) and builds its own
sublayers under SAM 2's names (``image_encoder``, ``memory_attention``, ``memory_encoder``,
``sam_prompt_encoder``, ``sam_mask_decoder`` ...), so an official checkpoint's ``model``
state dict loads one to one (Linear weights transposed).

The settings every released SAM 2 / 2.1 config shares (high-resolution features in the
decoder, object-score MLP, a fixed no-object pointer, a 3-layer pointer projection, mask
inputs used as outputs, ``no_mem_embed`` added directly on the first frame ...) are fixed;
the ones that differ between SAM 2.0 and 2.1 (``no_obj_embed_spatial``, the temporal encoding
of object pointers) are arguments, as is ``binarize_mask_from_pts_for_mem_enc`` (set by
upstream's video-predictor builder).
"""

from __future__ import annotations

from typing import Any

import paddle
from paddle import nn

from ..common import MLP, Linear
from ..sam3.interactive import Sam3TrackerHeads
from ..sam3.sam3_tracker_base import NO_OBJ_SCORE, Sam3TrackerBase, get_1d_sine_pe

__all__ = ["NO_OBJ_SCORE", "SAM2Base"]


class SAM2Base(Sam3TrackerBase):
    """The SAM 2 model: image encoder, SAM prompt encoder and mask decoder, memory encoder
    and memory attention, object-pointer heads and memory embeddings.

    ``image_encoder``: an :class:`~.image_encoder.ImageEncoder` (its neck's ``d_model`` is the
    hidden width); ``memory_attention``: a :class:`~.memory.MemoryAttention`;
    ``memory_encoder``: a :class:`~.memory.MemoryEncoder`.
    ``sam_mlp_dim``: the SAM decoder's MLP width (2048 in every released model).
    ``sam_mask_decoder_extra_args``: upstream's (``build_sam2`` passes the
    ``dynamic_multimask_via_stability`` settings; None: no dynamic fallback).
    """

    def __init__(
        self,
        image_encoder: nn.Layer,
        memory_attention: nn.Layer,
        memory_encoder: nn.Layer,
        sam_mlp_dim: int = 2048,
        num_maskmem: int = 7,
        image_size: int = 1024,
        backbone_stride: int = 16,
        sigmoid_scale_for_mem_enc: float = 20.0,
        sigmoid_bias_for_mem_enc: float = -10.0,
        binarize_mask_from_pts_for_mem_enc: bool = False,
        max_cond_frames_in_attn: int = -1,
        multimask_output_in_sam: bool = True,
        multimask_min_pt_num: int = 0,
        multimask_max_pt_num: int = 1,
        multimask_output_for_tracking: bool = True,
        memory_temporal_stride_for_eval: int = 1,
        non_overlap_masks_for_mem_enc: bool = False,
        max_obj_ptrs_in_encoder: int = 16,
        add_tpos_enc_to_obj_ptrs: bool = True,
        proj_tpos_enc_in_obj_ptrs: bool = True,
        use_signed_tpos_enc_to_obj_ptrs: bool = True,
        no_obj_embed_spatial: bool = True,
        sam_mask_decoder_extra_args: dict[str, Any] | None = None,
    ) -> None:
        if proj_tpos_enc_in_obj_ptrs and not add_tpos_enc_to_obj_ptrs:
            raise ValueError("proj_tpos_enc_in_obj_ptrs needs add_tpos_enc_to_obj_ptrs")
        hidden_dim = image_encoder.neck.d_model
        extra = {"dynamic_multimask_via_stability": False, **(sam_mask_decoder_extra_args or {})}
        # the SAM heads and no_mem_embed as SAM 3's tracker builds them; its memory modules
        # are built here under SAM 2's names instead
        Sam3TrackerHeads.__init__(
            self,
            image_size=image_size,
            backbone_stride=backbone_stride,
            hidden_dim=hidden_dim,
            mlp_dim=sam_mlp_dim,
            sam_mask_decoder_extra_args=extra,
        )
        # SAM 2's two-way transformer keeps its MLP as sam2_utils.MLP (``mlp.layers.0/1``),
        # the same maths as SAM v1's MLPBlock (``mlp.lin1/lin2``)
        for layer in self.sam_mask_decoder.transformer.layers:
            lin1 = layer.mlp.lin1
            layer.mlp = MLP(lin1.weight.shape[0], lin1.weight.shape[1], hidden_dim, 2)
        self.image_encoder = image_encoder
        self.use_high_res_features_in_sam = True
        self.directly_add_no_mem_embed = True
        self.use_obj_ptrs_in_encoder = True
        self.use_mask_input_as_output_without_sam = True
        self.memory_attention = memory_attention
        self.memory_encoder = memory_encoder
        self.mem_dim = hidden_dim
        out_proj = getattr(memory_encoder, "out_proj", None)
        if getattr(out_proj, "weight", None) is not None:
            self.mem_dim = out_proj.weight.shape[0]  # Conv2D weight: out x in x 1 x 1
        self.num_maskmem = num_maskmem
        self.max_obj_ptrs_in_encoder = max_obj_ptrs_in_encoder
        self.mask_downsample = nn.Conv2D(1, 1, kernel_size=4, stride=4)

        def param(shape: list[int]) -> paddle.Tensor:
            return self.create_parameter(
                shape, default_initializer=nn.initializer.TruncatedNormal(std=0.02)
            )

        self.maskmem_tpos_enc = param([num_maskmem, 1, 1, self.mem_dim])
        self.no_mem_pos_enc = param([1, 1, hidden_dim])
        self.sigmoid_scale_for_mem_enc = sigmoid_scale_for_mem_enc
        self.sigmoid_bias_for_mem_enc = sigmoid_bias_for_mem_enc
        self.binarize_mask_from_pts_for_mem_enc = binarize_mask_from_pts_for_mem_enc
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
        self.no_obj_embed_spatial = param([1, self.mem_dim]) if no_obj_embed_spatial else None
        self.obj_ptr_proj = MLP(hidden_dim, hidden_dim, hidden_dim, 3)
        self.add_tpos_enc_to_obj_ptrs = add_tpos_enc_to_obj_ptrs
        self.proj_tpos_enc_in_obj_ptrs = proj_tpos_enc_in_obj_ptrs
        self.use_signed_tpos_enc_to_obj_ptrs = use_signed_tpos_enc_to_obj_ptrs
        self.obj_ptr_tpos_proj = (
            Linear(hidden_dim, self.mem_dim) if proj_tpos_enc_in_obj_ptrs else nn.Identity()
        )
        self.max_cond_frames_in_attn = max_cond_frames_in_attn
        self.keep_first_cond_frame = False  # SAM 3 only
        self.use_memory_selection = False  # SAM 3 only
        self.mf_threshold = 0.01

    # ------------------------------------------------------------------ image features

    def forward_image(self, img_batch: paddle.Tensor) -> dict[str, Any]:
        """Image encoder on a normalised ``B x 3 x S x S`` batch; the two finest levels go
        through the decoder's ``conv_s0`` / ``conv_s1`` once here, not per prompt."""
        backbone_out = self.image_encoder(img_batch)
        fpn = list(backbone_out["backbone_fpn"])
        fpn[0] = self.sam_mask_decoder.conv_s0(fpn[0])
        fpn[1] = self.sam_mask_decoder.conv_s1(fpn[1])
        backbone_out["backbone_fpn"] = fpn
        return backbone_out

    # ------------------------------------------------------------------ memory modules

    def _attend_memory(
        self,
        curr: list[paddle.Tensor],
        curr_pos: list[paddle.Tensor],
        memory: paddle.Tensor,
        memory_pos: paddle.Tensor,
        feat_sizes: list[tuple[int, int]],
        num_obj_ptr_tokens: int,
    ) -> paddle.Tensor:
        return self.memory_attention(
            curr=curr,
            curr_pos=curr_pos,
            memory=memory,
            memory_pos=memory_pos,
            num_obj_ptr_tokens=num_obj_ptr_tokens,
        )

    def _encode_memory(self, pix_feat: paddle.Tensor, mask_for_mem: paddle.Tensor) -> dict:
        return self.memory_encoder(pix_feat, mask_for_mem, skip_mask_sigmoid=True)

    def _get_tpos_enc(self, rel_pos_list: list[int], max_abs_pos: int | None = None):
        """Temporal encoding of object pointers ``P x mem_dim``: SAM 2.1's signed, projected
        sine encoding, or SAM 2.0's zeros (``add_tpos_enc_to_obj_ptrs`` False)."""
        if not self.add_tpos_enc_to_obj_ptrs:
            return paddle.zeros([len(rel_pos_list), self.mem_dim], dtype="float32")
        if not self.use_signed_tpos_enc_to_obj_ptrs:
            rel_pos_list = [abs(p) for p in rel_pos_list]
        t_diff_max = max_abs_pos - 1 if max_abs_pos is not None else 1
        pos = paddle.to_tensor(list(rel_pos_list), dtype="float32") / t_diff_max
        dim = self.hidden_dim if self.proj_tpos_enc_in_obj_ptrs else self.mem_dim
        return self.obj_ptr_tpos_proj(get_1d_sine_pe(pos, dim=dim))
