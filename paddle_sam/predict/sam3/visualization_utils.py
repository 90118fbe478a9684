"""Plotting helpers of the SAM 3 example notebooks (upstream module: ``sam3.visualization_utils``).

The same names, arguments and drawings as upstream, so that notebook code runs after changing
``sam3`` to ``paddle_sam`` in its imports: users import it as ``paddle_sam.visualization_utils``,
upstream's path, which re-exports this module. Masks, boxes, scores and points may be Paddle
tensors, NumPy arrays (or torch tensors), where upstream takes torch tensors.

matplotlib is not a dependency of paddle-sam: the functions that draw with it import it when
called and say how to install it (``pip install 'paddle-sam[viz]'``). OpenCV and pycocotools
come with paddle-sam; pandas (SA-Co annotation tables only) is imported on use as well.

Differences from upstream, on purpose: :data:`COLORS` comes from a NumPy k-means in CIELAB
(upstream uses scikit-learn and scikit-image, and seeds NumPy's global random generator on
import; this module leaves it alone), and bad input raises a ``ValueError`` naming the argument.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

VIZ_INSTALL_HINT = "pip install 'paddle-sam[viz]'"


def _pyplot() -> Any:
    """``matplotlib.pyplot``, or an ImportError saying how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "paddle_sam.visualization_utils draws with matplotlib, which paddle-sam does not "
            f"install by default: {VIZ_INSTALL_HINT}"
        ) from exc
    return plt


def _patches() -> Any:
    _pyplot()
    import matplotlib.patches as patches

    return patches


def _cv2() -> Any:
    import cv2

    return cv2


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError(
            "reading SA-Co annotation files into tables needs pandas: pip install pandas"
        ) from exc
    return pd


def _as_numpy(x: Any) -> np.ndarray:
    """A Paddle or torch tensor, a PIL image, a list or an array as a NumPy array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # paddle.Tensor and torch.Tensor
        x = x.detach()
        if hasattr(x, "cpu"):
            x = x.cpu()
        return np.asarray(x.numpy())
    return np.asarray(x)


def _box4(box: Any, name: str = "box") -> np.ndarray:
    """The four numbers of a box (list, tensor or array) as a 1-D array, dtype kept."""
    values = _as_numpy(box).reshape(-1)
    if values.size != 4:
        raise ValueError(f"{name} must hold 4 numbers, got shape {list(np.shape(box))}")
    return values


# ---- colour palettes ----


_SRGB_TO_XYZ = np.array(
    [
        [0.412453, 0.357580, 0.180423],
        [0.212671, 0.715160, 0.072169],
        [0.019334, 0.119193, 0.950227],
    ]
)
_WHITE_D65 = np.array([0.95047, 1.0, 1.08883])
_DELTA = 6.0 / 29.0


def _rgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB in [0, 1] ``N x 3`` -> CIELAB (D65) ``N x 3``."""
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    t = linear @ _SRGB_TO_XYZ.T / _WHITE_D65
    f = np.where(t > _DELTA**3, np.cbrt(t), t / (3 * _DELTA**2) + 4.0 / 29.0)
    return np.stack(
        [116.0 * f[:, 1] - 16.0, 500.0 * (f[:, 0] - f[:, 1]), 200.0 * (f[:, 1] - f[:, 2])],
        axis=1,
    )


def _lab_to_rgb(lab: np.ndarray) -> np.ndarray:
    """CIELAB (D65) ``N x 3`` -> sRGB ``N x 3`` clipped to [0, 1]."""
    fy = (lab[:, 0] + 16.0) / 116.0
    f = np.stack([fy + lab[:, 1] / 500.0, fy, fy - lab[:, 2] / 200.0], axis=1)
    t = np.where(f > _DELTA, f**3, 3 * _DELTA**2 * (f - 4.0 / 29.0)) * _WHITE_D65
    linear = np.clip(t @ np.linalg.inv(_SRGB_TO_XYZ).T, 0.0, None)
    rgb = np.where(linear <= 0.0031308, 12.92 * linear, 1.055 * linear ** (1 / 2.4) - 0.055)
    return np.clip(rgb, 0.0, 1.0)


