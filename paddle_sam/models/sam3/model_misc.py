"""Layers shared by the SAM 3 modules (upstream: sam3/model/model_misc.py).

``MultiheadAttention`` follows ``torch.nn.MultiheadAttention`` semantics (sequence-first unless
``batch_first``, bool or additive ``attn_mask``, ``key_padding_mask``) with separate q/k/v
projections; the converter splits torch's fused ``in_proj_weight`` into them.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from ..common import Linear, can_be_inplace, worker_pool


def inverse_sigmoid(x: paddle.Tensor, eps: float = 1e-3) -> paddle.Tensor:
    """``log(x / (1 - x))`` with both terms clamped to ``eps`` (x clamped to [0, 1] first)."""
    x = x.clip(0.0, 1.0)
    return paddle.log(x.clip(min=eps) / (1 - x).clip(min=eps))


def is_static_size(n: object) -> bool:
    """Whether a size from ``x.shape`` is a Python int. Always in dygraph; in a static graph
    only for sizes fixed at export (a dynamic one is a tensor there), so shape-dependent
    Python control flow can take the branch that is valid for every size."""
    return isinstance(n, int)


_ATTN_BLOCK = 1 << 23  # attention scores computed at once (32 MB in float32)
#: a ``block`` for :func:`attend_in_row_blocks` that no attention exceeds: every row at once
ALL_ROWS = 1 << 62

# Paddle's CPU softmax (like its other elementwise kernels) runs on one thread; only its GEMMs
# use several. Where the fused kernel below does not apply (CPUs without AVX-512) the softmax
# is about half of an attention's time. Paddle's dygraph ops release the GIL, so large
# attentions split their query rows between Python threads, one CPU thread each (measured
# here, AMD EPYC without AVX-512, 2 threads: 8 heads x 5184 x 5184 of 32, 0.60 s -> 0.49 s).
# Below this many scores the hand-off costs more than it gains. The ViT does not take this
# path: its 256 MB blocks from two threads fragmented glibc's heap (peak RSS of a forward
# +1.0 GB) for no gain in its time.
PARALLEL_ATTENTION_MIN_SCORES = 1 << 22


# Paddle's fused CPU attention kernel (``self_dp_attention``: flash-style 512 x 512 tiles with an
# online softmax, AVX-512, OpenMP over heads and row tiles). Measured here (AMD EPYC, 2 threads)
# against matmul + softmax (in row blocks where those apply): 5184 tokens, 8 heads of 32 (SAM 3's
# fusion encoder) 0.20-0.22 s against 0.42-0.46 s (torch's SDPA 0.20-0.22 s); 16 heads of 64
# (the ViT's global blocks) 0.67 s against 1.16-1.26 s (torch 0.70-0.76 s); the ViT's 9 windows
# of 576 tokens 85 ms against 127 ms; 201 tokens (the decoder's queries) 0.45 against 0.68 ms;
# 64 tokens 0.14 against 0.07 ms, hence the length floor. Agreement with the unfused form:
# ~2e-7. It needs the thread count set on the calling thread (``_runtime``).
FUSED_ATTENTION_MIN_TOKENS = 192


@functools.cache
def fused_attention_available() -> bool:
    """Whether this Paddle has the fused CPU attention kernel and this CPU runs it (AVX-512F).
    The kernel's GEMMs are oneDNN's: a build without oneDNN would only log an error."""
    try:
        from paddle.base import core

        return (
            hasattr(paddle._C_ops, "self_dp_attention")
            and bool(core.is_compiled_with_mkldnn())
            and bool(core.supports_avx512f())
        )
    except (ImportError, AttributeError):  # pragma: no cover - other Paddle builds
        return False


@paddle.jit.not_to_static  # plain Python while a program is traced (reads live settings)
def use_fused_attention(mode: bool | None, x: paddle.Tensor, n_q: object, n_k: object) -> bool:
    """Whether an attention over ``n_q`` queries and ``n_k`` keys of ``x``'s dtype and place
    runs through :func:`fused_self_attention`.

    ``mode``: ``False`` never; ``None`` (a layer's default) in dygraph when the kernel runs
    here, ``x`` is float32 on the CPU and no gradient is wanted, never in a static graph;
    ``True`` also in a static graph (an export for CPUs with AVX-512, which the runtime
    checks). Only for equal lengths of at least ``FUSED_ATTENTION_MIN_TOKENS`` and no mask.
    """
    if mode is False or not (is_static_size(n_q) and is_static_size(n_k)):
        return False
    if n_q != n_k or n_q < FUSED_ATTENTION_MIN_TOKENS:
        return False
    if not paddle.in_dynamic_mode():
        return bool(mode)
    return (
        fused_attention_available()
        and x.place.is_cpu_place()
        and x.dtype == paddle.float32
        and (x.stop_gradient or not paddle.is_grad_enabled())
        and _serial_executor()
    )


def _serial_executor() -> bool:
    # from dygraph the kernel runs with the calling thread's thread count only when Paddle's
    # executor runs programs on that thread (``_runtime``'s default on CPU-only builds);
    # otherwise it would run on one thread, slower than matmul + softmax on several
    flag = "FLAGS_new_executor_serial_run"
    return bool(paddle.get_flags([flag])[flag])


def _self_dp_attention(qkv: paddle.Tensor, scale: float, num_heads: int) -> paddle.Tensor:
    return paddle._C_ops.self_dp_attention(qkv, scale, num_heads)


@functools.cache
def _fused_attention_program() -> Callable:
    # the kernel exists as a static-graph op only: dygraph reaches it through a to_static
    # function (one small program per input shape, built on first use)
    return paddle.jit.to_static(_self_dp_attention, full_graph=True)


def fused_self_attention(qkv: paddle.Tensor, scale: float) -> paddle.Tensor:
    """``softmax(scale * q k^T) v`` per head from packed ``qkv`` (``B x L x 3 x h x d``: q, k, v
    of equal length, no mask) -> ``B x L x h x d``, through Paddle's fused CPU kernel; see
    :func:`use_fused_attention` for when it applies."""
    num_heads = int(qkv.shape[3])
    if paddle.in_dynamic_mode():
        return _fused_attention_program()(qkv, float(scale), num_heads)
    return _self_dp_attention(qkv, float(scale), num_heads)


def _as_additive(mask: paddle.Tensor, dtype: paddle.dtype) -> paddle.Tensor:
    """Bool mask (True = masked out) -> 0 / -inf; float masks are returned as they are."""
    if mask.dtype == paddle.bool:
        return paddle.where(mask, paddle.full([], float("-inf"), dtype), paddle.zeros([], dtype))
    return mask.astype(dtype)


def _row_workers(rows: int, scores: int, x: paddle.Tensor) -> int:
    """How many threads an attention of ``scores`` scores in ``rows`` query rows runs on (1:
    the calling thread, as it is): dygraph inference on the CPU with several threads."""
    if scores < PARALLEL_ATTENTION_MIN_SCORES or rows < 2 or not paddle.in_dynamic_mode():
        return 1
    if not x.place.is_cpu_place() or (paddle.is_grad_enabled() and not x.stop_gradient):
        return 1
    from ..._runtime import get_num_threads

    return max(1, min(rows, get_num_threads() or 1))


def attend_in_row_blocks(
    q: paddle.Tensor,
    k: paddle.Tensor,
    v: paddle.Tensor,
    mask: paddle.Tensor | None = None,
    block: int | None = None,
    dropout_p: float = 0.0,
    threads: bool = True,
) -> paddle.Tensor:
    """``softmax(q k^T + mask) v`` over the last two axes (``... x L x d`` queries, ``... x S x d``
    keys and values; ``q`` already scaled; ``mask`` additive, broadcastable to ``... x L x S``).

    Rows of the attention matrix are independent: they are computed in blocks of at most
    ``block`` scores, so the whole matrix (860 MB for SAM 3's 72 x 72 fusion encoder) is never
    materialised and the blocks stay in a warm working set (``block`` None: ``_ATTN_BLOCK``,
    32 MB; ``ALL_ROWS``: one block, for a runtime that tiles the rows itself). With
    ``threads``, in dygraph inference on the CPU the rows are shared between threads, each
    with a share of ``block`` (see ``PARALLEL_ATTENTION_MIN_SCORES``). A static
    graph with a dynamic length runs one block: those matrices are small. ``dropout_p`` > 0
    applies dropout to the attention weights (training)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if not (is_static_size(n_q) and is_static_size(n_k)):
        return _attend_rows(q, k, v, mask, dropout_p, 0, None)
    lead = int(np.prod(q.shape[:-2]))
    workers = _row_workers(n_q, lead * n_q * n_k, q) if threads else 1
    # the threads share the block budget: as much memory in flight as on one thread
    step = max(1, (block or _ATTN_BLOCK) // workers // max(1, lead * n_k))
    if workers == 1:
        return _attend_blocks(q, k, v, mask, dropout_p, 0, n_q, step)
    bounds = np.linspace(0, n_q, workers + 1).round().astype(int)
    futures = [
        worker_pool(workers).submit(_attend_blocks, q, k, v, mask, dropout_p, int(a), int(b), step)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return paddle.concat([f.result() for f in futures], axis=-2)


def _attend_blocks(q, k, v, mask, dropout_p, begin, end, step) -> paddle.Tensor:
    outs = [
        _attend_rows(q, k, v, mask, dropout_p, i, min(i + step, end))
        for i in range(begin, end, step)
    ]
    return outs[0] if len(outs) == 1 else paddle.concat(outs, axis=-2)


def _attend_rows(q, k, v, mask, dropout_p, begin, end) -> paddle.Tensor:
    """Rows ``begin:end`` of the attention (``end`` None: all)."""
    whole = end is None or (begin == 0 and end == q.shape[-2])
    attn = paddle.matmul(q if whole else q[..., begin:end, :], k, transpose_y=True)
    if mask is not None:
        rows = mask if whole or mask.shape[-2] == 1 else mask[..., begin:end, :]
        if list(rows.shape) != list(attn.shape):
            # Paddle's CPU add is slow when the smaller operand broadcasts along the middle
            # axes (heads, queries): 41 ms against 6 ms with the expand for 8 x 200 x 5184
            rows = rows.expand(attn.shape)
        attn = attn + rows
    if dropout_p > 0:
        attn = F.dropout(F.softmax(attn, axis=-1), dropout_p)
    elif can_be_inplace(attn):  # saves a pass over the largest tensor
        attn = F.softmax_(attn, axis=-1)
    else:
        attn = F.softmax(attn, axis=-1)
    return paddle.matmul(attn, v)


class MultiheadAttention(nn.Layer):
    """Multi-head attention with ``torch.nn.MultiheadAttention`` semantics.

    Inputs are ``L x B x E`` (``B x L x E`` with ``batch_first``). ``attn_mask`` is ``L x S`` or
    ``(B * num_heads) x L x S``, bool (True = not allowed) or additive float;
    ``key_padding_mask`` is ``B x S``, bool (True = padding) or additive float. Returns
    ``(output, None)``: attention weights are never returned (upstream wraps the layer with
    ``need_weights=False``). Dropout is applied to the attention weights in training only.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        batch_first: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        # see use_fused_attention (None: Paddle's fused CPU kernel when it applies)
        self.fused_attention: bool | None = None
        self.q_proj = Linear(embed_dim, embed_dim, bias_attr=None if bias else False)
        self.k_proj = Linear(kdim or embed_dim, embed_dim, bias_attr=None if bias else False)
        self.v_proj = Linear(vdim or embed_dim, embed_dim, bias_attr=None if bias else False)
        self.out_proj = Linear(embed_dim, embed_dim, bias_attr=None if bias else False)

    def forward(
        self,
        query: paddle.Tensor,
        key: paddle.Tensor,
        value: paddle.Tensor,
        key_padding_mask: paddle.Tensor | None = None,
        need_weights: bool = False,
        attn_mask: paddle.Tensor | None = None,
    ) -> tuple[paddle.Tensor, None]:
        if not self.batch_first:
            query, key, value = (t.transpose([1, 0, 2]) for t in (query, key, value))
        b, n_q, _ = query.shape
        n_k = key.shape[1]
        h, d = self.num_heads, self.head_dim
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        no_mask = attn_mask is None and key_padding_mask is None
        dropout = self.training and self.dropout > 0
        if no_mask and not dropout and use_fused_attention(self.fused_attention, q, n_q, n_k):
            qkv = paddle.stack([t.reshape([b, n_q, h, d]) for t in (q, k, v)], axis=2)
            out = fused_self_attention(qkv, 1.0 / math.sqrt(d)).reshape([b, n_q, h * d])
            out = self.out_proj(out)
            return (out if self.batch_first else out.transpose([1, 0, 2])), None
        q = q.reshape([b, n_q, h, d]).transpose([0, 2, 1, 3])
        k = k.reshape([b, n_k, h, d]).transpose([0, 2, 1, 3])
        v = v.reshape([b, n_k, h, d]).transpose([0, 2, 1, 3])

        mask = None  # additive, broadcastable to B x h x Lq x Lk
        if attn_mask is not None:
            mask = _as_additive(attn_mask, q.dtype)
            mask = mask.reshape([b, h, n_q, n_k] if mask.ndim == 3 else [1, 1, n_q, n_k])
        if key_padding_mask is not None:
            pad = _as_additive(key_padding_mask, q.dtype).reshape([b, 1, 1, n_k])
            mask = pad if mask is None else mask + pad
        q = q * (1.0 / math.sqrt(d))
        out = attend_in_row_blocks(q, k, v, mask, dropout_p=self.dropout if dropout else 0.0)
        out = out.transpose([0, 2, 1, 3]).reshape([b, n_q, h * d])
        out = self.out_proj(out)
        if not self.batch_first:
            out = out.transpose([1, 0, 2])
        return out, None


class MLP(nn.Layer):
    """Linear layers with ReLU between them, optional residual and output norm (upstream MLP)."""

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int,
        output_dim: int,
        num_layers: int,
        dropout: float = 0.0,
        residual: bool = False,
        out_norm: nn.Layer | None = None,
    ) -> None:
        super().__init__()
        self.num_layers = num_layers
        h = [hidden_dim] * (num_layers - 1)
        self.layers = nn.LayerList(
            Linear(n, k) for n, k in zip([input_dim] + h, h + [output_dim], strict=True)
        )
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        if residual and input_dim != output_dim:
            raise ValueError("residual is only supported if input_dim == output_dim")
        self.residual = residual
        self.out_norm = out_norm or nn.Identity()

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        orig_x = x
        for i, layer in enumerate(self.layers):
            x = self.drop(F.relu(layer(x))) if i < self.num_layers - 1 else layer(x)
        if self.residual:
            x = x + orig_x
        return self.out_norm(x)


class DotProductScoring(nn.Layer):
    """Query-vs-prompt classification logits: mean-pooled prompt dotted with each query."""

    def __init__(
        self,
        d_model: int,
        d_proj: int,
        prompt_mlp: nn.Layer | None = None,
        clamp_logits: bool = True,
        clamp_max_val: float = 12.0,
    ) -> None:
        super().__init__()
        self.d_proj = d_proj
        self.prompt_mlp = prompt_mlp
        self.prompt_proj = Linear(d_model, d_proj)
        self.hs_proj = Linear(d_model, d_proj)
        self.scale = float(1.0 / math.sqrt(d_proj))
        self.clamp_logits = clamp_logits
        self.clamp_max_val = clamp_max_val

    @staticmethod
    def mean_pool_text(prompt: paddle.Tensor, prompt_mask: paddle.Tensor) -> paddle.Tensor:
        """prompt: ``S x B x C``; prompt_mask: ``B x S`` bool, True = padding -> ``B x C``."""
        is_valid = (~prompt_mask).astype(prompt.dtype).transpose([1, 0]).unsqueeze(-1)
        num_valid = is_valid.sum(axis=0).clip(min=1.0)
        return (prompt * is_valid).sum(axis=0) / num_valid

    def forward(
        self, hs: paddle.Tensor, prompt: paddle.Tensor, prompt_mask: paddle.Tensor
    ) -> paddle.Tensor:
        """hs ``L x B x Q x C``, prompt ``S x B x C``, prompt_mask ``B x S`` -> ``L x B x Q x 1``"""
        if hs.ndim != 4 or prompt.ndim != 3 or prompt_mask.ndim != 2:
            raise ValueError(
                f"expected hs 4-D, prompt 3-D, prompt_mask 2-D; got {hs.ndim}, {prompt.ndim}, "
                f"{prompt_mask.ndim}"
            )
        if self.prompt_mlp is not None:
            prompt = self.prompt_mlp(prompt)
        pooled = self.prompt_proj(self.mean_pool_text(prompt, prompt_mask))  # B x d_proj
        proj_hs = self.hs_proj(hs)
        scores = paddle.matmul(proj_hs, pooled.unsqueeze(-1)) * self.scale
        if self.clamp_logits:
            scores = scores.clip(-self.clamp_max_val, self.clamp_max_val)
        return scores


class LayerScale(nn.Layer):
    """Per-channel scale ``x * gamma``."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = self.create_parameter(
            [dim], default_initializer=nn.initializer.Constant(init_values)
        )

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return x * self.gamma


class TransformerWrapper(nn.Layer):
    """Holds the fusion encoder and the decoder (upstream TransformerWrapper, inference only)."""

    def __init__(
        self,
        encoder: nn.Layer,
        decoder: nn.Layer | None,
        d_model: int,
        two_stage_type: str = "none",
        pos_enc_at_input_dec: bool = True,
    ) -> None:
        super().__init__()
        if two_stage_type != "none":
            raise ValueError(f"unknown two_stage_type {two_stage_type!r}: only 'none'")
        self.encoder = encoder
        self.decoder = decoder
        self.num_queries = decoder.num_queries if decoder is not None else None
        self.pos_enc_at_input_dec = pos_enc_at_input_dec
        self.two_stage_type = two_stage_type
        self.d_model = d_model


def get_clones(module: nn.Layer, n: int) -> nn.LayerList:
    """``n`` independent deep copies of ``module``."""
    return nn.LayerList([copy.deepcopy(module) for _ in range(n)])


def get_activation_fn(activation: str) -> Callable[[paddle.Tensor], paddle.Tensor]:
    """``relu`` / ``gelu`` (exact erf) / ``glu`` by name."""
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if activation == "glu":
        return F.glu
    raise ValueError(f"activation should be relu/gelu/glu, not {activation!r}")


def gen_sineembed_for_position(pos_tensor: paddle.Tensor, num_feats: int = 256) -> paddle.Tensor:
    """Sine embedding of ``Q x B x k`` points (k=2) or boxes (k=4) -> ``Q x B x num_feats/2*k``.

    Order of the parts: y, x (then w, h for boxes); sin and cos interleaved.
    """
    if num_feats % 2 != 0:
        raise ValueError(f"num_feats must be even, got {num_feats}")
    half = num_feats // 2
    scale = 2 * math.pi
    dim_t = paddle.arange(half, dtype="float32")
    dim_t = 10000 ** (2 * paddle.floor(dim_t / 2) / half)

    def embed(c: paddle.Tensor) -> paddle.Tensor:
        p = (c * scale).unsqueeze(-1) / dim_t
        return paddle.stack((p[:, :, 0::2].sin(), p[:, :, 1::2].cos()), axis=3).flatten(2)

    n = pos_tensor.shape[-1]
    if n == 2:
        return paddle.concat([embed(pos_tensor[:, :, 1]), embed(pos_tensor[:, :, 0])], axis=2)
    if n == 4:
        parts = [embed(pos_tensor[:, :, i]) for i in (1, 0, 2, 3)]
        return paddle.concat(parts, axis=2)
    raise ValueError(f"unknown pos_tensor shape(-1): {n} (expected 2 or 4)")
