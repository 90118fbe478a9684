"""Hostile training configs (issue 37: 9, 10, 17), each run through the real CLI: refused with
exit status 2 and one stderr line naming the key and the file, no traceback, and no run folder
(nothing trained). The values are checked by one checker, ``train.config.checked``, for the
file and for ``--set`` alike, and YAML is read by a bounded loader.

Cases where memory matters run ``paddle-sam`` in a subprocess of a small wrapper that reports
its peak memory (``RUSAGE_CHILDREN`` of the wrapper: only that one command).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from paddle_sam.cli import main
from paddle_sam.train.config import MAX_DEPTH, MAX_NODES, read_raw
from paddle_sam.train.families import load_config
from tests.helpers.specs import tiny_sam3_spec, tiny_train_spec

ROOT = Path(__file__).resolve().parents[2]


def v1_config(tmp_path: Path) -> dict:
    """A tiny SAM v1 run that would train (one step) if nothing were wrong with it."""
    return {
        "model": {"type": "vit_tiny_synthetic", "spec": tiny_train_spec()},
        "data": {"train": {"format": "synthetic", "num_images": 1, "sizes": [[64, 64]]}},
        "train": {"steps": 1, "log_every": 1, "checkpoint_every": 1},
        "run": {"output_dir": str(tmp_path / "run")},
    }


def sam3_config(tmp_path: Path) -> dict:
    return {
        "family": "sam3",
        "model": {"spec": json.loads(json.dumps(tiny_sam3_spec().to_dict()))},
        "data": {"train": {"format": "concepts", "path": str(tmp_path / "c"), "num_images": 1}},
        "train": {"steps": 1, "log_every": 1, "checkpoint_every": 1},
        "run": {"output_dir": str(tmp_path / "run")},
    }


FAMILIES = {"sam_v1": v1_config, "sam3": sam3_config}


def put(cfg: dict, key: str, value) -> dict:
    node = cfg
    *parents, last = key.split(".")
    for k in parents:
        node = node.setdefault(k, {})
    node[last] = value
    return cfg


def refused(capsys, tmp_path: Path, argv: list[str], *patterns: str) -> str:
    """Run ``argv`` through the CLI: exit 2, one line matching every pattern, no run."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    assert "Traceback" not in err
    assert lines[0].startswith("paddle-sam train: error: "), lines[0]
    for p in patterns:
        assert p in lines[0], (p, lines[0])
    assert not (tmp_path / "run").exists(), "a run folder was made: training started"
    return lines[0]


# -- 9: non-finite numbers and negatives where they make no sense --

NON_FINITE_FILE = [
    ("sam_v1", "optim.lr", float("nan")),
    ("sam_v1", "optim.weight_decay", float("inf")),
    ("sam_v1", "loss.focal_weight", float("-inf")),
    ("sam_v1", "optim.grad_clip", float("nan")),
    ("sam_v1", "prompts.box_noise", float("nan")),
    ("sam_v1", "model.spec.image_size", float("nan")),  # a free-form section too
    ("sam3", "optim.lr", float("nan")),
    ("sam3", "optim.layer_decay", float("nan")),
    ("sam3", "loss.o2m_weight", float("inf")),
    ("sam3", "data.exemplar_prob", float("nan")),
    ("sam3", "model.lora_alpha", float("-inf")),
]


@pytest.mark.parametrize("family,key,value", NON_FINITE_FILE)
def test_non_finite_numbers_in_the_file_are_refused(tmp_path, capsys, family, key, value):
    cfg = put(FAMILIES[family](tmp_path), key, value)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))  # .nan / .inf / -.inf
    assert (".nan" if value != value else ".inf") in path.read_text()
    refused(capsys, tmp_path, ["train", str(path)], str(path), f"{key} = ", "not a finite number")


NON_FINITE_SET = [
    ("sam_v1", "optim.lr=.nan", "--set optim.lr = nan: not a finite number"),
    ("sam_v1", "optim.lr=1e400", "--set optim.lr = inf: not a finite number"),
    ("sam_v1", "optim.lr=nan", "optim.lr: expected a number, got 'nan'"),
    ("sam_v1", "optim.grad_clip=inf", "optim.grad_clip: expected a number, got 'inf'"),
    ("sam_v1", "prompts.box_noise=-.inf", "--set prompts.box_noise = -inf: not a finite"),
    ("sam_v1", "optim={lr: .NaN}", "--set optim.lr = nan: not a finite number"),
    ("sam3", "loss.denoise=.nan", "--set loss.denoise = nan: not a finite number"),
    ("sam3", "optim.weight_decay=.inf", "--set optim.weight_decay = inf: not a finite"),
]


@pytest.mark.parametrize("family,override,message", NON_FINITE_SET)
def test_non_finite_numbers_in_set_are_refused(tmp_path, capsys, family, override, message):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(FAMILIES[family](tmp_path)))
    refused(capsys, tmp_path, ["train", str(path), "--set", override], str(path), message)


