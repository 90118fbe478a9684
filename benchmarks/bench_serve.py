"""Round trip per click of ``paddle-sam serve``: HTTP request in, mask PNG out, embedding cached.

Starts ``paddle-sam serve`` in its own process on a free loopback port, uploads one image
(the embedding is computed once), then times prompt requests from a keep-alive client:
the wall time from sending the request to holding the decoded mask PNG bytes. The server's
own figures split each request into the model call (prompt encoder + mask decoder +
upscaling, under the model lock) and the rest of its handler (PNG/RLE encoding). A reference
row times ``SamPredictor.predict`` alone in this process on the same prompts, interleaved
with the first case's requests so both see the same machine load.

Without --checkpoint, random ViT-B weights are written in the official layout and
converted (cached under benchmarks/results/): timings do not depend on the weights.

    python benchmarks/bench_serve.py --clicks 50
    python benchmarks/bench_serve.py --exported sam_vit_b_static/   # Paddle Inference decoder
"""

from __future__ import annotations

import argparse
import base64
import csv
import io
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "paddle_sam", *args], check=True, cwd=ROOT)


def random_vit_b() -> Path:
    dst = RESULTS / "sam_vit_b_random.pdparams"
    if not dst.exists():
        src = RESULTS / "sam_vit_b_random.safetensors"
        _cli("random-checkpoint", "--model-type", "vit_b", "-o", str(src), "--overwrite")
        _cli("convert", str(src), str(dst), "--overwrite", "--quiet")
        src.unlink()
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_image(h: int, w: int) -> bytes:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([255 * xx / w, 255 * yy / h, 128 + 0 * xx], -1) + rng.normal(0, 8, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


REFERENCE_CASE = "1 point, 1 mask, png"


def reference_predictor(ckpt: Path | None, exported: Path | None, height: int, width: int):
    """The server's predictor in this process with a random embedding, to time decoding alone.

    The prompt decoder's cost does not depend on the embedding's values, so the image
    encoder (tens of seconds on a CPU) is skipped.
    """
    import paddle

    if exported is not None:
        from paddle_sam.deploy import StaticSamPredictor

        p = StaticSamPredictor(exported)
        spec = p.manifest["spec"]
        grid = p.mask_input_size[0] // 4
        p.features = np.random.default_rng(0).standard_normal(
            (1, spec["prompt_embed_dim"], grid, grid), dtype=np.float32
        )
    else:
        from paddle_sam.loading.sam_v1 import load_sam
        from paddle_sam.predict.sam_v1.predictor import SamPredictor

        p = SamPredictor(load_sam(ckpt))
        grid = p.model.prompt_encoder.image_embedding_size
        p.features = paddle.randn([1, p.model.prompt_encoder.embed_dim, *grid])
        with paddle.no_grad():
            p.dense_pe = p.model.prompt_encoder.get_dense_pe()
    scale = p.transform.target_length / max(height, width)
    p.original_size = (height, width)
    p.input_size = (int(height * scale + 0.5), int(width * scale + 0.5))
    p.is_image_set = True
    return p


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--checkpoint", default=None, help="a converted .pdparams (default: random ViT-B)"
    )
    ap.add_argument(
        "--exported", default=None, help="serve a 'paddle-sam export' folder (Paddle Inference)"
    )
    ap.add_argument("--clicks", type=int, default=50, help="timed requests per case")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--height", type=int, default=768)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--csv", default=str(RESULTS / "bench_serve.csv"))
    ap.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip timing SamPredictor.predict in-process next to the first case",
    )
    args = ap.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # paddle's import turns INFO logs on

    RESULTS.mkdir(parents=True, exist_ok=True)
    exported = Path(args.exported) if args.exported else None
    ckpt = None if exported else Path(args.checkpoint) if args.checkpoint else random_vit_b()
    source = ["--exported", str(exported)] if exported else ["--checkpoint", str(ckpt)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "paddle_sam", "serve", *source,
         "--port", str(port), "--log-level", "warning"],
        env=env,
    )  # fmt: skip
    rows = []
    try:
        with httpx.Client(base_url=url, timeout=600) as http:
            for _ in range(600):
                try:
                    health = http.get("/health").json()
                    break
                except httpx.TransportError:
                    if server.poll() is not None:
                        raise SystemExit("the server exited") from None
                    time.sleep(0.2)
            print(
                f"model {health['model']['type']} ({health['model']['runtime']}), "
                f"{health['threads']} threads"
            )
            t = time.perf_counter()
            r = http.post(
                "/sessions", files={"image": ("b.png", test_image(args.height, args.width))}
            )
            r.raise_for_status()
            sess = r.json()
            print(
                f"upload + embedding {args.width}x{args.height}: {time.perf_counter() - t:.2f} s "
                f"(model {sess['embed_seconds']:.2f} s)"
            )
            sid = sess["session_id"]
            rng = np.random.default_rng(0)
            cases = {
                "1 point, 1 mask, png": dict(outputs=["png"]),
                "1 point, 1 mask, png+rle": dict(outputs=["png", "rle"]),
                "1 point, 3 masks, png": dict(outputs=["png"], multimask=True),
                "box + 2 points, 1 mask, png": dict(outputs=["png"], box=True),
            }
            direct = None
            if args.reference:
                direct = reference_predictor(ckpt, exported, args.height, args.width)
            for name, opts in cases.items():
                wall, model, handler, alone = [], [], [], []
                for i in range(args.warmup + args.clicks):
                    x, y = rng.uniform(0, args.width), rng.uniform(0, args.height)
                    body = {"points": [[x, y]], "outputs": opts["outputs"]}
                    if opts.get("multimask"):
                        body["multimask"] = True
                    if opts.get("box"):
                        body["points"].append([x / 2, y / 2])
                        body["labels"] = [1, 0]
                        body["box"] = [
                            x / 4,
                            y / 4,
                            min(x + 200, args.width),
                            min(y + 200, args.height),
                        ]
                    t = time.perf_counter()
                    r = http.post(f"/sessions/{sid}/prompt", json=body)
                    r.raise_for_status()
                    answer = r.json()
                    pngs = [base64.b64decode(m["png"]) for m in answer["masks"]]
                    dt = time.perf_counter() - t
                    assert pngs[0][:4] == b"\x89PNG"
                    if direct is not None and name == REFERENCE_CASE:
                        # the same prompt in this process, interleaved so both see the same load
                        t = time.perf_counter()
                        direct.predict(
                            np.array(body["points"]), np.array([1]), multimask_output=False
                        )
                        if i >= args.warmup:
                            alone.append((time.perf_counter() - t) * 1e3)
                    if i >= args.warmup:
                        wall.append(dt * 1e3)
                        model.append(answer["timings_ms"]["model"])
                        handler.append(answer["timings_ms"]["total"])
                if alone:
                    rows.append(
                        {
                            "case": f"{type(direct).__name__}.predict alone, no HTTP",
                            "requests": len(alone),
                            "round_trip_median_ms": round(statistics.median(alone), 1),
                            "round_trip_p90_ms": round(pct(alone, 90), 1),
                            "model_median_ms": round(statistics.median(alone), 1),
                            "handler_median_ms": "",
                            "outside_model_median_ms": 0.0,
                        }
                    )
                rows.append(
                    {
                        "case": name,
                        "requests": len(wall),
                        "round_trip_median_ms": round(statistics.median(wall), 1),
                        "round_trip_p90_ms": round(pct(wall, 90), 1),
                        "model_median_ms": round(statistics.median(model), 1),
                        "handler_median_ms": round(statistics.median(handler), 1),
                        "outside_model_median_ms": round(
                            statistics.median(w - m for w, m in zip(wall, model, strict=True)), 1
                        ),
                    }
                )
            http.delete(f"/sessions/{sid}")
    finally:
        server.terminate()
        server.wait(timeout=30)

    cols = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print(" | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    print(f"-> {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
