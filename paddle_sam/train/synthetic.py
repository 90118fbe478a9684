"""Procedural synthetic scenes: overlapping shapes on varied backgrounds, with exact masks.

Every scene is a pure function of ``(seed, index)``, so a dataset of any size is reproducible
without storing it. Shapes of many kinds (discs, ellipses, rotated rectangles, triangles,
polygons, stars, rings, crescents, crosses, thin lines) are painted back to front with flat,
striped, gradient or speckled fills; an instance's mask is the part still visible after later
shapes are painted over it (occlusion). :func:`write_dataset` writes scenes as COCO instance
JSON, SA-1B style per-image JSON or a folder of images with per-instance mask PNGs, which
:mod:`paddle_sam.train.sam_v1.data` reads back.

Concept scenes (for SAM 3's text prompts, :func:`concept_scene`): a few shapes from a small
fixed vocabulary of named shapes in named colours (:data:`CONCEPT_PHRASES`: "red star",
"star", ...); :func:`write_concept_dataset` writes them as COCO JSON whose categories are the
phrases, which :mod:`paddle_sam.train.sam3.data` reads.
"""

from __future__ import annotations

import colorsys
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..predict.io import coco_bbox, coco_rle

SHAPES = (
    "disc",
    "ellipse",
    "rectangle",
    "triangle",
    "polygon",
    "star",
    "ring",
    "crescent",
    "cross",
    "line",
)
FORMATS = ("coco", "sa1b", "folder")


@dataclass
class Scene:
    image: np.ndarray  # H x W x 3 uint8
    masks: list[np.ndarray] = field(default_factory=list)  # visible part, H x W bool each
    kinds: list[str] = field(default_factory=list)


def _colour(rng: np.random.Generator) -> np.ndarray:
    h, s, v = rng.random(), rng.uniform(0.35, 1.0), rng.uniform(0.3, 1.0)
    return np.array(colorsys.hsv_to_rgb(h, s, v), dtype=np.float32) * 255.0


def _smooth_noise(rng: np.random.Generator, h: int, w: int, cells: int) -> np.ndarray:
    """H x W float32 in [0, 1]: a random grid bilinearly upsampled (low-frequency noise)."""
    grid = (rng.random((cells, cells)) * 255).astype(np.uint8)
    return np.asarray(Image.fromarray(grid).resize((w, h), Image.BILINEAR), np.float32) / 255.0


