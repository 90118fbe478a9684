"""Segmentation datasets: COCO instance JSON, SA-1B style per-image JSON, image + mask folders,
and procedural synthetic scenes.

Every dataset yields ``(image, masks)``: an H x W x 3 uint8 RGB array and a list of H x W bool
instance masks. Bad entries are skipped, never fatal: an unreadable image (a format outside
the allow-list or above the pixel limit included), a ``file_name`` that leads out of the image
folder, an empty annotation, a polygon outside the image or a mask of the wrong size is
counted in :class:`~paddle_sam.train.data.SkipLog` (with the first few examples named) and
reported at the end of a run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...predict.io import IMAGE_SUFFIXES, OutsideRootError, resolve_under
from ..data import SkipLog, decode_segmentation, read_mask, read_rgb, unreadable
from ..synthetic import synthetic_scene

FORMATS = ("coco", "sa1b", "folder", "synthetic")


class SegmentationDataset:
    """Base: ``records`` are (image path, annotation payload); subclasses decode payloads."""

    name = "dataset"

    def __init__(self, root: str | Path, skips: SkipLog | None = None) -> None:
        self.root = Path(root)
        self.skips = skips if skips is not None else SkipLog()
        if not self.root.exists():
            raise FileNotFoundError(f"{self.name} dataset not found: {self.root}")
        self.records: list[tuple[Path, object]] = []

    def __len__(self) -> int:
        return len(self.records)

    def _finish(self) -> None:
        if not self.records:
            raise ValueError(
                f"no usable images with annotations in {self.name} dataset {self.root} "
                f"({self.skips.summary()})"
            )

    def load(self, index: int) -> tuple[np.ndarray, list[np.ndarray]] | None:
        """(image, masks), or None (counted in ``skips``) if the image cannot be used."""
        path, payload = self.records[index]
        try:
            image = read_rgb(path)
        except Exception as exc:  # missing, damaged (PIL raises many types), refused
            self.skips.add("unreadable image", unreadable(path, exc))
            return None
        masks = self._masks(path, payload, image.shape[0], image.shape[1])
        if not masks:
            self.skips.add("no usable annotation", str(path))
            return None
        return image, masks

    def _masks(self, path, payload, h: int, w: int) -> list[np.ndarray]:
        raise NotImplementedError

    def _path(self, root: Path, file_name, where: str) -> Path | None:
        """``root / file_name`` of an annotation file's entry, or None (skipped) when the name
        leads out of ``root`` (see :func:`~paddle_sam.predict.io.resolve_under`)."""
        try:
            return resolve_under(root, str(file_name))
        except OutsideRootError as exc:
            self.skips.add("file_name outside the image folder", f"{where}: {exc}")
            return None


class _AnnotatedDataset(SegmentationDataset):
    """Records whose payload is a list of COCO-style annotations (polygons or RLE)."""

    def _masks(self, path, anns, h, w):
        out = []
        for a in anns:
            m = decode_segmentation(
                a.get("segmentation"), h, w, f"{path.name} annotation {a.get('id')}", self.skips
            )
            if m is not None:
                out.append(m)
        return out


class CocoDataset(_AnnotatedDataset):
    """COCO instance annotations: ``annotations`` JSON + an image folder (polygons or RLE)."""

    name = "COCO"

    def __init__(
        self,
        annotations: str | Path,
        images: str | Path | None = None,
        skips: SkipLog | None = None,
    ) -> None:
        super().__init__(annotations, skips)
        ann_path = self.root
        if ann_path.is_dir():
            ann_path = ann_path / "annotations.json"
        if not ann_path.is_file():
            raise FileNotFoundError(f"COCO annotation file not found: {ann_path}")
        image_dir = Path(images) if images is not None else ann_path.parent / "images"
        if not image_dir.is_dir():
            raise FileNotFoundError(f"COCO image folder not found: {image_dir}")
        try:
            doc = json.loads(ann_path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ann_path} is not valid JSON: {exc}") from None
        for key in ("images", "annotations"):
            if not isinstance(doc.get(key), list):
                raise ValueError(f"{ann_path} has no '{key}' list: not a COCO instance file")
        by_image: dict[int, list[dict]] = {}
        for a in doc["annotations"]:
            if a.get("iscrowd", 0):
                continue
            by_image.setdefault(a.get("image_id"), []).append(a)
        for info in doc["images"]:
            anns = by_image.get(info.get("id"), [])
            path = self._path(image_dir, info.get("file_name"), f"{ann_path.name}: image")
            if path is None:
                continue
            if not anns:
                self.skips.add("image without annotations", str(path))
                continue
            self.records.append((path, anns))
        self._finish()


class SA1BDataset(_AnnotatedDataset):
    """SA-1B layout: ``name.jpg`` next to ``name.json`` ({"image": ..., "annotations": [...]})."""

    name = "SA-1B"

    def __init__(self, root: str | Path, skips: SkipLog | None = None) -> None:
        super().__init__(root, skips)
        for js in sorted(self.root.glob("*.json")):
            try:
                doc = json.loads(js.read_text())
            except json.JSONDecodeError as exc:
                self.skips.add("invalid annotation JSON", f"{js}: {exc}")
                continue
            info, anns = doc.get("image") or {}, doc.get("annotations") or []
            path = self._path(self.root, info.get("file_name", js.stem + ".jpg"), js.name)
            if path is None:
                continue
            if not anns:
                self.skips.add("image without annotations", str(path))
                continue
            self.records.append((path, anns))
        self._finish()


class MaskFolderDataset(SegmentationDataset):
    """``images/NAME.png`` with ``masks/NAME/*.png``: one binary PNG per instance (> 0 = in)."""

    name = "mask folder"

    def __init__(self, root: str | Path, skips: SkipLog | None = None) -> None:
        super().__init__(root, skips)
        image_dir, mask_dir = self.root / "images", self.root / "masks"
        for d in (image_dir, mask_dir):
            if not d.is_dir():
                raise FileNotFoundError(f"mask folder dataset needs {d}/")
        for img in sorted(image_dir.iterdir()):
            if img.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            masks = sorted(p for p in (mask_dir / img.stem).glob("*.png"))
            if not masks:
                self.skips.add("image without annotations", str(img))
                continue
            self.records.append((img, masks))
        self._finish()

    def _masks(self, path, mask_paths, h, w):
        out = []
        for p in mask_paths:
            try:
                m = read_mask(p)
            except Exception as exc:  # damaged (PIL raises many types), refused
                self.skips.add("unreadable mask", unreadable(p, exc))
                continue
            if m.shape != (h, w):
                self.skips.add("mask size differs from the image", f"{p}: {m.shape} vs {(h, w)}")
            elif not m.any():
                self.skips.add("empty annotation", str(p))
            else:
                out.append(m)
        return out


class SyntheticDataset:
    """Procedural scenes generated on demand: scene ``i`` of ``seed`` is always the same."""

    name = "synthetic"

    def __init__(
        self,
        num_images: int,
        seed: int = 0,
        sizes: list[list[int]] | None = None,
        skips: SkipLog | None = None,
    ) -> None:
        if num_images < 1:
            raise ValueError(f"synthetic num_images must be >= 1, got {num_images}")
        self.num_images, self.seed, self.sizes = int(num_images), int(seed), sizes
        self.skips = skips if skips is not None else SkipLog()

    def __len__(self) -> int:
        return self.num_images

    def load(self, index: int):
        scene = synthetic_scene(self.seed, index, self.sizes)
        if not scene.masks:
            self.skips.add("no usable annotation", f"synthetic scene {self.seed}/{index}")
            return None
        return scene.image, scene.masks


def open_dataset(spec: dict, skips: SkipLog | None = None):
    """A dataset from a config entry: {format, path[, images]} or {format: synthetic, ...}."""
    fmt = spec.get("format")
    if fmt not in FORMATS:
        raise ValueError(f"unknown dataset format {fmt!r}; choose from {FORMATS}")
    if fmt == "synthetic":
        return SyntheticDataset(
            spec.get("num_images", 0), spec.get("seed", 0), spec.get("sizes"), skips
        )
    path = spec.get("path")
    if not path:
        raise ValueError(f"a {fmt} dataset needs a 'path'")
    if fmt == "coco":
        return CocoDataset(path, spec.get("images"), skips)
    if fmt == "sa1b":
        return SA1BDataset(path, skips)
    return MaskFolderDataset(path, skips)
