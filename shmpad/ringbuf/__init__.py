"""Lock-free shared-memory rings, the versioned weight store, and what they stand on."""

from shmpad.ringbuf.mpmc import MPMCRing
from shmpad.ringbuf.batch import MessageBatch
from shmpad.ringbuf.ring import RingStatistics
from shmpad.shm.segment import Segment
from shmpad.ringbuf.spsc import SPSCRing
from shmpad.ringbuf.typed import TypedRing
from shmpad.ringbuf.weights import WeightStore
from shmpad.ringbuf.weights import WeightStoreStatistics

__all__ = [
    "MPMCRing",
    "MessageBatch",
    "RingStatistics",
    "SPSCRing",
    "Segment",
    "TypedRing",
    "WeightStore",
    "WeightStoreStatistics",
]
