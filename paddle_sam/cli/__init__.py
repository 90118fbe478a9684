"""Segment Anything in PaddlePaddle: download, convert, segment, everything, label, track, serve.

Run ``paddle-sam COMMAND --help`` for each command's options. Errors in what the user gave
(files, prompts, arguments, output folders) print one line naming the problem and exit with
status 2, before any model is loaded where the check allows; any other exception is a bug and
propagates with its traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import NoReturn

from ..loading.sam_v1 import DEFAULT_MODEL
from . import align, convert, download, everything, export, label, segment, serve, track, train
from .common import check_bounded
from .quiet import quiet_paddle

MAX_THREADS = 1024

# what the user gave is wrong: a value (CheckpointError and the other errors of files' contents
# are ValueErrors), or a path (missing, existing, a folder, not a folder, not permitted)
USER_ERRORS = (
    ValueError,
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


def missing_extra(exc: ImportError) -> bool:
    """An optional dependency is not installed: a module outside paddle-sam not found, or
    our own ImportError saying which extra to install (it names no module)."""
    if isinstance(exc, ModuleNotFoundError):
        return not (exc.name or "paddle_sam").startswith("paddle_sam")
    return exc.name is None


class Parser(argparse.ArgumentParser):
    """argparse, its errors one line like ours (no usage block; a pointer to --help instead).
    The subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _version() -> str:
    import paddle

    from .._version import __version__

    return f"paddle-sam {__version__} (PaddlePaddle {paddle.__version__})"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="paddle-sam", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=_version())
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show Paddle's own log lines and warnings (hidden by default)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"CPU threads, 1 to {MAX_THREADS} (default: all available)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for command in (
        download,
        convert,
        segment,
        everything,
        label,
        track,
        export,
        align,
        serve,
        train,
    ):
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .._runtime import set_num_threads, tune_process

    # this process runs paddle-sam only: the process-wide CPU settings (views copy, glibc keeps
    # freed memory), before any model is built; `paddle-sam serve` comes through here too
    tune_process()
    try:
        if args.threads is not None:  # checked here to name the command in the error
            check_bounded("--threads", args.threads, 1, MAX_THREADS)
            set_num_threads(args.threads)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            with quiet_paddle(args.verbose):
                return args.func(args)
    except (*USER_ERRORS, ImportError) as exc:
        if isinstance(exc, ImportError) and not missing_extra(exc):
            raise
        print(f"paddle-sam {args.command}: error: {exc}", file=sys.stderr)
        return 2


__all__ = ["DEFAULT_MODEL", "USER_ERRORS", "Parser", "build_parser", "main"]
