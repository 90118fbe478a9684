"""Full-size SAM 3 video tracker against the official one (sam3 0.1.4): random weights in the
released ``sam3.pt`` layout (every ``detector.*`` and ``tracker.*`` key of the released
checkpoint, nothing else), converted by ``convert_checkpoint`` and loaded by
``load_sam3_tracker``; a freshly built official tracker (``build_tracker(with_backbone=True)``)
loads the same file (its ``tracker.*`` keys and the detector's vision backbone, strictly).
Both open the same folder of JPEG frames of a generated 640 x 480 video; two objects are
clicked on frame 0 and propagated forward over all 8 frames. Per frame and object: binary
masks (logit > 0) agree on >= 99.9 % of the pixels and object score logits within 1e-3. The
measured figures (with wall time and RSS per stage) go to
``test-artifacts/full_size_sam3_tracker.json``.

Weights (:func:`write_random_checkpoint`): the official tracker's own init with every Linear
(and fused ``in_proj``) redrawn from N(0, 1 / fan_in), so that attention, the memory
attention's included, is peaked rather than uniform, and every tensor perturbed, as
``test_full_size_sam3.py`` draws the image model; the memory embeddings (``no_mem_embed``,
``no_obj_ptr``, ``no_obj_embed_spatial``, ``maskmem_tpos_enc``) of scale 0.5 and the
object-score head's bias at 6 (objects clearly present: both sides take the same presence
decisions), as ``randomise_tracker_`` does at reduced size. The complex ``freqs_cis`` RoPE
tables hold their true values (as in ``sam3.pt``): upstream loads them strictly, our
converter drops them. The detector's other weights (unused here) are random arrays of the
released shapes. With these weights the masks follow the frames' content and the clicks (the
two objects' masks differ), at logits of a few units, so many pixels are close to 0.

Opt-in: ``pytest --runslow tests/models/test_full_size_sam3_tracker.py -s``. About 20 minutes
on 2 cores (each tracker ~8-9 minutes for the 8 frames); peak RSS ~17 GB, all of it
``convert_checkpoint``'s (each tracker's run stays under 5 GB).
"""

from __future__ import annotations

import ast
import ctypes
import gc
import json
import resource
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.video import textured_ground, write_frames

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
HW = (480, 640)
NUM_FRAMES = 8
# one positive click per object on frame 0, relative (x, y): the red square, the blue disc
CLICKS = {1: (0.2, 0.35), 2: (0.7, 0.6)}
OBJ_BIAS = 6.0
MEMORY_EMBEDDINGS = ("no_mem_embed", "no_obj_ptr", "no_obj_embed_spatial", "maskmem_tpos_enc")
VISION = "backbone.vision_backbone."


# ------------------------------------------------------------------------------ video


def scene(num_frames: int = NUM_FRAMES, hw: tuple[int, int] = HW) -> list[np.ndarray]:
    """RGB frames of a generated video: a red square moving right, a blue disc moving down and
    left, a static green bar, on a textured ground with mild noise."""
    h, w = hw
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    ground = textured_ground(h, w)
    frames = []
    for t in range(num_frames):
        img = ground + rng.normal(0, 4, ground.shape)
        x0, y0 = int(0.12 * w) + 24 * t, int(0.25 * h)
        img[y0 : y0 + 100, x0 : x0 + 110] = (220, 35, 30)
        cx, cy = 0.7 * w - 10 * t, 0.6 * h + 8 * t
        img[(yy - cy) ** 2 + (xx - cx) ** 2 <= 60**2] = (35, 45, 215)
        img[int(0.08 * h) : int(0.14 * h), int(0.7 * w) : int(0.92 * w)] = (40, 200, 70)
        frames.append(np.clip(img, 0, 255).astype(np.uint8))
    return frames


# ------------------------------------------------------------------------------ weights


def build_official_tracker() -> Any:
    """The official full-size tracker with its vision backbone (random init), eval mode."""
    import torch
    from sam3 import model_builder

    from tests.helpers.sam3_ref import tracker_cpu_patches

    with tracker_cpu_patches():
        torch.manual_seed(0)
        return model_builder.build_tracker(
            apply_temporal_disambiguation=False, with_backbone=True
        ).eval()


