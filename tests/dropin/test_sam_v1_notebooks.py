"""segment-anything's notebooks, run on paddle-sam after swapping the imports.

The code cells of the official predictor and automatic mask generator example notebooks run
twice, cell by cell: once as written (``segment_anything``, torch) and once with
``segment_anything`` replaced by ``paddle_sam`` in their imports, nothing else changed, with
the same weights in the official model and in ours. Every mask, score and logit the cells
produce is compared between the two runs.

What differs from the notebooks, in both runs alike: the photos (not in the repository) are
replaced by generated images for the predictor and by the repository's example.png for the
generator; instead of the released ViT-H checkpoint the predictor runs a tiny random-weight
SAM and the generator the bundled small model (trained on generated shapes) with sharpened
outputs; the device is ``"cpu"``; the ``sys.path`` set-up is left out; and ``plt`` is a
stand-in that draws nothing.

Also here: the upstream module paths (``paddle_sam.utils.transforms``, ``paddle_sam.utils.amg``,
``paddle_sam.modeling``), the ``*_torch`` entry points given PyTorch tensors, and devices.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from PIL import Image

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("segment_anything")

from paddle_sam import build_sam  # noqa: E402
from tests.helpers.pairs import image, make_pair  # noqa: E402
from tests.helpers.specs import TINY  # noqa: E402
from tests.predict.test_amg import _compare_records  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[2] / "paddle_sam"
MASK_AGREEMENT = 0.999

# ------------------------------------------------------------------------ the notebooks' cells
# (name, code as in the notebook, the variables the cell produces that are compared)

PREDICTOR_CELLS = [
    (
        "imports",
        """
        import numpy as np
        import torch
        import cv2
        """,
        (),
    ),
    (
        "helpers",
        """
        def show_mask(mask, ax, random_color=False):
            if random_color:
                color = np.concatenate([np.random.random(3), np.array([0.6])], axis=0)
            else:
                color = np.array([30/255, 144/255, 255/255, 0.6])
            h, w = mask.shape[-2:]
            mask_image = mask.reshape(h, w, 1) * color.reshape(1, 1, -1)
            ax.imshow(mask_image)

        def show_points(coords, labels, ax, marker_size=375):
            pos_points = coords[labels==1]
            neg_points = coords[labels==0]
            ax.scatter(pos_points[:, 0], pos_points[:, 1], color='green', marker='*', s=marker_size, edgecolor='white', linewidth=1.25)
            ax.scatter(neg_points[:, 0], neg_points[:, 1], color='red', marker='*', s=marker_size, edgecolor='white', linewidth=1.25)

        def show_box(box, ax):
            x0, y0 = box[0], box[1]
            w, h = box[2] - box[0], box[3] - box[1]
            ax.add_patch(plt.Rectangle((x0, y0), w, h, edgecolor='green', facecolor=(0,0,0,0), lw=2))
        """,  # noqa: E501
        (),
    ),
    (
        "example image",
        """
        image = truck  # the notebook reads its truck photo with OpenCV here

        plt.figure(figsize=(10,10))
        plt.imshow(image)
        plt.axis('on')
        plt.show()
        """,
        (),
    ),
    (
        "model",
        """
        from segment_anything import sam_model_registry, SamPredictor

        device = "cpu"

        sam = tiny_sam  # the notebook loads ViT-H through sam_model_registry here
        sam.to(device=device)

        predictor = SamPredictor(sam)
        """,
        (),
    ),
    ("set image", "predictor.set_image(image)", ()),
    (
        "point",
        """
        input_point = np.array([[500, 375]])
        input_label = np.array([1])

        plt.figure(figsize=(10,10))
        plt.imshow(image)
        show_points(input_point, input_label, plt.gca())
        plt.axis('on')
        plt.show()
        """,
        (),
    ),
    (
        "predict point, multimask",
        """
        masks, scores, logits = predictor.predict(
            point_coords=input_point,
            point_labels=input_label,
            multimask_output=True,
        )
        masks.shape  # (number_of_masks) x H x W

        for i, (mask, score) in enumerate(zip(masks, scores)):
            plt.figure(figsize=(10,10))
            plt.imshow(image)
            show_mask(mask, plt.gca())
            show_points(input_point, input_label, plt.gca())
            plt.title(f"Mask {i+1}, Score: {score:.3f}", fontsize=18)
            plt.axis('off')
            plt.show()
        """,
        ("masks", "scores", "logits"),
    ),
    (
        "two points with the best mask",
        """
        input_point = np.array([[500, 375], [1125, 625]])
        input_label = np.array([1, 1])

        mask_input = logits[np.argmax(scores), :, :]  # Choose the model's best mask

        masks, _, _ = predictor.predict(
            point_coords=input_point,
            point_labels=input_label,
            mask_input=mask_input[None, :, :],
            multimask_output=False,
        )
        masks.shape

        plt.figure(figsize=(10,10))
        plt.imshow(image)
        show_mask(masks, plt.gca())
        show_points(input_point, input_label, plt.gca())
        plt.axis('off')
        plt.show()
        """,
        ("mask_input", "masks"),
    ),
    (
        "foreground and background point",
        """
        input_point = np.array([[500, 375], [1125, 625]])
        input_label = np.array([1, 0])

        mask_input = logits[np.argmax(scores), :, :]  # Choose the model's best mask

        masks, _, _ = predictor.predict(
            point_coords=input_point,
            point_labels=input_label,
            mask_input=mask_input[None, :, :],
            multimask_output=False,
        )

        plt.figure(figsize=(10, 10))
        plt.imshow(image)
        show_mask(masks, plt.gca())
        show_points(input_point, input_label, plt.gca())
        plt.axis('off')
        plt.show()
        """,
        ("masks",),
    ),
    (
        "box",
        """
        input_box = np.array([425, 600, 700, 875])

        masks, _, _ = predictor.predict(
            point_coords=None,
            point_labels=None,
            box=input_box[None, :],
            multimask_output=False,
        )

        plt.figure(figsize=(10, 10))
        plt.imshow(image)
        show_mask(masks[0], plt.gca())
        show_box(input_box, plt.gca())
        plt.axis('off')
        plt.show()
        """,
        ("masks",),
    ),
    (
        "box and point",
        """
        input_box = np.array([425, 600, 700, 875])
        input_point = np.array([[575, 750]])
        input_label = np.array([0])

        masks, _, _ = predictor.predict(
            point_coords=input_point,
            point_labels=input_label,
            box=input_box,
            multimask_output=False,
        )

        plt.figure(figsize=(10, 10))
        plt.imshow(image)
        show_mask(masks[0], plt.gca())
        show_box(input_box, plt.gca())
        show_points(input_point, input_label, plt.gca())
        plt.axis('off')
        plt.show()
        """,
        ("masks",),
    ),
    (
        "batched boxes",
        """
        input_boxes = torch.tensor([
            [75, 275, 1725, 850],
            [425, 600, 700, 875],
            [1375, 550, 1650, 800],
            [1240, 675, 1400, 750],
        ], device=predictor.device)

        transformed_boxes = predictor.transform.apply_boxes_torch(input_boxes, image.shape[:2])
        masks, _, _ = predictor.predict_torch(
            point_coords=None,
            point_labels=None,
            boxes=transformed_boxes,
            multimask_output=False,
        )
        masks.shape  # (batch_size) x (num_predicted_masks_per_input) x H x W

        plt.figure(figsize=(10, 10))
        plt.imshow(image)
        for mask in masks:
            show_mask(mask.cpu().numpy(), plt.gca(), random_color=True)
        for box in input_boxes:
            show_box(box.cpu().numpy(), plt.gca())
        plt.axis('off')
        plt.show()
        """,
        ("transformed_boxes", "masks"),
    ),
    (
        "batched input: images and boxes",
        """
        image1 = image  # truck.jpg from above
        image1_boxes = torch.tensor([
            [75, 275, 1725, 850],
            [425, 600, 700, 875],
            [1375, 550, 1650, 800],
            [1240, 675, 1400, 750],
        ], device=sam.device)

        image2 = groceries  # the notebook reads its groceries photo here
        image2_boxes = torch.tensor([
            [450, 170, 520, 350],
            [350, 190, 450, 350],
            [500, 170, 580, 350],
            [580, 170, 640, 350],
        ], device=sam.device)
        """,
        (),
    ),
    (
        "batched input: transform",
        """
        from segment_anything.utils.transforms import ResizeLongestSide
        resize_transform = ResizeLongestSide(sam.image_encoder.img_size)

        def prepare_image(image, transform, device):
            image = transform.apply_image(image)
            image = torch.as_tensor(image, device=device.device)
            return image.permute(2, 0, 1).contiguous()
        """,
        (),
    ),
    (
        "batched input: run the model",
        """
        batched_input = [
             {
                 'image': prepare_image(image1, resize_transform, sam),
                 'boxes': resize_transform.apply_boxes_torch(image1_boxes, image1.shape[:2]),
                 'original_size': image1.shape[:2]
             },
             {
                 'image': prepare_image(image2, resize_transform, sam),
                 'boxes': resize_transform.apply_boxes_torch(image2_boxes, image2.shape[:2]),
                 'original_size': image2.shape[:2]
             }
        ]

        batched_output = sam(batched_input, multimask_output=False)

        batched_output[0].keys()

        fig, ax = plt.subplots(1, 2, figsize=(20, 20))

        ax[0].imshow(image1)
        for mask in batched_output[0]['masks']:
            show_mask(mask.cpu().numpy(), ax[0], random_color=True)
        for box in image1_boxes:
            show_box(box.cpu().numpy(), ax[0])
        ax[0].axis('off')

        ax[1].imshow(image2)
        for mask in batched_output[1]['masks']:
            show_mask(mask.cpu().numpy(), ax[1], random_color=True)
        for box in image2_boxes:
            show_box(box.cpu().numpy(), ax[1])
        ax[1].axis('off')

        plt.tight_layout()
        plt.show()
        """,
        ("batched_output",),
    ),
]

AMG_CELLS = [
    (
        "imports",
        """
        import numpy as np
        import torch
        import cv2
        """,
        (),
    ),
    (
        "helpers",
        """
        def show_anns(anns):
            if len(anns) == 0:
                return
            sorted_anns = sorted(anns, key=(lambda x: x['area']), reverse=True)
            ax = plt.gca()
            ax.set_autoscale_on(False)

            img = np.ones((sorted_anns[0]['segmentation'].shape[0], sorted_anns[0]['segmentation'].shape[1], 4))
            img[:,:,3] = 0
            for ann in sorted_anns:
                m = ann['segmentation']
                color_mask = np.concatenate([np.random.random(3), [0.35]])
                img[m] = color_mask
            ax.imshow(img)
        """,  # noqa: E501
        (),
    ),
    (
        "example image",
        """
        image = dog  # the notebook reads its dog photo with OpenCV here

        plt.figure(figsize=(20,20))
        plt.imshow(image)
        plt.axis('off')
        plt.show()
        """,
        (),
    ),
    (
        "model",
        """
        from segment_anything import sam_model_registry, SamAutomaticMaskGenerator, SamPredictor

        device = "cpu"

        sam = tiny_sam  # the notebook loads ViT-H through sam_model_registry here
        sam.to(device=device)

        mask_generator = SamAutomaticMaskGenerator(sam)
        """,
        (),
    ),
    (
        "generate",
        """
        masks = mask_generator.generate(image)

        print(len(masks))
        print(masks[0].keys())

        plt.figure(figsize=(20,20))
        plt.imshow(image)
        show_anns(masks)
        plt.axis('off')
        plt.show()
        """,
        ("masks",),
    ),
    (
        "generate with custom options",
        """
        mask_generator_2 = SamAutomaticMaskGenerator(
            model=sam,
            points_per_side=32,
            pred_iou_thresh=0.86,
            stability_score_thresh=0.92,
            crop_n_layers=1,
            crop_n_points_downscale_factor=2,
            min_mask_region_area=100,  # Requires open-cv to run post-processing
        )

        masks2 = mask_generator_2.generate(image)

        len(masks2)

        plt.figure(figsize=(20,20))
        plt.imshow(image)
        show_anns(masks2)
        plt.axis('off')
        plt.show()
        """,
        ("masks2",),
    ),
]


# ------------------------------------------------------------------------ running them


class NoPlot:
    """Stands in for ``matplotlib.pyplot`` and its figures and axes: every call draws nothing."""

    def __getattr__(self, name: str) -> NoPlot:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> NoPlot:
        return self

    def __getitem__(self, index: Any) -> NoPlot:
        return self

    def __iter__(self):
        return iter((self, self))  # fig, ax = plt.subplots(...)


def swap_imports(code: str) -> str:
    """The issue's recipe: ``segment_anything`` -> ``paddle_sam`` in the import statements."""
    lines = []
    for line in code.splitlines():
        words = line.split()
        if (
            len(words) > 1
            and words[0] in ("from", "import")
            and words[1].split(".")[0] == "segment_anything"
        ):
            line = line.replace("segment_anything", "paddle_sam", 1)
        lines.append(line)
    return "\n".join(lines)


