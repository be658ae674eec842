"""The process-shared lock of a replay table's index, which survives a holder's death.

Why a lock and not lock-free: one insert or sample changes several structures at once
(up to four trees, a linked list, the free stack and the rate limiter's counters) that
must agree, and a lock-free version of that is a research project. The lock guards only
that bookkeeping (microseconds of compiled code); an inserter copies its item's bytes
outside it, into a slot nobody else can see, and a sampler gathers its rows outside it
and then checks that they were not evicted meanwhile (``hot_path.sample_and_gather``).

The lock word holds the holder's pid (0: free)::

    acquire    CAS 0 -> pid, spinning a while; then sleep on LOCK_EV (shm/wait.py) with a
               short timeout, and on waking look whether the holder is still alive
    release    store 0 (release: pairs with the acquire CAS of the next holder), notify

Why a dead holder never hangs the others: a waiter that finds the holder's pid dead (or
a zombie) takes the lock over with CAS holder -> own pid (one of the waiters wins) and
is told so, so that it rebuilds the index from the per-slot arrays (``index.rebuild``)
before using it. A pid reused by another process within the sleep chunk would make the
dead holder look alive until that process exits; it cannot make two holders.
"""

from __future__ import annotations

import os
import time

from numba import njit

from shmpad.replay.index import LOCK, LOCK_EV
from shmpad.shm.atomics import cas, cpu_pause, load_acquire, store_release
from shmpad.shm.pids import pid_alive
from shmpad.shm.wait import finish_wait, notify, prepare_wait, sleep

__all__ = ["acquire", "release", "SPINS", "SLEEP_NS"]

SPINS = 2000
SLEEP_NS = 2_000_000  # how long a waiter sleeps before it looks at the holder again


@njit(nogil=True, cache=True)
def _try(ctl, pid, spins):
    for _ in range(spins):
        if cas(ctl, LOCK, 0, pid) == 0:  # acq_rel: pairs with the release store in _release
            return 0
        cpu_pause()
    return load_acquire(ctl, LOCK)


@njit(nogil=True, cache=True)
def _sleep(ctl, timeout_ns):
    seq = prepare_wait(ctl, LOCK_EV)
    if load_acquire(ctl, LOCK) != 0:  # pairs with the release store in _release
        sleep(ctl, LOCK_EV, seq, timeout_ns)
    finish_wait(ctl, LOCK_EV)


@njit(nogil=True, cache=True)
def _steal(ctl, dead, pid):
    return cas(ctl, LOCK, dead, pid) == dead


@njit(nogil=True, cache=True)
def _release(ctl):
    store_release(ctl, LOCK, 0)  # pairs with the CAS in _try
    notify(ctl, LOCK_EV)


def acquire(ctl, deadline: float | None = None) -> bool | None:
    """Take the lock: False normally, True if it was taken from a dead holder (rebuild
    the index before using it), None if ``deadline`` (monotonic) passed first."""
    pid = os.getpid()
    while True:
        holder = _try(ctl, pid, SPINS)
        if holder == 0:
            return False
        if holder != pid and not pid_alive(holder):
            if _steal(ctl, holder, pid):
                return True
            continue
        if deadline is not None and time.monotonic() >= deadline:
            return None
        _sleep(ctl, SLEEP_NS)


def release(ctl) -> None:
    _release(ctl)
