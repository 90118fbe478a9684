"""SAM 3's training forward and step (paddle_sam.train.sam3.step) against the official model and
criterion, LoRA (paddle_sam.train.sam3.lora) and freezing.

The reduced SAM 3 (``tiny_sam3_spec``) is built on both sides with the same perturbed weights
(as the model tests do); dropout and drop-path are switched off on both sides (their random
draws cannot be shared). The batch: two images, a positive prompt with three targets (boxes,
masks, some masks marked invalid) and a negative phrase with none. The vision backbone and the
text encoder are frozen on both sides; the criterion is the roboflow_v100 one with its
segmentation variant's mask loss. Compared: every training output (final, per-layer auxiliary,
one-to-many), every loss term and the gradient of every trainable parameter.

The official criterion runs on the CPU through ``sam3_train_reference`` (a torch
transcription of its Triton focal-loss kernels); ``torch.distributed.all_reduce`` is a no-op
here (one process).
"""

from __future__ import annotations

import fnmatch
import types
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sam3")
pytest.importorskip("scipy")

import paddle  # noqa: E402

from paddle_sam.loading.sam3 import build_sam3_image_model  # noqa: E402
from paddle_sam.models.sam3 import model_misc as MM  # noqa: E402
from paddle_sam.train.sam3 import lora as LORA  # noqa: E402
from paddle_sam.train.sam3 import step as STEP  # noqa: E402
from paddle_sam.train.sam3.sam3_loss import build_roboflow_v100_loss  # noqa: E402
from tests.helpers.sam3_ref import (  # noqa: E402
    cpu_patches,
    perturb_module_,
    sam3_train_reference,
)
from tests.helpers.specs import tiny_sam3_spec  # noqa: E402
from tests.models.test_sam3_heads import load_from_torch  # noqa: E402
from tests.models.test_sam3_model import build_reference, image  # noqa: E402
from tests.train.test_sam3_loss import (  # noqa: E402
    make_targets_np,
    np_of,
    paddle_targets,
    ref_roboflow_loss,
)

TINY = tiny_sam3_spec()
TEXTS = ["a red car", "a purple giraffe"]  # the second prompt has no target
COUNTS = [3, 0]
MAX_DIFF: dict[str, float] = {}


def _record(key: str, value: float) -> None:
    MAX_DIFF[key] = max(MAX_DIFF.get(key, 0.0), value)


# -------------------------------------------------------------------------------- the models