def snapshot(value: Any) -> Any:
    """A copy of a cell's result with every tensor (torch or paddle) as a numpy array."""
    if isinstance(value, paddle.Tensor):
        return value.numpy()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(v) for v in value)
    return value


def run_notebook(
    cells: list, namespace: dict[str, Any], swap: bool
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Execute the cells in order in ``namespace``; returns each cell's compared variables
    (as numpy) and the final namespace."""
    namespace = {"__name__": "notebook", "plt": NoPlot(), **namespace}
    results = {}
    for name, code, keep in cells:
        code = textwrap.dedent(code).strip()
        if swap:
            code = swap_imports(code)
        exec(compile(code, f"<notebook cell {name!r}>", "exec"), namespace)  # noqa: S102
        results[name] = {k: snapshot(namespace[k]) for k in keep}
    return results, namespace


def assert_masks_agree(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert ours.dtype == ref.dtype == np.bool_, (what, ours.dtype, ref.dtype)
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    agreement = float((ours == ref).mean())
    assert agreement >= MASK_AGREEMENT, f"{what}: {agreement:.6f} of the pixels agree"


def assert_same_result(name: str, ours: Any, ref: Any) -> None:
    """Compare one notebook variable from our run with the official run's."""
    if name in ("masks", "masks2") and isinstance(ref, list):  # generator records
        _compare_records(ours, ref, "binary_mask")
    elif name == "masks":
        assert_masks_agree(ours, ref, name)
    elif name == "batched_output":
        assert len(ours) == len(ref)
        for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
            assert set(a) == set(b) == {"masks", "iou_predictions", "low_res_logits"}
            assert_masks_agree(a["masks"], b["masks"], f"batched_output[{i}]['masks']")
            np.testing.assert_allclose(a["iou_predictions"], b["iou_predictions"], atol=1e-5)
            np.testing.assert_allclose(a["low_res_logits"], b["low_res_logits"], atol=1e-5)
    else:  # scores, logits, mask_input (values below 1), transformed_boxes (pixels)
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-5, err_msg=name)


