"""SAM 3 training criterion, ported from the official ``sam3.train`` (matcher and losses), on
Paddle tensors: :mod:`.matcher` (Hungarian and one-to-many matchers), :mod:`.loss_fns`
(classification with presence, boxes, masks) and :mod:`.sam3_loss` (the wrapper over final,
auxiliary and one-to-many outputs, and the roboflow_v100 defaults).

The Hungarian matching needs scipy (``scipy.optimize.linear_sum_assignment``), imported when a
matcher first runs.
"""

from .loss_fns import (
    CORE_LOSS_KEY,
    Boxes,
    IABCEMdetr,
    LossWithWeights,
    Masks,
    dice_loss,
    sigmoid_focal_loss,
)
from .matcher import BinaryHungarianMatcherV2, BinaryOneToManyMatcher
from .sam3_loss import (
    ROBOFLOW_V100_LOSS_WEIGHTS,
    ROBOFLOW_V100_MASK_LOSS_WEIGHTS,
    DummyLoss,
    Sam3LossWrapper,
    build_roboflow_v100_loss,
    compute_matching,
    make_find_targets,
    roboflow_v100_loss_weights,
)

__all__ = [
    "CORE_LOSS_KEY",
    "ROBOFLOW_V100_LOSS_WEIGHTS",
    "ROBOFLOW_V100_MASK_LOSS_WEIGHTS",
    "BinaryHungarianMatcherV2",
    "BinaryOneToManyMatcher",
    "Boxes",
    "DummyLoss",
    "IABCEMdetr",
    "LossWithWeights",
    "Masks",
    "Sam3LossWrapper",
    "build_roboflow_v100_loss",
    "compute_matching",
    "dice_loss",
    "make_find_targets",
    "roboflow_v100_loss_weights",
    "sigmoid_focal_loss",
]
