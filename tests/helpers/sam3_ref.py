"""Helpers to run the official sam3 code (facebookresearch/sam3 0.1.4) on the CPU in tests.

Importing this module imports neither torch nor sam3; every helper imports them when called.

sam3 0.1.4 assumes CUDA in three places (docs/design.md section 1). :func:`cpu_patches` patches
them for the duration of a ``with`` block, without touching site-packages:

* ``PositionEmbeddingSine(precompute_resolution=...)`` fills its cache from tensors made on
  ``"cuda"``: the cache is filled from CPU tensors instead (same values; ``forward`` computes
  exactly what the cache would hold);
* ``TransformerDecoder`` builds its box-RPB coordinates with ``device="cuda"``: made on the CPU;
* ``SequenceGeometryEncoder`` calls ``Tensor.pin_memory()``: a no-op.

Use it as a context manager around building *and* running the reference, or through the
``sam3_cpu`` pytest fixture pattern::

    @pytest.fixture
    def sam3_cpu():
        with cpu_patches():
            yield
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from paddle_sam.align.sam3 import (  # one copy of these, shared with `paddle-sam align`
    cpu_patches,
    import_sam3,
    reference_vision_backbone,
)

BPE_NAME = "bpe_simple_vocab_16e6.txt.gz"


@contextlib.contextmanager
def tracker_cpu_patches() -> Iterator[None]:
    """:func:`cpu_patches` plus what sam3 0.1.4's video tracker needs on the CPU, inside the
    block only: ``Tensor.cuda`` a no-op (stored memories are moved to CUDA), and
    ``Sam3TrackerBase.track_step`` accepting and dropping ``gt_masks`` and
    ``frames_to_add_correction_pt``, which ``_get_empty_mask_ptr`` passes although
    ``track_step`` has no such arguments (upstream raises a TypeError whenever an object has
    no output on a frame that another object was prompted on)."""
    from unittest import mock

    torch, _ = import_sam3()
    from sam3.model.sam3_tracker_base import Sam3TrackerBase

    track_step = Sam3TrackerBase.track_step

    def track_step_tolerant(self, *args: Any, **kwargs: Any):
        kwargs.pop("gt_masks", None)
        kwargs.pop("frames_to_add_correction_pt", None)
        return track_step(self, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(cpu_patches())
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self))
        stack.enter_context(mock.patch.object(Sam3TrackerBase, "track_step", track_step_tolerant))
        yield


def perturb_state_dict(
    state_dict: Mapping[str, Any], seed: int = 0, scale: float = 0.02, init_std: float = 0.02
) -> dict[str, Any]:
    """A copy of a torch state dict with every floating tensor made finite and perturbed.

    Tensors that hold a non-finite or absurd value (sam3 leaves the text encoder's
    ``positional_embedding`` and ``text_projection`` as ``torch.empty``) are first drawn from
    N(0, ``init_std``). Then every floating tensor gets relative noise
    ``scale * N(0, 1) * (mean|t| + 0.5)``, so norms at 1 and biases at 0 all matter.
    Complex buffers (RoPE ``freqs_cis``) and integer tensors are returned unchanged: they are
    fixed functions of the configuration, which our model recomputes.
    """
    torch, _ = import_sam3()
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for key, t in state_dict.items():
            if not t.is_floating_point():
                out[key] = t.clone()
                continue
            t = t.detach().clone()
            if t.numel() and (not torch.isfinite(t).all() or t.abs().max() > 1e3):
                t = torch.randn(t.shape, generator=gen, dtype=t.dtype) * init_std
            noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
            out[key] = t + scale * noise * (t.abs().mean() + 0.5)
    return out


def perturb_module_(module: Any, seed: int = 0, scale: float = 0.02) -> Any:
    """:func:`perturb_state_dict` applied to ``module`` in place (strict load); returns it."""
    module.load_state_dict(perturb_state_dict(module.state_dict(), seed, scale), strict=True)
    return module


def fan_in_init_(module: Any, seed: int = 0, gain: float = 1.0) -> Any:
    """Redraw every Linear weight (and fused ``in_proj_weight``) from N(0, gain^2 / fan_in).

    Upstream inits (trunc-normal std 0.02) keep attention logits near 0: softmax is then
    almost uniform and a wrong RoPE or mask barely moves the output. Unit-variance
    projections make attention peaked, so positional details matter. Returns ``module``.
    """
    torch, _ = import_sam3()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for sub in module.modules():
            for name in ("weight", "in_proj_weight"):
                w = getattr(sub, name, None)
                is_linear = isinstance(sub, torch.nn.Linear) and name == "weight"
                if w is None or not (is_linear or name == "in_proj_weight"):
                    continue
                std = gain / w.shape[1] ** 0.5
                w.copy_(torch.randn(w.shape, generator=gen, dtype=w.dtype) * std)
    return module


def numpy_state_dict(module_or_state: Any) -> dict[str, np.ndarray]:
    """A torch module's (or state dict's) tensors as numpy arrays, official names and layouts."""
    state = (
        module_or_state.state_dict() if hasattr(module_or_state, "state_dict") else module_or_state
    )
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


def to_numpy(x: Any) -> np.ndarray:
    """A torch or paddle tensor (or array) as a numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def metrics(ref: Any, ours: Any) -> tuple[float, float, float]:
    """(cosine, max abs error, mean abs error) of two same-shaped arrays, in float64."""
    a = to_numpy(ref).astype(np.float64).ravel()
    b = to_numpy(ours).astype(np.float64).ravel()
    if a.shape != b.shape:
        raise AssertionError(f"shape mismatch: reference {a.shape}, ours {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise AssertionError("non-finite values in the compared outputs")
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    cos = float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))
    diff = np.abs(a - b)
    return cos, float(diff.max(initial=0.0)), float(diff.mean()) if a.size else 0.0