def file_key(official_key: str) -> str:
    """The released checkpoint's name of an official tracker key."""
    if official_key.startswith(VISION):
        return "detector." + official_key
    return "tracker." + official_key


def official_key(released_key: str) -> str | None:
    """The official tracker's name of a released checkpoint key (None: not the tracker's)."""
    if released_key.startswith("tracker."):
        return released_key[len("tracker.") :]
    if released_key.startswith("detector." + VISION):
        return released_key[len("detector.") :]
    return None


def official_state(released: Mapping[str, Any]) -> dict[str, Any]:
    """The official tracker's state dict from a released-layout one: the ``tracker.*`` keys
    without prefix and the detector's vision backbone as ``backbone.vision_backbone.*``."""
    named = ((official_key(key), value) for key, value in released.items())
    return {key: value for key, value in named if key is not None}


def released_layout(official: Any) -> dict[str, tuple[list[int], str]]:
    """``{key: (shape, dtype)}`` of the released checkpoint: the detector as our converter
    describes it (it checks that against the released file's rows) and the official tracker's
    own keys."""
    from paddle_sam.convert import sam3 as convert_sam3

    layout = {k: (list(s), d) for k, (s, d) in convert_sam3.released_layout(None, False).items()}
    for key, value in official.state_dict().items():
        dtype = str(value.dtype).removeprefix("torch.")
        layout[file_key(key)] = (list(value.shape), dtype)
    return layout


def randomise_official_(official: Any, seed: int = 0) -> Any:
    """Random weights that make every part of the official tracker matter (in place): every
    Linear (and fused ``in_proj``) from N(0, 1 / fan_in) so that attention, the memory
    attention's included, is peaked rather than uniform; every tensor perturbed (upstream's
    inits otherwise leave biases at 0 and norms at 1); the memory embeddings of scale 0.5; the
    object-score head's bias at ``OBJ_BIAS``. The complex RoPE tables stay as built."""
    import torch

    from tests.helpers.sam3_ref import fan_in_init_, perturb_module_

    perturb_module_(fan_in_init_(official, seed=seed), seed=seed, scale=0.02)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in MEMORY_EMBEDDINGS:
            getattr(official, name).normal_(0.0, 0.5, generator=gen)
        official.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.fill_(OBJ_BIAS)
    return official.eval()


def write_random_checkpoint(path: Path, official: Any, seed: int = 0) -> dict:
    """Write full-size weights in the released layout (``torch.save({"model": ...})``, every
    ``detector.*`` and ``tracker.*`` key) to ``path``: the official tracker's weights, drawn
    by :func:`randomise_official_`, under their released names, and the detector's other
    weights (unused by the tracker) random (``random_weight``: norms near 1, the rest fan-in
    scaled). Returns the layout written."""
    import torch

    from paddle_sam.convert.core import random_weight

    layout = released_layout(official)
    state = {file_key(k): v for k, v in randomise_official_(official, seed).state_dict().items()}
    rng = np.random.default_rng(seed)
    for key, (shape, dtype) in layout.items():
        if key not in state:
            assert dtype == "float32", key
            state[key] = torch.from_numpy(random_weight(key, tuple(shape), rng))
    torch.save({"model": state}, path)
    return layout


def load_official_weights(official: Any, path: Path) -> None:
    """Strictly load a released-layout file into the official tracker (memory-mapped, so the
    detector's weights are never read)."""
    import torch

    released = torch.load(path, map_location="cpu", mmap=True, weights_only=True)["model"]
    official.load_state_dict(official_state(released), strict=True)
    del released
    gc.collect()