def generate_colors(n_colors: int = 256, n_samples: int = 5000) -> np.ndarray:
    """``n_colors x 3`` RGB colours in [0, 1], spread evenly over what the eye distinguishes:
    k-means centres (in CIELAB) of ``n_samples`` random colours, drawn from a fixed seed."""
    if not 0 < n_colors <= n_samples:
        raise ValueError(f"n_colors must be in [1, n_samples={n_samples}], got {n_colors}")
    rng = np.random.default_rng(42)
    lab = _rgb_to_lab(rng.random((n_samples, 3)))
    # farthest-point initialisation, then Lloyd iterations
    chosen = [0]
    nearest = np.linalg.norm(lab - lab[0], axis=1)
    for _ in range(n_colors - 1):
        chosen.append(int(np.argmax(nearest)))
        nearest = np.minimum(nearest, np.linalg.norm(lab - lab[chosen[-1]], axis=1))
    centres = lab[chosen]
    sq = (lab**2).sum(1, keepdims=True)
    for _ in range(20):
        d2 = sq - 2.0 * lab @ centres.T + (centres**2).sum(1)
        owner = np.argmin(d2, axis=1)
        counts = np.bincount(owner, minlength=n_colors)
        sums = np.stack(
            [np.bincount(owner, weights=lab[:, k], minlength=n_colors) for k in range(3)], axis=1
        )
        keep = counts > 0
        centres[keep] = sums[keep] / counts[keep, None]
    return _lab_to_rgb(centres)


def _palette() -> np.ndarray:
    """:data:`COLORS`, computed on first use (a fraction of a second) or as the user set it."""
    colors = globals().get("COLORS")
    if colors is None:
        colors = generate_colors(n_colors=128, n_samples=5000)
        globals()["COLORS"] = colors
    return colors


def __getattr__(name: str) -> Any:
    # ``COLORS`` (128 x 3 RGB in [0, 1], upstream's palette size) is made on first access
    if name == "COLORS":
        return _palette()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _color(index: Any) -> np.ndarray:
    """Entry ``index`` of :data:`COLORS`, cycling."""
    palette = _palette()
    return palette[index % len(palette)]


def bitget(val: Any, idx: int) -> Any:
    """Bit ``idx`` of ``val`` (an int or an integer array)."""
    return (val >> idx) & 1


def pascal_color_map() -> np.ndarray:
    """The PASCAL VOC label palette: ``512 x 3`` uint8, entry 0 black."""
    index = np.arange(512, dtype=np.int64)
    colormap = np.zeros((512, 3), dtype=np.int64)
    for bit in range(8):  # bit ``bit`` of each channel comes from bits 3*bit.. of the index
        for channel in range(3):
            colormap[:, channel] |= bitget(index >> (3 * bit), channel) << (7 - bit)
    return colormap.astype(np.uint8)


# ---- boxes ----


def normalize_bbox(bbox_xywh: Any, img_w: float, img_h: float) -> Any:
    """A box (x, y, w, h) in pixels -> relative to the image size: x and w divided by
    ``img_w``, y and h by ``img_h``. A list of 4 numbers gives a list; a Paddle / torch tensor
    or a NumPy array of boxes ``... x 4`` gives the same kind of object, batched."""
    scale = (img_w, img_h, img_w, img_h)
    if isinstance(bbox_xywh, list | tuple):
        if len(bbox_xywh) != 4:
            raise ValueError(
                f"bbox_xywh as a list must have 4 elements, got {len(bbox_xywh)}; "
                "pass a tensor or array to normalise a batch"
            )
        return [v / s for v, s in zip(bbox_xywh, scale, strict=True)]
    shape = list(bbox_xywh.shape) if hasattr(bbox_xywh, "shape") else None
    if not shape or shape[-1] != 4:
        raise ValueError(f"bbox_xywh must have a last dimension of size 4, got shape {shape}")
    if isinstance(bbox_xywh, np.ndarray):
        out = bbox_xywh.astype(np.result_type(bbox_xywh.dtype, np.float32), copy=True)
        for i, s in enumerate(scale):
            out[..., i] /= s
        return out
    parts = [bbox_xywh[..., i] / s for i, s in enumerate(scale)]
    stack = getattr(type(bbox_xywh), "__module__", "").startswith("torch")
    if stack:
        import torch

        return torch.stack(parts, dim=-1)
    import paddle

    return paddle.stack(parts, axis=-1)


def _mask_box_xyxy(mask: np.ndarray) -> np.ndarray:
    """float32 (x0, y0, x1, y1) of a non-empty mask, inclusive pixel indices."""
    ys, xs = np.nonzero(mask)
    return np.array([xs.min(), ys.min(), xs.max(), ys.max()], dtype=np.float32)


