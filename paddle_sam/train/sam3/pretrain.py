"""Dense pretraining of a small SAM 3's vision backbone on concept scenes (not in upstream).

Upstream trains SAM 3 from a pretrained vision encoder (the Perception Encoder); a small SAM 3
trained here from random weights has none, and its detector learns the shapes of the concept
scenes only slowly (colours come first: a phrase's colour alone then finds its instance when
the colour is unique in the scene). This stage gives the backbone that prior cheaply: the
trunk and neck, with a 1 x 1 convolution on the neck's finest level, are trained to label
every pixel with its shape and its colour (cross-entropy, background down-weighted), on
scenes drawn afresh each step; no text encoder, fusion encoder, decoder or per-phrase heads
run, so a step costs a fraction of a detector step. With ``instance_loss``, a linear head also
names each instance's shape from the mean of its tokens on the level the detector reads (what a
decoder query, attending over an object's tokens, gets to see): the dense labels ask every token
to know its whole shape, the mean only asks the object's tokens together. The result is a
``.pdparams`` with the ``backbone.vision_backbone.*`` tensors only, which
``model.backbone_init`` in a SAM 3 config loads.

    python -m paddle_sam.train.sam3.pretrain configs/sam3_tiny_concepts.yaml -o backbone.pdparams
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F

from ..synthetic import CONCEPT_COLOURS, CONCEPT_SHAPES, ConceptScene, concept_scene
from .data import NORM_MEAN, NORM_STD
from .init import VISION_PREFIX

__all__ = ["dense_labels", "instance_cells", "pretrain_vision_backbone", "main"]

SHAPES = list(CONCEPT_SHAPES)
COLOURS = list(CONCEPT_COLOURS)
BACKGROUND_WEIGHT = 0.2  # background covers most pixels


def _cell_centres(scene: ConceptScene, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel rows and columns of the centres of a ``size x size`` grid over ``scene``."""
    h, w = scene.image.shape[:2]
    ys = ((np.arange(size) + 0.5) * h / size).astype(np.int64)
    xs = ((np.arange(size) + 0.5) * w / size).astype(np.int64)
    return ys, xs


def dense_labels(scene: ConceptScene, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``size x size`` int64 maps of ``scene`` (square): each pixel's shape (1 + index in
    :data:`CONCEPT_SHAPES`) and colour (1 + index in :data:`CONCEPT_COLOURS`), 0 for the
    background; sampled at the centres of a ``size x size`` grid over the image."""
    ys, xs = _cell_centres(scene, size)
    shape = np.zeros((size, size), np.int64)
    colour = np.zeros((size, size), np.int64)
    for mask, kind, name in zip(scene.masks, scene.kinds, scene.colours, strict=True):
        on = mask[np.ix_(ys, xs)]
        shape[on] = SHAPES.index(kind) + 1
        colour[on] = COLOURS.index(name) + 1
    return shape, colour


def instance_cells(scene: ConceptScene, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each instance of ``scene`` (square) on a ``size x size`` grid, sampled at the cells'
    centres as :func:`dense_labels`: ``N x size*size`` float32 masks (flattened) and their
    shapes (``N`` int64, index in :data:`CONCEPT_SHAPES`); instances no cell centre falls on
    are left out."""
    ys, xs = _cell_centres(scene, size)
    cells, shapes = [], []
    for mask, kind in zip(scene.masks, scene.kinds, strict=True):
        on = mask[np.ix_(ys, xs)]
        if on.any():
            cells.append(on.reshape(-1).astype(np.float32))
            shapes.append(SHAPES.index(kind))
    return (
        np.stack(cells) if cells else np.zeros((0, size * size), np.float32),
        np.asarray(shapes, np.int64),
    )


