"""The service's log: ``paddle_sam.serve.*`` loggers (sessions created and dropped, background
jobs started, finished or failed with their traceback, requests that failed with a 500).

Nothing here runs at import: a program that embeds ``create_app`` configures ``logging`` as it
likes; ``paddle-sam serve`` calls :func:`configure_logging` with its ``--log-level``.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error")


class StderrHandler(logging.StreamHandler):
    """A stream handler on whatever ``sys.stderr`` is when a record is written (it may have
    been replaced since the handler was made)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it; sys.stderr is read instead
        pass


def configure_logging(level: str) -> logging.Logger:
    """Write the ``paddle_sam`` loggers' records of ``level`` (debug, info, warning, error)
    and above to stderr, one line each (a traceback after its line), and only there: not
    to the root logger's handlers too (importing Paddle gives the root logger one, which would
    print each record a second time). Calling it again replaces the handler it added."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    logger = logging.getLogger("paddle_sam")
    for h in [h for h in logger.handlers if isinstance(h, StderrHandler)]:
        logger.removeHandler(h)
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger


__all__ = ["configure_logging"]
