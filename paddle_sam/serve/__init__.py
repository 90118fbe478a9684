"""``paddle-sam serve``: an interactive segmentation service and its web page.

``create_app`` is imported lazily so that building the CLI parser does not load FastAPI.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["create_app"]
