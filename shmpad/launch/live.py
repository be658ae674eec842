"""The live view at the bottom of the launching terminal (``launch(..., top=True)``,
``python -m bench.impala --top``), with the program's output scrolling above it.

The nodes' ``[label/i]`` lines reach the terminal through ``shmpad.launch.output``;
while the view is on, ``output.route`` hands them here instead of to the terminal: they
queue, and the view's thread prints them above the view (``rich.live.Live`` redraws the
view under whatever is printed) at most every ``_PRINT_S``, so a chatty node costs one
redraw per batch, not per line. A line is printed whole or not yet: the queue holds
the whole lines ``write_fd`` was given. Only descriptors that are this terminal are
routed: a stderr sent to a file stays in the file.

``stop()`` (the launcher calls it when the program has ended, before ``wait()``
returns) prints what is left, draws the last sample, gives the descriptors back and
joins the thread: nothing is lost, the cursor is shown again, no thread stays.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from shmpad.launch import output
from shmpad.top.sample import Sampler
from shmpad.top.view import render

__all__ = ["LiveView", "terminal_fds"]

_PRINT_S = 0.05
_JOIN_S = 10.0


def terminal_fds(console: Console) -> tuple[int, ...]:
    """The launcher's output descriptors (1, 2) that are the terminal the view is on."""
    try:
        view_fd = console.file.fileno()
        view = os.fstat(view_fd)
    except (AttributeError, OSError, ValueError):
        return ()
    fds = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if os.isatty(fd) and (st.st_dev, st.st_ino, st.st_rdev) == (view.st_dev, view.st_ino, view.st_rdev):
            fds.append(fd)
    return tuple(fds)


class LiveView:
    """Draws ``registry_name``'s program every ``interval`` seconds on ``console`` (by
    default this process's stdout) and prints the lines of descriptors ``fds`` (by
    default: those that are the console's terminal) above it, until ``stop()``."""

    def __init__(
        self,
        registry_name: str,
        interval: float = 1.0,
        console: Console | None = None,
        fds: tuple[int, ...] | None = None,
    ):
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(f"interval must be a number of seconds, got {type(interval).__name__}")
        if not 0.05 <= interval <= 3600:
            raise ValueError(f"interval must be between 0.05 and 3600 seconds, got {interval}")
        self._console = Console() if console is None else console
        self._fds = frozenset(terminal_fds(self._console) if fds is None else fds)
        self._interval = float(interval)
        self._sampler = Sampler(registry_name)
        self._pending: deque[bytes] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._live = Live(
            render(self._sampler.sample()),
            console=self._console,
            auto_refresh=False,
            transient=False,
            redirect_stdout=False,  # a node forked later would inherit the proxy and draw the view too
            redirect_stderr=False,
        )
        self._live.start(refresh=True)
        self._replaced = output.route(self._take)
        self._thread = threading.Thread(target=self._run, name="shmpad-top-view", daemon=True)
        self._thread.start()

    def _take(self, fd: int, data: bytes) -> bool:
        """``output``'s route (runs under its lock): queue the lines of our descriptors."""
        if fd not in self._fds:
            return False
        self._pending.append(data)
        self._wake.set()
        return True

    def _print_pending(self) -> None:
        chunks = []
        while self._pending:
            chunks.append(self._pending.popleft())
        if chunks:
            text = b"".join(chunks).decode("utf-8", "replace").rstrip("\n")
            self._console.print(Text.from_ansi(text), soft_wrap=True, highlight=False)

    def _run(self) -> None:
        next_sample = time.monotonic() + self._interval
        while not self._stopping.is_set():
            self._wake.wait(max(0.0, next_sample - time.monotonic()))
            if self._stopping.is_set():
                return
            self._wake.clear()
            self._print_pending()
            if time.monotonic() >= next_sample:
                next_sample = time.monotonic() + self._interval
                self._draw()
            else:
                time.sleep(_PRINT_S)  # lines coming fast are printed in batches

    def _draw(self) -> None:
        try:
            view: Any = render(self._sampler.sample())
        except Exception as e:  # the program ended under us: say so, keep the output flowing
            view = Text(f"shmpad top: cannot read the program: {e}")
        self._live.update(view, refresh=True)

    def stop(self) -> None:
        """Print the lines still queued, draw a last sample, and give the terminal back.
        Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)
        output.route(self._replaced, first=self._last_frame)
        self._sampler.close()

    def _last_frame(self) -> None:
        self._print_pending()
        self._draw()
        self._live.stop()
