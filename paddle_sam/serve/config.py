"""Defaults of the service's limits, shared by the app and its command line."""

DEFAULT_MEMORY_BUDGET_MB = 2048  # sessions: images, embeddings (4 MiB each for SAM v1), answers
DEFAULT_MAX_IMAGE_PIXELS = 25_000_000  # 75 MB decoded as RGB; a typical camera is 12-24 MP
DEFAULT_MAX_UPLOAD_MB = 50
DEFAULT_SESSION_TTL_S = 3600.0
DEFAULT_MAX_QUEUED_JOBS = 4  # "everything" jobs waiting or running at once (one runs at a time)
MAX_JSON_BYTES = 1 << 20  # every request body but an upload: prompts and job options are small
TOKEN_ENV = "PADDLE_SAM_TOKEN"  # the token's environment variable (instead of --token)

# the video mode (SAM 3 checkpoints with the tracker): what one uploaded video may be
DEFAULT_MAX_VIDEO_UPLOAD_MB = 200
DEFAULT_MAX_VIDEO_FRAMES = 300  # 10 s at 30 fps; every frame runs the whole model once
DEFAULT_MAX_VIDEO_SECONDS = 60.0
DEFAULT_MAX_VIDEO_PIXELS = 1920 * 1080  # per frame

# the Label Studio backend: what one download and one /predict request may cost
DEFAULT_DOWNLOAD_TIMEOUT_S = 30.0  # one image, redirects included (Label Studio waits 100 s)
DEFAULT_MAX_TASKS_PER_REQUEST = 16  # each is downloaded and embedded
DEFAULT_MAX_LABELS_PER_TASK = 32  # SAM 3 pre-labelling prompts each brush label
DEFAULT_MAX_TRACK_FRAMES = 50  # SAM 2 tracks a VideoRectangle this many frames per request
