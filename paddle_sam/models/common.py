"""Small layers shared by the SAM modules (upstream: segment_anything/modeling/common.py)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Any, ClassVar

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn


def can_be_inplace(x: paddle.Tensor) -> bool:
    """Dygraph inference: nothing will differentiate through ``x``, so an op may overwrite it
    (static graphs plan their own memory reuse)."""
    return paddle.in_dynamic_mode() and not (paddle.is_grad_enabled() and not x.stop_gradient)


_worker_pool: concurrent.futures.ThreadPoolExecutor | None = None
_worker_pool_threads = 0
_worker_pool_lock = threading.Lock()


def _one_thread_per_worker() -> None:
    from .._runtime import set_local_threads

    set_local_threads(1)


def worker_pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """A process-wide pool of ``workers`` Python threads whose MKL GEMMs and OpenMP regions run
    on one thread each, for splitting dygraph inference work between threads on the CPU:
    Paddle's ops release the GIL, and its CPU elementwise kernels (softmax, adds, casts,
    layer norms) run on one thread whatever the thread count."""
    global _worker_pool, _worker_pool_threads
    with _worker_pool_lock:
        if _worker_pool is None or _worker_pool_threads != workers:
            if _worker_pool is not None:
                _worker_pool.shutdown(wait=False)
            _worker_pool = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix="paddle-sam-worker", initializer=_one_thread_per_worker
            )
            _worker_pool_threads = workers
        return _worker_pool


def as_tensor(array: np.ndarray) -> paddle.Tensor:
    """A CPU Paddle tensor over ``array``'s memory (through DLPack, not copied: SAM 3's
    feature maps are ~0.2 GB an image, 200 upscaled masks 0.6 GB); the tensor keeps the
    array alive. A read-only or strided array is copied."""
    if array.flags.c_contiguous and array.flags.writeable:
        try:
            return paddle.from_dlpack(array)
        except (BufferError, TypeError, RuntimeError):
            pass
    return paddle.to_tensor(np.ascontiguousarray(array))


def resize_bilinear(x: paddle.Tensor, size: tuple[int, int] | list[int]) -> paddle.Tensor:
    """``F.interpolate(x, size, mode="bilinear", align_corners=False)`` of ``B x C x h x w``.

    On the CPU, outside autograd, :func:`resize_bilinear_np` computes it: Paddle's CPU kernel
    runs on one thread and took 18 ms for the three 1024 x 1024 masks of a prompt, OpenCV
    1.5 ms. Elsewhere (GPU, or when gradients flow) Paddle's own kernel runs.
    """
    if not x.place.is_cpu_place() or (paddle.is_grad_enabled() and not x.stop_gradient):
        size = [int(size[0]), int(size[1])]
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return as_tensor(resize_bilinear_np(x.astype("float32").numpy(), size)).astype(x.dtype)


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


def depthwise_conv2d(
    x: paddle.Tensor, weight: paddle.Tensor, bias: paddle.Tensor | None, padding: int
) -> paddle.Tensor:
    """``F.conv2d(x, weight, bias, padding=padding, groups=C)`` of ``B x C x H x W`` with a
    ``C x 1 x k x k`` kernel (stride 1, zero padding ``padding``).

    On the CPU, outside autograd, OpenCV's ``filter2D`` (a correlation, as ``conv2d``) runs on
    each plane: Paddle's CPU depthwise kernel took 276 ms for the tracker's 7 x 7 over
    2 x 256 x 72 x 72, this 46 ms (sums in another order: ~1e-7 relative). Elsewhere (GPU,
    gradients, static graphs, other shapes) Paddle's own kernel runs."""
    k = weight.shape[-1]
    size_ok = padding == k // 2 and k % 2 == 1 and weight.shape[-2] == k
    if (
        not paddle.in_dynamic_mode()
        or not x.place.is_cpu_place()
        or x.dtype != paddle.float32
        or not size_ok
        or (paddle.is_grad_enabled() and not (x.stop_gradient and weight.stop_gradient))
    ):
        return F.conv2d(x, weight, bias, padding=padding, groups=x.shape[1])
    import cv2

    xn, wn = x.numpy(), weight.astype("float32").numpy()
    out = np.empty_like(xn)
    for b, c in np.ndindex(*xn.shape[:2]):
        cv2.filter2D(xn[b, c], -1, wn[c, 0], dst=out[b, c], borderType=cv2.BORDER_CONSTANT)
    if bias is not None:
        out += bias.astype("float32").numpy()[None, :, None, None]
    return as_tensor(out)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same ``[in, out]`` weight) computed with ``addmm``.

    In dygraph on CPU, ``F.linear`` runs a GEMM and then a separate broadcast add of the bias;
    ``addmm`` lets MKL add the bias inside the GEMM: measured here 0.14 s -> 0.08 s for a
    4096 x 768 x 3072 layer, about 2 s over a ViT-B forward. Static graphs keep ``F.linear``
    (their own passes fuse it, and it keeps dynamic shapes simple). So does a frozen bias on
    a gradient path (training with frozen layers): Paddle 3.3's addmm backward crashes
    (segmentation fault) when its bias operand stops gradients and another operand does not.
    """

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if self.bias is None or not paddle.in_dynamic_mode() or x.ndim < 2:
            return super().forward(x)
        if self.bias.stop_gradient and paddle.is_grad_enabled():
            if not (x.stop_gradient and self.weight.stop_gradient):
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
    """``num_layers`` Linear layers with an activation (ReLU unless ``activation`` is given)
    between them (upstream: mask_decoder.MLP; SAM 2's sam2_utils.MLP takes ``activation``)."""

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int,
        output_dim: int,
        num_layers: int,
        sigmoid_output: bool = False,
        activation: type[nn.Layer] | None = None,
    ) -> None:
        super().__init__()
        self.num_layers = num_layers
        h = [hidden_dim] * (num_layers - 1)
        self.layers = nn.LayerList(
            Linear(n, k) for n, k in zip([input_dim] + h, h + [output_dim], strict=True)
        )
        self.sigmoid_output = sigmoid_output
        self.act = nn.functional.relu if activation is None else activation()

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        for i, layer in enumerate(self.layers):
            x = self.act(layer(x)) if i < self.num_layers - 1 else layer(x)
        if self.sigmoid_output:
            x = nn.functional.sigmoid(x)
        return x