# ------------------------------------------------------------------------------ runs


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system. Importing paddle_sam
    makes glibc keep freed memory for reuse (``paddle_sam._runtime.keep_freed_memory``):
    without a trim the RSS left by each stage (torch model, weights file, converter) would
    stay with the process."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def run_official(official: Any, video_dir: Path) -> list[tuple]:
    """Clicks on frame 0, forward propagation: ``[(frame, obj_ids, mask logits, scores)]``."""
    import torch

    from tests.helpers.sam3_ref import tracker_cpu_patches

    with tracker_cpu_patches(), torch.inference_mode():
        state = official.init_state(
            video_path=str(video_dir), offload_video_to_cpu=True, offload_state_to_cpu=True
        )
        for obj_id, point in CLICKS.items():
            official.add_new_points_or_box(
                state, 0, obj_id, points=torch.tensor([point]), labels=torch.tensor([1])
            )
        return [
            (f, list(ids), masks.numpy().copy(), scores.numpy().copy())
            for f, ids, _, masks, scores in official.propagate_in_video(
                state, 0, None, False, tqdm_disable=True, propagate_preflight=True
            )
        ]


def run_ours(tracker: Any, video_dir: Path) -> list[tuple]:
    import paddle

    with paddle.no_grad():
        state = tracker.init_state(video_path=str(video_dir))
        for obj_id, point in CLICKS.items():
            tracker.add_new_points_or_box(state, 0, obj_id, points=[list(point)], labels=[1])
        return [
            (f, list(ids), masks.numpy(), scores.numpy())
            for f, ids, _, masks, scores in tracker.propagate_in_video(
                state,
                start_frame_idx=0,
                max_frame_num_to_track=None,
                reverse=False,
                propagate_preflight=True,
            )
        ]


def compare(ref: list[tuple], ours: list[tuple]) -> dict:
    assert [r[0] for r in ref] == [o[0] for o in ours] == list(range(NUM_FRAMES))
    per_frame = []
    for (frame, r_ids, r_masks, r_scores), (_, o_ids, o_masks, o_scores) in zip(
        ref, ours, strict=True
    ):
        assert r_ids == o_ids == list(CLICKS), (frame, r_ids, o_ids)
        assert r_masks.shape == o_masks.shape == (len(CLICKS), 1, *HW), o_masks.shape
        for i, obj_id in enumerate(r_ids):
            r, o = r_masks[i, 0], o_masks[i, 0]
            per_frame.append(
                {
                    "frame": frame,
                    "obj_id": obj_id,
                    "mask_agreement": float(((r > 0) == (o > 0)).mean()),
                    "mask_pixels_differing": int(((r > 0) != (o > 0)).sum()),
                    "mask_logits_max_abs": float(np.abs(r - o).max()),
                    "mask_logits_max": float(np.abs(r).max()),
                    "coverage": float((r > 0).mean()),
                    "score": float(r_scores[i, 0]),
                    "score_abs_err": float(abs(r_scores[i, 0] - o_scores[i, 0])),
                }
            )
    first, last = ref[0][2][:, 0] > 0, ref[-1][2][:, 0] > 0
    return {
        # how much the clicks and the frames matter (on the official masks)
        "objects_differ_frame0": float((first[0] != first[1]).mean()),
        "frames_differ_first_last": float((first != last).mean()),
        "mask_agreement_min": min(p["mask_agreement"] for p in per_frame),
        "score_abs_err_max": max(p["score_abs_err"] for p in per_frame),
        "mask_logits_max_abs": max(p["mask_logits_max_abs"] for p in per_frame),
        "coverage_range": [
            min(p["coverage"] for p in per_frame),
            max(p["coverage"] for p in per_frame),
        ],
        "per_frame": per_frame,
    }


