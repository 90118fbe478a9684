"""SAM 3 drop-in completeness against the official sam3 package (0.1.4).

* ``Sam3Image.predict_inst_batch``: a reduced SAM 3 with the SAM 2 neck and the tracker's SAM
  heads on both sides, same perturbed weights, images through each side's own
  ``Sam3Processor.set_image_batch``; the prompt forms of the official notebooks.
* ``paddle_sam.models.sam3.box_ops``: every public function of ``sam3.model.box_ops``, on the
  same random boxes and masks.
* ``paddle_sam.visualization_utils``: the helpers of the official notebooks draw the same
  pixels as ``sam3.visualization_utils`` (Agg canvases compared), on a tiny model's outputs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
import types
import warnings

import numpy as np
import paddle
import pytest
from PIL import Image

from paddle_sam.models.sam3 import box_ops
from paddle_sam.models.sam3.build_sam3 import TRACKER_SETTINGS
from tests.helpers.sam3_ref import (
    assert_close,
    import_sam3,
    perturb_module_,
    reference_tracker,
    reference_vision_backbone,
    tracker_cpu_patches,
)
from tests.helpers.specs import tiny_sam3_spec, tiny_sam3_tracker_spec
from tests.models.test_sam3_heads import load_from_torch
from tests.models.test_sam3_model import build_reference, image

torch, _ = import_sam3()

SPEC = tiny_sam3_tracker_spec()
SIDE = SPEC.image_size // SPEC.vit_patch_size
IMAGE_HW = [(90, 130), (64, 80)]


# ---------------------------------------------------------------- predict_inst_batch


@pytest.fixture(scope="module")
def batch_pair(bpe_path):
    """(official model, ours, official batch state, our batch state) for two images."""
    from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor as RefPredictor
    from sam3.model.sam3_image_processor import Sam3Processor as RefProcessor
    from sam3.model.vl_combiner import SAM3VLBackbone

    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.predict.sam3.processor import Sam3Processor

    with tracker_cpu_patches():
        torch.manual_seed(0)
        ref = build_reference(SPEC, bpe_path)
        ref.backbone = SAM3VLBackbone(
            visual=reference_vision_backbone(SPEC, add_sam2_neck=True),
            text=ref.backbone.language_backbone,
            scalp=SPEC.scalp,
        )
        tracker = reference_tracker(SPEC, with_backbone=False, **TRACKER_SETTINGS)
        predictor = RefPredictor(tracker)
        # upstream hard-codes the released feature sizes (288, 144, 72)
        predictor._bb_feat_sizes = [(4 * SIDE, 4 * SIDE), (2 * SIDE, 2 * SIDE), (SIDE, SIDE)]
        ref.inst_interactive_predictor = predictor
    perturb_module_(ref.backbone, seed=0, scale=0.2)
    for name in ("sam_prompt_encoder", "sam_mask_decoder"):
        perturb_module_(getattr(tracker, name), seed=1, scale=0.05)
    with torch.no_grad():
        tracker.no_mem_embed.normal_(0, 0.1)
        # perturbed default weights give logits above 0 almost everywhere, and hole filling
        # then turns every mask into the whole image: the hypernetworks' last layers are
        # redrawn (unit gain) with their sign flipped, so that masks cover 5-45 % of an image
        gen = torch.Generator().manual_seed(5)
        for mlp in tracker.sam_mask_decoder.output_hypernetworks_mlps:
            last = mlp.layers[-1]
            fan_in = last.weight.shape[1]
            last.weight.copy_(-torch.randn(last.weight.shape, generator=gen) / fan_in**0.5)
            last.bias.copy_(-torch.randn(last.bias.shape, generator=gen))
    ref.eval()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = build_sam3_image_model(bpe_path=bpe_path, spec=SPEC, enable_inst_interactivity=True)
    load_from_torch(ours.backbone, ref.backbone, skip_complex=True)
    heads = ours.inst_interactive_predictor.model
    for name in ("sam_prompt_encoder", "sam_mask_decoder"):
        load_from_torch(getattr(heads, name), getattr(tracker, name))
    heads.no_mem_embed.set_value(tracker.no_mem_embed.detach().numpy())
    ours.eval()

    images = [Image.fromarray(image(h, w, seed=i + 1)) for i, (h, w) in enumerate(IMAGE_HW)]
    with tracker_cpu_patches(), torch.inference_mode():
        ref_state = RefProcessor(ref, resolution=SPEC.image_size, device="cpu").set_image_batch(
            images
        )
    our_proc = Sam3Processor(ours, resolution=SPEC.image_size)
    our_state = our_proc.set_image_batch(images)
    return ref, ours, ref_state, our_state, our_proc, images


BOXES = [
    np.array([[10, 15, 70, 80], [60, 5, 120, 60]]),  # image 1 (90 x 130): two objects
    np.array([[5, 5, 40, 50], [30, 20, 75, 60], [50, 10, 78, 30]]),  # image 2 (64 x 80)
]
# one click per object (B x 1 x 2) on image 1, two clicks on one object on image 2
POINTS = [np.array([[[40, 30]], [[100, 60]]]), np.array([[[20, 20], [60, 40]]])]
LABELS = [np.array([[1], [1]]), np.array([[1, 0]])]

CASES = {
    # the notebook's two calls, positional arguments as there
    "boxes, one mask each": ((None, None), dict(box_batch=BOXES, multimask_output=False)),
    "a click per object, multimask": ((POINTS, LABELS), dict(box_batch=None)),
    "box + clicks on image 1 only, logits": (
        (),
        dict(
            point_coords_batch=[np.array([[50, 40], [20, 70]]), np.array([[30, 30]])],
            point_labels_batch=[np.array([1, 0]), np.array([1])],
            box_batch=[np.array([10, 15, 70, 80]), None],
            multimask_output=False,
            return_logits=True,
        ),
    ),
    "relative coordinates": (
        (),
        dict(
            point_coords_batch=[[[0.3, 0.4]], [[0.6, 0.5], [0.2, 0.3]]],
            point_labels_batch=[[1], [1, 1]],
            box_batch=[None, [0.1, 0.1, 0.7, 0.8]],
            normalize_coords=False,
        ),
    ),
}


def run_both(batch_pair, *args, **kwargs):
    ref, ours, ref_state, our_state, _, _ = batch_pair
    ref_args = [None if a is None else [np.asarray(v) for v in a] for a in args]
    ref_kwargs = {
        k: [None if v is None else np.asarray(v) for v in a] if isinstance(a, list) else a
        for k, a in kwargs.items()
    }
    with tracker_cpu_patches(), torch.inference_mode(), warnings.catch_warnings():
        # holes are filled on both sides: upstream's CPU backend is scikit-image (test extra)
        warnings.simplefilter("error")
        r = ref.predict_inst_batch(ref_state, *ref_args, **ref_kwargs)
    o = ours.predict_inst_batch(our_state, *args, **kwargs)
    return r, o


def assert_same_results(r, o, name: str, logits: bool = False) -> None:
    assert all(isinstance(x, list) and len(x) == len(IMAGE_HW) for x in o), name
    for i in range(len(IMAGE_HW)):
        (rm, ri, rl), (om, oi, ol) = (x[i] for x in r), (x[i] for x in o)
        assert om.shape == rm.shape and oi.shape == ri.shape and ol.shape == rl.shape, name
        assert om.dtype == np.float32 and om.shape[-2:] == IMAGE_HW[i], name
        covered = (rm > 0).mean()
        assert 0.02 < covered < 0.98, f"{name}, image {i}: masks cover {covered:.3f} of it"
        assert_close(ri, oi, max_abs=1e-5, name=f"{name}, image {i}: iou")
        assert_close(rl, ol, max_abs=2e-4, name=f"{name}, image {i}: low-res logits")
        if logits:
            assert_close(rm, om, max_abs=2e-4, name=f"{name}, image {i}: mask logits")
        else:
            agree = (rm == om).mean()
            assert agree >= 0.9999, f"{name}, image {i}: binary masks agree on {agree:.6f}"


@pytest.mark.parametrize("case", list(CASES))
def test_predict_inst_batch_matches_official(batch_pair, case):
    args, kwargs = CASES[case]
    r, o = run_both(batch_pair, *args, **kwargs)
    assert_same_results(r, o, case, logits=kwargs.get("return_logits", False))
    predictor = batch_pair[1].inst_interactive_predictor
    assert not predictor._is_image_set and not predictor._is_batch  # reset afterwards


def test_predict_inst_batch_shapes_and_mask_input(batch_pair):
    """The notebook's shapes (B objects x C masks x H x W), then the best low-res logits of
    each object fed back as ``mask_input_batch`` with the same clicks."""
    r, o = run_both(batch_pair, POINTS, LABELS, box_batch=None, multimask_output=True)
    masks, ious, low_res = o
    assert masks[0].shape == (2, 3, 90, 130) and ious[0].shape == (2, 3)
    assert masks[1].shape == (3, 64, 80) and ious[1].shape == (3,)  # one object: squeezed
    assert low_res[0].shape == (2, 3, 4 * SIDE, 4 * SIDE)
    best = [
        r[2][0][np.arange(2), r[1][0].argmax(-1)][:, None],  # 2 x 1 x h x w
        r[2][1][r[1][1].argmax()][None],  # 1 x h x w
    ]
    r2, o2 = run_both(
        batch_pair,
        POINTS,
        LABELS,
        mask_input_batch=best,
        multimask_output=False,
    )
    assert_same_results(r2, o2, "mask input")
    assert o2[0][0].shape == (2, 1, 90, 130) and o2[0][1].shape == (1, 64, 80)


def test_predict_inst_batch_of_one_equals_predict_inst(batch_pair):
    """A batch of one image gives predict_inst's results on that image."""
    _, ours, _, _, our_proc, images = batch_pair
    single = our_proc.set_image(images[1])
    batch = our_proc.set_image_batch([images[1]])
    want = ours.predict_inst(single, point_coords=POINTS[1], point_labels=LABELS[1])
    got = ours.predict_inst_batch(batch, [POINTS[1]], [LABELS[1]])
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g[0], w, atol=1e-6)


