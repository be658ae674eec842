"""The exceptions shmpad raises of its own. Every layer imports them from here.

Wrong types raise ``TypeError`` and bad values ``ValueError``; these cover what
those two cannot say.
"""

from __future__ import annotations

__all__ = [
    "ShmpadError",
    "Closed",
    "WouldBlock",
    "Timeout",
    "SegmentError",
    "NodeFailed",
    "AuthError",
    "FrameError",
    "Abandoned",
    "RemoteError",
]


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
        if exit_code is not None and exit_code < 0:
            import signal

            try:
                how = f"was killed by {signal.Signals(-exit_code).name}"
            except ValueError:
                how = f"was killed by signal {-exit_code}"
        elif exit_code is not None:
            how = f"exited with code {exit_code}"
        else:
            how = "raised"
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
