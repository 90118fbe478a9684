"""LoRA adapters for SAM 3's Linear layers (low-rank updates ``W + (alpha / r) A B``).

:func:`apply_lora` replaces the Linear layers whose names match ``targets`` by
:class:`LoRALinear`, which keeps the original ``weight`` and ``bias`` under their names (the
state dict gains only ``lora_A`` / ``lora_B`` next to them) and adds the update computed from
the input. :func:`merge_lora` folds the updates into the weights and puts the original layers
back, so the model's state dict has exactly its original keys and shapes again: the
converters, predictors and static export take it unchanged.

Names of the layers (Paddle ``[in, out]`` weights throughout): attention projections are
``q_proj`` / ``k_proj`` / ``v_proj`` / ``out_proj`` (the detector's, the geometry encoder's
and the text encoder's attentions) and ``attn.qkv`` / ``attn.proj`` (the ViT's); MLP layers are
``linear1`` / ``linear2`` (encoder and decoder layers), ``mlp.fc1`` / ``mlp.fc2`` (ViT) and
``mlp.c_fc`` / ``mlp.c_proj`` (text encoder).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence

import paddle
from paddle import nn

__all__ = [
    "ATTENTION_LORA_TARGETS",
    "DEFAULT_LORA_TARGETS",
    "MLP_LORA_TARGETS",
    "LoRALinear",
    "apply_lora",
    "lora_parameters",
    "lora_state_dict",
    "merge_lora",
]

ATTENTION_LORA_TARGETS = (
    "*.q_proj",
    "*.k_proj",
    "*.v_proj",
    "*.out_proj",
    "*.attn.qkv",
    "*.attn.proj",
)
MLP_LORA_TARGETS = (
    "*.linear1",
    "*.linear2",
    "*.mlp.fc1",
    "*.mlp.fc2",
    "*.mlp.c_fc",
    "*.mlp.c_proj",
)
# every attention projection and MLP layer of the model; restrict with a prefix, e.g.
# ("transformer.*.q_proj", ...), or with apply_lora's ``exclude``
DEFAULT_LORA_TARGETS = ATTENTION_LORA_TARGETS + MLP_LORA_TARGETS


class LoRALinear(nn.Layer):
    """A Linear layer plus a rank-``rank`` update: ``base(x) + dropout(x) A B * alpha / rank``.

    ``weight`` ``[in, out]`` and ``bias`` are the base layer's own parameters (same objects,
    same names in the state dict); ``lora_A`` ``[in, rank]`` starts uniform in
    ``+-1/sqrt(in)``, ``lora_B`` ``[rank, out]`` at zero, so the layer starts as the base one.
    The base layer computes its part, as it did before."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be at least 1, got {rank}")
        in_features, out_features = (int(d) for d in base.weight.shape)
        # the base layer is held outside the sublayers, so its parameters appear once, under
        # this layer's names; merge_lora puts it back in place
        object.__setattr__(self, "_base", base)
        self.weight = base.weight
        self.bias = base.bias
        self.rank = rank
        self.alpha = float(alpha)
        self.scaling = self.alpha / rank
        bound = 1.0 / math.sqrt(in_features)
        self.lora_A = self.create_parameter(
            [in_features, rank],
            dtype=base.weight.dtype,
            default_initializer=nn.initializer.Uniform(-bound, bound),
        )
        self.lora_B = self.create_parameter(
            [rank, out_features],
            dtype=base.weight.dtype,
            default_initializer=nn.initializer.Constant(0.0),
        )
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def base(self) -> nn.Linear:
        """The original layer (its weight not yet merged)."""
        return self._base

    def delta_weight(self) -> paddle.Tensor:
        """The update of the weight, ``A B * alpha / rank`` (``[in, out]``)."""
        return paddle.matmul(self.lora_A, self.lora_B) * self.scaling

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        update = paddle.matmul(paddle.matmul(self.lora_dropout(x), self.lora_A), self.lora_B)
        return self._base(x) + update * self.scaling

    def extra_repr(self) -> str:
        shape = list(self.weight.shape)
        return f"in={shape[0]}, out={shape[1]}, rank={self.rank}, alpha={self.alpha}"


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _parent(model: nn.Layer, name: str) -> tuple[nn.Layer, str]:
    owner, _, leaf = name.rpartition(".")
    return (model.get_sublayer(owner) if owner else model), leaf


def apply_lora(
    model: nn.Layer,
    rank: int,
    alpha: float,
    targets: Sequence[str] = DEFAULT_LORA_TARGETS,
    exclude: Sequence[str] = (),
    dropout: float = 0.0,
    freeze_base: bool = True,
) -> list[str]:
    """Put :class:`LoRALinear` adapters on the Linear layers of ``model`` whose names match
    one of the fnmatch ``targets`` and none of ``exclude`` (default: every attention
    projection and MLP layer, :data:`DEFAULT_LORA_TARGETS`). ``freeze_base`` stops the
    gradients of every other parameter of the model, so that only the adapters train.
    Returns the names of the adapted layers; raises ValueError when none matches or when a
    matching layer already has adapters."""
    if isinstance(targets, str) or isinstance(exclude, str):
        raise TypeError("targets and exclude are sequences of patterns, not strings")
    chosen = [
        (name, layer)
        for name, layer in model.named_sublayers()
        if isinstance(layer, nn.Linear | LoRALinear)
        and _matches(name, targets)
        and not _matches(name, exclude)
    ]
    done = [name for name, layer in chosen if isinstance(layer, LoRALinear)]
    if done:
        raise ValueError(f"layers already have LoRA adapters: {done[:5]}")
    if not chosen:
        raise ValueError(f"no Linear layer matches {list(targets)} (excluding {list(exclude)})")
    for name, layer in chosen:
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, LoRALinear(layer, rank, alpha, dropout))
    if freeze_base:
        for name, param in model.named_parameters():
            param.stop_gradient = not name.endswith((".lora_A", ".lora_B"))
    return [name for name, _ in chosen]


def lora_parameters(model: nn.Layer) -> list[paddle.Tensor]:
    """The adapters' parameters (``lora_A``, ``lora_B`` of every :class:`LoRALinear`)."""
    return [p for m in model.sublayers() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]


def lora_state_dict(model: nn.Layer) -> dict[str, paddle.Tensor]:
    """The adapters alone, under their state-dict names (``<layer>.lora_A`` / ``.lora_B``)."""
    return {k: v for k, v in model.state_dict().items() if k.endswith((".lora_A", ".lora_B"))}


def merge_lora(model: nn.Layer) -> list[str]:
    """Fold every adapter into its base weight (``W += A B * alpha / rank``) and put the
    original layer back in its place, so that the state dict has exactly the original keys
    and shapes. The parameters keep their ``stop_gradient`` flags. Returns the names of the
    merged layers."""
    merged = [(n, m) for n, m in model.named_sublayers() if isinstance(m, LoRALinear)]
    with paddle.no_grad():
        for name, layer in merged:
            base = layer.base
            base.weight.set_value(base.weight + layer.delta_weight().astype(base.weight.dtype))
            parent, leaf = _parent(model, name)
            setattr(parent, leaf, base)
    return [name for name, _ in merged]
