"""The exception the actors raise of their own (wrong types and values raise TypeError/ValueError)."""

from __future__ import annotations

from shmpad.errors import ShmpadError

__all__ = ["EnvWorkerError"]


class EnvWorkerError(ShmpadError):
    """An environment worker died, raised or hung; the message carries its report
    (the environment's traceback, the signal that killed it, or its stack when hung).

    ``worker`` is the worker's index, ``report`` the text the worker left, if any."""

    def __init__(self, message: str, worker: int = -1, report: str = ""):
        super().__init__(message)
        self.worker = worker
        self.report = report
