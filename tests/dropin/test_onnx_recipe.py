"""Upstream's onnxruntime recipe for the SAM ONNX decoder, unchanged, on the decoder that
``export_onnx`` writes and on the official one (``torch.onnx.export`` of
segment-anything's ``SamOnnxModel``, as its export script does), same tiny random weights.

The feeds are built the way the official notebook (``onnx_model_example.ipynb``) builds them:
the official predictor's image embedding, points mapped with ``ResizeLongestSide.apply_coords``,
a padding point (0, 0) labelled -1 when there is no box, box corners labelled 2 and 3, zeros or
the previous low-res logits as ``mask_input`` with ``has_mask_input``, float32 ``orig_im_size``;
and the way the web demo's ``onnxModelAPI.tsx`` does (clicks times the resize scale). Both
decoders get the same feeds and must give the same answer. The official export is made from
upstream's main-branch ``SamOnnxModel`` (see :func:`official_onnx_model_class`); the eager
official module, as released, is compared with ours directly too.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import paddle
import pytest

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")
pytest.importorskip("segment_anything")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("paddle2onnx")

from paddle_sam.export.onnx import EXTRA_METRICS_OUTPUTS, export_onnx  # noqa: E402
from tests.helpers.pairs import image, make_pair  # noqa: E402
from tests.helpers.specs import TINY  # noqa: E402

# the official export script's options, one decoder pair each
VARIANTS = {
    "all-masks": {},
    "single-mask": {"return_single_mask": True},
    "single-mask-stability": {"return_single_mask": True, "use_stability_score": True},
    "all-masks-stability-gelu-tanh": {"use_stability_score": True, "gelu_approximate": True},
    "extra-metrics": {"return_single_mask": True, "return_extra_metrics": True},
}
SIZES = [(150, 230), (240, 97)]  # landscape and portrait: the crop of the padding differs
MIN_AGREEMENT = 0.999  # fraction of mask pixels equal
SCORE_ATOL = 1e-4


@pytest.fixture(scope="module")
def models():
    """(official torch Sam, our Sam) with the same perturbed random weights."""
    return make_pair(TINY, seed=11)


def _session(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def official_onnx_model_class():
    """segment-anything's ``SamOnnxModel`` as on upstream's main branch.

    The 1.0 release (the PyPI package installed here) crops the padding with Python ints
    taken from a tensor, so the traced graph keeps the dummy input's crop and its masks are
    wrong for any other aspect ratio (upstream issue #56); upstream's main branch slices with
    the int64 tensor instead (pull request #58). This subclass does the same, so the
    reference export is the fixed one.
    """
    from segment_anything.utils.onnx import SamOnnxModel

    class FixedSamOnnxModel(SamOnnxModel):
        def mask_postprocessing(self, masks, orig_im_size):
            size = (self.img_size, self.img_size)
            masks = F.interpolate(masks, size=size, mode="bilinear", align_corners=False)
            kept = self.resize_longest_image_size(orig_im_size, self.img_size).to(torch.int64)
            masks = masks[..., : kept[0], : kept[1]]
            h, w = orig_im_size.to(torch.int64)
            return F.interpolate(masks, size=(h, w), mode="bilinear", align_corners=False)

    return FixedSamOnnxModel


def export_official(sam, path, **options) -> None:
    """The official export script's steps (``scripts/export_onnx_model.py``) for ``sam``."""
    gelu_tanh = options.pop("gelu_approximate", False)
    options.setdefault("return_single_mask", False)
    sam = copy.deepcopy(sam)  # the GELU switch stays out of the shared model
    onnx_model = official_onnx_model_class()(sam, **options)
    if gelu_tanh:
        for module in onnx_model.modules():
            if isinstance(module, torch.nn.GELU):
                module.approximate = "tanh"
    embed_dim = sam.prompt_encoder.embed_dim
    embed_size = sam.prompt_encoder.image_embedding_size
    side = sam.image_encoder.img_size
    gen = torch.Generator().manual_seed(0)
    dummy = {
        "image_embeddings": torch.randn(1, embed_dim, *embed_size, generator=gen),
        "point_coords": torch.randint(0, side, (1, 5, 2), generator=gen).float(),
        "point_labels": torch.randint(0, 4, (1, 5), generator=gen).float(),
        "mask_input": torch.randn(1, 1, *[4 * x for x in embed_size], generator=gen),
        "has_mask_input": torch.tensor([1.0]),
        "orig_im_size": torch.tensor([1500.0, 2250.0]),
    }
    onnx_model(**dummy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            onnx_model,
            tuple(dummy.values()),
            str(path),
            export_params=True,
            opset_version=17,
            do_constant_folding=True,
            input_names=list(dummy),
            output_names=["masks", "iou_predictions", "low_res_masks"],
            dynamic_axes={"point_coords": {1: "num_points"}, "point_labels": {1: "num_points"}},
            dynamo=False,  # the script's TorchScript exporter (the dynamo one needs onnxscript)
        )


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def decoders(request, models, tmp_path_factory):
    """(official session, our session, options, our file) for one variant."""
    ref, ours = models
    options = VARIANTS[request.param]
    d = tmp_path_factory.mktemp(f"onnx-{request.param}")
    export_official(ref, d / "official.onnx", **options)
    export_onnx(ours, d / "ours", **options)
    ours_path = d / "ours" / "prompt_decoder.onnx"
    return _session(d / "official.onnx"), _session(ours_path), options, ours_path


@pytest.fixture(scope="module")
def official_predictors(models):
    """The official ``SamPredictor`` with each test image set, by size."""
    from segment_anything import SamPredictor

    out = {}
    for i, (h, w) in enumerate(SIZES):
        predictor = SamPredictor(models[0])
        predictor.set_image(image(h, w, seed=20 + i))
        out[(h, w)] = predictor
    return out


def notebook_feeds(predictor, input_point, input_label, input_box=None, mask_input=None):
    """The decoder feeds as the official notebook builds them."""
    h, w = predictor.original_size
    embedding = predictor.get_image_embedding().cpu().numpy()
    if input_box is None:  # a padding point, as there is no box
        coord = np.concatenate([input_point, np.array([[0.0, 0.0]])], axis=0)[None, :, :]
        label = np.concatenate([input_label, np.array([-1])], axis=0)[None, :]
    else:
        coord = np.concatenate([input_point, input_box.reshape(2, 2)], axis=0)[None, :, :]
        label = np.concatenate([input_label, np.array([2, 3])], axis=0)[None, :]
    coord = predictor.transform.apply_coords(coord, (h, w)).astype(np.float32)
    mask_size = [4 * x for x in predictor.model.prompt_encoder.image_embedding_size]
    return {
        "image_embeddings": embedding,
        "point_coords": coord,
        "point_labels": label.astype(np.float32),
        "mask_input": (
            np.zeros((1, 1, *mask_size), dtype=np.float32) if mask_input is None else mask_input
        ),
        "has_mask_input": np.array([0.0 if mask_input is None else 1.0], dtype=np.float32),
        "orig_im_size": np.array((h, w), dtype=np.float32),
    }


def web_demo_feeds(predictor, clicks):
    """The decoder feeds as the web demo builds them: clicks (x, y, label) times the scale
    to the model's long side, a padding point, float32 sizes, no mask input."""
    h, w = predictor.original_size
    scale = predictor.model.image_encoder.img_size / max(h, w)
    n = len(clicks)
    coords = np.zeros(2 * (n + 1), np.float32)
    labels = np.zeros(n + 1, np.float32)
    for i, (x, y, kind) in enumerate(clicks):
        coords[2 * i], coords[2 * i + 1], labels[i] = x * scale, y * scale, kind
    labels[n] = -1.0
    mask_size = [4 * x for x in predictor.model.prompt_encoder.image_embedding_size]
    return {
        "image_embeddings": predictor.get_image_embedding().cpu().numpy(),
        "point_coords": coords.reshape(1, n + 1, 2),
        "point_labels": labels.reshape(1, n + 1),
        "orig_im_size": np.array([h, w], np.float32),
        "mask_input": np.zeros((1, 1, *mask_size), np.float32),
        "has_mask_input": np.array([0.0], np.float32),
    }


def compare(expected, got, options, threshold=0.0, what=""):
    """Same output shapes, masks equal on >= MIN_AGREEMENT of the pixels, scores within
    SCORE_ATOL; returns the agreement and the largest score and low-res logit differences."""
    assert len(got) == len(expected)
    for e, g in zip(expected, got, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype, (what, g.shape, e.shape)
    masks_e, masks_g = expected[0] > threshold, got[0] > threshold
    agreement = float((masks_e == masks_g).mean())
    assert agreement >= MIN_AGREEMENT, (what, agreement)
    np.testing.assert_allclose(got[1], expected[1], atol=SCORE_ATOL, rtol=0, err_msg=what)
    np.testing.assert_allclose(got[-1], expected[-1], atol=1e-3, rtol=0, err_msg=what)
    if options.get("return_extra_metrics"):
        stability_e, stability_g = expected[2], got[2]
        np.testing.assert_allclose(stability_g, stability_e, atol=1e-3, rtol=0, err_msg=what)
        pixels = masks_e.shape[-1] * masks_e.shape[-2]
        assert np.abs(got[3] - expected[3]).max() <= (1 - MIN_AGREEMENT) * pixels, what
    return agreement, np.abs(got[1] - expected[1]).max(), np.abs(got[-1] - expected[-1]).max()


def test_same_interface(decoders):
    """Input names, dtypes and shapes (the point count symbolic) as the official file; the
    outputs' names and dtypes; with the tanh GELU, no erf left."""
    import onnx

    official, ours, options, path = decoders
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert ("Erf" in ops) != bool(options.get("gelu_approximate"))

    def inputs(s):
        return [(i.name, i.type, i.shape) for i in s.get_inputs()]

    assert inputs(ours) == inputs(official)
    assert [i.shape for i in ours.get_inputs()][1] == [1, "num_points", 2]
    assert [o.type for o in ours.get_outputs()] == [o.type for o in official.get_outputs()]
    names = [o.name for o in ours.get_outputs()]
    if options.get("return_extra_metrics"):  # the official script names the first three only
        assert names == list(EXTRA_METRICS_OUTPUTS)
    else:
        assert names == [o.name for o in official.get_outputs()]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_notebook_recipe(decoders, official_predictors, size):
    official, ours, options, _ = decoders
    predictor = official_predictors[size]
    h, w = size
    threshold = predictor.model.mask_threshold
    figures = []

    def run(feeds, what):
        expected = official.run(None, feeds)
        got = ours.run(None, feeds)
        figures.append(compare(expected, got, options, threshold, what))
        return expected

    # a click, no mask input
    point, label = np.array([[0.55 * w, 0.4 * h]]), np.array([1])
    first = run(notebook_feeds(predictor, point, label), "click")
    # two clicks with the previous low-res logits as the mask input (the official
    # decoder's, so both get the same feeds; with all masks returned, the best one)
    low_res, scores = first[-1], first[1]
    k = int(np.argmax(scores[0]))
    points, labels = np.array([[0.55 * w, 0.4 * h], [0.2 * w, 0.7 * h]]), np.array([1, 1])
    run(notebook_feeds(predictor, points, labels, mask_input=low_res[:, k : k + 1]), "mask in")
    # a box and a negative click, no padding point
    box = np.array([0.1 * w, 0.2 * h, 0.7 * w, 0.9 * h])
    run(notebook_feeds(predictor, np.array([[0.4 * w, 0.5 * h]]), np.array([0]), box), "box")
    # a box alone
    run(notebook_feeds(predictor, np.zeros((0, 2)), np.zeros(0), box), "box alone")
    # the web demo's feeds: two clicks
    clicks = [(0.3 * w, 0.3 * h, 1), (0.8 * w, 0.6 * h, 0)]
    run(web_demo_feeds(predictor, clicks), "web demo")
    agreement = min(f[0] for f in figures)
    scores, logits = max(f[1] for f in figures), max(f[2] for f in figures)
    print(
        f"\n{options} {size}: mask agreement min {agreement:.6f}, score diff max {scores:.2e}, "
        f"low-res logit diff max {logits:.2e}"
    )


@pytest.mark.parametrize("options", list(VARIANTS.values()), ids=list(VARIANTS))
def test_sam_onnx_model_in_dygraph(models, official_predictors, options):
    """``paddle_sam.utils.onnx.SamOnnxModel`` (the drop-in of the official module) against
    the official module, both eager, same feeds."""
    from segment_anything.utils.onnx import SamOnnxModel as OfficialSamOnnxModel

    from paddle_sam.export.onnx import approximate_gelu
    from paddle_sam.utils.onnx import SamOnnxModel

    ref, sam = models
    options = dict(options)
    gelu_tanh = options.pop("gelu_approximate", False)
    options.setdefault("return_single_mask", False)
    ref = copy.deepcopy(ref)
    official = OfficialSamOnnxModel(ref, **options)
    if gelu_tanh:
        for module in official.modules():
            if isinstance(module, torch.nn.GELU):
                module.approximate = "tanh"
    ours = SamOnnxModel(sam, **options)
    predictor = official_predictors[SIZES[0]]
    h, w = SIZES[0]
    for n in (1, 3):
        points = np.array([[0.3 * w, 0.6 * h], [0.5 * w, 0.5 * h], [0.9 * w, 0.1 * h]])[:n]
        feeds = notebook_feeds(predictor, points, np.ones(n))
        expected = [t.numpy() for t in official(*[torch.from_numpy(v) for v in feeds.values()])]
        with paddle.no_grad(), approximate_gelu(ours, gelu_tanh):
            got = ours(*[paddle.to_tensor(v) for v in feeds.values()])
        compare(expected, [t.numpy() for t in got], options, what=f"{n} points")
