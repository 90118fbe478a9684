"""Output folders, by the real CLI: one rule for every command that writes. A file paddle-sam
did not write is never replaced, whatever the flags (``--overwrite`` included); paddle-sam's
own outputs (recorded in the folder's ``.paddle-sam.json``) only with ``--overwrite`` (or
``--resume`` where a command continues its own run). Each refusal: exit status 2, one stderr
line naming the file, no traceback, and every byte of the folder as it was.

Then ``label --resume`` over a job folder someone tampered with: a truncated shard, a shard
missing a key or holding a wrong type, annotations of an image the shard did not label, a
``job.json`` that is a list, and a source JSON nested too deeply: one line naming the file
(and the key), nothing merged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddle_sam import cli
from paddle_sam.loading.sam_v1 import DEFAULT_MODEL
from paddle_sam.predict.outputs import MARKER

# pycocotools 2.0.x's decode trips a numpy 2 deprecation inside the library; not ours to fix.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

# the bundled model with every generator option it would lower given (no notes on stderr),
# a 2 x 2 grid: a label job in about a second
LABEL = [
    "--everything",
    "--checkpoint",
    str(DEFAULT_MODEL),
    "--points-per-side",
    "2",
    "--pred-iou-thresh",
    "0",
    "--stability-score-thresh",
    "0",
    "--quiet",
]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (links as their target path), by relative path."""
    files = {}
    for p in sorted(folder.rglob("*")):
        key = p.relative_to(folder).as_posix()
        if p.is_symlink():
            files[key] = f"-> {p.readlink()}".encode()
        elif p.is_file():
            files[key] = p.read_bytes()
    return files


def refused(capsys, argv: list, *needles: str) -> str:
    """Run ``paddle-sam ARGV``: exit status 2, one stderr line starting with the command's
    name and holding every needle, no traceback; returns the line."""
    argv = [str(a) for a in argv]
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"paddle-sam {argv[0]}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def refused_untouched(capsys, folder: Path, argv: list, *needles: str) -> str:
    before = snapshot(folder)
    line = refused(capsys, argv, *needles)
    assert snapshot(folder) == before
    return line


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Two small images."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(2):
        img = (rng.random((40, 48, 3)) * 60).astype(np.uint8)
        img[8:24, 10:30] = 200
        Image.fromarray(img).save(root / f"img{i}.png")
    return root


