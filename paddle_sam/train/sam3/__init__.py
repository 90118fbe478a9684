"""SAM 3 training criterion, ported from the official ``sam3.train`` (matcher and losses), on
Paddle tensors: :mod:`.matcher` (Hungarian and one-to-many matchers), :mod:`.loss_fns`
(classification with presence, boxes, masks) and :mod:`.sam3_loss` (the wrapper over final,
auxiliary and one-to-many outputs, and the roboflow_v100 defaults); :mod:`.step` (the training
forward of the model, the training step, freezing by name) and :mod:`.lora` (LoRA adapters
and their merge).

The Hungarian matching needs scipy (``scipy.optimize.linear_sum_assignment``), imported when a
matcher first runs.
"""

from .lora import (
    ATTENTION_LORA_TARGETS,
    DEFAULT_LORA_TARGETS,
    MLP_LORA_TARGETS,
    LoRALinear,
    apply_lora,
    lora_parameters,
    lora_state_dict,
    merge_lora,
)
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
from .step import (
    MODEL_PARTS,
    backbone_features,
    clip_grad_norm_,
    forward_train,
    freeze,
    train_step,
    trainable_parameters,
    unfreeze,
)

__all__ = [
    "ATTENTION_LORA_TARGETS",
    "CORE_LOSS_KEY",
    "DEFAULT_LORA_TARGETS",
    "MLP_LORA_TARGETS",
    "MODEL_PARTS",
    "ROBOFLOW_V100_LOSS_WEIGHTS",
    "ROBOFLOW_V100_MASK_LOSS_WEIGHTS",
    "BinaryHungarianMatcherV2",
    "BinaryOneToManyMatcher",
    "Boxes",
    "DummyLoss",
    "IABCEMdetr",
    "LoRALinear",
    "LossWithWeights",
    "Masks",
    "Sam3LossWrapper",
    "apply_lora",
    "backbone_features",
    "build_roboflow_v100_loss",
    "clip_grad_norm_",
    "compute_matching",
    "dice_loss",
    "forward_train",
    "freeze",
    "lora_parameters",
    "lora_state_dict",
    "make_find_targets",
    "merge_lora",
    "roboflow_v100_loss_weights",
    "sigmoid_focal_loss",
    "train_step",
    "trainable_parameters",
    "unfreeze",
]
