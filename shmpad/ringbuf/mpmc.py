"""Multi-producer multi-consumer ring of byte messages that survives dead claimants.

Layout of the data area (after the control block of ``control.py``)::

    word  SLOT_WORDS + 8 i        state of slot i (below)
    word  SLOT_WORDS + 8 i + 1    length in bytes of the message in slot i
    word  SLOT_WORDS + 8 i + 2    GOT: messages consumers have claimed from slot i
    word  SLOT_WORDS + 8 i + 3    GOT_BYTES: their bytes
                                  (one 64-byte line per slot: producers of
                                  neighbouring slots never share a line)
    byte  SLOTS + i * STRIDE      payload of slot i (64-byte aligned)

HEAD is the enqueue position and TAIL the dequeue position; position ``p`` lives
in slot ``p % capacity`` on lap ``p // capacity``. A slot's state word packs
``lap`` (31 bits) << 32 | ``phase`` (2 bits) << 30 | ``pid`` (30 bits)::

    (L, FREE, 0) --producer CAS--> (L, WRITING, pid) --commit--> (L, READY, pid)
    --consumer CAS--> (L, READING, pid) --release--> (L+1, FREE, 0)

Claims are made by CAS on the slot's state, with the claimant's pid in it, and
the position is advanced afterwards by whoever sees the claim (helping), so a
claimant that dies at any instruction leaves a trace naming it:

- a producer that dies while WRITING stalls consumers at that position until one
  of them finds the pid dead and moves the slot to (L+1, FREE): the message is
  dropped and counted in DEAD_CLAIMS;
- a consumer that dies while READING stalls producers a lap later until one of
  them finds the pid dead and moves the slot to (L+1, FREE): the message it held
  is lost with it and counted.

Liveness is checked from Python (``_recover``), only after a waiter slept a whole
chunk without progress, so the fast paths carry no system call.

Waking: a producer that finds the ring full waits for a refill batch of slots to be
free, not for one. The slots fall into batches of ``mpmc_slots._refill(capacity)`` (half the
ring, at most REFILL_MAX; 1 below 4 slots), and a release wakes the producers asleep on
EV_NOT_FULL only when it frees the last slot of a batch, or finds the slot after the
ones it freed free already (a consumer that released out of order: without this, its
release of the slot at HEAD would wake nobody). Woken at every release, four producers
of a full ring cost the consumer a futex_wake per message and then took the core from
it, one message each: 4->1 at 64 B moved far fewer messages (``python -m bench.ringbuf --sizes 64
--producers 4`` measures it; no kept figure yet, see docs/benchmarks.md). A producer waits on the state word
of the last slot of HEAD's batch (HEAD's own where that one is free already), never
while the slot at HEAD is free, and a release that wakes nobody costs a sleeping
producer at most a sleep chunk: it then looks at HEAD again.

Counting: the control block's PUTS, GETS, BYTES_PUT and BYTES_GOT stay 0 here. A
locked add on a line every producer writes cost each message two cache-line
transfers between the producers; instead the consumer that claims a message adds it
to its slot's GOT and GOT_BYTES with plain stores (the claim makes it the line's
only writer until it frees the slot; the next claimant acquires the line through the
state word). ``statistics()`` sums them: ``gets`` = the sum of GOT, and ``puts`` =
``gets`` + the messages waiting READY (bytes alike), so a message counts as put once
it is published, whoever later takes it. Producers write no counter at all.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from shmpad.ringbuf.control import (
    CAPACITY,
    CLOSED,
    CLOSED_CODE,
    EMPTY,
    EV_NOT_EMPTY,
    EV_NOT_FULL,
    FULL,
    HEAD,
    IN_PROGRESS,
    SLOT_SIZE,
    SLOTS,
    STRIDE,
    TAIL,
    TOO_BIG,
    WORDS_PER_LINE,
    Kernels,
    take_into_with,
)
from shmpad.ringbuf.mpmc_slots import (
    _LENGTH,
    FREE,
    LAP_MASK,
    PID_MASK,
    READING,
    READY,
    WRITING,
    _batch_end,
    _count_claimed,
    _drop_claim,
    _lap,
    _pack,
    _phase,
    _refilled,
    _state_word,
    _stuck,
    _traffic,
)
from shmpad.ringbuf.ring import ByteRing
from shmpad.shm import pids
from shmpad.shm.atomics import cas, load_acquire, load_relaxed, store_relaxed, store_release
from shmpad.shm.compiled import fast_entry
from shmpad.shm.memcopy import copy_bytes
from shmpad.shm.pids import current_pid, pid_alive
from shmpad.shm.segment import Segment
from shmpad.shm.wait import notify, notify_always, sleepers

__all__ = ["MPMCRing"]

# _take_small's flag: the message did not fit, its slot is still claimed.
HELD = 1 << 62
# get_bytes copies messages up to this size out in the call that takes them (the
# ring's one copy, then bytes() of it) and larger ones straight from their slot.
SMALL = 4096


@njit(nogil=True, cache=True)
def _claim_write(ctl, pid):
    """Claim the slot at HEAD for writing: its index, FULL or CLOSED_CODE."""
    cap = ctl[CAPACITY]
    while True:
        if load_relaxed(ctl, CLOSED) != 0:
            return CLOSED_CODE
        pos = load_acquire(ctl, HEAD)  # pairs with the cas on HEAD below (ours or a helper's)
        i = pos % cap
        lap = pos // cap
        sw = _state_word(ctl, i)
        s = load_acquire(ctl, sw)  # pairs with store_release(FREE) in _release and the reclaims
        free = _pack(lap, FREE, 0)
        if s == free:
            if cas(ctl, sw, free, _pack(lap, WRITING, pid)) == free:
                cas(ctl, HEAD, pos, pos + 1)
                return i
        elif _lap(s) == lap & LAP_MASK:
            cas(ctl, HEAD, pos, pos + 1)  # claimed by someone who has not moved HEAD yet
        elif _lap(s) == (lap - 1) & LAP_MASK and load_relaxed(ctl, HEAD) == pos:
            return FULL  # the previous lap's message is still in the slot
        elif s == _pack(lap + 1, FREE, 0):
            cas(ctl, HEAD, pos, pos + 1)  # a dead claim here was dropped before HEAD moved


@njit(nogil=True, cache=True)
def _publish(ctl, i, n):
    sw = _state_word(ctl, i)
    s = load_relaxed(ctl, sw)
    store_relaxed(ctl, sw + _LENGTH, n)
    store_release(ctl, sw, _pack(_lap(s), READY, s & PID_MASK))  # pairs with load_acquire(sw) in _claim_read


@njit(nogil=True, cache=True)
def _put_one(ctl, src, a, n, pid):
    """Claim a slot, copy ``src[a:a + n]`` into it and publish it: 0, or the claim's code."""
    i = _claim_write(ctl, pid)
    if i < 0:
        return i
    copy_bytes(ctl.view(np.uint8), ctl[SLOTS] + i * ctl[STRIDE], src, a, n)
    _publish(ctl, i, n)
    return 0


