"""Training pipeline: data formats, prompts, losses, a short run, resume, two processes, errors.

Tiny model (64 px input) and tiny generated images, so the whole file takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddle_sam.cli import main
from paddle_sam.train.config import ConfigError
from paddle_sam.train.data import SkipLog
from paddle_sam.train.families import load_config
from paddle_sam.train.sam_v1 import prompts
from paddle_sam.train.sam_v1.data import CocoDataset, MaskFolderDataset, SA1BDataset, open_dataset
from paddle_sam.train.synthetic import synthetic_scene, write_dataset
from tests.helpers.specs import tiny_train_spec
from tests.helpers.train_runs import losses_of, write_yaml

ROOT = Path(__file__).resolve().parents[2]
SIZES = [[96, 72]]


def tiny_config(tmp_path: Path, **sections) -> dict:
    cfg = {
        "model": {"type": "vit_tiny_synthetic", "spec": tiny_train_spec()},
        "data": {
            "train": {"format": "synthetic", "num_images": 4, "seed": 0, "sizes": SIZES},
            "masks_per_image": 3,
            "hflip": False,
        },
        "prompts": {"correction_rounds": 1},
        "optim": {"lr": 3e-3, "warmup_steps": 2, "weight_decay": 0.0, "encoder_lr_scale": 0.5},
        "train": {
            "steps": 4,
            "batch_size": 1,
            "freeze_encoder_steps": 2,
            "unfreeze_last_blocks": 1,
            "log_every": 1,
            "checkpoint_every": 2,
        },
        "run": {"output_dir": str(tmp_path / "run")},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


# -- synthetic data and formats --


def test_synthetic_scene_is_reproducible_and_masks_are_disjoint():
    a, b = synthetic_scene(3, 7), synthetic_scene(3, 7)
    assert np.array_equal(a.image, b.image) and len(a.masks) == len(b.masks) > 0
    assert a.image.shape == (480, 640, 3) and a.image.dtype == np.uint8
    stack = np.stack(a.masks).astype(int)
    assert stack.sum(0).max() == 1  # occlusion: visible parts never overlap
    assert not np.array_equal(a.image, synthetic_scene(3, 8).image)


@pytest.mark.parametrize(
    "fmt,cls", [("coco", CocoDataset), ("sa1b", SA1BDataset), ("folder", MaskFolderDataset)]
)
def test_every_format_reads_back_the_generated_masks(tmp_path, fmt, cls):
    out = write_dataset(tmp_path / fmt, fmt, 2, seed=5, sizes=SIZES)
    ds = open_dataset({"format": fmt, "path": str(out)})
    assert isinstance(ds, cls) and len(ds) == 2
    for i in range(2):
        image, masks = ds.load(i)
        scene = synthetic_scene(5, i, SIZES)
        assert np.array_equal(image, scene.image)
        assert len(masks) == len(scene.masks)
        for m, ref in zip(masks, scene.masks, strict=True):
            assert np.array_equal(m, ref)


def test_write_dataset_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        write_dataset(tmp_path / "x", "folder", 1)


def test_bad_coco_entries_are_skipped_and_counted(tmp_path):
    (tmp_path / "images").mkdir()
    Image.fromarray(np.zeros((40, 50, 3), np.uint8)).save(tmp_path / "images" / "ok.png")
    (tmp_path / "images" / "broken.png").write_bytes(b"\x89PNG not really")
    Image.fromarray(np.zeros((40, 50, 3), np.uint8)).save(tmp_path / "images" / "bare.png")
    square = [[10, 10, 30, 10, 30, 30, 10, 30]]
    doc = {
        "images": [
            {"id": 1, "file_name": "ok.png", "width": 50, "height": 40},
            {"id": 2, "file_name": "broken.png", "width": 50, "height": 40},
            {"id": 3, "file_name": "bare.png", "width": 50, "height": 40},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "segmentation": square, "iscrowd": 0},
            {"id": 2, "image_id": 1, "segmentation": [], "iscrowd": 0},
            {"id": 3, "image_id": 1, "segmentation": [[10, 10, 90, 10, 90, 30]], "iscrowd": 0},
            {"id": 4, "image_id": 2, "segmentation": square, "iscrowd": 0},
        ],
    }
    (tmp_path / "annotations.json").write_text(json.dumps(doc))
    skips = SkipLog()
    with pytest.warns(UserWarning, match="skipped"):
        ds = CocoDataset(tmp_path / "annotations.json", skips=skips)
        assert len(ds) == 2  # bare.png has no annotation
        image, masks = ds.load(0)
        assert ds.load(1) is None  # the broken image
    assert len(masks) == 1 and masks[0].sum() == 20 * 20
    assert skips.counts == {
        "image without annotations": 1,
        "empty annotation": 1,
        "polygon outside the image": 1,
        "unreadable image": 1,
    }
    assert "skipped 4 items" in skips.summary() and "broken.png" in skips.summary()


def test_dataset_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        open_dataset({"format": "folder", "path": str(tmp_path / "nowhere")})
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "images" / "a.png")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="no usable images"):
        MaskFolderDataset(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        CocoDataset(tmp_path / "bad.json", images=tmp_path / "images")


# -- prompts and loss --


def test_prompt_simulation():
    rng = np.random.default_rng(0)
    gt = np.zeros((60, 80), bool)
    gt[10:40, 20:50] = True
    for _ in range(20):
        x, y = prompts.random_point(gt, rng)
        assert gt[int(y), int(x)]
        box = prompts.noisy_box(gt, rng)
        assert 0 <= box[0] < box[2] <= 80 and 0 <= box[1] < box[3] <= 60
        assert np.abs(box - [20, 10, 50, 40]).max() <= 20
    pred = np.zeros_like(gt)  # everything missed: a positive correction inside the object
    x, y, label = prompts.correction_click(pred, gt, rng)
    assert label == 1 and gt[int(y), int(x)]
    pred = np.ones_like(gt)  # everything included: a negative correction outside
    x, y, label = prompts.correction_click(pred, gt, rng)
    assert label == 0 and not gt[int(y), int(x)]
    assert prompts.interior_point(gt) in {(34.0, 24.0), (34.0, 25.0), (35.0, 24.0), (35.0, 25.0)}


def test_loss_picks_the_best_multimask_output():
    import paddle

    from paddle_sam.train.sam_v1.losses import sam_loss

    target = paddle.zeros([1, 3, 8, 8])
    target[:, :, 2:6, 2:6] = 1.0
    good = (target * 2 - 1) * 10  # confident and right
    logits = paddle.concat([-good[:, :1], good[:, 1:2], -good[:, 2:]], axis=1)
    iou_pred = paddle.to_tensor([[0.0, 1.0, 0.0]])
    loss, parts, best = sam_loss(logits, iou_pred, target, paddle.ones([1, 1, 8, 8]))
    assert int(best[0]) == 1
    assert float(parts["iou"]) == 1.0 and float(parts["iou_mse"]) < 1e-6
    assert float(loss) < 1e-3


# -- training runs --


def test_short_run_lowers_the_loss_and_writes_its_outputs(tmp_path):
    cfg = tiny_config(
        tmp_path,
        data={"train": {"format": "synthetic", "num_images": 1, "seed": 0, "sizes": SIZES}},
        train={"steps": 12, "freeze_encoder_steps": 6, "checkpoint_every": 6},
    )
    cfg["data"]["val"] = {"format": "synthetic", "num_images": 2, "seed": 9, "sizes": SIZES}
    cfg["data"]["eval_images"] = 1
    assert main(["train", str(write_yaml(tmp_path / "c.yaml", cfg)), "--quiet"]) == 0
    run = tmp_path / "run"
    losses = losses_of(run)
    assert sorted(losses) == list(range(1, 13))
    first, last = (
        np.mean([losses[i] for i in (1, 2, 3)]),
        np.mean([losses[i] for i in (10, 11, 12)]),
    )
    assert last < 0.8 * first, losses
    for name in ("curves.png", "config.yaml", "model.pdparams", "model.pdparams.json", "eval.json"):
        assert (run / name).is_file(), name
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_0000006",
        "step_0000012",
    ]
    ev = json.loads((run / "eval.json").read_text())
    assert set(ev) >= {"miou_1click", "miou_3click", "miou_box"}
    # the exported model loads like any converted checkpoint
    from paddle_sam.loading.sam_v1 import load_sam

    sam = load_sam(run / "model.pdparams")
    assert sam.spec.image_size == 64
    # a second run into the same folder is refused
    assert main(["train", str(tmp_path / "c.yaml"), "--quiet"]) == 2


def test_stages_freeze_then_unfreeze_the_last_blocks(tmp_path):
    from paddle_sam.train.sam_v1.trainer import Trainer

    cfg = load_config(write_yaml(tmp_path / "c.yaml", tiny_config(tmp_path)))
    t = Trainer(cfg, progress=False)
    enc = t.sam.image_encoder
    before = {n: p.numpy().copy() for n, p in enc.named_parameters()}
    t.train_step()
    t.train_step()  # stage 1: nothing in the encoder moves
    assert all(np.array_equal(p.numpy(), before[n]) for n, p in enc.named_parameters())
    t.train_step()  # stage 2: last block and neck move, the first block does not
    moved = {n for n, p in enc.named_parameters() if not np.array_equal(p.numpy(), before[n])}
    assert any(n.startswith("blocks.1.") for n in moved) and any(
        n.startswith("neck") for n in moved
    )
    assert not any(n.startswith(("blocks.0.", "patch_embed")) for n in moved)
    assert enc.blocks[1].attn.qkv.weight.optimize_attr["learning_rate"] == 0.5


@pytest.mark.parametrize("tied", [False, True])
def test_tied_qk_init_starts_decoder_keys_as_queries(tmp_path, tied):
    from paddle_sam.models.sam_v1.transformer import Attention
    from paddle_sam.train.sam_v1.trainer import Trainer

    model = {"type": "vit_tiny_synthetic", "spec": tiny_train_spec(), "tied_qk_init": tied}
    cfg = load_config(write_yaml(tmp_path / "c.yaml", tiny_config(tmp_path, model=model)))
    t = Trainer(cfg, progress=False)
    attns = [m for _, m in t.sam.mask_decoder.named_sublayers() if isinstance(m, Attention)]
    assert len(attns) == 7  # 2 blocks x 3 + the final token-to-image attention
    same = [np.array_equal(a.k_proj.weight.numpy(), a.q_proj.weight.numpy()) for a in attns]
    assert all(same) if tied else not any(same)
    assert attns[0].k_proj.weight is not attns[0].q_proj.weight  # tied values, not one tensor


def test_resume_continues_exactly(tmp_path):
    from paddle_sam.train.sam_v1.trainer import Trainer

    cfg_a = tiny_config(tmp_path / "a")
    cfg_b = tiny_config(tmp_path / "b")
    assert main(["train", str(write_yaml(tmp_path / "a.yaml", cfg_a)), "--quiet"]) == 0
    uninterrupted = losses_of(tmp_path / "a" / "run")

    # "interrupted": two steps and a checkpoint, then the process is gone
    t = Trainer(load_config(write_yaml(tmp_path / "b.yaml", cfg_b)), progress=False)
    t.train_step()
    t.train_step()
    t.save_checkpoint()
    del t
    assert main(["train", str(tmp_path / "b.yaml"), "--resume", "--quiet"]) == 0
    resumed = losses_of(tmp_path / "b" / "run")
    assert set(resumed) == {3, 4}  # steps 1-2 ran in the interrupted process
    np.testing.assert_allclose(resumed[3], uninterrupted[3], rtol=1e-6)
    np.testing.assert_allclose(resumed[4], uninterrupted[4], rtol=1e-6)


def test_two_processes_agree_on_the_weights(tmp_path):
    cfg = tiny_config(tmp_path, train={"steps": 3, "freeze_encoder_steps": 1})
    path = write_yaml(tmp_path / "c.yaml", cfg)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "paddle_sam", "train", str(path), "--nproc", "2", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    run = tmp_path / "run"
    logs = "".join(p.read_text() for p in sorted((run / "launch_logs").glob("workerlog.*")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs[-3000:]
    ranks = json.loads((run / "ranks.json").read_text())
    assert ranks["world_size"] == 2 and ranks["agree"]
    assert len(set(ranks["weights_sha256"])) == 1
    meta = json.loads((run / "model.pdparams.json").read_text())
    assert meta["training"]["world_size"] == 2 and meta["training"]["steps"] == 3


# -- configs --


@pytest.mark.parametrize(
    "change,overrides,error",
    [
        (lambda c: c["train"].update(stepz=3), [], "unknown key train.stepz"),
        (lambda c: c.update(extra={}), [], "unknown key extra"),
        (lambda c: c["train"].update(steps="many"), [], "train.steps: expected an integer"),
        (lambda c: c["optim"].update(lr=[1]), [], "optim.lr: expected a number"),
        (lambda c: None, ["train.amp=maybe"], "train.amp: expected true or false"),
        (lambda c: None, ["model.type=vit_q"], "model.type = 'vit_q'"),
        (lambda c: None, ["train.steps=0"], "train.steps = 0: must be > 0"),
        (lambda c: None, ["optim.decay=step"], "optim.decay"),
        (lambda c: None, ["nonsense"], "--set needs KEY=VALUE"),
    ],
)
def test_bad_configs_give_clear_errors(tmp_path, change, overrides, error):
    cfg = tiny_config(tmp_path)
    change(cfg)
    path = write_yaml(tmp_path / "bad.yaml", cfg)
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(".", r"\.")) as exc:
        load_config(path, overrides)
    if not overrides or "=" in overrides[0]:
        assert str(path) in str(exc.value)


def test_missing_files_in_configs(tmp_path, capsys):
    assert main(["train", str(tmp_path / "none.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    cfg = tiny_config(tmp_path)
    cfg["data"]["train"] = {"format": "coco", "path": str(tmp_path / "missing.json")}
    assert main(["train", str(write_yaml(tmp_path / "c.yaml", cfg))]) == 2
    assert "data.train.path not found" in capsys.readouterr().err
    cfg = tiny_config(tmp_path, model={"checkpoint": str(tmp_path / "w.pdparams")})
    assert main(["train", str(write_yaml(tmp_path / "c.yaml", cfg))]) == 2
    assert "model.checkpoint file not found" in capsys.readouterr().err


def test_amp_is_off_on_cpu_with_a_warning(tmp_path):
    from paddle_sam.train.sam_v1.trainer import Trainer

    cfg = load_config(write_yaml(tmp_path / "c.yaml", tiny_config(tmp_path)), ["train.amp=true"])
    with pytest.warns(UserWarning, match="mixed precision is off on CPU"):
        t = Trainer(cfg, progress=False)
    assert t.amp is False


def test_shipped_configs_load(tmp_path):
    from paddle_sam.train.synthetic import write_concept_dataset

    concepts = write_concept_dataset(tmp_path / "concepts", 1, sizes=[[64, 64]])
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        overrides = []
        if "vit_b" in path.name:  # needs the user's converted weights and data
            continue
        if path.name == "sam3_finetune.yaml":  # the user's sam3.pt and data: stand-ins
            overrides = ["model.checkpoint=null"] + [
                f"data.{s}.path={concepts / 'annotations.json'}" for s in ("train", "val")
            ]
        if "_stage" in path.name:  # continues the previous stage's run output: the bundled
            # model of its family will do
            sam3 = path.name.startswith("sam3_")
            stand_in = "sam3_tiny_concepts" if sam3 else "sam_tiny_synthetic"
            overrides = [f"model.checkpoint={ROOT / 'paddle_sam/assets' / stand_in}.pdparams"]
        cfg = load_config(path, overrides)
        assert cfg.train.steps > 0
