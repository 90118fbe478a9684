"""SAM 3 fine-tuning data: COCO detection / instance JSON (also Roboflow's export layout) read
as text-prompted find queries, preprocessed as upstream's roboflow_v100 fine-tuning config does
and batched in the layout of upstream's collator (upstream: ``sam3/train/data`` and
``sam3/train/transforms``).

**Queries.** Every image gets one find query per category of the file, in category-id order:
the categories annotated on it are its positives (their annotations are the targets), all the
others its negatives (no targets), as upstream's ``COCO_FROM_JSON`` with
``include_negatives=True`` (the configs' training loader). ``max_negatives`` caps the negatives
of an image (a seeded draw per image and epoch); None keeps them all, as upstream. One sample is
one query: the image, its text (the category name) and its targets. A query with more than
``max_targets`` targets is dropped (the configs' ``FilterFindQueriesWithTooManyOut``, 200).

**Annotations.** Crowd annotations are dropped (``FilterCrowds``): a category present only as
a crowd stays a query without targets, as upstream. Boxes are COCO ``[x, y, w, h]`` pixels
clamped to the image; an annotation without a bbox gets its mask's extent. Masks come from
polygons, RLE or uncompressed RLE. Bad entries never stop a run; they are counted in a
:class:`~paddle_sam.train.data.SkipLog` (``dataset.skips``) with a few named examples:
malformed / degenerate / outside-the-image boxes, unknown category ids, annotations of unknown
images, undecodable segmentations, image entries without a file or whose ``file_name`` leads
out of the image folder (absolute, ``..``, a symlink out of it), images the package's decoder
refuses (formats outside its allow-list, more pixels than its limit: checked from the header).
An annotation whose box is good but whose segmentation is bad keeps its box and gets no mask
(``is_valid_mask`` False); a category that lost some of its annotations on an image makes a
non-exhaustive query there (``is_exhaustive`` False), one that lost all of them is neither a
positive nor a negative there.
A file that is not COCO JSON at all raises ``ValueError`` naming the file and the problem.

**Preprocessing** (upstream's ``RandomResizeAPI`` / ``PadToSizeAPI`` / ``ToTensorAPI`` /
``NormalizeAPI`` with the configs' values). ``train=True``: resize to a random square side among
480, 512, ..., up to ``resolution`` (``get_random_resize_scales``; the aspect ratio is not kept)
and pad at a random offset to ``resolution`` x ``resolution``; ``train=False`` (the validation
transforms): resize to ``resolution`` x ``resolution``. Pixels are scaled to [0, 1] and
normalised with mean = std = 0.5. Images are resized with PIL's bilinear filter (what torchvision
does for PIL images), masks with a bilinear filter and thresholded at 0.5 (upstream resizes the
0/1 mask bilinearly and rounds; the two differ only on exact ties). Targets are normalised
(cx, cy, w, h) of the padded image, masks ``resolution`` x ``resolution``.

**Exemplar prompts** (upstream's ``TextQueryToVisual``; not in the roboflow configs, so off by
default): with probability ``exemplar_prob`` a positive query gets the box of one of its targets
as a positive box prompt, jittered as the configs' ``RandomizeInputBbox`` (noise of std 0.1 of
the box size, at most 20 px), and its text becomes ``"visual"`` unless ``exemplar_keeps_text``.

**Randomness** comes from NumPy generators keyed by ``(seed, epoch, image index, purpose)``: a
sample is a pure function of ``(seed, epoch, index)``, and all the queries of an image in an
epoch share its resize and padding (upstream transforms a whole image with its queries), so
:func:`collate_concepts` passes each image once.
"""

from __future__ import annotations

import json
import math
import random
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle
from PIL import Image

from ...models.sam3.geometry_encoders import Prompt
from ...models.sam3.sam3_image import FindStage
from ...predict.io import OutsideRootError, decode_coco_rle, image_size, resolve_under
from ..data import SkipLog, decode_segmentation, read_rgb, unreadable
from .sam3_loss import make_find_targets