@njit(nogil=True, cache=True)
def _put_done(ctl, k, code):
    """What a put of several messages returns once ``k`` are in and its last attempt
    returned ``code``: ``k``, or ``CLOSED_CODE`` when none went in because the ring is closed."""
    if k == 0 and code == CLOSED_CODE:
        return CLOSED_CODE
    if k > 0:
        notify(ctl, EV_NOT_EMPTY)
    return k


@njit(cache=True)  # holds the GIL: releasing it costs more than the call
def _put(ctl, msg, pid):
    n = len(msg)
    if n > ctl[SLOT_SIZE]:
        return TOO_BIG
    r = _put_one(ctl, msg, 0, n, pid)
    if r == 0:
        notify(ctl, EV_NOT_EMPTY)
    return r


@njit(nogil=True, cache=True)
def _put_rows(ctl, rows, first, pid):
    n = rows.shape[1]
    if n > ctl[SLOT_SIZE]:
        return TOO_BIG
    flat = rows.reshape(-1)
    k = r = 0
    for j in range(first, rows.shape[0]):
        r = _put_one(ctl, flat, j * n, n, pid)
        if r < 0:
            break
        k += 1
    return _put_done(ctl, k, r)


@njit(nogil=True, cache=True)
def _put_packed(ctl, buf, offsets, first, pid):
    k = r = 0
    for j in range(first, offsets.shape[0] - 1):
        a = offsets[j]
        n = offsets[j + 1] - a
        if n > ctl[SLOT_SIZE]:
            break
        r = _put_one(ctl, buf, a, n, pid)
        if r < 0:
            break
        k += 1
    return _put_done(ctl, k, r)