def draw_box_on_image(image: Any, box: Any, color: tuple[int, int, int] = (0, 255, 0)) -> Any:
    """A copy of a PIL image (converted to RGB) with the outline of box ``(x, y, w, h)``
    (pixels, truncated to integers) drawn three pixels thick in ``color``: the rows ``y - 1``
    to ``y + 1`` and ``y + h - 2`` to ``y + h`` over columns ``x`` to ``x + w - 1``, and the
    columns ``x - 1`` to ``x + 1`` and ``x + w - 2`` to ``x + w`` over rows ``y`` to
    ``y + h - 1``. Lines outside the image are left out."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise ValueError(f"image must be a PIL image, got {type(image).__name__}")
    x, y, w, h = (int(v) for v in _box4(box).tolist())
    pixels = np.array(image.convert("RGB"))
    height, width = pixels.shape[:2]
    cols = np.arange(max(x, 0), min(x + w, width))
    rows = np.arange(max(y, 0), min(y + h, height))
    for r in (y - 1, y, y + 1, y + h - 2, y + h - 1, y + h):
        if 0 <= r < height:
            pixels[r, cols] = color
    for c in (x - 1, x, x + 1, x + w - 2, x + w - 1, x + w):
        if 0 <= c < width:
            pixels[rows, c] = color
    return Image.fromarray(pixels)


# ---- matplotlib drawings ----


def show_img_tensor(img_batch: Any, vis_img_idx: int = 0) -> None:
    """Show image ``vis_img_idx`` of a ``B x 3 x H x W`` batch normalised with the ImageNet
    mean and std, de-normalised and clipped to [0, 1], on the current axes."""
    plt = _pyplot()
    image = _as_numpy(img_batch[vis_img_idx])
    if image.ndim != 3:
        raise ValueError(f"img_batch[{vis_img_idx}] must be 3 x H x W, got {list(image.shape)}")
    mean = np.array([0.485, 0.456, 0.406])
    std = np.array([0.229, 0.224, 0.225])
    plt.imshow(np.clip(image.transpose(1, 2, 0) * std + mean, 0, 1))


def plot_bbox(
    img_height: float,
    img_width: float,
    box: Any,
    box_format: str = "XYXY",
    relative_coords: bool = True,
    color: Any = "r",
    linestyle: str = "solid",
    text: str | None = None,
    ax: Any = None,
) -> None:
    """Draw a box outline (1.5 pt) on ``ax`` (default: the current axes), with ``text`` in a
    white label above it. ``box_format``: ``"XYXY"``, ``"XYWH"`` or ``"CxCyWH"``;
    ``relative_coords``: the box is in [0, 1] and scaled by the image size."""
    a, b, c, d = _box4(box)
    if box_format == "XYXY":
        x, y, w, h = a, b, c - a, d - b
    elif box_format == "XYWH":
        x, y, w, h = a, b, c, d
    elif box_format == "CxCyWH":
        x, y, w, h = a - c / 2, b - d / 2, c, d
    else:
        raise ValueError(f"box_format must be 'XYXY', 'XYWH' or 'CxCyWH', got {box_format!r}")
    if relative_coords:
        x, w = x * img_width, w * img_width
        y, h = y * img_height, h * img_height
    plt, patches = _pyplot(), _patches()
    ax = plt.gca() if ax is None else ax
    ax.add_patch(
        patches.Rectangle(
            (x, y), w, h, linewidth=1.5, edgecolor=color, facecolor="none", linestyle=linestyle
        )
    )
    if text is not None:
        label_box = {"facecolor": "w", "alpha": 0.75, "pad": 2}
        ax.text(x, y - 5, text, color=color, weight="bold", fontsize=8, bbox=label_box)


def plot_mask(mask: Any, color: Any = "r", ax: Any = None) -> None:
    """Overlay an ``H x W`` mask in ``color`` at half opacity (alpha = 0.5 x mask value) on
    ``ax`` (default: the current axes)."""
    plt = _pyplot()
    from matplotlib.colors import to_rgb

    m = _as_numpy(mask)
    if m.ndim != 2:
        raise ValueError(f"mask must be H x W, got {list(m.shape)}")
    rgba = np.zeros((*m.shape, 4), dtype=np.float32)
    rgba[..., :3] = to_rgb(color)
    rgba[..., 3] = m.astype(np.float32) * 0.5
    (plt.gca() if ax is None else ax).imshow(rgba)


def plot_results(img: Any, results: dict) -> None:
    """Draw ``Sam3Processor`` results on the image: a 12 x 8 in figure with every kept mask
    and its xyxy box (pixels) labelled ``(id=i, prob=score)``, colour i of :data:`COLORS`.
    ``img``: a PIL image or an ``H x W x 3`` array; ``results``: the processor's state (or any
    dict with ``masks`` ``N x 1 x H x W``, ``boxes`` ``N x 4`` and ``scores`` ``N``)."""
    plt = _pyplot()
    for key in ("masks", "boxes", "scores"):
        if key not in results:
            raise ValueError(f"results has no {key!r}: pass the state Sam3Processor returns")
    from PIL import Image

    if isinstance(img, Image.Image):
        width, height = img.size
    else:
        img = _as_numpy(img)
        height, width = img.shape[:2]
    plt.figure(figsize=(12, 8))
    plt.imshow(img)
    scores = _as_numpy(results["scores"]).reshape(-1)
    masks, boxes = _as_numpy(results["masks"]), _as_numpy(results["boxes"])
    print(f"found {len(scores)} object(s)")
    for i, prob in enumerate(scores.tolist()):
        color = _color(i)
        plot_mask(masks[i].squeeze(0), color=color)
        plot_bbox(
            height,
            width,
            boxes[i],
            text=f"(id={i}, {prob=:.2f})",
            box_format="XYXY",
            color=color,
            relative_coords=False,
        )


def show_mask(mask: Any, ax: Any, obj_id: int | None = None, random_color: bool = False) -> None:
    """Overlay a mask (``H x W``, or with leading axes of size 1) on ``ax`` in colour
    ``obj_id`` of matplotlib's tab10 (0 when None) or, with ``random_color``, a colour drawn
    from NumPy's global generator, at opacity 0.6."""
    plt = _pyplot()
    if random_color:
        color = np.concatenate([np.random.random(3), np.array([0.6])], axis=0)
    else:
        color = np.array([*plt.get_cmap("tab10")(0 if obj_id is None else obj_id)[:3], 0.6])
    m = _as_numpy(mask)
    h, w = m.shape[-2:]
    if m.size != h * w:
        raise ValueError(f"mask must hold one H x W mask, got shape {list(m.shape)}")
    ax.imshow(m.reshape(h, w, 1) * color.reshape(1, 1, -1))


