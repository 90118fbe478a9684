"""``paddle-sam serve``: the argument parser and the command."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import sys

from ..serve.config import (
    DEFAULT_DOWNLOAD_TIMEOUT_S,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_LABELS_PER_TASK,
    DEFAULT_MAX_QUEUED_JOBS,
    DEFAULT_MAX_TASKS_PER_REQUEST,
    DEFAULT_MAX_TRACK_FRAMES,
    DEFAULT_MAX_UPLOAD_MB,
    DEFAULT_MAX_VIDEO_FRAMES,
    DEFAULT_MAX_VIDEO_PIXELS,
    DEFAULT_MAX_VIDEO_SECONDS,
    DEFAULT_MAX_VIDEO_UPLOAD_MB,
    DEFAULT_MEMORY_BUDGET_MB,
    DEFAULT_SESSION_TTL_S,
    TOKEN_ENV,
)
from .common import (
    add_model_args,
    add_precision_arg,
    check_one_source,
    check_precision,
    exported_predictor,
    family,
    parse_confidence_threshold,
    positive,
    sam_v1_source,
    source_of,
)

LS_URL_ENV = "LABEL_STUDIO_URL"
LS_KEY_ENV = "LABEL_STUDIO_API_KEY"
BASIC_AUTH_PASS_ENV = "PADDLE_SAM_BASIC_AUTH_PASS"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``serve``."""
    s = sub.add_parser(
        "serve",
        help="web page and HTTP API for interactive segmentation (loopback by default)",
        description="Serve a web page and an HTTP API: upload an image once, then prompt it "
        "with points, boxes or a previous mask. With SAM 2, or a SAM 3 checkpoint that has the "
        "tracker (the released sam3.pt, or a .pdparams converted from it), also a video page "
        "(/video): clicks (SAM 3: also text) on any frame, propagation, downloads. The OpenAPI "
        "schema is at /openapi.json.",
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
        help="run a 'paddle-sam export' folder of SAM v1 with Paddle Inference",
    )
    add_precision_arg(s)
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
        help="'everything' jobs and video propagations waiting or running at once; more are "
        "refused with 429 (default: %(default)s)",
    )
    s.add_argument(
        "--session-ttl",
        type=positive(float),
        default=DEFAULT_SESSION_TTL_S,
        metavar="SECONDS",
        help="drop sessions idle this long (default: %(default)s)",
    )
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_model_args(s, families=("sam_v1", "sam2", "sam3"))
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
    ls = s.add_argument_group(
        "Label Studio ML backend (--label-studio): Label Studio's /health, /setup, /predict and "
        "/webhook instead of the page and its API"
    )
    ls.add_argument(
        "--label-studio",
        action="store_true",
        help="answer Label Studio as its ML backend: brush masks for keypoint and rectangle "
        "clicks, and (SAM 3) for text prompts and each brush label of the project",
    )
    ls.add_argument(
        "--label-studio-url",
        default=None,
        metavar="URL",
        help="Label Studio's address, where task images are downloaded from with its token "
        "(default: the address Label Studio sends when it first connects, kept for the "
        f"server's life; ${LS_URL_ENV})",
    )
    ls.add_argument(
        "--label-studio-api-key",
        default=None,
        metavar="KEY",
        help="the token to download them with (a legacy token or a personal access token), "
        "sent only to --label-studio-url, which it needs (default: the one Label Studio sends "
        f"when it connects; ${LS_KEY_ENV})",
    )
    ls.add_argument(
        "--allow-private-urls",
        action="store_true",
        help="also download task images from loopback, private and link-local addresses "
        "(default: refused, except Label Studio's own address)",
    )
    ls.add_argument(
        "--download-timeout",
        type=positive(float),
        default=DEFAULT_DOWNLOAD_TIMEOUT_S,
        metavar="SECONDS",
        help="the most one image download may take, redirects included (default: %(default)s)",
    )
    ls.add_argument(
        "--max-tasks-per-request",
        type=positive(int),
        default=DEFAULT_MAX_TASKS_PER_REQUEST,
        metavar="N",
        help="refuse /predict requests with more tasks, each downloaded and embedded "
        "(Retrieve Predictions sends every selected task at once; default: %(default)s)",
    )
    ls.add_argument(
        "--max-labels-per-task",
        type=positive(int),
        default=DEFAULT_MAX_LABELS_PER_TASK,
        metavar="N",
        help="SAM 3 pre-labelling prompts every brush label of the config: refuse configs with "
        "more (default: %(default)s)",
    )
    ls.add_argument(
        "--max-track-frames",
        type=positive(int),
        default=DEFAULT_MAX_TRACK_FRAMES,
        metavar="N",
        help="SAM 2 tracks a VideoRectangle this many frames past its last keyframe per request "
        "(the video limits of the video mode apply; default: %(default)s)",
    )
    ls.add_argument(
        "--basic-auth-user",
        default=None,
        metavar="NAME",
        help=f"require HTTP basic authentication with this user and the password in "
        f"${BASIC_AUTH_PASS_ENV} (Label Studio's ML backend setting 'Basic Authentication')",
    )
    video = s.add_argument_group(
        "video mode (SAM 2, or SAM 3 with its tracker: the released sam3.pt or a .pdparams "
        "converted from it)"
    )
    video.add_argument(
        "--no-video",
        action="store_true",
        help="no video mode (the image page only; the model without the video memory modules)",
    )
    video.add_argument(
        "--max-video-upload-mb",
        type=positive(float),
        default=DEFAULT_MAX_VIDEO_UPLOAD_MB,
        help="refuse larger video files (default: %(default)s)",
    )
    video.add_argument(
        "--max-video-frames",
        type=positive(int),
        default=DEFAULT_MAX_VIDEO_FRAMES,
        help="refuse videos with more frames (default: %(default)s)",
    )
    video.add_argument(
        "--max-video-seconds",
        type=positive(float),
        default=DEFAULT_MAX_VIDEO_SECONDS,
        help="refuse longer videos (default: %(default)s)",
    )
    video.add_argument(
        "--max-video-pixels",
        type=positive(int),
        default=DEFAULT_MAX_VIDEO_PIXELS,
        help="refuse videos with larger frames, width x height (default: %(default)s, 1080p)",
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
            "can reach this address can upload images (and videos, in the video mode) and run "
            "the model on them (CPU time, and memory up to --memory-budget-mb), prompt, "
            "download and delete any session whose id they hold, start 'everything' jobs and "
            "propagations and read /health (the model and its limits). Pass --token TOKEN or "
            f"set {TOKEN_ENV} to require a token."
        )
    return (
        f"paddle-sam serve: note: listening on {where} with a token; plain HTTP is not "
        "encrypted: the token, images and videos cross the network readable by anyone on the "
        "path (put a TLS proxy in front on a network you do not trust)"
    )