__all__ = [
    "ANNOTATION_FILES",
    "BOX_NOISE_MAX",
    "BOX_NOISE_STD",
    "MAX_TARGETS",
    "MIN_RESIZE",
    "NORM_MEAN",
    "NORM_STD",
    "RESOLUTION",
    "VISUAL_TEXT",
    "ConceptDataset",
    "ConceptSample",
    "collate_concepts",
    "resize_scales",
]

# the roboflow_v100 configs' values (scratch.resolution, the min_size of the random resize,
# scratch.train_norm_mean / train_norm_std, scratch.max_ann_per_img, RandomizeInputBbox)
RESOLUTION = 1008
MIN_RESIZE = 480
NORM_MEAN = (0.5, 0.5, 0.5)
NORM_STD = (0.5, 0.5, 0.5)
MAX_TARGETS = 200
BOX_NOISE_STD = 0.1
BOX_NOISE_MAX = 20.0
# the text of a query turned into an exemplar (visual) query (upstream's TextQueryToVisual)
VISUAL_TEXT = "visual"
# annotation files looked for in a folder: Roboflow's COCO export, then ours (write_dataset)
ANNOTATION_FILES = ("_annotations.coco.json", "annotations.json")

# purposes of the random streams (the last key of a generator)
_NEGATIVES, _GEOMETRY, _EXEMPLAR, _SHUFFLE = range(4)


def resize_scales(resolution: int = RESOLUTION, min_size: int = MIN_RESIZE) -> list[int]:
    """The square sides of the training resize: multiples of 32 from ``min_size`` (rounded up)
    to ``resolution`` (upstream's ``get_random_resize_scales(size, min_size, rounded=False)``):
    480, 512, ..., 992 for 1008."""
    scales = list(range(32 * math.ceil(min_size / 32), int(resolution) + 1, 32))
    if not scales:
        raise ValueError(f"no resize scale between min_size {min_size} and resolution {resolution}")
    return scales


@dataclass
class ConceptSample:
    """One find query: a preprocessed image, a text prompt and the instances it must find."""

    image: np.ndarray  # 3 x R x R float32, normalised (read-only: shared by the image's queries)
    text: str
    boxes: np.ndarray  # T x 4 float32, normalised (cx, cy, w, h); T = 0 for a negative
    masks: np.ndarray | None  # T x R x R bool; None: no mask supervision (detection only)
    is_valid_mask: np.ndarray  # T bool: False where the annotation has no (usable) mask
    object_ids: np.ndarray  # T int64: the targets' indices among the image's objects
    is_exhaustive: bool  # every instance of the query's category on the image is a target
    exemplar_boxes: np.ndarray  # E x 4 float32 box prompts, normalised (cx, cy, w, h); E <= 1
    exemplar_labels: np.ndarray  # E int64, 1 = positive
    category_id: int
    image_id: object  # the image's id in the JSON file
    image_index: int  # the image's index in the dataset
    epoch: int
    original_size: tuple[int, int]  # (h, w) of the image file
    resized: int  # side of the resized image in the R x R canvas
    pad: tuple[int, int]  # (left, top): where the resized image sits in the canvas
    source: str  # the annotation file (tells datasets apart when batching)


@dataclass
class _Object:
    category_id: int
    box: np.ndarray  # float32 (x0, y0, x1, y1) normalised by the JSON's image size, in [0, 1]
    rle: dict | None  # compressed RLE of the mask; None: no mask


@dataclass
class _ImageRecord:
    path: Path
    image_id: object
    objects: list[_Object]  # by category id, then in file order (upstream's object order)
    positives: dict[int, list[int]]  # category id -> indices into objects
    exhaustive: dict[int, bool]  # category id -> all its annotations were usable
    negatives: list[int]  # categories that may be asked for with no targets


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _sort_key(v) -> tuple:
    return (0, v, "") if _is_number(v) else (1, 0, str(v))


def _read_coco(path: Path) -> dict:
    """The parsed file; ``ValueError`` naming the file unless it is COCO detection JSON."""
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a COCO JSON object, got a {type(doc).__name__}")
    for key in ("images", "annotations", "categories"):
        if not isinstance(doc.get(key), list):
            raise ValueError(f"{path} has no '{key}' list: not a COCO detection/instance file")
    return doc


