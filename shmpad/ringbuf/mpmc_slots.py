"""The MPMC ring's slots, below its operations (``mpmc.py`` has the protocol):
the state word of a slot (``lap`` << 32 | ``phase`` << 30 | ``pid``), the refill
batches whose last release wakes a full ring's producers (``mpmc.py``, Waking), the
counters on each slot's line (``mpmc.py``, Counting), and freeing the slot of a
claimant that died (``mpmc.py``, liveness).
"""

from __future__ import annotations

from numba import njit

from shmpad.ringbuf.control import (
    CAPACITY,
    DEAD_CLAIMS,
    EV_NOT_EMPTY,
    EV_NOT_FULL,
    HEAD,
    SLOT_WORDS,
    TAIL,
    WORDS_PER_LINE,
)
from shmpad.shm.atomics import cas, fetch_add, load_acquire, load_relaxed, store_relaxed
from shmpad.shm.wait import notify

__all__ = ["FREE", "LAP_MASK", "PID_MASK", "READING", "READY", "REFILL_MAX", "WRITING"]

FREE, WRITING, READY, READING = 0, 1, 2, 3
LAP_MASK = 0x7FFFFFFF
PID_MASK = (1 << 30) - 1
# The most slots in a refill batch (see mpmc.py's Waking); libzmq's pipes resume a
# writer after a reader took at most 1024 messages too.
REFILL_MAX = 1024
_LENGTH, _GOT, _GOT_BYTES = 1, 2, 3  # words of a slot's line after its state word


@njit(nogil=True, cache=True)
def _pack(lap, phase, pid):
    return ((lap & LAP_MASK) << 32) | (phase << 30) | (pid & PID_MASK)


@njit(nogil=True, cache=True)
def _lap(s):
    return (s >> 32) & LAP_MASK


@njit(nogil=True, cache=True)
def _phase(s):
    return (s >> 30) & 3


@njit(nogil=True, cache=True)
def _state_word(ctl, i):
    return ctl[SLOT_WORDS] + i * WORDS_PER_LINE


@njit(nogil=True, cache=True)
def _refill(cap):
    """Slots in a refill batch (see Waking)."""
    return max(1, min(cap // 2, REFILL_MAX))


@njit(nogil=True, cache=True)
def _batch_end(cap, i):
    """The last slot of the refill batch that slot ``i`` is in."""
    batch = _refill(cap)
    return min((i // batch + 1) * batch - 1, cap - 1)


@njit(nogil=True, cache=True)
def _refilled(ctl, i, k, lap):
    """Whether freeing the slots [i, i + k) for ``lap`` ends a refill batch, or finds the
    slot after them free already (a consumer released out of order; see Waking)."""
    cap = ctl[CAPACITY]
    if _batch_end(cap, i) < i + k:
        return True
    return load_relaxed(ctl, _state_word(ctl, i + k)) == _pack(lap, FREE, 0)


@njit(nogil=True, cache=True)
def _stuck(ctl, which):
    """The pid holding up HEAD (which=0: a reader of the previous lap) or TAIL (which=1:
    a writer of this lap), with the state word it is in; (0, 0) when nothing is."""
    cap = ctl[CAPACITY]
    pos = load_acquire(ctl, TAIL if which else HEAD)
    lap = pos // cap
    s = load_acquire(ctl, _state_word(ctl, pos % cap))
    if which == 1 and _lap(s) == lap & LAP_MASK and _phase(s) == WRITING:
        return s & PID_MASK, s
    if which == 0 and _lap(s) == (lap - 1) & LAP_MASK and _phase(s) == READING:
        return s & PID_MASK, s
    return 0, 0


@njit(nogil=True, cache=True)
def _drop_claim(ctl, which, s):
    """Free the slot whose state is still exactly ``s`` (a dead claimant's); True if done."""
    cap = ctl[CAPACITY]
    pos = load_acquire(ctl, TAIL if which else HEAD)
    sw = _state_word(ctl, pos % cap)
    if cas(ctl, sw, s, _pack(_lap(s) + 1, FREE, 0)) != s:
        return False
    if which == 1:
        cas(ctl, TAIL, pos, pos + 1)
    fetch_add(ctl, DEAD_CLAIMS, 1)
    notify(ctl, EV_NOT_FULL)
    notify(ctl, EV_NOT_EMPTY)
    return True


@njit(nogil=True, cache=True)
def _count_claimed(ctl, sw):
    """Count the message this consumer just claimed in its slot's GOT and GOT_BYTES. The
    claim makes us the line's only writer (until _release), so plain stores do; the
    previous writer's values reached us through the acquire of the state word."""
    store_relaxed(ctl, sw + _GOT, load_relaxed(ctl, sw + _GOT) + 1)
    store_relaxed(ctl, sw + _GOT_BYTES, load_relaxed(ctl, sw + _GOT_BYTES) + load_relaxed(ctl, sw + _LENGTH))


@njit(nogil=True, cache=True)
def _traffic(ctl):
    """(puts, gets, bytes_put, bytes_got) summed over the slot lines (see Counting)."""
    gets = got_bytes = ready = ready_bytes = 0
    for i in range(ctl[CAPACITY]):
        sw = _state_word(ctl, i)
        gets += load_relaxed(ctl, sw + _GOT)
        got_bytes += load_relaxed(ctl, sw + _GOT_BYTES)
        # GOT first: a message claimed meanwhile is missed (never counted twice)
        s = load_acquire(ctl, sw)  # pairs with store_release(READY) in _publish: the length is the message's
        if _phase(s) == READY:
            ready += 1
            ready_bytes += load_relaxed(ctl, sw + _LENGTH)
    return gets + ready, gets, got_bytes + ready_bytes, got_bytes