def _batch(seed: int, step: int, n: int, size: int, grid: int, instance_grid: int | None = None):
    """``n`` scenes normalised as the detector's data (``NORM_MEAN`` / ``NORM_STD``), with
    their label maps on the ``grid x grid`` of the backbone's finest level and, with
    ``instance_grid``, their instances on that grid (:func:`instance_cells`: masks, image
    index, shape)."""
    mean = np.asarray(NORM_MEAN, np.float32).reshape(3, 1, 1)
    std = np.asarray(NORM_STD, np.float32).reshape(3, 1, 1)
    images, shapes, colours, cells, owner, kinds = [], [], [], [], [], []
    for i in range(n):
        scene = concept_scene(seed, step * n + i, [[size, size]])
        s, c = dense_labels(scene, grid)
        images.append((scene.image.astype(np.float32).transpose(2, 0, 1) / 255.0 - mean) / std)
        shapes.append(s)
        colours.append(c)
        if instance_grid:
            m, k = instance_cells(scene, instance_grid)
            cells.append(m)
            owner.append(np.full(len(k), i, np.int64))
            kinds.append(k)
    out = [paddle.to_tensor(np.stack(a)) for a in (images, shapes, colours)]
    if instance_grid:
        out += [paddle.to_tensor(np.concatenate(a)) for a in (cells, owner, kinds)]
    return tuple(out)


def pretrain_vision_backbone(
    model: paddle.nn.Layer,
    steps: int,
    batch_size: int = 8,
    lr: float = 2e-3,
    seed: int = 0,
    log_every: int = 100,
    log: Callable[[str], None] = print,
    instance_loss: bool = False,
    held_out_scenes: int = 16,
) -> dict[str, float]:
    """Train ``model.backbone.vision_backbone`` in place for ``steps`` steps of ``batch_size``
    concept scenes at the model's resolution (AdamW, weight decay 0.05, linear warm-up over
    100 steps and linear decay to 5 %). With ``instance_loss``, also the shape of each instance
    from its tokens' mean on the level the detector reads (the last one after the scalp).
    Returns the last held-out accuracies on ``held_out_scenes`` scenes of another seed:
    per pixel, ``shape_acc`` and ``colour_acc`` over the shapes' pixels and
    ``background_acc`` elsewhere; with ``instance_loss``, ``instance_acc`` per instance."""
    if steps < 1 or batch_size < 1 or held_out_scenes < 1:
        raise ValueError(
            f"steps, batch_size and held_out_scenes must be >= 1, got {steps}, {batch_size} "
            f"and {held_out_scenes}"
        )
    backbone = model.backbone.vision_backbone
    size = int(backbone.trunk.img_size)
    levels = backbone(paddle.zeros([1, 3, size, size]))[0]
    finest = levels[0]
    grid = int(finest.shape[-1])
    head = paddle.nn.Conv2D(int(finest.shape[1]), len(SHAPES) + len(COLOURS) + 2, 1)
    params = [p for p in backbone.parameters() if not p.stop_gradient] + list(head.parameters())
    read = len(levels) - 1 - int(model.backbone.scalp)  # the level the detector's encoder reads
    instance_grid = instance_head = None
    if instance_loss:
        instance_grid = int(levels[read].shape[-1])
        instance_head = paddle.nn.Linear(int(levels[read].shape[1]), len(SHAPES))
        params += list(instance_head.parameters())

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / 100) * max(0.05, 1 - step / steps)

    scheduler = paddle.optimizer.lr.LambdaDecay(lr, factor)
    opt = paddle.optimizer.AdamW(learning_rate=scheduler, parameters=params, weight_decay=0.05)
    ws = paddle.to_tensor([BACKGROUND_WEIGHT] + [1.0] * len(SHAPES))
    wc = paddle.to_tensor([BACKGROUND_WEIGHT] + [1.0] * len(COLOURS))
    held_out = _batch(seed + 1_000_003, 0, held_out_scenes, size, grid, instance_grid)
    k = len(SHAPES) + 1

    def logits(batch: tuple) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        """Dense logits on the finest level; with the instance loss, each instance's shape
        logits from the mean of its cells on the level the detector reads."""
        levels = backbone(batch[0])[0]
        if instance_head is None or not len(batch[5]):
            return head(levels[0]), None
        cells, owner = batch[3], batch[4]
        tokens = levels[read].flatten(2)[owner]  # N x C x HW: each instance's image
        mean = (tokens * cells.unsqueeze(1)).sum(-1) / cells.sum(-1, keepdim=True)
        return head(levels[0]), instance_head(mean)

    def evaluate() -> dict[str, float]:
        backbone.eval()  # running batch-norm statistics, no stochastic depth
        with paddle.no_grad():
            out, inst = logits(held_out)
        backbone.train()
        ps, pc = out[:, :k].argmax(1).numpy(), out[:, k:].argmax(1).numpy()
        s, c = held_out[1].numpy(), held_out[2].numpy()
        fg = s > 0
        acc = {
            "shape_acc": float((ps[fg] == s[fg]).mean()),
            "colour_acc": float((pc[fg] == c[fg]).mean()),
            "background_acc": float((ps[~fg] == 0).mean()),
        }
        if inst is not None:
            acc["instance_acc"] = float((inst.argmax(1).numpy() == held_out[5].numpy()).mean())
        return acc

    model.train()
    start = time.time()
    metrics: dict[str, float] = {}
    for step in range(steps):
        batch = _batch(seed, step, batch_size, size, grid, instance_grid)
        s, c = batch[1], batch[2]
        out, inst = logits(batch)
        loss = F.cross_entropy(out[:, :k], s.unsqueeze(1), axis=1, weight=ws) + F.cross_entropy(
            out[:, k:], c.unsqueeze(1), axis=1, weight=wc
        )
        if inst is not None:
            loss = loss + F.cross_entropy(inst, batch[5])
        loss.backward()
        opt.step()
        opt.clear_grad()
        scheduler.step()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            metrics = {"step": step + 1, "loss": float(loss), **evaluate()}
            per_instance = (
                f", per instance {metrics['instance_acc']:.3f}" if "instance_acc" in metrics else ""
            )
            log(
                f"step {step + 1}: loss {metrics['loss']:.3f}, held-out shape accuracy "
                f"{metrics['shape_acc']:.3f}{per_instance}, colour {metrics['colour_acc']:.3f}, "
                f"background {metrics['background_acc']:.3f} ({time.time() - start:.0f} s)"
            )
    return metrics