def show_box(box: Any, ax: Any) -> None:
    """Draw an xyxy box (pixels) as a green 2 pt outline on ``ax``."""
    plt = _pyplot()
    x0, y0, x1, y1 = _box4(box)
    ax.add_patch(
        plt.Rectangle((x0, y0), x1 - x0, y1 - y0, edgecolor="green", facecolor=(0, 0, 0, 0), lw=2)
    )


def show_points(coords: Any, labels: Any, ax: Any, marker_size: float = 375) -> None:
    """Draw points ``... x 2`` (pixels) as stars on ``ax``: label 1 green, label 0 red."""
    pts = _as_numpy(coords)
    lab = _as_numpy(labels)
    if pts.shape[-1] != 2 or pts.shape[:-1] != lab.shape:
        raise ValueError(
            f"coords must be ... x 2 with labels of shape ...: got {list(pts.shape)} and "
            f"{list(lab.shape)}"
        )
    for value, color in ((1, "green"), (0, "red")):
        chosen = pts[lab == value]
        ax.scatter(
            chosen[:, 0],
            chosen[:, 1],
            color=color,
            marker="*",
            s=marker_size,
            edgecolor="white",
            linewidth=1.25,
        )


# ---- video frames and tracker outputs ----


def load_frame(frame: Any) -> np.ndarray:
    """A video frame as an ``H x W x C`` array: an array as is, a PIL image converted, an
    image file path read with matplotlib (PNG: floats in [0, 1])."""
    from PIL import Image

    if isinstance(frame, np.ndarray):
        return frame
    if isinstance(frame, Image.Image):
        return np.array(frame)
    if isinstance(frame, str | os.PathLike) and os.path.isfile(frame):
        return _pyplot().imread(frame)
    raise ValueError(f"Invalid video frame: {type(frame).__name__} {frame!r:.80}")


def prepare_masks_for_visualization(frame_to_output: dict) -> dict:
    """Turn ``{frame: {"out_obj_ids": ..., "out_binary_masks": ...}}`` (the video predictor's
    outputs) into ``{frame: {obj_id: mask}}`` in place, dropping empty masks; returns it."""
    for frame_idx, out in frame_to_output.items():
        masks = out["out_binary_masks"]
        ids = out["out_obj_ids"]
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        frame_to_output[frame_idx] = {
            obj_id: masks[i] for i, obj_id in enumerate(ids) if bool(masks[i].any())
        }
    return frame_to_output


def visualize_frame_output(
    frame_idx: int, video_frames: Sequence[Any], outputs: dict, figsize: tuple = (12, 8)
) -> None:
    """One frame with the video predictor's raw outputs (``out_probs``, ``out_boxes_xywh``
    relative, ``out_obj_ids``, ``out_binary_masks``): each object's mask and labelled box in
    its :data:`COLORS` entry."""
    plt = _pyplot()
    plt.figure(figsize=figsize)
    plt.title(f"frame {frame_idx}")
    img = load_frame(video_frames[frame_idx])
    img_h, img_w = img.shape[:2]
    plt.imshow(img)
    for i in range(len(outputs["out_probs"])):
        obj_id = int(outputs["out_obj_ids"][i])
        prob = outputs["out_probs"][i]
        color = _color(obj_id)
        plot_bbox(
            img_h,
            img_w,
            outputs["out_boxes_xywh"][i],
            text=f"(id={obj_id}, {prob=:.2f})",
            box_format="XYWH",
            color=color,
        )
        plot_mask(outputs["out_binary_masks"][i], color=color)


