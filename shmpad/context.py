"""What a node sees of its program: where it runs, and how the program stops.

This is Launchpad's ``context`` module (``import shmpad as lp``; ``lp.context.LaunchType``,
``lp.context.get_context()``) and the stop API every node calls (``stop``,
``wait_for_stop``, ``stop_event``, stop handlers). It sits below both the graph
(``shmpad.nodes``, ``shmpad.program``) and the launcher (``shmpad.launch``): a node
that stops its program never imports the launcher that started it.

Every process of a launched program (and, under the thread launch types, every
node thread) has a ``NodeContext``. Its ``StopController`` is the program's stop
as seen from here: ``request()`` asks the launcher to stop the program (one byte
down an inherited pipe) and ``trigger()`` is how the stop arrives (the launcher
closes the stop pipe, a watcher thread sees end-of-file, or the thread launcher
calls it directly). Stop handlers run once, in the thread that triggers, before
the event is set. Every stop function works from any thread of a node (or of the
process that launched the program), not only from a main thread.
"""

from __future__ import annotations

import enum
import os
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = [
    "LaunchType",
    "NodeContext",
    "StopController",
    "current",
    "current_or_none",
    "get_context",
    "make_program_stopper",
    "register_stop_handler",
    "set_process_context",
    "set_thread_context",
    "stop",
    "stop_event",
    "unregister_stop_handler",
    "wait_for_stop",
]


class LaunchType(enum.Enum):
    """How ``launch()`` runs a program's nodes (``--lp_launch_type`` names them by value)."""

    LOCAL_MULTI_THREADING = "local_mt"
    LOCAL_MULTI_PROCESSING = "local_mp"
    TEST_MULTI_THREADING = "test_mt"
    TEST_MULTI_PROCESSING = "test_mp"


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
    """What a node knows about where it runs. It is also Launchpad's launch context
    (what ``get_context()`` returns): ``launch_type``, ``launch_config`` (the group's
    ``PythonProcess`` in a forked node, else None) and ``program_stopper``."""

    program: str
    launch_type: LaunchType
    stopper: StopController
    label: str = ""
    index: int = 0
    extra: dict = field(default_factory=dict)
    launch_config: Any = None

    def __post_init__(self) -> None:
        # the launcher passes the value ("local_mp"); Launchpad code compares members
        self.launch_type = LaunchType(self.launch_type)

    @property
    def node_name(self) -> str:
        return f"{self.label}/{self.index}"

    @property
    def program_stopper(self) -> Callable[[], None]:
        """Launchpad's stopper: a callable that stops this program (``stop``)."""
        return self.stopper.request


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


def get_context() -> NodeContext:
    """Launchpad's ``get_context()``: the context of the node that calls it (or of the
    process that launched the program)."""
    return current("context.get_context")


# -- stopping a program from inside it ------------------------------------------------------


def stop() -> None:
    """Ask the launcher to stop the whole program. Returns at once; every node then
    sees ``wait_for_stop()`` return True and its stop handlers run."""
    current("stop").stopper.request()


def wait_for_stop(timeout: float | None = None) -> bool:
    """Block until the program is stopping (True) or ``timeout`` seconds pass (False)."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
    return current("wait_for_stop").stopper.event.wait(timeout)


def stop_event() -> threading.Event:
    """A ``threading.Event`` that is set once the program is stopping."""
    return current("stop_event").stopper.event


def register_stop_handler(handler: Callable[[], None]) -> None:
    """Call ``handler()`` once when the program starts stopping (at once if it already
    has). Handlers run in the thread that delivers the stop."""
    if not callable(handler):
        raise TypeError(f"stop handler must be callable, got {type(handler).__name__}")
    current("register_stop_handler").stopper.register(handler)


def unregister_stop_handler(handler: Callable[[], None]) -> None:
    """Forget ``handler``; unknown handlers are ignored."""
    current("unregister_stop_handler").stopper.unregister(handler)


def make_program_stopper(launch_type: LaunchType | str) -> Callable[[], None]:
    """Launchpad's way to hand a node a stopper: a callable that stops the program it is
    called in (``stop``), for any of shmpad's launch types."""
    try:
        LaunchType(launch_type)
    except ValueError:
        raise ValueError(
            f"launch_type must be one of {[t.value for t in LaunchType]} or a LaunchType, got {launch_type!r}"
        ) from None
    return stop