def compare_runs(cells: list, ours: dict, ref: dict) -> int:
    """Every compared variable of every cell; returns how many were compared."""
    compared = 0
    for name, _, keep in cells:
        for var in keep:
            assert_same_result(var, ours[name][var], ref[name][var])
            compared += 1
    return compared


@pytest.fixture(scope="module")
def one_torch_thread():
    # torch's intra-op threads and Paddle's OpenMP workers oversubscribe small CPU machines
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------ predictor notebook


@pytest.fixture(scope="module")
def predictor_runs(one_torch_thread):
    ref_sam, our_sam = make_pair(TINY, seed=2)
    images = {"truck": image(1200, 1800, seed=1), "groceries": image(480, 720, seed=2)}
    ref, _ = run_notebook(PREDICTOR_CELLS, {"tiny_sam": ref_sam, **images}, swap=False)
    ours, namespace = run_notebook(PREDICTOR_CELLS, {"tiny_sam": our_sam, **images}, swap=True)
    return ours, ref, namespace


def test_predictor_notebook_runs_with_swapped_imports(predictor_runs):
    """The paddle run really used paddle-sam: its objects and results are Paddle's."""
    import paddle_sam

    _, _, ns = predictor_runs
    assert isinstance(ns["predictor"], paddle_sam.SamPredictor)
    assert ns["ResizeLongestSide"] is paddle_sam.utils.transforms.ResizeLongestSide
    assert ns["sam"].device == ns["predictor"].device == "cpu"
    # batched prompts: torch boxes in (the notebook's torch.tensor), paddle results out
    assert isinstance(ns["input_boxes"], torch.Tensor)
    for value in (ns["transformed_boxes"], ns["masks"], ns["batched_output"][1]["masks"]):
        assert isinstance(value, paddle.Tensor)