@pytest.fixture(scope="module")
def measured(tmp_path_factory, reference_dir):
    from paddle_sam.convert.checkpoint import convert_checkpoint
    from paddle_sam.loading.sam3 import load_sam3_tracker

    pytest.importorskip("torch")
    pytest.importorskip("sam3")
    tmp = tmp_path_factory.mktemp("sam3_tracker_full")
    # JPEG frames: upstream reads MP4 files only through decord
    video_dir = write_frames(scene(), tmp / "video")
    seconds: dict[str, float] = {}
    rss: dict[str, dict[str, float]] = {}

    def mark(stage: str, t0: float) -> None:
        seconds[stage] = round(time.perf_counter() - t0, 2)
        rss[stage] = {"current_mb": round(current_rss_mb()), "peak_mb": round(peak_rss_mb())}
        print(f"  {stage}: {seconds[stage]:.1f} s, RSS {rss[stage]}", flush=True)

    start = t0 = time.perf_counter()
    pt = tmp / "sam3_random.pt"
    layout = write_random_checkpoint(pt, build_official_tracker(), seed=0)
    rows = (reference_dir / "sam3_checkpoint_keys.tsv").read_text().splitlines()[1:]
    released = {
        row.split("\t")[0]: (ast.literal_eval(row.split("\t")[1]), row.split("\t")[2])
        for row in rows
    }
    assert layout == released  # every released key, shape and dtype; nothing else
    release_memory()
    mark("released-layout checkpoint written", t0)

    t0 = time.perf_counter()
    official = build_official_tracker()  # upstream's own init, then the file's weights
    load_official_weights(official, pt)
    release_memory()
    mark("official tracker built and loaded (strict)", t0)
    t0 = time.perf_counter()
    ref_out = run_official(official, video_dir)
    del official
    release_memory()
    mark("official: clicks + propagation", t0)

    t0 = time.perf_counter()
    pdparams = tmp / "sam3_random.pdparams"
    convert_checkpoint(pt, pdparams, progress=False)
    pt.unlink()
    release_memory()
    mark("convert_checkpoint", t0)

    t0 = time.perf_counter()
    ours = load_sam3_tracker(pdparams)
    pdparams.unlink()  # 3.4 GB: pytest keeps its last temporary folders
    release_memory()
    mark("load_sam3_tracker", t0)
    t0 = time.perf_counter()
    our_out = run_ours(ours, video_dir)
    del ours
    release_memory()
    mark("paddle: clicks + propagation", t0)

    figures = compare(ref_out, our_out)
    seconds["total"] = round(time.perf_counter() - start, 1)
    doc = {
        "model": "SAM 3 video tracker with its vision backbone, full size, random weights in "
        "the released layout (1465 keys), converted by convert_checkpoint",
        "video": {"frames": NUM_FRAMES, "height": HW[0], "width": HW[1], "format": "JPEG q95"},
        "clicks_frame0_rel_xy": {str(k): v for k, v in CLICKS.items()},
        "figures": figures,
        "seconds": seconds,
        "rss_mb": rss,
        "peak_rss_mb": round(peak_rss_mb()),
    }
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "full_size_sam3_tracker.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"\nfull-size SAM 3 tracker, {NUM_FRAMES} frames {HW[1]}x{HW[0]}, {len(CLICKS)} objects: "
        f"wall time {seconds['total']:.0f} s, peak RSS {doc['peak_rss_mb']} MB; min mask "
        f"agreement {figures['mask_agreement_min']:.6f}, max score error "
        f"{figures['score_abs_err_max']:.2e}, max mask logit error "
        f"{figures['mask_logits_max_abs']:.2e}, mask coverage "
        f"{figures['coverage_range'][0]:.3f}..{figures['coverage_range'][1]:.3f}; objects "
        f"differ on {figures['objects_differ_frame0']:.2%} of frame 0, frames 0 and "
        f"{NUM_FRAMES - 1} on {figures['frames_differ_first_last']:.2%}"
    )
    for p in figures["per_frame"]:
        print(
            f"  frame {p['frame']} obj {p['obj_id']}: agreement {p['mask_agreement']:.6f} "
            f"({p['mask_pixels_differing']} px), logit err {p['mask_logits_max_abs']:.2e} "
            f"(max |logit| {p['mask_logits_max']:.1f}), coverage {p['coverage']:.3f}, "
            f"score {p['score']:.4f} (err {p['score_abs_err']:.1e})"
        )
    return figures


def test_full_size_tracker_parity(measured):
    for p in measured["per_frame"]:
        assert p["mask_agreement"] >= 0.999, p
        assert p["score_abs_err"] <= 1e-3, p


def test_full_size_tracker_not_degenerate(measured):
    """Agreement on empty, full or prompt-independent masks would prove little."""
    for p in measured["per_frame"]:
        assert 0.01 < p["coverage"] < 0.99, p
    assert measured["objects_differ_frame0"] > 1e-3, measured["objects_differ_frame0"]
    assert measured["frames_differ_first_last"] > 1e-2, measured["frames_differ_first_last"]
