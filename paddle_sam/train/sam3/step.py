"""SAM 3's training forward and step (upstream: ``Sam3Image.forward`` in training mode and the
step of ``sam3/train/trainer.py``), on our :class:`~paddle_sam.models.sam3.sam3_image.Sam3Image`.

:func:`forward_train` runs the model's own modules on an image batch with one text prompt per
find query and returns what upstream's training forward returns for it: the final outputs,
one auxiliary output per earlier decoder layer and, with the decoder's divide-and-conquer
(DAC) queries, the one-to-many (o2m) outputs. :func:`train_step` adds the matching, the
criterion (:class:`~.sam3_loss.Sam3LossWrapper`), the backward pass, optional gradient
clipping and the optimizer step. :func:`freeze` / :func:`unfreeze` set ``stop_gradient`` on
parts of the model by name, as upstream's configs select them.
"""

from __future__ import annotations

import contextlib
import fnmatch
import inspect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import paddle
from paddle import nn

from ...models.sam3.box_ops import box_cxcywh_to_xyxy
from ...models.sam3.model_misc import inverse_sigmoid
from ...models.sam3.sam3_image import FindStage, Sam3Image
from .denoise import DenoisingQueries, make_denoising_queries
from .loss_fns import CORE_LOSS_KEY
from .sam3_loss import compute_matching

__all__ = [
    "MODEL_PARTS",
    "backbone_features",
    "clip_grad_norm_",
    "disable_dropout",
    "forward_train",
    "freeze",
    "freeze_batch_norm_statistics",
    "step_loss",
    "train_step",
    "trainable_parameters",
    "unfreeze",
]

# parameter-name prefixes of the parts upstream's configs address by name
# (``backbone.vision_backbone.*``, ``backbone.language_backbone.*``)
MODEL_PARTS = {
    "vision_backbone": "backbone.vision_backbone.",
    "text_encoder": "backbone.language_backbone.",
    "language_backbone": "backbone.language_backbone.",
}


# ------------------------------------------------------------------------------------ freezing


def _selected(model: nn.Layer, parts: Sequence[str]) -> Iterator[tuple[str, paddle.Tensor]]:
    """Parameters of ``model`` named by ``parts``: keys of :data:`MODEL_PARTS` or fnmatch
    patterns over parameter names (``"transformer.decoder.*"``)."""
    if not parts:
        raise ValueError(f"name at least one part: {sorted(MODEL_PARTS)} or a name pattern")
    patterns = [MODEL_PARTS[p] + "*" if p in MODEL_PARTS else p for p in parts]
    found = False
    for name, param in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
            found = True
            yield name, param
    if not found:
        raise ValueError(f"no parameter of the model matches {list(parts)}")


def freeze(model: nn.Layer, *parts: str) -> list[str]:
    """Stop the gradients of the parameters in ``parts`` (``"vision_backbone"``,
    ``"text_encoder"``, or fnmatch patterns over parameter names). Returns their names.

    :func:`forward_train` runs a wholly frozen vision backbone or text encoder without
    recording its graph (same values, far less memory)."""
    names = []
    for name, param in _selected(model, parts):
        param.stop_gradient = True
        names.append(name)
    return names


def unfreeze(model: nn.Layer, *parts: str) -> list[str]:
    """Undo :func:`freeze` for ``parts``; returns the parameter names."""
    names = []
    for name, param in _selected(model, parts):
        param.stop_gradient = False
        names.append(name)
    return names


def trainable_parameters(model: nn.Layer) -> list[paddle.Tensor]:
    """The parameters that get gradients (``stop_gradient`` False), for the optimizer."""
    return [p for p in model.parameters() if not p.stop_gradient]


def _graph_unless_frozen(layer: nn.Layer | None) -> contextlib.AbstractContextManager:
    """``paddle.no_grad()`` when every parameter of ``layer`` is frozen, else a no-op."""
    if layer is not None and all(p.stop_gradient for p in layer.parameters()):
        return paddle.no_grad()
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- training forward