def _sam3_models(
    args: argparse.Namespace,
) -> tuple[object, object | None, str | None, object]:
    """SAM 3's image predictor, video predictor (or None), why there is no video mode, and the
    source: one copy of the weights when the checkpoint has the video tracker (the video
    model's detector, with the tracker's heads for clicks, serves the image page)."""
    from ..loading import image_predictor_of_video, load_image_predictor, video_predictor_or_refusal

    check_one_source(args)
    source = source_of(args, "sam3")  # a checkpoint, or an ONNX export (OpenVINO backbone)
    if source.exported and source.runtime != "openvino":
        raise ValueError(
            f"--exported {args.exported}: SAM 3 is served from a checkpoint or from its "
            "OpenVINO export ('paddle-sam export --format onnx'), not from PIR programs"
        )
    precision = {"precision": args.precision}
    if args.no_video:
        video, why = None, "the video mode is off on this server (paddle-sam serve --no-video)"
    elif args.label_studio:
        # a VideoRectangle is one object's box; SAM 3's video model takes a box as an example
        video, why = (
            None,
            (
                "SAM 3 tracks no VideoRectangle here (its video model takes a box as an example of "
                "a concept, not as one object's box): serve a SAM 2 checkpoint to track them"
            ),
        )
    else:
        video, why = video_predictor_or_refusal(source, bpe=args.bpe, **precision)
        if video is None and not source.lacks("video"):  # the tracker failed to build
            print(f"paddle-sam serve: note: no video mode: {why}", file=sys.stderr)
            why = f"this server's SAM 3 checkpoint has no video mode: {why}"
    if video is not None:
        return image_predictor_of_video(video, args.confidence_threshold), video, None, source
    image = load_image_predictor(
        source, bpe=args.bpe, confidence_threshold=args.confidence_threshold, **precision
    )
    return image, None, why, source


def _sam2_models(
    args: argparse.Namespace,
) -> tuple[object, object | None, str | None, object]:
    """SAM 2's image predictor, video predictor (None with --no-video), why there is no video
    mode, and the source: one model serves both pages, or the Label Studio backend's images
    and video tracking (SAM 2's weights are one model)."""
    from ..loading import image_predictor_of_video, load_image_predictor, load_video_predictor

    check_one_source(args)
    source = source_of(args, "sam2")  # a checkpoint, or an export (image encoder on OpenVINO)
    options = {"model_type": args.model_type, "precision": args.precision}
    if args.no_video:
        why = "the video mode is off on this server (paddle-sam serve --no-video)"
        return load_image_predictor(source, **options), None, why, source
    video = load_video_predictor(source, **options)
    return image_predictor_of_video(video), video, None, source