def _draw_prompt_info(ax: Any, prompt_info: dict, img_h: int, img_w: int) -> None:
    for box in prompt_info.get("boxes", ()):
        x, y, w, h = box  # relative x, y, w, h
        plot_bbox(
            img_h,
            img_w,
            [x, y, x + w, y + h],
            box_format="XYXY",
            relative_coords=True,
            color="yellow",
            linestyle="dashed",
            text="PROMPT BOX",
            ax=ax,
        )
    if "points" in prompt_info and "point_labels" in prompt_info:
        points = np.array(prompt_info["points"]) * np.array([img_w, img_h])
        labels = np.array(prompt_info["point_labels"])
        for value, color, name in ((1, "lime", "Positive Points"), (0, "red", "Negative Points")):
            chosen = points[labels == value]
            if len(chosen):
                ax.scatter(
                    chosen[:, 0],
                    chosen[:, 1],
                    color=color,
                    marker="*",
                    s=200,
                    edgecolor="white",
                    linewidth=2,
                    label=name,
                    zorder=10,
                )


def visualize_formatted_frame_output(
    frame_idx: int,
    video_frames: Sequence[Any],
    outputs_list: Any,
    titles: Sequence[str] | None = None,
    points_list: Sequence[Any] | None = None,
    points_labels_list: Sequence[Any] | None = None,
    figsize: tuple = (12, 8),
    title_suffix: str = "",
    prompt_info: dict | None = None,
) -> None:
    """Side by side, one panel per set of outputs, the masks of one frame with their boxes.

    ``outputs_list``: a list of ``{frame: {obj_id: mask}}`` (from
    :func:`prepare_masks_for_visualization`), or one such dict, or one frame's
    ``{obj_id: mask}``. ``titles`` name the panels; ``points_list`` / ``points_labels_list``
    add clicks (pixels) per panel; ``prompt_info`` (``boxes`` relative xywh, ``points``
    relative, ``point_labels``) is drawn on frame 0."""
    plt = _pyplot()
    if isinstance(outputs_list, dict):
        if frame_idx in outputs_list:
            outputs_list = [outputs_list]
        elif not any(isinstance(k, int) for k in outputs_list):
            outputs_list = [{frame_idx: outputs_list}]
    num_outputs = len(outputs_list)
    titles = [f"Set {i + 1}" for i in range(num_outputs)] if titles is None else titles
    if len(titles) != num_outputs:
        raise ValueError(f"{len(titles)} titles for {num_outputs} sets of outputs")
    _, axes = plt.subplots(1, num_outputs, figsize=figsize)
    axes = [axes] if num_outputs == 1 else axes
    img = load_frame(video_frames[frame_idx])
    img_h, img_w = img.shape[:2]
    for idx, (ax, outputs_set, ax_title) in enumerate(zip(axes, outputs_list, titles, strict=True)):
        ax.set_title(f"Frame {frame_idx} - {ax_title}{title_suffix}")
        ax.imshow(img)
        if frame_idx not in outputs_set:
            print(f"Warning: Frame {frame_idx} not found in outputs_set")
            continue
        if prompt_info and frame_idx == 0:
            _draw_prompt_info(ax, prompt_info, img_h, img_w)
        drawn = 0
        for obj_id, binary_mask in outputs_set[frame_idx].items():
            mask = _as_numpy(binary_mask)
            if not mask.sum() > 0:
                continue
            box = _mask_box_xyxy(mask.reshape(mask.shape[-2:]))
            color = _color(obj_id)
            plot_bbox(
                img_h,
                img_w,
                normalize_bbox(box, img_w, img_h),
                text=f"(id={obj_id})",
                box_format="XYXY",
                color=color,
                ax=ax,
            )
            plot_mask(mask, color=color, ax=ax)
            drawn += 1
        if drawn == 0:
            ax.text(
                0.5,
                0.5,
                "No objects detected",
                transform=ax.transAxes,
                fontsize=16,
                ha="center",
                va="center",
                color="red",
                weight="bold",
            )
        if points_list is not None and points_list[idx] is not None:
            show_points(points_list[idx], points_labels_list[idx], ax=ax, marker_size=200)
        ax.axis("off")
    plt.tight_layout()
    plt.show()


