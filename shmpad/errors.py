"""The exceptions shmpad raises of its own. Every layer imports them from here.

Wrong types raise ``TypeError`` and bad values ``ValueError``; these cover what
those two cannot say.
"""

from __future__ import annotations

__all__ = ["ShmpadError", "Closed", "WouldBlock", "Timeout", "SegmentError"]


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