def _label_studio_options(args: argparse.Namespace, token: str | None) -> dict:
    """The Label Studio backend's options, checked before the slow model load."""
    if not args.label_studio:
        given = [
            flag
            for flag, v, default in (
                ("--label-studio-url", args.label_studio_url, None),
                ("--label-studio-api-key", args.label_studio_api_key, None),
                ("--basic-auth-user", args.basic_auth_user, None),
                ("--allow-private-urls", args.allow_private_urls, False),
                ("--download-timeout", args.download_timeout, DEFAULT_DOWNLOAD_TIMEOUT_S),
                (
                    "--max-tasks-per-request",
                    args.max_tasks_per_request,
                    DEFAULT_MAX_TASKS_PER_REQUEST,
                ),
                ("--max-labels-per-task", args.max_labels_per_task, DEFAULT_MAX_LABELS_PER_TASK),
                ("--max-track-frames", args.max_track_frames, DEFAULT_MAX_TRACK_FRAMES),
            )
            if v != default
        ]
        if given:
            raise ValueError(f"{', '.join(given)} apply to --label-studio only")
        return {}
    if token is not None:
        raise ValueError(
            "--label-studio takes no --token (Label Studio cannot send one): protect it with "
            f"--basic-auth-user and ${BASIC_AUTH_PASS_ENV}"
        )
    url = args.label_studio_url or os.environ.get(LS_URL_ENV) or None
    if url is not None:
        from ..serve.errors import ServiceError
        from ..serve.fetch import origin_of

        try:
            origin_of(url)
        except ServiceError as exc:
            raise ValueError(f"--label-studio-url: {exc.detail}") from None
    key = args.label_studio_api_key or os.environ.get(LS_KEY_ENV) or None
    if key is not None and url is None:
        raise ValueError(
            f"--label-studio-api-key (or ${LS_KEY_ENV}) needs --label-studio-url (or "
            f"${LS_URL_ENV}): the key is sent only to that address, never to the one a "
            "/setup request names"
        )
    basic = None
    if args.basic_auth_user is not None:
        password = os.environ.get(BASIC_AUTH_PASS_ENV)
        if not password:
            raise ValueError(f"--basic-auth-user needs the password in ${BASIC_AUTH_PASS_ENV}")
        basic = (args.basic_auth_user, password)
    return {
        "label_studio_url": url,
        "api_key": key,
        "basic_auth": basic,
        "allow_private_urls": args.allow_private_urls,
        "download_timeout_s": args.download_timeout,
        "max_tasks": args.max_tasks_per_request,
        "max_labels": args.max_labels_per_task,
        "max_track_frames": args.max_track_frames,
    }


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..serve import create_app
    from ..serve.guard import check_token
    from ..serve.logs import configure_logging

    configure_logging(args.log_level)  # the paddle_sam loggers; uvicorn's get it below
    check_precision(args)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    check_token(token)
    ls_options = _label_studio_options(args, token)
    _check_port(args.host, args.port)
    warning = _exposure_warning(args.host, args.port, token or ls_options.get("basic_auth"))
    if warning is not None:
        print(warning, file=sys.stderr)
    kind = family(args)
    sam3 = kind == "sam3"
    if not sam3 and (args.bpe is not None or args.confidence_threshold != 0.5):
        raise ValueError("--bpe and --confidence-threshold apply to --model-type sam3 only")
    video = video_refusal = source = None
    if sam3:
        model, video, video_refusal, source = _sam3_models(args)
    elif kind == "sam2":
        model, video, video_refusal, source = _sam2_models(args)
    elif args.exported is not None:
        check_one_source(args)
        model = exported_predictor(args.exported, precision=args.precision)
    else:
        from ..loading import load_image_predictor

        source = sam_v1_source(args)
        model = load_image_predictor(source, model_type=args.model_type)
    common = {
        "model_type": args.model_type,
        "memory_budget_mb": args.memory_budget_mb,
        "max_image_pixels": args.max_image_pixels,
        "max_upload_mb": args.max_upload_mb,
        "session_ttl_s": args.session_ttl,
        "allowed_hosts": args.allow_host,
    }
    host = f"[{args.host}]" if ":" in args.host else args.host
    if args.label_studio:
        from ..serve import create_label_studio_app

        video_options = {
            "max_video_upload_mb": args.max_video_upload_mb,
            "max_video_frames": args.max_video_frames,
            "max_video_seconds": args.max_video_seconds,
            "max_video_pixels": args.max_video_pixels,
        }
        app = create_label_studio_app(
            model, **common, **ls_options, video=video, video_refusal=video_refusal, **video_options
        )
        print(
            f"paddle-sam serve: Label Studio ML backend at http://{host}:{args.port} (add it "
            "in the project's settings, Model; Ctrl+C to stop)",
            file=sys.stderr,
        )
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
        return 0
    app = create_app(
        model,
        **common,
        token=token,
        max_queued_jobs=args.max_queued_jobs,
        video=video,
        video_refusal=video_refusal,
        max_video_upload_mb=args.max_video_upload_mb,
        max_video_frames=args.max_video_frames,
        max_video_seconds=args.max_video_seconds,
        max_video_pixels=args.max_video_pixels,
        source=source,
    )
    page = f"http://{host}:{args.port}/" + (f"#token={token}" if token else "")
    print(f"paddle-sam serve: {page} (Ctrl+C to stop)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