def assert_close(
    ref: Any, ours: Any, *, cos: float = 0.99999, max_abs: float = 1e-4, name: str = "output"
) -> tuple[float, float, float]:
    """Assert cosine >= ``cos`` and max abs error <= ``max_abs``; returns the metrics."""
    ref_shape, our_shape = tuple(to_numpy(ref).shape), tuple(to_numpy(ours).shape)
    assert ref_shape == our_shape, f"{name}: shape {our_shape}, reference {ref_shape}"
    c, m, mean = metrics(ref, ours)
    assert c >= cos and m <= max_abs, (
        f"{name}: cosine {c:.8f} (need >= {cos}), max abs {m:.3e} (need <= {max_abs:.1e}), "
        f"mean abs {mean:.3e}"
    )
    return c, m, mean


def reference_tracker(spec: Any, with_backbone: bool, **settings: Any) -> Any:
    """The official ``Sam3TrackerPredictor`` at ``spec``'s image and patch sizes: memory
    attention and memory encoder as ``model_builder.build_tracker`` makes them (the mask resize
    scaled to 16 x the feature side), ``settings`` passed through; ``with_backbone`` adds the
    vision backbone with its SAM 2 neck and no text encoder. Build it inside
    :func:`tracker_cpu_patches`."""
    from sam3 import model_builder as mb
    from sam3.model import memory as m
    from sam3.model.position_encoding import PositionEmbeddingSine
    from sam3.model.sam3_tracking_predictor import Sam3TrackerPredictor
    from sam3.model.vl_combiner import SAM3VLBackbone

    side = spec.image_size // spec.vit_patch_size
    maskmem = m.SimpleMaskEncoder(
        out_dim=64,
        position_encoding=PositionEmbeddingSine(
            num_pos_feats=64, normalize=True, scale=None, temperature=10000
        ),
        mask_downsampler=m.SimpleMaskDownSampler(
            kernel_size=3, stride=2, padding=1, interpol_size=[16 * side, 16 * side]
        ),
        fuser=m.SimpleFuser(
            layer=m.CXBlock(
                dim=256, kernel_size=7, padding=3, layer_scale_init_value=1e-6, use_dwconv=True
            ),
            num_layers=2,
        ),
    )
    backbone = None
    if with_backbone:
        backbone = SAM3VLBackbone(
            visual=reference_vision_backbone(spec, add_sam2_neck=True), text=None, scalp=1
        )
    return Sam3TrackerPredictor(
        backbone=backbone,
        transformer=mb._create_tracker_transformer(),
        maskmem_backbone=maskmem,
        image_size=spec.image_size,
        backbone_stride=spec.vit_patch_size,
        **settings,
    )


