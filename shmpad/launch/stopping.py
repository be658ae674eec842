"""Stopping a program from inside it: ``stop``, ``wait_for_stop``, ``stop_event`` and
stop handlers. Every function works from any thread of a node (or of the process
that launched the program), not only from a main thread."""

from __future__ import annotations

import threading
from typing import Callable

from shmpad.launch.context import current
from shmpad.launch.launcher import LaunchType

__all__ = [
    "make_program_stopper",
    "stop",
    "wait_for_stop",
    "stop_event",
    "register_stop_handler",
    "unregister_stop_handler",
]


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
