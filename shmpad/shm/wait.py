"""Blocking waits on shared words: spin a little, then sleep on a Linux futex.

An *event* is two words on one cache line of a segment: ``seq`` (the futex word,
bumped by every notify that finds a sleeper) and ``sleepers`` (how many waiters
are between ``prepare`` and ``finish``). The handshake is Dekker's:

    waiter                                notifier
    sleepers += 1        (seq_cst RMW)    publish the condition (release store)
    fence(seq_cst)                        fence(seq_cst)
    s = seq                               if sleepers > 0:
    re-check the condition                    seq += 1; futex_wake(seq)
    futex_wait(seq, s, timeout)
    sleepers -= 1

Either the waiter's re-check sees the published condition, or the notifier sees
the sleeper and bumps ``seq`` (so a waiter that has not gone to sleep yet returns
from ``futex_wait`` at once). A notifier that finds no sleepers costs one fence
and one load. Every sleep has a timeout, so a dead notifier never hangs a waiter.
"""

from __future__ import annotations

import ctypes.util
import platform

import llvmlite.binding
import numpy as np
from numba import njit, types

from shmpad.shm.atomics import fence_seq_cst, fetch_add, load_acquire, load_relaxed, word_address

__all__ = [
    "prepare_wait",
    "sleep",
    "finish_wait",
    "notify",
    "notify_always",
    "sleepers",
    "futex_wait",
    "futex_wake",
]

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
if _SYS_FUTEX is None:
    raise ImportError(f"shmpad needs Linux futexes; no futex syscall number known for {platform.machine()!r}")
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_INT_MAX = 2**31 - 1

llvmlite.binding.load_library_permanently(ctypes.util.find_library("c"))

# libc's syscall(2), called by symbol name so that the kernels stay cacheable
# (a ctypes function pointer would make numba refuse to cache them). The futex
# calls pass only integers, for which the variadic and fixed calling conventions
# agree.
_syscall = types.ExternalFunction(
    "syscall",
    types.int64(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64, types.int64),
)


@njit(nogil=True, cache=True)
def futex_wait(words, idx, expected, timeout_ns):
    """Sleep while the low 32 bits of ``words[idx]`` equal those of ``expected``, at most
    ``timeout_ns``. Returns 0 when woken, -1 on timeout, mismatch or signal."""
    ts = np.empty(2, np.int64)
    ts[0] = timeout_ns // 1_000_000_000
    ts[1] = timeout_ns % 1_000_000_000
    low = expected & 0xFFFFFFFF
    if low >= 0x80000000:
        low -= 0x100000000
    return _syscall(_SYS_FUTEX, word_address(words, idx), _FUTEX_WAIT, low, ts.ctypes.data, 0, 0)


@njit(nogil=True, cache=True)
def futex_wake(words, idx):
    """Wake every sleeper on ``words[idx]``."""
    return _syscall(_SYS_FUTEX, word_address(words, idx), _FUTEX_WAKE, _INT_MAX, 0, 0, 0)


@njit(nogil=True, cache=True)
def prepare_wait(words, ev):
    """Announce a sleeper on the event at ``ev``; returns the ``seq`` to sleep on.
    Re-check the condition after this and before ``sleep``."""
    fetch_add(words, ev + 1, 1)
    fence_seq_cst()  # pairs with the fence in notify(): Dekker handshake
    return load_acquire(words, ev)


@njit(nogil=True, cache=True)
def sleep(words, ev, seq, timeout_ns):
    """Sleep until notified (``seq`` moved) or ``timeout_ns`` passed."""
    return futex_wait(words, ev, seq, timeout_ns)


@njit(nogil=True, cache=True)
def finish_wait(words, ev):
    """Withdraw the sleeper announced by ``prepare_wait``."""
    fetch_add(words, ev + 1, -1)


@njit(nogil=True, cache=True)
def sleepers(words, ev):
    """How many waiters the event at ``ev`` has; call after publishing. A notifier that
    wakes only some of the times it could (``mpmc.py``'s refill batches) decides on this."""
    fence_seq_cst()  # pairs with the fence in prepare_wait(): orders our publish before this load
    return load_relaxed(words, ev + 1)


@njit(nogil=True, cache=True)
def notify(words, ev):
    """Wake the sleepers of the event at ``ev``, if any. Call after publishing."""
    if sleepers(words, ev) > 0:
        notify_always(words, ev)


@njit(nogil=True, cache=True)
def notify_always(words, ev):
    """Bump ``seq`` and wake everyone, whether or not a sleeper was seen (close; or
    after ``sleepers``)."""
    fetch_add(words, ev, 1)
    futex_wake(words, ev)
