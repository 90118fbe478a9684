"""SAM 3 fine-tuning data (paddle_sam.train.sam3.data) and the concept scenes
(paddle_sam.train.synthetic): COCO files written here, broken ones included.

Where torch and the official sam3 are installed, the same files go through upstream's own
loader on the CPU (``COCO_FROM_JSON``, ``Sam3ImageDataset`` with the roboflow_v100 training or
validation transforms, ``collate_fn_api``): the queries, targets, images and masks must agree.
Tiny images and a 128 px model resolution keep the file to seconds.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import numpy as np
import paddle
import pytest
from PIL import Image

from paddle_sam.train.data import SkipLog
from paddle_sam.train.sam3.data import (
    VISUAL_TEXT,
    ConceptDataset,
    collate_concepts,
    resize_scales,
)
from paddle_sam.train.sam3.sam3_loss import make_find_targets
from paddle_sam.train.synthetic import (
    CONCEPT_COLOURS,
    CONCEPT_PHRASES,
    CONCEPT_SHAPES,
    concept_scene,
    synthetic_scene,
    write_concept_dataset,
)

R = 128  # model resolution of these tests (1008 in the configs)
SMALL = dict(resolution=R, min_size=64)
CONCEPT_SIZES = [[160, 120]]


@pytest.fixture(autouse=True)
def _quiet_skips():
    """SkipLog warns about the first skips of each kind; the tests read the counts instead."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="skipped", category=UserWarning)
        yield


def _image(path: Path, w: int, h: int, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)


def _write(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _rle(mask: np.ndarray, compressed: bool = True) -> dict:
    from pycocotools import mask as mask_utils

    if not compressed:  # uncompressed: column-major run lengths, starting with zeros
        runs, value = [0], 0
        for v in mask.T.reshape(-1).tolist():
            if v == value:
                runs[-1] += 1
            else:
                runs.append(1)
                value = v
        return {"size": list(mask.shape), "counts": runs}
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}


def _ellipse(h, w, cx, cy, rx, ry) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1


def _extent_xywh(mask: np.ndarray) -> list[int]:
    ys, xs = np.nonzero(mask)
    return [
        int(xs.min()),
        int(ys.min()),
        int(xs.max() - xs.min() + 1),
        int(ys.max() - ys.min() + 1),
    ]


def _clean_coco(root: Path, crowd: bool = True) -> Path:
    """Three images (non-square, different sizes), three categories, masks as polygons,
    compressed and uncompressed RLE, one box-only annotation, one crowd, an image with none."""
    sizes = {1: (96, 72), 2: (80, 100), 3: (64, 64)}
    images = []
    for iid, (w, h) in sizes.items():
        _image(root / "images" / f"im{iid}.png", w, h, seed=iid)
        images.append({"id": iid, "file_name": f"im{iid}.png", "width": w, "height": h})
    anns = []

    def add(iid, cat, seg, bbox, iscrowd=0):
        anns.append(
            {
                "id": len(anns) + 1,
                "image_id": iid,
                "category_id": cat,
                "segmentation": seg,
                "bbox": bbox,
                "area": 1.0,
                "iscrowd": iscrowd,
            }
        )

    m1 = _ellipse(72, 96, 30, 30, 14, 9)
    add(1, 1, _rle(m1), _extent_xywh(m1))
    add(1, 1, [[60, 10, 90, 12, 85, 40, 62, 35]], [60, 10, 30, 30])
    m3 = _ellipse(72, 96, 70, 55, 8, 12)
    add(1, 3, _rle(m3, compressed=False), _extent_xywh(m3))
    add(1, 3, [], [5.5, 50.25, 20.5, 15.0])  # box only
    m5 = _ellipse(100, 80, 40, 60, 20, 25)
    add(2, 2, _rle(m5), _extent_xywh(m5))
    if crowd:
        m6 = _ellipse(100, 80, 20, 20, 10, 10)
        add(2, 1, _rle(m6), _extent_xywh(m6), iscrowd=1)
    cats = [{"id": 1, "name": "red apple"}, {"id": 2, "name": "pear"}, {"id": 3, "name": "fig"}]
    return _write(
        root / "annotations.json", {"images": images, "annotations": anns, "categories": cats}
    )


