"""Small layers shared by the SAM modules (upstream: segment_anything/modeling/common.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn


def resize_bilinear(x: paddle.Tensor, size: tuple[int, int] | list[int]) -> paddle.Tensor:
    """``F.interpolate(x, size, mode="bilinear", align_corners=False)`` of ``B x C x h x w``.

    On the CPU, outside autograd, :func:`resize_bilinear_np` computes it: Paddle's CPU kernel
    runs on one thread and took 18 ms for the three 1024 x 1024 masks of a prompt, OpenCV
    1.5 ms. Elsewhere (GPU, or when gradients flow) Paddle's own kernel runs.
    """
    if not x.place.is_cpu_place() or (paddle.is_grad_enabled() and not x.stop_gradient):
        size = [int(size[0]), int(size[1])]
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return paddle.to_tensor(resize_bilinear_np(x.astype("float32").numpy(), size)).astype(x.dtype)


def resize_bilinear_np(x: np.ndarray, size: tuple[int, int] | list[int]) -> np.ndarray:
    """Bilinear resize (half-pixel centres, as ``align_corners=False``) of the last two axes
    of a float32 array, by OpenCV's resize (float32 weights: agrees with Paddle's and torch's
    kernels to ~1e-7 relative)."""
    import cv2

    out_h, out_w = int(size[0]), int(size[1])
    x = np.asarray(x, np.float32)
    out = np.empty((*x.shape[:-2], out_h, out_w), np.float32)
    # plane by plane, straight into ``out``; OpenCV reads row-strided views (a crop) as they are
    for idx in np.ndindex(*x.shape[:-2]):
        plane = x[idx] if x.strides[-1] == x.itemsize else np.ascontiguousarray(x[idx])
        cv2.resize(plane, (out_w, out_h), dst=out[idx], interpolation=cv2.INTER_LINEAR)
    return out


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same ``[in, out]`` weight) computed with ``addmm``.

    In dygraph on CPU, ``F.linear`` runs a GEMM and then a separate broadcast add of the bias;
    ``addmm`` lets MKL add the bias inside the GEMM: measured here 0.14 s -> 0.08 s for a
    4096 x 768 x 3072 layer, about 2 s over a ViT-B forward. Static graphs keep ``F.linear``
    (their own passes fuse it, and it keeps dynamic shapes simple).
    """

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if self.bias is None or not paddle.in_dynamic_mode() or x.ndim < 2:
            return super().forward(x)
        out = paddle.addmm(self.bias, x.reshape([-1, x.shape[-1]]), self.weight)
        return out.reshape([*x.shape[:-1], self.weight.shape[1]])


class MLPBlock(nn.Layer):
    """Two Linear layers with an activation between them: ``lin2(act(lin1(x)))``."""

    def __init__(self, embedding_dim: int, mlp_dim: int, act: type[nn.Layer] = nn.GELU) -> None:
        super().__init__()
        self.lin1 = Linear(embedding_dim, mlp_dim)
        self.lin2 = Linear(mlp_dim, embedding_dim)
        self.act = act()

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.lin2(self.act(self.lin1(x)))


class LayerNorm2d(nn.Layer):
    """LayerNorm over the channel axis of a ``B x C x H x W`` tensor (eps 1e-6 as upstream)."""

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = self.create_parameter(
            [num_channels], default_initializer=nn.initializer.Constant(1.0)
        )
        self.bias = self.create_parameter(
            [num_channels], default_initializer=nn.initializer.Constant(0.0), is_bias=True
        )
        self.eps = eps

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        # Channels-last layer_norm: Paddle's CPU broadcasts along a middle axis (x - mean over
        # C) are ~10x slower than its layer_norm kernel plus two 4-D transposes.
        x = F.layer_norm(x.transpose([0, 2, 3, 1]), x.shape[1:2], self.weight, self.bias, self.eps)
        return x.transpose([0, 3, 1, 2])


class MLP(nn.Layer):
    """``num_layers`` Linear layers with ReLU between them (upstream: mask_decoder.MLP)."""

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int,
        output_dim: int,
        num_layers: int,
        sigmoid_output: bool = False,
    ) -> None:
        super().__init__()
        self.num_layers = num_layers
        h = [hidden_dim] * (num_layers - 1)
        self.layers = nn.LayerList(
            Linear(n, k) for n, k in zip([input_dim] + h, h + [output_dim], strict=True)
        )
        self.sigmoid_output = sigmoid_output

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        for i, layer in enumerate(self.layers):
            x = nn.functional.relu(layer(x)) if i < self.num_layers - 1 else layer(x)
        if self.sigmoid_output:
            x = nn.functional.sigmoid(x)
        return x


class Spec:
    """What the model specs (``SamSpec``, ``Sam3Spec``: frozen dataclasses) share: a plain dict
    and back (a converted checkpoint's sidecar, an export's manifest), unknown fields refused,
    lists read back as tuples, older field names read under their current ones."""

    RENAMED: ClassVar[dict[str, str]] = {}  # older field name -> current one

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        if not isinstance(d, dict):
            raise ValueError(f"a {cls.__name__} must be a JSON object, got {type(d).__name__}")
        d = {cls.RENAMED.get(k, k): v for k, v in d.items()}
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {unknown}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def _check_positive(self, *names: str) -> None:
        bad = [f"{n}={getattr(self, n)!r}" for n in names if not getattr(self, n) > 0]
        if bad:
            raise ValueError(f"{type(self).__name__}: sizes must be positive: {', '.join(bad)}")
