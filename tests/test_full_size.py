"""Full-size ViT-B: official weights layout -> CLI conversion -> parity with segment-anything.

Random weights (the official initialisation, perturbed so no tensor stays trivial) saved with
torch.save exactly like an official checkpoint, converted by ``paddle-sam convert``, then
compared module by module and through both predictors. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
segment_anything = pytest.importorskip("segment_anything")

from paddle_sam import sam_model_registry  # noqa: E402
from paddle_sam.align.reference import perturb_weights_  # noqa: E402
from paddle_sam.align.sam_v1 import align_sam, default_image  # noqa: E402
from paddle_sam.cli import main as cli  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vit_b")
    torch.manual_seed(0)
    ref = segment_anything.sam_model_registry["vit_b"]()
    perturb_weights_(ref, seed=0, scale=0.02)
    ref.eval()
    pth = tmp / "sam_vit_b_random.pth"
    torch.save(ref.state_dict(), pth)
    assert cli(["convert", str(pth), str(tmp / "sam_vit_b.pdparams"), "--quiet"]) == 0
    meta = json.loads((tmp / "sam_vit_b.pdparams.json").read_text())
    assert meta["model_type"] == "vit_b"
    ours = sam_model_registry["vit_b"](checkpoint=str(tmp / "sam_vit_b.pdparams"))
    rep = align_sam(ref, ours, default_image(600, 800, seed=3))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "full_size_vit_b_alignment.json").write_text(rep.to_json())
    (ARTIFACTS / "full_size_vit_b_alignment.txt").write_text(rep.format_table() + "\n")
    return rep


def test_image_embedding(report):
    row = report.row("image_embedding")
    assert row.shape == (1, 256, 64, 64)
    assert row.cosine >= 0.99999, report.format_table()


@pytest.mark.parametrize("case", ["point", "points", "box", "box+neg", "refine"])
def test_prompts(report, case):
    masks = report.row(f"[{case}] masks")
    assert masks.agreement >= 0.999, report.format_table()
    assert report.row(f"[{case}] iou_predictions").max_abs <= 2e-3, report.format_table()


def test_masks_are_not_trivial(report):
    """Agreement on empty or full masks would prove nothing."""
    cover = [
        report.row(f"[{c}] masks").coverage for c in ["point", "points", "box", "box+neg", "refine"]
    ]
    assert any(0.01 < c < 0.99 for c in cover), cover


def test_every_module_passes(report):
    assert report.passed, report.format_table()
    assert len([r for r in report.rows if r.module.startswith("image_encoder.blocks.")]) == 12