def visualize_prompt_overlay(
    frame_idx: int,
    video_frames: Sequence[Any],
    title: str = "Prompt Visualization",
    text_prompt: str | None = None,
    point_prompts: Sequence[Any] | None = None,
    point_labels: Sequence[int] | None = None,
    bounding_boxes: Sequence[Any] | None = None,
    box_labels: Sequence[int] | None = None,
    obj_id: int | None = None,
) -> None:
    """A frame with its prompts: the text in a red tag, points (relative x, y; label 1 a
    green circle, else a red cross, numbered P1..) and boxes (relative x, y, w, h; label 1
    green, else red, numbered B1..), and the object id in a blue tag."""
    from PIL import Image

    plt, patches = _pyplot(), _patches()
    img = Image.fromarray(load_frame(video_frames[frame_idx]))
    _, ax = plt.subplots(1, figsize=(6, 4))
    ax.imshow(img)
    img_w, img_h = img.size
    tag = {"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.8}
    if text_prompt:
        ax.text(
            0.02,
            0.98,
            f'Text: "{text_prompt}"',
            transform=ax.transAxes,
            fontsize=12,
            color="white",
            weight="bold",
            bbox={"boxstyle": "round,pad=0.3", "facecolor": "red", "alpha": 0.7},
            verticalalignment="top",
        )

    def label_of(labels: Sequence[int] | None, i: int) -> int:
        return labels[i] if labels and len(labels) > i else 1

    for i, (x, y) in enumerate(point_prompts or ()):
        positive = label_of(point_labels, i) == 1
        color = "green" if positive else "red"
        px, py = x * img_w, y * img_h
        ax.plot(
            px,
            py,
            marker="o" if positive else "x",
            color=color,
            markersize=10,
            markeredgewidth=2,
            markeredgecolor="white",
        )
        ax.text(px + 5, py - 5, f"P{i + 1}", color=color, fontsize=10, weight="bold", bbox=tag)
    for i, (x, y, w, h) in enumerate(bounding_boxes or ()):
        color = "green" if label_of(box_labels, i) == 1 else "red"
        bx, by = x * img_w, y * img_h
        ax.add_patch(
            patches.Rectangle(
                (bx, by), w * img_w, h * img_h, linewidth=2, edgecolor=color, facecolor="none"
            )
        )
        ax.text(bx, by - 5, f"B{i + 1}", color=color, fontsize=10, weight="bold", bbox=tag)
    if obj_id is not None:
        ax.text(
            0.02,
            0.02,
            f"Object ID: {obj_id}",
            transform=ax.transAxes,
            fontsize=10,
            color="white",
            weight="bold",
            bbox={"boxstyle": "round,pad=0.3", "facecolor": "blue", "alpha": 0.7},
            verticalalignment="bottom",
        )
    ax.set_title(title)
    ax.axis("off")
    plt.tight_layout()
    plt.show()


# ---- overlays drawn into the pixels (OpenCV) ----


def render_masklet_frame(
    img: np.ndarray, outputs: dict, frame_idx: int | None = None, alpha: float = 0.5
) -> np.ndarray:
    """``H x W x 3`` uint8: the frame with each object's mask blended in its :data:`COLORS`
    entry (``alpha``), its box (relative xywh) and an ``id=.., p=..`` label, and
    ``Frame i`` in the corner when ``frame_idx`` is given. ``img``: uint8, or floats in
    [0, 1] (float32 is always taken as [0, 1]); a 4th channel is dropped. ``outputs``: the
    video predictor's ``out_boxes_xywh``, ``out_probs`` (entries may be None),
    ``out_obj_ids`` and ``out_binary_masks`` (resized nearest to the frame if needed)."""
    cv2 = _cv2()
    img = np.asarray(img)
    if img.ndim != 3 or img.shape[-1] < 3:
        raise ValueError(f"img must be H x W x 3 (or 4), got {list(img.shape)}")
    if img.dtype == np.float32 or img.max() <= 1.0:
        img = (img * 255).astype(np.uint8)
    overlay = img[..., :3].copy()
    height, width = overlay.shape[:2]
    for i in range(len(outputs["out_probs"])):
        color = _color(outputs["out_obj_ids"][i])
        mask = _as_numpy(outputs["out_binary_masks"][i])
        if mask.shape != (height, width):
            mask = cv2.resize(
                mask.astype(np.float32), (width, height), interpolation=cv2.INTER_NEAREST
            )
        covered = mask > 0.5
        blended = alpha * (color * 255).astype(np.uint8) + (1 - alpha) * overlay[covered]
        overlay[covered] = blended.astype(np.uint8)
    for i in range(len(outputs["out_probs"])):
        obj_id = int(outputs["out_obj_ids"][i])
        prob = outputs["out_probs"][i]
        color = tuple(int(c * 255) for c in _color(obj_id))
        # in the box's own dtype, as upstream (float32 products truncate differently)
        x, y, w, h = _box4(outputs["out_boxes_xywh"][i], "out_boxes_xywh entry")
        x0, y0 = int(x * width), int(y * height)
        x1, y1 = int((x + w) * width), int((y + h) * height)
        cv2.rectangle(overlay, (x0, y0), (x1, y1), color, 2)
        label = f"id={obj_id}" if prob is None else f"id={obj_id}, p={prob:.2f}"
        font = cv2.FONT_HERSHEY_SIMPLEX
        cv2.putText(overlay, label, (x0, max(y0 - 10, 0)), font, 0.5, color, 1, cv2.LINE_AA)
    if frame_idx is not None:
        cv2.putText(
            overlay,
            f"Frame {frame_idx}",
            (10, 30),
            cv2.FONT_HERSHEY_SIMPLEX,
            1.0,
            (255, 255, 255),
            2,
            cv2.LINE_AA,
        )
    return overlay


def save_masklet_image(
    frame: Any, outputs: dict, out_path: str, alpha: float = 0.5, frame_idx: int | None = None
) -> None:
    """Write :func:`render_masklet_frame` of one frame to an image file."""
    from PIL import Image

    overlay = render_masklet_frame(load_frame(frame), outputs, frame_idx=frame_idx, alpha=alpha)
    Image.fromarray(overlay).save(out_path)
    print(f"Overlay image saved to {out_path}")


def save_masklet_video(
    video_frames: Sequence[Any], outputs: dict, out_path: str, alpha: float = 0.5, fps: int = 10
) -> None:
    """Write the frames of ``outputs`` (``{frame: outputs}``, in frame order) rendered with
    :func:`render_masklet_frame` to an MP4 video (OpenCV's mp4v); re-encoded with ffmpeg
    (H.264, which browsers and editors play) when ffmpeg is on the PATH."""
    from tqdm import tqdm

    cv2 = _cv2()
    first = load_frame(video_frames[0])
    height, width = first.shape[:2]
    out = Path(out_path)
    tmp = out.with_name(f".{out.stem}.mp4v.mp4")
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise OSError(f"OpenCV cannot write an MP4 video to {tmp}")
    try:
        for frame_idx in tqdm(sorted(outputs)):
            img = load_frame(video_frames[frame_idx])
            overlay = render_masklet_frame(
                img, outputs[frame_idx], frame_idx=frame_idx, alpha=alpha
            )
            writer.write(cv2.cvtColor(overlay, cv2.COLOR_RGB2BGR))
    finally:
        writer.release()
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        tmp.replace(out)
        print(f"Video saved to {out_path} (mp4v; install ffmpeg to re-encode it as H.264)")
        return
    try:
        subprocess.run([ffmpeg, "-y", "-loglevel", "error", "-i", str(tmp), str(out)], check=True)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"Re-encoded video saved to {out_path}")


