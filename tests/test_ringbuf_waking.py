"""A full MPMC ring wakes its sleeping producers once per refill batch of freed slots,
not at every release (``mpmc.py``, Waking), and a producer never sleeps for good while
the slot at HEAD is free.

Where a test stands in for a sleeping producer, it announces a sleeper on EV_NOT_FULL
with ``prepare_wait``, as a producer's wait does, and counts the wake-ups releases give
it by the event's ``seq``, which every wake-up bumps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import helpers
import pytest
from helpers import Forked
from numba import njit

from shmpad.ringbuf import MPMCRing, mpmc, mpmc_slots
from shmpad.ringbuf.control import EV_NOT_FULL
from shmpad.shm.atomics import load_acquire
from shmpad.shm.wait import finish_wait, prepare_wait


@njit(cache=True)
def _seq(ctl):
    return load_acquire(ctl, EV_NOT_FULL)


@pytest.fixture
def full_ring() -> Iterator[Callable[[int], MPMCRing]]:
    """``full_ring(capacity)``: a new MPMC ring holding messages b"0", b"1", ... in every slot."""
    rings: list[MPMCRing] = []

    def make(capacity: int) -> MPMCRing:
        ring = MPMCRing.create(capacity, 16)
        rings.append(ring)
        for n in range(capacity):
            ring.put_nowait(b"%d" % n)
        return ring

    yield make
    for ring in rings:
        ring.close()


@contextlib.contextmanager
def asleep_for_space(ring: MPMCRing) -> Iterator[Callable[[], int]]:
    """A producer waiting for space, as far as the ring's consumers can tell; yields a
    function giving how many wake-ups it has had."""
    ctl = ring._ctl
    seq = prepare_wait(ctl, EV_NOT_FULL)
    try:
        yield lambda: int(_seq(ctl)) - seq
    finally:
        finish_wait(ctl, EV_NOT_FULL)


@pytest.mark.parametrize("capacity, batch", [(1, 1), (3, 1), (4, 2), (8, 4), (9, 4), (4096, 1024), (5000, 1024)])
def test_refill_batches_are_half_the_ring_and_at_most_1024_slots(capacity, batch):
    assert mpmc_slots._refill(capacity) == batch
    ends = [i for i in range(capacity) if mpmc_slots._batch_end(capacity, i) == i]
    assert ends == sorted({min(b + batch - 1, capacity - 1) for b in range(0, capacity, batch)})


def test_releases_in_order_wake_the_producers_at_the_end_of_each_batch(full_ring):
    ring = full_ring(8)  # batches: slots 0-3 and 4-7
    woken = []
    with asleep_for_space(ring) as wakeups:
        for _ in range(8):
            ring.get_bytes()
            woken.append(wakeups())
    assert woken == [0, 0, 0, 1, 1, 1, 1, 2]


def test_a_batch_of_views_released_at_once_wakes_the_producers_once(full_ring):
    ring = full_ring(8)
    with asleep_for_space(ring) as wakeups:
        ring.get_many(3)
        ring.release()
        assert wakeups() == 0
        ring.get_many(3)  # slots 3-5: across the end of the first batch
        ring.release()
        assert wakeups() == 1


def test_a_ring_under_four_slots_wakes_the_producers_at_every_release(full_ring):
    ring = full_ring(3)
    with asleep_for_space(ring) as wakeups:
        for n in range(1, 4):
            ring.get_bytes()
            assert wakeups() == n


def test_the_slot_at_head_released_last_out_of_order_wakes_the_producers(full_ring):
    ring = full_ring(8)
    other = MPMCRing.attach(ring.name)  # a second consumer
    with asleep_for_space(ring) as wakeups:
        held = ring.get()  # slot 0, the one at HEAD
        assert bytes(held) == b"0"
        for _ in range(3):
            other.get_bytes()  # slots 1-3: the batch ends, but HEAD's slot is still held
        assert wakeups() == 1
        del held
        ring.release()  # slot 0, with slot 1 free already
        assert wakeups() == 2


def test_a_producer_waits_on_the_end_of_heads_batch_or_on_head_once_that_is_free(full_ring):
    ring = full_ring(8)
    other = MPMCRing.attach(ring.name)
    ctl = ring._ctl
    word, _ = mpmc._watch_write(ctl, 0)
    assert word == mpmc._state_word(ctl, 3)
    held = ring.get()  # slot 0
    for _ in range(3):
        other.get_bytes()  # slots 1-3
    word, _ = mpmc._watch_write(ctl, 0)
    assert word == mpmc._state_word(ctl, 0)
    del held
    ring.release()
    assert mpmc._watch_write(ctl, 0) == (-1, 0)  # HEAD's slot is free: no wait


def _put_one(ring: MPMCRing) -> bool:
    ring.put(b"more", timeout=30)
    return True


def test_a_producer_asleep_on_a_full_ring_gets_a_slot_freed_mid_batch(full_ring):
    """One message taken, then nothing: no release ends a batch, yet the producer's put
    goes through (it looks at HEAD again after every sleep chunk)."""
    ring = full_ring(8)
    producer = Forked(_put_one, ring, name="producer")
    try:
        assert helpers.wait_until(lambda: ring.statistics().waits_full >= 1, 60), "the producer never waited"
        assert ring.get_bytes() == b"0"
        assert producer.result(30) is True
    finally:
        producer.kill()
    assert [ring.get_bytes() for _ in range(8)] == [b"%d" % n for n in range(1, 8)] + [b"more"]