NEGATIVE = [
    ("sam_v1", "optim.lr", -1e-3, "must be > 0"),
    ("sam_v1", "optim.weight_decay", -0.1, "must be >= 0"),
    ("sam_v1", "optim.grad_clip", -1.0, "must be > 0 (or null: off)"),
    ("sam_v1", "optim.beta2", 1.0, "must be in [0, 1)"),
    ("sam_v1", "optim.encoder_lr_scale", -0.5, "must be >= 0"),
    ("sam_v1", "loss.focal_weight", -20.0, "must be >= 0"),
    ("sam_v1", "loss.focal_alpha", 2.0, "must be in [0, 1] (or -1: none)"),
    ("sam_v1", "prompts.box_noise", -0.1, "must be >= 0"),
    ("sam_v1", "train.steps", -5, "must be > 0"),
    ("sam_v1", "train.batch_size", 0, "must be > 0"),
    ("sam_v1", "train.checkpoint_every", 0, "must be > 0"),  # was a ZeroDivisionError
    ("sam_v1", "train.seed", -1, "must be >= 0"),
    ("sam_v1", "train.threads", 0, "must be >= 1"),
    ("sam_v1", "data.eval_images", 0, "must be > 0"),
    ("sam_v1", "train.steps", 2**70, "too large a number"),
    ("sam3", "optim.lr", -8e-5, "must be > 0"),
    ("sam3", "optim.vision_lr_scale", -1.0, "must be >= 0"),
    ("sam3", "optim.grad_clip", 0.0, "must be > 0 (or null: off)"),
    ("sam3", "optim.min_lr_ratio", 1.5, "must be in [0, 1]"),
    ("sam3", "loss.o2m_weight", -2.0, "must be >= 0"),
    ("sam3", "model.lora_alpha", 0.0, "must be > 0"),
    ("sam3", "train.batch_size", -1, "must be > 0"),
    ("sam3", "train.eval_every", -1, "must be >= 0"),
    ("sam3", "data.min_size", 0, "must be >= 1"),
]


@pytest.mark.parametrize("family,key,value,why", NEGATIVE)
def test_out_of_range_values_are_refused(tmp_path, capsys, family, key, value, why):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(put(FAMILIES[family](tmp_path), key, value)))
    refused(capsys, tmp_path, ["train", str(path)], str(path), f"{key} = ", why)
    path.write_text(yaml.safe_dump(FAMILIES[family](tmp_path)))  # and the same through --set
    refused(capsys, tmp_path, ["train", str(path), "--set", f"{key}={value}"], f"{key} = ", why)


def test_exponent_floats_are_numbers(tmp_path):
    """--set optim.lr=3e-4 (as --help says) and lr: 1e-4 in a file are numbers, not text."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(v1_config(tmp_path)) + "optim: {lr: 1e-4, beta2: 9.99e-1}\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.optim.beta2) == (1e-4, 0.999)
    cfg = load_config(path, ["optim.lr=3e-4", "optim.weight_decay=1E-2"])
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (3e-4, 1e-2)


# -- 10: alias bombs, and values printed cut --

LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [{','.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
WRAPPER = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=300)\n"
    "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) + '\\n')\n"
    "sys.stderr.write(p.stderr)\n"
    "sys.exit(p.returncode)\n"
)


def run_measured(tmp_path: Path, *args: str) -> tuple[int, str, int]:
    """``paddle-sam train ARGS`` in a subprocess: (exit status, stderr, peak memory in bytes)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, sys.executable, "-m", "paddle_sam", "train", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    return proc.returncode, proc.stderr, int(proc.stdout.split()[-1]) * 1024


def test_billion_laughs_file_is_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    assert path.stat().st_size < 600
    rc, err, peak = run_measured(tmp_path, str(path))
    assert rc == 2, err[-2000:]
    assert len(err) < 2000 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{path}: more than {MAX_NODES} values (aliases expanded)" in err
    assert peak < 1 << 30, f"peak memory {peak / 2**20:.0f} MiB"


