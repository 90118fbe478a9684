"""``paddle_sam.align`` for SAM 2 / 2.1 and SAM 3 against the official code, at reduced sizes
with random weights: the report passes for our converted models and names every module it
promises; one changed weight makes its module the first divergent one, everything before it
still aligned. (SAM v1's alignment: tests/models/test_parity.py.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("torch")

from paddle_sam.align.common import AlignReport, default_image  # noqa: E402

IMAGE = default_image(90, 130, seed=2)


def _nudge(model, name: str, delta: float = 0.5):
    """Add ``delta`` to one element of our parameter ``name``; returns an undo function."""
    param = dict(model.named_parameters())[name]
    saved = param.numpy().copy()
    changed = saved.copy()
    changed.flat[0] += delta
    param.set_value(changed)
    return lambda: param.set_value(saved)


def _assert_first_divergent(report: AlignReport, module: str) -> None:
    first = report.first_divergent()
    assert first is not None, "the changed weight went unnoticed\n" + report.format_table()
    assert first.module == module, report.format_table()
    rows = [r.module for r in report.rows]
    assert rows.index(module) > 0 and all(r.passed for r in report.rows[: rows.index(module)])


# ------------------------------------------------------------------------------- SAM 2

pytest.importorskip("sam2")


@pytest.fixture(scope="module", params=["2.1", "2.0"])
def sam2_pair(request):
    from paddle_sam.align.sam2 import random_pair
    from tests.helpers.sam2_ref import reduced_spec

    return random_pair(reduced_spec(request.param), seed=1)


def test_sam2_every_module_aligned(sam2_pair):
    from paddle_sam.align.sam2 import align_sam2

    ref, ours = sam2_pair
    report = align_sam2(ref, ours, IMAGE, frames=3)
    assert report.passed, "\n" + report.format_table()
    modules = report.modules()
    blocks = len(ours.image_encoder.trunk.blocks)
    layers = len(ours.memory_attention.layers)
    for name in [
        "image_encoder.trunk.patch_embed",
        *(f"image_encoder.trunk.blocks.{i}" for i in range(blocks)),
        "image_encoder.trunk",
        "image_encoder.neck",
        "image_embedding",
        "sam_prompt_encoder",
        "sam_mask_decoder",
        "masks",
        "obj_ptr_proj",
        "memory_encoder.vision_features",
        *(f"memory_attention.layers.{i}" for i in range(layers)),
        "memory_attention",
        "maskmem_features",
    ]:
        assert name in modules, name
    # the memory is read from frame 1 on, and the click's mask is not trivial
    assert report.row("[frame 1] memory_attention").passed
    assert 0.0 < report.row("[point] masks").coverage < 1.0
    assert report.meta["family"] == "sam2" and report.meta["frames"] == 3


def test_sam2_names_memory_encoder(sam2_pair):
    from paddle_sam.align.sam2 import align_sam2

    ref, ours = sam2_pair
    undo = _nudge(ours, "memory_encoder.out_proj.weight")
    try:
        report = align_sam2(ref, ours, IMAGE, cases=[], frames=2)
    finally:
        undo()
    _assert_first_divergent(report, "[frame 0] memory_encoder.vision_features")


def test_sam2_names_trunk_block(sam2_pair):
    from paddle_sam.align.sam2 import align_sam2

    ref, ours = sam2_pair
    undo = _nudge(ours, "image_encoder.trunk.blocks.2.mlp.layers.0.weight")
    try:
        report = align_sam2(ref, ours, IMAGE, cases=[], frames=0)
    finally:
        undo()
    _assert_first_divergent(report, "image_encoder.trunk.blocks.2")


def test_sam2_official_config():
    """Released sizes are upstream's own configs; a reduced size is the same model that
    hydra overrides written by hand make (tests/helpers/sam2_ref.py)."""
    from paddle_sam.align.sam2 import build_reference_sam2, official_config
    from paddle_sam.models.sam2.build_sam import SAM2_CONFIGS, SAM2_SPECS
    from tests.helpers.sam2_ref import REDUCED_OVERRIDES, config_file, official_model, reduced_spec

    for name, spec in SAM2_SPECS.items():
        assert official_config(spec) == (SAM2_CONFIGS[name], [])
    ours = build_reference_sam2(reduced_spec("2.1"))
    want = official_model(config_file("2.1"), REDUCED_OVERRIDES)
    shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in want.state_dict().items()}
    assert ours.memory_attention.layers[0].self_attn.freqs_cis.shape[0] == 16 * 16  # 256 px


# ------------------------------------------------------------------------------- SAM 3

pytest.importorskip("sam3")


@pytest.fixture(scope="module")
def sam3_pair():
    """(upstream image model with its tracker, ours, our tracker) at 112 px, 8 x 8 tokens."""
    from paddle_sam.align.sam3 import random_pair
    from tests.helpers.specs import tiny_sam3_tracker_spec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return random_pair(tiny_sam3_tracker_spec(), interactive=True, seed=1)


def test_sam3_every_module_aligned(sam3_pair):
    from paddle_sam.align.sam3 import align_sam3

    ref, ours, tracker = sam3_pair
    # threshold 0: every query's mask and box is compared, not only the confident ones
    report = align_sam3(ref, ours, tracker, IMAGE, confidence_threshold=0.0, frames=3)
    assert report.passed, "\n" + report.format_table()
    modules = report.modules()
    depth = len(ours.backbone.vision_backbone.trunk.blocks)
    for name in [
        *(f"backbone.vision_backbone.trunk.blocks.{i}" for i in range(depth)),
        "backbone.vision_backbone.trunk",
        "backbone.vision_backbone",
        "backbone.language_backbone",
        "geometry_encoder",
        "transformer.encoder.memory",
        "transformer.decoder",
        "segmentation_head.pred_masks",
        "dot_prod_scoring",
        "scores",
        "masks",
        "tracker.sam_prompt_encoder",
        "tracker.sam_mask_decoder",
        "tracker.obj_ptr_proj",
        "tracker.maskmem_backbone.vision_features",
        *(f"tracker.transformer.encoder.layers.{i}" for i in range(4)),
        "tracker.transformer.encoder.memory",
        "maskmem_features",
    ]:
        assert name in modules, name
    # 12 queries kept on both sides; the box step sees the box; clicks and memory ran
    assert report.row("[text] scores").shape == (12,)
    assert report.row("[text+box] geometry_encoder[0]").shape[0] == 2
    assert report.row("[inst point] masks").agreement_decided == 1.0
    assert report.row("[frame 2] tracker.transformer.encoder.layers.3").passed
    assert report.meta["clicks"] is True and report.meta["frames"] == 3


def test_sam3_names_memory_encoder(sam3_pair):
    from paddle_sam.align.sam3 import align_sam3

    ref, ours, tracker = sam3_pair
    undo = _nudge(tracker, "maskmem_backbone.out_proj.weight")
    try:
        report = align_sam3(ref, ours, tracker, IMAGE, cases=[], frames=2)
    finally:
        undo()
    _assert_first_divergent(report, "[frame 0] tracker.maskmem_backbone.vision_features")
    # the image model's heads are untouched: every image row before the video still passes
    assert report.row("[text+box] segmentation_head.pred_masks").passed


def test_sam3_names_trunk_block(sam3_pair):
    from paddle_sam.align.sam3 import align_sam3

    ref, ours, tracker = sam3_pair
    undo = _nudge(ours, "backbone.vision_backbone.trunk.blocks.1.mlp.fc1.weight")
    try:
        report = align_sam3(ref, ours, None, IMAGE, cases=[], frames=0)
    finally:
        undo()
    _assert_first_divergent(report, "backbone.vision_backbone.trunk.blocks.1")


def test_sam3_without_tracker():
    """An image model without the tracker: the detector's modules only."""
    from paddle_sam.align.sam3 import align_sam3, random_pair
    from tests.helpers.specs import tiny_sam3_spec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref, ours, tracker = random_pair(tiny_sam3_spec(), interactive=False)
    assert tracker is None
    report = align_sam3(ref, ours, tracker, IMAGE, confidence_threshold=0.0)
    assert report.passed, "\n" + report.format_table()
    assert not any("tracker." in m or "frame" in m for m in report.modules())
    assert report.meta["clicks"] is False and report.meta["frames"] == 0