@njit(nogil=True, cache=True)
def _reserve(ctl, n, pid):
    if n > ctl[SLOT_SIZE]:
        return TOO_BIG
    return _claim_write(ctl, pid)


@njit(nogil=True, cache=True)
def _commit(ctl, i, n):
    _publish(ctl, i, n)
    notify(ctl, EV_NOT_EMPTY)


@njit(nogil=True, cache=True)
def _claim_read(ctl, pid):
    """Claim the message at TAIL: its slot index, EMPTY, IN_PROGRESS or CLOSED_CODE."""
    cap = ctl[CAPACITY]
    while True:
        pos = load_acquire(ctl, TAIL)  # pairs with the cas on TAIL below (ours or a helper's)
        i = pos % cap
        lap = pos // cap
        sw = _state_word(ctl, i)
        s = load_acquire(ctl, sw)  # pairs with store_release(READY) in _publish
        if _lap(s) == lap & LAP_MASK:
            phase = _phase(s)
            if phase == READY:
                if cas(ctl, sw, s, _pack(lap, READING, pid)) == s:
                    _count_claimed(ctl, sw)
                    cas(ctl, TAIL, pos, pos + 1)
                    return i
            elif phase == READING:
                cas(ctl, TAIL, pos, pos + 1)  # claimed by someone who has not moved TAIL yet
            elif load_relaxed(ctl, TAIL) == pos:
                if phase == WRITING:
                    return IN_PROGRESS
                if load_acquire(ctl, CLOSED) != 0 and load_acquire(ctl, sw) == s:
                    return CLOSED_CODE
                return EMPTY
        elif s == _pack(lap + 1, FREE, 0):
            cas(ctl, TAIL, pos, pos + 1)  # consumed and released before TAIL moved
        elif _lap(s) == (lap - 1) & LAP_MASK and load_relaxed(ctl, TAIL) == pos:
            # A consumer (perhaps this one) still holds the previous lap's message:
            # nothing newer can have been written here yet.
            if load_acquire(ctl, CLOSED) != 0:
                return CLOSED_CODE
            return EMPTY


@njit(cache=True)  # holds the GIL: releasing it costs more than the call
def _peek(ctl, pid):
    """Claim the next message: ``slot << 32 | length``, or a code."""
    i = _claim_read(ctl, pid)
    if i < 0:
        return i
    return (i << 32) | load_relaxed(ctl, _state_word(ctl, i) + _LENGTH)


@njit(nogil=True, cache=True)
def _peek_many(ctl, max_n, pid):
    """Claim up to ``max_n`` messages in consecutive slots: ``slot << 32 | k``."""
    i = _claim_read(ctl, pid)
    if i < 0:
        return i
    cap = ctl[CAPACITY]
    k = 1
    while k < max_n and i + k < cap:
        pos = load_acquire(ctl, TAIL)
        if pos % cap != i + k:
            break  # another consumer took the next one
        lap = pos // cap
        sw = _state_word(ctl, i + k)
        s = load_acquire(ctl, sw)  # pairs with store_release(READY) in _publish
        if _lap(s) != lap & LAP_MASK or _phase(s) != READY:
            break
        if cas(ctl, sw, s, _pack(lap, READING, pid)) != s:
            break
        _count_claimed(ctl, sw)
        cas(ctl, TAIL, pos, pos + 1)
        k += 1
    return (i << 32) | k


