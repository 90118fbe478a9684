"""What SAM 2's export costs in accuracy: the image encoder on OpenVINO (fp32, int8 weights,
and bf16 where the CPU has avx512_bf16 or AMX) against the dynamic model, full size, same
weights.

    python benchmarks/sam2_export_accuracy.py [--models t,b+] [--clicks 32]
        [--csv benchmarks/results/sam2_export_accuracy_<timestamp>.csv]

Per model: the official SAM 2.1 config built by upstream's ``build_sam2`` with random weights
(``tests/helpers/sam2_ref.py``: seeded, every tensor perturbed), converted, then exported by
``export_sam2``. On the generated 768 x 1024 image of ``bench_sam_v1``, ``set_image`` on the
dynamic model and on the export; then ``--clicks`` random single clicks (fixed seed), each
answered with three masks: per mask, the share of pixels equal to the dynamic model's, and the
score difference. Random weights give masks of no meaning but of the model's full numerics:
this says how far the runtime moves the answer, not how good the answer is.

Prints a table and writes a CSV (one row per model and runtime). A measurement: no thresholds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.* (weights)

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime as dt  # noqa: E402
import tempfile  # noqa: E402

import bench_sam_v1 as v1  # noqa: E402
import numpy as np  # noqa: E402

MODELS = {"t": "tiny", "b+": "base_plus"}


def measure(model: str, clicks: int, tmp: Path) -> list[dict]:
    import paddle

    from paddle_sam._runtime import bf16_refusal
    from paddle_sam.convert.checkpoint import convert_checkpoint
    from paddle_sam.export.sam2 import export_sam2
    from paddle_sam.loading.sam2 import load_sam2, load_sam2_export
    from paddle_sam.predict.sam2.predictor import SAM2ImagePredictor
    from tests.helpers.sam2_ref import config_file, official_model, save_official

    pt = save_official(official_model(config_file("2.1", model)), tmp / f"{model}.pt")
    pdparams = tmp / f"{model}.pdparams"
    convert_checkpoint(pt, pdparams, progress=False)
    dynamic = load_sam2(pdparams)
    export_sam2(
        dynamic,
        tmp / f"{model}_export",
        model_type=f"sam2.1_hiera_{MODELS[model]}",
        quantize="int8",
    )
    image = v1.make_image()
    rng = np.random.default_rng(0)
    points = rng.uniform(0, 1, (clicks, 2)) * np.array([image.shape[1], image.shape[0]])

    def answers(m) -> tuple[np.ndarray, list]:
        p = SAM2ImagePredictor(m)
        with paddle.no_grad():
            p.set_image(image)
            emb = p.get_image_embedding().numpy()
            return emb, [p.predict(pt[None], np.array([1])) for pt in points]

    ref_emb, ref = answers(dynamic)
    rows = []
    precisions = ["fp32", "int8"] + (["bf16"] if bf16_refusal() is None else [])
    for precision in precisions:
        emb, got = answers(load_sam2_export(tmp / f"{model}_export", precision=precision))
        agree = [
            float(np.mean(a == b))
            for (ma, _, _), (mb, _, _) in zip(got, ref, strict=True)
            for a, b in zip(ma, mb, strict=True)
        ]
        dscore = [
            float(np.abs(sa - sb).max()) for (_, sa, _), (_, sb, _) in zip(got, ref, strict=True)
        ]
        a, b = emb.ravel(), ref_emb.ravel()
        rows.append(
            {
                "model": f"sam2.1_hiera_{MODELS[model]}",
                "runtime": f"openvino {precision}",
                "masks": len(agree),
                "agreement_min": min(agree),
                "agreement_p01": float(np.percentile(agree, 1)),
                "agreement_median": float(np.median(agree)),
                "masks_at_least_99.9pct": float(np.mean(np.array(agree) >= 0.999)),
                "score_diff_max": max(dscore),
                "embedding_max_abs_diff": float(np.abs(a - b).max()),
                "embedding_cosine": float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="t,b+", help="comma list of t, b+")
    p.add_argument("--clicks", type=v1.positive, default=32)
    p.add_argument("--csv", default=None)
    args = p.parse_args(argv)
    import paddle_sam

    paddle_sam.tune_process()
    started = dt.datetime.now().astimezone()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sam2_export_accuracy_") as tmp:
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            if model not in MODELS:
                raise SystemExit(f"--models: unknown {model!r} (t, b+)")
            rows += measure(model, args.clicks, Path(tmp))
    print(f"cpu: {v1._cpu_model()}; flags: {v1.cpu_flags()}; {started:%Y-%m-%d %H:%M %Z}")
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r.values()))
    path = Path(
        args.csv
        or Path(__file__).parent / "results" / f"sam2_export_accuracy_{started:%Y%m%d-%H%M%S}.csv"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
