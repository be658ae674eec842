"""What a launched program prints: every node's output line by line, each line
prefixed ``[label/i]``, and the launcher's own messages, written straight to the
descriptors so that lines from different sources never interleave mid-line."""

from __future__ import annotations

import os

__all__ = ["Lines", "say", "write_fd"]


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


def write_fd(fd: int, data: bytes) -> None:
    """Whole lines straight to the descriptor: going through ``sys.stdout`` would put
    them between the two writes of a ``print()`` in another thread of the launcher."""
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