def test_billion_laughs_in_set_is_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(v1_config(tmp_path)))
    levels = "abcdefghi"
    bomb = "{a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol], " + ", ".join(
        f"{b}: &{b} [{','.join([f'*{a}'] * 9)}]" for a, b in zip(levels, levels[1:], strict=False)
    )
    bomb += "}"
    rc, err, peak = run_measured(tmp_path, str(path), "--set", f"model.spec={bomb}")
    assert rc == 2, err[-2000:]
    assert len(err) < 2000 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{path}: --set model.spec: cannot parse value" in err
    assert "values (aliases expanded)" in err or "aliases (*name)" in err
    assert peak < 1 << 30, f"peak memory {peak / 2**20:.0f} MiB"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "text,message",
    [
        ("a: &a [1, *a]\n", "alias *a inside its own anchor"),
        ("x: &x 1\n" + "".join(f"k{i}: *x\n" for i in range(101)), "more than 100 aliases"),
        ("a: *nothing\n", "found undefined alias"),
        ("train: {steps: " + "9" * 5000 + "}\n", "not valid YAML"),  # over int()'s limit
    ],
)
def test_hostile_yaml_is_refused(tmp_path, capsys, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    refused(capsys, tmp_path, ["train", str(path)], str(path), message)


def test_an_override_does_not_leak_through_an_alias(tmp_path):
    """An alias (kept within the bounds) still works, and --set on one copy leaves the other
    as written: the checker copies values apart."""
    cfg = v1_config(tmp_path)
    del cfg["data"]
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(cfg) + "data:\n"
        "  train: &t {format: synthetic, num_images: 1, seed: 0, sizes: [[64, 64]]}\n"
        "  val: *t\n"
    )
    loaded = yaml.safe_load(path.read_text())
    assert loaded["data"]["val"] is loaded["data"]["train"]
    out = load_config(path, ["data.val.seed=5"])
    assert (out.data.train.seed, out.data.val.seed) == (0, 5)


@pytest.mark.parametrize(
    "key,value",
    [
        ("train.steps", "x" * 100_000),
        ("model.type", "v" * 100_000),
        ("model.type", list(range(30_000))),  # a long list where text belongs
        ("train", {f"k{i}": i for i in range(30_000)}),  # 30000 unknown keys
    ],
)
def test_values_in_errors_are_cut(tmp_path, capsys, key, value):
    path = tmp_path / "c.yaml"
    cfg = put(v1_config(tmp_path), key, value)
    path.write_text(yaml.safe_dump(cfg))
    line = refused(capsys, tmp_path, ["train", str(path)], str(path), key)
    assert len(line) < len(str(path)) + 250, line
    assert "..." in line or "unknown key train.k0;" in line


def test_long_set_values_in_errors_are_cut(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(v1_config(tmp_path)))
    line = refused(
        capsys, tmp_path, ["train", str(path), "--set", "train.steps=" + "[" * 50_000], str(path)
    )
    assert "--set train.steps: cannot parse value" in line and len(line) < len(str(path)) + 400


# -- 17: deep nesting and sizes beyond the pixel limit --


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 100_000 + "]" * 100_000 + "\n",  # flow
        "a: " + "{b: " * 100_000 + "1" + "}" * 100_000 + "\n",
        "- " * 100_000 + "x\n",  # block sequences on one line
    ],
    ids=["flow-lists", "flow-maps", "block"],
)
def test_deep_yaml_is_refused(tmp_path, capsys, text):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    refused(
        capsys, tmp_path, ["train", str(path)], str(path), f"nested deeper than {MAX_DEPTH} levels"
    )


def test_deep_set_is_refused(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(v1_config(tmp_path)))
    deep = "[" * 100_000 + "]" * 100_000
    refused(
        capsys,
        tmp_path,
        ["train", str(path), "--set", f"model.spec={deep}"],
        f"{path}: --set model.spec: cannot parse value",
        f"nested deeper than {MAX_DEPTH} levels",
    )
    refused(
        capsys,
        tmp_path,
        ["train", str(path), "--set", "a" + ".a" * 100_000 + "=1"],
        f"{path}: --set a.a.a",
        f"at most {MAX_DEPTH} parts",
    )


@pytest.mark.parametrize("family", ["sam_v1", "sam3"])
@pytest.mark.parametrize(
    "sizes,why",
    [
        ("[[100000,100000]]", "above the limit of 100000000 pixels"),
        ("[[64,64],[20000,6000]]", "above the limit of 100000000 pixels"),
        ("[[8,8]]", "each side must be >= 32 pixels"),
        ("[[64,64,3]]", "expected [width, height]"),
    ],
)
def test_scene_sizes_are_bounded(tmp_path, capsys, family, sizes, why):
    from paddle_sam.predict.io import MAX_IMAGE_PIXELS

    assert MAX_IMAGE_PIXELS == 100_000_000  # the limit the image readers use, reused
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(FAMILIES[family](tmp_path)))
    argv = ["train", str(path), "--set", f"data.train.sizes={sizes}"]
    refused(capsys, tmp_path, argv, str(path), "data.train.sizes[", why)


def test_shipped_configs_read_as_before(tmp_path):
    """The bounded loader reads the shipped configs to the same values as ``yaml.safe_load``."""
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        assert read_raw(path)[0] == yaml.safe_load(path.read_text()), path.name


def test_a_loss_that_stops_being_finite_stops_the_run(tmp_path, capsys):
    """A finite but absurd learning rate sends the weights to infinity after the first step: the
    run stops at the first non-finite loss with one line, and no model with NaN weights is
    saved."""
    cfg = put(v1_config(tmp_path), "optim.lr", 1e30)
    cfg = put(cfg, "train.steps", 4)
    cfg = put(cfg, "train.checkpoint_every", 100)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert len(lines) == 1 and "not finite" in lines[0], err[-2000:]
    assert not (tmp_path / "run" / "model.pdparams").exists()
