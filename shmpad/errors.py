"""The exceptions shmpad raises of its own. Every layer imports them from here.

Wrong types raise ``TypeError`` and bad values ``ValueError``; these cover what
those two cannot say.
"""

from __future__ import annotations

__all__ = [
    "describe_exit",
    "ShmpadError",
    "Closed",
    "WouldBlock",
    "Timeout",
    "SegmentError",
    "NodeFailed",
    "AuthError",
    "FrameError",
    "Abandoned",
    "EnvWorkerError",
    "RemoteError",
]


def describe_exit(exit_code: int) -> str:
    """How a process ended, in the one wording every message uses: ``exited with code 1``,
    ``was killed by signal 9 (SIGKILL)`` (``exit_code`` as ``os.waitstatus_to_exitcode``
    gives it: negative for a signal)."""
    if exit_code >= 0:
        return f"exited with code {exit_code}"
    import signal

    try:
        name = signal.Signals(-exit_code).name
    except ValueError:
        name = "unknown"
    return f"was killed by signal {-exit_code} ({name})"


class ShmpadError(Exception):
    """Base class of every exception shmpad defines."""


class Closed(ShmpadError):
    """The ring or store was closed: nothing more can be put, and a get finds nothing left."""


class WouldBlock(ShmpadError):
    """A ``*_nowait`` call found the ring full (put) or empty (get)."""


class Timeout(ShmpadError, TimeoutError):
    """A blocking call did not complete within its timeout."""


class SegmentError(ShmpadError):
    """A shared-memory segment is missing, foreign, of another kind or of another layout."""


class NodeFailed(ShmpadError, RuntimeError):
    """A node of a launched program raised or exited non-zero; the program was stopped.

    ``label`` and ``index`` name the node (``label/index``), ``exit_code`` is its
    process's exit status (negative: killed by that signal; None for a thread), and
    ``node_traceback`` the traceback it printed, if any.
    """

    def __init__(self, label: str, index: int, exit_code: int | None, node_traceback: str = ""):
        self.label = label
        self.index = index
        self.exit_code = exit_code
        self.node_traceback = node_traceback
        how = "raised" if exit_code is None else describe_exit(exit_code)
        msg = f"Error in node '{label}/{index}': it {how}"
        if node_traceback:
            msg += "\n" + node_traceback.rstrip()
        super().__init__(msg)

    def __reduce__(self):
        return (NodeFailed, (self.label, self.index, self.exit_code, self.node_traceback))


class AuthError(ShmpadError, ConnectionError):
    """A network peer failed the shared-token handshake (or there is no token to use)."""


class FrameError(ShmpadError, ConnectionError):
    """A network frame was malformed, oversized or cut short; its connection was closed."""


class Abandoned(ShmpadError):
    """A collective operation (allreduce, broadcast) was abandoned because its group changed,
    one of its members went away or it timed out. The array it worked on holds partial
    results: its caller drops them (the accumulator drops that reduction's gradients)."""


class RemoteError(ShmpadError):
    """A server raised an exception that could not be sent back as itself (it could not
    be pickled, or it was not an ``Exception``), or its reply could not be unpickled here."""


class EnvWorkerError(ShmpadError):
    """An environment worker died, raised or hung; the message carries its report
    (the environment's traceback, the signal that killed it, or its stack when hung).

    ``worker`` is the worker's index, ``report`` the text the worker left, if any."""

    def __init__(self, message: str, worker: int = -1, report: str = ""):
        super().__init__(message)
        self.worker = worker
        self.report = report
