"""Defaults of the service's limits, shared by the app and its command line."""

DEFAULT_MEMORY_BUDGET_MB = 2048  # sessions: images, embeddings (4 MiB each for SAM v1), answers
DEFAULT_MAX_IMAGE_PIXELS = 25_000_000  # 75 MB decoded as RGB; a typical camera is 12-24 MP
DEFAULT_MAX_UPLOAD_MB = 50
DEFAULT_SESSION_TTL_S = 3600.0
