"""What every family's alignment shares: the per-module metrics, the report, forward hooks on
paired modules of the official PyTorch model and ours, and the fixed inputs.

An :class:`Alignment` holds hooks on pairs of modules (the reference's and ours, under one
label). Each side runs the same step inside :meth:`Alignment.stage`; the outputs recorded
there are paired by label, in our execution order, and scored by cosine similarity and
max / mean absolute error. The report's first row below the bar names the module where the
two implementations part: the place to look for a bug.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
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
    # why a row failed without numbers (an output one side has and the other lacks)
    note: str | None = None


@dataclass
class AlignReport:
    rows: list[AlignRow] = field(default_factory=list)
    # what was compared: family, model type, weights (checkpoint or random), image size
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    def first_divergent(self) -> AlignRow | None:
        return next((r for r in self.rows if not r.passed), None)

    def row(self, module: str) -> AlignRow:
        for r in self.rows:
            if r.module == module:
                return r
        raise KeyError(f"no row named {module!r}; have {[r.module for r in self.rows]}")

    def modules(self) -> set[str]:
        """The compared names without the stage prefix and output index: ``[box] mask_decoder[0]``
        -> ``mask_decoder``."""
        return {r.module.split("] ")[-1].split("[")[0].split("#")[0] for r in self.rows}

    def summary(self) -> dict[str, Any]:
        """Rows compared, the lowest cosine and the largest max abs error of the numeric
        rows, the lowest agreement of the mask rows, each with its module."""
        numeric = [r for r in self.rows if r.agreement is None and np.isfinite(r.cosine)]
        masks = [r for r in self.rows if r.agreement is not None]
        out: dict[str, Any] = {"compared": len(self.rows)}
        if numeric:
            low = min(numeric, key=lambda r: r.cosine)
            high = max(numeric, key=lambda r: r.max_abs)
            out["lowest_cosine"] = [low.cosine, low.module]
            out["largest_max_abs"] = [high.max_abs, high.module]
        if masks:
            worst = min(masks, key=lambda r: r.agreement)
            out["lowest_mask_agreement"] = [worst.agreement, worst.module]
        return out

    def to_json(self) -> str:
        first = self.first_divergent()
        return json.dumps(
            {
                **self.meta,
                "passed": self.passed,
                "first_divergent": first.module if first else None,
                "cos_threshold": COS_THRESHOLD,
                "summary": self.summary(),
                "rows": [asdict(r) for r in self.rows],
            },
            indent=2,
        )

    def format_table(self) -> str:
        width = max([48, *(len(r.module) + 1 for r in self.rows)])
        head = (
            f"{'module':<{width}} {'shape':<22} {'cosine':>12} {'max abs':>10} {'mean abs':>10}  ok"
        )
        lines = [head, "-" * len(head)]
        for r in self.rows:
            cos = f"{r.cosine:.8f}" if r.agreement is None else f"agree {r.agreement:.5f}"
            line = (
                f"{r.module:<{width}} {str(list(r.shape)):<22} {cos:>12} {r.max_abs:>10.2e} "
                f"{r.mean_abs:>10.2e}  {'PASS' if r.passed else 'FAIL'}"
            )
            lines.append(line + (f"  ({r.note})" if r.note else ""))
        first = self.first_divergent()
        summary = self.summary()
        if "lowest_cosine" in summary:
            (cos, at), (err, where) = summary["lowest_cosine"], summary["largest_max_abs"]
            lines.append(
                f"{summary['compared']} outputs compared; lowest cosine {cos:.8f} ({at}), "
                f"largest max abs error {err:.2e} ({where})"
            )
        if not self.rows:
            lines.append("nothing compared")
        else:
            lines.append(
                "all modules aligned"
                if first is None
                else f"first divergent module: {first.module}"
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
        return AlignRow(
            module,
            tuple(ours.shape),
            float("nan"),
            float("inf"),
            float("inf"),
            False,
            note=f"shape {list(ours.shape)}, reference {list(ref.shape)}",
        )
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
            float(diff.mean()) if ref.size else 0.0,
            agreement >= MASK_AGREEMENT,
            agreement,
            float(ref.mean()) if ref.size else 0.0,
            decided,
        )
    a, b = ref.astype(np.float64).ravel(), ours.astype(np.float64).ravel()
    diff = np.abs(a - b)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return AlignRow(
            module, ref.shape, float("nan"), float("inf"), float("inf"), False, note="not finite"
        )
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


def missing(module: str, note: str) -> AlignRow:
    """A failing row for an output only one side produced."""
    return AlignRow(module, (), float("nan"), float("inf"), float("inf"), False, note=note)


def to_numpy(x: Any) -> np.ndarray:
    """A torch or paddle tensor (bfloat16 read as float32) or an array, as a numpy array."""
    if hasattr(x, "place") and hasattr(x, "numpy"):  # paddle
        if str(x.dtype).endswith(("bfloat16", "float16")):
            x = x.astype("float32")
        return x.numpy()
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu()
        if x.dtype.is_floating_point and x.element_size() < 4:
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "detach") or (hasattr(x, "numpy") and hasattr(x, "place"))


def flatten(name: str, out: Any) -> list[tuple[str, Any]]:
    """The tensors of a module's output with their names: a tuple or list by index
    (``name[0]``), a dict by key (``name.key``), nested; anything else is left out."""
    if _is_tensor(out):
        return [(name, out)]
    if isinstance(out, (tuple, list)):
        return [item for i, o in enumerate(out) for item in flatten(f"{name}[{i}]", o)]
    if isinstance(out, dict):
        return [item for k, o in out.items() for item in flatten(f"{name}.{k}", o)]
    return []


def submodule(model: Any, name: str) -> Any:
    """The submodule ``name`` of a torch module or paddle layer; a KeyError naming it."""
    named = model.named_modules() if hasattr(model, "named_modules") else model.named_sublayers()
    found = dict(named).get(name)
    if found is None:
        raise KeyError(f"{type(model).__name__} has no submodule {name!r}")
    return found


class _Recorder:
    """Records the outputs of labelled modules of one side (torch or paddle): each call's
    output tensors as numpy arrays, in call order; a label called twice in one stage gets
    ``#2``. The module's ``forward`` is wrapped on the instance rather than hooked, so that a
    module its parent calls as ``module.forward(...)`` (sam3's vision backbone) is seen too."""

    def __init__(self, modules: dict[str, list[Any]]) -> None:
        self.records: list[tuple[str, np.ndarray]] = []
        self.prefix = ""
        self.paused = False
        self._calls: dict[str, int] = {}
        self._wrapped: list[tuple[Any, Any]] = []
        for label, mods in modules.items():
            for mod in mods:
                self._wrap(mod, label)

    def _wrap(self, module: Any, label: str) -> None:
        own = module.__dict__.get("forward")  # an instance attribute to put back, if any
        forward = module.forward

        def recorded(*args: Any, **kwargs: Any) -> Any:
            output = forward(*args, **kwargs)
            self._record(label, output)
            return output

        object.__setattr__(module, "forward", recorded)
        self._wrapped.append((module, own))

    def start(self, prefix: str) -> None:
        self.records, self.prefix, self._calls = [], prefix, {}

    def _record(self, label: str, output: Any) -> None:
        if self.paused:
            return
        n = self._calls[label] = self._calls.get(label, 0) + 1
        name = f"{self.prefix}{label}" + (f"#{n}" if n > 1 else "")
        for sub, t in flatten(name, output):
            self.records.append((sub, to_numpy(t)))

    def remove(self) -> None:
        for module, own in reversed(self._wrapped):
            if own is None:
                object.__delattr__(module, "forward")
            else:
                object.__setattr__(module, "forward", own)
        self._wrapped = []


ModulePair = tuple[str, Any, Any]


class Alignment:
    """Hooks on pairs ``(label, reference module, our module(s))`` and the report they fill.

    Use as a context manager (the hooks are removed on exit); run each step of both sides in
    ``with alignment.stage("[case] "):`` and add the steps' final outputs with
    :meth:`output`. Our module may be a list: several of our layers that play the one
    reference module's part (SAM 3's tracker heads live in two of our models)."""

    def __init__(self, pairs: Sequence[ModulePair]) -> None:
        self.report = AlignReport()
        ref: dict[str, list[Any]] = {}
        ours: dict[str, list[Any]] = {}
        for label, r, o in pairs:
            ref.setdefault(label, []).append(r)
            ours.setdefault(label, []).extend(o if isinstance(o, list) else [o])
        self._ref, self._ours = _Recorder(ref), _Recorder(ours)

    def __enter__(self) -> Alignment:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._ref.remove()
        self._ours.remove()

    @contextlib.contextmanager
    def stage(self, prefix: str = "") -> Iterator[None]:
        """Record both sides' module outputs inside the block; pair them after it."""
        self._ref.start(prefix)
        self._ours.start(prefix)
        yield
        theirs = dict(self._ref.records)
        ours = dict(self._ours.records)
        for name, arr in self._ours.records:
            if name in theirs:
                self.report.rows.append(compare(name, theirs[name], arr))
            else:
                self.report.rows.append(missing(name, "the reference has no such output"))
        for name, _ in self._ref.records:
            if name not in ours:
                self.report.rows.append(missing(name, "ours has no such output"))
        self._ref.records, self._ours.records = [], []

    @contextlib.contextmanager
    def unrecorded(self) -> Iterator[None]:
        """Run a step whose module outputs were compared before (features computed again)."""
        self._ref.paused = self._ours.paused = True
        try:
            yield
        finally:
            self._ref.paused = self._ours.paused = False

    def output(
        self,
        name: str,
        ref: Any,
        ours: Any,
        ref_logits: Any = None,
        threshold: float = 0.0,
    ) -> AlignRow:
        """Compare one final output of a step (after the stage's module rows)."""
        logits = None if ref_logits is None else to_numpy(ref_logits)
        row = compare(name, to_numpy(ref), to_numpy(ours), logits, threshold)
        self.report.rows.append(row)
        return row


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


def click_cases(height: int, width: int) -> list[tuple[str, dict[str, Any]]]:
    """Prompt sets for SAM's ``predict`` (SAM v1, SAM 2, SAM 3's ``predict_inst``): points,
    boxes, box + negative point and mask refinement (``mask_input="previous"``)."""
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


def run_click_cases(
    alignment: Alignment,
    ref_predict: Any,
    our_predict: Any,
    cases: list[tuple[str, dict[str, Any]]],
    threshold: float = 0.0,
    tag: str = "",
) -> None:
    """Each case through both ``predict`` functions (SAM's signature, returning masks, scores
    and low-res logits): module rows, then ``masks`` (the reference's logits thresholded at
    ``threshold``), ``iou_predictions`` and ``low_res_logits``. ``mask_input="previous"``
    feeds each side its own best low-res logits of the previous case, as an interactive
    refinement loop does. ``tag`` goes before each case's name (``[inst point]``)."""
    import torch

    prev_t = prev_p = None
    for case, kwargs in cases:
        name = f"[{tag}{case}] "
        kt, kp = dict(kwargs), dict(kwargs)
        if kwargs.get("mask_input") == "previous":
            kt["mask_input"], kp["mask_input"] = prev_t, prev_p
        with alignment.stage(name):
            with torch.no_grad():  # logits, to tell borderline pixels from real differences
                logits_t, st, lt = (to_numpy(x) for x in ref_predict(**kt, return_logits=True))
            mp, sp, lp = (to_numpy(x) for x in our_predict(**kp))
        alignment.output(f"{name}masks", logits_t > threshold, mp.astype(bool), logits_t, threshold)
        alignment.output(f"{name}iou_predictions", st, sp)
        alignment.output(f"{name}low_res_logits", lt, lp)
        prev_t, prev_p = lt[np.argmax(st)][None], lp[np.argmax(sp)][None]


def perturb_torch_(module: Any, seed: int = 0, scale: float = 0.02, init_std: float = 0.02) -> Any:
    """Make every floating tensor of a torch module's state dict finite and non-trivial, in
    place; returns the module.

    A tensor holding a non-finite or absurd value (SAM 3 leaves two text-encoder tensors as
    ``torch.empty``) is first drawn from N(0, ``init_std``). Then each gets relative noise
    ``scale * N(0, 1) * (mean|t| + 0.5)``: default inits leave norms at 1 and biases at 0,
    which a port could get wrong and still match. Complex and integer tensors stay.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in module.state_dict().values():
            if not t.is_floating_point() or not t.numel():
                continue
            if not torch.isfinite(t).all() or t.abs().max() > 1e3:
                t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype) * init_std)
            noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
            t.add_(scale * noise * (t.abs().mean() + 0.5))
    return module


def load_official(module: Any, path: Any, map_keys: Any = None) -> Any:
    """Load an official checkpoint into a torch reference module strictly: ``torch.load``
    with ``weights_only=True`` (no pickled code runs), the state dict under ``"model"`` if
    the file wraps it so, keys mapped by ``map_keys`` (a function of the dict) if given. A
    file whose keys or shapes do not fit is a one-line ValueError naming a few of them.
    Returns ``module``."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a state dict (a {type(state).__name__})")
    if map_keys is not None:
        state = map_keys(state)
    own = module.state_dict()
    problems = []
    for what, keys in (
        ("missing", sorted(set(own) - set(state))),
        ("unexpected", sorted(set(state) - set(own))),
        (
            "of another shape",
            [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)],
        ),
    ):
        if keys:
            problems.append(f"{len(keys)} keys {what} ({', '.join(keys[:3])})")
    if problems:
        raise ValueError(
            f"{path} does not fit the official model of these sizes: {'; '.join(problems)}"
        )
    module.load_state_dict(state, strict=True)
    return module


def numpy_state_dict(model: Any) -> dict[str, np.ndarray]:
    """A torch module's state dict as numpy arrays (official key names and layouts)."""
    return {k: to_numpy(v) for k, v in model.state_dict().items()}