def main(argv: list[str] | None = None) -> int:
    from ...loading.sam3 import build_sam3_image_model
    from ..config import ConfigError, build_config, read_raw
    from .config import Sam3Config, model_spec, validate_sam3

    ap = argparse.ArgumentParser(
        prog="python -m paddle_sam.train.sam3.pretrain", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("config", help="a SAM 3 training config; its model.spec sizes the backbone")
    ap.add_argument("-o", "--output", required=True, help="the .pdparams to write")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--instance-loss",
        action="store_true",
        help="also name each instance's shape from its tokens' mean on the detector's level",
    )
    ap.add_argument(
        "--held-out", type=int, default=16, help="held-out scenes for the logged accuracies"
    )
    ap.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.held_out < 1 or args.lr <= 0:
        print(
            "error: --steps, --batch-size and --held-out must be >= 1 and --lr > 0",
            file=sys.stderr,
        )
        return 2
    out = Path(args.output)
    if out.exists() and not args.overwrite:
        print(f"error: {out} exists; pass --overwrite to replace it", file=sys.stderr)
        return 2
    try:
        raw, where = read_raw(args.config)
        cfg = build_config(Sam3Config, raw, where) if raw.get("family") == "sam3" else None
        if cfg is not None:
            validate_sam3(cfg, where)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg is None or cfg.model.checkpoint is not None:
        print(
            f"error: {args.config}: needs a SAM 3 config with model.spec (trained from scratch)",
            file=sys.stderr,
        )
        return 2
    spec = model_spec(cfg.model)
    paddle.seed(args.seed)
    with warnings.catch_warnings():  # random weights are the point here
        warnings.simplefilter("ignore")
        model = build_sam3_image_model(spec=spec)
    metrics = pretrain_vision_backbone(
        model,
        args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        instance_loss=args.instance_loss,
        held_out_scenes=args.held_out,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    paddle.save(
        {k: v for k, v in model.state_dict().items() if k.startswith(VISION_PREFIX)}, str(out)
    )
    print(f"wrote {out} (held-out shape accuracy {metrics['shape_acc']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
