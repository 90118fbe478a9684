"""``paddle-sam label`` with the local engine: sources, the COCO output against the generator
run image by image, bad images reported, several workers, and a worker killed mid-job then
``--resume`` giving the uninterrupted job's file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddle_sam.label import LabelSpec, label, list_images

# pycocotools 2.0.x's decode trips a numpy 2 deprecation inside the library; not ours to fix.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

# the bundled default model, a small grid and no filters: many masks, quickly
OPTIONS = dict(points_per_side=4, pred_iou_thresh=0.0, stability_score_thresh=0.0)


def _scene(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    img = (rng.random((h, w, 3)) * 50).astype(np.uint8)
    for _ in range(3):
        y, x = rng.integers(0, h - 12), rng.integers(0, w - 12)
        img[y : y + rng.integers(8, 20), x : x + rng.integers(8, 24)] = rng.integers(120, 255, 3)
    return img


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """Seven images in two folders (PNG and JPEG, sizes differ), one broken file, one image
    above the job's pixel limit."""
    root = tmp_path_factory.mktemp("label_src")
    rng = np.random.default_rng(0)
    (root / "b").mkdir()
    for i in range(7):
        name = f"b/img{i}.jpg" if i % 3 == 0 else f"img{i}.png"
        Image.fromarray(_scene(rng, 40 + 6 * i, 56 + 4 * i)).save(root / name)
    (root / "broken.png").write_bytes(b"\x89PNG not really")
    Image.fromarray(_scene(rng, 120, 120)).save(root / "huge.png")  # over max_pixels below
    return root


MAX_PIXELS = 100 * 100