def _texture(rng: np.random.Generator, h: int, w: int, strength: float) -> np.ndarray:
    """H x W x 3 float32 fill: flat, stripes, gradient, checker or speckle around a colour."""
    base = _colour(rng)
    kind = rng.choice(["flat", "flat", "stripes", "gradient", "checker", "speckle"])
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if kind == "flat":
        return np.broadcast_to(base, (h, w, 3)).copy()
    other = _colour(rng) if rng.random() < 0.5 else base * rng.uniform(0.5, 0.8)
    if kind == "stripes":
        angle, period = rng.uniform(0, math.pi), rng.uniform(6, 24)
        t = np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / period) > 0
        t = t.astype(np.float32)
    elif kind == "gradient":
        angle = rng.uniform(0, 2 * math.pi)
        t = xx * math.cos(angle) + yy * math.sin(angle)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1.0)
    elif kind == "checker":
        cell = int(rng.integers(6, 20))
        t = (((xx // cell) + (yy // cell)) % 2).astype(np.float32)
    else:
        t = _smooth_noise(rng, h, w, int(rng.integers(4, 24)))
    t = t[..., None] * strength
    return base * (1 - t) + other * t


def _polygon_mask(size: tuple[int, int], pts: np.ndarray) -> np.ndarray:
    img = Image.new("L", size, 0)
    ImageDraw.Draw(img).polygon([tuple(p) for p in pts.tolist()], fill=1)
    return np.asarray(img, bool)


def _ellipse_pts(cx, cy, rx, ry, angle, n=96) -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    x, y = rx * np.cos(t), ry * np.sin(t)
    c, s = math.cos(angle), math.sin(angle)
    return np.stack([cx + x * c - y * s, cy + x * s + y * c], axis=1)


def _shape_mask(rng: np.random.Generator, kind: str, w: int, h: int, scale: float) -> np.ndarray:
    """H x W bool mask of one shape of ``kind``, about ``scale`` pixels across."""
    size = (w, h)
    r = scale / 2
    cx, cy = rng.uniform(-0.1 * w, 1.1 * w), rng.uniform(-0.1 * h, 1.1 * h)
    cx, cy = float(np.clip(cx, r * 0.3, w - r * 0.3)), float(np.clip(cy, r * 0.3, h - r * 0.3))
    angle = rng.uniform(0, 2 * math.pi)
    if kind == "disc":
        return _polygon_mask(size, _ellipse_pts(cx, cy, r, r, 0.0))
    if kind == "ellipse":
        return _polygon_mask(size, _ellipse_pts(cx, cy, r, r * rng.uniform(0.35, 0.8), angle))
    if kind == "rectangle":
        a, b = r, r * rng.uniform(0.3, 1.0)
        corners = np.array([[-a, -b], [a, -b], [a, b], [-a, b]])
        c, s = math.cos(angle), math.sin(angle)
        rot = corners @ np.array([[c, s], [-s, c]])
        return _polygon_mask(size, rot + [cx, cy])
    if kind in ("triangle", "polygon"):
        n = 3 if kind == "triangle" else int(rng.integers(5, 9))
        t = angle + np.linspace(0, 2 * math.pi, n, endpoint=False)
        t += rng.uniform(-0.4, 0.4, n) * (math.pi / n)
        rr = r * rng.uniform(0.8, 1.0, n)
        return _polygon_mask(size, np.stack([cx + rr * np.cos(t), cy + rr * np.sin(t)], 1))
    if kind == "star":
        n = int(rng.integers(5, 8))
        t = angle + np.linspace(0, 2 * math.pi, 2 * n, endpoint=False)
        rr = np.where(np.arange(2 * n) % 2 == 0, r, r * rng.uniform(0.4, 0.6))
        return _polygon_mask(size, np.stack([cx + rr * np.cos(t), cy + rr * np.sin(t)], 1))
    if kind == "ring":
        outer = _polygon_mask(size, _ellipse_pts(cx, cy, r, r, 0.0))
        inner = _polygon_mask(size, _ellipse_pts(cx, cy, r * rng.uniform(0.45, 0.7), r * 0.6, 0))
        return outer & ~inner
    if kind == "crescent":
        outer = _polygon_mask(size, _ellipse_pts(cx, cy, r, r, 0.0))
        d = r * rng.uniform(0.35, 0.6)
        bite = _ellipse_pts(cx + d * math.cos(angle), cy + d * math.sin(angle), r, r, 0.0)
        return outer & ~_polygon_mask(size, bite)
    if kind == "cross":
        a, b = r, r * rng.uniform(0.2, 0.35)
        c, s = math.cos(angle), math.sin(angle)
        rot = np.array([[c, s], [-s, c]])
        bar = np.array([[-a, -b], [a, -b], [a, b], [-a, b]])
        return _polygon_mask(size, bar @ rot + [cx, cy]) | _polygon_mask(
            size, bar[:, ::-1] @ rot + [cx, cy]
        )
    if kind == "line":  # a thin structure: a polyline 3-8 px wide
        img = Image.new("L", size, 0)
        pts = [(cx, cy)]
        for _ in range(int(rng.integers(1, 4))):
            angle += rng.uniform(-0.8, 0.8)
            step = scale * rng.uniform(0.5, 1.0)
            pts.append((pts[-1][0] + step * math.cos(angle), pts[-1][1] + step * math.sin(angle)))
        ImageDraw.Draw(img).line(pts, fill=1, width=int(rng.integers(3, 9)), joint="curve")
        return np.asarray(img, bool)
    raise ValueError(f"unknown shape kind {kind!r}; choose from {SHAPES}")


def make_scene(
    rng: np.random.Generator,
    width: int = 640,
    height: int = 480,
    num_shapes: tuple[int, int] = (3, 9),
    min_area: int = 150,
    kinds: tuple[str, ...] = SHAPES,
) -> Scene:
    """One random scene; instances whose visible part is under ``min_area`` px are dropped."""
    bg = _texture(rng, height, width, strength=rng.uniform(0.2, 0.6))
    bg = bg * 0.8 + _smooth_noise(rng, height, width, 6)[..., None] * 50.0
    canvas = bg.astype(np.float32)
    masks: list[np.ndarray] = []
    names: list[str] = []
    ref = min(width, height)
    for _ in range(int(rng.integers(num_shapes[0], num_shapes[1] + 1))):
        kind = str(rng.choice(kinds))
        scale = ref * rng.uniform(0.12, 0.45)
        m = _shape_mask(rng, kind, width, height, scale)
        if not m.any():
            continue
        ys, xs = np.nonzero(m)
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        fill = _texture(rng, int(y1 - y0), int(x1 - x0), strength=rng.uniform(0.3, 0.8))
        region = canvas[y0:y1, x0:x1]
        canvas[y0:y1, x0:x1] = np.where(m[y0:y1, x0:x1, None], fill, region)
        masks = [old & ~m for old in masks]
        masks.append(m)
        names.append(kind)
    canvas = canvas + rng.normal(0, rng.uniform(0, 6), canvas.shape)
    image = np.clip(canvas, 0, 255).astype(np.uint8)
    keep = [i for i, m in enumerate(masks) if m.sum() >= min_area]
    return Scene(image, [masks[i] for i in keep], [names[i] for i in keep])


def scene_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(index)])


def scene_size(rng: np.random.Generator, sizes: list[list[int]] | None) -> tuple[int, int]:
    """(width, height): one of ``sizes`` ([[w, h], ...]) at random, 640 x 480 if None."""
    if not sizes:
        return 640, 480
    w, h = sizes[int(rng.integers(len(sizes)))]
    return int(w), int(h)


def synthetic_scene(seed: int, index: int, sizes: list[list[int]] | None = None) -> Scene:
    """Scene ``index`` of the synthetic dataset ``seed`` (the same on every machine)."""
    rng = scene_rng(seed, index)
    w, h = scene_size(rng, sizes)
    return make_scene(rng, w, h)


def instance_map(masks: list[np.ndarray]) -> np.ndarray:
    """H x W uint8: 0 background, i + 1 where mask i is (visible masks never overlap)."""
    if len(masks) > 255:
        raise ValueError(f"{len(masks)} instances do not fit an 8-bit instance map")
    out = np.zeros(masks[0].shape, np.uint8)
    for i, m in enumerate(masks):
        out[m] = i + 1
    return out


def _coco_annotation(ann_id: int, image_id: int, category_id: int, mask: np.ndarray) -> dict:
    """One COCO instance annotation of ``mask`` (RLE segmentation, pixel-extent bbox)."""
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "segmentation": coco_rle(mask),
        "area": int(mask.sum()),
        "bbox": coco_bbox(mask),
        "iscrowd": 0,
    }