def test_predict_inst_batch_errors(batch_pair, monkeypatch):
    _, ours, _, our_state, our_proc, images = batch_pair
    with pytest.raises(ValueError, match="set_image_batch"):
        ours.predict_inst_batch(our_proc.set_image(images[0]), box_batch=BOXES)
    with pytest.raises(ValueError, match="box_batch must hold one entry per image: 3 entries"):
        ours.predict_inst_batch(our_state, box_batch=[*BOXES, BOXES[0]])
    with pytest.raises(ValueError, match="point_labels must be supplied"):
        ours.predict_inst_batch(our_state, POINTS, None)
    bad = dict(our_state, original_heights=[90])
    with pytest.raises(ValueError, match="Batch size mismatch"):
        ours.predict_inst_batch(bad, box_batch=BOXES)
    predictor = ours.inst_interactive_predictor
    assert not predictor._is_image_set  # reset after the failed calls too
    with pytest.raises(RuntimeError, match="set_image_batch"):
        predictor.predict_batch(box_batch=BOXES)
    backbone_out = our_state["backbone_out"]["sam2_backbone_out"]
    predictor.set_features(backbone_out, list(zip(*[[90, 64], [130, 80]], strict=True)))
    try:
        with pytest.raises(RuntimeError, match="for one image use predict"):
            predictor.predict_batch(box_batch=BOXES)
        assert predictor.get_image_embedding().shape == [2, SPEC.d_model, SIDE, SIDE]
    finally:
        predictor.reset_predictor()
    with pytest.raises(ValueError, match="2 images in the features but 1 original sizes"):
        predictor.set_features(backbone_out, [(90, 130)])
    monkeypatch.setattr(ours, "inst_interactive_predictor", None)
    with pytest.raises(ValueError, match="enable_inst_interactivity"):
        ours.predict_inst_batch(our_state, box_batch=BOXES)