@njit(cache=True)  # holds the GIL: releasing it costs more than the call
def _release(ctl, i, k):
    lap = 0
    for j in range(k):
        sw = _state_word(ctl, i + j)
        lap = _lap(load_relaxed(ctl, sw)) + 1
        store_release(ctl, sw, _pack(lap, FREE, 0))  # pairs with load_acquire(sw) in _claim_write
    if sleepers(ctl, EV_NOT_FULL) > 0 and _refilled(ctl, i, k, lap):
        notify_always(ctl, EV_NOT_FULL)


@njit(nogil=True, cache=True)
def _take_into(ctl, out, pid):
    """Take the next message, copy it into ``out`` and free its slot: its length, or a code."""
    return take_into_with(ctl, out, pid, _peek, _release)


@njit(cache=True)  # holds the GIL, as _peek and _release do
def _take_small(ctl, out, pid):
    """Take the next message: if it fits ``out``, copy it there and free its slot: its
    length; else keep the slot claimed: ``HELD | slot << 32 | length``; or a code."""
    r = _peek(ctl, pid)
    if r < 0:
        return r
    i = r >> 32
    n = r & 0xFFFFFFFF
    if n > len(out):
        return HELD | r
    copy_bytes(out, 0, ctl.view(np.uint8), ctl[SLOTS] + i * ctl[STRIDE], n)
    _release(ctl, i, 1)
    return n