# ------------------------------------------------------------------------------ broken input


def test_bad_annotations_are_skipped_and_counted(tmp_path):
    _image(tmp_path / "images" / "a.png", 64, 48)
    square = [[10, 10, 30, 10, 30, 30, 10, 30]]
    good_rle = _rle(_ellipse(48, 64, 40, 20, 6, 6))

    def ann(i, **kw):
        return {"id": i, "image_id": 1, "category_id": 1, "iscrowd": 0, **kw}

    anns = [
        ann(1, bbox=[10, 10, 20, 20], segmentation=square),  # good
        ann(2, bbox=[10, 10, 0, 5]),  # degenerate
        ann(3, bbox=[100, 10, 5, 5]),  # outside the image
        ann(4, bbox=[1, 2, "x", 4]),  # malformed
        ann(5, segmentation=[[0, 0, 200, 0, 200, 200]]),  # mask only: polygon outside
        ann(6, segmentation=[["a", "b", "c", "d", "e", "f"]]),  # mask only: not numbers
        ann(7, segmentation={"size": [48, 64], "counts": "garbage!!"}),  # mask only: bad RLE
        ann(8, segmentation={"size": [48, 64], "counts": [5, 3]}),  # runs too short
        ann(9, bbox=[40, 5, 10, 10], segmentation={"size": [48, 64], "counts": ""}),
        ann(10, bbox=[1, 1, 5, 5], category_id=9),  # unknown category
        ann(11, bbox=[1, 1, 5, 5], category_id=2, iscrowd=1, segmentation=good_rle),  # crowd
        {"id": 12, "image_id": 77, "category_id": 1, "bbox": [1, 1, 2, 2]},  # unknown image
        ann(13),  # neither bbox nor segmentation
        ann(14, segmentation=good_rle),  # good, mask only
        "not an annotation",
    ]
    doc = {
        "images": [
            {"id": 1, "file_name": "a.png", "width": 64, "height": 48},
            {"id": 2, "file_name": "gone.png", "width": 64, "height": 48},  # no file
            {"file_name": "no_id.png"},
        ],
        "annotations": anns,
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}],
    }
    skips = SkipLog()
    ds = ConceptDataset(_write(tmp_path / "annotations.json", doc), skips=skips, **SMALL)
    assert dict(skips.counts) == {
        "degenerate bbox (width or height <= 0)": 1,
        "bbox outside the image": 1,
        "malformed bbox": 1,
        "polygon outside the image": 1,
        "undecodable segmentation": 1,
        "invalid RLE (runs do not cover the image)": 3,
        "unknown category": 1,
        "crowd annotation (FilterCrowds)": 1,
        "annotation of an unknown image": 1,
        "bad annotation entry": 1,
        "annotation without bbox or segmentation": 1,
        "missing image file": 1,
        "bad image entry": 1,
    }
    assert "gone.png" in skips.summary() and "annotation 3 " in str(skips.examples)
    assert ds.with_masks and ds.num_images == 1 and len(ds) == 2
    cat, dog = (ds[i] for i in ds.queries(0))
    # cat: annotations 1, 9 (good box, bad RLE: box kept without a mask) and 14; it lost some
    assert cat.text == "cat" and len(cat.boxes) == 3 and not cat.is_exhaustive
    assert cat.is_valid_mask.tolist() == [True, False, True]
    assert cat.masks[0].any() and not cat.masks[1].any() and cat.masks[2].any()
    # dog: only a crowd, so a negative query with no targets (upstream's FilterCrowds)
    assert dog.text == "dog" and dog.boxes.shape == (0, 4) and dog.masks.shape == (0, R, R)
    assert dog.is_exhaustive


