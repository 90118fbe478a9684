"""Dense pretraining of a small SAM 3's vision backbone (paddle_sam.train.sam3.pretrain): the
label maps, a short run that changes the backbone only, and its file loaded by
model.backbone_init."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
import yaml

from paddle_sam.loading.sam3 import build_sam3_image_model
from paddle_sam.train.sam3.init import VISION_PREFIX, load_vision_backbone
from paddle_sam.train.sam3.pretrain import (
    COLOURS,
    SHAPES,
    dense_labels,
    instance_cells,
    main,
    pretrain_vision_backbone,
)
from paddle_sam.train.synthetic import concept_scene
from tests.helpers.specs import tiny_sam3_spec


def test_dense_labels_follow_the_masks():
    scene = concept_scene(3, 0, [[96, 96]])
    shape, colour = dense_labels(scene, 96)
    assert shape.shape == colour.shape == (96, 96)
    assert ((shape > 0) == (colour > 0)).all()
    for mask, kind, name in zip(scene.masks, scene.kinds, scene.colours, strict=True):
        assert (shape[mask] == SHAPES.index(kind) + 1).all()
        assert (colour[mask] == COLOURS.index(name) + 1).all()
    union = np.any(scene.masks, axis=0)
    assert (shape[~union] == 0).all() and union.any()
    small, _ = dense_labels(scene, 24)  # every 4th pixel, at the cells' centres
    np.testing.assert_array_equal(small, shape[2::4, 2::4])


def test_instance_cells_follow_the_masks():
    scene = concept_scene(3, 0, [[96, 96]])
    cells, kinds = instance_cells(scene, 96)
    assert cells.shape == (len(scene.masks), 96 * 96) and cells.dtype == np.float32
    for row, kind, mask, name in zip(cells, kinds, scene.masks, scene.kinds, strict=True):
        np.testing.assert_array_equal(row.reshape(96, 96) > 0, mask)
        assert kind == SHAPES.index(name)
    # on a coarse grid: each instance at the cells' centres, as dense_labels samples them;
    # an instance no centre falls on is left out, not kept as an empty mask
    cells, kinds = instance_cells(scene, 6)
    shape, _ = dense_labels(scene, 6)
    assert cells.shape[1] == 36 and (cells.sum(1) > 0).all()
    hit = [m[8::16, 8::16] for m in scene.masks]
    assert len(kinds) == sum(bool(h.any()) for h in hit)
    kept = [h for h in hit if h.any()]
    for row, kind, h in zip(cells, kinds, kept, strict=True):
        np.testing.assert_array_equal(row.reshape(6, 6) > 0, h)
        assert (shape[h] == kind + 1).all()  # the label map says the same


def test_instance_loss_trains_its_head_and_reports_it():
    model = build_sam3_image_model(spec=tiny_sam3_spec())
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    logged = []
    metrics = pretrain_vision_backbone(
        model, 2, batch_size=2, instance_loss=True, held_out_scenes=3, log=logged.append
    )
    assert 0.0 <= metrics["instance_acc"] <= 1.0 and "per instance" in logged[-1]
    changed = {k for k, v in model.state_dict().items() if not np.array_equal(v.numpy(), before[k])}
    assert changed and all(k.startswith(VISION_PREFIX) for k in changed)
    plain = pretrain_vision_backbone(
        build_sam3_image_model(spec=tiny_sam3_spec()), 1, batch_size=1, log=logged.append
    )
    assert "instance_acc" not in plain and "per instance" not in logged[-1]


def test_pretrain_command(tmp_path, capsys):
    spec = tiny_sam3_spec().to_dict()
    cfg = tmp_path / "c.yaml"
    data = {"train": {"format": "concepts", "path": str(tmp_path / "d"), "num_images": 4}}
    cfg.write_text(yaml.safe_dump({"family": "sam3", "model": {"spec": spec}, "data": data}))
    out = tmp_path / "bb.pdparams"
    args = ["--steps", "3", "--batch-size", "2", "--instance-loss", "--held-out", "2"]
    assert main([str(cfg), "-o", str(out), *args]) == 0
    text = capsys.readouterr().out
    assert "held-out shape accuracy" in text and "per instance" in text
    assert f"wrote {out}" in text
    state = paddle.load(str(out))
    assert state and all(k.startswith(VISION_PREFIX) for k in state)
    paddle.seed(0)  # the command's seed: the same initial weights
    init = build_sam3_image_model(spec=tiny_sam3_spec())
    before = {k: v.numpy() for k, v in init.state_dict().items() if k.startswith(VISION_PREFIX)}
    assert set(state) == set(before)
    assert any(not np.array_equal(state[k].numpy(), before[k]) for k in state)  # it trained
    assert load_vision_backbone(init, str(out)) == len(state)

    # an existing file is kept unless --overwrite; a config it cannot use is refused
    assert main([str(cfg), "-o", str(out), "--steps", "1"]) == 2
    assert "exists" in capsys.readouterr().err
    bad = tmp_path / "v1.yaml"
    bad.write_text(
        yaml.safe_dump({"family": "sam3", "model": {"checkpoint": str(out)}, "data": data})
    )
    assert main([str(bad), "-o", str(tmp_path / "x.pdparams")]) == 2
    assert "model.spec" in capsys.readouterr().err
    assert main([str(cfg), "-o", str(tmp_path / "x.pdparams"), "--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert main([str(cfg), "-o", str(tmp_path / "x.pdparams"), "--held-out", "0"]) == 2
    assert "--held-out" in capsys.readouterr().err
    assert not (tmp_path / "x.pdparams").exists()


@pytest.mark.parametrize("steps,batch,held_out", [(0, 2, 4), (1, 0, 4), (1, 2, 0)])
def test_pretrain_arguments(steps, batch, held_out):
    model = build_sam3_image_model(spec=tiny_sam3_spec())
    with pytest.raises(ValueError, match="steps, batch_size and held_out_scenes"):
        pretrain_vision_backbone(model, steps, batch_size=batch, held_out_scenes=held_out)