def test_sources(dataset, tmp_path):
    items = list_images(dataset)
    names = [it.file_name for it in items]
    assert names == sorted(names) and "b/img0.jpg" in names and "broken.png" in names
    assert [it.id for it in items] == list(range(1, len(items) + 1))
    assert [it.file_name for it in list_images(f"{dataset}/**/*.jpg")] == [
        f"{dataset}/b/img0.jpg",
        f"{dataset}/b/img3.jpg",
        f"{dataset}/b/img6.jpg",
    ]
    (tmp_path / "list.txt").write_text("# two images\nimg1.png\n\nb/img3.jpg\n")
    txt = list_images(tmp_path / "list.txt", image_root=dataset)
    assert [(it.id, it.file_name) for it in txt] == [(1, "img1.png"), (2, "b/img3.jpg")]
    coco = {"images": [{"id": 42, "file_name": "img2.png"}, {"id": 7, "file_name": "b/img0.jpg"}]}
    (dataset / "set.json").write_text(json.dumps(coco))
    try:
        got = list_images(dataset / "set.json")
        assert [(it.id, it.file_name, Path(it.path)) for it in got] == [
            (42, "img2.png", dataset / "img2.png"),
            (7, "b/img0.jpg", dataset / "b/img0.jpg"),
        ]
    finally:
        (dataset / "set.json").unlink()
    with pytest.raises(FileNotFoundError, match="source not found"):
        list_images(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images found"):
        list_images(tmp_path / "empty")
    (tmp_path / "bad.json").write_text(json.dumps({"images": [{"file_name": "x.png"}]}))
    with pytest.raises(ValueError, match=r"images\[0\] needs an integer 'id'"):
        list_images(tmp_path / "bad.json")


def test_label_matches_the_generator_image_by_image(dataset, tmp_path):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    from paddle_sam import SamAutomaticMaskGenerator
    from paddle_sam.loading.sam_v1 import DEFAULT_MODEL, load_sam
    from paddle_sam.predict.io import load_image

    spec = LabelSpec(mode="everything", everything=OPTIONS)
    out = tmp_path / "out"
    report = label(dataset, out, spec, shard_size=3, max_pixels=MAX_PIXELS)
    assert (report["labelled"], report["skipped"]) == (7, 2)
    reasons = {s["file_name"]: s["reason"] for s in report["skipped_images"]}
    assert "not a readable image" in reasons["broken.png"]
    assert "above the limit" in reasons["huge.png"]
    assert json.loads((out / "report.json").read_text())["skipped"] == 2

    coco = COCO(str(out / "annotations.json"))  # pycocotools reads it
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == ["object"]
    doc = json.loads((out / "annotations.json").read_text())
    assert [a["id"] for a in doc["annotations"]] == list(range(1, len(doc["annotations"]) + 1))

    generator = SamAutomaticMaskGenerator(load_sam(DEFAULT_MODEL), **OPTIONS)
    items = {it.id: it for it in list_images(dataset)}
    total = 0
    for img in doc["images"]:
        image = load_image(items[img["id"]].path)
        assert (img["height"], img["width"]) == image.shape[:2]
        want = [w for w in generator.generate(image) if w["area"]]  # COCO holds no empty
        got = coco.loadAnns(coco.getAnnIds(imgIds=[img["id"]]))
        assert len(got) == len(want) > 0
        for g, w in zip(got, want, strict=True):
            rle = dict(g["segmentation"], counts=g["segmentation"]["counts"].encode())
            mask = mask_utils.decode(rle).astype(bool)
            assert mask.shape == image.shape[:2]
            np.testing.assert_array_equal(mask, w["segmentation"])
            assert g["area"] == int(w["segmentation"].sum())
            # COCO's bbox is the mask's own box (the generator's record, upstream's, stops a
            # pixel short of the mask's far edges)
            np.testing.assert_allclose(g["bbox"], mask_utils.toBbox(rle))
            np.testing.assert_allclose(np.add(w["bbox"], [0, 0, 1, 1]), g["bbox"])
            assert g["score"] == pytest.approx(w["predicted_iou"], abs=1e-6)
            assert g["category_id"] == 1 and g["iscrowd"] == 0
        total += len(got)
    assert total == len(doc["annotations"])

    # the same job again is refused, --resume finds every shard done, another job is refused
    with pytest.raises(FileExistsError, match="--resume"):
        label(dataset, out, spec, shard_size=3, max_pixels=MAX_PIXELS)
    again = label(dataset, out, spec, shard_size=3, max_pixels=MAX_PIXELS, resume=True)
    assert again["resumed_shards"] == again["shards"] == 3
    assert json.loads((out / "annotations.json").read_text()) == doc
    other = LabelSpec(mode="everything", everything={**OPTIONS, "points_per_side": 2})
    with pytest.raises(ValueError, match="different spec"):
        label(dataset, out, other, shard_size=3, max_pixels=MAX_PIXELS, resume=True)


def _cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "paddle_sam", "label", *map(str, args)]