def no_dropout_torch(module):
    """Dropout, drop-path and attention dropout off in a torch module in training mode."""
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "DropPath":
            m.eval()
        for attr in ("dropout", "dropout_p"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return module


def tiny_model(bpe_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_sam3_image_model(bpe_path=bpe_path, spec=TINY)


@pytest.fixture(scope="module")
def train_ref():
    with sam3_train_reference() as ns:
        yield ns


@pytest.fixture(scope="module")
def batch_np():
    imgs = np.stack([image(112, 112, seed=s).transpose(2, 0, 1) for s in (1, 2)])
    imgs = imgs.astype(np.float32) / 127.5 - 1
    tg = make_targets_np(np.random.default_rng(3), COUNTS, H=TINY.image_size, valid_p=0.7)
    tg["valid"][0][:] = [True, False, True]
    return imgs, tg


def paddle_batch(batch_np):
    imgs, tg = batch_np
    return {"images": paddle.to_tensor(imgs), "texts": list(TEXTS), "targets": paddle_targets(tg)}


def torch_datapoint(ref_ns, batch_np):
    """Upstream's collated batch: one find stage, image i with text i, no box prompts."""
    from sam3.model.data_misc import BatchedDatapoint
    from sam3.model.data_misc import FindStage as RefFindStage

    imgs, tg = batch_np
    n = len(TEXTS)
    counts = torch.tensor([len(b) for b in tg["boxes"]], dtype=torch.long)
    boxes = torch.tensor(np.concatenate(tg["boxes"]).reshape(-1, 4))
    ids = torch.arange(len(boxes), dtype=torch.long)
    target = types.SimpleNamespace(
        num_boxes=counts,
        boxes=boxes,
        boxes_padded=ref_ns.pad(boxes, counts),
        segments=torch.tensor(np.concatenate(tg["masks"])),
        semantic_segments=None,
        is_valid_segment=torch.tensor(np.concatenate(tg["valid"])),
        is_exhaustive=torch.tensor(tg["exhaustive"]),
        object_ids=ids,
        object_ids_padded=ref_ns.pad(ids, counts, fill_value=-1),
    )
    find = RefFindStage(
        img_ids=torch.arange(n),
        text_ids=torch.arange(n),
        input_boxes=torch.zeros(0, n, 4),
        input_boxes_mask=torch.zeros(n, 0, dtype=torch.bool),
        input_boxes_label=torch.zeros(0, n, dtype=torch.long),
        input_points=None,
        input_points_mask=None,
    )
    return BatchedDatapoint(
        img_batch=torch.tensor(imgs),
        find_text_batch=list(TEXTS),
        find_inputs=[find],
        find_targets=[target],
        find_metadatas=[None],
    )


@pytest.fixture(scope="module")
def pair(bpe_path):
    """The official model and ours with the same weights, both in training mode without
    dropout, backbone and text encoder frozen."""
    with cpu_patches():
        torch.manual_seed(0)
        ref = build_reference(TINY, bpe_path)
        perturb_module_(ref, seed=0, scale=0.2)
    ours = tiny_model(bpe_path)
    load_from_torch(ours, ref, skip_complex=True)
    ref.train()
    no_dropout_torch(ref)
    for part in (ref.backbone.vision_backbone, ref.backbone.language_backbone):
        part.requires_grad_(False)
    ours.train()
    STEP.disable_dropout(ours)
    frozen = STEP.freeze(ours, "vision_backbone", "text_encoder")
    assert frozen and all(n.startswith("backbone.") for n in frozen)
    return ref, ours


@pytest.fixture(scope="module")
def reference_step(pair, train_ref, batch_np):
    """Upstream's step: ``model(batch)`` (matching inside), the criterion, ``backward``."""
    ref, _ = pair
    ref.matcher = train_ref.M.BinaryHungarianMatcherV2(
        focal=True, cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, alpha=0.25, gamma=2
    )
    criterion = ref_roboflow_loss(train_ref, with_masks=True)
    batch = torch_datapoint(train_ref, batch_np)
    ref.zero_grad(set_to_none=True)
    mp = pytest.MonkeyPatch()
    mp.setattr(torch.distributed, "all_reduce", lambda *a, **k: None)
    try:
        with cpu_patches():
            stages = ref(batch)
            targets = [ref.back_convert(t) for t in batch.find_targets]
            losses = criterion(stages, targets)
            losses["core_loss"].backward()
    finally:
        mp.undo()
    return stages, losses


def torch_grads_in_our_layout(ref, ours):
    """``{our parameter name: the reference gradient in our layout}`` for every trainable
    parameter of ours (fused ``in_proj`` split into q/k/v, Linear weights transposed; a
    parameter without a gradient gets zeros), and the set of reference parameters that train."""
    ref_params = dict(ref.named_parameters())
    subs = dict(ours.named_sublayers(include_self=True))
    out, used = {}, set()
    for name, param in ours.named_parameters():
        if param.stop_gradient:
            continue
        owner, _, pname = name.rpartition(".")
        parent, _, proj = owner.rpartition(".")
        rows = slice(None)
        key = name
        if proj in ("q_proj", "k_proj", "v_proj") and isinstance(
            subs.get(parent), MM.MultiheadAttention
        ):
            key = f"{parent}.in_proj_{pname}".lstrip(".")
            d = subs[parent].embed_dim
            i = ("q_proj", "k_proj", "v_proj").index(proj)
            rows = slice(i * d, (i + 1) * d)
        t = ref_params[key]
        assert t.requires_grad, f"{key} trains here but not in the reference"
        g = np.zeros(t.shape, np.float32) if t.grad is None else t.grad.numpy()
        g = g[rows]
        if isinstance(subs[owner], paddle.nn.Linear) and pname == "weight":
            g = g.T
        out[name] = g
        used.add(key)
    trains = {k for k, p in ref_params.items() if p.requires_grad}
    return out, trains - used


# ---------------------------------------------------------------------------------- the step


def assert_outputs_close(ours, theirs, what, tol=1e-4):
    for key, t in theirs.items():
        if not isinstance(t, torch.Tensor):
            continue
        assert key in ours, f"{what}: {key} missing"
        a, b = np_of(ours[key]), np_of(t)
        assert a.shape == b.shape, f"{what} {key}: {a.shape} vs {b.shape}"
        diff = float(np.max(np.abs(a - b), initial=0.0))
        scale = max(1.0, float(np.abs(b).max(initial=0.0)))
        _record("outputs_rel", diff / scale)
        assert diff <= tol * scale, f"{what} {key}: max diff {diff:.3e}, scale {scale:.3e}"


def test_forward_train_matches_official(pair, reference_step, batch_np):
    """Final, auxiliary and one-to-many outputs of forward_train against upstream's training
    forward, and the matching on every level."""
    _, ours = pair
    stages, _ = reference_step
    theirs = stages.output[0][0]
    batch = paddle_batch(batch_np)
    with paddle.no_grad():
        out = STEP.forward_train(ours, batch["images"], batch["texts"])
    assert len(out["aux_outputs"]) == TINY.decoder_layers - 1
    expected = {
        "pred_logits",
        "pred_boxes",
        "pred_boxes_xyxy",
        "presence_logit_dec",
        "pred_logits_o2m",
        "pred_boxes_o2m",
        "pred_boxes_xyxy_o2m",
    }
    assert expected | {"pred_masks", "pred_masks_o2m", "semantic_seg"} <= set(out)
    assert out["pred_logits"].shape == [2, TINY.num_queries, 1]
    assert out["pred_masks_o2m"].shape[1] == TINY.num_queries
    assert set(theirs) - {"prev_encoder_out", "indices"} <= set(out)
    assert_outputs_close(out, theirs, "final")
    for i, (a, b) in enumerate(zip(out["aux_outputs"], theirs["aux_outputs"], strict=True)):
        assert set(a) == expected and set(b) - {"indices"} == expected
        assert_outputs_close(a, b, f"aux {i}")
    from paddle_sam.train.sam3.sam3_loss import compute_matching

    criterion = build_roboflow_v100_loss(with_masks=True)
    compute_matching(out, batch["targets"], criterion.matcher)
    levels = [(out, theirs)] + list(zip(out["aux_outputs"], theirs["aux_outputs"], strict=True))
    for a, b in levels:
        for x, y in zip(a["indices"], b["indices"], strict=True):
            if y is None:
                assert x is None
            else:
                np.testing.assert_array_equal(np_of(x).reshape(-1), np_of(y).reshape(-1))


def test_train_step_matches_official(pair, reference_step, batch_np):
    """One training step: every loss term and the gradient of every trainable parameter."""
    ref, ours = pair
    _, t_losses = reference_step
    losses = STEP.train_step(ours, paddle_batch(batch_np), build_roboflow_v100_loss(True))
    assert set(losses) == set(t_losses), set(losses) ^ set(t_losses)
    assert "loss_mask_o2m" in losses and "loss_ce_aux_0_o2m" in losses
    assert losses["loss_bbox"] > 0 and losses["loss_mask"] > 0
    assert losses["loss_bbox_aux_0_o2m"] > 0  # the auxiliary o2m outputs are matched
    for k, v in losses.items():
        assert isinstance(v, float)
        b = float(t_losses[k])
        _record("loss_abs", abs(v - b))
        _record("loss_rel", abs(v - b) / max(abs(b), 1e-6))
        np.testing.assert_allclose(v, b, rtol=1e-4, atol=1e-5, err_msg=k)

    t_grads, missing = torch_grads_in_our_layout(ref, ours)
    assert not missing, f"trainable in the reference only: {sorted(missing)}"
    assert len(t_grads) > 100
    # float32 noise floor: some gradients are zero in exact arithmetic (key biases, whose
    # shift softmax ignores; the geometry encoder's self-attention over its one CLS token) and
    # come out as rounding noise of the order of eps x the largest gradient
    overall = max(float(np.abs(g).max(initial=0.0)) for g in t_grads.values())
    floor = 1e-6 * overall
    significant = 0
    for name, param in ours.named_parameters():
        if param.stop_gradient:
            assert param.grad is None, f"frozen {name} got a gradient"
            continue
        tg = t_grads[name]
        pg = np.zeros(tg.shape, np.float32) if param.grad is None else param.grad.numpy()
        assert pg.shape == tg.shape, name
        scale = float(np.abs(tg).max(initial=0.0))
        diff = float(np.abs(pg - tg).max(initial=0.0))
        if scale > 100 * floor:
            significant += 1
            _record("grad_rel", diff / scale)
        else:
            _record("grad_abs_near_zero", diff)
        assert diff <= 1e-4 * scale + floor, f"grad {name}: max diff {diff:.3e}, scale {scale:.3e}"
    assert significant > 0.8 * len(t_grads), "most trainable parameters should get a gradient"


def test_recompute_gives_the_same_gradients(bpe_path, batch_np):
    """Activation checkpointing (the default) against keeping every activation: the same
    losses and gradients, with dropout on (its masks are replayed in the recomputation)."""
    results = []
    for recompute in (True, False):
        paddle.seed(11)
        model = tiny_model(bpe_path)
        model.train()
        STEP.freeze(model, "vision_backbone", "text_encoder")
        paddle.seed(5)
        criterion = build_roboflow_v100_loss(True)
        core, losses = STEP.step_loss(model, paddle_batch(batch_np), criterion, recompute)
        core.backward()
        grads = {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
        results.append(({k: float(v) for k, v in losses.items()}, grads))
    (l1, g1), (l2, g2) = results
    assert l1 == pytest.approx(l2, rel=1e-6)
    assert set(g1) == set(g2) and len(g1) > 50
    for name in g1:
        np.testing.assert_allclose(g1[name], g2[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_step_with_optimizer_and_clipping(bpe_path, batch_np):
    """train_step with an optimizer and clipping: the clipped gradient norm is max_norm, the
    trainable weights move, the frozen ones do not."""
    model = tiny_model(bpe_path)
    model.train()
    STEP.freeze(model, "vision_backbone")
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    params = STEP.trainable_parameters(model)
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=params)
    losses = STEP.train_step(
        model, paddle_batch(batch_np), build_roboflow_v100_loss(True), opt, max_grad_norm=0.1
    )
    assert np.isfinite(losses["core_loss"])
    grads = [p.grad.numpy() for p in params if p.grad is not None]
    norm = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads)))
    np.testing.assert_allclose(norm, 0.1, rtol=1e-4)
    after = model.state_dict()
    for k, v in before.items():
        moved = not np.array_equal(v, after[k].numpy())
        if k.startswith("backbone.vision_backbone."):
            assert not moved, k
    assert not np.array_equal(
        before["transformer.decoder.query_embed.weight"],
        after["transformer.decoder.query_embed.weight"].numpy(),
    )


# -------------------------------------------------------------------------------------- freezing


def test_freeze_and_unfreeze(bpe_path, batch_np):
    """Frozen parts get no gradient (and run without a graph); unfrozen ones get theirs."""
    model = tiny_model(bpe_path)
    model.train()
    STEP.disable_dropout(model)
    vision = STEP.freeze(model, "vision_backbone")
    text = STEP.freeze(model, "text_encoder")
    assert vision and text and not set(vision) & set(text)
    STEP.train_step(model, paddle_batch(batch_np), build_roboflow_v100_loss(True))
    params = dict(model.named_parameters())
    for name in vision + text:
        assert params[name].stop_gradient and params[name].grad is None, name
    assert params["transformer.decoder.query_embed.weight"].grad is not None
    assert STEP.unfreeze(model, "text_encoder") == text
    STEP.train_step(model, paddle_batch(batch_np), build_roboflow_v100_loss(True))
    # all of the text encoder but its unused text_projection (as upstream) now trains
    got = [n for n in text if params[n].grad is not None and float(params[n].grad.abs().max())]
    assert set(text) - set(got) == {"backbone.language_backbone.encoder.text_projection"}
    assert all(params[n].grad is None for n in vision)
    # by pattern; unknown names are refused
    assert STEP.freeze(model, "transformer.decoder.*") and not any(
        not p.stop_gradient for n, p in params.items() if n.startswith("transformer.decoder.")
    )
    with pytest.raises(ValueError, match="no parameter"):
        STEP.freeze(model, "no_such_part.*")


@pytest.mark.parametrize("frozen", ["bias", "weight", "both"])
def test_linear_backward_with_frozen_parameters(frozen):
    """Our Linear (addmm in dygraph) differentiates with frozen parameters as F.linear does
    (Paddle 3.3's addmm backward crashes with a frozen bias operand: F.linear is used then)."""
    from paddle_sam.models.common import Linear

    layer = Linear(4, 3)
    layer.weight.stop_gradient = frozen in ("weight", "both")
    layer.bias.stop_gradient = frozen in ("bias", "both")
    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(2, 5, 4)).astype(np.float32))
    x.stop_gradient = False
    (layer(x) ** 2).sum().backward()
    ref = x.detach()
    ref.stop_gradient = False
    (paddle.nn.functional.linear(ref, layer.weight, layer.bias) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), ref.grad.numpy(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------ LoRA


def randomise_lora_(model, seed=0):
    """Nonzero adapters (B starts at zero), so that merging has something to fold."""
    rng = np.random.default_rng(seed)
    for layer in model.sublayers():
        if isinstance(layer, LORA.LoRALinear):
            layer.lora_B.set_value(rng.normal(0, 0.05, layer.lora_B.shape).astype(np.float32))


def grounding_outputs(model, batch):
    with paddle.no_grad():
        out = STEP.forward_train(model, batch["images"], batch["texts"])
    keys = ["pred_logits", "pred_boxes", "presence_logit_dec", "pred_masks", "pred_logits_o2m"]
    return {k: out[k].numpy() for k in keys}


def test_lora_apply_train_merge(bpe_path, batch_np):
    model = tiny_model(bpe_path)
    model.eval()
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    batch = paddle_batch(batch_np)
    plain = grounding_outputs(model, batch)

    adapted = LORA.apply_lora(model, rank=4, alpha=8)
    assert adapted and all(isinstance(model.get_sublayer(n), LORA.LoRALinear) for n in adapted)
    targets = LORA.DEFAULT_LORA_TARGETS
    linear_names = [
        n for n, m in model.named_sublayers() if isinstance(m, paddle.nn.Linear | LORA.LoRALinear)
    ]
    wanted = [n for n in linear_names if any(fnmatch.fnmatchcase(n, p) for p in targets)]
    assert sorted(adapted) == sorted(wanted)
    assert any(".qkv" in n for n in adapted) and any(".c_fc" in n for n in adapted)
    assert any("transformer.decoder.layers.0.self_attn.q_proj" == n for n in adapted)
    # B = 0 at the start: the adapted model computes what the plain one did
    for k, v in grounding_outputs(model, batch).items():
        np.testing.assert_allclose(v, plain[k], rtol=0, atol=1e-5, err_msg=k)
    # base weights keep their names; only the adapters train
    state = model.state_dict()
    assert set(shapes) <= set(state)
    extra = set(state) - set(shapes)
    assert extra and all(k.endswith((".lora_A", ".lora_B")) for k in extra)
    trainable = {n for n, p in model.named_parameters() if not p.stop_gradient}
    assert trainable == extra

    model.train()
    STEP.disable_dropout(model)
    STEP.train_step(model, batch, build_roboflow_v100_loss(True))
    for name, p in model.named_parameters():
        if name in trainable:
            continue
        assert p.grad is None, f"{name} got a gradient"
    assert any(float(model.get_sublayer(n).lora_B.grad.abs().max()) > 0 for n in adapted)

    model.eval()
    randomise_lora_(model)
    with_adapters = grounding_outputs(model, batch)
    assert not np.allclose(with_adapters["pred_logits"], plain["pred_logits"], atol=1e-3)
    merged = LORA.merge_lora(model)
    assert sorted(merged) == sorted(adapted)
    assert not any(isinstance(m, LORA.LoRALinear) for m in model.sublayers())
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == shapes
    for n in adapted:
        assert type(model.get_sublayer(n)).__name__ == "Linear"
    for k, v in grounding_outputs(model, batch).items():
        scale = max(1.0, float(np.abs(with_adapters[k]).max()))
        diff = float(np.abs(v - with_adapters[k]).max())
        _record("lora_merge", diff / scale)
        assert diff <= 1e-5 * scale, f"{k}: merged vs adapted {diff:.3e}"


def test_lora_selection_and_options(bpe_path):
    model = tiny_model(bpe_path)
    names = LORA.apply_lora(
        model,
        rank=2,
        alpha=2,
        targets=("transformer.decoder.*_proj",),
        exclude=("*.ca_text.*",),
        dropout=0.1,
        freeze_base=False,
    )
    assert names and all(n.startswith("transformer.decoder.") for n in names)
    assert not any(".ca_text." in n for n in names)
    layer = model.get_sublayer(names[0])
    assert layer.scaling == 1.0 and layer.rank == 2
    assert isinstance(layer.lora_dropout, paddle.nn.Dropout)
    assert not model.backbone.vision_backbone.trunk.blocks[0].attn.qkv.weight.stop_gradient
    assert set(LORA.lora_state_dict(model)) == {
        f"{n}.{p}" for n in names for p in ("lora_A", "lora_B")
    }
    with pytest.raises(ValueError, match="already"):
        LORA.apply_lora(model, rank=2, alpha=2, targets=("transformer.decoder.*_proj",))
    with pytest.raises(ValueError, match="no Linear layer"):
        LORA.apply_lora(model, rank=2, alpha=2, targets=("nothing.*",))


def test_report_max_differences():
    """Prints the largest differences measured above (run with -s to see them)."""
    print(f"\nmax differences: {MAX_DIFF}")
