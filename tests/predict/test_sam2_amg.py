"""SAM2AutomaticMaskGenerator against the official one (sam2 1.1.0) at the reduced size of
test_sam2_parity.py (random weights, 256 px input) on a small image: the same masks as sets
(matched one to one, >= 99.9 % of the image's pixels equal), scores, boxes and points, for
upstream's options (multimask, use_m2m, crop layers, RLE output), a small point grid each.

Upstream's constructor defaults are checked against its signature and used throughout."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from paddle_sam.convert.checkpoint import convert_checkpoint
from paddle_sam.loading.sam2 import build_sam2
from paddle_sam.predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator
from paddle_sam.predict.sam_v1.amg_utils import rle_to_mask
from tests.helpers.sam2_ref import (
    REDUCED_OVERRIDES,
    config_file,
    official_model,
    reduced_spec,
    save_official,
)

torch = pytest.importorskip("torch")
pytest.importorskip("sam2")

AGREEMENT = 0.999  # fraction of the image's pixels on which matched masks agree


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Random weights made to give crisp masks that differ from point to point: perturbed
    more than the parity tests' (still well conditioned: logits within 1e-2 of upstream's),
    mask logits scaled up, clicks weighing more, the single-mask output made like a multimask
    one."""
    tmp = tmp_path_factory.mktemp("sam2_amg")
    ref = official_model(config_file("2.1"), REDUCED_OVERRIDES, seed=2, scale=0.2)
    with torch.no_grad():
        for mlp in ref.sam_mask_decoder.output_hypernetworks_mlps:
            mlp.layers[-1].weight.mul_(10.0)
            mlp.layers[-1].bias.mul_(10.0)
        ref.sam_prompt_encoder.pe_layer.positional_encoding_gaussian_matrix.mul_(3.0)
        for embedding in ref.sam_prompt_encoder.point_embeddings:
            embedding.weight.mul_(3.0)
        # the single-mask output (token 0) made like the first multimask one: random token 0
        # covers the whole image
        decoder = ref.sam_mask_decoder
        decoder.mask_tokens.weight[0] = decoder.mask_tokens.weight[1]
        hyper = decoder.output_hypernetworks_mlps
        hyper[0].load_state_dict(hyper[1].state_dict())
    pt = save_official(ref, tmp / "reduced.pt")
    convert_checkpoint(pt, tmp / "reduced.pdparams", spec=reduced_spec(), progress=False)
    return ref, build_sam2(reduced_spec(), tmp / "reduced.pdparams")


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    """Three flat shapes on a flat background."""
    img = np.full((120, 160, 3), 120, dtype=np.uint8)
    img[20:70, 15:65] = (220, 40, 40)
    img[60:110, 90:150] = (30, 60, 210)
    yy, xx = np.mgrid[:120, :160]
    img[(yy - 35) ** 2 + (xx - 115) ** 2 < 18**2] = (40, 200, 60)
    return img


def _official(model, **kwargs):
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator as Official

    gen = Official(model, **kwargs)
    side = model.image_size // 16  # upstream hard-codes 1024 px feature sizes
    gen.predictor._bb_feat_sizes = [(4 * side, 4 * side), (2 * side, 2 * side), (side, side)]
    return gen


def _mask(seg) -> np.ndarray:
    if not isinstance(seg, dict):
        return seg
    if isinstance(seg["counts"], str):  # coco_rle
        from pycocotools import mask as mask_utils

        return mask_utils.decode({**seg, "counts": seg["counts"].encode()})
    return rle_to_mask(seg)


def _masks(records) -> np.ndarray:
    return np.stack([_mask(r["segmentation"]) for r in records])


def _compare(want: list[dict], got: list[dict]) -> None:
    """Equal as sets: each official record has its own of ours from the same grid point with
    the same predicted IoU, whose mask agrees on >= AGREEMENT of the pixels."""
    assert len(got) == len(want), f"{len(got)} masks, official {len(want)}"
    assert len(want) >= 3, "too few masks to compare anything"
    a, b = _masks(want).astype(bool), _masks(got).astype(bool)
    free = set(range(len(got)))
    for i, w in enumerate(want):
        same_point = [
            j for j in free if np.allclose(w["point_coords"], got[j]["point_coords"], atol=1e-3)
        ]
        assert same_point, f"mask {i}: no mask of ours from the point {w['point_coords']}"
        j = min(same_point, key=lambda j: abs(w["predicted_iou"] - got[j]["predicted_iou"]))
        free.discard(j)
        g = got[j]
        agree = float((a[i] == b[j]).mean())
        assert agree >= AGREEMENT, f"mask {i}: agrees on {agree:.5f} of the pixels"
        assert abs(w["predicted_iou"] - g["predicted_iou"]) < 1e-4
        assert abs(w["stability_score"] - g["stability_score"]) < 2e-3
        np.testing.assert_allclose(w["bbox"], g["bbox"], atol=1)
        assert w["crop_box"] == g["crop_box"]
        assert abs(w["area"] - g["area"]) <= (1 - AGREEMENT) * a[i].size


def test_defaults_are_upstreams():
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator as Official

    theirs = inspect.signature(Official.__init__).parameters
    ours = inspect.signature(SAM2AutomaticMaskGenerator.__init__).parameters
    for name, p in theirs.items():
        if name not in ("self", "model", "kwargs"):
            assert ours[name].default == p.default, name


@pytest.mark.parametrize(
    "options",
    [
        {"points_per_side": 8},
        {"points_per_side": 6, "use_m2m": True, "points_per_batch": 40},
        {"points_per_side": 4, "crop_n_layers": 1, "output_mode": "coco_rle"},
        {"points_per_side": 8, "multimask_output": False, "output_mode": "uncompressed_rle"},
    ],
    ids=["multimask", "m2m", "crops", "single"],
)
def test_same_masks_as_official(pair, image, options):
    ref, ours = pair
    with torch.inference_mode():
        want = _official(ref, **options).generate(image)
    got = SAM2AutomaticMaskGenerator(ours, **options).generate(image)
    _compare(want, got)
    if options.get("output_mode") == "coco_rle":
        assert isinstance(got[0]["segmentation"]["counts"], str)


def test_refusals(pair):
    _, ours = pair
    with pytest.raises(ValueError, match="Exactly one of points_per_side or point_grids"):
        SAM2AutomaticMaskGenerator(ours, points_per_side=None)
    with pytest.raises(ValueError, match="Unknown output_mode"):
        SAM2AutomaticMaskGenerator(ours, output_mode="png")
    with pytest.raises(TypeError, match="needs a SAM 2 model"):
        SAM2AutomaticMaskGenerator(object())
    with pytest.raises(ValueError, match="never downloads"):
        SAM2AutomaticMaskGenerator.from_pretrained("facebook/sam2.1-hiera-tiny")


def test_small_regions_go_to_the_predictor(pair, image):
    """As upstream, min_mask_region_area becomes the predictor's max_hole_area and
    max_sprinkle_area (upstream skips them without its CUDA extension; ours runs on the CPU)
    and the final masks are not cleaned again."""
    _, ours = pair
    gen = SAM2AutomaticMaskGenerator(ours, points_per_side=4, min_mask_region_area=30)
    assert gen.predictor.max_hole_area == gen.predictor.max_sprinkle_area == 30
    records = gen.generate(image)
    assert records and all(r["area"] > 0 for r in records)
