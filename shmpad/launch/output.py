"""What a launched program prints: every node's output line by line, each line
prefixed ``[label/i]``, and the launcher's own messages, written straight to the
descriptors so that lines from different sources never interleave mid-line.

While a live view is drawn at the bottom of the terminal (``launch(..., top=True)``,
``shmpad.launch.live``), ``route`` hands it the whole lines instead, and it prints them
above itself.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

__all__ = ["Lines", "say", "write_fd", "route"]

# One writer at a time, so that a write the terminal takes in parts is never split by
# another; and no write falls between a route's start or end and what it draws.
_lock = threading.Lock()
_route: Callable[[int, bytes], bool] | None = None


def _forked() -> None:
    """A forked child writes to its own descriptors: the view it would route to is the
    parent's, and the lock may have been held by a thread that did not come along."""
    global _lock, _route
    _lock, _route = threading.Lock(), None


os.register_at_fork(after_in_child=_forked)


class Lines:
    """Whole lines out of the chunks one node's pipe delivers, prefixed with the node's
    name, for stdout (``"out"``) or stderr (``"err"``)."""

    def __init__(self, name: str, kind: str):
        self._prefix = f"[{name}] ".encode()
        self._fd = 1 if kind == "out" else 2
        self._partial = b""

    def feed(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if lines:
            self._emit(lines)

    def flush(self) -> None:
        """Write an unfinished last line (the pipe reached its end)."""
        if self._partial:
            self._emit([self._partial])
            self._partial = b""

    def _emit(self, lines: list[bytes]) -> None:
        write_fd(self._fd, b"".join(self._prefix + line + b"\n" for line in lines))


def route(
    to: Callable[[int, bytes], bool] | None, first: Callable[[], None] | None = None
) -> Callable[[int, bytes], bool] | None:
    """Send what ``write_fd`` gets to ``to(fd, data)`` (whole lines; it returns False
    for a descriptor it does not take, which is then written as usual), or with None
    to the descriptors again; ``first()``, if given, runs just before the switch, with
    no write in between. Returns the route it replaced. ``to`` and ``first`` run under
    the lock that orders the writes: they must not call ``write_fd``."""
    global _route
    with _lock:
        if first is not None:
            first()
        old, _route = _route, to
    return old


def write_fd(fd: int, data: bytes) -> None:
    """Whole lines straight to the descriptor (or to the route, see ``route``): going
    through ``sys.stdout`` would put them between the two writes of a ``print()`` in
    another thread of the launcher."""
    with _lock:
        if _route is not None and _route(fd, data):
            return
        _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return
        view = view[n:]


def say(msg: str) -> None:
    write_fd(2, (msg.rstrip("\n") + "\n").encode("utf-8", "replace"))
