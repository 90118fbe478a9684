"""The page's API: its objects exported as COCO and YOLO (``/export/coco``, ``/export/yolo``),
a prompt's own SAM 3 confidence threshold, and what ``/health`` says about the bundled demo
models (their notice, vocabulary and the generator's lowered defaults)."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from fastapi.testclient import TestClient

from paddle_sam.loading import bundled, generator_defaults_for
from paddle_sam.predict.io import coco_rle, decode_coco_rle
from paddle_sam.serve import create_app
from paddle_sam.serve.exports import rle_counts
from tests.helpers.pairs import image as make_image
from tests.helpers.server import (
    assert_error,
    png_bytes,
    sam3_reference,
    sam3_threshold,
    tiny_model,
    tiny_sam3_model,
)

H, W = 40, 60


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(tiny_model())) as c:
        yield c


def masks() -> dict[str, np.ndarray]:
    a = np.zeros((H, W), bool)
    a[5:15, 10:30] = True
    b = np.zeros((H, W), bool)  # two parts and a hole
    b[20:35, 5:20] = True
    b[25:30, 10:15] = False
    b[22:38, 40:55] = True
    return {"a": a, "b": b}


def body(objects, **kw) -> dict:
    return {
        "file_name": "photo.jpg",
        "width": W,
        "height": H,
        "objects": [{"name": n, "rle": coco_rle(m)} for n, m in objects],
        **kw,
    }


def test_rle_counts_reads_pycocotools_strings():
    from paddle_sam.serve.exports import decode_rle

    rng = np.random.default_rng(0)
    for _ in range(50):
        h, w = (int(v) for v in rng.integers(1, 30, 2))
        m = rng.random((h, w)) < rng.random()
        rle = coco_rle(m)
        assert sum(rle_counts(rle["counts"])) == m.size
        np.testing.assert_array_equal(decode_rle(rle, h, w), m)
        np.testing.assert_array_equal(decode_coco_rle(rle), m)  # pycocotools agrees


def test_coco_export_round_trips(client, tmp_path):
    from pycocotools.coco import COCO

    ms = masks()
    r = client.post(
        "/export/coco", json=body([("cat", ms["a"]), ("dog", ms["b"]), ("cat", ms["b"])])
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"] == 'attachment; filename="photo.json"'
    path = tmp_path / "photo.json"
    path.write_text(r.text)
    coco = COCO(str(path))
    assert coco.loadImgs(1)[0] == {"id": 1, "file_name": "photo.jpg", "height": H, "width": W}
    assert {c["id"]: c["name"] for c in coco.loadCats(coco.getCatIds())} == {1: "cat", 2: "dog"}
    anns = coco.loadAnns(coco.getAnnIds())
    assert [a["category_id"] for a in anns] == [1, 2, 1]
    for a, m in zip(anns, [ms["a"], ms["b"], ms["b"]], strict=True):
        np.testing.assert_array_equal(coco.annToMask(a).astype(bool), m)
        ys, xs = np.nonzero(m)
        assert a["bbox"] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
        assert a["area"] == m.sum()

    # a class list given keeps its ids, including classes this image lacks
    r = client.post("/export/coco", json=body([("dog", ms["a"])], classes=["cat", "bird", "dog"]))
    doc = r.json()
    assert [c["name"] for c in doc["categories"]] == ["cat", "bird", "dog"]
    assert doc["annotations"][0]["category_id"] == 3


def test_yolo_export_one_polygon_per_object(client):
    ms = masks()
    r = client.post("/export/yolo", json=body([("cat", ms["a"]), ("dog", ms["b"])]))
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"] == 'attachment; filename="photo.txt"'
    assert json.loads(r.headers["x-class-names"]) == ["cat", "dog"]
    lines = r.text.splitlines()
    assert [line.split()[0] for line in lines] == ["0", "1"]
    for line, m in zip(lines, [ms["a"], ms["b"]], strict=True):
        xy = np.array(line.split()[1:], dtype=np.float64).reshape(-1, 2)
        assert (xy >= 0).all() and (xy <= 1).all()
        drawn = np.zeros((H, W), np.uint8)
        cv2.fillPoly(drawn, [np.round(xy * [W, H]).astype(np.int32)], 1)
        outer = m.copy()
        outer[25:30, 10:15] = m[20:35, 5:20].any()  # YOLO keeps no holes
        # traced through the pixel centres: the drawn polygon covers the mask but its border
        iou = (outer & (drawn > 0)).sum() / (outer | (drawn > 0)).sum()
        assert iou > 0.85, iou
    # a one-pixel mask: its box
    dot = np.zeros((H, W), bool)
    dot[3, 4] = True
    r = client.post("/export/yolo", json=body([("dot", dot)]))
    xy = np.array(r.text.split()[1:], dtype=np.float64).reshape(-1, 2) * [W, H]
    np.testing.assert_allclose(xy, [[4, 3], [5, 3], [5, 4], [4, 4]], atol=1e-4)  # 6 decimals


@pytest.mark.parametrize("fmt", ["coco", "yolo"])
def test_export_refusals(client, fmt):
    ms = masks()
    good = coco_rle(ms["a"])
    url = f"/export/{fmt}"

    def refused(b, *words):
        assert_error(client.post(url, json=b), 400, "invalid_export", *words)

    wrong_size = coco_rle(np.ones((H + 1, W), bool))
    refused(
        body([("a", ms["a"]), ("b", ms["b"])])
        | {"objects": [{"name": "a", "rle": good}, {"name": "b", "rle": wrong_size}]},
        "object 2 ('b')",
        "[41, 60]",
    )
    # run lengths that overrun the image (pycocotools' decoder would write past its buffer)
    for counts, words in [
        (coco_rle(np.ones((3 * H, W), bool))["counts"], "runs cover"),
        ("0[", "ends inside"),
        ("0 ", "not"),
    ]:
        refused(
            body([]) | {"objects": [{"name": "a", "rle": {"size": [H, W], "counts": counts}}]},
            "object 1 ('a')",
            words,
        )
    refused(body([("a", np.zeros((H, W), bool))]), "empty mask")
    refused(body([("a", ms["a"])], classes=["b"]), "classes lacks 'a'")
    refused(body([("a", ms["a"])], classes=["a", "a"]), "twice")
    big = {
        "file_name": "x.png",
        "width": 100_000,
        "height": 100_000,
        "objects": [{"name": "a", "rle": {"size": [100_000, 100_000], "counts": "0"}}],
    }
    refused(big, "limit")
    r = client.post(url, json=body([("a", ms["a"])]) | {"objects": []})
    assert r.status_code == 422


def test_prompt_confidence_threshold_sam3():
    """A prompt's own threshold is used for it alone: the answer is the processor's at that
    threshold, echoed, and the server's own threshold is unchanged after it."""
    from paddle_sam.predict.sam3.predictor import Sam3Predictor

    model = tiny_sam3_model()
    img = make_image(90, 130, seed=3)
    low = sam3_threshold(model, img, "a dog", keep=3)
    high = sam3_threshold(model, img, "a dog", keep=1)
    with TestClient(create_app(Sam3Predictor(model, confidence_threshold=low))) as c:
        assert c.get("/health").json()["model"]["confidence_threshold"] == pytest.approx(low)
        r = c.post("/sessions", files={"image": ("x.png", png_bytes(img), "image/png")})
        sid = r.json()["session_id"]
        for thr, n in [(high, 1), (None, 3), (0.999999, 0)]:
            b = {"text": "a dog"} | ({} if thr is None else {"confidence_threshold": thr})
            got = c.post(f"/sessions/{sid}/prompt", json=b).json()
            assert len(got["masks"]) == n
            assert got["confidence_threshold"] == pytest.approx(low if thr is None else thr)
            if n:
                _, scores = sam3_reference(
                    model, img, "a dog", threshold=got["confidence_threshold"]
                )
                np.testing.assert_allclose([m["score"] for m in got["masks"]], scores, rtol=1e-6)
                decoded = decode_coco_rle(got["masks"][0]["rle"])
                assert decoded.shape == img.shape[:2]