def _prepare_out(out: str | Path, overwrite: bool) -> Path:
    """``out`` created; refused when it is not empty unless ``overwrite``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} is not empty; pass --overwrite to write into it")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_dataset(
    out: str | Path,
    fmt: str,
    num_images: int,
    seed: int = 0,
    sizes: list[list[int]] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``num_images`` synthetic scenes to ``out`` in format ``fmt`` (coco, sa1b, folder).

    coco: ``images/NNNNNN.png`` + ``annotations.json`` (RLE segmentations); sa1b:
    ``sa_NNNNNN.png`` + ``sa_NNNNNN.json`` per image; folder: ``images/NNNNNN.png`` +
    ``masks/NNNNNN/III.png``. Refuses a non-empty ``out`` unless ``overwrite``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown dataset format {fmt!r}; choose from {FORMATS}")
    out = _prepare_out(out, overwrite)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "shape"}]}
    ann_id = 1
    for i in range(num_images):
        scene = synthetic_scene(seed, i, sizes)
        h, w = scene.image.shape[:2]
        name = f"{i:06d}"
        if fmt == "sa1b":
            Image.fromarray(scene.image).save(out / f"sa_{name}.png")
            anns = []
            for j, m in enumerate(scene.masks):
                anns.append(
                    {
                        "id": j,
                        "segmentation": coco_rle(m),
                        "bbox": coco_bbox(m),
                        "area": int(m.sum()),
                        "predicted_iou": 1.0,
                        "stability_score": 1.0,
                        "crop_box": [0, 0, w, h],
                        "point_coords": [],
                    }
                )
            doc = {
                "image": {"image_id": i, "width": w, "height": h, "file_name": f"sa_{name}.png"},
                "annotations": anns,
            }
            (out / f"sa_{name}.json").write_text(json.dumps(doc) + "\n")
            continue
        (out / "images").mkdir(exist_ok=True)
        Image.fromarray(scene.image).save(out / "images" / f"{name}.png")
        if fmt == "folder":
            mdir = out / "masks" / name
            mdir.mkdir(parents=True, exist_ok=True)
            for j, m in enumerate(scene.masks):
                Image.fromarray(m.astype(np.uint8) * 255).save(mdir / f"{j:03d}.png")
            continue
        coco["images"].append({"id": i + 1, "file_name": f"{name}.png", "width": w, "height": h})
        for m in scene.masks:
            coco["annotations"].append(_coco_annotation(ann_id, i + 1, 1, m))
            ann_id += 1
    if fmt == "coco":
        (out / "annotations.json").write_text(json.dumps(coco) + "\n")
    return out


EXAMPLE_OBJECTS = (
    # (kind, centre x, centre y, size px, colour) on a 640 x 480 canvas, back to front
    ("rectangle", 175, 300, 190, (52, 101, 164)),
    ("triangle", 470, 300, 170, (78, 154, 6)),
    ("disc", 520, 110, 120, (204, 0, 0)),
    ("star", 300, 160, 160, (237, 212, 0)),
    ("ring", 110, 120, 130, (117, 80, 123)),
    ("ellipse", 380, 410, 150, (245, 121, 0)),
)


def example_scene(seed: int = 2024) -> Scene:
    """The bundled example image: six everyday shapes at fixed places (640 x 480), each a
    flat colour with a little shading, on a soft gradient."""
    rng = np.random.default_rng(seed)
    w, h = 640, 480
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    top, bottom = np.array([170, 200, 225], np.float32), np.array([225, 215, 190], np.float32)
    t = (yy / (h - 1))[..., None]
    canvas = top * (1 - t) + bottom * t + (_smooth_noise(rng, h, w, 8)[..., None] - 0.5) * 30
    masks: list[np.ndarray] = []
    kinds: list[str] = []
    for kind, cx, cy, size, colour in EXAMPLE_OBJECTS:
        r = size / 2
        if kind == "rectangle":
            pts = np.array(
                [
                    [cx - r, cy - r * 0.6],
                    [cx + r, cy - r * 0.6],
                    [cx + r, cy + r * 0.6],
                    [cx - r, cy + r * 0.6],
                ]
            )
            m = _polygon_mask((w, h), pts)
        elif kind == "triangle":
            pts = np.array(
                [[cx, cy - r], [cx + r * 0.9, cy + r * 0.7], [cx - r * 0.9, cy + r * 0.7]]
            )
            m = _polygon_mask((w, h), pts)
        elif kind == "disc":
            m = _polygon_mask((w, h), _ellipse_pts(cx, cy, r, r, 0.0))
        elif kind == "star":
            a = -math.pi / 2 + np.linspace(0, 2 * math.pi, 10, endpoint=False)
            rr = np.where(np.arange(10) % 2 == 0, r, r * 0.45)
            m = _polygon_mask((w, h), np.stack([cx + rr * np.cos(a), cy + rr * np.sin(a)], 1))
        elif kind == "ring":
            m = _polygon_mask((w, h), _ellipse_pts(cx, cy, r, r, 0.0)) & ~_polygon_mask(
                (w, h), _ellipse_pts(cx, cy, r * 0.55, r * 0.55, 0.0)
            )
        else:
            m = _polygon_mask((w, h), _ellipse_pts(cx, cy, r, r * 0.5, 0.2))
        shade = 1 + (_smooth_noise(rng, h, w, 12)[..., None] - 0.5) * 0.25
        fill = np.array(colour, np.float32) * shade
        canvas = np.where(m[..., None], fill, canvas)
        masks = [old & ~m for old in masks]
        masks.append(m)
        kinds.append(kind)
    canvas = canvas + rng.normal(0, 2.0, canvas.shape)
    return Scene(np.clip(canvas, 0, 255).astype(np.uint8), masks, kinds)


# ---- concept scenes (SAM 3): named shapes in named colours, with their noun phrases ----

# the fixed vocabulary of the concept scenes: every instance is one of these shapes (noun ->
# the shape kind drawn) in one of these flat colours (name -> RGB); it answers to two phrases,
# "<colour> <shape>" ("red star") and "<shape>" ("star")
CONCEPT_COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (45, 85, 225),
    "yellow": (235, 205, 40),
}
CONCEPT_SHAPES = {
    "circle": "disc",
    "rectangle": "rectangle",
    "triangle": "triangle",
    "star": "star",
    "ring": "ring",
    "cross": "cross",
}
# the categories of :func:`write_concept_dataset`, in category-id order (ids 1, 2, ...)
CONCEPT_PHRASES = tuple(f"{c} {s}" for c in CONCEPT_COLOURS for s in CONCEPT_SHAPES) + tuple(
    CONCEPT_SHAPES
)
_CONCEPT_STREAM = 3  # concept scenes draw from their own random stream, not the SAM v1 scenes'


@dataclass
class ConceptScene(Scene):
    """A scene whose instance i is shape ``kinds[i]`` (a noun of :data:`CONCEPT_SHAPES`) in
    colour ``colours[i]``; ``masks[i]`` is its visible part, ``shape_masks[i]`` the whole
    shape before the instances painted after it covered some of it."""

    colours: list[str] = field(default_factory=list)
    shape_masks: list[np.ndarray] = field(default_factory=list)

    def phrases(self, i: int) -> tuple[str, str]:
        """The phrases instance ``i`` answers to: ("<colour> <shape>", "<shape>")."""
        return f"{self.colours[i]} {self.kinds[i]}", self.kinds[i]


def _visible(shapes: list[np.ndarray]) -> list[np.ndarray]:
    """The visible part of each shape when painted in order (later ones on top)."""
    out, above = [], np.zeros(shapes[0].shape, bool) if shapes else None
    for m in reversed(shapes):
        out.append(m & ~above)
        above = above | m
    return out[::-1]


# drawing styles of concept scenes (:func:`concept_scene`): "flat" is the original one (flat,
# slightly shaded shapes on a tinted grey gradient); the others vary backgrounds, fills,
# outlines, clutter of shapes outside the vocabulary, shading with shadows, and photo-like
# degradation (blur, noise, colour cast, JPEG)
CONCEPT_STYLES = ("flat", "textured", "outlined", "clutter", "shaded", "photo")
# shapes drawn as clutter: none of them is in the vocabulary (no disc, rectangle, triangle,
# star, ring or cross)
_CLUTTER_KINDS = ("ellipse", "crescent", "polygon", "line")


def concept_scene(
    seed: int,
    index: int,
    sizes: list[list[int]] | None = None,
    num_instances: tuple[int, int] = (2, 7),
    min_area: int = 150,
    styles: tuple[str, ...] | list[str] | None = None,
) -> ConceptScene:
    """Concept scene ``index`` of ``seed`` (a pure function of both): ``num_instances``
    shapes of :data:`CONCEPT_SHAPES` in colours near those of :data:`CONCEPT_COLOURS`
    (shifted a little per instance). ``styles``: the drawing styles to pick from at random
    (:data:`CONCEPT_STYLES`); None draws the original "flat" style, exactly as before styles
    existed. Shapes whose visible part would be under ``min_area`` px are left out before
    painting, so every drawn shape is annotated and every mask is exactly what shows."""
    rng = np.random.default_rng([int(seed), int(index), _CONCEPT_STREAM])
    w, h = scene_size(rng, sizes)
    style = "flat"
    if styles is not None:
        unknown = [x for x in styles if x not in CONCEPT_STYLES]
        if unknown or not styles:
            raise ValueError(f"styles {list(styles)}: choose from {', '.join(CONCEPT_STYLES)}")
        srng = np.random.default_rng([int(seed), int(index), _CONCEPT_STREAM, 1])
        style = str(styles[int(srng.integers(len(styles)))])
    if style == "flat":
        t = (np.mgrid[0:h, 0:w][0].astype(np.float32) / max(h - 1, 1))[..., None]
        # a vertical gradient between two greys, each tinted (up to 30 levels per channel)
        top, bottom = rng.uniform(90, 220, (2, 1)) + rng.uniform(-30, 30, (2, 3))
        noise = (_smooth_noise(rng, h, w, int(rng.integers(4, 12))) - 0.5) * 40
        canvas = top * (1 - t) + bottom * t + noise[..., None]
    else:
        canvas = _styled_background(srng, style, h, w)
    nouns, colours, shapes = list(CONCEPT_SHAPES), list(CONCEPT_COLOURS), []
    for _ in range(int(rng.integers(num_instances[0], num_instances[1] + 1))):
        noun, colour = (
            nouns[int(rng.integers(len(nouns)))],
            colours[int(rng.integers(len(colours)))],
        )
        scale = min(w, h) * rng.uniform(0.12, 0.35)
        m = _shape_mask(rng, CONCEPT_SHAPES[noun], w, h, scale)
        if m.any():
            shapes.append((noun, colour, m))
    while shapes:  # leaving a shape out only uncovers the ones below it: repeat until none
        visible = _visible([m for _, _, m in shapes])
        small = [i for i, v in enumerate(visible) if v.sum() < min_area]
        if not small:
            break
        del shapes[small[0]]
    for _, colour, m in shapes:
        # the named colour, shifted up to 25 levels per channel
        rgb = np.array(CONCEPT_COLOURS[colour], np.float32) + rng.uniform(-25, 25, 3)
        if style == "flat":  # slightly shaded
            shade = 1 + (_smooth_noise(rng, h, w, 8)[..., None] - 0.5) * 0.15
            canvas = np.where(m[..., None], rgb * shade, canvas)
        else:
            canvas = _styled_paint(srng, style, canvas, m, rgb)
    if style == "photo":
        canvas = _photo_degrade(srng, canvas)
    else:
        canvas = canvas + rng.normal(0, 2.0, canvas.shape)
    full = [m for _, _, m in shapes]
    return ConceptScene(
        image=np.clip(canvas, 0, 255).astype(np.uint8),
        masks=_visible(full),
        kinds=[noun for noun, _, _ in shapes],
        colours=[colour for _, colour, _ in shapes],
        shape_masks=full,
    )


def _styled_background(rng: np.random.Generator, style: str, h: int, w: int) -> np.ndarray:
    """H x W x 3 float32 background of a concept scene drawn in ``style`` (not "flat")."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if style in ("textured", "photo"):
        return _texture(rng, h, w, strength=rng.uniform(0.3, 0.8)) * rng.uniform(0.7, 1.0)
    if style == "outlined":  # a pale paper
        return np.broadcast_to(rng.uniform(200, 250, 3).astype(np.float32), (h, w, 3)).copy()
    if style == "clutter":  # SAM v1's scenes: textures and shapes outside the vocabulary
        canvas = _texture(rng, h, w, strength=rng.uniform(0.2, 0.6)).astype(np.float32)
        for _ in range(int(rng.integers(3, 8))):
            kind = _CLUTTER_KINDS[int(rng.integers(len(_CLUTTER_KINDS)))]
            m = _shape_mask(rng, kind, w, h, min(w, h) * rng.uniform(0.1, 0.4))
            canvas = np.where(m[..., None], _colour(rng) * rng.uniform(0.6, 1.0), canvas)
        return canvas
    if style == "shaded":  # a soft two-colour gradient with a vignette (the example's style)
        angle = rng.uniform(0, 2 * math.pi)
        t = xx * math.cos(angle) + yy * math.sin(angle)
        t = ((t - t.min()) / max(float(t.max() - t.min()), 1.0))[..., None]
        a, b = rng.uniform(150, 240, 3), rng.uniform(150, 240, 3)
        r = np.hypot((xx - w / 2) / w, (yy - h / 2) / h)[..., None]
        return (a * (1 - t) + b * t) * (1 - 0.35 * r)
    raise ValueError(f"unknown style {style!r}")