@pytest.mark.parametrize("cell", [c[0] for c in PREDICTOR_CELLS if c[2]])
def test_predictor_notebook_cell_matches_official(predictor_runs, cell):
    ours, ref, _ = predictor_runs
    keep = dict((c[0], c[2]) for c in PREDICTOR_CELLS)[cell]
    for var in keep:
        assert_same_result(var, ours[cell][var], ref[cell][var])


def test_predictor_notebook_masks_are_not_trivial(predictor_runs):
    """Agreement on empty or full masks would prove little: every mask of every cell covers
    between 5 % and 95 % of its image."""
    _, ref, _ = predictor_runs
    masks = [ref[c]["masks"] for c, _, keep in PREDICTOR_CELLS if "masks" in keep]
    masks += [out["masks"] for out in ref["batched input: run the model"]["batched_output"]]
    fractions = np.concatenate([m.reshape(-1, *m.shape[-2:]).mean(axis=(1, 2)) for m in masks])
    assert len(fractions) == 3 + 4 * 1 + 4 + 4 + 4
    assert ((fractions > 0.05) & (fractions < 0.95)).all(), fractions


# ------------------------------------------------------------------------ generator notebook


def bundled_pair():
    """(official Sam, ours) with the weights of the bundled model, trained on generated shapes:
    its masks are objects of the example image, where random weights give noise that covers
    the whole image (and one mask after NMS)."""
    from paddle_sam.align.reference import build_reference_sam
    from paddle_sam.convert.sam_v1 import expected_layout
    from paddle_sam.loading.sam_v1 import DEFAULT_MODEL, load_sam

    ours = load_sam(DEFAULT_MODEL)
    ref = build_reference_sam(ours.spec)
    _, linear = expected_layout(ours.spec)  # Paddle keeps Linear weights as [in, out]
    state = {k: v.numpy() for k, v in ours.state_dict().items()}
    state = {k: np.ascontiguousarray(v.T) if k in linear else v for k, v in state.items()}
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    return ref, ours


