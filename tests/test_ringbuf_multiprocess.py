"""Many processes through one ring, every message counted and checked.

Each producer sends ``make_message(producer, seq, n)`` for seq = 0..N-1, with sizes
that vary; each consumer checks every message whole (``parse_message``) and records
the order it saw each producer's messages in. Afterwards, across consumers, every
message arrived exactly once and each consumer saw each producer's messages in the
order they were sent. Capacity 16 and 20k messages per producer, so wrap-around
happens many times; full and empty each happen at least once by construction (the
consumers wait on the empty ring before the producers start, and are stopped until
a producer has waited on the full ring), whatever the scheduler does.
"""

from __future__ import annotations

import os
import signal

import helpers
import numpy as np
import pytest
from helpers import Forked, make_message, parse_message
from helpers.ring_workers import CAPACITY, SLOT_SIZE, consume, produce, wait_while_progressing

from shmpad.ringbuf import MPMCRing, SPSCRing

N = 20_000
RESULT_TIMEOUT = 60.0

PRODUCE = ["put", "put_many_list", "put_many_array", "reserve"]
# "get_held" keeps 1 to 3 views before each release. Only a sole consumer may: with
# several, the others can drain the ring while it holds a view, the producers then wait
# for that view's slot, and it waits for a message: a deadlock (ended by timeouts).
CONSUME = ["get_bytes", "get", "get_many", "get_held"]


def _run(ring_cls, producers: list[str], consumers: list[str], n: int = N) -> None:
    """Start the consumers, wait until they are all waiting on the empty ring, stop them
    (SIGSTOP), start the producers, let the consumers go on once a producer waits on the
    full ring, close the ring once the producers are done, and check what the consumers got."""
    ring = ring_cls.create(CAPACITY, SLOT_SIZE)
    started: list[Forked] = []
    try:
        for j, how in enumerate(consumers):
            started.append(Forked(consume, ring, how, j, name=f"consumer {j} ({how})"))
        assert helpers.wait_until(lambda: ring.statistics().waits_empty >= len(consumers), 60), "consumers never waited"
        for c in started:
            os.kill(c.pid, signal.SIGSTOP)
        prods = [Forked(produce, ring, i, n, how, name=f"producer {i} ({how})") for i, how in enumerate(producers)]
        started += prods
        assert helpers.wait_until(lambda: ring.statistics().waits_full >= 1, 60), "the producers never filled the ring"
        for c in started[: len(consumers)]:
            os.kill(c.pid, signal.SIGCONT)
        wait_while_progressing(ring, prods)
        sent = sum(p.result(RESULT_TIMEOUT) for p in prods)
        ring.close()
        wait_while_progressing(ring, started[: len(consumers)])
        got = [c.result(RESULT_TIMEOUT) for c in started[: len(consumers)]]
        stats = ring.statistics()
    finally:
        for child in started:
            child.kill()
        ring.close()

    for i in range(len(producers)):
        per_consumer = [g.get(i, np.zeros(0, np.int64)) for g in got]
        for j, seqs in enumerate(per_consumer):
            assert np.all(np.diff(seqs) > 0), f"consumer {j} saw producer {i}'s messages out of order"
        everything = np.sort(np.concatenate(per_consumer))
        missing = np.setdiff1d(np.arange(n), everything)
        assert len(missing) == 0, f"producer {i}: {len(missing)} messages lost, first {missing[:10]}"
        dups = everything[1:][np.diff(everything) == 0]
        assert len(dups) == 0, f"producer {i}: messages delivered twice: {dups[:10]}"
        assert len(everything) == n
    total = n * len(producers)
    assert (stats.puts, stats.gets, stats.size, stats.dead_claims_skipped) == (total, total, 0, 0)
    assert stats.bytes_put == stats.bytes_got == sent
    assert stats.waits_full > 0 and stats.waits_empty > 0


ONE_TO_ONE = [("put", "get_bytes"), ("put_many_list", "get_held"), ("put_many_array", "get_many"), ("reserve", "get")]


@pytest.mark.parametrize("ring_cls", [SPSCRing, MPMCRing], ids=lambda r: r.__name__)
@pytest.mark.parametrize("produce_how, consume_how", ONE_TO_ONE)
def test_one_producer_one_consumer(ring_cls, produce_how, consume_how):
    _run(ring_cls, [produce_how], [consume_how])


@pytest.mark.parametrize("consume_how", CONSUME)
def test_mpmc_four_producers_one_consumer(consume_how):
    _run(MPMCRing, PRODUCE, [consume_how])


@pytest.mark.parametrize(
    "consumers", [["get_bytes", "get", "get_many", "get_bytes"], ["get", "get_many", "get", "get_many"]], ids=["a", "b"]
)
def test_mpmc_four_producers_four_consumers(consumers):
    _run(MPMCRing, PRODUCE, consumers)


def test_consumer_checks_catch_a_torn_message():
    """The checks above would see a message made of two: a self-test of parse_message."""
    a, b = make_message(1, 10, 60), make_message(1, 11, 60)
    with pytest.raises(AssertionError, match="torn message"):
        parse_message(a[:30] + b[30:])
    with pytest.raises(AssertionError, match="torn message"):
        parse_message(a[:59])
    assert parse_message(a) == (1, 10)