# ---------------------------------------------------------------- box_ops


def public_functions(module) -> dict:
    """The functions a module defines (its TorchScript ones included), by name."""
    out = {}
    for name, fn in vars(module).items():
        scripted = type(fn).__name__ == "ScriptFunction"
        defined = inspect.isfunction(fn) and fn.__module__ == module.__name__
        if not name.startswith("_") and (scripted or defined):
            out[name] = fn
    return out


def test_box_ops_has_every_public_upstream_function():
    from sam3.model import box_ops as ref_ops

    names = set(public_functions(ref_ops))
    assert {"box_xywh_to_cxcywh", "masks_to_boxes", "fast_diag_box_iou"} <= names
    missing = sorted(n for n in names if not callable(getattr(box_ops, n, None)))
    assert not missing, f"missing from paddle_sam.models.sam3.box_ops: {missing}"
    assert set(box_ops.__all__) == names


def random_xywh(*shape: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 50, (*shape, 2))
    wh = rng.uniform(0.5, 30, (*shape, 2))
    return np.concatenate([xy, wh], -1).astype(np.float32)


def both(fn_name: str, *arrays: np.ndarray):
    from sam3.model import box_ops as ref_ops

    r = getattr(ref_ops, fn_name)(*(torch.from_numpy(a) for a in arrays))
    o = getattr(box_ops, fn_name)(*(paddle.to_tensor(a) for a in arrays))
    return r, o


def assert_outputs_equal(r, o, name: str) -> None:
    if isinstance(r, tuple):
        assert isinstance(o, tuple) and len(o) == len(r), name
        for i, (a, b) in enumerate(zip(r, o, strict=True)):
            assert_outputs_equal(a, b, f"{name}[{i}]")
        return
    a, b = r.numpy(), o.numpy()
    assert a.shape == b.shape and a.dtype == b.dtype, f"{name}: {b.shape} {b.dtype} vs {a.shape}"
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    "name",
    [
        "box_cxcywh_to_xyxy",
        "box_cxcywh_to_xywh",
        "box_xywh_to_xyxy",
        "box_xywh_to_cxcywh",
        "box_xyxy_to_xywh",
        "box_xyxy_to_cxcywh",
        "box_area",
    ],
)
def test_box_conversions(name):
    boxes = random_xywh(3, 5, seed=1) - 10.0  # negative coordinates too
    assert_outputs_equal(*both(name, boxes), name)
    assert_outputs_equal(*both(name, boxes[0, 0]), f"{name} (one box)")