def test_confidence_threshold_refused_for_sam_v1(client):
    r = client.post(
        "/sessions", files={"image": ("x.png", png_bytes(make_image(30, 40)), "image/png")}
    )
    sid = r.json()["session_id"]
    r = client.post(
        f"/sessions/{sid}/prompt", json={"points": [[5, 5]], "confidence_threshold": 0.3}
    )
    assert_error(r, 400, "not_supported", "SAM 3")
    assert client.get("/health").json()["model"]["confidence_threshold"] is None


def test_health_names_the_bundled_model_and_everything_takes_its_defaults(client):
    m = client.get("/health").json()["model"]
    assert m["demo"] is None and m["vocabulary"] is None
    assert m["generator"]["points_per_side"] == 32  # upstream's defaults

    source = bundled("sam_v1")
    with TestClient(create_app(tiny_model(), source=source)) as c:
        m = c.get("/health").json()["model"]
        assert "paddle-sam download vit_b" in m["demo"] and source.path.name in m["demo"]
        lowered = generator_defaults_for(source)
        assert m["generator"] == {k: lowered[k] for k in m["generator"]}
        assert m["generator"]["pred_iou_thresh"] < 0.88
        r = c.post(
            "/sessions", files={"image": ("x.png", png_bytes(make_image(30, 40)), "image/png")}
        )
        sid = r.json()["session_id"]
        # what the request leaves out comes from the lowered defaults: 16 x 16 points in
        # batches of 64 are 4 batches (upstream's 32 x 32 would be 16)
        job = c.post(f"/sessions/{sid}/everything", json={}).json()
        assert job["total"] == 4
        job = c.post(f"/sessions/{sid}/everything", json={"points_per_side": 8}).json()
        assert job["total"] == 1

    sam3 = bundled("sam3")
    from paddle_sam.loading import vocabulary

    with TestClient(create_app(tiny_sam3_model(), source=sam3)) as c:
        m = c.get("/health").json()["model"]
        assert "paddle-sam download sam3" in m["demo"]
        assert m["vocabulary"] == vocabulary(sam3) and "red star" in m["vocabulary"]
        assert m["generator"] is None and m["takes_points"] is False