def test_unreadable_image_falls_back_to_the_next_sample(tmp_path):
    _image(tmp_path / "images" / "ok.png", 32, 32)
    (tmp_path / "images" / "bad.png").write_bytes(b"\x89PNG not really")
    doc = {
        "images": [
            {"id": 1, "file_name": "bad.png", "width": 32, "height": 32},
            {"id": 2, "file_name": "ok.png", "width": 32, "height": 32},
        ],
        "annotations": [{"id": 1, "image_id": 2, "category_id": 1, "bbox": [1, 1, 9, 9]}],
        "categories": [{"id": 1, "name": "thing"}],
    }
    ds = ConceptDataset(_write(tmp_path / "annotations.json", doc), **SMALL)
    assert ds[0].image_id == 2 and ds.skips.counts == {"unreadable image": 1}


@pytest.mark.parametrize(
    "content, error",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "expected a COCO JSON object"),
        ('{"images": [], "annotations": []}', "no 'categories' list"),
        ('{"images": {}, "annotations": [], "categories": []}', "no 'images' list"),
        ('{"images": [], "annotations": [], "categories": []}', "has no categories"),
        ('{"images": [], "annotations": [], "categories": [{"id": 1}]}', "bad category"),
        (
            '{"images": [], "annotations": [], "categories": '
            '[{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]}',
            "category id 1 appears twice",
        ),
        ('{"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}]}', "no usable"),
    ],
)
def test_broken_json_files_raise_errors_naming_the_file(tmp_path, content, error):
    path = tmp_path / "broken.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=error) as info:
        ConceptDataset(path, **SMALL)
    assert str(path) in str(info.value)


def test_missing_files_and_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.json"):
        ConceptDataset(tmp_path / "nothing.json")
    with pytest.raises(FileNotFoundError, match="_annotations.coco.json or annotations.json"):
        ConceptDataset(tmp_path)
    path = _write(tmp_path / "a.json", {"images": [], "annotations": [], "categories": []})
    with pytest.raises(FileNotFoundError, match="image folder not found"):
        ConceptDataset(path, images=tmp_path / "nope")


# ------------------------------------------------------------------------------ layouts


def test_roboflow_layout_box_only(tmp_path):
    """Roboflow's COCO export: <split>/_annotations.coco.json with the images beside it, a
    supercategory as category 0, bbox-only annotations (segmentation [])."""
    split = tmp_path / "train"
    for i in range(2):
        _image(split / f"img{i}_jpg.rf.abc.jpg", 80, 60, seed=i)
    doc = {
        "info": {"description": "roboflow"},
        "categories": [
            {"id": 0, "name": "cells", "supercategory": "none"},
            {"id": 1, "name": "platelet", "supercategory": "cells"},
            {"id": 2, "name": "red blood cell", "supercategory": "cells"},
        ],
        "images": [
            {"id": i, "file_name": f"img{i}_jpg.rf.abc.jpg", "width": 80, "height": 60}
            for i in range(2)
        ],
        "annotations": [
            {"id": 0, "image_id": 0, "category_id": 2, "bbox": [10, 5, 20, 30], "area": 600,
             "segmentation": [], "iscrowd": 0},
            {"id": 1, "image_id": 0, "category_id": 2, "bbox": [50, 20, 25, 30], "area": 750,
             "segmentation": [], "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 0, 80, 60], "area": 4800,
             "segmentation": [], "iscrowd": 0},
        ],
    }  # fmt: skip
    _write(split / "_annotations.coco.json", doc)
    by_folder = ConceptDataset(split, train=False, **SMALL)
    by_file = ConceptDataset(split / "_annotations.coco.json", train=False, **SMALL)
    assert by_folder.image_dir == split and not by_folder.with_masks
    assert len(by_folder) == len(by_file) == 6  # 2 images x 3 categories
    a, b = by_folder[1], by_file[1]
    assert np.array_equal(a.image, b.image) and np.array_equal(a.boxes, b.boxes)
    samples = [by_folder[i] for i in by_folder.queries(0)]
    assert [s.text for s in samples] == ["cells", "platelet", "red blood cell"]
    assert [len(s.boxes) for s in samples] == [0, 0, 2] and samples[2].masks is None
    # val mode: resized to R x R, so the boxes are the pixel boxes over the image size
    cx, cy, w, h = samples[2].boxes[0]
    assert np.allclose([cx, cy, w, h], [20 / 80, 20 / 60, 20 / 80, 30 / 60], atol=1e-6)
    batch = collate_concepts(samples)
    assert batch["targets"]["masks"] is None and batch["targets"]["is_valid_mask"] is None
    assert batch["targets"]["num_boxes"].tolist() == [0, 0, 2]
    renamed = ConceptDataset(split, train=False, prompts={2: "erythrocyte"}, **SMALL)
    assert renamed[2].text == "erythrocyte"


