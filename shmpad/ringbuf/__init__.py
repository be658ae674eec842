"""Lock-free shared-memory rings: byte rings (SPSC, MPMC) and typed rings on top of them.

The weight store, which stands beside the rings on the same floor, is ``shmpad.weights``
(and ``shmpad.WeightStore``)."""

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
