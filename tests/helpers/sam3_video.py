"""The reduced-size SAM 3 video model on both sides, for the parity tests of the dense video
inference (tests/models/test_sam3_video_base.py, test_sam3_video_inference.py): a 112 px
detector (2-block ViT, the SAM 2 neck on, d_model 256 for the tracker's heads) and the tracker
of the released settings, the same perturbed weights on both sides (copied into ours with
``load_from_torch``), and the CPU patches of the official video code.

Upstream's CUDA assumptions are patched here only: ``tracker_cpu_patches``, the tracker's
inference states kept on the CPU (``offload_state_to_cpu``), and the bfloat16 SAM 2 features
that upstream's detector hands over (its all-gather cast, kept with one process) cast back to
float32 before the tracker's float32 convolutions (on a GPU, autocast runs them in bfloat16; on
the CPU upstream would stop with a dtype error; ours does the same cast), and the CPU connected
components given a batch of no mask (see ``reference_patches``).
"""

from __future__ import annotations

import contextlib
import warnings
from unittest import mock

import numpy as np
import paddle

from paddle_sam.models.sam3.build_sam3 import (
    TRACKER_SETTINGS,
    build_sam3_model,
    build_tracker_model,
)
from paddle_sam.models.sam3.geometry_encoders import Prompt
from paddle_sam.models.sam3.sam3_image import FindStage
from paddle_sam.models.sam3.sam3_video_base import BatchedDatapoint, Sam3VideoBase
from paddle_sam.predict.sam3.tokenizer import SimpleTokenizer
from tests.helpers.sam3_ref import (
    import_sam3,
    perturb_module_,
    randomise_tracker_,
    reference_tracker,
    reference_vision_backbone,
    tracker_cpu_patches,
)
from tests.helpers.specs import tiny_sam3_tracker_spec
from tests.helpers.video import scene
from tests.models.test_sam3_heads import load_from_torch
from tests.models.test_sam3_model import build_reference

torch, _ = import_sam3()

# the tracker's heads keep the released widths whatever the detector's size
SPEC = tiny_sam3_tracker_spec()
NUM_FRAMES = 5
VIDEO_H, VIDEO_W = 90, 120
TEXT = "a red square"
DET_SEED = 8  # perturbation of the detector: several detections per frame, tracker masks
# the released video model's settings (model_builder.build_sam3_video_model); each test
# lowers the thresholds for random weights and shortens hot-start for a 5-frame video
SETTINGS = dict(
    score_threshold_detection=0.5,
    assoc_iou_thresh=0.1,
    det_nms_thresh=0.1,
    new_det_thresh=0.7,
    hotstart_delay=15,
    hotstart_unmatch_thresh=8,
    hotstart_dup_thresh=8,
    suppress_unmatched_only_within_hotstart=True,
    min_trk_keep_alive=-1,
    max_trk_keep_alive=30,
    init_trk_keep_alive=30,
    suppress_overlapping_based_on_recent_occlusion_threshold=0.7,
    suppress_det_close_to_boundary=False,
    fill_hole_area=16,
    recondition_every_nth_frame=16,
    masklet_confirmation_enable=False,
    decrease_trk_keep_alive_for_empty_masklets=False,
)


@contextlib.contextmanager
def reference_patches():
    """``tracker_cpu_patches`` plus the CPU patches of the video model (module docstring):
    tracker states on the CPU, the bfloat16 SAM 2 features cast back to float32, and the CPU
    connected components accepting a batch of no mask (upstream's CPU fallback stacks an
    empty list when a frame has no new detection; its GPU kernels return empty results)."""
    from sam3.model.sam3_image import Sam3ImageOnVideoMultiGPU
    from sam3.model.sam3_tracking_predictor import Sam3TrackerPredictor as RefPredictor
    from sam3.perflib import connected_components

    init_state = RefPredictor.init_state

    def init_state_cpu(self, *args, **kwargs):
        kwargs["offload_state_to_cpu"] = True
        return init_state(self, *args, **kwargs)

    def gather_tensor_fp32(self, x):
        return [x.float()], None

    cc_cpu = connected_components.connected_components_cpu

    def cc_cpu_batch_of_none(input_tensor):
        if input_tensor.shape[0] == 0:  # torch.stack of an empty list fails
            zeros = torch.zeros(input_tensor.shape, dtype=torch.long)
            return zeros, zeros.clone()
        return cc_cpu(input_tensor)

    with contextlib.ExitStack() as stack:
        stack.enter_context(tracker_cpu_patches())
        stack.enter_context(mock.patch.object(RefPredictor, "init_state", init_state_cpu))
        stack.enter_context(
            mock.patch.object(Sam3ImageOnVideoMultiGPU, "_gather_tensor", gather_tensor_fp32)
        )
        stack.enter_context(
            mock.patch.object(
                connected_components, "connected_components_cpu", cc_cpu_batch_of_none
            )
        )
        stack.enter_context(torch.inference_mode())
        yield


