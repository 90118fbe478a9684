"""Starting points for training a SAM 3 from scratch (``model.box_prior_init`` in a config).

With random weights the decoder's box relative-position bias (``boxRPB``) is noise and the
learned reference boxes all sit near the image centre, so every query looks at the whole image
and predicts much the same box: the losses plateau with boxes and masks no better than a
guess. :func:`box_prior_init` starts the decoder as a DETR with box priors does: reference
boxes on a grid over the image, and a bias that lets each query attend inside its reference
box only (0 inside, falling off with the log distance outside). Both stay trainable.
"""

from __future__ import annotations

import math

import numpy as np
import paddle

from ...models.sam3.model_misc import inverse_sigmoid


def grid_boxes(num_queries: int) -> np.ndarray:
    """``num_queries x 4`` boxes (cx, cy, w, h in [0, 1]) on a near-square grid, row by row,
    each 1.5 grid cells wide and high (at most half the image)."""
    cols = math.ceil(math.sqrt(num_queries))
    rows = math.ceil(num_queries / cols)
    i = np.arange(num_queries)
    cx, cy = (i % cols + 0.5) / cols, (i // cols + 0.5) / rows
    w = np.full(num_queries, min(0.5, 1.5 / cols))
    h = np.full(num_queries, min(0.5, 1.5 / rows))
    return np.stack([cx, cy, w, h], axis=1).astype(np.float32)


def box_prior_init(model: paddle.nn.Layer, strength: float = 10.0) -> None:
    """Reference boxes on :func:`grid_boxes` and a box bias of ``-strength x`` the log-scaled
    distance outside the box, the same for every head (``model``: a ``Sam3Image`` whose
    decoder has ``boxRPB="log"``)."""
    dec = model.transformer.decoder
    if dec.boxRPB != "log":
        raise ValueError(f"box_prior_init needs the decoder's boxRPB 'log', not {dec.boxRPB!r}")
    boxes = paddle.to_tensor(grid_boxes(dec.reference_points.weight.shape[0]))
    with paddle.no_grad():
        dec.reference_points.weight.set_value(inverse_sigmoid(boxes.clip(1e-3, 1 - 1e-3)))
        for mlp in (dec.boxRPB_embed_x, dec.boxRPB_embed_y):
            first, last = mlp.layers[0], mlp.layers[-1]
            if len(mlp.layers) != 2 or first.weight.shape[0] != 2:
                raise ValueError("box_prior_init expects the 2-layer log-scale boxRPB MLPs")
            # inputs: the log-scaled offsets of a coordinate from the box's near edge (>= 0
            # inside) and far edge (<= 0 inside); hidden units 0 and 1 measure how far outside
            w0, b0 = first.weight.numpy(), first.bias.numpy()
            w0[:, :2] = [[-1.0, 0.0], [0.0, 1.0]]
            b0[:2] = 0.0
            first.weight.set_value(w0)
            first.bias.set_value(b0)
            w1 = np.zeros(last.weight.shape, np.float32)
            w1[:2] = -strength
            last.weight.set_value(w1)
            last.bias.set_value(np.zeros(last.bias.shape, np.float32))


__all__ = ["box_prior_init", "grid_boxes"]


VISION_PREFIX = "backbone.vision_backbone."


def load_vision_backbone(model: paddle.nn.Layer, path: str) -> int:
    """Set the vision backbone's weights (every ``backbone.vision_backbone.*`` parameter and
    buffer) from ``path``, a Paddle state dict (``.pdparams``) holding at least those keys,
    e.g. one written by :mod:`.pretrain` or a trained model's file; the rest of ``model`` is
    left as it is. Returns how many tensors were set. A missing file, a file without the
    backbone or with other sizes is an error naming it."""
    from pathlib import Path

    if not Path(path).is_file():
        raise FileNotFoundError(f"model.backbone_init: {path} does not exist")
    state = paddle.load(str(path))
    if not isinstance(state, dict):
        raise ValueError(f"model.backbone_init: {path} is not a state dict")
    own = {k: v for k, v in model.state_dict().items() if k.startswith(VISION_PREFIX)}
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(
            f"model.backbone_init: {path} lacks {len(missing)} of the {len(own)} vision "
            f"backbone tensors, e.g. {missing[0]}"
        )
    for key, target in own.items():
        value = np.asarray(state[key].numpy() if hasattr(state[key], "numpy") else state[key])
        if list(value.shape) != list(target.shape):
            raise ValueError(
                f"model.backbone_init: {path}: {key} is {list(value.shape)}, the model's "
                f"{list(target.shape)} (another model size)"
            )
        target.set_value(value.astype(np.dtype(str(target.numpy().dtype))))
    return len(own)
