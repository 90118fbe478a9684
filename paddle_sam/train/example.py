"""The bundled example image and its ground truth, and the IoU check of the demo.

``python -m paddle_sam.train.example write`` regenerates ``paddle_sam/assets/example.png``
(640 x 480, fixed seed) and ``example_instances.png`` (0 background, i + 1 = object i);
``python -m paddle_sam.train.example write-clip`` regenerates the example clip
``example_clip.mp4`` (generated moving shapes) with its ground truth ``example_clip.json``;
``python -m paddle_sam.train.example track DIR`` prints the mean IoU over the frames of the
object ``paddle-sam track`` followed into ``DIR`` (its ``masks/<id>/<frame>.png``) with the
object clicked on the first frame;
``python -m paddle_sam.train.example iou MASK.png --point X,Y`` prints the IoU of a mask with
the object under the point; ``python -m paddle_sam.train.example concept DIR --text star``
checks that the masks of ``paddle-sam segment --text`` (``DIR/masks/*.png``) find every
instance of a shape noun of the concept vocabulary. Needs only numpy and Pillow.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ASSETS = Path(__file__).resolve().parents[1] / "assets"
EXAMPLE = ASSETS / "example.png"
INSTANCES = ASSETS / "example_instances.png"
DEMO_POINT = (520, 110)  # the red disc: what `make demo` clicks
EXAMPLE_CLIP = ASSETS / "example_clip.mp4"
# the example clip: the first seed from 2024 whose clip (320 x 240, 36 frames) has 3 to 5
# objects, each of at least 1500 px on the first frame and seen on every frame; `make demo`
# tracks its object 1 from the click stored in example_clip.json
CLIP_SEED, CLIP_SIZE, CLIP_FRAMES, CLIP_FPS = 2027, (320, 240), 36, 12.0


def write_assets(folder: Path = ASSETS, overwrite: bool = False) -> list[Path]:
    from .synthetic import example_scene, instance_map

    scene = example_scene()
    out = [folder / "example.png", folder / "example_instances.png", folder / "example.json"]
    clash = [p for p in out if p.exists()]
    if clash and not overwrite:
        raise FileExistsError(f"{clash[0]} exists; pass --overwrite to replace it")
    Image.fromarray(scene.image).save(out[0])
    Image.fromarray(instance_map(scene.masks)).save(out[1])
    objects = [
        {"id": i + 1, "kind": k, "area": int(m.sum())}
        for i, (k, m) in enumerate(zip(scene.kinds, scene.masks, strict=True))
    ]
    out[2].write_text(
        json.dumps(
            {
                "image": "example.png",
                "instances": "example_instances.png",
                "demo_point": list(DEMO_POINT),
                "objects": objects,
            },
            indent=2,
        )
        + "\n"
    )
    return out


def write_example_clip(folder: Path = ASSETS, overwrite: bool = False) -> list[Path]:
    from .clips import synthetic_clip, write_clip

    clip = synthetic_clip(CLIP_SEED, 0, *CLIP_SIZE, CLIP_FRAMES)
    video = write_clip(clip, folder / EXAMPLE_CLIP.name, fps=CLIP_FPS, overwrite=overwrite)
    return [video, video.with_suffix(".json")]


def track_iou(track_dir: str | Path, clip: Path = EXAMPLE_CLIP) -> dict[int, float]:
    """Mean IoU over the frames of each object ``paddle-sam track`` wrote into ``track_dir``
    (``masks/<id>/<frame>.png``; a frame without a PNG is an empty mask) with the ground-truth
    object of the same id in ``clip``'s JSON (:func:`~.clips.write_clip`)."""
    from .clips import read_clip_truth
    from .sam2.evaluate import frame_ious

    truth = read_clip_truth(clip)
    objects = {o["id"]: o for o in truth["objects"]}
    folders = sorted((Path(track_dir) / "masks").glob("*"))
    if not folders:
        raise ValueError(f"{track_dir}/masks holds no tracked object")
    out = {}
    for folder in folders:
        obj_id = int(folder.name)
        if obj_id not in objects:
            raise ValueError(f"{folder}: the example clip has no object {obj_id}")
        gt = objects[obj_id]["masks"]
        pred = np.zeros_like(gt)
        for t in range(len(gt)):
            png = folder / f"{t:05d}.png"
            if png.is_file():
                pred[t] = np.asarray(Image.open(png).convert("L")) > 127
        out[obj_id] = float(frame_ious(pred, gt).mean())
    return out


