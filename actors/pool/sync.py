"""Compiled hand-offs between the pool's consumer and its workers, on shared counters.

Every hand-off is a counter with one writer, published with a release store and
read with an acquire load, and an event (``shmpad.shm.wait``) that the writer
notifies so that a reader that ran out of spins can sleep on a futex. The payload
(actions, or observations and rewards) is written before the counter moves, so a
reader that sees the new count sees the whole payload.

A wait spins ``spins`` times, then sleeps at most ``timeout_ns`` once and returns;
the caller's Python loop decides whether to wait again, so that it can look at
deadlines, stop requests and the liveness of the other side between sleeps.

Spinning pays only when the wait is shorter than the spin. A waiter therefore
spins only while the last time it had to wait (the condition was not already met)
took less than ``LONG_WAIT_NS`` (``spins_for``): Atari workers wait milliseconds,
and every spin then takes CPU from a process on the same core, often the one they
wait for; waiters on fast environments keep spinning.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmpad.shm.atomics import cpu_pause, fence_seq_cst, load_acquire, load_relaxed, store_relaxed, store_release
from shmpad.shm.wait import finish_wait, notify, notify_always, prepare_wait, sleep

__all__ = [
    "LONG_WAIT_NS",
    "spins_for",
    "count_short",
    "wait_all",
    "publish_part",
    "publish_all",
    "wake",
    "load",
    "store",
    "store_stats",
    "load_stats",
    "copy_actions",
    "warm_up",
]

LONG_WAIT_NS = 1_000_000


def spins_for(spins: int, last_wait_ns: int) -> int:
    """The spins for a waiter whose last wait (one that found the condition unmet) took ``last_wait_ns``."""
    return spins if last_wait_ns < LONG_WAIT_NS else 0


@njit(nogil=True, cache=True)
def count_short(words, idxs, target):
    """How many of the counters ``words[idxs]`` are still below ``target``."""
    short = 0
    for k in range(idxs.shape[0]):
        if load_acquire(words, idxs[k]) < target:  # pairs with store_release in publish_part/publish_all
            short += 1
    return short


@njit(nogil=True, cache=True)
def wait_all(words, idxs, target, ev, spins, timeout_ns):
    """Wait until every counter ``words[idxs]`` reaches ``target``: spin, then sleep
    once on the event at ``ev`` for at most ``timeout_ns``. Returns how many counters
    are still short (0: all reached)."""
    for _ in range(spins):
        if count_short(words, idxs, target) == 0:
            return 0
        cpu_pause()
    seq = prepare_wait(words, ev)
    if count_short(words, idxs, target) != 0:
        sleep(words, ev, seq, timeout_ns)
    finish_wait(words, ev)
    return count_short(words, idxs, target)


@njit(nogil=True, cache=True)
def publish_part(words, idx, value, idxs, ev):
    """``words[idx] = value`` (release) for one of the counters ``words[idxs]``, and wake
    the reader of the set only if that completed it (every counter reached ``value``):
    a reader waiting for the whole set is not woken once per part.

    Of several parts published at once, the one whose fence comes last sees every
    counter, so it notifies; and ``notify`` pairs with the reader's ``prepare_wait``
    as usual, so a reader that re-checked before the last part never sleeps through it."""
    store_release(words, idx, value)  # pairs with load_acquire in count_short
    fence_seq_cst()  # pairs with the fences of the other parts: the last sees all stores
    if count_short(words, idxs, value) == 0:
        notify(words, ev)


@njit(nogil=True, cache=True)
def publish_all(words, idxs, value, evs):
    """Set several counters to ``value`` after the payload, and wake each one's reader (its own event)."""
    for k in range(idxs.shape[0]):
        store_release(words, idxs[k], value)  # pairs with load_acquire in count_short
    for k in range(idxs.shape[0]):
        notify(words, evs[k])


@njit(nogil=True, cache=True)
def wake(words, evs):
    """Wake every sleeper on the events ``evs``, whether or not one was seen (stop)."""
    for k in range(evs.shape[0]):
        notify_always(words, evs[k])


@njit(nogil=True, cache=True)
def load(words, idx):
    """``words[idx]`` with acquire ordering (pairs with the release store that set it)."""
    return load_acquire(words, idx)


@njit(nogil=True, cache=True)
def store_stats(words, idx, steps, env_ns, wait_ns):
    """A worker's own statistics line: steps taken, time in environments, time waiting.
    Relaxed: the readers want recent values, not an ordering with the payload."""
    store_relaxed(words, idx, steps)
    store_relaxed(words, idx + 1, env_ns)
    store_relaxed(words, idx + 2, wait_ns)


@njit(nogil=True, cache=True)
def load_stats(words, idx):
    """The three words ``store_stats`` writes."""
    return load_relaxed(words, idx), load_relaxed(words, idx + 1), load_relaxed(words, idx + 2)


@njit(nogil=True, cache=True)
def store(words, idx, value):
    """``words[idx] = value`` with release ordering (pairs with ``load``)."""
    store_release(words, idx, value)


@njit(nogil=True, cache=True)
def copy_actions(src, dst, num_actions):
    """Copy discrete actions ``src`` into the slots ``dst`` if all are in
    ``0..num_actions-1``; returns -1, or the index of the first bad one (nothing copied)."""
    for i in range(src.shape[0]):
        if src[i] < 0 or src[i] >= num_actions:
            return i
    for i in range(src.shape[0]):
        dst[i] = src[i]
    return -1


def warm_up() -> None:
    """Compile (or load) every kernel here on a private array, so that forked workers
    start with them ready instead of each compiling its own."""
    words = np.zeros(64, np.int64)
    idxs = np.array([8], np.int64)
    evs = np.array([16], np.int64)
    count_short(words, idxs, 0)
    wait_all(words, idxs, 0, 16, 1, 0)
    publish_part(words, 8, 0, idxs, 16)
    copy_actions(np.zeros(2, np.int64), np.zeros(2, np.int64), 1)
    publish_all(words, idxs, 0, evs)
    wake(words, evs)
    load(words, 8)
    store(words, 8, 0)
    store_stats(words, 24, 0, 0, 0)
    load_stats(words, 24)
