"""Lock-free shared-memory rings: byte rings (SPSC, MPMC) and typed rings on top of them.

``WeightStore`` and ``WeightStoreStatistics`` are reachable here too, as they were before
the weight store had its package (``shmpad.weights``): ``shmpad/__init__.py`` puts them
here, since the rings do not depend on the weight store and so never import it.
"""

from shmpad.ringbuf.mpmc import MPMCRing
from shmpad.ringbuf.batch import MessageBatch
from shmpad.ringbuf.ring import RingStatistics
from shmpad.shm.segment import Segment
from shmpad.ringbuf.spsc import SPSCRing
from shmpad.ringbuf.typed import TypedRing

__all__ = [
    "MPMCRing",
    "MessageBatch",
    "RingStatistics",
    "SPSCRing",
    "Segment",
    "TypedRing",
]