def randomise_tracker_(ref: Any, obj_bias: float = 6.0) -> Any:
    """Perturbed weights that make every part of an official tracker matter: all tensors
    perturbed, unit-gain memory attention, memory embeddings of scale 0.5, and the object
    score head's bias at ``obj_bias`` (scores clearly away from 0, so that both sides take the
    same presence decisions). Returns ``ref`` in eval mode."""
    torch, _ = import_sam3()
    perturb_module_(ref, seed=1, scale=0.05)
    fan_in_init_(ref.transformer.encoder, seed=3, gain=1.0)
    with torch.no_grad():
        for name in ("no_mem_embed", "no_obj_ptr", "no_obj_embed_spatial", "maskmem_tpos_enc"):
            getattr(ref, name).normal_(0, 0.5)
        ref.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.fill_(obj_bias)
    return ref.eval()


def assert_masks_close(r: Any, o: Any, name: str, rel: float = 1e-4) -> float:
    """Tracker mask logits (objects x 1 x H x W, torch vs paddle) within ``rel`` of their
    scale. Where two objects' logits tie to float32 noise the non-overlap constraint may keep
    either one (the other clamped): such swapped pixels (at most 0.1 %) are compared with the
    objects' values sorted. Binary masks differ on at most 0.1 % of pixels, and only where the
    reference logit is within the tolerance of 0 or objects swapped. Returns the max abs
    error."""
    r_np = to_numpy(r)
    o_np = to_numpy(o)
    tol = rel * max(1.0, float(np.abs(r_np).max()))
    swapped = (np.abs(r_np - o_np) > tol).any(axis=(0, 1))
    assert swapped.mean() <= 1e-3, f"{name}: {int(swapped.sum())} pixels differ"
    _, err, _ = assert_close(np.sort(r_np, 0), np.sort(o_np, 0), max_abs=tol, name=name)
    flipped = (r_np > 0) != (o_np > 0)
    assert flipped.mean() <= 1e-3, f"{name}: binary masks differ on {flipped.mean():.4%}"
    near_zero = np.abs(r_np) <= tol
    assert not (flipped & ~near_zero & ~swapped).any(), f"{name}: a clear pixel flipped"
    return err


def run_prompts(processor: Any, img: Any, steps: list, threshold: float | None = None) -> dict:
    """Apply prompt steps ("text", str) / ("box", box, label) to a fresh state of any
    ``Sam3Processor`` (ours, the official one, the static runtime); return the state."""
    state = processor.set_image(img)
    if threshold is not None:
        processor.set_confidence_threshold(threshold)
    for step in steps:
        if step[0] == "text":
            state = processor.set_text_prompt(step[1], state)
        else:
            state = processor.add_geometric_prompt(step[1], step[2], state)
    return state


def attention_path(monkeypatch: Any, fused: bool) -> list[int]:
    """Make SAM 3's attention layers take (``fused``) or skip Paddle's fused CPU attention
    kernel at the tiny test sizes (the length floor lowered to 1 token, or the kernel
    reported unavailable); returns a list that counts the fused calls. Skips the test when
    ``fused`` is asked on a machine whose Paddle or CPU cannot run the kernel."""
    import pytest

    from paddle_sam.models.sam3 import model_misc, vitdet

    if fused and not model_misc.fused_attention_available():
        pytest.skip("Paddle's fused CPU attention needs AVX-512F and its kernel")
    calls: list[int] = []
    real = model_misc.fused_self_attention

    def counted(qkv, scale):
        calls.append(int(qkv.shape[1]))
        return real(qkv, scale)

    monkeypatch.setattr(model_misc, "fused_self_attention", counted)
    monkeypatch.setattr(vitdet, "fused_self_attention", counted)
    if fused:
        monkeypatch.setattr(model_misc, "FUSED_ATTENTION_MIN_TOKENS", 1)
    else:
        monkeypatch.setattr(model_misc, "fused_attention_available", lambda: False)
    return calls