def draw_masks_to_frame(frame: np.ndarray, masks: Sequence[Any], colors: np.ndarray) -> np.ndarray:
    """The frame (uint8 ``H x W x 3``) with each mask filled in its colour (25 %) and
    outlined: white, black, then the colour (7, 5 and 3 px wide contours)."""
    cv2 = _cv2()
    out = np.asarray(frame)
    for mask, color in zip(masks, colors, strict=False):
        m = _as_numpy(mask)
        color = np.asarray(color)
        filled = np.where(m[..., None], color, out)
        out = cv2.addWeighted(out, 0.75, filled, 0.25, 0)
        found = cv2.findContours(np.array(m, dtype=np.uint8), cv2.RETR_TREE, cv2.CHAIN_APPROX_NONE)
        contours = found[-2]  # (contours, hierarchy), or (image, contours, hierarchy) in cv2 3
        cv2.drawContours(out, contours, -1, (255, 255, 255), 7)
        cv2.drawContours(out, contours, -1, (0, 0, 0), 5)
        cv2.drawContours(out, contours, -1, color.tolist(), 3)
    return out


# ---- COCO-style annotations (SA-Co) ----


def convert_coco_to_masklet_format(
    annotations: Sequence[dict],
    img_info: dict,
    is_prediction: bool = False,
    score_threshold: float = 0.5,
) -> dict:
    """COCO annotations of one image (RLE ``segmentation``, optional ``bbox`` xywh in pixels
    or relative, ``score`` for predictions) -> the outputs :func:`render_masklet_frame` takes:
    relative xywh boxes (from the mask when there is no ``bbox``), scores (1.0 for ground
    truth), ids 0.. and binary masks (``mask > score_threshold``)."""
    from pycocotools import mask as mask_utils

    img_h, img_w = img_info["height"], img_info["width"]
    outputs: dict[str, list] = {
        "out_boxes_xywh": [],
        "out_probs": [],
        "out_obj_ids": [],
        "out_binary_masks": [],
    }
    for idx, ann in enumerate(annotations):
        mask = mask_utils.decode(ann["segmentation"])
        if "bbox" in ann:
            bbox = list(ann["bbox"])
            if max(bbox) > 1.0:
                bbox = normalize_bbox(bbox, img_w, img_h)
        elif mask.any():
            x0, y0, x1, y1 = _mask_box_xyxy(mask).astype(np.int64).tolist()
            bbox = [x0 / img_w, y0 / img_h, (x1 - x0 + 1) / img_w, (y1 - y0 + 1) / img_h]
        else:
            bbox = [0, 0, 0, 0]
        outputs["out_boxes_xywh"].append(bbox)
        outputs["out_probs"].append(ann["score"] if is_prediction else 1.0)
        outputs["out_obj_ids"].append(idx)
        outputs["out_binary_masks"].append((mask > score_threshold).astype(np.uint8))
    return outputs