def test_report_fails_on_a_missing_output():
    """An output one side lacks is a failing row, never silently skipped."""
    from paddle_sam.align.common import Alignment

    torch = pytest.importorskip("torch")
    import paddle

    ref, ours = torch.nn.Identity(), paddle.nn.Identity()
    with Alignment([("x", ref, ours)]) as al:
        with al.stage("[a] "):
            ref(torch.ones(3))
        with al.stage("[b] "):
            ref(torch.ones(3))
            ours(paddle.ones([3]))
            ours(paddle.ones([3]))
    report = al.report
    assert [r.module for r in report.rows] == ["[a] x", "[b] x", "[b] x#2"]
    assert [r.passed for r in report.rows] == [False, True, False]
    assert report.rows[0].note == "ours has no such output"
    assert not report.passed and report.first_divergent().module == "[a] x"
    assert np.isnan(report.rows[0].cosine)
    # hooks are gone after the block: calling again records nothing
    ref(torch.ones(3))
    assert "forward" not in ref.__dict__ and "forward" not in ours.__dict__


def test_sam3_released_keys_to_reference():
    """A released file's keys: the tracker and the second neck go to a reference with the
    tracker, and are left out of one without (which has neither)."""
    from paddle_sam.align.sam3 import released_to_reference

    state = {
        "detector.backbone.vision_backbone.trunk.pos_embed": 1,
        "detector.backbone.vision_backbone.sam2_convs.0.conv_1x1.weight": 2,
        "tracker.maskmem_backbone.out_proj.weight": 3,
    }
    assert released_to_reference(state, interactive=True) == {
        "backbone.vision_backbone.trunk.pos_embed": 1,
        "backbone.vision_backbone.sam2_convs.0.conv_1x1.weight": 2,
        "inst_interactive_predictor.model.maskmem_backbone.out_proj.weight": 3,
    }
    assert released_to_reference(state, interactive=False) == {
        "backbone.vision_backbone.trunk.pos_embed": 1
    }


@pytest.mark.slow
def test_sam3_released_reference_holds_the_checkpoint_keys(reference_dir):
    """The reference of the released size (upstream's own builder, with the tracker) has
    exactly the released ``sam3.pt``'s 1465 keys and shapes, so the file loads strictly
    (about 15 s and 4.7 GB: the whole model is built)."""
    import ast

    from paddle_sam.align.sam3 import build_reference_sam3, cpu_patches, reference_to_released

    with cpu_patches():
        ref = build_reference_sam3(interactive=True)
    rows = (reference_dir / "sam3_checkpoint_keys.tsv").read_text().splitlines()[1:]
    released = {r.split("\t")[0]: tuple(ast.literal_eval(r.split("\t")[1])) for r in rows}
    assert {k: v.shape for k, v in reference_to_released(ref).items()} == released