@njit(nogil=True, cache=True)
def _watch_write(ctl, pid):
    """(-1, 0) if a claim for writing could go ahead (or closed); else a state word and
    its value to wait on: that of the last slot of HEAD's refill batch, whose release
    wakes the producers (see Waking), or HEAD's own where that one is free already."""
    if load_relaxed(ctl, CLOSED) != 0:
        return -1, 0
    cap = ctl[CAPACITY]
    pos = load_acquire(ctl, HEAD)
    h = pos % cap
    sw = _state_word(ctl, h)
    s = load_acquire(ctl, sw)  # pairs with store_release(FREE) in _release
    if _lap(s) == (pos // cap) & LAP_MASK:
        return -1, 0
    end = pos + _batch_end(cap, h) - h
    ew = _state_word(ctl, end % cap)
    e = load_acquire(ctl, ew)  # pairs with store_release(FREE) in _release
    if e == _pack(end // cap, FREE, 0):
        return sw, s
    return ew, e


@njit(nogil=True, cache=True)
def _held_at_head(ctl):
    """The slot at HEAD if a consumer still holds its previous lap's message, else -1."""
    cap = ctl[CAPACITY]
    pos = load_acquire(ctl, HEAD)
    s = load_acquire(ctl, _state_word(ctl, pos % cap))
    if _lap(s) == (pos // cap - 1) & LAP_MASK and _phase(s) == READING:
        return pos % cap
    return -1


@njit(nogil=True, cache=True)
def _holder(ctl):
    """The pid of the consumer that holds the previous lap's message in the slot at HEAD
    (the slot the next put needs), else 0."""
    slot = _held_at_head(ctl)
    if slot < 0:
        return 0
    return load_acquire(ctl, _state_word(ctl, slot)) & PID_MASK  # pairs with the claim's cas in _claim_read


@njit(nogil=True, cache=True)
def _watch_read(ctl, pid):
    """(-1, 0) if a claim for reading could go ahead (or closed and drained); else the
    state word of the slot at TAIL and its value."""
    cap = ctl[CAPACITY]
    pos = load_acquire(ctl, TAIL)
    lap = pos // cap
    sw = _state_word(ctl, pos % cap)
    s = load_acquire(ctl, sw)  # pairs with store_release(READY) in _publish
    if _lap(s) == lap & LAP_MASK:
        phase = _phase(s)
        if phase == READY or phase == READING:
            return -1, 0
        if phase == FREE and load_acquire(ctl, CLOSED) != 0:
            return -1, 0
        return sw, s
    if _lap(s) == (lap - 1) & LAP_MASK:
        if load_acquire(ctl, CLOSED) != 0:
            return -1, 0
        return sw, s  # the previous lap's message is still held: wait for its release
    return -1, 0  # TAIL is stale: claiming will move it


class MPMCRing(ByteRing):
    """A ring of byte messages for any number of producer and consumer processes.

    A producer or consumer SIGKILLed in the middle of a message costs that one
    message (counted in ``statistics().dead_claims_skipped``) and stalls the others
    for at most about a sleep chunk (50 ms) plus the time to notice."""

    KIND = "mpmc"
    SLOT_WORDS_PER_SLOT = WORDS_PER_LINE
    RELEASES_IN_ORDER = False
    kernels = Kernels.of(globals())

    def __init__(self, segment: Segment):
        super().__init__(segment)
        self._small = np.empty(min(self.slot_size, SMALL), np.uint8)
        self._small_view = memoryview(self._small)
        self._take_small = fast_entry(_take_small, self._ctl, self._small, 0)

    def get_bytes(self, timeout: float | None = None) -> bytes:
        """The next message as a copy; its slot is free again at once. Nothing is
        left held, and a message returned is never delivered again (a consumer that dies
        holding a view loses that message: it is dropped and counted, never re-delivered)."""
        # one call into compiled code where the message is small: it is copied out and
        # its slot freed in the call (peek, then release is two calls, slower for small messages)
        r = self._take_small(self._ctl, self._small, pids.pid)
        if r < 0:
            r = self._retry(r, self._take_small_once, True, timeout, "get_bytes", None)
        if r < HELD:
            return self._small_view[:r].tobytes()
        return self._copy_out(r ^ HELD)

    def get_bytes_nowait(self) -> bytes:
        """``get_bytes`` that raises ``WouldBlock`` instead of waiting."""
        r = self._take_small(self._ctl, self._small, pids.pid)
        if r < 0:
            self._raise_empty(r)
        if r < HELD:
            return self._small_view[:r].tobytes()
        return self._copy_out(r ^ HELD)

    def _take_small_once(self) -> int:
        return self._take_small(self._ctl, self._small, pids.pid)

    def get_into(self, out: Any, timeout: float | None = None) -> int:
        """Copy the next message into ``out`` (a writable bytes-like object of at
        least ``slot_size`` bytes) and free its slot, in one call into compiled code;
        returns the message's length. No allocation: the fast copying read."""
        # ByteRing.get_into less what an MPMC ring never needs (a read-ahead to hand
        # back, views that must be released first): most of a call's cost is Python's
        buf = self._into_buf if out is self._into_out else self._into(out)
        r = self._take_into(self._ctl, buf, pids.pid)
        if r < 0:
            r = self._take_into_waiting(r, buf, timeout)
        return r

    def _traffic(self) -> tuple[int, int, int, int]:
        puts, gets, bytes_put, bytes_got = _traffic(self._ctl)
        return int(puts), int(gets), int(bytes_put), int(bytes_got)

    def _lengths(self, slot: int, k: int) -> np.ndarray:
        first = self._slot_words + slot * WORDS_PER_LINE + _LENGTH
        return self._ctl[first : first + k * WORDS_PER_LINE : WORDS_PER_LINE]

    def _release_except(self, keep: list[tuple[int, int]]) -> None:
        """Free every held slot but the runs in ``keep``."""
        kept = {slot for first, k in keep for slot in range(first, first + k)}
        for first, k in self._held:
            for slot in range(first, first + k):
                if slot not in kept:
                    self._release(self._ctl, slot, 1)
        self._held[:] = keep

    def _producers_wait_for_me(self) -> bool:
        # The slot at HEAD still holds the previous lap's message, handed out by this handle.
        slot = _held_at_head(self._ctl)
        return slot >= 0 and any(first <= slot < first + k for first, k in self._held)

    def _release_runs(self, runs: list[tuple[int, int]]) -> None:
        """Free the slots of ``runs`` (slot, count) only; every other held slot stays held."""
        gone = {slot for first, k in runs for slot in range(first, first + k)}
        for slot in gone:
            self._release(self._ctl, slot, 1)
        left = []
        for first, k in self._held:
            left.extend((slot, 1) for slot in range(first, first + k) if slot not in gone)
        self._held[:] = left

    def _recover(self) -> None:
        me = current_pid()
        for which in (0, 1):
            pid, state = _stuck(self._ctl, which)
            if pid and pid != me and not pid_alive(pid):
                _drop_claim(self._ctl, which, state)
