"""Per-module alignment of the Paddle SAM against the official PyTorch SAM.

Both models run the same image and prompts through their predictors; forward hooks record
every compared module's output, and each pair is scored by cosine similarity and max/mean
absolute error. The first module below the bar is named: that is where to look for a bug.
The parity tests use this same code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

COS_THRESHOLD = 0.99999
MASK_AGREEMENT = 0.999
# mask pixels whose reference logit is this close to the threshold may round either way
MASK_MARGIN = 1e-4


@dataclass
class AlignRow:
    module: str
    shape: tuple[int, ...]
    cosine: float
    max_abs: float
    mean_abs: float
    passed: bool
    agreement: float | None = None  # for boolean masks: fraction of equal pixels
    coverage: float | None = None  # for boolean masks: fraction of reference pixels inside
    # for boolean masks with the reference logits: fraction of equal pixels among those whose
    # reference logit is at least MASK_MARGIN away from the threshold (1.0: any difference is a
    # pixel the two float implementations may legitimately round either way)
    agreement_decided: float | None = None


@dataclass
class AlignReport:
    rows: list[AlignRow] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def first_divergent(self) -> AlignRow | None:
        return next((r for r in self.rows if not r.passed), None)

    def row(self, module: str) -> AlignRow:
        for r in self.rows:
            if r.module == module:
                return r
        raise KeyError(f"no row named {module!r}; have {[r.module for r in self.rows]}")

    def to_json(self) -> str:
        first = self.first_divergent()
        return json.dumps(
            {
                "passed": self.passed,
                "first_divergent": first.module if first else None,
                "cos_threshold": COS_THRESHOLD,
                "rows": [asdict(r) for r in self.rows],
            },
            indent=2,
        )

    def format_table(self) -> str:
        head = f"{'module':<48} {'shape':<22} {'cosine':>12} {'max abs':>10} {'mean abs':>10}  ok"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            cos = f"{r.cosine:.8f}" if r.agreement is None else f"agree {r.agreement:.5f}"
            lines.append(
                f"{r.module:<48} {str(list(r.shape)):<22} {cos:>12} {r.max_abs:>10.2e} "
                f"{r.mean_abs:>10.2e}  {'PASS' if r.passed else 'FAIL'}"
            )
        first = self.first_divergent()
        lines.append(
            "all modules aligned" if first is None else f"first divergent module: {first.module}"
        )
        return "\n".join(lines)


def compare(
    module: str,
    ref: np.ndarray,
    ours: np.ndarray,
    ref_logits: np.ndarray | None = None,
    threshold: float = 0.0,
) -> AlignRow:
    """Score one output pair; shapes must match exactly. For boolean masks, ``ref_logits``
    (the reference's logits behind ``ref``) adds ``agreement_decided``."""
    ref, ours = np.asarray(ref), np.asarray(ours)
    if ref.shape != ours.shape:
        return AlignRow(module, tuple(ours.shape), float("nan"), float("inf"), float("inf"), False)
    if ref.dtype == bool:
        agreement = float((ref == ours).mean()) if ref.size else 1.0
        diff = (ref != ours).astype(np.float64)
        decided = None
        if ref_logits is not None:
            far = np.abs(np.asarray(ref_logits, np.float64) - threshold) >= MASK_MARGIN
            decided = float((ref == ours)[far].mean()) if far.any() else 1.0
        return AlignRow(
            module,
            ref.shape,
            agreement,
            float(diff.max(initial=0.0)),
            float(diff.mean()),
            agreement >= MASK_AGREEMENT,
            agreement,
            float(ref.mean()) if ref.size else 0.0,
            decided,
        )
    a, b = ref.astype(np.float64).ravel(), ours.astype(np.float64).ravel()
    diff = np.abs(a - b)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return AlignRow(module, ref.shape, float("nan"), float("inf"), float("inf"), False)
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    cos = float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))
    return AlignRow(
        module,
        ref.shape,
        cos,
        float(diff.max(initial=0.0)),
        float(diff.mean()) if a.size else 0.0,
        cos >= COS_THRESHOLD,
    )


# modules compared on every call, in execution order (names are shared by both models)
ENCODER_MODULES = ("image_encoder.patch_embed", "image_encoder.blocks.*", "image_encoder.neck")
DECODER_MODULES = ("prompt_encoder", "mask_decoder.transformer", "mask_decoder")


def _expand(names: tuple[str, ...], depth: int) -> list[str]:
    out = []
    for n in names:
        if n.endswith(".*"):
            out.extend(f"{n[:-2]}.{i}" for i in range(depth))
        else:
            out.append(n)
    return out


def _flatten(name: str, out: Any) -> list[tuple[str, Any]]:
    if isinstance(out, (tuple, list)):
        return [(f"{name}[{i}]", o) for i, o in enumerate(out)]
    return [(name, out)]