def test_mask_only_annotations_get_the_masks_extents(tmp_path):
    out = write_concept_dataset(tmp_path / "c", 2, seed=4, sizes=[[R, R]])
    doc = json.loads((out / "annotations.json").read_text())
    extents = {a["id"]: a["bbox"] for a in doc["annotations"]}
    for a in doc["annotations"]:
        del a["bbox"]
    _write(out / "annotations.json", doc)
    # R = the image size and no training resize: the canvas is the image itself
    ds = ConceptDataset(out, train=False, resolution=R)
    assert ds.with_masks and not ds.skips.counts
    n = 0
    for i in range(len(ds)):
        s = ds[i]
        for box, mask in zip(s.boxes, s.masks, strict=True):
            ys, xs = np.nonzero(mask)
            x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
            expected = np.asarray([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0]) / R
            np.testing.assert_allclose(box, expected, atol=1e-6)
            n += 1
    assert n == len(extents) > 0


# ------------------------------------------------------------------------------ queries


def test_positives_and_negatives(tmp_path):
    out = write_concept_dataset(tmp_path / "c", 3, seed=1, sizes=CONCEPT_SIZES)
    ds = ConceptDataset(out, seed=0, **SMALL)
    assert list(ds.categories.values()) == list(CONCEPT_PHRASES)
    assert len(ds) == 3 * len(CONCEPT_PHRASES)  # every phrase asked on every image
    for i in range(ds.num_images):
        scene = concept_scene(1, i, CONCEPT_SIZES)
        present = {p for j in range(len(scene.masks)) for p in scene.phrases(j)}
        for q in ds.queries(i):
            s = ds[q]
            assert s.is_exhaustive and len(s.boxes) == len(s.masks) == len(s.object_ids)
            if s.text in present:
                want = sum(s.text in scene.phrases(j) for j in range(len(scene.masks)))
                assert len(s.boxes) == want
            else:
                assert s.boxes.shape == (0, 4) and s.masks.shape == (0, R, R)
    capped = ConceptDataset(out, seed=0, max_negatives=2, **SMALL)
    firsts = []
    for epoch in range(4):
        capped.set_epoch(epoch)
        texts = [capped[q].text for q in capped.queries(0)]
        scene = concept_scene(1, 0, CONCEPT_SIZES)
        present = {p for j in range(len(scene.masks)) for p in scene.phrases(j)}
        negatives = [t for t in texts if t not in present]
        assert len(negatives) == 2 and present <= set(texts)
        firsts.append(tuple(negatives))
    assert len(set(firsts)) > 1  # the negatives are drawn again each epoch
    none = ConceptDataset(out, include_negatives=False, **SMALL)
    assert all(len(none[i].boxes) > 0 for i in range(len(none)))


