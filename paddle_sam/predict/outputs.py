"""Which files of an output folder paddle-sam wrote: the one rule of every command that writes.

A command records the names it writes into a folder (files or folders directly in it) in the
folder's ``.paddle-sam.json`` before writing them (:func:`claim`). Before that, each name it
will write is checked (:func:`check_targets`):

- absent: written;
- present and recorded as paddle-sam's: replaced only when the user says so (``--overwrite``,
  or ``--resume`` where a command continues its own earlier run);
- present and not recorded: a user's file, never replaced, whatever the flags.

A symbolic link is never taken as ours: writing through it would replace the file it points
to. An unreadable record is refused (its files cannot be told apart), naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

MARKER = ".paddle-sam.json"
MARKER_FORMAT = 1


def owned(folder: str | os.PathLike) -> dict[str, str]:
    """``{name: command}`` of what paddle-sam recorded writing into ``folder`` ({} when
    nothing). Raises ValueError naming the record when it is not one."""
    path = Path(folder) / MARKER
    if not os.path.lexists(path):
        return {}
    fix = f"remove it (paddle-sam then treats every file in {Path(folder)} as the user's)"
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"{path} is not a file: not paddle-sam's record of its outputs; {fix}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ValueError(
            f"{path}: not a readable record of paddle-sam's outputs ({why}); {fix}"
        ) from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise ValueError(
            f"{path}: not paddle-sam's record of its outputs (a 'files' object of names and "
            f"commands expected); {fix}"
        )
    return files


def foreign(folder: str | os.PathLike, names: Iterable[str]) -> list[str]:
    """The ``names`` present in ``folder`` that paddle-sam did not write (or that are links)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    ours = owned(folder)
    return [
        n
        for n in names
        if os.path.lexists(folder / n) and (n not in ours or (folder / n).is_symlink())
    ]


def check_targets(
    folder: str | os.PathLike,
    names: Iterable[str],
    *,
    replace: bool = False,
    flag: str = "--overwrite",
) -> list[str]:
    """Refuse to write ``names`` into ``folder`` where that would replace a file paddle-sam did
    not write (whatever ``replace``), or, unless ``replace``, one it wrote earlier (``flag``
    says how to allow it). Returns the names present (all paddle-sam's). FileExistsError."""
    folder, names = Path(folder), list(names)
    theirs = foreign(folder, names)
    if theirs:
        shown = [f"{n} (a link)" if (folder / n).is_symlink() else n for n in theirs]
        if len(theirs) == 1:
            what = f"{folder / shown[0]} exists and paddle-sam did not write it"
            pronoun, them = "it is", "it"
        else:
            what = f"{folder} has {', '.join(shown)}, which paddle-sam did not write"
            pronoun, them = "they are", "them"
        raise FileExistsError(
            f"{what} (not listed in {MARKER}): {pronoun} never replaced, even with "
            f"--overwrite (which replaces paddle-sam's own outputs only); move {them} away or "
            "write elsewhere"
        )
    present = [n for n in names if os.path.lexists(folder / n)] if folder.is_dir() else []
    if present and not replace:
        if len(present) == 1:
            raise FileExistsError(f"{folder / present[0]} exists; pass {flag} to replace it")
        raise FileExistsError(
            f"{folder} already has {', '.join(present)}; pass {flag} to replace them"
        )
    return present


def claim(folder: str | os.PathLike, names: Iterable[str], command: str) -> None:
    """Record ``names`` in ``folder`` (made if missing) as written by paddle-sam ``command``;
    call it after :func:`check_targets` and before writing them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = owned(folder)
    names = list(names)
    if all(files.get(n) == command for n in names) and (folder / MARKER).is_file():
        return
    files.update(dict.fromkeys(names, command))
    doc = {
        "format": MARKER_FORMAT,
        "about": "files and folders paddle-sam wrote here; --overwrite may replace these only",
        "files": dict(sorted(files.items())),
    }
    tmp = folder / f".{MARKER}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER)


def remove_owned(folder: str | os.PathLike, names: Iterable[str]) -> None:
    """Delete the ``names`` in ``folder`` that paddle-sam wrote (files or whole folders);
    anything else is left alone."""
    import shutil

    folder = Path(folder)
    if not folder.is_dir():
        return
    ours = owned(folder)
    for n in names:
        p = folder / n
        if n not in ours or p.is_symlink() or not p.exists():
            continue
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


__all__ = ["MARKER", "check_targets", "claim", "foreign", "owned", "remove_owned"]
