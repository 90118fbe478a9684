"""``paddle-sam serve``: an interactive segmentation service and its web page.

``create_label_studio_app``: the same model as a Label Studio ML backend.

Both are imported lazily so that building the CLI parser does not load FastAPI.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name in ("create_app", "create_label_studio_app"):
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["create_app", "create_label_studio_app"]
