"""Paddle's own logs kept out of a user's console (``paddle-sam --verbose`` keeps them).

Paddle's C++ core writes glog lines to the process's stderr (``W1204 04:32:14.795897 13121
eager_utils.cc:3584] Paddle static graph(PIR) not support input out tensor for now!!!!!``) and
its Python side raises UserWarnings about its internals. Neither is about what the user asked
for. The glog level is read once, when Paddle's library loads, before the CLI runs; so instead
file descriptor 2 is passed through a pipe for the command's duration, and a thread forwards
everything but glog's info and warning lines (errors and fatal ones still pass), progress bars
included, as they come.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import warnings
from collections.abc import Iterator

# glog's prefix: severity I/W/E/F, mmdd hh:mm:ss.uuuuuu, thread id, file:line]
GLOG_QUIET = re.compile(rb"^[IW]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^ \]]+:\d+\] ")


def _forward(read_fd: int, out_fd: int) -> None:
    with contextlib.suppress(OSError):  # the pipe closed under it: the command is over
        _copy(read_fd, out_fd)


def _copy(read_fd: int, out_fd: int) -> None:
    pending = b""
    while chunk := os.read(read_fd, 65536):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        kept = [line + b"\n" for line in lines if not GLOG_QUIET.match(line)]
        if b"\r" in pending and not GLOG_QUIET.match(pending):  # a progress bar: now
            head, _, pending = pending.rpartition(b"\r")
            kept.append(head + b"\r")
        if kept:
            os.write(out_fd, b"".join(kept))
    if pending and not GLOG_QUIET.match(pending):
        os.write(out_fd, pending)


@contextlib.contextmanager
def quiet_paddle(verbose: bool) -> Iterator[None]:
    """Within: Paddle's glog info/warning lines and its Python warnings are dropped, unless
    ``verbose``."""
    if verbose:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"paddle(\.|$)")
        try:
            saved = os.dup(2)
            read_fd, write_fd = os.pipe()
        except OSError:  # no stderr to filter (a closed fd 2): nothing to quiet
            yield
            return
        thread = threading.Thread(target=_forward, args=(read_fd, saved), daemon=True)
        thread.start()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        try:
            yield
        finally:
            import sys

            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)  # the pipe's last writer gone: the thread drains and ends
            thread.join(timeout=5)
            os.close(read_fd)
            os.close(saved)