def _read_categories(doc: dict, path: Path, prompts: Mapping[int, str] | None) -> dict[int, str]:
    """Category id -> prompt text, by id (``prompts`` replaces names)."""
    cats: dict[int, str] = {}
    for c in doc["categories"]:
        ok = isinstance(c, dict) and isinstance(c.get("id"), int) and not isinstance(c["id"], bool)
        if not ok or not isinstance(c.get("name"), str) or not c["name"].strip():
            raise ValueError(
                f"{path}: bad category {c!r}: a category needs an integer 'id' and a name"
            )
        if c["id"] in cats:
            raise ValueError(f"{path}: category id {c['id']} appears twice")
        cats[c["id"]] = c["name"]
    if not cats:
        raise ValueError(f"{path} has no categories: the text prompts are the category names")
    for cid, text in (prompts or {}).items():
        if cid not in cats:
            raise ValueError(f"prompts: category id {cid} is not in {path}")
        cats[cid] = str(text)
    return dict(sorted(cats.items()))


def _rle_counts(counts: bytes) -> list[int] | None:
    """The run lengths of a compressed COCO RLE string, None if it is malformed."""
    out: list[int] = []
    p, n = 0, len(counts)
    while p < n:
        x = k = 0
        while True:
            if p >= n:
                return None
            c = counts[p] - 48
            if not 0 <= c < 64:
                return None
            x |= (c & 0x1F) << (5 * k)
            p, k = p + 1, k + 1
            if not c & 0x20:
                if c & 0x10:
                    x |= -1 << (5 * k)
                break
        if len(out) > 2:
            x += out[-2]
        out.append(x)
    return out


def _rle_problem(seg: dict) -> str | None:
    """Why a COCO RLE dict cannot be decoded (pycocotools does not check; it reads past the
    runs), or None."""
    size, counts = seg.get("size"), seg.get("counts")
    if not (isinstance(size, list | tuple) and len(size) == 2 and all(_is_number(v) for v in size)):
        return "invalid RLE (bad size)"
    if isinstance(counts, str):
        try:
            counts = counts.encode("ascii")
        except UnicodeEncodeError:
            return "invalid RLE (non-ASCII counts)"
    if isinstance(counts, bytes):
        runs = _rle_counts(counts)
    elif isinstance(counts, list) and all(isinstance(v, int) for v in counts):
        runs = counts
    else:
        runs = None
    if runs is None or any(v < 0 for v in runs) or sum(runs) != int(size[0]) * int(size[1]):
        return "invalid RLE (runs do not cover the image)"
    return None


def _normalised_box(bbox, w: int, h: int) -> np.ndarray | str:
    """COCO ``[x, y, w, h]`` pixels -> float32 (x0, y0, x1, y1) / image size clamped to [0, 1]
    (upstream's arithmetic for boxes inside the image), or the reason it is unusable."""
    if not isinstance(bbox, list | tuple) or len(bbox) != 4 or not all(map(_is_number, bbox)):
        return "malformed bbox"
    v = np.asarray(bbox, np.float32)
    if not np.isfinite(v).all():
        return "malformed bbox"
    if v[2] <= 0 or v[3] <= 0:
        return "degenerate bbox (width or height <= 0)"
    n = v / np.asarray([w, h, w, h], np.float32)
    box = np.asarray([n[0], n[1], n[0] + n[2], n[1] + n[3]], np.float32)
    box = np.clip(box, np.float32(0), np.float32(1))
    if box[2] <= box[0] or box[3] <= box[1]:
        return "bbox outside the image"
    return box


def _resize_mask(mask: np.ndarray, side: int) -> np.ndarray:
    """H x W 0/1 -> side x side bool: bilinear (antialiased when shrinking), > 0.5."""
    f = Image.fromarray(mask.astype(np.float32)).resize((side, side), Image.BILINEAR)
    return np.asarray(f) > 0.5


