"""Long-running use: no memory growth across 1,000 predictions (tiny config, CPU).

Each predictor runs in a fresh process, so the resident set measured is its own: after a
warm-up of 300 predictions (every image size, point count and prompt kind seen, so allocator
pools and oneDNN's per-shape primitives are in place), 1,000 more predictions on four images
of different sizes must not grow it by more than a few MB. A leak of one low-res mask per
call (3 x 64 x 64 floats, 48 KB) would add ~48 MB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import paddle
import pytest

from paddle_sam import build_sam
from paddle_sam.export.sam_v1 import export_sam
from tests.helpers.specs import TINY

SCRIPT = textwrap.dedent(
    """
    import gc, json, sys
    import numpy as np, paddle, psutil
    sys.path.insert(0, {root!r})
    from tests.helpers.pairs import image
    from tests.helpers.specs import TINY
    from paddle_sam import SamPredictor, build_sam
    from paddle_sam.deploy import StaticSamPredictor

    if {kind!r} == "dynamic":
        paddle.seed(0)
        predictor = SamPredictor(build_sam(TINY))
    else:
        predictor = StaticSamPredictor({export!r})
    images = [image(150 + 7 * i, 230 - 5 * i, seed=i) for i in range(4)]
    rng = np.random.default_rng(0)
    proc = psutil.Process()

    def work(n):
        for i in range(n):
            if i % 25 == 0:
                predictor.set_image(images[(i // 25) % 4])
            h, w = predictor.original_size
            k = 1 + i % 7
            pts = rng.uniform(0, [w - 1, h - 1], size=(k, 2))
            box = np.array([5, 5, w - 10, h - 10]) if i % 3 == 0 else None
            masks, scores, logits = predictor.predict(pts, np.ones(k), box=box)
            if i % 5 == 0:
                predictor.predict(pts, np.ones(k), mask_input=logits[:1], multimask_output=False)
        gc.collect()
        return proc.memory_info().rss

    before = work(300)  # every image, point count and prompt kind seen: pools are full
    after = work(1000)
    print(json.dumps({{"before": before, "after": after}}))
    """
)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    paddle.seed(0)
    d = tmp_path_factory.mktemp("mem") / "tiny"
    export_sam(build_sam(TINY), d)
    return d


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_no_growth_across_1000_predictions(kind, export_dir, request):
    root = str(request.config.rootpath)
    code = SCRIPT.format(kind=kind, export=str(export_dir), root=root)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    rss = json.loads(run.stdout.strip().splitlines()[-1])
    growth_mb = (rss["after"] - rss["before"]) / 2**20
    assert growth_mb < 8, f"{kind}: resident set grew {growth_mb:.1f} MB over 1,000 predictions"


def test_release_memory_keeps_the_embedding(export_dir):
    import numpy as np

    from paddle_sam.deploy import StaticSamPredictor
    from tests.helpers.pairs import image

    p = StaticSamPredictor(export_dir)
    p.set_image(image(100, 120))
    first = p.predict(np.array([[30, 40]]), np.array([1]))
    p.release_memory()
    again = p.predict(np.array([[30, 40]]), np.array([1]))
    np.testing.assert_array_equal(first[0], again[0])
