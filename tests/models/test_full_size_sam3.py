"""Full-size SAM 3 (issue "must show"): random weights in the released ``sam3.pt`` layout,
converted by ``paddle-sam convert``, against the official ``Sam3Processor`` with every one of
the 200 queries kept (confidence threshold 0), for a text prompt and a box prompt: scores
within 1e-3, boxes within 0.5 px, binary masks agreeing on >= 99.9 % of pixels. The measured
figures go to ``test-artifacts/full_size_sam3.json``.

Weights: the official full-size model built by sam3's own builder, then every Linear (and
fused ``in_proj``) redrawn from N(0, 1 / fan_in) and every tensor perturbed
(``tests/helpers/sam3_ref.py``: ``fan_in_init_`` + ``perturb_module_``). Upstream's own inits
(trunc-normal 0.02, then perturbed) make the comparison degenerate at full size: measured, all
200 text-prompt scores within 0.278..0.285 (std 0.001) and masks covering 99.9 % of the image.
With fan-in weights the scores spread over 0.27..0.31 (about 150 distinct values at 1e-4) and
masks cover 70-80 %, so a wrong query, box or mask shows. The ``tracker.*`` keys and the second
neck (``sam2_convs``, used only with instance interactivity) are random arrays of the released
shapes: the file holds exactly the 1465 released keys.

Opt-in (minutes and ~12 GB of memory on 2 cores):
``pytest --runslow tests/models/test_full_size_sam3.py``.
"""

from __future__ import annotations

import ast
import gc
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
pytest.importorskip("sam3")

from paddle_sam.cli import main as cli  # noqa: E402
from tests.helpers.sam3_ref import cpu_patches, fan_in_init_, perturb_module_  # noqa: E402
from tests.models.test_sam3_model import image  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
HW = (480, 640)
TEXT = "a red car"
BOX = [0.45, 0.5, 0.3, 0.4]  # cx, cy, w, h in [0, 1]
CASES = ("text", "box")


def _prompt(processor, state, case: str) -> dict:
    processor.reset_all_prompts(state)
    if case == "text":
        return processor.set_text_prompt(TEXT, state)
    return processor.add_geometric_prompt(BOX, True, state)


def _results(state) -> dict[str, np.ndarray]:
    def arr(x):
        return np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x.numpy())

    return {k: arr(state[k]) for k in ("scores", "boxes", "masks", "masks_logits")}


def _released_shapes(reference_dir: Path) -> dict[str, list[int]]:
    rows = (reference_dir / "sam3_checkpoint_keys.tsv").read_text().splitlines()[1:]
    return {r.split("\t")[0]: ast.literal_eval(r.split("\t")[1]) for r in rows}


