"""What to label: the images of a folder (recursive), a glob, a text file of paths, or a COCO
JSON's ``images``, as a fixed, ordered list."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..predict.io import IMAGE_SUFFIXES, OutsideRootError, resolve_under


@dataclass(frozen=True)
class ImageItem:
    """One image of a job: its COCO id, the ``file_name`` written to the output (relative to
    the source folder, or as listed) and where it is read from."""

    id: int
    file_name: str
    path: str


def list_images(source: str | os.PathLike, image_root: str | os.PathLike | None = None) -> list:
    """The images of ``source``, in a fixed order, ids from 1 (a COCO file's own ids kept).

    - a folder: every file with an image ending below it (:data:`IMAGE_SUFFIXES`), sorted by
      relative path; ``file_name`` is that relative path;
    - a ``.json`` file: COCO, its ``images`` (``id``, ``file_name``) read relative to
      ``image_root`` (default: the JSON's folder); a ``file_name`` that is absolute, holds
      ``..`` or leads out of that folder through a symlink is refused (a COCO file often comes
      from elsewhere; the message does not tell whether a file exists out there);
    - a ``.txt`` file: one path per line (blank lines and ``#`` comments skipped), relative to
      ``image_root`` (default: the text file's folder);
    - anything else: a glob pattern (``**`` recursive), sorted.

    Raises ``FileNotFoundError`` / ``ValueError`` naming the problem, or when nothing is found.
    """
    text = str(source)
    path = Path(text)
    if path.is_dir():
        root = path
        files = sorted(
            p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
        items = [
            ImageItem(i, p.relative_to(root).as_posix(), str(p)) for i, p in enumerate(files, 1)
        ]
    elif path.suffix.lower() == ".json" and path.is_file():
        items = _coco_images(path, Path(image_root) if image_root else path.parent)
    elif path.suffix.lower() == ".txt" and path.is_file():
        base = Path(image_root) if image_root else path.parent
        names = read_lines(path)
        items = [ImageItem(i, n, str(base / n)) for i, n in enumerate(names, 1)]
    elif any(c in text for c in "*?["):
        files = sorted(glob.glob(text, recursive=True))
        files = [f for f in files if Path(f).is_file()]
        items = [ImageItem(i, f, f) for i, f in enumerate(files, 1)]
    elif path.exists():
        raise ValueError(
            f"{source}: not a folder, a COCO .json, a .txt list of paths or a glob pattern"
        )
    else:
        raise FileNotFoundError(f"source not found: {source}")
    if not items:
        raise ValueError(f"{source}: no images found")
    return items


def read_lines(path: Path) -> list[str]:
    """The entries of a text list: one per line, stripped; blank lines and ``#`` comments
    skipped (image lists, prompt files)."""
    return [
        line.strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _coco_images(path: Path, root: Path) -> list[ImageItem]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from None
    except RecursionError:  # json's parser on a deeply nested file
        raise ValueError(f"{path}: not a readable JSON file (nested too deeply)") from None
    images = doc.get("images") if isinstance(doc, dict) else None
    if not isinstance(images, list):
        raise ValueError(f"{path}: a COCO file needs an 'images' list")
    items, seen = [], set()
    for k, img in enumerate(images):
        ok = isinstance(img, dict) and isinstance(img.get("file_name"), str)
        if not ok or not isinstance(img.get("id"), int) or isinstance(img.get("id"), bool):
            raise ValueError(f"{path}: images[{k}] needs an integer 'id' and a 'file_name'")
        if img["id"] in seen:
            raise ValueError(f"{path}: images[{k}] repeats id {img['id']}")
        seen.add(img["id"])
        try:
            image_path = resolve_under(root, img["file_name"])
        except OutsideRootError as exc:
            raise ValueError(f"{path}: images[{k}]: {exc}") from None
        items.append(ImageItem(img["id"], img["file_name"], str(image_path)))
    return items
