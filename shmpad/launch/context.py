"""Where a piece of code runs: which program, which node, and how it stops.

Every process of a launched program (and, under the thread launch types, every
node thread) has a ``NodeContext``. Its ``StopController`` is the program's stop
as seen from here: ``request()`` asks the launcher to stop the program (one byte
down an inherited pipe) and ``trigger()`` is how the stop arrives (the launcher
closes the stop pipe, a watcher thread sees end-of-file, or the thread launcher
calls it directly). Stop handlers run once, in the thread that triggers, before
the event is set.
"""

from __future__ import annotations

import os
import threading
import traceback
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["NodeContext", "StopController", "current", "current_or_none", "set_process_context", "set_thread_context"]


class StopController:
    """The program's stop, seen from one process (or, under threads, one program)."""

    def __init__(self, request_fd: int | None = None, on_request: Callable[[], None] | None = None):
        self.event = threading.Event()
        self._handlers: list[Callable[[], None]] = []
        self._triggered = False
        self._lock = threading.Lock()
        self._request_fd = request_fd
        self._on_request = on_request

    def request(self) -> None:
        """Ask the launcher to stop the whole program; the stop arrives later through
        ``trigger``. Any thread may call this."""
        if self._on_request is not None:
            self._on_request()
        if self._request_fd is not None:
            try:
                os.write(self._request_fd, b"s")
            except OSError:
                self.trigger()  # the launcher is gone: stop ourselves

    def trigger(self) -> None:
        """The stop has begun: run every handler once, then set the event (so that a
        node that returns when it sees the event does not end before its handlers ran)."""
        with self._lock:
            if self._triggered:
                return
            self._triggered = True
            handlers, self._handlers = self._handlers, []
        for handler in handlers:
            try:
                handler()
            except Exception:
                traceback.print_exc()
        self.event.set()

    def register(self, handler: Callable[[], None]) -> None:
        with self._lock:
            if not self._triggered:
                self._handlers.append(handler)
                return
        handler()  # registered after the stop began: it still runs, once

    def unregister(self, handler: Callable[[], None]) -> None:
        with self._lock:
            try:
                self._handlers.remove(handler)
            except ValueError:
                pass

    def watch(self, stop_fd: int) -> threading.Thread:
        """Trigger when ``stop_fd`` (the read end of the launcher's stop pipe) reaches
        end-of-file: the launcher closed it to stop, or died."""

        def run() -> None:
            while True:
                try:
                    if not os.read(stop_fd, 64):
                        break
                except InterruptedError:
                    continue
                except OSError:
                    break
            self.trigger()

        t = threading.Thread(target=run, name="shmpad-stop-watcher", daemon=True)
        t.start()
        return t


@dataclass
class NodeContext:
    """What a node knows about where it runs."""

    program: str
    launch_type: str
    stopper: StopController
    label: str = ""
    index: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def node_name(self) -> str:
        return f"{self.label}/{self.index}"


_process_context: NodeContext | None = None
_thread = threading.local()


def set_process_context(ctx: NodeContext | None) -> None:
    """The context of this process (and of threads that have none of their own)."""
    global _process_context
    _process_context = ctx


def set_thread_context(ctx: NodeContext | None) -> None:
    """The context of the calling thread (nodes run as threads)."""
    _thread.ctx = ctx


def current_or_none() -> NodeContext | None:
    return getattr(_thread, "ctx", None) or _process_context


def current(what: str) -> NodeContext:
    ctx = current_or_none()
    if ctx is None:
        raise RuntimeError(
            f"shmpad.{what}() needs a launched program: call it from a node of a program started with "
            "shmpad.launch.launcher(), or from the process that launched it"
        )
    return ctx