def _jitter_box(box, w: int, h: int, rng, std: float, max_px: float | None) -> np.ndarray:
    """Upstream's ``noise_box``: pixel (x0, y0, x1, y1) + N(0, std * box size), each offset at
    most ``max_px``, clamped to the image; the box itself if the result is empty."""
    if std <= 0:
        return box
    bw, bh = box[2] - box[0], box[3] - box[1]
    noise = std * rng.standard_normal(4).astype(np.float32) * np.asarray([bw, bh, bw, bh])
    if max_px is not None:
        noise = np.clip(noise, -max_px, max_px)
    out = np.clip(box + noise, 0, np.asarray([w, h, w, h], np.float32)).astype(np.float32)
    return out if out[2] > out[0] and out[3] > out[1] else box


class _Unreadable(Exception):
    pass


class ConceptDataset:
    """Text-prompted find queries over a COCO detection / instance JSON file (module doc).

    ``path``: the JSON file, or a folder holding ``_annotations.coco.json`` (Roboflow's COCO
    export, images beside it) or ``annotations.json``. ``images``: the image folder; default
    ``<json folder>/images`` if it exists, else the JSON's folder. ``with_masks``: load masks
    (None: if any annotation has a segmentation); without masks, samples have ``masks=None``
    (box-only training, upstream's default for these configs). ``num_images``: keep that many
    images, the same ones as upstream's ``limit_ids`` (the roboflow configs' ``num_images``).
    ``prompts``: category id -> text, instead of the category names. ``skips``: a shared
    :class:`~paddle_sam.train.data.SkipLog`. Call :meth:`set_epoch` at each epoch.
    """

    def __init__(
        self,
        path: str | Path,
        images: str | Path | None = None,
        *,
        resolution: int = RESOLUTION,
        train: bool = True,
        min_size: int = MIN_RESIZE,
        mean: Sequence[float] = NORM_MEAN,
        std: Sequence[float] = NORM_STD,
        with_masks: bool | None = None,
        include_negatives: bool = True,
        max_negatives: int | None = None,
        max_targets: int = MAX_TARGETS,
        exemplar_prob: float = 0.0,
        exemplar_keeps_text: bool = False,
        box_noise_std: float = BOX_NOISE_STD,
        box_noise_max: float | None = BOX_NOISE_MAX,
        num_images: int | None = None,
        prompts: Mapping[int, str] | None = None,
        seed: int = 0,
        skips: SkipLog | None = None,
    ) -> None:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if not 0.0 <= exemplar_prob <= 1.0:
            raise ValueError(f"exemplar_prob must be in [0, 1], got {exemplar_prob}")
        if max_negatives is not None and max_negatives < 0:
            raise ValueError(f"max_negatives must be >= 0 or None, got {max_negatives}")
        self.ann_path = self.find_annotations(Path(path))
        self.image_dir = self._find_images(self.ann_path, images)
        self.resolution, self.train = int(resolution), bool(train)
        self.scales = resize_scales(resolution, min_size) if train else [self.resolution]
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)
        self.include_negatives, self.max_negatives = include_negatives, max_negatives
        self.max_targets = int(max_targets)
        self.exemplar_prob, self.exemplar_keeps_text = float(exemplar_prob), exemplar_keeps_text
        self.box_noise_std, self.box_noise_max = box_noise_std, box_noise_max
        self.seed, self.epoch = int(seed), 0
        self.skips = skips if skips is not None else SkipLog()
        self.source = str(self.ann_path)

        doc = _read_coco(self.ann_path)
        self.categories = _read_categories(doc, self.ann_path, prompts)
        if with_masks is None:
            with_masks = any(
                isinstance(a, dict) and a.get("segmentation") not in (None, [], {})
                for a in doc["annotations"]
            )
        self.with_masks = bool(with_masks)
        self.records: list[_ImageRecord] = []
        self._parse(doc, num_images)
        if not self.records:
            raise ValueError(
                f"no usable images in {self.ann_path} (images from {self.image_dir}; "
                f"{self.skips.summary()})"
            )
        counts = [len(r.positives) + self._num_negatives(r) for r in self.records]
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
        self._bad: set[int] = set()
        self._cache: tuple | None = None

    # ---- reading the file ----

    @staticmethod
    def find_annotations(path: Path) -> Path:
        if path.is_dir():
            for name in ANNOTATION_FILES:
                if (path / name).is_file():
                    return path / name
            raise FileNotFoundError(f"no {' or '.join(ANNOTATION_FILES)} in {path}")
        if not path.is_file():
            raise FileNotFoundError(f"COCO annotation file not found: {path}")
        return path

    @staticmethod
    def _find_images(ann_path: Path, images: str | Path | None) -> Path:
        if images is not None:
            image_dir = Path(images)
        elif (ann_path.parent / "images").is_dir():
            image_dir = ann_path.parent / "images"
        else:
            image_dir = ann_path.parent
        if not image_dir.is_dir():
            raise FileNotFoundError(f"image folder not found: {image_dir}")
        return image_dir

    def _parse(self, doc: dict, num_images: int | None) -> None:
        name = self.ann_path.name
        infos: dict = {}
        for info in doc["images"]:
            ok = isinstance(info, dict) and isinstance(info.get("file_name"), str)
            if not ok or not isinstance(info.get("id"), int | str):
                self.skips.add("bad image entry", f"{name}: {str(info)[:120]}")
            elif info["id"] in infos:
                self.skips.add("duplicate image id", f"{name}: image {info['id']!r}")
            else:
                infos[info["id"]] = info
        by_image: dict = {}
        for a in doc["annotations"]:
            iid = a.get("image_id") if isinstance(a, dict) else None
            if not isinstance(a, dict):
                self.skips.add("bad annotation entry", f"{name}: {str(a)[:120]}")
            elif not isinstance(iid, int | str) or iid not in infos:
                where = f"{name}: annotation {a.get('id')!r} (image_id {iid!r})"
                self.skips.add("annotation of an unknown image", where)
            else:
                by_image.setdefault(iid, []).append(a)
        ids = sorted(infos, key=_sort_key)
        if num_images is not None:  # upstream's limit_ids: a fixed shuffle of the datapoints
            order = list(range(len(ids)))
            random.Random(len(order)).shuffle(order)
            ids = [ids[i] for i in sorted(order[:num_images])]
        for iid in ids:
            record = self._image_record(infos[iid], by_image.get(iid, []))
            if record is not None:
                self.records.append(record)

    def _image_record(self, info: dict, anns: list[dict]) -> _ImageRecord | None:
        try:
            path = resolve_under(self.image_dir, info["file_name"])
        except OutsideRootError as exc:
            self.skips.add("file_name outside the image folder", f"{self.ann_path.name}: {exc}")
            return None
        if not path.is_file():
            self.skips.add("missing image file", str(path))
            return None
        w, h = info.get("width"), info.get("height")
        if not (isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0):
            try:
                w, h = image_size(path, str(path))  # the header only
            except Exception as exc:  # PIL raises many types for damaged files
                self.skips.add("unreadable image", unreadable(path, exc))
                return None
        by_cat: dict[int, list[_Object]] = {c: [] for c in self.categories}
        lossy: set[int] = set()
        for a in anns:
            where = f"{self.ann_path.name}: annotation {a.get('id')!r} (image {info['file_name']})"
            cat = a.get("category_id")
            if not isinstance(cat, int) or cat not in self.categories:
                self.skips.add("unknown category", f"{where}: category_id {cat!r}")
            elif a.get("iscrowd", 0):
                self.skips.add("crowd annotation (FilterCrowds)", where)
            else:
                obj = self._object(a, cat, w, h, where)
                if obj is None:
                    lossy.add(cat)
                else:
                    by_cat[cat].append(obj)
        objects: list[_Object] = []
        positives: dict[int, list[int]] = {}
        for cat, objs in by_cat.items():
            if len(objs) > self.max_targets:
                self.skips.add(
                    "query with too many targets",
                    f"{path.name}: {len(objs)} x {self.categories[cat]!r} (max {self.max_targets})",
                )
                lossy.add(cat)
            elif objs:
                positives[cat] = list(range(len(objects), len(objects) + len(objs)))
                objects.extend(objs)
        negatives = []
        if self.include_negatives:
            negatives = [c for c in self.categories if c not in positives and c not in lossy]
        if not positives and not negatives:
            self.skips.add("image without queries", str(path))
            return None
        exhaustive = {c: c not in lossy for c in positives}
        return _ImageRecord(path, info["id"], objects, positives, exhaustive, negatives)

    def _object(self, a: dict, cat: int, w: int, h: int, where: str) -> _Object | None:
        bbox, seg = a.get("bbox"), a.get("segmentation")
        has_box, has_seg = bbox not in (None, []), seg not in (None, [], {})
        rle = None
        if has_seg and (self.with_masks or not has_box):
            rle = self._mask_rle(seg, w, h, where)
        if has_box:
            box = _normalised_box(bbox, w, h)
            if isinstance(box, str):
                self.skips.add(box, f"{where}: bbox {bbox!r} in a {w}x{h} image")
                return None
        elif rle is not None:
            from pycocotools import mask as mask_utils

            box = _normalised_box(mask_utils.toBbox(rle).tolist(), w, h)
        else:
            if not has_seg:
                self.skips.add("annotation without bbox or segmentation", where)
            return None
        return _Object(cat, box, rle if self.with_masks else None)

    def _mask_rle(self, seg, w: int, h: int, where: str) -> dict | None:
        """The segmentation as compressed RLE, None (counted) if it cannot be decoded."""
        from pycocotools import mask as mask_utils

        if isinstance(seg, dict):
            problem = _rle_problem(seg)
            if problem:
                self.skips.add(problem, where)
                return None
        try:
            mask = decode_segmentation(seg, h, w, where, self.skips)
        except (TypeError, ValueError, KeyError, OverflowError) as exc:
            self.skips.add("undecodable segmentation", f"{where}: {exc}")
            return None
        if mask is None:
            return None
        return mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))

    # ---- queries ----

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def num_images(self) -> int:
        return len(self.records)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next samples are drawn for (negatives, resize, padding, exemplars)."""
        self.epoch = int(epoch)

    def queries(self, image_index: int) -> range:
        """The sample indices of image ``image_index``'s queries."""
        return range(self._starts[image_index], self._starts[image_index + 1])

    def image_batches(
        self, images_per_batch: int = 1, shuffle: bool = True, drop_last: bool = False
    ) -> list[list[int]]:
        """Batches of sample indices holding all the queries of ``images_per_batch`` images
        (upstream's batches: whole datapoints; the roboflow configs take one image per batch),
        in an order drawn from ``(seed, epoch)`` when ``shuffle``."""
        if images_per_batch < 1:
            raise ValueError(f"images_per_batch must be >= 1, got {images_per_batch}")
        order = np.arange(self.num_images)
        if shuffle:
            order = np.random.default_rng([self.seed, self.epoch, _SHUFFLE]).permutation(order)
        groups = [order[i : i + images_per_batch] for i in range(0, len(order), images_per_batch)]
        if drop_last and groups and len(groups[-1]) < images_per_batch:
            groups.pop()
        return [[q for i in g for q in self.queries(int(i))] for g in groups]

    def _rng(self, image_index: int, purpose: int, *more: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, image_index, purpose, *more])

    def _num_negatives(self, record: _ImageRecord) -> int:
        n = len(record.negatives)
        return n if self.max_negatives is None else min(n, self.max_negatives)

    def query_categories(self, image_index: int) -> list[int]:
        """The category ids image ``image_index`` is asked for this epoch, in sample order."""
        rec = self.records[image_index]
        negatives = rec.negatives
        if self._num_negatives(rec) < len(negatives):
            pick = self._rng(image_index, _NEGATIVES).choice(
                len(negatives), self._num_negatives(rec), replace=False
            )
            negatives = [negatives[j] for j in sorted(pick)]
        return sorted([*rec.positives, *negatives])

    def _geometry(self, image_index: int) -> tuple[int, int, int]:
        """(side of the resized image, left pad, top pad) of an image this epoch."""
        if not self.train:
            return self.resolution, 0, 0
        rng = self._rng(image_index, _GEOMETRY)
        side = self.scales[int(rng.integers(len(self.scales)))]
        room = self.resolution - side
        return side, int(rng.integers(room + 1)), int(rng.integers(room + 1))

    def _image(self, image_index: int) -> tuple[np.ndarray, tuple[int, int]]:
        """(3 x R x R normalised image, (h, w) of the file), cached for the image's queries."""
        key = (image_index, self.epoch)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        path = self.records[image_index].path
        try:
            rgb = read_rgb(path)
        except Exception as exc:  # PIL raises many types for damaged files
            self.skips.add("unreadable image", unreadable(path, exc))
            self._bad.add(image_index)
            raise _Unreadable from None
        side, left, top = self._geometry(image_index)
        scaled = np.asarray(Image.fromarray(rgb).resize((side, side), Image.BILINEAR))
        r = self.resolution
        canvas = np.zeros((r, r, 3), np.float32)  # the padding is black before normalising
        canvas[top : top + side, left : left + side] = scaled.astype(np.float32) / np.float32(255)
        image = np.ascontiguousarray(((canvas - self.mean) / self.std).transpose(2, 0, 1))
        image.flags.writeable = False  # shared by the image's queries
        value = (image, rgb.shape[:2])
        self._cache = (key, value)
        return value

    def _to_canvas(self, boxes: np.ndarray, w: int, h: int, geometry) -> np.ndarray:
        """Pixel (x0, y0, x1, y1) in the image -> normalised (cx, cy, w, h) in the canvas."""
        side, left, top = geometry
        boxes = boxes * np.asarray([side / w, side / h, side / w, side / h], np.float32)
        boxes = boxes + np.asarray([left, top, left, top], np.float32)
        x0, y0, x1, y1 = boxes.T
        cxcywh = np.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], axis=-1)
        return (cxcywh / np.float32(self.resolution)).astype(np.float32).reshape(-1, 4)

    def __getitem__(self, index: int) -> ConceptSample:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of a dataset of {len(self)}")
        for _ in range(len(self)):  # an unreadable image: the next sample, as upstream retries
            image_index = bisect_right(self._starts, index) - 1
            if image_index not in self._bad:
                try:
                    return self._sample(image_index, index - self._starts[image_index])
                except _Unreadable:
                    pass
            index = (index + 1) % len(self)
        raise ValueError(f"no readable image in {self.ann_path} ({self.skips.summary()})")

    def _sample(self, image_index: int, slot: int) -> ConceptSample:
        rec = self.records[image_index]
        cat = self.query_categories(image_index)[slot]
        image, (h, w) = self._image(image_index)
        geometry = self._geometry(image_index)
        obj_ids = rec.positives.get(cat, [])
        limits = np.asarray([w, h, w, h], np.float32)
        pixel = np.zeros((len(obj_ids), 4), np.float32)
        for t, j in enumerate(obj_ids):
            pixel[t] = np.minimum(rec.objects[j].box * limits, limits)
        r, (side, left, top) = self.resolution, geometry
        masks, valid = None, np.ones(len(obj_ids), bool)
        if self.with_masks:
            masks = np.zeros((len(obj_ids), r, r), bool)
            for t, j in enumerate(obj_ids):
                rle = rec.objects[j].rle
                if rle is None:
                    valid[t] = False
                else:
                    masks[t, top : top + side, left : left + side] = _resize_mask(
                        decode_coco_rle(rle), side
                    )
        text = self.categories[cat]
        exemplars = np.zeros((0, 4), np.float32)
        if self.exemplar_prob > 0 and obj_ids:
            rng = self._rng(image_index, _EXEMPLAR, cat)
            if rng.random() <= self.exemplar_prob:
                box = pixel[int(rng.integers(len(obj_ids)))]
                box = _jitter_box(box, w, h, rng, self.box_noise_std, self.box_noise_max)
                exemplars = self._to_canvas(box[None], w, h, geometry)
                text = text if self.exemplar_keeps_text else VISUAL_TEXT
        return ConceptSample(
            image=image,
            text=text,
            boxes=self._to_canvas(pixel, w, h, geometry),
            masks=masks,
            is_valid_mask=valid,
            object_ids=np.asarray(obj_ids, np.int64),
            is_exhaustive=rec.exhaustive.get(cat, True),
            exemplar_boxes=exemplars,
            exemplar_labels=np.ones(len(exemplars), np.int64),
            category_id=cat,
            image_id=rec.image_id,
            image_index=image_index,
            epoch=self.epoch,
            original_size=(h, w),
            resized=side,
            pad=(left, top),
            source=self.source,
        )