def save_side_by_side_visualization(
    img: np.ndarray, gt_anns: dict, pred_anns: dict, noun_phrase: str
) -> None:
    """A 14 x 7 in figure: ground truth (left) and predictions (right) rendered with
    :func:`render_masklet_frame`, under the noun phrase."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 7))
    fig.suptitle(f"Noun phrase: '{noun_phrase}'", fontsize=16, fontweight="bold")
    for ax, anns, name in ((left, gt_anns, "Ground Truth"), (right, pred_anns, "Predictions")):
        ax.imshow(render_masklet_frame(img, anns, alpha=0.5))
        ax.set_title(name, fontsize=14, fontweight="bold")
        ax.axis("off")
    plt.subplots_adjust(top=0.88)
    plt.tight_layout()


def single_visualization(img: np.ndarray, anns: dict, title: str) -> None:
    """A 7 x 7 in figure of :func:`render_masklet_frame` under ``title``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 7))
    fig.suptitle(title, fontsize=16, fontweight="bold")
    ax.imshow(render_masklet_frame(img, anns, alpha=0.5))
    ax.axis("off")
    plt.tight_layout()


def get_annot_df(file_path: str) -> dict:
    """A COCO-style annotation file (SA-Co) as ``{key: pandas.DataFrame}`` (``info`` and
    ``licenses`` kept as read)."""
    import json

    pd = _pandas()
    with open(file_path) as f:
        data = json.load(f)
    return {k: v if k in ("info", "licenses") else pd.DataFrame(v) for k, v in data.items()}


def get_annot_dfs(file_list: Sequence[str]) -> dict:
    """:func:`get_annot_df` of each file, keyed by the file name without its extension."""
    from tqdm import tqdm

    _pandas()
    return {Path(path).stem: get_annot_df(path) for path in tqdm(file_list)}


_SACO_MEDIA = {
    "saco_veval_sav_test": ("saco_sav", "JPEGImages_24fps"),
    "saco_veval_sav_val": ("saco_sav", "JPEGImages_24fps"),
    "saco_veval_yt1b_test": ("saco_yt1b", "JPEGImages_6fps"),
    "saco_veval_yt1b_val": ("saco_yt1b", "JPEGImages_6fps"),
    "saco_veval_smartglasses_test": ("saco_sg", "JPEGImages_6fps"),
    "saco_veval_smartglasses_val": ("saco_sg", "JPEGImages_6fps"),
    "sa_fari_test": ("sa_fari", "JPEGImages_6fps"),
}


def get_media_dir(media_dir: str, dataset: str) -> str:
    """The folder of an SA-Co video dataset's frames under ``media_dir``."""
    if dataset not in _SACO_MEDIA:
        raise ValueError(f"Dataset {dataset} not found; known: {sorted(_SACO_MEDIA)}")
    return os.path.join(media_dir, *_SACO_MEDIA[dataset])


def get_all_annotations_for_frame(
    dataset_df: dict, video_id: int, frame_idx: int, data_dir: str, dataset: str
) -> tuple[np.ndarray, Any, Any]:
    """Frame ``frame_idx`` of video ``video_id`` (RGB, read from ``data_dir/media``) with
    every annotated mask on it and its noun phrase, sorted by noun phrase; ``(frame, None,
    None)`` when the video has no annotation. ``dataset_df``: :func:`get_annot_df`'s tables."""
    from pycocotools import mask as mask_utils

    cv2 = _cv2()
    annotations, videos = dataset_df["annotations"], dataset_df["videos"]
    rows = videos[videos.id == video_id]
    if len(rows) != 1:
        raise ValueError(f"Expected 1 video row for video_id {video_id}, got {len(rows)}")
    file_name = rows.iloc[0].file_names[frame_idx]
    media = get_media_dir(media_dir=os.path.join(data_dir, "media"), dataset=dataset)
    path = os.path.join(media, file_name)
    frame = cv2.imread(path)
    if frame is None:
        raise FileNotFoundError(f"cannot read frame {path}")
    frame = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
    video_annotations = annotations[annotations.video_id == video_id]
    if len(video_annotations) == 0:
        print(f"No annotations found for video_id {video_id}")
        return frame, None, None
    empty = np.zeros(frame.shape[:2], dtype=np.uint8)
    pairs = []
    for _, row in video_annotations.iterrows():
        rle = row.segmentations[frame_idx]
        pairs.append((mask_utils.decode(rle) if rle else empty, row.noun_phrase))
    pairs.sort(key=lambda pair: pair[1])
    masks, noun_phrases = zip(*pairs, strict=True)
    return frame, masks, noun_phrases