def _row_runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Horizontal runs of True in an H x W mask: rows, starts, ends (exclusive), raster order."""
    h, w = mask.shape
    padded = np.zeros((h, w + 2), dtype=np.int8)
    padded[:, 1:-1] = mask
    d = np.diff(padded, axis=1)
    rows, starts = np.nonzero(d == 1)
    _, ends = np.nonzero(d == -1)
    return rows, starts, ends


def connected_components(mask: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """8-connected components of an H x W binary mask, labelled like OpenCV.

    Returns ``(n_labels, labels, areas)``: ``labels`` is H x W int32 with 0 for background and
    1..n_labels-1 for components numbered in raster order of their first pixel; ``areas[i]`` is
    the pixel count of label i (``areas[0]`` counts the background).
    """
    mask = np.asarray(mask).astype(bool)
    h, w = mask.shape
    rows, starts, ends = _row_runs(mask)
    n_runs = len(rows)
    labels = np.zeros((h, w), dtype=np.int32)
    if n_runs == 0:
        return 1, labels, np.array([h * w], dtype=np.int64)

    # Runs in adjacent rows touch (8-connectivity) iff  start_b <= end_a and start_a <= end_b.
    # With keys row * K + col (K > w) the runs are globally sorted, so for each run b in row r+1
    # the touching runs of row r form one contiguous index range [lo, hi).
    k = w + 2
    start_keys = rows * k + starts
    end_keys = rows * k + ends
    above = rows > 0
    b_idx = np.flatnonzero(above)
    prev_row = (rows[b_idx] - 1) * k
    lo = np.searchsorted(end_keys, prev_row + starts[b_idx], side="left")
    hi = np.searchsorted(start_keys, prev_row + ends[b_idx], side="right")
    n_pairs = np.maximum(hi - lo, 0)
    edge_b = np.repeat(b_idx, n_pairs)
    first = np.repeat(lo - np.concatenate([[0], np.cumsum(n_pairs)[:-1]]), n_pairs)
    edge_a = first + np.arange(edge_b.size)

    # Union-find by hooking roots onto the smaller root and full path compression, vectorised.
    parent = np.arange(n_runs)
    while edge_a.size:
        ra, rb = parent[edge_a], parent[edge_b]
        differ = ra != rb
        if not differ.any():
            break
        ra, rb = ra[differ], rb[differ]
        lo_root = np.minimum(ra, rb)
        np.minimum.at(parent, np.maximum(ra, rb), lo_root)
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand
    # Roots are the first run (in raster order) of each component -> OpenCV's label order.
    roots, run_label = np.unique(parent, return_inverse=True)
    run_len = ends - starts
    areas = np.zeros(len(roots) + 1, dtype=np.int64)
    np.add.at(areas, run_label + 1, run_len)
    areas[0] = h * w - run_len.sum()
    labels.reshape(-1)[np.flatnonzero(mask)] = np.repeat(run_label + 1, run_len)
    return len(roots) + 1, labels, areas


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
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        unknown = sorted(set(d) - {f.name for f in fields})
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {unknown}")
        missing = [
            f.name
            for f in fields
            if f.name not in d
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(f"missing {cls.__name__} fields: {missing}")
        try:
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
        except TypeError as exc:  # a value of the wrong kind, e.g. text for a size
            raise ValueError(f"bad {cls.__name__} values: {exc}") from exc

    def _check_positive(self, *names: str) -> None:
        bad = [f"{n}={getattr(self, n)!r}" for n in names if not getattr(self, n) > 0]
        if bad:
            raise ValueError(f"{type(self).__name__}: sizes must be positive: {', '.join(bad)}")