@pytest.mark.parametrize("name", ["box_iou", "generalized_box_iou"])
def test_pairwise_ious(name):
    xyxy = random_xywh(2, 7, seed=2)
    xyxy[..., 2:] += xyxy[..., :2]
    other = random_xywh(2, 4, seed=3)
    other[..., 2:] += other[..., :2]
    other[0, 0] = xyxy[0, 0]  # an identical pair
    assert_outputs_equal(*both(name, xyxy, other), f"{name} batched")
    assert_outputs_equal(*both(name, xyxy[1], other[1]), name)
    with pytest.raises(ValueError, match="boxes2 must hold boxes"):
        getattr(box_ops, name)(paddle.to_tensor(xyxy), paddle.zeros([3, 3]))


@pytest.mark.parametrize("name", ["fast_diag_box_iou", "fast_diag_generalized_box_iou"])
def test_diagonal_ious(name):
    a = random_xywh(9, seed=4)
    b = random_xywh(9, seed=5)
    a[:, 2:] += a[:, :2]
    b[:, 2:] += b[:, :2]
    b[3] = a[3]
    assert_outputs_equal(*both(name, a, b), name)
    with pytest.raises(ValueError, match="9 boxes vs 8"):
        getattr(box_ops, name)(paddle.to_tensor(a), paddle.to_tensor(b[:8]))


def test_box_xywh_inter_union():
    a, b = random_xywh(4, 6, seed=6), random_xywh(4, 6, seed=7)
    b[1, 2] = a[1, 2]
    assert_outputs_equal(*both("box_xywh_inter_union", a, b), "box_xywh_inter_union")
    a[0, 0, 2] = -1.0
    with pytest.raises(ValueError, match="areas"):
        box_ops.box_xywh_inter_union(paddle.to_tensor(a), paddle.to_tensor(b))


def test_masks_to_boxes():
    """As upstream for one mask (2-D or 1 x H x W, empty or not) and for several non-empty
    ones; several masks with an empty one: each box as upstream gives it for that mask alone
    (upstream's own batched result does not broadcast there)."""
    rng = np.random.default_rng(8)
    masks = np.zeros((4, 20, 30), dtype=bool)
    for m in masks:
        y0, x0 = rng.integers(0, 10), rng.integers(0, 15)
        m[y0 : y0 + rng.integers(1, 10), x0 : x0 + rng.integers(1, 15)] = True
        m[rng.integers(0, 20), rng.integers(0, 30)] = True  # a stray pixel
    assert_outputs_equal(*both("masks_to_boxes", masks), "four masks")
    assert_outputs_equal(*both("masks_to_boxes", masks[1]), "one 2-D mask")
    assert_outputs_equal(*both("masks_to_boxes", masks[2:3]), "1 x H x W")
    empty = np.zeros((1, 20, 30), dtype=bool)
    assert_outputs_equal(*both("masks_to_boxes", empty), "empty mask")
    assert_outputs_equal(*both("masks_to_boxes", masks.astype(np.float32)), "float masks")
    mixed = np.concatenate([masks[:2], empty])
    ours = box_ops.masks_to_boxes(paddle.to_tensor(mixed)).numpy()
    for i, m in enumerate(mixed):
        r, _ = both("masks_to_boxes", m[None])
        np.testing.assert_array_equal(ours[i], r.numpy()[0])
    assert box_ops.masks_to_boxes(paddle.zeros([0, 5, 5])).shape == [0, 4]
    with pytest.raises(ValueError, match="N x H x W"):
        box_ops.masks_to_boxes(paddle.zeros([1, 1, 5, 5]))


# ---------------------------------------------------------------- visualization_utils


class _FirstSamplesKMeans:
    """Stand-in for scikit-learn's KMeans while the official module is imported: its
    palette is replaced by ours in every comparison below."""

    def __init__(self, n_clusters: int, n_init: int = 10) -> None:
        self.n_clusters = n_clusters

    def fit(self, x):
        self.cluster_centers_ = np.asarray(x)[: self.n_clusters]
        return self


@pytest.fixture(scope="module")
def plt():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    with matplotlib.rc_context({"figure.dpi": 40}):
        yield pyplot
    pyplot.close("all")


@pytest.fixture(scope="module")
def viz(plt):
    from paddle_sam import visualization_utils

    return visualization_utils