def test_samples_are_a_function_of_seed_epoch_and_index(tmp_path):
    out = write_concept_dataset(tmp_path / "c", 2, seed=2, sizes=CONCEPT_SIZES)
    kw = dict(seed=5, max_negatives=3, exemplar_prob=0.5, **SMALL)
    a, b = ConceptDataset(out, **kw), ConceptDataset(out, **kw)
    a.set_epoch(1)
    b.set_epoch(1)
    backwards = {i: a[i] for i in reversed(range(len(a)))}  # another order: no hidden state
    for i in range(len(b)):
        x, y = backwards[i], b[i]
        assert x.text == y.text and (x.resized, x.pad) == (y.resized, y.pad)
        for f in ("image", "boxes", "masks", "object_ids", "exemplar_boxes"):
            assert np.array_equal(getattr(x, f), getattr(y, f)), f
    geometry = {(a[q].resized, a[q].pad) for q in a.queries(0)}
    assert len(geometry) == 1  # the queries of an image share its resize and padding
    draws = set()
    for epoch in range(6):
        a.set_epoch(epoch)
        draws.add((a[0].resized, a[0].pad))
    assert len(draws) > 1
    assert all(s in resize_scales(R, 64) for s, _ in draws)
    assert resize_scales() == list(range(480, 1009, 32))  # upstream: 480, 512, ..., 992
    other = ConceptDataset(out, **{**kw, "seed": 6})
    other.set_epoch(5)
    assert any(
        (other[q].resized, other[q].pad, other[q].text) != (a[q].resized, a[q].pad, a[q].text)
        for q in range(len(a))
    )


def test_exemplar_prompts(tmp_path):
    out = write_concept_dataset(tmp_path / "c", 2, seed=3, sizes=CONCEPT_SIZES)
    ds = ConceptDataset(out, exemplar_prob=1.0, **SMALL)
    keep = ConceptDataset(out, exemplar_prob=1.0, exemplar_keeps_text=True, **SMALL)
    exact = ConceptDataset(out, exemplar_prob=1.0, box_noise_std=0.0, **SMALL)
    for i in range(len(ds)):
        s = ds[i]
        if len(s.boxes) == 0:
            assert s.exemplar_boxes.shape == (0, 4) and s.text != VISUAL_TEXT
            continue
        assert s.text == VISUAL_TEXT and keep[i].text == ds.categories[s.category_id]
        assert s.exemplar_boxes.shape == (1, 4) and s.exemplar_labels.tolist() == [1]
        # without noise the exemplar is one of the targets' boxes
        e = exact[i].exemplar_boxes[0]
        assert np.isclose(exact[i].boxes, e, atol=1e-6).all(axis=1).any()
        # with noise it stays near one of them
        assert (np.abs(s.boxes - s.exemplar_boxes[0]).max(axis=1) < 0.25).any()
    assert not ConceptDataset(out, **SMALL)[0].exemplar_boxes.size  # off by default


# ------------------------------------------------------------------------------ batches