def _random(shapes: dict[str, list[int]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in shapes.items():
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        out[key] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def measured(tmp_path_factory, reference_dir):
    from sam3 import model_builder as mb
    from sam3.model.sam3_image_processor import Sam3Processor as RefProcessor

    from paddle_sam import Sam3Processor, build_sam3_image_model
    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH

    tmp = tmp_path_factory.mktemp("sam3_full")
    img = image(*HW, seed=3)
    seconds = {}
    ref_out = {}
    with cpu_patches(), torch.no_grad():
        torch.manual_seed(0)
        ref = mb.build_sam3_image_model(
            bpe_path=str(DEFAULT_BPE_PATH),
            device="cpu",
            checkpoint_path=None,
            load_from_HF=False,
        )
        perturb_module_(fan_in_init_(ref, seed=0), seed=0, scale=0.02)
        ref.eval()
        # the released layout: {"model": {"detector.*": ..., "tracker.*": ...}}, 1465 keys
        state = {f"detector.{k}": v for k, v in ref.state_dict().items()}
        released = _released_shapes(reference_dir)
        # what the image model without interactivity lacks: the second neck and the tracker
        missing = {k: v for k, v in released.items() if k not in state}
        assert all(
            k.startswith(("tracker.", "detector.backbone.vision_backbone.sam2_convs."))
            for k in missing
        ), sorted(missing)[:5]
        state.update({k: torch.from_numpy(v) for k, v in _random(missing, seed=1).items()})
        assert {k: list(v.shape) for k, v in state.items()} == released
        pt = tmp / "sam3_random.pt"
        torch.save({"model": state}, pt)
        del state
        gc.collect()

        processor = RefProcessor(ref, device="cpu", confidence_threshold=0.0)
        t = time.perf_counter()
        ref_state = processor.set_image(Image.fromarray(img))  # upstream: PIL (or CHW)
        seconds["official set_image"] = time.perf_counter() - t
        for case in CASES:
            t = time.perf_counter()
            ref_out[case] = _results(_prompt(processor, ref_state, case))
            seconds[f"official {case} prompt"] = time.perf_counter() - t
        del ref, processor, ref_state
        gc.collect()

    pdparams = tmp / "sam3_random.pdparams"
    t = time.perf_counter()
    assert cli(["convert", str(pt), str(pdparams), "--quiet"]) == 0  # type auto-detected
    seconds["convert (CLI)"] = time.perf_counter() - t
    meta = json.loads((tmp / "sam3_random.pdparams.json").read_text())
    assert meta["model_type"] == "sam3" and meta["interactive"] is True
    pt.unlink()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = build_sam3_image_model(checkpoint_path=str(pdparams))
    processor = Sam3Processor(ours, confidence_threshold=0.0)
    t = time.perf_counter()
    state = processor.set_image(img)
    seconds["paddle set_image"] = time.perf_counter() - t
    figures = {}
    for case in CASES:
        t = time.perf_counter()
        o = _results(_prompt(processor, state, case))
        seconds[f"paddle {case} prompt"] = time.perf_counter() - t
        r = ref_out[case]
        figures[case] = {
            "queries": int(o["scores"].shape[0]),
            "scores_max_abs": float(np.abs(o["scores"] - r["scores"]).max()),
            "scores_range": [float(r["scores"].min()), float(r["scores"].max())],
            "scores_std": float(r["scores"].std()),
            "scores_distinct_1e-4": int(len(np.unique(r["scores"].round(4)))),
            "boxes_max_abs_px": float(np.abs(o["boxes"] - r["boxes"]).max()),
            "masks_logits_max_abs": float(np.abs(o["masks_logits"] - r["masks_logits"]).max()),
            "masks_agreement": float((o["masks"] == r["masks"]).mean()),
            "masks_pixels_differing": int((o["masks"] != r["masks"]).sum()),
            "masks_pixels": int(o["masks"].size),
            "masks_coverage": float(r["masks"].mean()),
        }
    doc = {
        "model": "SAM 3 image model, full size (released layout, 1465 keys), random fan-in "
        "weights (perturbed), converted by 'paddle-sam convert'",
        "image": list(HW),
        "text_prompt": TEXT,
        "box_prompt_cxcywh": BOX,
        "confidence_threshold": 0.0,
        "figures": figures,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "full_size_sam3.json").write_text(json.dumps(doc, indent=2) + "\n")
    return figures


@pytest.mark.parametrize("case", CASES)
def test_full_size_parity(measured, case):
    f = measured[case]
    assert f["queries"] == 200, f
    assert f["scores_max_abs"] <= 1e-3, f
    assert f["boxes_max_abs_px"] <= 0.5, f
    assert f["masks_agreement"] >= 0.999, f


@pytest.mark.parametrize("case", CASES)
def test_full_size_not_degenerate(measured, case):
    """Agreement on equal scores or full masks would prove little."""
    f = measured[case]
    assert f["scores_distinct_1e-4"] >= 50 and f["scores_std"] > 1e-3, f
    assert 0.05 < f["masks_coverage"] < 0.95, f