@pytest.fixture(scope="module")
def official_viz(plt, viz):
    """``sam3.visualization_utils``, with our palette. It imports pandas and scikit-learn at
    the top, though the helpers compared here use neither: where they are missing,
    stand-ins are in ``sys.modules`` while it is imported. It seeds NumPy's global generator
    on import: the generator's state is restored."""
    stubs: dict[str, types.ModuleType] = {}
    if importlib.util.find_spec("pandas") is None:
        stubs["pandas"] = types.ModuleType("pandas")
        stubs["pandas"].DataFrame = dict  # named in a type annotation only
    if importlib.util.find_spec("sklearn") is None:
        sklearn, cluster = types.ModuleType("sklearn"), types.ModuleType("sklearn.cluster")
        cluster.KMeans = _FirstSamplesKMeans
        sklearn.cluster = cluster
        stubs.update({"sklearn": sklearn, "sklearn.cluster": cluster})
    rng_state = np.random.get_state()
    with pytest.MonkeyPatch.context() as mp:
        for name, module in stubs.items():
            mp.setitem(sys.modules, name, module)
        mp.delitem(sys.modules, "sam3.visualization_utils", raising=False)
        try:
            module = importlib.import_module("sam3.visualization_utils")
        except ImportError as exc:
            pytest.skip(f"the official visualization_utils cannot be imported: {exc}")
        finally:
            np.random.set_state(rng_state)
    module.COLORS = viz.COLORS
    return module


def canvas(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba()).copy()


def draw_both(plt, ref_draw, our_draw, background=None, figsize=(3, 2)) -> np.ndarray:
    """Run each drawing on a fresh figure (over ``background`` when given) and assert the
    rendered pixels are equal; returns them."""
    pixels = []
    for draw in (ref_draw, our_draw):
        fig, ax = plt.subplots(figsize=figsize)
        if background is not None:
            ax.imshow(background)
        draw(ax)
        pixels.append(canvas(plt.gcf()))
        plt.close("all")
    np.testing.assert_array_equal(pixels[1], pixels[0])
    return pixels[1]


def test_viz_mirrors_the_implementation(viz, monkeypatch):
    """``paddle_sam.visualization_utils`` (upstream's path) re-exports every public name of
    the implementation in ``predict``, and a palette assigned to it is the one drawn with."""
    impl = importlib.import_module("paddle_sam.predict.sam3.visualization_utils")
    defined = set()  # the names its top-level functions, classes and assignments define
    for node in ast.parse(inspect.getsource(impl)).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    public = {name for name in defined if not name.startswith("_")} | {"COLORS"}
    assert set(viz.__all__) == public
    for name in public:
        assert getattr(viz, name) is getattr(impl, name), name
    palette = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    monkeypatch.setattr(viz, "COLORS", palette)
    assert impl.COLORS is palette and viz.COLORS is palette
    np.testing.assert_array_equal(impl._color(3), palette[1])
    monkeypatch.undo()  # deletes it: the default palette is made again
    assert impl.COLORS is not palette and viz.COLORS is impl.COLORS
    assert viz.COLORS.shape == (128, 3)


def test_viz_needs_matplotlib_only_when_drawing(monkeypatch):
    """Importing works without matplotlib; drawing says how to install it."""
    path = importlib.util.find_spec("paddle_sam.predict.sam3.visualization_utils").origin
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    spec = importlib.util.spec_from_file_location("viz_without_matplotlib", path)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.COLORS.shape == (128, 3)
    img = Image.new("RGB", (8, 6))
    results = {"masks": np.zeros((0, 1, 6, 8)), "boxes": np.zeros((0, 4)), "scores": []}
    for call in (
        lambda: fresh.plot_results(img, results),
        lambda: fresh.plot_mask(np.zeros((6, 8))),
        lambda: fresh.show_box([0, 0, 1, 1], None),
    ):
        with pytest.raises(ImportError, match=r"pip install 'paddle-sam\[viz\]'"):
            call()
    # drawing into pixels needs no matplotlib
    assert fresh.draw_box_on_image(img, [1, 1, 4, 3]).size == (8, 6)


def test_palettes(viz, official_viz):
    np.testing.assert_array_equal(viz.pascal_color_map(), official_viz.pascal_color_map())
    assert viz.bitget(0b1010, 1) == official_viz.bitget(0b1010, 1) == 1
    state = np.random.get_state()[1].copy()
    colors = viz.generate_colors(n_colors=16, n_samples=500)
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # global generator untouched
    assert colors.shape == (16, 3) and colors.min() >= 0 and colors.max() <= 1
    np.testing.assert_array_equal(colors, viz.generate_colors(n_colors=16, n_samples=500))
    c = viz.COLORS
    assert c.shape == (128, 3)
    gaps = np.linalg.norm(c[:, None] - c[None], axis=-1) + np.eye(len(c))
    assert gaps.min() > 0.02, "palette colours must be distinct"
    with pytest.raises(ValueError, match="n_colors"):
        viz.generate_colors(n_colors=10, n_samples=5)


