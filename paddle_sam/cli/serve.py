"""``paddle-sam serve``: the argument parser and the command."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import sys

from ..serve.config import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_QUEUED_JOBS,
    DEFAULT_MAX_UPLOAD_MB,
    DEFAULT_MEMORY_BUDGET_MB,
    DEFAULT_SESSION_TTL_S,
    TOKEN_ENV,
)
from .common import (
    add_model_args,
    check_one_source,
    family,
    load_model,
    parse_confidence_threshold,
    positive,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``serve``."""
    s = sub.add_parser(
        "serve",
        help="web page and HTTP API for interactive segmentation (loopback by default)",
        description="Serve a web page and an HTTP API: upload an image once, then prompt it "
        "with points, boxes or a previous mask. The OpenAPI schema is at /openapi.json.",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    s.add_argument(
        "--token",
        default=None,
        help="require 'Authorization: Bearer TOKEN' on every API route (the page reads it "
        f"from the printed address's #token=...); default: ${TOKEN_ENV}, which keeps it out "
        "of the process list",
    )
    s.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer to besides the address bound, localhost, 127.0.0.1 and "
        "[::1] (others are refused against DNS rebinding); repeatable; '*' for any",
    )
    s.add_argument(
        "--exported",
        default=None,
        metavar="DIR",
        help="run a 'paddle-sam export' folder with Paddle Inference (no 'everything' mode)",
    )
    s.add_argument(
        "--memory-budget-mb",
        type=positive(float),
        default=DEFAULT_MEMORY_BUDGET_MB,
        help="bytes all sessions may hold (images, embeddings, last answers); least recently "
        "used sessions are evicted beyond it (default: %(default)s)",
    )
    s.add_argument(
        "--max-image-pixels",
        type=positive(int),
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="refuse larger uploads (default: %(default)s)",
    )
    s.add_argument(
        "--max-upload-mb",
        type=positive(float),
        default=DEFAULT_MAX_UPLOAD_MB,
        help="refuse larger files (default: %(default)s)",
    )
    s.add_argument(
        "--max-queued-jobs",
        type=positive(int),
        default=DEFAULT_MAX_QUEUED_JOBS,
        help="'everything' jobs waiting or running at once; more are refused with 429 "
        "(default: %(default)s)",
    )
    s.add_argument(
        "--session-ttl",
        type=positive(float),
        default=DEFAULT_SESSION_TTL_S,
        metavar="SECONDS",
        help="drop sessions idle this long (default: %(default)s)",
    )
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_model_args(s, families=("sam_v1", "sam3"))
    s.add_argument(
        "--bpe",
        default=None,
        metavar="PATH",
        help="SAM 3 only: the text tokenizer's BPE vocabulary (default: the bundled one)",
    )
    s.add_argument(
        "--confidence-threshold",
        type=parse_confidence_threshold,
        default=0.5,
        help="SAM 3 only: keep instances scoring above this, in [0, 1) (default: %(default)s)",
    )
    s.set_defaults(func=cmd_serve)


def _check_port(host: str, port: int) -> None:
    """A clear error for a taken port, before the slow model load."""
    address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(address_family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is already in use; pick --port") from None
            raise ValueError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None


def _exposure_warning(host: str, port: int, token: str | None) -> str | None:
    """What binding ``host`` without loopback exposes, or None on loopback."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    where = f"{host}:{port}"
    if token is None:
        return (
            f"paddle-sam serve: warning: listening on {where} without a token: anyone who "
            "can reach this address can upload images and run the model on them (CPU time, "
            "and memory up to --memory-budget-mb), prompt, download and delete any session "
            "whose id they hold, start 'everything' jobs and read /health (the model and its "
            f"limits). Pass --token TOKEN or set {TOKEN_ENV} to require a token."
        )
    return (
        f"paddle-sam serve: note: listening on {where} with a token; plain HTTP is not "
        "encrypted: the token and the images cross the network readable by anyone on the "
        "path (put a TLS proxy in front on a network you do not trust)"
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..serve import create_app
    from ..serve.guard import check_token

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    check_token(token)
    _check_port(args.host, args.port)
    warning = _exposure_warning(args.host, args.port, token)
    if warning is not None:
        print(warning, file=sys.stderr)
    sam3 = family(args) == "sam3"
    if not sam3 and (args.bpe is not None or args.confidence_threshold != 0.5):
        raise ValueError("--bpe and --confidence-threshold apply to --model-type sam3 only")
    if sam3:
        from ..build.sam3 import load_sam3_predictor

        if args.exported is not None:
            raise ValueError("SAM 3 is served from --checkpoint only (no exported SAM 3 yet)")
        if args.checkpoint is None:
            raise ValueError("--model-type sam3 needs --checkpoint (sam3.pt or a .pdparams)")
        model = load_sam3_predictor(args.checkpoint, args.bpe, args.confidence_threshold)
    elif args.exported is not None:
        from ..deploy import StaticSamPredictor

        check_one_source(args)
        model = StaticSamPredictor(args.exported)
    else:
        model = load_model(args)
    app = create_app(
        model,
        model_type=args.model_type,
        memory_budget_mb=args.memory_budget_mb,
        max_image_pixels=args.max_image_pixels,
        max_upload_mb=args.max_upload_mb,
        session_ttl_s=args.session_ttl,
        token=token,
        allowed_hosts=args.allow_host,
        max_queued_jobs=args.max_queued_jobs,
    )
    host = f"[{args.host}]" if ":" in args.host else args.host
    page = f"http://{host}:{args.port}/" + (f"#token={token}" if token else "")
    print(f"paddle-sam serve: {page} (Ctrl+C to stop)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
