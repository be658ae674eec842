"""How a ring call that cannot complete at once waits: the failed fast path's code
turned into an error (``Closed``, ``WouldBlock``, a too-large message) or into a wait,
bounded spinning then a futex sleep in chunks, until the ring changes, the deadline
passes (``Timeout``) or a dead peer's claim is recovered. Nothing here runs on the
fast path: a call that succeeds at once never gets here.

The spin adapts per handle, as an adaptive mutex's does: a wait that its spin ended,
or that slept but was over within ``QUICK_NS`` (a longer spin would have caught it),
doubles the handle's budget (up to ``SPIN``); a longer wait halves it (down to
``SPIN_MIN``). Spinning pays when the peer runs on another core at the same
time; on a machine with more runnable threads than cores the peer is mostly off the
CPU, the spin burns the time slice it needs, and the futex is the faster way back.
``python -m bench.rpc --subjects shmpad,mp-pipe`` on 2 cores shared with other work,
run with a fixed ``SPIN`` and with adapting, in interleaved runs, measures it (shmpad's
calls/s against ``multiprocessing.Pipe``'s, sync and with 16 calls in flight); no kept
figure yet, see docs/benchmarks.md.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

from numba import njit

from shmpad._checks import deadline as _deadline
from shmpad.errors import Closed, Timeout, WouldBlock
from shmpad.ringbuf.control import (
    CLOSED,
    CLOSED_CODE,
    EV_NOT_EMPTY,
    EV_NOT_FULL,
    RESERVATION_OPEN,
    TOO_BIG,
    WAITS_EMPTY,
    WAITS_FULL,
)
from shmpad.shm.atomics import cpu_pause, fetch_add, load_acquire
from shmpad.shm.wait import finish_wait, prepare_wait, sleep

__all__ = ["Blocking", "SPIN", "SLEEP_CHUNK_S", "nowait"]

# Spins before sleeping, at most: long enough to cover a peer that is mid-copy (~tens of us).
SPIN = 2000
# ... and at least (about a microsecond): what a handle whose spins keep failing still tries.
SPIN_MIN = 32
# A wait that slept and was over this soon would have been caught by spinning.
QUICK_NS = 20_000
# What _wait_change returns: the word changed while spinning, after sleeping, or not.
SPUN, SLEPT, UNCHANGED = 2, 1, 0
# A sleeper wakes at least this often to check deadlines and dead claims.
SLEEP_CHUNK_S = 0.05


@njit(nogil=True, cache=True)
def _wait_change(ctl, idx, old, ev, spin, timeout_ns):
    """Spin, then sleep on the event ``ev``, until ``ctl[idx]`` differs from ``old`` or the
    ring is closed: ``SPUN`` or ``SLEPT`` if it did within ``timeout_ns`` (by which
    phase it was seen), else ``UNCHANGED``."""
    for _ in range(spin):
        if load_acquire(ctl, idx) != old:  # pairs with the release store that changed it
            return SPUN
        cpu_pause()
    seq = prepare_wait(ctl, ev)
    changed = load_acquire(ctl, idx) != old or load_acquire(ctl, CLOSED) != 0
    if not changed:
        sleep(ctl, ev, seq, timeout_ns)
        changed = load_acquire(ctl, idx) != old
    finish_wait(ctl, ev)
    return SLEPT if changed else UNCHANGED


def next_spin(spin: int, seen: int, waited_ns: int) -> int:
    """A handle's spin budget after a wait that ``_wait_change`` ended with ``seen``
    after ``waited_ns``."""
    if seen == SPUN or (seen == SLEPT and waited_ns < QUICK_NS):
        return min(SPIN, spin * 2)
    return max(SPIN_MIN, spin >> 1)


@njit(nogil=True, cache=True)
def _count(ctl, idx):
    fetch_add(ctl, idx, 1)


class Blocking:
    """The waiting half of ``ByteRing``: it needs ``_ctl``, ``capacity``, ``slot_size``
    and ``kernels`` (with ``watch_read``/``watch_write``) from the ring."""

    _spin = SPIN  # this handle's spin budget (see the module docstring)

    def _producers_wait_for_me(self) -> bool:
        """True when no producer can put until this handle releases what it holds."""
        return False

    def _recover(self) -> None:
        """Called when a wait made no progress for a sleep chunk: kinds that can detect
        dead claims do it here."""

    def _raise_for(self, r: int, data: Any, what: str = "put") -> None:
        if r == RESERVATION_OPEN:
            raise RuntimeError(f"{what}() called between reserve() and commit()")
        if r == CLOSED_CODE:
            raise Closed("ring is closed")
        if r == TOO_BIG:
            n = len(data) if data is not None else -1
            raise ValueError(f"slot holds at most {self.slot_size} bytes, got {n}")

    def _raise_empty(self, r: int, wait_ok: bool = False) -> None:
        if r == CLOSED_CODE:
            raise Closed("ring is closed and drained")
        if not wait_ok and r < 0:
            raise WouldBlock("ring is empty")

    def _retry(self, r: int, attempt: Callable[[], int], reading: bool, timeout, what: str, data) -> int:
        """Wait and retry ``attempt`` until it succeeds (returns >= 0); ``r`` is the
        failed first attempt's code."""
        if reading:
            self._raise_empty(r, wait_ok=True)
        else:
            self._raise_for(r, data)
        deadline = _deadline(timeout)
        counter = WAITS_EMPTY if reading else WAITS_FULL
        while True:
            self._wait(reading, counter, deadline, timeout, what)
            counter = -1
            r = attempt()
            if r >= 0:
                return r
            if reading:
                self._raise_empty(r, wait_ok=True)
            else:
                self._raise_for(r, data)

    def _wait(self, reading: bool, counter: int, deadline: float | None, timeout, what: str) -> None:
        """Block until the ring may have become readable (or writable), counting one
        wait in ``counter`` (-1: none). Raises ``Timeout`` past ``deadline``, and
        ``RuntimeError`` for a read without a deadline that could never end (the ring
        empty and its producers waiting for a slot this handle holds)."""
        if counter >= 0:
            _count(self._ctl, counter)
        watch = self.kernels.watch_read if reading else self.kernels.watch_write
        ev = EV_NOT_EMPTY if reading else EV_NOT_FULL
        while True:
            idx, old = watch(self._ctl, os.getpid())
            if idx < 0:
                return
            if reading and deadline is None and self._held and self._producers_wait_for_me():
                raise RuntimeError(
                    f"{what}() would wait forever: the ring is empty and its producers wait for a slot whose "
                    "message this handle holds (views stay valid until release()): release() them before waiting"
                )
            if deadline is None:
                chunk = SLEEP_CHUNK_S
            else:
                chunk = min(deadline - time.monotonic(), SLEEP_CHUNK_S)
                if chunk <= 0:
                    state = "empty" if reading else "full"
                    raise Timeout(f"{what} timed out after {timeout} s: ring {state} ({self.capacity} slots)")
            began = time.perf_counter_ns()
            seen = _wait_change(self._ctl, idx, old, ev, self._spin, math.ceil(chunk * 1e9))
            # threads sharing a handle may race on the budget: any of their values is one
            self._spin = next_spin(self._spin, seen, time.perf_counter_ns() - began)
            if seen != UNCHANGED:
                return
            self._recover()


def nowait(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, timeout=0, **kwargs)``, raising ``WouldBlock`` where it would raise
    ``Timeout``: the ``X_nowait`` twin of a blocking ``X`` (trio's rule: ``X_nowait``
    raises ``WouldBlock``, ``X(timeout=...)`` raises ``Timeout``)."""
    try:
        return call(*args, timeout=0, **kwargs)
    except Timeout as e:
        raise WouldBlock(str(e)) from None
