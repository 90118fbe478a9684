"""``paddle-sam serve``: the argument parser and the command."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket
import sys
from collections.abc import Callable

from .config import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_UPLOAD_MB,
    DEFAULT_MEMORY_BUDGET_MB,
    DEFAULT_SESSION_TTL_S,
)


def _positive(kind: type) -> Callable[[str], float | int]:
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return v

    return parse


def add_parser(sub, model_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``serve`` on the subcommand set of ``paddle-sam``."""
    s = sub.add_parser(
        "serve",
        help="web page and HTTP API for interactive segmentation (loopback by default)",
        description="Serve a web page and an HTTP API: upload an image once, then prompt it "
        "with points, boxes or a previous mask. The OpenAPI schema is at /openapi.json.",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    s.add_argument(
        "--exported",
        default=None,
        metavar="DIR",
        help="run a 'paddle-sam export' folder with Paddle Inference (no 'everything' mode)",
    )
    s.add_argument(
        "--memory-budget-mb",
        type=_positive(float),
        default=DEFAULT_MEMORY_BUDGET_MB,
        help="bytes all sessions may hold (images, embeddings, last answers); least recently "
        "used sessions are evicted beyond it (default: %(default)s)",
    )
    s.add_argument(
        "--max-image-pixels",
        type=_positive(int),
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="refuse larger uploads (default: %(default)s)",
    )
    s.add_argument(
        "--max-upload-mb",
        type=_positive(float),
        default=DEFAULT_MAX_UPLOAD_MB,
        help="refuse larger files (default: %(default)s)",
    )
    s.add_argument(
        "--session-ttl",
        type=_positive(float),
        default=DEFAULT_SESSION_TTL_S,
        metavar="SECONDS",
        help="drop sessions idle this long (default: %(default)s)",
    )
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    model_args(s)
    # SAM 3 joins the model types here (segment, everything and export are SAM v1 only)
    for action in s._actions:
        if action.dest == "model_type" and action.choices is not None:
            action.choices = [*action.choices, "sam3"]
            action.help = "sam3: SAM 3 (text and box prompts); default: from the checkpoint"
    s.add_argument(
        "--bpe",
        default=None,
        metavar="PATH",
        help="SAM 3 only: the text tokenizer's BPE vocabulary (default: the bundled one)",
    )
    s.add_argument(
        "--confidence-threshold",
        type=float,
        default=0.5,
        help="SAM 3 only: keep instances scoring above this (default: %(default)s)",
    )
    s.set_defaults(func=cmd_serve)


def _check_port(host: str, port: int) -> None:
    """A clear error for a taken port, before the slow model load."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is already in use; pick --port") from None
            raise ValueError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None


def cmd_serve(args) -> int:
    import uvicorn

    from ..cli import _load_model
    from .app import create_app

    _check_port(args.host, args.port)
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback:
        print(
            f"paddle-sam serve: warning: binding {args.host}: the service has no "
            "authentication; anyone who can reach this address can use it",
            file=sys.stderr,
        )
    sam3 = args.model_type == "sam3"
    if not sam3 and (args.bpe is not None or args.confidence_threshold != 0.5):
        raise ValueError("--bpe and --confidence-threshold apply to --model-type sam3 only")
    if sam3:
        from ..build.sam3 import load_sam3_predictor

        if args.exported is not None:
            raise ValueError("SAM 3 is served from --checkpoint only (no exported SAM 3 yet)")
        if args.checkpoint is None:
            raise ValueError("--model-type sam3 needs --checkpoint (sam3.pt or a .pdparams)")
        if not 0.0 <= args.confidence_threshold < 1.0:
            raise ValueError(
                f"--confidence-threshold must be in [0, 1), got {args.confidence_threshold}"
            )
        model = load_sam3_predictor(args.checkpoint, args.bpe, args.confidence_threshold)
    elif args.exported is not None:
        from ..deploy import StaticSamPredictor

        if args.checkpoint is not None:
            raise ValueError("give either --checkpoint or --exported, not both")
        model = StaticSamPredictor(args.exported)
    else:
        model = _load_model(args)
    app = create_app(
        model,
        model_type=args.model_type,
        memory_budget_mb=args.memory_budget_mb,
        max_image_pixels=args.max_image_pixels,
        max_upload_mb=args.max_upload_mb,
        session_ttl_s=args.session_ttl,
    )
    print(f"paddle-sam serve: http://{args.host}:{args.port}/ (Ctrl+C to stop)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