def make_confident_(ref_sam, our_sam, logit_scale: float, iou_shift: float) -> None:
    """Scale the mask logits and shift the IoU predictions, identically in both models, so
    that part of the masks pass the generator's default quality filters (predicted IoU 0.88,
    stability 0.95 at offset 1.0), which the small bundled model's rarely do."""
    with torch.no_grad():
        for mlp in ref_sam.mask_decoder.output_hypernetworks_mlps:
            mlp.layers[-1].weight.mul_(logit_scale)
            mlp.layers[-1].bias.mul_(logit_scale)
        ref_sam.mask_decoder.iou_prediction_head.layers[-1].bias.add_(iou_shift)
    for mlp in our_sam.mask_decoder.output_hypernetworks_mlps:
        last = mlp.layers[-1]
        last.weight.set_value(last.weight * logit_scale)
        last.bias.set_value(last.bias * logit_scale)
    head = our_sam.mask_decoder.iou_prediction_head.layers[-1]
    head.bias.set_value(head.bias + iou_shift)


@pytest.fixture(scope="module")
def amg_runs(one_torch_thread):
    ref_sam, our_sam = bundled_pair()
    make_confident_(ref_sam, our_sam, logit_scale=10.0, iou_shift=0.4)
    dog = np.asarray(Image.open(PACKAGE / "assets" / "example.png").convert("RGB"))
    ref, _ = run_notebook(AMG_CELLS, {"tiny_sam": ref_sam, "dog": dog}, swap=False)
    ours, namespace = run_notebook(AMG_CELLS, {"tiny_sam": our_sam, "dog": dog}, swap=True)
    return ours, ref, namespace


def test_generator_notebook_matches_official(amg_runs):
    import paddle_sam

    ours, ref, ns = amg_runs
    assert isinstance(ns["mask_generator"], paddle_sam.SamAutomaticMaskGenerator)
    assert compare_runs(AMG_CELLS, ours, ref) == 2  # record by record, every field


