"""The compiled hot paths of a replay table: one call each for the two halves of an insert
and for a whole sample, lock included, so that the common case crosses from Python into
compiled code three times per insert-and-sample instead of a dozen.

Each takes the lock with a bounded spin (``lock._try``) unless ``have_lock`` says the
caller already holds it; on a lock still busy after the spin it returns ``BUSY`` having
done nothing, and the caller takes the lock the slow way (``lock.acquire``: it sleeps,
and takes over from a dead holder) and calls again with ``have_lock=True``. Every path
releases the lock before it returns.

Rows travel as bytes: ``rows[f]`` is field f of the table as one flat uint8 array,
``row_bytes[f]`` the bytes of one item's field, ``src[f]``/``dst[f]`` an item's or a
batch's field as flat uint8 arrays; ``copy_bytes`` is one ``memcpy`` per row.

A sample gathers its rows after releasing the lock, as a seqlock reader: an insert that
reuses a slot marks it WRITING under the lock, then (release fence) writes its bytes,
and its commit gives the slot a new key (keys are never reused). The sampler copies,
then (acquire fence) reads each slot's state and key. If any byte it copied came from
such an insert, the fences make the WRITING mark visible to that read, so the slot is
no longer READY with the key the sampler chose; the row is drawn again under the lock.
"""

from __future__ import annotations

from numba import njit

from shmpad.replay import index
from shmpad.replay.index import EV_CHANGED
from shmpad.replay.lock import _release, _try
from shmpad.shm.atomics import fence_acquire, fence_release, load_relaxed
from shmpad.shm.memcopy import copy_bytes
from shmpad.shm.wait import notify

__all__ = ["BUSY", "TORN", "reserve_and_copy", "publish", "sample_and_gather", "redraw"]

BUSY = -3
TORN = -4


@njit(nogil=True, cache=True)
def reserve_and_copy(t, limits, remover, u, pid, max_times, spins, have_lock, rows, row_bytes, src):
    """Reserve a slot (``index.reserve``) and copy the item's fields into it outside the
    lock; the slot, or RATE_LIMITED, NO_SLOT or BUSY."""
    ctl = t[0]
    if not have_lock and _try(ctl, pid, spins) != 0:
        return BUSY
    slot = index.reserve(t, limits, remover, u, pid, max_times)
    _release(ctl)
    fence_release()  # the slot's WRITING state before its new bytes: a seqlock's write side
    if slot >= 0:
        for f in range(len(rows)):
            n = row_bytes[f]
            copy_bytes(rows[f], slot * n, src[f], 0, n)
    return slot


@njit(nogil=True, cache=True)
def publish(t, slot, priority, exponent, max_times, pid, spins, have_lock):
    """Make the item in ``slot`` visible (``index.commit``) and wake waiters; its key, or BUSY."""
    ctl = t[0]
    if not have_lock and _try(ctl, pid, spins) != 0:
        return BUSY
    key = index.commit(t, slot, priority, exponent, max_times)
    _release(ctl)
    notify(ctl, EV_CHANGED)
    return key


@njit(nogil=True, cache=True)
def _gather(rows, row_bytes, dst, slots):
    """Copy the rows of ``slots`` into ``dst``, skipping rows marked -1."""
    for i in range(slots.shape[0]):
        if slots[i] >= 0:
            _gather_row(rows, row_bytes, dst, slots, i)


@njit(nogil=True, cache=True)
def _gather_row(rows, row_bytes, dst, slots, i):
    """Copy every field of the item in ``slots[i]`` into row ``i`` of ``dst``."""
    for f in range(len(rows)):
        n = row_bytes[f]
        copy_bytes(dst[f], i * n, rows[f], slots[i] * n, n)


@njit(nogil=True, cache=True)
def _mark_torn(t, slots, keys):
    """After a gather outside the lock: mark -1 the row of every item that was evicted
    (its slot WRITING, or READY with another key) while it was copied; how many."""
    state, key = t[1], t[3]
    fence_acquire()  # the gather's loads complete before the checks (a seqlock's read side)
    torn = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        if load_relaxed(state, s) != index.READY or load_relaxed(key, s) != keys[i]:
            slots[i] = -1
            torn += 1
    return torn


@njit(nogil=True, cache=True)
def sample_and_gather(
    t,
    limits,
    sampler,
    uniforms,
    max_times,
    pid,
    spins,
    have_lock,
    rows,
    row_bytes,
    dst,
    slots,
    keys,
    probs,
    prios,
    times,
):
    """If the rate limiter lets a batch through: choose it (``index.sample``), gather its
    rows into ``dst`` and return the table's size before it (> 0); 0 if not let through;
    BUSY; or TORN when rows must be drawn again (``redraw``).

    Without ``max_times`` the rows are gathered after the lock is released, so that
    samplers copy side by side, and checked afterwards: a row whose item an insert
    evicted meanwhile is marked -1 in ``slots`` and TORN returned. With ``max_times``
    they are gathered under the lock, since the sample itself may free their slots."""
    ctl = t[0]
    if not have_lock and _try(ctl, pid, spins) != 0:
        return BUSY
    b = uniforms.shape[0]
    if not index.can_sample(ctl, limits, b, max_times):
        _release(ctl)
        return 0
    size = ctl[index.SIZE]
    index.sample(t, sampler, uniforms, max_times, slots, keys, probs, prios, times)
    if max_times > 0:
        _gather(rows, row_bytes, dst, slots)
    _release(ctl)
    notify(ctl, EV_CHANGED)
    if max_times == 0:
        _gather(rows, row_bytes, dst, slots)
        if _mark_torn(t, slots, keys) > 0:
            return TORN
    return size


@njit(nogil=True, cache=True)
def redraw(t, sampler, uniforms, pid, spins, have_lock, rows, row_bytes, dst, slots, keys, probs, prios, times):
    """Draw again, under the lock, every row that ``sample_and_gather`` marked -1 (its
    draw is uncounted, a fresh one counted; ``uniforms`` are fresh) and gather it; the
    table's size, BUSY, or 0 when the table is empty now: then the whole batch is
    uncounted and must be sampled again."""
    ctl = t[0]
    if not have_lock and _try(ctl, pid, spins) != 0:
        return BUSY
    size = ctl[index.SIZE]
    for i in range(slots.shape[0]):
        if slots[i] < 0:
            ctl[index.SAMPLES] -= 1
    if size == 0:  # the last item was evicted: hand every draw back
        state, key, times_of = t[1], t[3], t[4]
        for i in range(slots.shape[0]):
            s = slots[i]
            if s >= 0:
                ctl[index.SAMPLES] -= 1
                if state[s] == index.READY and key[s] == keys[i]:
                    times_of[s] -= 1
        _release(ctl)
        return 0
    for i in range(slots.shape[0]):
        if slots[i] < 0:
            index.draw(t, sampler, uniforms[i], 0, i, slots, keys, probs, prios, times)
            _gather_row(rows, row_bytes, dst, slots, i)
    _release(ctl)
    notify(ctl, EV_CHANGED)
    return size