class _O2OSelfAttention(nn.Layer):
    """A decoder layer's self-attention restricted to the one-to-one part of the sequence.

    With DAC the decoder carries its queries twice, ``[presence?, o2o queries, o2m queries]``
    (then any denoising queries); only the first ``n - num_trailing`` tokens attend to each
    other, the trailing ones get no update (a zero added to them, then the layer's norm, as
    upstream's ``dac_use_selfatt_ln``)."""

    def __init__(self, attn: nn.Layer, num_trailing: int) -> None:
        super().__init__()
        self.attn = attn
        self.num_trailing = num_trailing

    def forward(
        self,
        query: paddle.Tensor,
        key: paddle.Tensor,
        value: paddle.Tensor,
        key_padding_mask: paddle.Tensor | None = None,
        need_weights: bool = False,
        attn_mask: paddle.Tensor | None = None,
    ) -> tuple[paddle.Tensor, None]:
        if key_padding_mask is not None or attn_mask is not None:
            raise NotImplementedError("masked decoder self-attention is not supported with DAC")
        axis = 1 if getattr(self.attn, "batch_first", False) else 0
        n = query.shape[axis] - self.num_trailing
        head = [paddle.slice(t, [axis], [0], [n]) for t in (query, key, value)]
        out = self.attn(*head)[0]
        rest = paddle.zeros_like(paddle.slice(query, [axis], [n], [query.shape[axis]]))
        return paddle.concat([out, rest.astype(out.dtype)], axis=axis), None


@contextlib.contextmanager
def _divide_and_conquer(decoder: nn.Layer, num_trailing: int) -> Iterator[None]:
    """Inside the block each decoder layer's self-attention skips the ``num_trailing``
    trailing queries (DAC's one-to-many copies, denoising queries); the layers are restored
    on exit."""
    if num_trailing == 0:
        yield
        return
    originals = [layer.self_attn for layer in decoder.layers]
    try:
        for layer, attn in zip(decoder.layers, originals, strict=True):
            layer.self_attn = _O2OSelfAttention(attn, num_trailing)
        yield
    finally:
        for layer, attn in zip(decoder.layers, originals, strict=True):
            layer.self_attn = attn


@contextlib.contextmanager
def _recomputed(layers: Sequence[nn.Layer], enable: bool) -> Iterator[None]:
    """Inside the block (when ``enable`` and gradients are on) each of ``layers`` keeps only
    its inputs for the backward pass and runs its forward again there (activation
    checkpointing, as upstream's training builds its encoder): the fusion encoder's attention
    over every image token, kept per query and per layer, is what fills memory otherwise.
    The same gradients; the layers are restored on exit. (Not the decoder's layers: their
    gradients came out wrong under Paddle 3.3's recompute, and they hold far less.)"""
    if not enable or not paddle.is_grad_enabled():
        yield
        return
    from paddle.distributed.fleet.utils import recompute

    def wrap(forward):
        signature = inspect.signature(forward)

        def run(*args, **kwargs):
            # every argument positional: Paddle's recompute sends gradients back to the
            # positional tensors only (a tensor passed by keyword lost part of its gradient)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return recompute(forward, *bound.args, use_reentrant=False)

        return run

    originals = [layer.forward for layer in layers]
    try:
        for layer, forward in zip(layers, originals, strict=True):
            layer.forward = wrap(forward)
        yield
    finally:
        for layer in layers:
            del layer.forward  # the class's forward again


def backbone_features(
    model: Sam3Image, images: paddle.Tensor, texts: Sequence[str]
) -> tuple[dict[str, Any], paddle.Tensor]:
    """Image features of ``images`` (``B x 3 x H x W``, normalised as the model expects) and
    text features of the distinct strings of ``texts``. A part whose parameters are all frozen
    runs without recording its graph. Returns ``(backbone_out, text_ids)``: ``text_ids``
    (int64 ``[len(texts)]``) indexes each text's features, as upstream's collator does."""
    backbone = model.backbone
    with _graph_unless_frozen(backbone.vision_backbone):
        backbone_out = {"img_batch_all_stages": images, **backbone.forward_image(images)}
    unique = list(dict.fromkeys(texts))
    with _graph_unless_frozen(backbone.language_backbone):
        backbone_out.update(backbone.forward_text(unique))
    text_ids = paddle.to_tensor([unique.index(t) for t in texts], dtype="int64")
    return backbone_out, text_ids


def _per_layer(levels: list[dict], key: str, values: paddle.Tensor) -> None:
    for level, value in zip(levels, values, strict=True):
        level[key] = value