def reference_video_detector(bpe_path: str):
    """The official ``Sam3ImageOnVideoMultiGPU`` as ``build_sam3_video_model`` configures it,
    at ``SPEC``'s sizes (the image model of ``build_reference``, SAM 2 neck added)."""
    from sam3.model.sam3_image import Sam3ImageOnVideoMultiGPU
    from sam3.model.vl_combiner import SAM3VLBackbone

    image_model = build_reference(SPEC, bpe_path)
    backbone = SAM3VLBackbone(
        visual=reference_vision_backbone(SPEC, add_sam2_neck=True),
        text=image_model.backbone.language_backbone,
        scalp=SPEC.scalp,
    )
    return Sam3ImageOnVideoMultiGPU(
        num_feature_levels=1,
        backbone=backbone,
        transformer=image_model.transformer,
        segmentation_head=image_model.segmentation_head,
        semantic_segmentation_head=None,
        input_geometry_encoder=image_model.geometry_encoder,
        use_early_fusion=True,
        use_dot_prod_scoring=True,
        dot_prod_scoring=image_model.dot_prod_scoring,
        supervise_joint_box_scores=True,
    ).eval()


def make_parts(bpe_path: str):
    """(reference detector, reference tracker, our detector, our tracker), same weights."""
    with reference_patches():
        torch.manual_seed(0)
        ref_det = reference_video_detector(bpe_path)
        # the text encoder leaves two parameters as torch.empty (NaN under the tests' torch
        # settings): drawn here, the detector the video tests were written against;
        # perturb_module_ would redraw them from its own seed, a different detector
        gen = torch.Generator().manual_seed(4)
        with torch.no_grad():
            for name, p in ref_det.named_parameters():
                if name.endswith(("positional_embedding", "text_projection")):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        perturb_module_(ref_det, seed=DET_SEED, scale=0.2)
        ref_det.eval()
        (ref_batch, ref_prompt), _ = inputs()
        balance_mask_head_(ref_det, ref_batch, ref_prompt)
        ref_trk = reference_tracker(
            SPEC, with_backbone=False, use_memory_selection=True, **TRACKER_SETTINGS
        )
        randomise_tracker_(ref_trk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det = build_sam3_model(
            SPEC, tokenizer=SimpleTokenizer(bpe_path=bpe_path), enable_inst_interactivity=True
        )
    det.inst_interactive_predictor = None
    det.supervise_joint_box_scores = True  # as build_sam3_video_model's detector
    load_from_torch(det, ref_det, skip_complex=True)
    det.eval()
    trk = build_tracker_model(SPEC, apply_temporal_disambiguation=True)
    load_from_torch(trk, ref_trk, skip_complex=True)
    trk.eval()
    return ref_det, ref_trk, det, trk


def make_models(parts, **overrides):
    from sam3.model.sam3_video_base import Sam3VideoBase as RefBase

    ref_det, ref_trk, det, trk = parts
    settings = {**SETTINGS, **overrides}
    with reference_patches():
        ref = RefBase(detector=ref_det, tracker=ref_trk, **settings)
    return ref, Sam3VideoBase(detector=det, tracker=trk, **settings)


def frames() -> np.ndarray:
    """``T x 3 x 112 x 112`` float32 frames in [-1, 1] (the model's input normalisation)."""
    imgs = scene(NUM_FRAMES, SPEC.image_size, SPEC.image_size)
    return np.stack([im.transpose(2, 0, 1) for im in imgs]).astype(np.float32) / 127.5 - 1.0


def inputs(text: str = TEXT):
    """The same input batch and empty geometric prompt on both sides (as upstream's
    ``Sam3VideoInference`` builds them)."""
    from sam3.model.data_misc import BatchedDatapoint as RefBatch
    from sam3.model.data_misc import FindStage as RefFind
    from sam3.model.geometry_encoders import Prompt as RefPrompt

    video = frames()
    texts = [text, "visual"]
    ref_batch = RefBatch(
        img_batch=torch.from_numpy(video),
        find_text_batch=list(texts),
        find_inputs=[
            RefFind(
                img_ids=torch.tensor([t]),
                text_ids=torch.tensor([0]),
                input_boxes=None,
                input_boxes_mask=None,
                input_boxes_label=None,
                input_points=None,
                input_points_mask=None,
            )
            for t in range(NUM_FRAMES)
        ],
        find_targets=[None] * NUM_FRAMES,
        find_metadatas=[None] * NUM_FRAMES,
    )
    batch = BatchedDatapoint(
        img_batch=paddle.to_tensor(video),
        find_text_batch=list(texts),
        find_inputs=[
            FindStage(img_ids=paddle.to_tensor([t]), text_ids=paddle.to_tensor([0]))
            for t in range(NUM_FRAMES)
        ],
    )
    ref_prompt = RefPrompt(
        box_embeddings=torch.zeros(0, 1, 4),
        box_mask=torch.zeros(1, 0, dtype=torch.bool),
        box_labels=torch.zeros(0, 1, dtype=torch.long),
        point_embeddings=torch.zeros(0, 1, 2),
        point_mask=torch.zeros(1, 0, dtype=torch.bool),
        point_labels=torch.zeros(0, 1, dtype=torch.long),
    )
    prompt = Prompt(
        box_embeddings=paddle.zeros([0, 1, 4]),
        box_mask=paddle.zeros([1, 0], "bool"),
        box_labels=paddle.zeros([0, 1], "int64"),
        point_embeddings=paddle.zeros([0, 1, 2]),
        point_mask=paddle.zeros([1, 0], "bool"),
        point_labels=paddle.zeros([0, 1], "int64"),
    )
    return (ref_batch, ref_prompt), (batch, prompt)


def _run_detector(det, batch, prompt, frame_idx: int) -> dict:
    """The reference detector on one frame (fresh buffer): its outputs."""
    text = det.backbone.forward_text(batch.find_text_batch, device="cpu")
    out, _ = det.forward_video_grounding_multigpu(
        backbone_out={"img_batch_all_stages": batch.img_batch, **text},
        find_inputs=batch.find_inputs,
        geometric_prompt=prompt,
        frame_idx=frame_idx,
        num_frames=NUM_FRAMES,
        multigpu_buffer={},
    )
    return out


def balance_mask_head_(ref_det, batch, prompt) -> None:
    """Random weights give every query nearly the same mask, covering most of the image (the
    pixel and query embeddings share a large common component): the biases of the mask
    head's last layers are set to remove the means of its inputs over the video, so that
    masks differ between queries, cover about half the image and overlap partially (NMS and
    matching then keep some and drop others). Means over all frames, not one: on a frame
    whose own means were removed, the logits would be small differences of large terms,
    their float32 errors those of the large terms."""
    head = ref_det.segmentation_head.instance_seg_head
    embed = ref_det.segmentation_head.mask_predictor.mask_embed.layers[-1]
    pixels, queries = [], []
    hooks = [
        head.register_forward_hook(lambda m, i, o: pixels.append(i[0])),
        embed.register_forward_hook(lambda m, i, o: queries.append(o)),
    ]
    for t in range(NUM_FRAMES):
        _run_detector(ref_det, batch, prompt, t)
    for hook in hooks:
        hook.remove()
    pixel_mean = torch.stack([x.mean((0, 2, 3)) for x in pixels]).mean(0)
    query_mean = torch.cat([x.reshape(-1, x.shape[-1]) for x in queries]).mean(0)
    with torch.no_grad():
        head.bias.copy_(-(head.weight[:, :, 0, 0] @ pixel_mean))
        embed.bias.sub_(query_mean)