class _Recorder:
    """Forward hooks on named submodules of a torch or paddle model."""

    def __init__(self, model, names: list[str], framework: str) -> None:
        self.records: list[tuple[str, np.ndarray]] = []
        self.prefix = ""
        self.handles = []
        modules = dict(model.named_modules() if framework == "torch" else model.named_sublayers())
        for name in names:
            mod = modules[name]
            if framework == "torch":
                h = mod.register_forward_hook(self._hook(name))
            else:
                h = mod.register_forward_post_hook(self._hook(name))
            self.handles.append(h)

    def _hook(self, name: str):
        def hook(_module, _inputs, output):
            for sub, t in _flatten(name, output):
                arr = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
                self.records.append((f"{self.prefix}{sub}", arr))

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def default_image(height: int = 480, width: int = 640, seed: int = 0) -> np.ndarray:
    """A fixed synthetic RGB image (smooth gradients, discs and noise): H x W x 3 uint8."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.stack(
        [255 * xx / width, 255 * yy / height, 128 + 60 * np.sin(xx / 23.0 + yy / 31.0)], axis=-1
    )
    for _ in range(6):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        r = rng.uniform(0.05, 0.25) * min(height, width)
        inside = (yy - cy) ** 2 + (xx - cx) ** 2 < r**2
        img[inside] = rng.uniform(0, 255, size=3)
    img += rng.normal(0, 6, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def default_cases(height: int, width: int) -> list[tuple[str, dict[str, Any]]]:
    """Prompt sets covering points, boxes, box + negative point and mask refinement."""
    h, w = height, width
    pt = np.array([[0.4 * w, 0.45 * h]])
    pts = np.array([[0.4 * w, 0.45 * h], [0.7 * w, 0.3 * h], [0.2 * w, 0.8 * h]])
    box = np.array([0.15 * w, 0.2 * h, 0.65 * w, 0.75 * h])
    return [
        ("point", dict(point_coords=pt, point_labels=np.array([1]), multimask_output=True)),
        (
            "points",
            dict(point_coords=pts, point_labels=np.array([1, 1, 0]), multimask_output=False),
        ),
        ("box", dict(box=box, multimask_output=False)),
        (
            "box+neg",
            dict(point_coords=pts[1:2], point_labels=np.array([0]), box=box, multimask_output=True),
        ),
        (
            "refine",
            dict(
                point_coords=pts[:2],
                point_labels=np.array([1, 1]),
                mask_input="previous",
                multimask_output=False,
            ),
        ),
    ]


def align_sam(
    torch_sam,
    paddle_sam,
    image: np.ndarray | None = None,
    cases: list[tuple[str, dict[str, Any]]] | None = None,
) -> AlignReport:
    """Run both models through their predictors and compare module by module.

    ``mask_input="previous"`` in a case feeds each predictor its own best low-res logits of
    the previous case, as an interactive refinement loop does.
    """
    from segment_anything import SamPredictor as TorchPredictor

    from ..predict.sam_v1.predictor import SamPredictor

    image = default_image() if image is None else image
    cases = default_cases(*image.shape[:2]) if cases is None else cases
    depth = len(paddle_sam.image_encoder.blocks)
    names = _expand(ENCODER_MODULES, depth) + list(DECODER_MODULES)
    rec_t = _Recorder(torch_sam, names, "torch")
    rec_p = _Recorder(paddle_sam, names, "paddle")
    report = AlignReport()
    try:
        import torch

        ref, ours = TorchPredictor(torch_sam), SamPredictor(paddle_sam)
        with torch.no_grad():
            ref.set_image(image)
        ours.set_image(image)
        report.rows.append(
            compare(
                "image_embedding",
                ref.get_image_embedding().numpy(),
                ours.get_image_embedding().numpy(),
            )
        )
        prev_t = prev_p = None
        for case, kwargs in cases:
            rec_t.prefix = rec_p.prefix = f"[{case}] "
            kt, kp = dict(kwargs), dict(kwargs)
            if kwargs.get("mask_input") == "previous":
                kt["mask_input"], kp["mask_input"] = prev_t, prev_p
            with torch.no_grad():  # logits, to tell borderline pixels from real differences
                logits_t, st, lt = ref.predict(**kt, return_logits=True)
            threshold = float(torch_sam.mask_threshold)
            mt = logits_t > threshold
            mp, sp, lp = ours.predict(**kp)
            report.rows += [
                compare(f"[{case}] masks", mt, mp, logits_t, threshold),
                compare(f"[{case}] iou_predictions", st, sp),
                compare(f"[{case}] low_res_logits", lt, lp),
            ]
            prev_t, prev_p = lt[np.argmax(st)][None], lp[np.argmax(sp)][None]
        recorded_t = dict(rec_t.records)
        for name, arr in rec_p.records:
            if name in recorded_t:
                report.rows.append(compare(name, recorded_t[name], arr))
    finally:
        rec_t.remove()
        rec_p.remove()
    # hooks record in execution order: put module rows first, predictor outputs after
    order = {n: i for i, (n, _) in enumerate(rec_p.records)}
    report.rows.sort(key=lambda r: order.get(r.module, len(order)))
    return report
