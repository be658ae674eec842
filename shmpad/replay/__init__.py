"""Replay tables in shared memory, in Reverb's vocabulary: ``Table``, its selectors
(samplers and removers) and its rate limiters."""

from shmpad.replay.table import Table
from shmpad.replay.table import TableInfo
from shmpad.replay.table import SampleBatch
from shmpad.replay.writer import Writer
from shmpad.replay.selectors import Uniform
from shmpad.replay.selectors import Prioritized
from shmpad.replay.selectors import Fifo
from shmpad.replay.selectors import Lifo
from shmpad.replay.selectors import MinHeap
from shmpad.replay.selectors import MaxHeap
from shmpad.replay.rate_limiters import RateLimiter
from shmpad.replay.rate_limiters import MinSize
from shmpad.replay.rate_limiters import SampleToInsertRatio
from shmpad.replay.rate_limiters import Queue
from shmpad.replay import rate_limiters
from shmpad.replay import selectors

__all__ = [
    "Table",
    "TableInfo",
    "SampleBatch",
    "Writer",
    "Uniform",
    "Prioritized",
    "Fifo",
    "Lifo",
    "MinHeap",
    "MaxHeap",
    "RateLimiter",
    "MinSize",
    "SampleToInsertRatio",
    "Queue",
    "rate_limiters",
    "selectors",
]