def test_generator_notebook_masks_are_objects(amg_runs):
    """Many distinct, localised masks (a comparison of one full-image mask would prove
    little), and with the custom options some come from the crops."""
    _, ref, ns = amg_runs
    h, w = ns["image"].shape[:2]
    for cell, var in (("generate", "masks"), ("generate with custom options", "masks2")):
        records = ref[cell][var]
        assert len(records) >= 20, (cell, len(records))
        assert len({tuple(r["bbox"]) for r in records}) == len(records)
        box_areas = [r["bbox"][2] * r["bbox"][3] / (h * w) for r in records]
        assert np.median(box_areas) < 0.1, (cell, box_areas)
    crops = {tuple(r["crop_box"]) for r in ref["generate with custom options"]["masks2"]}
    assert len(crops - {(0, 0, w, h)}) >= 2, crops


# ------------------------------------------------------------------------ module paths


def test_upstream_module_paths_re_export_the_real_objects():
    import segment_anything.modeling as upstream_modeling
    import segment_anything.utils.amg as upstream_amg

    import paddle_sam.modeling as modeling
    from paddle_sam.models import sam_v1 as models
    from paddle_sam.predict.sam_v1 import amg_utils, transforms
    from paddle_sam.utils import amg
    from paddle_sam.utils import transforms as utils_transforms

    assert utils_transforms.ResizeLongestSide is transforms.ResizeLongestSide
    for name in ("Sam", "ImageEncoderViT", "PromptEncoder", "MaskDecoder", "TwoWayTransformer"):
        assert hasattr(upstream_modeling, name)
        assert getattr(modeling, name) is getattr(models, name)
    public = {
        name
        for name, value in vars(upstream_amg).items()
        if not name.startswith("_")
        and getattr(value, "__module__", None) == "segment_anything.utils.amg"
    }
    assert len(public) >= 15
    missing = sorted(public - set(amg.__all__))
    assert not missing, (
        f"segment_anything.utils.amg names missing in paddle_sam.utils.amg: {missing}"
    )
    for name in amg.__all__:
        assert getattr(amg, name) is getattr(amg_utils, name)


def test_torch_named_transforms_match_upstream_on_torch_tensors():
    from segment_anything.utils.transforms import ResizeLongestSide as Upstream

    from paddle_sam.utils.transforms import ResizeLongestSide

    ours, ref = ResizeLongestSide(256), Upstream(256)
    size = (481, 733)
    coords = torch.tensor([[[0, 0], [732, 480]], [[100.5, 300.25], [17, 3]]])
    boxes = torch.tensor([[10, 20, 700, 470], [0, 0, 733, 481]])
    out = ours.apply_coords_torch(coords, size)
    assert isinstance(out, paddle.Tensor) and out.dtype == paddle.float32
    np.testing.assert_array_equal(out.numpy(), ref.apply_coords_torch(coords, size).numpy())
    out = ours.apply_boxes_torch(boxes, size)
    np.testing.assert_array_equal(out.numpy(), ref.apply_boxes_torch(boxes, size).numpy())
    # paddle tensors in give the same answer
    same = ours.apply_boxes_torch(paddle.to_tensor(boxes.numpy()), size)
    np.testing.assert_array_equal(same.numpy(), out.numpy())
    # the image form (upstream's reads the size from the wrong axes, so no reference here)
    img = torch.rand(1, 3, 40, 60)
    resized = ours.apply_image_torch(img)
    assert isinstance(resized, paddle.Tensor) and list(resized.shape) == [1, 3, 171, 256]
    np.testing.assert_array_equal(
        resized.numpy(), ours.apply_image_paddle(paddle.to_tensor(img.numpy())).numpy()
    )


def test_mask_to_rle_pytorch_matches_upstream():
    from segment_anything.utils.amg import mask_to_rle_pytorch as upstream

    from paddle_sam.utils.amg import mask_to_rle_pytorch

    rng = np.random.default_rng(0)
    masks = torch.from_numpy(rng.random((3, 17, 23)) > 0.6)
    masks[0] = False
    assert mask_to_rle_pytorch(masks) == upstream(masks)
    assert mask_to_rle_pytorch(paddle.to_tensor(masks.numpy())) == upstream(masks)


# ------------------------------------------------------------------------ torch-named entry points


@pytest.fixture(scope="module")
def tiny_model():
    return build_sam(TINY)