def forward_train(
    model: Sam3Image,
    images: paddle.Tensor,
    texts: Sequence[str],
    img_ids: paddle.Tensor | Sequence[int] | None = None,
    geometric_prompt: Any = None,
    recompute: bool = True,
    denoise: DenoisingQueries | None = None,
) -> dict[str, Any]:
    """Upstream's training forward of one find stage: ``texts[i]`` is the prompt of image
    ``img_ids[i]`` (default ``i``) of ``images`` (``B x 3 x H x W``); ``geometric_prompt``
    (a ``Prompt``, default none) adds boxes.

    Returns, for ``N = len(texts)`` prompts and ``Q`` queries: ``pred_logits`` ``N x Q x 1``,
    ``pred_boxes`` / ``pred_boxes_xyxy`` ``N x Q x 4``, ``presence_logit_dec`` ``N x 1``,
    ``pred_masks`` ``N x Q x h x w`` and ``semantic_seg`` (with the segmentation head),
    ``queries``, ``encoder_hidden_states``, ``presence_feats``; ``aux_outputs``: one dict per
    earlier decoder layer with the same logits, boxes and presence keys. With the decoder's
    DAC, every level also has ``pred_logits_o2m``, ``pred_boxes_o2m``,
    ``pred_boxes_xyxy_o2m`` (and the final one ``pred_masks_o2m``) for the ``Q`` one-to-many
    queries. ``recompute``: the encoder and decoder layers keep only their inputs for the
    backward pass (activation checkpointing, upstream's training setting; same gradients, far
    less memory). Dropout follows the layers' train / eval modes; no matching is done
    (:func:`~.sam3_loss.compute_matching`). ``[[out]]`` is what the criterion takes.

    ``denoise`` (:func:`~.denoise.make_denoising_queries`) appends denoising queries; their
    outputs are under ``out["dn"]`` (same keys and ``aux_outputs``, with their fixed
    ``indices``), and the other outputs are unchanged by them."""
    n = len(texts)
    if img_ids is None:
        img_ids = list(range(n))
    if not isinstance(img_ids, paddle.Tensor):
        img_ids = paddle.to_tensor(list(img_ids), dtype="int64")
    if int(img_ids.shape[0]) != n:
        raise ValueError(f"{n} texts but {int(img_ids.shape[0])} image ids")
    backbone_out, text_ids = backbone_features(model, images, texts)
    find_input = FindStage(img_ids=img_ids, text_ids=text_ids)
    if geometric_prompt is None:
        geometric_prompt = model._get_dummy_prompt(n)
    prompt, prompt_mask = model._encode_prompt(backbone_out, find_input, geometric_prompt)
    with _recomputed(model.transformer.encoder.layers, recompute):
        encoder_out = model._run_encoder(backbone_out, find_input, prompt, prompt_mask)
    memory = encoder_out["encoder_hidden_states"]

    decoder = model.transformer.decoder
    num_o2o = decoder.num_queries
    num_o2m = num_o2o if decoder.dac else 0
    copies = 2 if num_o2m else 1
    bs, d = memory.shape[1], decoder.d_model
    query = paddle.tile(decoder.query_embed.weight, [copies, 1]).unsqueeze(1)
    anchors = paddle.tile(decoder.reference_points.weight, [copies, 1]).unsqueeze(1)
    tgt = query.expand([query.shape[0], bs, d])
    reference_boxes = anchors.expand([anchors.shape[0], bs, 4]).sigmoid()
    num_dn = 0
    if denoise is not None:
        num_dn = denoise.num_queries
        content = paddle.gather(decoder.query_embed.weight, denoise.anchor_ids.flatten())
        tgt = paddle.concat([tgt, content.reshape([num_dn, bs, d])])
        reference_boxes = paddle.concat([reference_boxes, denoise.boxes.astype(memory.dtype)])
    with _divide_and_conquer(decoder, num_o2m + num_dn):
        hs, ref_boxes, presence, presence_feats = decoder(
            tgt=tgt,
            memory=memory,
            memory_key_padding_mask=encoder_out["padding_mask"],
            pos=encoder_out["pos_embed"],
            reference_boxes=reference_boxes,
            spatial_shapes=encoder_out["spatial_shapes"],
            valid_ratios=encoder_out["valid_ratios"],
            memory_text=prompt,
            text_attention_mask=prompt_mask,
        )
    hs = hs.transpose([0, 2, 1, 3])  # L x B x (copies * Q) x C
    ref_boxes = ref_boxes.transpose([0, 2, 1, 3])

    if model.use_dot_prod_scoring:
        # one decoder layer at a time: the scorer's matmul of L x B x Q x C queries with a
        # B x C x 1 prompt broadcasts over L, and Paddle 3.3's matmul backward fails on that
        # broadcast (it does not with L = 1); the values are the same
        logits = paddle.concat(
            [model.dot_prod_scoring(hs[i : i + 1], prompt, prompt_mask) for i in range(hs.shape[0])]
        )
    else:
        logits = model.class_embed(hs)
    coords = (inverse_sigmoid(ref_boxes) + decoder.bbox_embed(hs)).sigmoid()
    boxes_xyxy = box_cxcywh_to_xyxy(coords)

    levels: list[dict[str, Any]] = [{} for _ in range(hs.shape[0])]
    dn_levels: list[dict[str, Any]] = [{} for _ in range(hs.shape[0])]
    if presence is not None:
        presence = presence.transpose([0, 2, 1])  # L x B x 1
        _per_layer(levels, "presence_logit_dec", presence)
        if num_dn:  # their presence term would count the same logit twice
            _per_layer(dn_levels, "presence_logit_dec", presence.detach())
    if model.supervise_joint_box_scores:
        if presence is None:
            raise ValueError("supervise_joint_box_scores needs the presence token")
        prob = presence.sigmoid()
        if getattr(model, "detach_presence_in_joint_score", False):
            prob = prob.detach()
        logits = inverse_sigmoid(logits.sigmoid() * prob.unsqueeze(2)).clip(-10.0, 10.0)
    for key, value in (
        ("pred_logits", logits),
        ("pred_boxes", coords),
        ("pred_boxes_xyxy", boxes_xyxy),
    ):
        _per_layer(levels, key, value[:, :, :num_o2o])
        if num_o2m:
            _per_layer(levels, f"{key}_o2m", value[:, :, num_o2o : num_o2o + num_o2m])
        if num_dn:
            _per_layer(dn_levels, key, value[:, :, num_o2o + num_o2m :])

    out: dict[str, Any] = {
        "encoder_hidden_states": memory,
        "presence_feats": presence_feats,
        "queries": hs[-1][:, :num_o2o],
        **levels[-1],
        "aux_outputs": levels[:-1],
    }
    if num_dn:
        for level in dn_levels:
            level["indices"] = denoise.indices
        out["dn"] = {**dn_levels[-1], "aux_outputs": dn_levels[:-1]}
    head = model.segmentation_head
    if head is not None:
        fpn = backbone_out["backbone_fpn"]
        # the pixel decoder's convolutions of the images' own levels once per image, not per
        # prompt (PixelDecoder.image_terms; the same function up to float rounding): with a
        # few prompts per image this halves the decoder's cost, the largest part of a step
        terms = head.pixel_decoder.image_terms(fpn) if n > int(images.shape[0]) else None
        seg = head(
            backbone_feats=fpn,
            obj_queries=hs if model.o2m_mask_predict or num_dn else hs[:, :, :num_o2o],
            image_ids=img_ids,
            encoder_hidden_states=memory,
            prompt=prompt,
            prompt_mask=prompt_mask,
            image_terms=terms,
        )
        for key, value in seg.items():
            if key in head.instance_keys:
                out[key] = value[:, :num_o2o]
                if model.o2m_mask_predict and num_o2m:
                    out[f"{key}_o2m"] = value[:, num_o2o : num_o2o + num_o2m]
                if num_dn:
                    out["dn"][key] = value[:, num_o2o + num_o2m :]
            else:
                out[key] = value
    return out


