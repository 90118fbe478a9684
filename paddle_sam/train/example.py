"""The bundled example image and its ground truth, and the IoU check of the demo.

``python -m paddle_sam.train.example write`` regenerates ``paddle_sam/assets/example.png``
(640 x 480, fixed seed) and ``example_instances.png`` (0 background, i + 1 = object i);
``python -m paddle_sam.train.example iou MASK.png --point X,Y`` prints the IoU of a mask with
the object under the point. Needs only numpy and Pillow.
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
    args = p.parse_args(argv)
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