def test_collate_layout_and_make_find_targets(tmp_path):
    out = write_concept_dataset(tmp_path / "c", 3, seed=1, sizes=CONCEPT_SIZES)
    ds = ConceptDataset(out, exemplar_prob=0.5, max_negatives=4, **SMALL)
    batches = ds.image_batches(images_per_batch=2, shuffle=True)
    assert sorted(q for b in batches for q in b) == list(range(len(ds)))
    assert [len(b) for b in ds.image_batches(2, drop_last=True)] == [len(batches[0])]
    samples = [ds[q] for q in batches[0]]
    B = len(samples)
    batch = collate_concepts(samples)
    assert batch["images"].shape == [2, 3, R, R] and batch["images"].dtype == paddle.float32
    assert batch["img_ids"].dtype == paddle.int64 and batch["img_ids"].shape == [B]
    rows = batch["img_ids"].numpy()
    for s, row in zip(samples, rows, strict=True):
        assert np.array_equal(batch["images"][int(row)].numpy(), s.image)
    assert batch["texts"] == [s.text for s in samples]
    assert [batch["text_batch"][i] for i in batch["text_ids"].numpy()] == batch["texts"]
    E = max(len(s.exemplar_boxes) for s in samples)
    fi = batch["find_input"]
    assert fi.input_boxes.shape == [E, B, 4] and fi.input_boxes_label.shape == [E, B]
    assert fi.input_boxes_mask.shape == [B, E] and fi.input_boxes_mask.dtype == paddle.bool
    assert batch["geometric_prompt"].box_embeddings.shape == [E, B, 4]
    for b, s in enumerate(samples):
        n = len(s.exemplar_boxes)
        assert fi.input_boxes_mask[b].numpy().tolist() == [False] * n + [True] * (E - n)
    # the targets are make_find_targets' own output on the samples
    ref = make_find_targets(
        [paddle.to_tensor(s.boxes) for s in samples],
        masks=[paddle.to_tensor(s.masks) for s in samples],
        is_valid_mask=[paddle.to_tensor(s.is_valid_mask) for s in samples],
        is_exhaustive=[s.is_exhaustive for s in samples],
        object_ids=[paddle.to_tensor(s.object_ids) for s in samples],
    )
    got = batch["targets"]
    assert set(got) == set(ref)
    for key, value in ref.items():
        if value is None:
            assert got[key] is None, key
        else:
            assert got[key].dtype == value.dtype and np.array_equal(got[key], value), key
    T = sum(len(s.boxes) for s in samples)
    assert got["boxes"].shape == [T, 4] and got["masks"].shape == [T, R, R]
    assert got["masks"].dtype == paddle.bool and got["num_boxes"].dtype == paddle.int64
    own = collate_concepts(samples, share_images=False)
    assert own["images"].shape == [B, 3, R, R] and own["img_ids"].tolist() == list(range(B))
    with pytest.raises(ValueError, match="at least one"):
        collate_concepts([])


# ------------------------------------------------------------------------------ concept scenes


def _nearest_colour(pixels: np.ndarray) -> np.ndarray:
    names = list(CONCEPT_COLOURS)
    palette = np.asarray([CONCEPT_COLOURS[n] for n in names], np.float32)
    d = ((pixels[:, None, :].astype(np.float32) - palette[None]) ** 2).sum(-1)
    return np.asarray(names)[d.argmin(1)]


def test_concept_scenes_draw_what_their_phrases_say():
    for index in range(6):
        scene = concept_scene(7, index, CONCEPT_SIZES)
        again = concept_scene(7, index, CONCEPT_SIZES)
        assert np.array_equal(scene.image, again.image)
        assert (scene.kinds, scene.colours) == (again.kinds, again.colours)
        assert scene.image.shape == (120, 160, 3) and len(scene.masks) >= 1
        covered = np.zeros(scene.image.shape[:2], bool)
        for j in reversed(range(len(scene.masks))):
            mask, colour, shape = scene.masks[j], scene.colours[j], scene.kinds[j]
            assert scene.phrases(j) == (f"{colour} {shape}", shape)
            assert set(scene.phrases(j)) <= set(CONCEPT_PHRASES) and shape in CONCEPT_SHAPES
            assert mask.sum() >= 150  # visible and large enough to keep
            # exact after occlusion: the shape minus every shape painted after it
            assert np.array_equal(mask, scene.shape_masks[j] & ~covered)
            covered |= scene.shape_masks[j]
            assert (_nearest_colour(scene.image[mask]) == colour).all()
    assert not np.array_equal(concept_scene(7, 0).image, concept_scene(7, 1).image)
    # the SAM v1 scenes of the same seed and index are untouched by the concept stream
    assert synthetic_scene(7, 0).image.shape == (480, 640, 3)


def test_concept_dataset_reads_back(tmp_path):
    out = write_concept_dataset(tmp_path / "c", 2, seed=9, sizes=CONCEPT_SIZES)
    with pytest.raises(FileExistsError):
        write_concept_dataset(out, 1)
    ds = ConceptDataset(out, train=False, resolution=R)
    for i in range(ds.num_images):
        scene = concept_scene(9, i, CONCEPT_SIZES)
        for q in ds.queries(i):
            s = ds[q]
            instances = [j for j in range(len(scene.masks)) if s.text in scene.phrases(j)]
            assert len(s.boxes) == len(instances)
            areas = sorted(int(_resize_like(scene.masks[j]).sum()) for j in instances)
            assert sorted(int(m.sum()) for m in s.masks) == areas