def freeze_batch_norm_statistics(model: nn.Layer) -> nn.Layer:
    """Batch norm layers whose parameters are all frozen (a frozen vision backbone with a
    ``conv_stem``) to inference mode while the model trains: they normalise with their running
    statistics and keep them, as the frozen weights were trained with. Returns the model."""
    for m in model.sublayers(include_self=True):
        if isinstance(m, nn.BatchNorm1D | nn.BatchNorm2D | nn.BatchNorm3D) and all(
            p.stop_gradient for p in m.parameters()
        ):
            m.eval()
    return model


def disable_dropout(model: nn.Layer) -> nn.Layer:
    """Dropout, drop-path and attention dropout off while the model trains (deterministic
    steps, e.g. to compare process counts); returns the model."""
    from ...models.sam3.model_misc import MultiheadAttention
    from ...models.sam3.vitdet import DropPath

    for m in model.sublayers(include_self=True):
        if isinstance(m, nn.Dropout | DropPath):
            m.eval()
        if isinstance(m, MultiheadAttention):
            m.dropout = 0.0
    return model


# ---------------------------------------------------------------------------------- train step


def clip_grad_norm_(
    parameters: Iterable[paddle.Tensor], max_norm: float, norm_type: float = 2.0
) -> float:
    """Scale the gradients of ``parameters`` in place so that their joint ``norm_type`` norm
    is at most ``max_norm`` (``torch.nn.utils.clip_grad_norm_``'s rule, which upstream's
    ``GradientClipper`` applies: factor ``max_norm / (norm + 1e-6)`` when below 1). Returns
    the norm before clipping."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    with paddle.no_grad():
        if math.isinf(norm_type):
            total = paddle.max(paddle.stack([g.abs().max().astype("float32") for g in grads]))
        else:
            norms = [paddle.linalg.norm(g.flatten().astype("float32"), p=norm_type) for g in grads]
            total = paddle.linalg.norm(paddle.stack(norms), p=norm_type)
        total_norm = float(total)
        coef = float(max_norm) / (total_norm + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.scale_(coef)
    return total_norm


def _field(batch: Any, name: str, default: Any = None) -> Any:
    if isinstance(batch, Mapping):
        return batch.get(name, default)
    return getattr(batch, name, default)


def step_loss(
    model: Sam3Image,
    batch: Any,
    criterion: nn.Layer,
    recompute: bool = True,
    denoise_weight: float = 0.0,
    denoise_box_noise: float = 0.5,
    rng: np.random.Generator | None = None,
) -> tuple[paddle.Tensor, dict[str, paddle.Tensor]]:
    """The forward half of :func:`train_step`: :func:`forward_train` on ``batch`` (with
    ``recompute``), the matching with ``criterion.matcher`` and the criterion. Returns the
    total loss (a tensor to backpropagate) and every term; a non-finite total raises
    ``FloatingPointError``.

    ``denoise_weight`` > 0 adds denoising queries (:mod:`.denoise`, noise ``denoise_box_noise``
    drawn from ``rng``) and the criterion's terms on them, with their fixed assignment, times
    that weight (terms suffixed ``_dn``). Not upstream: a from-scratch aid, off by default."""
    targets = _field(batch, "targets")
    denoise = None
    if denoise_weight > 0:
        if rng is None:
            raise ValueError("denoising queries need an rng")
        ref = model.transformer.decoder.reference_points.weight
        denoise = make_denoising_queries(ref, targets, rng, denoise_box_noise)
    out = forward_train(
        model,
        _field(batch, "images"),
        _field(batch, "texts"),
        img_ids=_field(batch, "img_ids"),
        geometric_prompt=_field(batch, "geometric_prompt"),
        recompute=recompute,
        denoise=denoise,
    )
    compute_matching(out, targets, criterion.matcher)
    losses = criterion([[out]], [targets])
    core = losses[CORE_LOSS_KEY]
    if denoise is not None:
        dn = criterion.compute_loss(out["dn"], targets)
        scale = denoise_weight
        if criterion.scale_by_find_batch_size:
            scale *= int(targets["num_boxes"].shape[0]) ** 0.5
        core = core + dn.pop(CORE_LOSS_KEY) * scale
        losses.update({f"{k}_dn": v for k, v in dn.items()})
        losses[CORE_LOSS_KEY] = core
    total = float(core)
    if not math.isfinite(total):
        raise FloatingPointError(f"Loss is {total}, stopping the step")
    return core, losses


def train_step(
    model: Sam3Image,
    batch: Any,
    criterion: nn.Layer,
    optimizer: Any = None,
    max_grad_norm: float | None = None,
    norm_type: float = 2.0,
) -> dict[str, float]:
    """One training step: :func:`forward_train`, the one-to-one matching with
    ``criterion.matcher`` (:func:`~.sam3_loss.compute_matching`), the loss, the backward pass,
    optional clipping of the trainable gradients to ``max_grad_norm`` (upstream's
    roboflow_v100 config: 0.1) and ``optimizer.step()``.

    ``batch`` (a mapping or an object with these fields): ``images`` ``B x 3 x H x W``,
    ``texts`` (one prompt per find query), ``targets`` (the targets dict of
    :func:`~.sam3_loss.make_find_targets`, queries in ``texts``' order), optionally
    ``img_ids`` (the image of each query, default ``0..N-1``) and ``geometric_prompt``.
    Gradients are cleared first (``optimizer.clear_grad``, or the model's without an
    optimizer) and left in place after the step. Returns every loss term as a float, the
    total under ``core_loss``; a non-finite total raises ``FloatingPointError`` before the
    backward pass, as upstream's trainer does."""
    params = trainable_parameters(model)
    if optimizer is not None:
        optimizer.clear_grad(set_to_zero=False)
    else:
        for p in params:
            p.clear_gradient(set_to_zero=False)
    core, losses = step_loss(model, batch, criterion)
    core.backward()
    if max_grad_norm is not None:
        clip_grad_norm_(params, max_grad_norm, norm_type)
    if optimizer is not None:
        optimizer.step()
    return {k: float(v) for k, v in losses.items()}