def collate_concepts(samples: Sequence[ConceptSample], share_images: bool = True) -> dict:
    """A batch of find queries in upstream's collator layout, as Paddle tensors (CPU).

    Returns ``images`` (``N x 3 x R x R`` float32: each image once when ``share_images`` and
    queries of the same image and epoch meet in the batch, else one per query, N = B),
    ``img_ids`` (int64 B: each query's row of ``images``), ``texts`` (B prompt texts),
    ``text_batch`` (the distinct texts) and ``text_ids`` (int64 B: each query's text in
    ``text_batch``), ``find_input`` (the model's ``FindStage``: image and text ids, exemplar
    boxes ``E x B x 4``, their labels ``E x B`` and padding mask ``B x E``, E = most exemplars of
    a query), ``geometric_prompt`` (the same boxes as the model's ``Prompt``), ``targets``
    (:func:`~paddle_sam.train.sam3.sam3_loss.make_find_targets` of the queries' boxes, masks or
    None, mask validity, exhaustivity and object ids), ``category_ids`` and ``image_ids``.
    """
    if not samples:
        raise ValueError("collate_concepts needs at least one sample")
    shape = samples[0].image.shape
    if any(s.image.shape != shape for s in samples):
        raise ValueError(
            f"samples of different image sizes: {sorted({s.image.shape for s in samples})}"
        )
    has_masks = {s.masks is not None for s in samples}
    if len(has_masks) > 1:
        raise ValueError("some samples have masks and some do not: use one with_masks setting")
    rows: list[np.ndarray] = []
    row_of: dict = {}
    img_ids = []
    for s in samples:
        key = (s.source, s.image_index, s.epoch, s.resized, s.pad) if share_images else len(rows)
        if key not in row_of:
            row_of[key] = len(rows)
            rows.append(s.image)
        img_ids.append(row_of[key])
    texts = [s.text for s in samples]
    text_batch = list(dict.fromkeys(texts))
    img_ids_t = paddle.to_tensor(np.asarray(img_ids, np.int64))
    text_ids_t = paddle.to_tensor(np.asarray([text_batch.index(t) for t in texts], np.int64))

    with_masks = has_masks == {True}
    targets = make_find_targets(
        [paddle.to_tensor(s.boxes.reshape(-1, 4).astype(np.float32)) for s in samples],
        masks=[paddle.to_tensor(s.masks) for s in samples] if with_masks else None,
        is_valid_mask=[paddle.to_tensor(s.is_valid_mask) for s in samples] if with_masks else None,
        is_exhaustive=[bool(s.is_exhaustive) for s in samples],
        object_ids=[paddle.to_tensor(s.object_ids.astype(np.int64)) for s in samples],
    )

    B, E = len(samples), max(len(s.exemplar_boxes) for s in samples)
    boxes = np.zeros((E, B, 4), np.float32)
    labels = np.zeros((E, B), np.int64)
    padding = np.ones((B, E), bool)
    for b, s in enumerate(samples):
        n = len(s.exemplar_boxes)
        boxes[:n, b], labels[:n, b], padding[b, :n] = s.exemplar_boxes, s.exemplar_labels, False
    boxes_t, labels_t, padding_t = map(paddle.to_tensor, (boxes, labels, padding))
    return {
        "images": paddle.to_tensor(np.stack(rows)),
        "img_ids": img_ids_t,
        "texts": texts,
        "text_batch": text_batch,
        "text_ids": text_ids_t,
        "find_input": FindStage(
            img_ids=img_ids_t,
            text_ids=text_ids_t,
            input_boxes=boxes_t,
            input_boxes_mask=padding_t,
            input_boxes_label=labels_t,
        ),
        "geometric_prompt": Prompt(box_embeddings=boxes_t, box_mask=padding_t, box_labels=labels_t),
        "targets": targets,
        "category_ids": [s.category_id for s in samples],
        "image_ids": [s.image_id for s in samples],
    }