def _resize_like(mask: np.ndarray) -> np.ndarray:
    f = Image.fromarray(mask.astype(np.float32)).resize((R, R), Image.BILINEAR)
    return np.asarray(f) > 0.5


# ------------------------------------------------------------------------------ upstream


@pytest.fixture(scope="module")
def upstream():
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    pytest.importorskip("sam3.train.data.sam3_image_dataset")
    import sam3.train.data.coco_json_loaders as loaders
    import sam3.train.data.collator as collator
    import sam3.train.data.sam3_image_dataset as dataset
    import sam3.train.transforms.basic as basic
    import sam3.train.transforms.basic_for_api as api
    import sam3.train.transforms.filter_query_transforms as filters
    import sam3.train.transforms.point_sampling as points
    import sam3.train.transforms.segmentation as segmentation

    class NS:
        pass

    ns = NS()
    for name, mod in dict(
        loaders=loaders,
        collator=collator,
        dataset=dataset,
        basic=basic,
        api=api,
        filters=filters,
        points=points,
        segmentation=segmentation,
    ).items():
        setattr(ns, name, mod)
    return ns


def _upstream_transforms(up, train: bool):
    """The roboflow_v100 config's train_transforms / val_transforms at resolution R (the val
    ones plus FilterCrowds and DecodeRle, to compare masks too)."""
    flt = up.filters.FlexibleFilterFindGetQueries
    if not train:
        steps = [
            flt(query_filter=up.filters.FilterCrowds()),
            up.segmentation.DecodeRle(),
            up.api.RandomResizeAPI(
                sizes=R,
                max_size=up.basic.get_random_resize_max_size(size=R),
                square=True,
                consistent_transform=False,
            ),
            up.api.ToTensorAPI(),
            up.api.NormalizeAPI(mean=[0.5] * 3, std=[0.5] * 3),
        ]
        return [up.api.ComposeAPI(transforms=steps)]
    steps = [
        flt(query_filter=up.filters.FilterCrowds()),
        up.points.RandomizeInputBbox(box_noise_std=0.1, box_noise_max=20),
        up.segmentation.DecodeRle(),
        up.api.RandomResizeAPI(
            sizes=up.basic.get_random_resize_scales(size=R, min_size=64, rounded=False),
            max_size=up.basic.get_random_resize_max_size(size=R),
            square=True,
            consistent_transform=False,
        ),
        up.api.PadToSizeAPI(size=R, consistent_transform=False),
        up.api.ToTensorAPI(),
        flt(query_filter=up.filters.FilterEmptyTargets()),
        up.api.NormalizeAPI(mean=[0.5] * 3, std=[0.5] * 3),
        flt(query_filter=up.filters.FilterEmptyTargets()),
    ]
    return [
        up.api.ComposeAPI(transforms=steps),
        flt(query_filter=up.filters.FilterFindQueriesWithTooManyOut(max_num_objects=200)),
    ]


