"""``paddle-sam train`` / ``eval`` for SAM 3 (``family: sam3`` configs) at the tiny test sizes:
a whole run (metrics, curves, an exported model the predictors load), exact resume, two
data-parallel processes equal to one with the doubled batch, LoRA exported as plain weights,
the layer-wise learning rates against upstream's own modifier, the evaluation's AP, and config
errors."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_sam.cli import main
from paddle_sam.train.config import ConfigError
from paddle_sam.train.families import load_config
from paddle_sam.train.sam3.trainer import Sam3Trainer
from tests.helpers.specs import tiny_sam3_spec
from tests.helpers.train_runs import losses_of, write_yaml

ROOT = Path(__file__).resolve().parents[2]


def tiny_config(out: Path, **sections) -> dict:
    cfg = {
        "family": "sam3",
        "model": {"spec": json.loads(json.dumps(tiny_sam3_spec().to_dict()))},
        "data": {
            "train": {"format": "concepts", "path": str(out / "train"), "num_images": 4, "seed": 1},
            "val": {"format": "concepts", "path": str(out / "val"), "num_images": 2, "seed": 2},
            "max_negatives": 2,
            "eval_images": 2,
        },
        "optim": {"lr": 1e-3, "warmup_steps": 1, "timescale": 2, "cooldown_steps": 1},
        "train": {"steps": 4, "log_every": 1, "checkpoint_every": 2, "seed": 3},
        "run": {"output_dir": str(out / "run")},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def metrics_of(run: Path) -> dict[int, dict[str, float]]:
    with open(run / "metrics.csv", newline="") as f:
        return {
            int(r["step"]): {k: float(v) for k, v in r.items() if v not in ("", None)}
            for r in csv.DictReader(f)
        }


def weights(path: Path) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in paddle.load(str(path)).items()}


def test_train_run_and_eval(tmp_path, capsys):
    """A whole run: metrics and curves, a model the SAM 3 predictor loads (the released keys:
    frozen backbone and text encoder unchanged), held-out AP in eval.json; then one eval command
    on held-out concept scenes. With the semantic-map loss (logged as its own terms), denoising
    queries (their terms logged too) and half the positive queries turned into exemplar-box
    prompts."""
    cfg = tiny_config(
        tmp_path, loss={"semantic_seg": True, "denoise": 1.0}, data={"exemplar_prob": 0.5}
    )
    path = write_yaml(tmp_path / "a.yaml", cfg)
    assert main(["train", str(path), "--quiet"]) == 0
    run = tmp_path / "run"
    assert sorted(losses_of(run)) == [1, 2, 3, 4]
    assert all(np.isfinite(v) for v in losses_of(run).values())
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[0]["queries"]) > 0 and float(rows[0]["targets"]) > 0
    from paddle_sam.train.sam3.data import ConceptDataset

    ds = ConceptDataset(tmp_path / "train", resolution=112, train=False)
    assert {len(ds[q].boxes) == 0 for q in range(len(ds))} == {True, False}  # some negatives
    assert float(rows[0]["loss_semantic_dice"]) > 0
    assert all(np.isfinite(float(rows[0][k])) for k in ("loss_giou_dn", "loss_dice_dn"))
    assert rows[-1]["mask_AP50"] != ""
    assert (run / "curves.png").is_file()
    ev = json.loads((run / "eval.json").read_text())
    assert 0.0 <= ev["mask_AP50"] <= 1.0 and "per_concept" in ev
    meta = json.loads((run / "model.pdparams.json").read_text())
    assert meta["format"] == "paddle-sam/sam3" and meta["training"]["steps"] == 4
    assert meta["training"]["recipe"] == f"{path} (4 steps)"

    from paddle_sam.loading.sam3 import build_sam3_image_model, load_sam3_predictor
    from paddle_sam.models.sam3.build_sam3 import Sam3Spec

    trained = weights(run / "model.pdparams")
    paddle.seed(cfg["train"]["seed"])
    init = build_sam3_image_model(spec=Sam3Spec.from_dict(cfg["model"]["spec"]))
    init_state = {k: v.numpy() for k, v in init.state_dict().items()}
    assert set(trained) == set(init_state)
    for k, v in trained.items():
        if k.startswith(("backbone.vision_backbone.", "backbone.language_backbone.")):
            assert np.array_equal(v, init_state[k]), k  # frozen
    assert any(
        not np.array_equal(v, init_state[k]) for k, v in trained.items() if "transformer." in k
    )
    pred = load_sam3_predictor(run / "model.pdparams", confidence_threshold=0.0)
    from paddle_sam.train.synthetic import concept_scene

    pred.set_image(concept_scene(9, 0, [[112, 112]]).image)
    assert len(pred.ground("red star").masks) > 0

    capsys.readouterr()
    out_json = tmp_path / "eval.json"
    args = ["eval", "--model-type", "sam3", "--checkpoint", str(run / "model.pdparams")]
    args += ["--format", "concepts", "--num-images", "2", "--seed", "7", "--json", str(out_json)]
    assert main([*args, "--quiet"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out_json.read_text())
    assert result["images"] == 2 and result["concepts"] == 30
    assert f"mask AP50 {result['mask']['AP50']:.4f}" in printed
    assert result["data"] == {"format": "concepts", "num_images": 2, "seed": 7, "styles": ["flat"]}


def test_resume_continues_exactly(tmp_path):
    """Stopped after a checkpoint at step 2 and resumed: steps 3 and 4 (dropout on, seeded
    per step) equal the uninterrupted run's."""

    a = write_yaml(tmp_path / "a.yaml", tiny_config(tmp_path / "a", data={"val": None}))
    assert main(["train", str(a), "--quiet"]) == 0
    uninterrupted = losses_of(tmp_path / "a" / "run")
    b = write_yaml(tmp_path / "b.yaml", tiny_config(tmp_path / "b", data={"val": None}))
    t = Sam3Trainer(load_config(b), progress=False)
    t.train_step()
    t.train_step()
    t.save_checkpoint()
    del t
    assert main(["train", str(b), "--resume", "--quiet"]) == 0
    resumed = losses_of(tmp_path / "b" / "run")
    np.testing.assert_allclose(resumed[3], uninterrupted[3], rtol=1e-6)
    np.testing.assert_allclose(resumed[4], uninterrupted[4], rtol=1e-6)
    wa = weights(tmp_path / "a" / "run" / "model.pdparams")
    wb = weights(tmp_path / "b" / "run" / "model.pdparams")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_two_processes_equal_one_with_the_doubled_batch(tmp_path):
    """Two data-parallel processes of one image each take the same optimizer steps as one
    process of two images (dropout off and no sqrt(batch) loss scaling, which differ by
    design between the two; as upstream, each process averages its classification loss
    over its own queries, so the processes get equally many)."""
    same = {"dropout": False}
    loss = {"scale_by_batch_size": False}

    def cfg(out: Path, batch: int) -> dict:
        # every concept asked on every image (no cap on negatives): the same number of
        # queries per process, as the classification loss is a mean over each process's
        c = tiny_config(out, model=same, loss=loss, data={"val": None, "max_negatives": None})
        c["train"].update(steps=2, batch_size=batch, checkpoint_every=2)
        c["data"]["train"]["path"] = str(tmp_path / "shared_train")
        return c

    one = write_yaml(tmp_path / "one.yaml", cfg(tmp_path / "one", 2))
    assert main(["train", str(one), "--quiet"]) == 0
    # its own copy of the same scenes (a pure function of the seed), which the launching
    # process writes before it starts the two (waiting at a barrier while one of them wrote
    # thousands of scenes timed out)
    c2 = cfg(tmp_path / "two", 1)
    c2["data"]["train"]["path"] = str(tmp_path / "shared_train_2")
    two = write_yaml(tmp_path / "two.yaml", c2)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "paddle_sam", "train", str(two), "--nproc", "2", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    run = tmp_path / "two" / "run"
    logs = "".join(p.read_text() for p in sorted((run / "launch_logs").glob("workerlog.*")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs[-3000:]
    assert f"wrote the generated data {tmp_path / 'shared_train_2'} before" in proc.stdout
    assert json.loads((run / "ranks.json").read_text())["agree"]
    w1 = weights(tmp_path / "one" / "run" / "model.pdparams")
    w2 = weights(run / "model.pdparams")
    m1, m2 = metrics_of(tmp_path / "one" / "run"), metrics_of(run)
    for step in (1, 2):  # the averaged gradient: its norm, and the loss it came from
        for key in ("loss", "grad_norm", "loss_ce", "presence_loss", "loss_bbox", "loss_dice"):
            np.testing.assert_allclose(m2[step][key], m1[step][key], rtol=1e-4, err_msg=key)
        assert m2[step]["queries"] * 2 == m1[step]["queries"]  # logged per process
    # Adam turns any gradient into a step of about lr: elements whose gradient is rounding
    # noise (exactly 0 in theory) move by +-lr either way; every other element agrees
    close = np.concatenate(
        [np.isclose(w2[k], v, rtol=1e-4, atol=1e-6).ravel() for k, v in w1.items()]
    )
    assert close.mean() > 0.99, close.mean()


def test_generated_data_is_written_once_before_the_processes(tmp_path):
    """What ``--nproc N`` writes before starting its processes: the run's concept scenes that
    are not on disk yet (train and val), and nothing the second time."""
    cfg = load_config(write_yaml(tmp_path / "c.yaml", tiny_config(tmp_path / "c")))
    written = Sam3Trainer.prepare_data(cfg)
    assert written == [tmp_path / "c" / "train", tmp_path / "c" / "val"]
    assert len(list((tmp_path / "c" / "train" / "images").glob("*.png"))) == 4
    assert len(json.loads((tmp_path / "c" / "val" / "annotations.json").read_text())["images"]) == 2
    assert Sam3Trainer.prepare_data(cfg) == []


def test_train_from_a_checkpoint(tmp_path):
    """A run starting from an exported model (named by its run: the sidecar's model_type is
    not "sam3"): its sizes come from the sidecar and its weights are the exported ones."""
    first = tiny_config(tmp_path / "a", data={"val": None})
    first["train"].update(steps=1, checkpoint_every=1)
    first["run"]["model_name"] = "my_concepts"
    assert main(["train", str(write_yaml(tmp_path / "a.yaml", first)), "--quiet"]) == 0
    model = tmp_path / "a" / "run" / "model.pdparams"
    from paddle_sam.convert.checkpoint import detect_family
    from paddle_sam.loading.sam_v1 import load_sam

    assert detect_family(model) == "sam3"  # what the commands pick the family by
    with pytest.raises(ValueError, match="is a SAM 3 model"):
        load_sam(model)
    second = tiny_config(tmp_path / "b", data={"val": None})
    second["model"] = {"checkpoint": str(model)}
    second["train"].update(steps=1, checkpoint_every=1)
    assert main(["train", str(write_yaml(tmp_path / "b.yaml", second)), "--quiet"]) == 0
    model_b = tmp_path / "b" / "run" / "model.pdparams"
    record = json.loads(model_b.with_name("model.pdparams.json").read_text())["training"]
    stages = [f"{tmp_path / 'a.yaml'} (1 steps)", f"{tmp_path / 'b.yaml'} (1 steps)"]
    assert record["recipe"] == stages and record["steps"] == 1 and record["total_steps"] == 2

    t = Sam3Trainer(load_config(tmp_path / "b.yaml"), progress=False, overwrite=True)
    assert t.spec == tiny_sam3_spec()
    loaded = {k: v.numpy() for k, v in t.model.state_dict().items()}
    assert all(np.array_equal(loaded[k], v) for k, v in weights(model).items())


def test_next_stage_at_another_resolution(tmp_path):
    """model.spec on top of a checkpoint's sizes: the sizes that keep its weights' shapes
    (image_size) change, the rest is refused; the stages chain in the sidecar's record."""
    from paddle_sam.models.sam3.build_sam3 import Sam3Spec

    first = tiny_config(tmp_path / "a", data={"val": None})
    first["train"].update(steps=1, checkpoint_every=1)
    assert main(["train", str(write_yaml(tmp_path / "a.yaml", first)), "--quiet"]) == 0
    model = tmp_path / "a" / "run" / "model.pdparams"
    second = tiny_config(tmp_path / "b")
    second["model"] = {"checkpoint": str(model), "spec": {"image_size": 168}}
    second["train"].update(steps=1, checkpoint_every=1)
    path = write_yaml(tmp_path / "b.yaml", second)
    assert main(["train", str(path), "--quiet"]) == 0
    meta = json.loads((tmp_path / "b" / "run" / "model.pdparams.json").read_text())
    bigger = Sam3Spec.from_dict({**tiny_sam3_spec().to_dict(), "image_size": 168})
    assert Sam3Spec.from_dict(meta["spec"]) == bigger
    assert meta["training"]["recipe"] == [f"{tmp_path / 'a.yaml'} (1 steps)", f"{path} (1 steps)"]
    assert meta["training"]["total_steps"] == 2
    from paddle_sam.loading.sam3 import sam3_spec

    trained = tmp_path / "b" / "run" / "model.pdparams"
    assert sam3_spec(trained, enable_inst_interactivity=False) == bigger  # checked on the weights
    for change, why in (({"d_model": 48}, "changes the shapes"), ({"image_size": 170}, "")):
        second["model"]["spec"] = change
        with pytest.raises(ConfigError, match=rf"model\.spec = .*{why}"):
            load_config(write_yaml(tmp_path / "c.yaml", second))


def test_lora_run_exports_plain_weights(tmp_path):
    """With LoRA only the adapters train; the exported model has exactly the model's keys,
    and differs from the initial weights only in layers the adapters were on."""
    cfg = tiny_config(tmp_path, model={"lora_rank": 4, "freeze": []}, data={"val": None})
    cfg["train"]["steps"] = 2
    assert main(["train", str(write_yaml(tmp_path / "l.yaml", cfg)), "--quiet"]) == 0
    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.models.sam3.build_sam3 import Sam3Spec
    from paddle_sam.train.sam3.lora import DEFAULT_LORA_TARGETS, _matches

    trained = weights(tmp_path / "run" / "model.pdparams")
    paddle.seed(cfg["train"]["seed"])
    init = build_sam3_image_model(spec=Sam3Spec.from_dict(cfg["model"]["spec"]))
    init_state = {k: v.numpy() for k, v in init.state_dict().items()}
    assert set(trained) == set(init_state)
    changed = [k for k in trained if not np.array_equal(trained[k], init_state[k])]
    assert changed
    for k in changed:
        assert k.endswith(".weight") and _matches(k[: -len(".weight")], DEFAULT_LORA_TARGETS), k


def test_layer_decay_matches_upstream(monkeypatch):
    """Each vision-trunk parameter's learning-rate multiplier equals what upstream's
    layer_decay_param_modifier gives it (its own get_layer_id rules, on our parameter names)."""
    import types

    pytest.importorskip("sam3")
    # upstream's optimizer module imports hydra and omegaconf (its training launcher's), which
    # the modifier does not use: stand-ins while it is imported
    for name in ("hydra", "omegaconf"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.DictConfig = dict
            monkeypatch.setitem(sys.modules, name, stub)
    from sam3.model.vitdet import ViT
    from sam3.train.optim.optimizer import layer_decay_param_modifier

    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.train.sam3.config import Sam3OptimConfig
    from paddle_sam.train.sam3.trainer import lr_scales

    spec = tiny_sam3_spec()
    model = build_sam3_image_model(spec=spec)
    oc = Sam3OptimConfig()
    ours = lr_scales(model, oc)
    names = [n for n, _ in model.named_parameters()]
    trunk = model.backbone.vision_backbone.trunk

    class Probe:  # upstream's modifier reads get_num_layers / get_layer_id from the part
        def get_num_layers(self):
            return len(trunk.blocks)

        def get_layer_id(self, name):
            return ViT.get_layer_id(self, name)

    class Root:
        backbone = type("B", (), {"vision_backbone": type("V", (), {"trunk": Probe()})()})()

    group = [{"option": "lr", "scheduler": None, "parameter_names": set(names)}]
    out = layer_decay_param_modifier(
        [group],
        Root(),
        oc.layer_decay,
        apply_to="backbone.vision_backbone.trunk",
        overrides=[{"pattern": "*pos_embed*", "value": 1.0}],
    )
    theirs = {n: g["scheduler"].mult_val for g in out[0] for n in g["parameter_names"]}
    for n in names:
        expected = theirs[n]
        if n.startswith("backbone.vision_backbone."):
            expected *= oc.vision_lr_scale
        elif n.startswith("backbone.language_backbone."):
            expected *= oc.text_lr_scale
        assert ours[n] == pytest.approx(expected, rel=1e-12), n


def test_conv_stem_decays_with_the_patch_embedding():
    """The convolutional stem (not in upstream) sits before the patch projection: layer id 0,
    the most decayed learning rate, as the patch embedding's."""
    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.models.sam3.build_sam3 import Sam3Spec
    from paddle_sam.train.sam3.config import Sam3OptimConfig
    from paddle_sam.train.sam3.trainer import lr_scales

    spec = Sam3Spec.from_dict(tiny_sam3_spec().to_dict() | {"conv_stem": [[8, 2]]})
    scales = lr_scales(
        build_sam3_image_model(spec=spec), Sam3OptimConfig(layer_decay=0.5, vision_lr_scale=1.0)
    )
    patch = scales["backbone.vision_backbone.trunk.patch_embed.proj.weight"]
    stem = [v for k, v in scales.items() if ".trunk.stem." in k]
    assert len(stem) == 5 and set(stem) == {patch}  # conv, norm weight and bias, statistics
    assert patch == pytest.approx(0.5 ** (spec.encoder_depth + 1))


def test_evaluate_concepts_ap(tmp_path):
    """AP of a predictor that answers every concept with its true instances is 1, of one that
    answers with another concept's instances 0, both through pycocotools."""
    from paddle_sam.predict.sam3.predictor import Instances
    from paddle_sam.train.sam3.evaluate import evaluate_concepts, instance_recall
    from paddle_sam.train.synthetic import concept_scene, write_concept_dataset

    write_concept_dataset(tmp_path, 3, seed=4, sizes=[[96, 80]])
    scenes = [concept_scene(4, i, [[96, 80]]) for i in range(3)]

    class Oracle:
        def __init__(self, shift: bool = False) -> None:
            self.shift, self.i = shift, -1

        def set_image(self, image):
            self.i = next(j for j, s in enumerate(scenes) if np.array_equal(s.image, image))

        def ground(self, text):
            s = scenes[self.i]
            if self.shift:  # the instances of another phrase
                text = "circle" if text != "circle" else "star"
            ms = [m for j, m in enumerate(s.masks) if text in s.phrases(j)]
            boxes = []
            for m in ms:
                ys, xs = np.nonzero(m)
                boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            n = len(ms)
            return Instances(
                np.asarray(ms, bool).reshape(n, 80, 96),
                np.linspace(0.9, 0.8, n),
                np.asarray(boxes, np.float32).reshape(n, 4),
                np.zeros((n, 1, 1), np.float32),
            )

    good = evaluate_concepts(Oracle(), tmp_path / "annotations.json")
    assert good["mask"]["AP50"] == pytest.approx(1.0) and good["box"]["AP50"] == pytest.approx(1.0)
    # a concept without ground truth in these images is not applicable (COCO's -1), not 0
    per = good["per_concept"]
    absent = [k for k, v in per.items() if v["instances"] == 0]
    assert absent and len(absent) < len(per)
    for v in per.values():
        assert (v["mask_AP50"] is None) == (v["instances"] == 0)
        assert v["mask_AP50"] is None or v["mask_AP50"] == pytest.approx(1.0)
    bad = evaluate_concepts(Oracle(shift=True), tmp_path / "annotations.json")
    assert bad["mask"]["AP50"] < 0.2
    assert all(
        (v["box_AP50"] is None) == (v["instances"] == 0) for v in bad["per_concept"].values()
    )
    r = instance_recall(scenes[0].masks, scenes[0].masks)
    assert r["recall"] == 1.0 and r["found"] == len(scenes[0].masks)
    assert instance_recall([], scenes[0].masks)["found"] == 0


@pytest.mark.parametrize(
    "change,error",
    [
        (lambda c: c["model"].update(freeze=["decoder"]), "model.freeze"),
        (lambda c: c["model"]["spec"].update(d_modle=3), "model.spec"),
        (lambda c: c.update(family="sam4"), "family"),
        (lambda c: c["optim"].update(decay="step"), "optim.decay"),
        (lambda c: c["data"]["train"].update(format="voc"), "data.train.format"),
        (lambda c: c["train"].update(stepz=1), "unknown key train.stepz"),
        (lambda c: c["data"].update(exemplar_prob=1.5), "data.exemplar_prob"),
        (
            lambda c: c["model"].update(
                spec={}, checkpoint=str(ROOT / "paddle_sam/assets/example.png"), box_prior_init=True
            ),
            "model.box_prior_init",
        ),
        (
            lambda c: (
                c.setdefault("loss", {}).update(semantic_seg=True),
                c["data"].update(with_masks=False),
            ),
            "loss.semantic_seg",
        ),
        (lambda c: c.setdefault("loss", {}).update(denoise=-0.5), "loss.denoise"),
        (lambda c: c.setdefault("loss", {}).update(denoise_box_noise=0), "loss.denoise_box_noise"),
        (lambda c: c.setdefault("loss", {}).update(pad_n_queries=0), "loss.pad_n_queries"),
    ],
)
def test_config_errors(tmp_path, change, error):
    cfg = tiny_config(tmp_path)
    change(cfg)
    with pytest.raises(ConfigError, match=error.replace(".", r"\.")):
        load_config(write_yaml(tmp_path / "c.yaml", cfg))


def test_box_prior_init():
    """Reference boxes on a grid, and a decoder attention bias that is 0 inside each query's
    reference box and negative outside it, falling with the distance, for every head."""
    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.train.sam3.init import box_prior_init, grid_boxes

    model = build_sam3_image_model(spec=tiny_sam3_spec())
    box_prior_init(model)
    dec = model.transformer.decoder
    q = dec.reference_points.weight.shape[0]
    ref = dec.reference_points.weight.sigmoid()
    np.testing.assert_allclose(ref.numpy(), grid_boxes(q), atol=1e-6)
    assert len({tuple(b) for b in grid_boxes(q)[:, :2].round(4)}) == q  # distinct centres
    h = w = 12
    bias = dec._get_rpb_matrix(ref.unsqueeze(1), h, w).numpy()[0]  # heads x Q x HW
    ys, xs = np.mgrid[0:h, 0:w]
    for k, (cx, cy, bw, bh) in enumerate(grid_boxes(q)):
        inside = (
            (xs / w >= cx - bw / 2)
            & (xs / w <= cx + bw / 2)
            & (ys / h >= cy - bh / 2)
            & (ys / h <= cy + bh / 2)
        ).ravel()
        assert inside.any() and not inside.all()
        np.testing.assert_allclose(bias[:, k, inside], 0.0, atol=1e-6)
        assert (bias[:, k, ~inside] < 0.0).all()
        far = np.hypot(xs / w - cx, ys / h - cy).ravel()
        out = ~inside
        assert bias[0, k, out][far[out].argmax()] == bias[0, k, out].min()


def test_backbone_init(tmp_path):
    """model.backbone_init sets the vision backbone, and only it, from a file's
    backbone.vision_backbone.* tensors; a missing file, missing keys or other sizes are errors
    naming the file."""
    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.models.sam3.build_sam3 import Sam3Spec
    from paddle_sam.train.sam3.init import VISION_PREFIX, load_vision_backbone

    spec = tiny_sam3_spec()
    paddle.seed(1)
    source = build_sam3_image_model(spec=spec)
    path = tmp_path / "bb.pdparams"
    paddle.save(
        {k: v for k, v in source.state_dict().items() if k.startswith(VISION_PREFIX)}, str(path)
    )
    paddle.seed(2)
    model = build_sam3_image_model(spec=spec)
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    n = load_vision_backbone(model, str(path))
    after = {k: v.numpy() for k, v in model.state_dict().items()}
    src = {k: v.numpy() for k, v in source.state_dict().items()}
    assert n == sum(k.startswith(VISION_PREFIX) for k in after) > 10
    for k, v in after.items():
        expected = src[k] if k.startswith(VISION_PREFIX) else before[k]
        np.testing.assert_array_equal(v, expected, err_msg=k)
    assert any(not np.array_equal(src[k], before[k]) for k in after if k.startswith(VISION_PREFIX))

    with pytest.raises(FileNotFoundError, match="nope.pdparams"):
        load_vision_backbone(model, str(tmp_path / "nope.pdparams"))
    partial = tmp_path / "partial.pdparams"
    paddle.save({k: v for k, v in source.state_dict().items() if "neck" in k}, str(partial))
    with pytest.raises(ValueError, match="partial.pdparams lacks"):
        load_vision_backbone(model, str(partial))
    wide = Sam3Spec.from_dict({**spec.to_dict(), "encoder_embed_dim": 2 * spec.encoder_embed_dim})
    other = build_sam3_image_model(spec=wide)
    paddle.save(
        {k: v for k, v in other.state_dict().items() if k.startswith(VISION_PREFIX)}, str(path)
    )
    with pytest.raises(ValueError, match="another model size"):
        load_vision_backbone(model, str(path))


def test_two_processes_agree_on_batch_norm_statistics(tmp_path):
    """A ``conv_stem`` (batch norm) trained by two processes: each updates the running
    statistics from its own images, so they are averaged every step; without that the ranks
    ended with different models (16 running-statistic tensors differed after 600 steps)."""
    cfg = tiny_config(tmp_path, data={"val": None}, train={"steps": 2, "checkpoint_every": 2})
    cfg["model"]["spec"] = tiny_sam3_spec().to_dict() | {"conv_stem": [[8, 2], [16, 1]]}
    cfg["model"]["freeze"] = ["text_encoder"]
    path = write_yaml(tmp_path / "a.yaml", cfg)
    proc = subprocess.run(
        [sys.executable, "-m", "paddle_sam", "train", str(path), "--nproc", "2", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    run = tmp_path / "run"
    logs = "".join(p.read_text() for p in sorted((run / "launch_logs").glob("workerlog.*")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs[-3000:]
    ranks = json.loads((run / "ranks.json").read_text())
    assert ranks["agree"] and ranks["tensors_that_differ"] == []
    trained = weights(run / "model.pdparams")
    means = [k for k in trained if ".trunk.stem." in k and k.endswith("_mean")]
    assert len(means) == 2
    assert all(np.abs(trained[k]).max() > 0 for k in means)  # they followed the batches


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen", "trained"])
def test_conv_stem_batch_norm_follows_the_freezing(tmp_path, frozen):
    """A vision backbone with a ``conv_stem`` (batch norm): frozen, its running statistics stay
    as loaded (the frozen weights were trained with them), though the rest of the model trains;
    trained, they follow the batches."""
    from paddle_sam.loading.sam3 import build_sam3_image_model
    from paddle_sam.models.sam3.build_sam3 import Sam3Spec

    spec = tiny_sam3_spec().to_dict() | {"conv_stem": [[8, 2], [16, 1]]}
    cfg = tiny_config(tmp_path, train={"steps": 2, "checkpoint_every": 2, "seed": 3})
    cfg["model"]["spec"] = spec
    cfg["model"]["freeze"] = ["vision_backbone", "text_encoder"] if frozen else ["text_encoder"]
    assert main(["train", str(write_yaml(tmp_path / "a.yaml", cfg)), "--quiet"]) == 0
    trained = weights(tmp_path / "run" / "model.pdparams")
    paddle.seed(3)
    init = build_sam3_image_model(spec=Sam3Spec.from_dict(spec)).state_dict()
    stats = [k for k in trained if ".trunk.stem." in k and k.endswith(("_mean", "_variance"))]
    assert len(stats) == 4
    same = [np.array_equal(trained[k], init[k].numpy()) for k in stats]
    assert same == [frozen] * 4
    assert not np.array_equal(
        trained["transformer.decoder.query_embed.weight"],
        init["transformer.decoder.query_embed.weight"].numpy(),
    )
