"""``paddle-sam download NAME``: an official checkpoint, verified by its sha256, converted to
``.pdparams`` in the same step."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..loading.registry import FAMILIES
from ..loading.weights import WEIGHTS, DownloadError, fetch, find, hub_token, sha256_of
from ..predict.outputs import check_targets, claim, foreign


def cmd_download(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        return _list()
    weights = find(args.name)
    if args.url and args.mirror:
        raise ValueError("give --url or --mirror, not both")
    if args.mirror and not weights.mirrors:
        raise ValueError(f"{weights.name} has no mirror; it is downloaded from {weights.url}")
    url = args.url or (weights.mirrors[0] if args.mirror else weights.url)
    out = Path(args.output_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--output-dir {out} is not a folder")
    dest = out / weights.file
    converted = dest.with_suffix(".pdparams")
    part = dest.with_name(dest.name + ".part")  # a download resumes from it
    written = [] if args.no_convert else [converted.name, converted.name + ".json"]
    check_targets(out, written, replace=True)  # a user's file: refused, whatever the flags
    check_targets(out, written[:1], replace=args.overwrite)  # paddle-sam's: --overwrite
    if dest.exists():
        digest = sha256_of(dest)
        if digest == weights.sha256:  # read, not written: whoever put it there
            print(f"{dest} is already here and verified (sha256 {digest[:12]}...)")
        else:
            wrong = (
                f"{dest} exists and is not the official file (sha256 {digest[:12]}..., "
                f"expected {weights.sha256[:12]}...)"
            )
            if foreign(out, [dest.name]):
                raise FileExistsError(
                    f"{wrong}; paddle-sam did not write it, so it is never replaced, even with "
                    "--overwrite: move it away or download elsewhere (-o)"
                )
            if not args.overwrite:
                raise FileExistsError(f"{wrong}; pass --overwrite to download it again")
            dest.unlink()
    elif os.path.lexists(dest):  # a dangling link: never written through
        check_targets(out, [dest.name])
    fetched = [] if dest.exists() else [dest.name, part.name]
    check_targets(out, fetched[1:], replace=True)  # ours: resumed
    if written or fetched:
        claim(out, [*written, *fetched], "download")
    if not dest.exists():
        token = (args.token or hub_token()) if weights.token_host else None
        t = time.perf_counter()

        def say(line: str) -> None:
            print(f"paddle-sam download: {line}", file=sys.stderr)

        try:
            fetch(weights, dest, url=url, token=token, progress=not args.quiet, on_retry=say)
        except DownloadError as exc:
            raise ValueError(str(exc)) from None
        print(
            f"downloaded {dest} in {time.perf_counter() - t:.0f}s; sha256 verified "
            f"({weights.checksum_from})"
        )
    if args.no_convert or weights.family not in FAMILIES:
        if not args.no_convert:
            print(f"this paddle-sam reads no {weights.family} checkpoint yet: not converted")
        print(f"use it as --checkpoint {dest}")
        return 0
    from ..convert.checkpoint import convert_checkpoint

    t = time.perf_counter()
    meta = convert_checkpoint(
        dest, converted, weights.model_type, overwrite=args.overwrite, progress=not args.quiet
    )
    print(
        f"converted -> {converted} ({meta['model_type']}) in {time.perf_counter() - t:.0f}s; "
        f"use it as --checkpoint {converted} (the original {dest} is kept)"
    )
    return 0


def _list() -> int:
    print(f"{'name':24} {'family':7} {'file':26} source")
    for w in WEIGHTS.values():
        gated = " (gated; --mirror for the ungated copy)" if w.gate else ""
        print(f"{w.name:24} {w.family:7} {w.file:26} {w.url}{gated}")
    print("\npaddle-sam download NAME [-o DIR]: verified by sha256, then converted to .pdparams")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "download",
        help="download an official checkpoint (verified) and convert it",
        description=__doc__.split("\n\n")[0],
    )
    d.add_argument("name", nargs="?", help=f"one of: {', '.join(WEIGHTS)} (none: list them)")
    d.add_argument("-o", "--output-dir", default=".", help="folder to write to (default: .)")
    d.add_argument(
        "--no-convert", action="store_true", help="keep the original only; do not convert"
    )
    d.add_argument(
        "--mirror", action="store_true", help="download a gated file from its ungated mirror"
    )
    d.add_argument(
        "--url",
        help="download from this URL instead (a local copy, another mirror); the file is "
        "still verified against the official sha256",
    )
    d.add_argument(
        "--token",
        help="Hugging Face token for a gated file (default: HF_TOKEN or the hub's login); "
        "sent only to huggingface.co",
    )
    d.add_argument("--overwrite", action="store_true", help="replace files already there")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.add_argument("--list", action="store_true", help="list the checkpoints and exit")
    d.set_defaults(func=cmd_download)