def threaded_attention(monkeypatch: Any, threads: int = 3) -> list[str]:
    """Make the row-blocked attention share its rows between ``threads`` worker threads at
    the tiny test sizes (as large attentions do in dygraph inference on several CPU threads);
    returns a list of the thread names that ran blocks of rows."""
    import threading

    import paddle_sam._runtime as runtime
    from paddle_sam.models.sam3 import model_misc

    names: list[str] = []
    real = model_misc._attend_blocks

    def counted(*args):
        names.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(model_misc, "PARALLEL_ATTENTION_MIN_SCORES", 0)
    monkeypatch.setattr(runtime, "get_num_threads", lambda: threads)
    monkeypatch.setattr(model_misc, "_attend_blocks", counted)
    return names


def _triton_kernel_math(x: Any, y: Any, alpha: float, gamma: float) -> Any:
    """The elementwise focal loss exactly as upstream's Triton kernel writes it."""
    torch, _ = import_sam3()
    x = x.float()
    bce = x.clamp(min=0) - x * y + torch.log(1 + torch.exp(-x.abs()))
    sig = torch.sigmoid(x)
    p_t = sig * y + (1 - sig) * (1 - y)
    alpha_t = alpha * y + (1 - alpha) * (1 - y)
    return alpha_t * (1 - p_t) ** gamma * bce


def _f1_score(preds: Any, target: Any, task: str = "binary") -> Any:
    """torchmetrics' binary F1: preds > 0.5 (probabilities), 0 when undefined."""
    torch, _ = import_sam3()
    assert task == "binary"
    pred, true = preds > 0.5, target.bool()
    tp = (pred & true).sum().float()
    fp = (pred & ~true).sum().float()
    fn = (~pred & true).sum().float()
    denom = 2 * tp + fp + fn
    return 2 * tp / denom if denom > 0 else torch.zeros(())


@contextlib.contextmanager
def sam3_train_reference() -> Iterator[Any]:
    """The official training criterion, runnable on the CPU inside the block: a namespace with
    ``M`` (``sam3.train.matcher``), ``L`` (``loss_fns``), ``S`` (``sam3_loss``), ``SAM3Output``
    and ``pad`` (the collator's ``packed_to_padded_naive``).

    Upstream's focal losses default to fused Triton kernels (GPU only): inside the block the
    two kernel entry points of ``loss_fns`` are a torch transcription of the kernels' formula
    (:func:`_triton_kernel_math`; autograd gives the kernels' hand-written backward). Without
    torchmetrics (not a declared dependency of sam3) its binary F1 (the ``ce_f1`` metric) is a
    stand-in while the modules are imported; without triton the kernel module is a stub."""
    import sys
    import types

    added: dict[str, Any] = {}
    try:
        import torchmetrics  # noqa: F401
    except ImportError:
        tm, fn = types.ModuleType("torchmetrics"), types.ModuleType("torchmetrics.functional")
        fn.f1_score = _f1_score
        tm.functional = fn
        added = {"torchmetrics": tm, "torchmetrics.functional": fn}
    try:
        import triton  # noqa: F401
    except ImportError:
        kern = types.ModuleType("sam3.train.loss.sigmoid_focal_loss")
        kern.triton_sigmoid_focal_loss = kern.triton_sigmoid_focal_loss_reduce = None
        added["sam3.train.loss.sigmoid_focal_loss"] = kern
    saved = {k: sys.modules.get(k) for k in added}
    sys.modules.update(added)
    try:
        from sam3.model.model_misc import SAM3Output
        from sam3.train import matcher
        from sam3.train.data.collator import packed_to_padded_naive
        from sam3.train.loss import loss_fns, sam3_loss
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    kernels = (loss_fns.triton_sigmoid_focal_loss, loss_fns.triton_sigmoid_focal_loss_reduce)
    loss_fns.triton_sigmoid_focal_loss = _triton_kernel_math
    loss_fns.triton_sigmoid_focal_loss_reduce = lambda x, y, a, g: _triton_kernel_math(
        x, y, a, g
    ).sum()
    try:
        yield types.SimpleNamespace(
            M=matcher, L=loss_fns, S=sam3_loss, SAM3Output=SAM3Output, pad=packed_to_padded_naive
        )
    finally:
        loss_fns.triton_sigmoid_focal_loss, loss_fns.triton_sigmoid_focal_loss_reduce = kernels
