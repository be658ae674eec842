"""shmpad: a single-box, shared-memory runtime for distributed reinforcement learning."""

# Errors
from shmpad.errors import Closed
from shmpad.errors import SegmentError
from shmpad.errors import ShmpadError
from shmpad.errors import Timeout
from shmpad.errors import WouldBlock

# Shared-memory rings and the weight store
from shmpad.ringbuf import MPMCRing
from shmpad.ringbuf import MessageBatch
from shmpad.ringbuf import RingStatistics
from shmpad.ringbuf import SPSCRing
from shmpad.ringbuf import TypedRing
from shmpad.ringbuf import WeightStore
from shmpad.ringbuf import WeightStoreStatistics

__version__ = "0.1.0"

__all__ = [
    "Closed",
    "MPMCRing",
    "MessageBatch",
    "RingStatistics",
    "SPSCRing",
    "SegmentError",
    "ShmpadError",
    "Timeout",
    "TypedRing",
    "WeightStore",
    "WeightStoreStatistics",
    "WouldBlock",
]