def mask_iou_at(
    mask_png: str | Path, point: tuple[float, float], instances: str | Path = INSTANCES
) -> tuple[float, int]:
    """(IoU of the mask with the ground-truth object under ``point``, that object's id)."""
    ids = np.asarray(Image.open(instances))
    mask = np.asarray(Image.open(mask_png).convert("L")) > 127
    if mask.shape != ids.shape:
        raise ValueError(f"{mask_png} is {mask.shape}, the ground truth {ids.shape}")
    x, y = int(point[0]), int(point[1])
    obj = int(ids[y, x])
    if obj == 0:
        raise ValueError(f"point ({x}, {y}) is on the background of {instances}")
    gt = ids == obj
    return float((mask & gt).sum() / (mask | gt).sum()), obj


def concept_check(
    segment_dir: str | Path, text: str, min_iou: float = 0.8, folder: Path = ASSETS
) -> dict:
    """The instances of the example image that ``text`` (a bare shape noun of the concept
    vocabulary: "star", "circle", ...) names, against the masks ``paddle-sam segment --text``
    wrote into ``segment_dir/masks/``: :func:`~.sam3.evaluate.instance_recall` at
    ``min_iou``."""
    from .sam3.evaluate import instance_recall
    from .synthetic import CONCEPT_SHAPES

    if text not in CONCEPT_SHAPES:
        raise ValueError(f"--text {text!r}: choose a shape noun of {sorted(CONCEPT_SHAPES)}")
    ids = np.asarray(Image.open(folder / "example_instances.png"))
    objects = json.loads((folder / "example.json").read_text())["objects"]
    gt = [ids == o["id"] for o in objects if o["kind"] == CONCEPT_SHAPES[text]]
    if not gt:
        raise ValueError(f"the example image holds no {text!r}")
    files = sorted((Path(segment_dir) / "masks").glob("*.png"))
    pred = [np.asarray(Image.open(f).convert("L")) > 127 for f in files]
    if any(m.shape != ids.shape for m in pred):
        raise ValueError(f"the masks in {segment_dir}/masks are not {ids.shape[::-1]} (w, h)")
    return instance_recall(np.asarray(pred).reshape(-1, *ids.shape), np.asarray(gt), min_iou)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paddle_sam.train.example")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="regenerate the example image and its ground truth")
    w.add_argument("--folder", default=str(ASSETS))
    w.add_argument("--overwrite", action="store_true")
    c = sub.add_parser("iou", help="IoU of a mask PNG with the clicked ground-truth object")
    c.add_argument("mask")
    c.add_argument("--point", default=",".join(map(str, DEMO_POINT)))
    c.add_argument("--min", type=float, default=None, help="exit 1 if the IoU is below this")
    wc = sub.add_parser("write-clip", help="regenerate the example clip and its ground truth")
    wc.add_argument("--folder", default=str(ASSETS))
    wc.add_argument("--overwrite", action="store_true")
    t = sub.add_parser("track", help="mean IoU of paddle-sam track's objects on the example clip")
    t.add_argument("track_dir", help="the output folder of paddle-sam track on the example clip")
    t.add_argument("--min", type=float, default=None, help="exit 1 if a mean IoU is below this")
    k = sub.add_parser("concept", help="did segment --text find every instance of a shape?")
    k.add_argument("segment_dir", help="the output folder of paddle-sam segment --text")
    k.add_argument("--text", required=True, help="a shape noun: star, circle, ring, ...")
    k.add_argument("--min-iou", type=float, default=0.8)
    args = p.parse_args(argv)
    if args.cmd == "concept":
        r = concept_check(args.segment_dir, args.text, args.min_iou)
        print(
            f"{args.text!r}: {r['found']} of {r['instances']} instance(s) found with IoU >= "
            f"{args.min_iou:g} (IoU per instance: {r['ious']})"
        )
        return 0 if r["found"] == r["instances"] else 1
    if args.cmd == "write-clip":
        for path in write_example_clip(Path(args.folder), args.overwrite):
            print(path)
        return 0
    if args.cmd == "track":
        ious = track_iou(args.track_dir)
        for obj_id, iou in ious.items():
            print(f"object {obj_id}: mean IoU over the frames with the ground truth {iou:.4f}")
        return 0 if args.min is None or min(ious.values()) >= args.min else 1
    if args.cmd == "write":
        for path in write_assets(Path(args.folder), args.overwrite):
            print(path)
        return 0
    point = tuple(float(v) for v in args.point.split(","))
    iou, obj = mask_iou_at(args.mask, point)
    print(f"IoU with ground-truth object {obj} at {args.point}: {iou:.4f}")
    return 0 if args.min is None or iou >= args.min else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