def _children(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def test_worker_killed_then_resume(dataset, tmp_path):
    """Two worker processes; one is killed mid-job: the job stops with a one-line error and
    keeps its finished shards; --resume completes it, and the file equals an uninterrupted
    two-worker run's (nothing lost, nothing twice)."""
    common = ["--everything", "--points-per-side", "4", "--pred-iou-thresh", "0"]
    common += ["--stability-score-thresh", "0", "--shard-size", "1", "--num-workers", "2"]
    common += ["--max-pixels", MAX_PIXELS, "--quiet"]
    full = tmp_path / "full"
    done = subprocess.run(_cli(dataset, "-o", full, *common), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        _cli(dataset, "-o", cut, *common), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while not list((cut / "shards").glob("shard-*.json")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no shard written"
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert workers, "no worker processes"
        os.kill(workers[-1], signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode == 0:  # the other worker finished everything first: nothing to resume
        pytest.skip("the job finished before the worker was killed")
    assert proc.returncode == 1 and "--resume" in err and "Traceback" not in err, err
    kept = len(list((cut / "shards").glob("shard-*.json")))
    assert 1 <= kept < 9
    assert not (cut / "annotations.json").exists()

    resumed = subprocess.run(
        _cli(dataset, "-o", cut, *common, "--resume"), capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"{kept} of 9 shards from an earlier run" in resumed.stdout
    a = json.loads((cut / "annotations.json").read_text())
    b = json.loads((full / "annotations.json").read_text())
    assert a == b
    assert len({im["id"] for im in a["images"]}) == len(a["images"]) == 7


def test_workers_stop_with_the_job(dataset, tmp_path):
    """The job process killed (SIGKILL: no clean-up runs): its worker processes stop too,
    rather than labelling on unseen."""
    import psutil

    common = ["--everything", "--points-per-side", "4", "--shard-size", "1"]
    common += ["--num-workers", "2", "--max-pixels", MAX_PIXELS, "--quiet"]
    out = tmp_path / "o"
    proc = subprocess.Popen(_cli(dataset, "-o", out, *common), stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while len(_children(proc.pid)) < 2:  # the pool's workers (and its resource tracker)
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        workers = [psutil.Process(pid) for pid in _children(proc.pid)]
        proc.kill()
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, [p.cmdline()[-2:] for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_label_command_errors(dataset, tmp_path, capsys):
    from paddle_sam.cli import main

    out = tmp_path / "o"
    for argv, words in [
        ([dataset, "-o", out], "--everything"),
        ([dataset, "-o", out, "--everything", "--text", "car"], "either --everything"),
        ([dataset, "-o", out, "--text", "car", "--text", "car", "--checkpoint", dataset], "twice"),
        ([tmp_path / "missing", "-o", out, "--everything"], "source not found"),
        ([dataset, "-o", out, "--everything", "--num-workers", "0"], "--num-workers"),
    ]:
        try:
            code = main(["label", *map(str, argv)])
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
        assert code == 2
        err = capsys.readouterr().err
        assert all(w in err for w in words.split("|")), err
        assert not out.exists()


def test_label_sam3_concepts(dataset, tmp_path):
    """SAM 3 concepts: one category per prompt, every instance the predictor grounds for it
    (threshold 0: every query of the tiny model), image by image."""
    import warnings

    from pycocotools import mask as mask_utils

    from paddle_sam.convert import sam3 as conv
    from paddle_sam.convert.checkpoint import convert_checkpoint
    from paddle_sam.loading.sam3 import load_sam3_predictor
    from paddle_sam.predict.io import load_image
    from tests.helpers.specs import tiny_sam3_spec

    torch = pytest.importorskip("torch")
    spec3 = tiny_sam3_spec()
    official = tmp_path / "sam3_tiny.pt"
    state = conv.random_released_state_dict(spec3, seed=7)
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, official)
    ckpt = tmp_path / "sam3_tiny.pdparams"
    convert_checkpoint(official, ckpt, spec=spec3, progress=False)

    prompts = ("a red box", "a ring")
    src = tmp_path / "few"
    src.mkdir()
    for name in ("img1.png", "img2.png"):
        (src / name).write_bytes((dataset / name).read_bytes())
    spec = LabelSpec(
        mode="concepts", checkpoint=str(ckpt), prompts=prompts, confidence_threshold=0.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = label(src, tmp_path / "out", spec)
        predictor = load_sam3_predictor(ckpt, None, 0.0, interactive=False)
    doc = json.loads((tmp_path / "out" / "annotations.json").read_text())
    assert [c["name"] for c in doc["categories"]] == list(prompts)
    assert report["annotations"] == len(doc["annotations"]) == 2 * 2 * spec3.num_queries
    for img in doc["images"]:
        image = load_image(src / img["file_name"])
        predictor.set_image(image)
        for category_id, text in enumerate(prompts, 1):
            found = predictor.ground(text, [], [])
            got = [
                a
                for a in doc["annotations"]
                if a["image_id"] == img["id"] and a["category_id"] == category_id
            ]
            assert len(got) == len(found.masks) == spec3.num_queries
            for a, mask, score in zip(got, found.masks, found.scores, strict=True):
                rle = dict(a["segmentation"], counts=a["segmentation"]["counts"].encode())
                np.testing.assert_array_equal(mask_utils.decode(rle).astype(bool), mask)
                assert a["score"] == pytest.approx(float(score), abs=1e-6)