def test_normalize_bbox_and_draw_box(viz, official_viz):
    box = [12.0, 30.0, 40.0, 20.0]
    assert viz.normalize_bbox(box, 160, 120) == official_viz.normalize_bbox(box, 160, 120)
    assert box == [12.0, 30.0, 40.0, 20.0]  # not modified
    batch = random_xywh(2, 3, seed=9)
    want = official_viz.normalize_bbox(torch.from_numpy(batch), 160, 120).numpy()
    got = viz.normalize_bbox(paddle.to_tensor(batch), 160, 120)
    assert isinstance(got, paddle.Tensor)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(viz.normalize_bbox(batch, 160, 120), want)
    with pytest.raises(ValueError, match="4 elements"):
        viz.normalize_bbox([1.0, 2.0, 3.0], 10, 10)
    with pytest.raises(ValueError, match="last dimension of size 4"):
        viz.normalize_bbox(np.zeros((2, 3)), 10, 10)

    img = Image.fromarray(image(50, 70, seed=3)).convert("RGBA")
    for xywh in ([10, 8, 30, 20], [3.7, 2.2, 60.9, 40.5]):
        want = official_viz.draw_box_on_image(img, xywh, color=(255, 0, 0))
        got = viz.draw_box_on_image(img, xywh, color=(255, 0, 0))
        assert got.mode == want.mode == "RGB"
        np.testing.assert_array_equal(np.array(got), np.array(want))
    edge = viz.draw_box_on_image(img, [0, 0, 70, 50])  # upstream fails at the border
    assert np.array(edge)[0, 5].tolist() == [0, 255, 0]


@pytest.fixture(scope="module")
def tiny_results():
    """A tiny random SAM 3 image model's results for a text prompt, every query kept."""
    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.predict.sam3.processor import Sam3Processor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_sam3_image_model(spec=tiny_sam3_spec())
    processor = Sam3Processor(model, resolution=112, confidence_threshold=0.0)
    img = Image.fromarray(image(60, 90, seed=11))
    state = processor.set_text_prompt("a cat", processor.set_image(img))
    return img, state


def test_plot_results(plt, viz, official_viz, tiny_results, capsys):
    """plot_results on a tiny model's outputs (Paddle tensors; torch copies upstream): a
    12 x 8 in figure, the same pixels as upstream's, every object reported."""
    img, state = tiny_results
    n = len(state["scores"])
    assert n == 12 and state["masks"].shape == [n, 1, 60, 90]
    ref_results = {k: torch.from_numpy(state[k].numpy()) for k in ("masks", "boxes", "scores")}
    official_viz.plot_results(img, ref_results)
    want = canvas(plt.gcf())
    plt.close("all")
    viz.plot_results(img, state)
    fig = plt.gcf()
    assert tuple(fig.get_size_inches()) == (12.0, 8.0)
    got = canvas(fig)
    assert got.shape == (8 * 40, 12 * 40, 4)
    np.testing.assert_array_equal(got, want)
    plt.close("all")
    assert capsys.readouterr().out == f"found {n} object(s)\n" * 2
    viz.plot_results(np.asarray(img), {k: state[k].numpy() for k in ("masks", "boxes", "scores")})
    np.testing.assert_array_equal(canvas(plt.gcf()), want)  # numpy in: the same drawing
    plt.close("all")
    with pytest.raises(ValueError, match="'boxes'"):
        viz.plot_results(img, {"masks": state["masks"], "scores": state["scores"]})


def test_drawing_helpers(plt, viz, official_viz, tiny_results):
    """show_mask / show_box / show_points (the SAM 1 task notebooks), plot_mask / plot_bbox."""
    img, state = tiny_results
    background = np.asarray(img)
    mask = state["masks"][3]  # 1 x H x W, Paddle bool
    mask_np = mask.numpy()
    pts = np.array([[[20, 15]], [[70, 40]], [[50, 30]]])
    labels = np.array([[1], [0], [1]])
    box = np.array([10, 12, 60, 50])

    def seeded(draw):
        def run(ax):
            np.random.seed(5)
            draw(ax)

        return run

    pairs = [
        (
            lambda ax: official_viz.show_mask(mask_np, ax, obj_id=3),
            lambda ax: viz.show_mask(mask, ax, obj_id=3),
        ),
        (
            seeded(lambda ax: official_viz.show_mask(mask_np, ax, random_color=True)),
            seeded(lambda ax: viz.show_mask(mask, ax, random_color=True)),
        ),
        (lambda ax: official_viz.show_box(box, ax), lambda ax: viz.show_box(box, ax)),
        (
            lambda ax: official_viz.show_points(pts, labels, ax),
            lambda ax: viz.show_points(paddle.to_tensor(pts), labels, ax),
        ),
        (
            lambda ax: official_viz.plot_mask(torch.from_numpy(mask_np[0]), "c", ax),
            lambda ax: viz.plot_mask(mask[0], "c", ax),
        ),
    ]
    for fmt, b in (("XYXY", [0.1, 0.2, 0.5, 0.7]), ("XYWH", [5, 6, 30, 20]), ("CxCyWH", box)):
        rel = fmt == "XYXY"

        def ref_draw(ax, fmt=fmt, b=b, rel=rel):
            official_viz.plot_bbox(60, 90, b, fmt, rel, "m", "dashed", text="obj", ax=ax)

        def our_draw(ax, fmt=fmt, b=b, rel=rel):
            viz.plot_bbox(60, 90, b, fmt, rel, "m", "dashed", text="obj", ax=ax)

        pairs.append((ref_draw, our_draw))
    for ref_draw, our_draw in pairs:
        draw_both(plt, ref_draw, our_draw, background)
    with pytest.raises(ValueError, match="box_format"):
        viz.plot_bbox(60, 90, box, box_format="YXYX")
    with pytest.raises(ValueError, match="coords must be"):
        viz.show_points(pts, labels[:2], None)