def _styled_paint(
    rng: np.random.Generator, style: str, canvas: np.ndarray, m: np.ndarray, rgb: np.ndarray
) -> np.ndarray:
    """``canvas`` with the shape ``m`` painted in colour ``rgb`` in ``style``."""
    from PIL import ImageFilter

    h, w = m.shape
    mask_img = Image.fromarray(m.astype(np.uint8) * 255)
    if style in ("textured", "photo", "clutter"):
        pattern = _texture(rng, h, w, strength=1.0).mean(axis=-1, keepdims=True) / 255.0
        fill = rgb * (1 - rng.uniform(0.1, 0.3) * pattern)
        return np.where(m[..., None], fill, canvas)
    if style == "outlined":
        width = int(rng.integers(2, 5))
        inner = np.asarray(mask_img.filter(ImageFilter.MinFilter(2 * width + 1)), bool)
        canvas = np.where(m[..., None], rgb * rng.uniform(0.25, 0.45), canvas)
        return np.where(inner[..., None], rgb, canvas)
    if style == "shaded":  # a soft drop shadow, then the shape lit from one side
        dx, dy = rng.integers(3, 9, 2)
        shadow = np.roll(np.roll(m, int(dy), axis=0), int(dx), axis=1)
        soft = (
            np.asarray(
                Image.fromarray(shadow.astype(np.uint8) * 255).filter(ImageFilter.GaussianBlur(4)),
                np.float32,
            )[..., None]
            / 255.0
        )
        canvas = canvas * (1 - 0.45 * soft)
        depth = np.asarray(mask_img.filter(ImageFilter.GaussianBlur(6)), np.float32) / 255.0
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        light = (xx / w + yy / h) * 0.5  # lit from the top left
        shade = 0.75 + 0.35 * depth[..., None] - 0.2 * light[..., None]
        return np.where(m[..., None], rgb * shade, canvas)
    raise ValueError(f"unknown style {style!r}")


