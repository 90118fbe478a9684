"""``paddle-sam align`` end to end at reduced sizes: official checkpoints of each family written
as upstream writes them (random weights), converted by ``paddle-sam``'s converter, compared
through the real CLI; the family is read from the file. Exit status 0 when every module is
aligned, 1 naming the first divergent module, 2 with one line for what the user got wrong."""

from __future__ import annotations

import json
import warnings

import pytest

from paddle_sam import cli
from paddle_sam.convert.checkpoint import convert_checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("segment_anything")


def run(argv: list) -> int:
    try:
        return cli.main([str(a) for a in argv])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def report_of(capsys, argv: list, code: int = 0) -> dict:
    assert run(argv) == code
    out, err = capsys.readouterr()
    assert "comparing" in err
    return json.loads(out)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("align_cli")


def _sam_v1_files(work, seed: int):
    """A tiny SAM v1 .pth as segment-anything saves it, and its conversion (made once)."""
    from paddle_sam.align.sam_v1 import random_pair
    from tests.helpers.specs import TINY

    pth, dst = work / f"sam_tiny_{seed}.pth", work / f"sam_tiny_{seed}.pdparams"
    if not dst.exists():
        ref, _ = random_pair(TINY, seed=seed)
        torch.save(ref.state_dict(), pth)
        convert_checkpoint(pth, dst, spec=TINY, progress=False)
    return pth, dst


def test_sam_v1(work, capsys):
    pth, pdparams = _sam_v1_files(work, seed=1)
    rep = report_of(
        capsys, ["align", "--torch-checkpoint", pth, "--checkpoint", pdparams, "--json"]
    )
    assert rep["passed"] and rep["first_divergent"] is None
    assert rep["family"] == "sam_v1" and rep["model_type"] == "custom"
    assert rep["weights"] == pth.name and rep["ours"] == pdparams.name
    names = {r["module"] for r in rep["rows"]}
    assert {"image_encoder.neck", "[box] mask_decoder[0]", "[refine] masks"} <= names
    # the table: one row per module, the verdict last
    assert run(["align", "--torch-checkpoint", pth, "--checkpoint", pdparams]) == 0
    assert capsys.readouterr().out.strip().endswith("all modules aligned")


def test_sam_v1_other_weights_diverge(work, capsys):
    """Ours converted from other weights of the same size: exit 1, the first module named."""
    pth, _ = _sam_v1_files(work, seed=1)
    _, other = _sam_v1_files(work, seed=2)
    rep = report_of(
        capsys, ["align", "--torch-checkpoint", pth, "--checkpoint", other, "--json"], code=1
    )
    assert not rep["passed"] and rep["first_divergent"] == "image_encoder.patch_embed"


def test_sam2(work, capsys):
    pytest.importorskip("sam2")
    from paddle_sam.align.sam2 import random_pair
    from tests.helpers.sam2_ref import reduced_spec, save_official

    spec = reduced_spec("2.1")
    ref, _ = random_pair(spec, seed=3)
    pt = save_official(ref, work / "sam2_reduced.pt")
    dst = work / "sam2_reduced.pdparams"
    convert_checkpoint(pt, dst, spec=spec, progress=False)
    argv = ["align", "--torch-checkpoint", pt, "--checkpoint", dst, "--frames", 2, "--json"]
    rep = report_of(capsys, argv)
    assert rep["passed"] and rep["family"] == "sam2" and rep["frames"] == 2
    names = {r["module"] for r in rep["rows"]}
    assert {"[frame 1] memory_attention", "[frame 1] memory_encoder.vision_features"} <= names


def test_sam3(work, capsys):
    pytest.importorskip("sam3")
    from paddle_sam.align.sam3 import random_pair, reference_to_released
    from tests.helpers.specs import tiny_sam3_tracker_spec

    spec = tiny_sam3_tracker_spec()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref, _, _ = random_pair(spec, seed=4)
    state = {k: torch.from_numpy(v) for k, v in reference_to_released(ref).items()}
    pt = work / "sam3_tiny.pt"
    torch.save({"model": state}, pt)
    dst = work / "sam3_tiny.pdparams"
    convert_checkpoint(pt, dst, spec=spec, progress=False)
    argv = ["align", "--torch-checkpoint", pt, "--checkpoint", dst, "--frames", 1]
    rep = report_of(capsys, [*argv, "--text", "red star", "--json"])
    assert rep["passed"], [r for r in rep["rows"] if not r["passed"]]
    assert rep["family"] == "sam3" and rep["clicks"] and rep["frames"] == 1
    assert rep["text"] == "red star"
    names = {r["module"] for r in rep["rows"]}
    assert {
        "[text] backbone.language_backbone[1]",
        "[inst box] tracker.sam_mask_decoder[0]",
        "[frame 0] tracker.maskmem_backbone.vision_features",
    } <= names


def assert_user_error(capsys, argv: list, *needles: str) -> None:
    assert run(argv) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paddle-sam align: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_user_errors(work, tmp_path, capsys):
    pth, pdparams = _sam_v1_files(work, seed=1)
    assert_user_error(capsys, ["align"], "--torch-checkpoint", "--model-type")
    assert_user_error(capsys, ["align", "--checkpoint", pdparams], "--checkpoint needs")
    missing = tmp_path / "missing.pth"
    assert_user_error(capsys, ["align", "--torch-checkpoint", missing], "missing.pth")
    assert_user_error(
        capsys,
        ["align", "--torch-checkpoint", pth, "--model-type", "sam2.1_hiera_tiny"],
        "SAM 2",
        "SAM v1",
    )
    assert_user_error(capsys, ["align", "--model-type", "vit_b", "--frames", "-1"], "--frames")
    assert_user_error(capsys, ["align", "--model-type", "vit_x"], "vit_x")
    # an official file whose keys do not make the model of --checkpoint's sizes
    bad = tmp_path / "bad.pth"
    torch.save({"image_encoder.patch_embed.proj.weight": torch.zeros(3)}, bad)
    assert_user_error(
        capsys,
        ["align", "--torch-checkpoint", bad, "--checkpoint", pdparams],
        "does not fit the official model",
        "missing",
    )


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["vit_b", "sam2.1_hiera_tiny"])
def test_random_weights_full_size(capsys, model_type):
    """Random weights of a released size (no checkpoint): minutes on 2 cores."""
    if model_type.startswith("sam2"):
        pytest.importorskip("sam2")
    rep = report_of(capsys, ["align", "--model-type", model_type, "--frames", 2, "--json"])
    assert rep["passed"] and rep["model_type"] == model_type
    assert rep["weights"] == "random (seed 0)"