def test_parsed_queries_match_upstreams_loader(tmp_path, upstream):
    ann = _clean_coco(tmp_path)
    ref = upstream.loaders.COCO_FROM_JSON(str(ann))
    ours = ConceptDataset(ann, train=False, resolution=R)
    assert ours.skips.counts == {"crowd annotation (FilterCrowds)": 1}
    assert len(ref.getDatapointIds()) == ours.num_images == 3
    for i in range(3):
        queries, anns = ref.loadQueriesAndAnnotationsFromDatapoint(i)
        samples = [ours[q] for q in ours.queries(i)]
        assert [q["query_text"] for q in queries] == [s.text for s in samples]
        for q, s in zip(queries, samples, strict=True):
            kept = [a for a in anns if a["id"] in q["object_ids_output"] and not a["is_crowd"]]
            assert len(kept) == len(s.boxes)
            for a, box in zip(kept, s.boxes, strict=True):  # upstream: normalised x, y, w, h
                x, y, w, h = a["bbox"].tolist()
                np.testing.assert_allclose(box, [x + w / 2, y + h / 2, w, h], atol=1e-6)
    # the roboflow configs' num_images: the same images as upstream's limit_ids
    for k in range(1, 6):
        root = tmp_path / f"many{k}"
        images = []
        for iid in range(7):
            _image(root / "images" / f"{iid}.png", 8, 8)
            images.append({"id": 10 + iid, "file_name": f"{iid}.png", "width": 8, "height": 8})
        doc = {"images": images, "annotations": [], "categories": [{"id": 1, "name": "x"}]}
        path = _write(root / "annotations.json", doc)
        up = upstream.dataset.CustomCocoDetectionAPI(
            str(root / "images"), str(path), load_segmentation=False, limit_ids=k
        )
        want = {up.coco.loadImagesFromDatapoint(int(i))[0]["original_img_id"] for i in up.ids}
        got = {r.image_id for r in ConceptDataset(path, num_images=k, **SMALL).records}
        assert got == want and len(got) == k


@pytest.mark.parametrize("train", [False, True], ids=["val", "train"])
def test_batches_match_upstreams_pipeline(tmp_path, upstream, monkeypatch, train):
    """Upstream's dataset, the roboflow config's transforms and collator vs ours, image by
    image: the same image tensor, texts, boxes, object ids and masks (up to the resize's
    rounding ties). For train, upstream's random resize and padding are set to ours."""
    ann = _clean_coco(tmp_path)
    ours = ConceptDataset(ann, train=train, resolution=R, min_size=64, seed=3)
    ref = upstream.dataset.Sam3ImageDataset(
        img_folder=str(tmp_path / "images"),
        ann_file=str(ann),
        transforms=_upstream_transforms(upstream, train),
        max_ann_per_img=500000,
        multiplier=1,
        training=True,
        load_segmentation=True,
        max_train_queries=50000,
        max_val_queries=50000,
    )
    padded = 0
    for epoch, i in [(e, i) for e in range(3 if train else 1) for i in range(ours.num_images)]:
        ours.set_epoch(epoch)
        samples = [ours[q] for q in ours.queries(i)]
        side, (left, top) = samples[0].resized, samples[0].pad
        padded += side < R and left + top > 0
        if train:
            pads = iter([left, top])
            monkeypatch.setattr(random, "choice", lambda seq, side=side: side)
            monkeypatch.setattr(random, "randint", lambda a, b, pads=pads: next(pads))
        up = upstream.collator.collate_fn_api([ref[i]], dict_key="x", with_seg_masks=True)["x"]
        monkeypatch.undo()
        got = collate_concepts(samples)
        np.testing.assert_array_equal(got["images"].numpy(), up.img_batch.numpy())
        stage, tgt = up.find_inputs[0], up.find_targets[0]
        assert [up.find_text_batch[t] for t in stage.text_ids.tolist()] == got["texts"]
        t = got["targets"]
        assert t["num_boxes"].tolist() == tgt.num_boxes.tolist()
        np.testing.assert_allclose(t["boxes"].numpy(), tgt.boxes.view(-1, 4).numpy(), atol=1e-6)
        np.testing.assert_allclose(t["boxes_padded"].numpy(), tgt.boxes_padded.numpy(), atol=1e-6)
        assert t["object_ids_packed"].tolist() == tgt.object_ids.tolist()
        assert t["object_ids_padded"].tolist() == tgt.object_ids_padded.tolist()
        assert t["is_exhaustive"].tolist() == tgt.is_exhaustive.tolist()
        assert t["is_valid_mask"].tolist() == tgt.is_valid_segment.tolist()
        if sum(t["num_boxes"].tolist()):  # upstream's empty lists become 1-d tensors
            ref_masks = tgt.segments.numpy().astype(bool)
            assert t["masks"].shape == list(ref_masks.shape)
            assert (t["masks"].numpy() != ref_masks).mean() < 1e-4
    assert padded or not train