def test_predict_torch_and_set_torch_image_take_torch_tensors(tiny_model):
    from paddle_sam import SamPredictor

    img = image(90, 130, seed=7)
    p = SamPredictor(tiny_model)
    p.set_image(img)
    embedding = p.get_image_embedding().numpy()
    coords = np.array([[[30.0, 40.0], [100.0, 20.0]], [[5.0, 80.0], [60.0, 60.0]]])
    coords = p.transform.apply_coords(coords, p.original_size)
    labels = np.array([[1, 0], [1, 1]])
    boxes = p.transform.apply_boxes(np.array([[0, 0, 60, 50], [20, 30, 120, 85]]), p.original_size)
    expected = p.predict_paddle(
        paddle.to_tensor(coords, dtype="float32"),
        paddle.to_tensor(labels),
        paddle.to_tensor(boxes, dtype="float32"),
    )
    got = p.predict_torch(
        torch.as_tensor(coords, dtype=torch.float),
        torch.as_tensor(labels),
        boxes=torch.as_tensor(boxes, dtype=torch.float),
    )
    for a, b in zip(got, expected, strict=True):
        assert isinstance(a, paddle.Tensor)
        np.testing.assert_array_equal(a.cpu().numpy(), b.numpy())

    resized = p.transform.apply_image(img)
    q = SamPredictor(tiny_model)
    q.set_torch_image(torch.from_numpy(resized).permute(2, 0, 1)[None], img.shape[:2])
    np.testing.assert_array_equal(q.get_image_embedding().numpy(), embedding)
    assert q.original_size == img.shape[:2] and q.input_size == p.input_size


def test_sam_forward_input_errors(tiny_model):
    with pytest.raises(ValueError, match=r"batched_input\[0\] has no 'original_size'"):
        tiny_model([{"image": paddle.zeros([3, 256, 200])}], multimask_output=False)
    with pytest.raises(ValueError, match=r"3 x H x W"):
        tiny_model(
            [{"image": torch.zeros(256, 200, 3), "original_size": (256, 200)}],
            multimask_output=False,
        )
    with pytest.raises(ValueError, match="go together"):
        tiny_model(
            [
                {
                    "image": paddle.zeros([3, 256, 200]),
                    "original_size": (256, 200),
                    "point_coords": paddle.zeros([1, 1, 2]),
                }
            ],
            multimask_output=False,
        )
    with pytest.raises(TypeError, match="must be a dict"):
        tiny_model([paddle.zeros([3, 256, 200])], multimask_output=False)


# ------------------------------------------------------------------------ devices


def test_device_strings_work_for_paddle_and_torch(tiny_model):
    from paddle_sam import SamPredictor

    predictor = SamPredictor(tiny_model)
    expected = "cuda:0" if tiny_model.pixel_mean.place.is_gpu_place() else "cpu"
    assert tiny_model.device == predictor.device == expected
    x = paddle.to_tensor([1.0, 2.0], place=predictor.device)
    assert x.place._equals(tiny_model.pixel_mean.place)
    if expected == "cpu" or torch.cuda.is_available():
        assert torch.tensor([1, 2], device=predictor.device).device.type == expected.split(":")[0]


def test_to_returns_the_model_and_keeps_its_other_arguments():
    model = build_sam(TINY)
    assert model.to("cpu") is model
    assert model.to(device="cpu") is model
    assert model.to(device=torch.device("cpu")) is model
    assert model.to(device=paddle.CPUPlace()) is model
    assert model.device == "cpu"
    assert model.to(dtype="float64") is model  # dtype still passes through to paddle
    assert model.image_encoder.patch_embed.proj.weight.dtype == paddle.float64
    assert model.pixel_mean.dtype == paddle.float64


@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="checks the CPU-only build's error")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "gpu", "gpu:0", "CUDA:1"])
def test_gpu_device_on_a_cpu_build_is_a_clear_error(tiny_model, device):
    with pytest.raises(ValueError, match=rf"device '{device}' needs a GPU build.*CPU-only"):
        tiny_model.to(device=device)
    with pytest.raises(ValueError, match="CPU-only"):
        tiny_model.to(device)
    assert tiny_model.device == "cpu"


@pytest.mark.skipif(not paddle.is_compiled_with_cuda(), reason="needs a GPU build of Paddle")
def test_to_cuda_on_a_gpu_build():
    model = build_sam(TINY)
    assert model.to(device="cuda") is model
    assert model.device == "cuda:0"
    assert paddle.to_tensor([1.0], place=model.device).place.is_gpu_place()
    assert model.to("cpu").device == "cpu"
