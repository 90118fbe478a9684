"""Helper ops of SAM 3's dense video inference (upstream: sam3/perflib, plus ``mask_to_box``
of sam3/model/sam3_tracker_utils.py and ``fast_diag_box_iou`` of sam3/model/box_ops.py).

Where upstream runs CUDA or Triton kernels (NMS), these modules compute what upstream's CPU
path computes. Upstream's ``USE_PERFLIB`` switch is not mirrored: the perflib versions are
always the ones used (upstream's default).
"""