def video_outputs(n_frames: int = 3, h: int = 48, w: int = 64) -> tuple[list, dict]:
    """Frames and tracker-style outputs (``out_obj_ids``, ``out_probs``, relative
    ``out_boxes_xywh``, ``out_binary_masks``), object 7 empty on frame 1."""
    frames = [image(h, w, seed=20 + t) for t in range(n_frames)]
    outputs = {}
    for t in range(n_frames):
        masks = np.zeros((2, h, w), dtype=bool)
        masks[0, 5 + t : 20 + t, 8:30] = True
        if t != 1:
            masks[1, 25:40, 30 + 2 * t : 55] = True
        outputs[t] = {
            "out_obj_ids": np.array([2, 7]),
            "out_probs": np.array([0.91, 0.4], dtype=np.float32),
            "out_boxes_xywh": np.array(
                [[8 / w, (5 + t) / h, 22 / w, 15 / h], [0.45, 0.5, 0.4, 0.3]], dtype=np.float32
            ),
            "out_binary_masks": masks,
        }
    return frames, outputs


def copy_outputs(outputs: dict) -> dict:
    return {t: dict(out) for t, out in outputs.items()}


def test_video_notebook_helpers(plt, viz, official_viz, tmp_path):
    """load_frame, prepare_masks_for_visualization, visualize_formatted_frame_output (the
    video notebook), visualize_frame_output and visualize_prompt_overlay."""
    frames, outputs = video_outputs()
    png = tmp_path / "frame.png"
    Image.fromarray(frames[0]).save(png)
    for frame in (frames[0], Image.fromarray(frames[0]), str(png)):
        np.testing.assert_array_equal(viz.load_frame(frame), official_viz.load_frame(frame))
    with pytest.raises(ValueError, match="Invalid video frame"):
        viz.load_frame(str(tmp_path / "missing.png"))

    prepared = viz.prepare_masks_for_visualization(copy_outputs(outputs))
    want = official_viz.prepare_masks_for_visualization(copy_outputs(outputs))
    assert prepared.keys() == want.keys()
    for t in want:
        assert list(prepared[t]) == list(want[t])
        for obj_id in want[t]:
            np.testing.assert_array_equal(prepared[t][obj_id], want[t][obj_id])
    assert list(prepared[1]) == [2]  # the empty mask is dropped

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plt.show() on Agg
        calls = [
            dict(frame_idx=1, video_frames=frames, outputs_list=[prepared]),
            dict(
                frame_idx=0,
                video_frames=frames,
                outputs_list=[prepared, {0: {2: prepared[0][2]}}, {5: {}}],
                titles=["all", "one", "missing"],
                points_list=[np.array([[10, 12], [40, 30]]), None, None],
                points_labels_list=[np.array([1, 0]), None, None],
                title_suffix=" (test)",
                prompt_info={
                    "boxes": [[0.1, 0.1, 0.3, 0.4]],
                    "points": [[0.5, 0.5], [0.2, 0.8]],
                    "point_labels": [1, 0],
                },
            ),
            # one frame's {obj_id: mask}: upstream takes it when no key is a Python int
            dict(frame_idx=2, video_frames=frames, outputs_list={np.int64(3): prepared[2][2]}),
        ]
        for kwargs in calls:
            draw_both(
                plt,
                lambda ax, kw=kwargs: official_viz.visualize_formatted_frame_output(**kw),
                lambda ax, kw=kwargs: viz.visualize_formatted_frame_output(**kw),
            )
        draw_both(
            plt,
            lambda ax: official_viz.visualize_frame_output(2, frames, outputs[2], figsize=(4, 3)),
            lambda ax: viz.visualize_frame_output(2, frames, outputs[2], figsize=(4, 3)),
        )
        prompts = dict(
            title="prompts",
            text_prompt="a red square",
            point_prompts=[[0.2, 0.3], [0.6, 0.7]],
            point_labels=[1, 0],
            bounding_boxes=[[0.1, 0.1, 0.4, 0.3], [0.5, 0.5, 0.3, 0.3]],
            box_labels=[1],
            obj_id=4,
        )
        draw_both(
            plt,
            lambda ax: official_viz.visualize_prompt_overlay(1, frames, **prompts),
            lambda ax: viz.visualize_prompt_overlay(1, frames, **prompts),
        )
    with pytest.raises(ValueError, match="2 titles for 1 sets"):
        viz.visualize_formatted_frame_output(0, frames, [prepared], titles=["a", "b"])