# -- defect 4: label replaced files it did not write ------------------------------------------


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"]], ids=["plain", "ow", "rs"])
def test_label_source_ground_truth_into_its_own_folder(images, tmp_path, capsys, flags):
    """``label DATA/annotations.json -o DATA``: the user's ground truth is the source and would
    be the job's annotations.json; refused, byte for byte the same."""
    data = tmp_path / "data"
    shutil.copytree(images, data)
    truth = {
        "images": [{"id": 7, "file_name": "img0.png"}, {"id": 9, "file_name": "img1.png"}],
        "annotations": [{"id": 1, "image_id": 7, "bbox": [1, 2, 3, 4], "category_id": 1}],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (data / "annotations.json").write_text(json.dumps(truth))
    source = data / "annotations.json"
    refused_untouched(
        capsys, data, ["label", source, "-o", data, *LABEL, *flags], str(source), "-o"
    )
    assert not (data / MARKER).exists()


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"]], ids=["plain", "ow", "rs"])
@pytest.mark.parametrize("name", ["annotations.json", "report.json", "job.json", "shards"])
def test_label_never_replaces_a_users_file(images, tmp_path, capsys, flags, name):
    """A file (or folder) of a job's name that paddle-sam did not write, in OUT without a
    job: refused whatever the flags, named."""
    out = tmp_path / "out"
    out.mkdir()
    if name == "shards":
        (out / "shards").mkdir()
        (out / "shards" / "shard-000000.json").write_text("my own notes")
    else:
        (out / name).write_text('{"mine": true}')
    (out / "notes.txt").write_text("mine too")
    line = refused_untouched(capsys, out, ["label", images, "-o", out, *LABEL, *flags], name)
    assert "paddle-sam did not write" in line and "even with --overwrite" in line


@pytest.fixture(scope="module")
def job(images, tmp_path_factory) -> Path:
    """A finished label job over ``images``, one image per shard (two shards)."""
    out = tmp_path_factory.mktemp("job") / "out"
    assert cli.main(["label", str(images), "-o", str(out), *LABEL, "--shard-size", "1"]) == 0
    assert sorted(p.name for p in (out / "shards").iterdir()) == [
        "shard-000000.json",
        "shard-000001.json",
    ]
    return out


def copy_of(job: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(job, out)
    return out


def test_label_replaces_its_own_files_only_with_overwrite(images, job, tmp_path, capsys):
    """paddle-sam's own job: refused without a flag, continued with --resume, started again
    with --overwrite; a user's file beside it is left alone."""
    out = copy_of(job, tmp_path)
    (out / "notes.txt").write_text("mine")
    argv = ["label", images, "-o", out, *LABEL, "--shard-size", "1"]
    refused_untouched(capsys, out, argv, "--resume", "--overwrite")
    assert cli.main([str(a) for a in argv] + ["--resume"]) == 0
    assert "2 of 2 shards from an earlier run" in capsys.readouterr().out
    assert cli.main([str(a) for a in argv] + ["--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / MARKER).read_text())["files"] == {
        "annotations.json": "label",
        "job.json": "label",
        "report.json": "label",
        "shards": "label",
    }


def test_label_results_without_job_json_need_overwrite(images, job, tmp_path, capsys):
    """paddle-sam's annotations.json and report.json left without their job.json: not replaced
    by a new job unless --overwrite."""
    out = copy_of(job, tmp_path)
    (out / "job.json").unlink()
    shutil.rmtree(out / "shards")
    argv = ["label", images, "-o", out, *LABEL]
    refused_untouched(capsys, out, argv, "annotations.json", "report.json", "--overwrite")


def test_label_source_is_its_own_earlier_output(job, tmp_path, capsys):
    """A job's own annotations.json as the source of a job into the same folder: refused with
    --overwrite too (the job would replace what it reads)."""
    out = copy_of(job, tmp_path)
    source = out / "annotations.json"
    argv = ["label", source, "-o", out, *LABEL, "--overwrite"]
    refused_untouched(capsys, out, argv, str(source), "-o")


# -- the same rule in every command that writes -----------------------------------------------


def write_users_file(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if name == "masks":
        (folder / "masks").mkdir()
        (folder / "masks" / "0000.png").write_bytes(b"my mask")
    else:
        (folder / name).write_bytes(b"the user's own " + name.encode())


@pytest.mark.parametrize(
    "name,command",
    [
        ("mask.png", "segment {img} --point 5,5 --checkpoint {ckpt} -o {out}"),
        ("result.json", "segment {img} --box 1,1,9,9 -o {out}"),
        ("annotations.json", "everything {img} --quiet -o {out}"),
        ("masks", "everything {img} --quiet -o {out}"),
        ("export.json", "export --checkpoint {ckpt} -o {out}"),
        ("image_encoder.pdiparams", "export --checkpoint {ckpt} -o {out}"),
        ("results.json", "track {video} --checkpoint {pt} --point 0,1,1 -o {out}"),
        ("r.json", "eval --format synthetic --num-images 1 --json {out}/r.json"),
        ("x.pdparams.json", "convert {pt} {out}/x.pdparams --quiet"),
        ("r.safetensors", "random-checkpoint -o {out}/r.safetensors"),
        ("sam_vit_b_01ec64.pdparams", "download vit_b -o {out} --url {url}"),
        ("sam_vit_b_01ec64.pth.part", "download vit_b -o {out} --url {url}"),
    ],
    ids=lambda v: v.split()[0] if " " in v else v,
)
def test_every_command_refuses_a_users_file_even_with_overwrite(
    images, tmp_path, capsys, name, command
):
    """The user's file of an output's name: refused before any model is loaded (an export's
    program files: before any is written), --overwrite or not, every byte kept."""
    out = tmp_path / "out"
    write_users_file(out, name)
    # never loaded: each command refuses before it would load the checkpoint or fetch the URL
    pt = tmp_path / "sam3.pt"
    pt.write_bytes(b"not read")
    fill = {
        "img": images / "img0.png",
        "ckpt": DEFAULT_MODEL,
        "out": out,
        "video": tmp_path / "clip.mp4",  # not even there: the refusal comes first
        "pt": pt,
        "url": "http://127.0.0.1:9/never",
    }
    argv = command.format(**fill).split()
    for flags in ([], ["--overwrite"]):
        line = refused_untouched(capsys, tmp_path, [*argv, *flags], name)
        assert "paddle-sam did not write" in line and "even with --overwrite" in line


def test_train_run_folder_of_a_users_files(tmp_path, capsys):
    """A run folder holding the user's metrics.csv: refused with --overwrite and --resume, not
    one file removed (before the model is built)."""
    import yaml

    run = tmp_path / "run"
    write_users_file(run, "metrics.csv")
    (run / "checkpoints").mkdir()  # paddle-sam's name, the user's folder
    cfg = {
        "model": {"type": "vit_tiny_synthetic"},
        "data": {"train": {"format": "synthetic", "num_images": 1, "seed": 0}},
        "train": {"steps": 1, "batch_size": 1},
        "run": {"output_dir": str(run)},
    }
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    for flags in ([], ["--overwrite"], ["--resume"]):
        line = refused_untouched(capsys, tmp_path, ["train", config, "--quiet", *flags])
        assert "checkpoints, metrics.csv" in line and "paddle-sam did not write" in line


def test_a_link_is_never_written_through(images, tmp_path, capsys):
    """An output name that is a link (here to the user's file), though the record says
    paddle-sam wrote that name: refused with --overwrite, the file it points to kept."""
    out = tmp_path / "out"
    out.mkdir()
    precious = tmp_path / "precious.png"
    precious.write_bytes(b"precious")
    (out / "mask.png").symlink_to(precious)
    record = {"format": 1, "files": {"mask.png": "segment", "overlay.png": "segment"}}
    (out / MARKER).write_text(json.dumps(record))
    argv = ["segment", images / "img0.png", "--point", "5,5", "--checkpoint", DEFAULT_MODEL]
    line = refused_untouched(capsys, tmp_path, [*argv, "-o", out, "--overwrite"], "mask.png")
    assert "(a link)" in line


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", "{not json", '{"files": {"mask.png": 3}}', "[" * 100_000],
    ids=["list", "truncated", "wrong type", "nested too deeply"],
)
def test_an_unreadable_record_is_named(images, tmp_path, capsys, text):
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(text)
    (out / "overlay.png").write_bytes(b"whose?")
    argv = ["segment", images / "img0.png", "--point", "5,5", "--checkpoint", DEFAULT_MODEL]
    refused_untouched(capsys, tmp_path, [*argv, "-o", out, "--overwrite"], str(out / MARKER))


def test_own_outputs_replaced_with_overwrite_users_kept(images, tmp_path, capsys):
    """The rule's other half: paddle-sam's own outputs are refused without --overwrite and
    replaced with it, the user's file beside them untouched."""
    out = tmp_path / "out"
    argv = ["segment", images / "img0.png", "--point", "20,15", "--checkpoint", DEFAULT_MODEL]
    argv = [str(a) for a in [*argv, "-o", out]]
    assert cli.main(argv) == 0
    (out / "notes.txt").write_text("mine")
    refused_untouched(capsys, out, argv, "--overwrite", "mask.png")
    assert cli.main([*argv, "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert set(json.loads((out / MARKER).read_text())["files"]) >= {
        "mask.png",
        "overlay.png",
        "result.json",
    }


# -- defect 15: label --resume over a tampered job --------------------------------------------


def _shard(out: Path, i: int = 0) -> Path:
    return out / "shards" / f"shard-{i:06d}.json"


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def _unknown_image(doc: dict) -> None:
    ann = dict(doc["annotations"][0], image_id=999)
    doc["annotations"].append(ann)


TAMPERED = [
    ("truncated", lambda out: _truncate(_shard(out)), ["shard-000000.json", "not a readable"]),
    (
        "no images key",
        lambda out: _edit(_shard(out), lambda d: d.pop("images")),
        ["shard-000000.json", "'images' missing"],
    ),
    (
        "annotations not a list",
        lambda out: _edit(_shard(out, 1), lambda d: d.update(annotations={"a": 1})),
        ["shard-000001.json", "'annotations' a dict, not a list"],
    ),
    (
        "image id a string",
        lambda out: _edit(_shard(out), lambda d: d["images"][0].update(id="1")),
        ["shard-000000.json", "'images[0].id' must be an integer"],
    ),
    (
        "seconds missing",
        lambda out: _edit(_shard(out), lambda d: d.pop("seconds")),
        ["shard-000000.json", "'seconds' must be a number"],
    ),
    (
        "shard a list",
        lambda out: _shard(out).write_text("[]"),
        ["shard-000000.json", "not a shard"],
    ),
    (
        "annotation of an unknown image",
        lambda out: _edit(_shard(out), _unknown_image),
        ["shard-000000.json", ".image_id' 999 is not an image the shard labelled"],
    ),
    (
        "shard nested too deeply",
        lambda out: _shard(out).write_text("[" * 100_000),
        ["shard-000000.json", "nested too deeply"],
    ),
    ("job.json a list", lambda out: (out / "job.json").write_text("[1, 2]"), ["job.json", "list"]),
    (
        "job.json truncated",
        lambda out: _truncate(out / "job.json"),
        ["job.json", "not a readable job description"],
    ),
]


@pytest.mark.parametrize("tamper,needles", [c[1:] for c in TAMPERED], ids=[c[0] for c in TAMPERED])
def test_label_resume_over_a_tampered_job(images, job, tmp_path, capsys, tamper, needles):
    """Each is one line naming the file (and the key), before any labelling; the job folder
    (the merged annotations.json included) is left as it was."""
    out = copy_of(job, tmp_path)
    tamper(out)
    argv = ["label", images, "-o", out, *LABEL, "--shard-size", "1", "--resume"]
    refused_untouched(capsys, out, argv, *needles)


def test_label_resume_redoes_a_deleted_shard(images, job, tmp_path, capsys):
    """What the errors advise: the shard deleted, --resume labels its images again and the
    merged file equals the untouched job's."""
    out = copy_of(job, tmp_path)
    _shard(out).unlink()
    argv = ["label", images, "-o", out, *LABEL, "--shard-size", "1", "--resume"]
    assert cli.main([str(a) for a in argv]) == 0
    assert "1 of 2 shards from an earlier run" in capsys.readouterr().out
    got = json.loads((out / "annotations.json").read_text())
    want = json.loads((job / "annotations.json").read_text())
    assert got == want


def test_label_source_json_nested_too_deeply(tmp_path, capsys):
    source = tmp_path / "deep.json"
    source.write_text('{"images": ' + "[" * 100_000)
    out = tmp_path / "out"
    refused_untouched(capsys, tmp_path, ["label", source, "-o", out, *LABEL], str(source))
    assert not out.exists()
