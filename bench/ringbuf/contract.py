"""What one ring-throughput measurement is (``Plan``), what its consumer counts
(``Tally``), the interface every subject of ``bench.ringbuf`` follows (``Subject``, see
``bench/ringbuf/peers.py`` for the contract) and the send and receive loops they share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from time import perf_counter
from typing import Callable, ClassVar, NamedTuple

import numpy as np

from bench.common import subject

__all__ = ["END", "Plan", "Subject", "Tally", "idler", "receive_until_ends", "send_for"]

# The end marker of the byte transports: every payload is at least 2 bytes, so a
# 1-byte message can only be the end.
END = b"\x00"


@dataclass(frozen=True)
class Plan:
    """What one measurement asks of a subject."""

    size: int
    """bytes per message"""
    producers: int
    """producer processes; there is always one consumer"""
    seconds: float
    """each producer sends for this long after the start barrier"""
    capacity: int
    """messages of buffering the transport gets, shared by all producers"""
    batch: int
    """messages per call for the batch subjects"""

    @property
    def capacity_per_producer(self) -> int:
        """Buffering of each producer's own channel, for subjects with one per producer."""
        return max(2, self.capacity // self.producers)

    @property
    def chunk(self) -> int:
        """Messages sent between two looks at the clock (keeps the clock off the profile)."""
        return max(1, 4096 // self.size)

    def payload(self) -> np.ndarray:
        """The message every producer sends: [size] uint8, first and last bytes differ."""
        return (np.arange(self.size, dtype=np.int64) % 251 + 1).astype(np.uint8)

    def message(self) -> bytes:
        return self.payload().tobytes()


class Tally(NamedTuple):
    """What the consumer saw."""

    received: int
    """payload messages received in all"""
    timed: int
    """payload messages received after the first receive call returned"""
    t_first: float
    """perf_counter() when the first receive call returned"""
    t_last: float
    """perf_counter() when the last end marker arrived"""
    intact: bool
    """the last payload the consumer read equals the one sent"""


class Subject(subject.Subject):
    """Base of every measured transport; see the module docstring for the contract."""

    family: ClassVar[str]  # "shmpad", "peer" or "ceiling"
    reads: ClassVar[str]  # what the consumer does with each message
    plan: Plan

    def prepare_consumer(self) -> None:
        pass

    def produce(self, index: int) -> int:
        raise NotImplementedError

    def consume(self) -> Tally:
        raise NotImplementedError


def send_for(send: Callable, msg, plan: Plan) -> int:
    """Call ``send(msg)`` for ``plan.seconds``; return how many messages went out."""
    chunk = plan.chunk
    stop = perf_counter() + plan.seconds
    sent = 0
    while perf_counter() < stop:
        for _ in range(chunk):
            send(msg)
        sent += chunk
    return sent


def receive_until_ends(recv: Callable[[], bytes], plan: Plan) -> Tally:
    """Call ``recv()`` until every producer's end marker came; messages are ``bytes``-like."""
    size = plan.size
    msg = recv()
    t_first = perf_counter()
    received, ends, last = (1, 0, msg) if len(msg) == size else (0, 1, None)
    first = received
    while ends < plan.producers:
        msg = recv()
        if len(msg) == size:
            received += 1
            last = msg
        else:
            ends += 1
    t_last = perf_counter()
    intact = last is not None and bytes(last) == plan.message()
    return Tally(received, received - first, t_first, t_last, intact)


def idler(spins: int = 64) -> Callable[[], None]:
    """What a spinning side calls each time it finds nothing to do: nothing, except
    that every ``spins``-th call yields the CPU.

    Pure spinning starves a peer that is waiting for a core (every busy machine
    has one sometimes; 4->1 on 2 cores always); yielding at once hands the core to
    any other program for the rest of a time slice. On the noisy 2-core machine
    this was written on, each extreme lost badly to the other under some load, and
    this bounded spin stayed close to the better one where it was tried (``python -m
    bench.ringbuf --producers 1,4`` with ``spins`` changed measures it; no kept figure
    yet, see docs/benchmarks.md)."""
    count = 0

    def idle() -> None:
        nonlocal count
        count += 1
        if count % spins == 0:
            os.sched_yield()

    return idle