def _photo_degrade(rng: np.random.Generator, canvas: np.ndarray) -> np.ndarray:
    """A camera's look: colour cast, blur, sensor noise, JPEG compression."""
    import io

    from PIL import ImageFilter

    canvas = canvas * rng.uniform(0.85, 1.15, 3) + rng.uniform(-15, 15)
    img = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8))
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 1.5))))
    noisy = np.asarray(img, np.float32) + rng.normal(0, rng.uniform(4, 10), canvas.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(
        buf, "JPEG", quality=int(rng.integers(30, 75))
    )
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), np.float32)


def write_concept_dataset(
    out: str | Path,
    num_images: int,
    seed: int = 0,
    sizes: list[list[int]] | None = None,
    overwrite: bool = False,
    styles: tuple[str, ...] | list[str] | None = None,
) -> Path:
    """Write ``num_images`` concept scenes (of ``styles``, see :func:`concept_scene`) as COCO
    instance JSON: ``images/NNNNNN.png`` +
    ``annotations.json`` whose categories are :data:`CONCEPT_PHRASES` (ids 1, 2, ... in that
    order, all of them, so that phrases absent from an image are its negatives) and whose
    annotations are one per (instance, phrase it answers to), with RLE segmentations. Refuses
    a non-empty ``out`` unless ``overwrite``."""
    out = _prepare_out(out, overwrite)
    (out / "images").mkdir(exist_ok=True)
    cat_ids = {name: i + 1 for i, name in enumerate(CONCEPT_PHRASES)}
    coco = {
        "images": [],
        "annotations": [],
        "categories": [{"id": i, "name": n, "supercategory": "shape"} for n, i in cat_ids.items()],
    }
    for i in range(num_images):
        scene = concept_scene(seed, i, sizes, styles=styles)
        h, w = scene.image.shape[:2]
        name = f"{i:06d}.png"
        Image.fromarray(scene.image).save(out / "images" / name)
        coco["images"].append({"id": i + 1, "file_name": name, "width": w, "height": h})
        for j, m in enumerate(scene.masks):
            for phrase in scene.phrases(j):
                ann_id = len(coco["annotations"]) + 1
                coco["annotations"].append(_coco_annotation(ann_id, i + 1, cat_ids[phrase], m))
    (out / "annotations.json").write_text(json.dumps(coco) + "\n")
    return out