def test_masklet_renders(plt, viz, official_viz, tmp_path, capsys):
    """render_masklet_frame, draw_masks_to_frame (SA-Co notebooks), COCO conversion, the
    side-by-side and single figures, saved images and videos."""
    import cv2
    from pycocotools import mask as mask_utils

    frames, outputs = video_outputs()
    out = dict(outputs[0], out_probs=[0.91, None])  # a track without a score
    small = dict(out, out_binary_masks=out["out_binary_masks"][:, ::2, ::2])  # resized
    float_frame = frames[0].astype(np.float32) / 255.0
    for frame, o, idx in ((frames[0], out, 3), (frames[1], small, None), (float_frame, out, 0)):
        want = official_viz.render_masklet_frame(frame, o, frame_idx=idx, alpha=0.4)
        got = viz.render_masklet_frame(frame, o, frame_idx=idx, alpha=0.4)
        assert got.dtype == np.uint8 and got.shape == frames[0].shape
        np.testing.assert_array_equal(got, want)

    colors = viz.pascal_color_map()[1:]
    masks = [m.astype(np.uint8) for m in outputs[0]["out_binary_masks"]]
    for frame in (frames[0], np.ones_like(frames[0]) * 255):
        want = official_viz.draw_masks_to_frame(frame=frame, masks=masks, colors=colors[:2])
        got = viz.draw_masks_to_frame(frame=frame, masks=masks, colors=colors[:2])
        np.testing.assert_array_equal(got, want)

    h, w = frames[0].shape[:2]
    rles = [mask_utils.encode(np.asfortranarray(m)) for m in masks]
    anns = [
        {"segmentation": rles[0], "bbox": [8, 5, 22, 15], "score": 0.8},
        {"segmentation": rles[1], "bbox": [0.45, 0.5, 0.4, 0.3], "score": 0.3},
        {"segmentation": rles[1], "score": 0.6},
        {"segmentation": mask_utils.encode(np.zeros((h, w), np.uint8, order="F")), "score": 0.1},
    ]
    for is_prediction in (False, True):
        want = official_viz.convert_coco_to_masklet_format(
            anns, {"height": h, "width": w}, is_prediction
        )
        got = viz.convert_coco_to_masklet_format(anns, {"height": h, "width": w}, is_prediction)
        assert got.keys() == want.keys()
        for key in ("out_boxes_xywh", "out_probs", "out_obj_ids"):
            assert got[key] == want[key], key
        for a, b in zip(got["out_binary_masks"], want["out_binary_masks"], strict=True):
            np.testing.assert_array_equal(a, b)
    gt = viz.convert_coco_to_masklet_format(anns, {"height": h, "width": w})
    pred = viz.convert_coco_to_masklet_format(anns[:2], {"height": h, "width": w}, True)
    draw_both(
        plt,
        lambda ax: official_viz.save_side_by_side_visualization(frames[0], gt, pred, "a cat"),
        lambda ax: viz.save_side_by_side_visualization(frames[0], gt, pred, "a cat"),
    )
    draw_both(
        plt,
        lambda ax: official_viz.single_visualization(frames[0], pred, "title"),
        lambda ax: viz.single_visualization(frames[0], pred, "title"),
    )

    viz.save_masklet_image(frames[0], out, str(tmp_path / "one.png"), frame_idx=0)
    want = official_viz.render_masklet_frame(frames[0], out, frame_idx=0)
    np.testing.assert_array_equal(np.array(Image.open(tmp_path / "one.png")), want)
    video = tmp_path / "masklets.mp4"
    viz.save_masklet_video(frames, outputs, str(video), fps=5)
    capture = cv2.VideoCapture(str(video))
    count = 0
    while capture.read()[0]:
        count += 1
    capture.release()
    assert count == len(frames)
    assert "saved to" in capsys.readouterr().out


def test_saco_annotation_helpers(viz, official_viz, tmp_path, monkeypatch):
    """The SA-Co tables: paths as upstream; pandas asked for by name when missing."""
    for dataset in ("saco_veval_sav_val", "saco_veval_yt1b_test", "sa_fari_test"):
        assert viz.get_media_dir("/m", dataset) == official_viz.get_media_dir("/m", dataset)
    with pytest.raises(ValueError, match="Dataset nope not found"):
        viz.get_media_dir("/m", "nope")
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        viz.get_annot_dfs([str(tmp_path / "x.json")])
