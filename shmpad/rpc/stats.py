"""A shared-memory server's call statistics: a tiny segment beside its request ring,
which ``python -m shmpad.top`` reads to show each courier's latency.

The segment is named after the request ring (``<ring name>.calls``, kind
``"rpcstats"``) and made by whoever makes the ring for a server that lives in
another process (a ``CourierNode`` in the launcher, so that the counts outlive a
SIGKILLed server and a restarted one goes on counting), or by an ``RpcServer`` that
makes its own ring. A server that serves a ring without one counts nothing.

Data area (8-byte words, one 64-byte line)::

    word  contents
    0     STARTED: updates begun
    1     CALLS: calls answered (counted when the reply is ready to put, so a caller
          that has its reply finds its call counted)
    2     SERVICE_NS: nanoseconds from a server starting each call (decoding its
          request) to its reply being ready, summed (the handler's time, and a
          batched call's wait for its batch)
    3     LATENCY_NS: nanoseconds from the caller's send (its CLOCK_MONOTONIC stamp in
          the request) to the reply being ready, summed (queue wait + service)
    4     FINISHED: updates finished

Every server thread or process adds to the words with atomic adds, STARTED first and
FINISHED last, so a reader that loads FINISHED, the counters, then STARTED and sees
the two equal read one consistent set (no update was in progress or began meanwhile:
FINISHED <= STARTED at every moment). A writer killed mid-update leaves STARTED ahead
for good; a reader then gives up waiting after a bounded spin and reads the counters
as they are (off by at most that one call). A call costs the server five uncontended
atomic adds on a line no ring operation touches.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from shmpad.errors import SegmentError
from shmpad.shm.atomics import fence_acquire, fetch_add, load_acquire, load_relaxed
from shmpad.shm.compiled import fast_entry
from shmpad.shm.segment import Segment

__all__ = ["CallStats", "stats_name"]

KIND = "rpcstats"
SUFFIX = ".calls"
_STARTED, _CALLS, _SERVICE_NS, _LATENCY_NS, _FINISHED = range(5)
_WORDS = 8
_READ_TRIES = 1000


def stats_name(ring_name: str) -> str:
    """The name of the statistics segment of the request ring ``ring_name``."""
    return ring_name + SUFFIX


# Not nogil: releasing the GIL for five adds would cost more than they do, and would hand
# the interpreter to another thread of the server in the middle of answering a call.
@njit(cache=True)
def _record(words, service_ns, latency_ns):
    fetch_add(words, _STARTED, 1)  # acq_rel: before the counters change (pairs with the load in _read)
    fetch_add(words, _CALLS, 1)
    fetch_add(words, _SERVICE_NS, service_ns)
    fetch_add(words, _LATENCY_NS, latency_ns)
    fetch_add(words, _FINISHED, 1)  # acq_rel: after the counters changed (pairs with load_acquire in _read)


@njit(nogil=True, cache=True)
def _read(words, out, tries):
    for _ in range(tries):
        finished = load_acquire(words, _FINISHED)  # pairs with the last fetch_add in _record
        out[0] = load_relaxed(words, _CALLS)
        out[1] = load_relaxed(words, _SERVICE_NS)
        out[2] = load_relaxed(words, _LATENCY_NS)
        fence_acquire()  # the counters are read before STARTED is
        if load_relaxed(words, _STARTED) == finished:
            return True
    return False


class CallStats:
    """One handle on a request ring's call statistics: ``create`` / ``attach`` by the
    ring's name; servers ``record``, readers ``read``."""

    def __init__(self, segment: Segment):
        if segment.data.nbytes < _WORDS * 8:
            raise SegmentError(
                f"call statistics {segment.name!r} are damaged: {segment.data.nbytes} data bytes, need {_WORDS * 8}"
            )
        self._seg = segment
        self._words = segment.data[: _WORDS * 8].view("int64")
        self.name = segment.name
        # load the compiled kernels now (tens of ms from numba's cache), not in the first call served
        scratch = np.zeros(_WORDS, np.int64)
        _record(scratch, 0, 0)
        _read(scratch, scratch[:3], 1)
        self._record = fast_entry(_record, self._words, 0, 0)  # a call served skips numba's type dispatch

    @classmethod
    def create(cls, ring_name: str) -> "CallStats":
        """New statistics for the request ring ``ring_name``, owned by this process
        (``close`` removes them)."""
        return cls(Segment.create(KIND, {"ring": ring_name}, _WORDS * 8, name=stats_name(ring_name)))

    @classmethod
    def attach(cls, ring_name: str) -> "CallStats | None":
        """The statistics of the request ring ``ring_name``, or None if it has none."""
        try:
            return cls(Segment.attach(stats_name(ring_name), KIND))
        except SegmentError:
            return None

    def record(self, taken_ns: int, sent_ns: int) -> None:
        """Count one answered call, started at ``taken_ns`` and sent by its
        caller at ``sent_ns`` (both ``time.monotonic_ns()``, which is CLOCK_MONOTONIC:
        one clock for every process of the host)."""
        words = self._words
        if words is None:
            return
        now = time.monotonic_ns()
        self._record(words, now - taken_ns, max(now - sent_ns, 0))

    def read(self) -> tuple[int, int, int]:
        """``(calls, service_ns, latency_ns)`` since the statistics were made."""
        out = np.zeros(3, np.int64)
        _read(self._words, out, _READ_TRIES)
        return int(out[0]), int(out[1]), int(out[2])

    def close(self) -> None:
        """Unmap (and, in the creating process, remove the name). Idempotent."""
        self._words = None
        self._seg.close()
