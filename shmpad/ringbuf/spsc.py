"""Single-producer single-consumer ring of byte messages in shared memory.

Layout of the data area (after the control block of ``control.py``)::

    word  SLOT_WORDS + i, i < capacity     length in bytes of the message in slot i
    byte  SLOTS + i * STRIDE                payload of slot i (64-byte aligned)

HEAD counts published messages and TAIL released ones; slot ``i`` of position
``p`` is ``p % capacity``. The producer writes the payload and the length, then
publishes with one release store of HEAD; the consumer reads HEAD with an acquire
load only when its cached copy (HEAD_SEEN) says the ring is empty, and the
producer reads TAIL only when TAIL_SEEN says it is full. The read cursor READ runs
ahead of TAIL while zero-copy views are held; ``release`` publishes it as TAIL.
``get_bytes`` reads ahead: one call into compiled code takes the run of messages
available, and later calls hand them out from Python (see ``SPSCRing.get_bytes``),
freeing the run's slots when its last message is handed out; meanwhile DELIVERED
counts the messages handed out as copies. A consumer in a new process (READER
differs) resumes from the later of TAIL and DELIVERED: a message a dead consumer
held as a view and never released is delivered again (at least once), a message it
got as a copy never is (exactly once). Views taken before a copy are freed with it
(SPSC frees in order), so a consumer that dies holding views and a later copy loses
those views with it.

One producer and one consumer at a time, each in one thread.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmpad.ringbuf.control import (
    BYTES_GOT,
    BYTES_PUT,
    CAPACITY,
    CLOSED,
    CLOSED_CODE,
    DELIVERED,
    EMPTY,
    EV_NOT_EMPTY,
    EV_NOT_FULL,
    FULL,
    GETS,
    HEAD,
    HEAD_SEEN,
    PUTS,
    READ,
    READER,
    SLOT_SIZE,
    SLOT_WORDS,
    SLOTS,
    STRIDE,
    TAIL,
    TAIL_SEEN,
    TOO_BIG,
    Kernels,
    take_into_with,
)
from shmpad.ringbuf.ring import ByteRing
from shmpad.shm import pids
from shmpad.shm.atomics import load_acquire, load_relaxed, store_relaxed, store_release
from shmpad.shm.compiled import fast_entry
from shmpad.shm.memcopy import copy_bytes
from shmpad.shm.wait import notify

__all__ = ["SPSCRing"]


@njit(nogil=True, cache=True)
def _free(ctl, head):
    """Free slots seen by the producer at ``head``."""
    cap = ctl[CAPACITY]
    free = cap - (head - load_relaxed(ctl, TAIL_SEEN))
    if free <= 0:
        tail = load_acquire(ctl, TAIL)  # pairs with store_release(TAIL) in _release
        store_relaxed(ctl, TAIL_SEEN, tail)
        free = cap - (head - tail)
    return free


@njit(nogil=True, cache=True)
def _reader(ctl, pid):
    """The read cursor, resumed from TAIL (or DELIVERED, past copies handed out but not
    yet freed) when a new consumer process takes over."""
    if load_relaxed(ctl, READER) != pid:
        store_relaxed(ctl, READ, max(load_relaxed(ctl, TAIL), load_relaxed(ctl, DELIVERED)))
        store_relaxed(ctl, READER, pid)
    return load_relaxed(ctl, READ)


@njit(nogil=True, cache=True)
def _available(ctl, rd):
    """Published messages from ``rd`` on."""
    avail = load_relaxed(ctl, HEAD_SEEN) - rd
    if avail <= 0:
        head = load_acquire(ctl, HEAD)  # pairs with store_release(HEAD) in _publish
        store_relaxed(ctl, HEAD_SEEN, head)
        avail = head - rd
    return avail


@njit(nogil=True, cache=True)
def _publish(ctl, head, k, nbytes):
    store_release(ctl, HEAD, head + k)  # pairs with load_acquire(HEAD) in _available
    store_relaxed(ctl, PUTS, head + k)
    store_relaxed(ctl, BYTES_PUT, load_relaxed(ctl, BYTES_PUT) + nbytes)
    notify(ctl, EV_NOT_EMPTY)


@njit(nogil=True, cache=True)
def _reserve(ctl, n, pid):
    """Claim the next slot for ``n`` bytes written in place; returns its index."""
    if load_relaxed(ctl, CLOSED) != 0:
        return CLOSED_CODE
    if n > ctl[SLOT_SIZE]:
        return TOO_BIG
    head = load_relaxed(ctl, HEAD)
    if _free(ctl, head) <= 0:
        return FULL
    return head % ctl[CAPACITY]


@njit(cache=True)  # holds the GIL: releasing it costs more than the call
def _put(ctl, msg, pid):
    n = len(msg)
    i = _reserve(ctl, n, pid)
    if i < 0:
        return i
    store_relaxed(ctl, ctl[SLOT_WORDS] + i, n)
    copy_bytes(ctl.view(np.uint8), ctl[SLOTS] + i * ctl[STRIDE], msg, 0, n)
    _publish(ctl, load_relaxed(ctl, HEAD), 1, n)
    return 0


@njit(nogil=True, cache=True)
def _put_rows(ctl, rows, first, pid):
    """Put rows ``first..`` of a 2-D uint8 array, as many as fit; returns how many."""
    if load_relaxed(ctl, CLOSED) != 0:
        return CLOSED_CODE
    n = rows.shape[1]
    if n > ctl[SLOT_SIZE]:
        return TOO_BIG
    head = load_relaxed(ctl, HEAD)
    k = min(_free(ctl, head), rows.shape[0] - first)
    if k <= 0:
        return 0
    cap, stride, slots, lens = ctl[CAPACITY], ctl[STRIDE], ctl[SLOTS], ctl[SLOT_WORDS]
    data = ctl.view(np.uint8)
    flat = rows.reshape(-1)
    for j in range(k):
        i = (head + j) % cap
        store_relaxed(ctl, lens + i, n)
        copy_bytes(data, slots + i * stride, flat, (first + j) * n, n)
    _publish(ctl, head, k, k * n)
    return k


@njit(nogil=True, cache=True)
def _put_packed(ctl, buf, offsets, first, pid):
    """Put messages ``first..`` of ``buf`` (message j is ``buf[offsets[j]:offsets[j+1]]``)."""
    if load_relaxed(ctl, CLOSED) != 0:
        return CLOSED_CODE
    head = load_relaxed(ctl, HEAD)
    k = min(_free(ctl, head), offsets.shape[0] - 1 - first)
    if k <= 0:
        return 0
    cap, stride, slots, lens, size = ctl[CAPACITY], ctl[STRIDE], ctl[SLOTS], ctl[SLOT_WORDS], ctl[SLOT_SIZE]
    data = ctl.view(np.uint8)
    total = 0
    for j in range(k):
        a = offsets[first + j]
        n = offsets[first + j + 1] - a
        if n > size:
            k = j
            break
        i = (head + j) % cap
        store_relaxed(ctl, lens + i, n)
        copy_bytes(data, slots + i * stride, buf, a, n)
        total += n
    if k > 0:
        _publish(ctl, head, k, total)
    return k


@njit(nogil=True, cache=True)
def _commit(ctl, slot, n):
    head = load_relaxed(ctl, HEAD)
    store_relaxed(ctl, ctl[SLOT_WORDS] + slot, n)
    _publish(ctl, head, 1, n)


@njit(nogil=True, cache=True)
def _closed_and_drained(ctl, rd):
    if load_acquire(ctl, CLOSED) != 0 and _available(ctl, rd) <= 0:
        return CLOSED_CODE
    return EMPTY


@njit(cache=True)  # holds the GIL: releasing it costs more than the call
def _release(ctl, slot, k):
    """Free every slot taken so far (SPSC releases in order; ``slot`` and ``k`` unused)."""
    rd = load_relaxed(ctl, READ)
    if rd != load_relaxed(ctl, TAIL):
        store_release(ctl, TAIL, rd)  # pairs with load_acquire(TAIL) in _free
        notify(ctl, EV_NOT_FULL)


@njit(cache=True)  # holds the GIL: releasing it costs more than the call
def _peek(ctl, pid):
    """Take the next message without releasing it: ``slot << 32 | length``, or a code."""
    rd = _reader(ctl, pid)
    if _available(ctl, rd) <= 0:
        return _closed_and_drained(ctl, rd)
    i = rd % ctl[CAPACITY]
    n = load_relaxed(ctl, ctl[SLOT_WORDS] + i)
    store_relaxed(ctl, READ, rd + 1)
    store_relaxed(ctl, GETS, load_relaxed(ctl, GETS) + 1)
    store_relaxed(ctl, BYTES_GOT, load_relaxed(ctl, BYTES_GOT) + n)
    return (i << 32) | n


@njit(nogil=True, cache=True)
def _peek_many(ctl, max_n, pid):
    """Take up to ``max_n`` messages in consecutive slots (never wrapping): ``slot << 32 | k``."""
    rd = _reader(ctl, pid)
    avail = _available(ctl, rd)
    if avail <= 0:
        return _closed_and_drained(ctl, rd)
    cap = ctl[CAPACITY]
    i = rd % cap
    k = min(avail, max_n, cap - i)
    lens = ctl[SLOT_WORDS]
    total = 0
    for j in range(k):
        total += load_relaxed(ctl, lens + i + j)
    store_relaxed(ctl, READ, rd + k)
    store_relaxed(ctl, GETS, load_relaxed(ctl, GETS) + k)
    store_relaxed(ctl, BYTES_GOT, load_relaxed(ctl, BYTES_GOT) + total)
    return (i << 32) | k


@njit(nogil=True, cache=True)
def _release_keep(ctl, keep):
    """Free everything taken except the newest ``keep`` messages."""
    rd = load_relaxed(ctl, READ) - keep
    if rd > load_relaxed(ctl, TAIL):
        store_release(ctl, TAIL, rd)  # pairs with load_acquire(TAIL) in _free
        notify(ctl, EV_NOT_FULL)


@njit(cache=True)  # holds the GIL: releasing it costs more than the call
def _refill(ctl, max_n, pid):
    """``_peek_many`` for the read-ahead of ``get_bytes``."""
    return _peek_many(ctl, max_n, pid)


@njit(nogil=True, cache=True)
def _untake(ctl, k, nbytes):
    """Give back the last ``k`` messages taken (``nbytes`` in all), not handed out."""
    store_relaxed(ctl, READ, load_relaxed(ctl, READ) - k)
    store_relaxed(ctl, GETS, load_relaxed(ctl, GETS) - k)
    store_relaxed(ctl, BYTES_GOT, load_relaxed(ctl, BYTES_GOT) - nbytes)


@njit(nogil=True, cache=True)
def _take_into(ctl, out, pid):
    """Take the next message, copy it into ``out`` and free its slot: its length, or a code."""
    return take_into_with(ctl, out, pid, _peek, _release)


@njit(nogil=True, cache=True)
def _watch_write(ctl, pid):
    """(-1, 0) if a put could go ahead (space, or closed); else the word to watch (TAIL)
    and the value it had when the ring was seen full."""
    if load_relaxed(ctl, CLOSED) != 0:
        return -1, 0
    tail = load_acquire(ctl, TAIL)  # pairs with store_release(TAIL) in _release
    if load_relaxed(ctl, HEAD) - tail < ctl[CAPACITY]:
        return -1, 0
    return TAIL, tail


@njit(nogil=True, cache=True)
def _watch_read(ctl, pid):
    """(-1, 0) if a get could go ahead (a message, or closed); else (HEAD, its value)."""
    if load_relaxed(ctl, CLOSED) != 0:
        return -1, 0
    head = load_acquire(ctl, HEAD)  # pairs with store_release(HEAD) in _publish
    if head > _reader(ctl, pid):
        return -1, 0
    return HEAD, head


@njit(nogil=True, cache=True)
def _holder(ctl):
    """The pid of the consumer that took, and has not freed, the message in the slot the
    next put needs (the ring is full and its oldest message was read); else 0."""
    tail = load_acquire(ctl, TAIL)  # pairs with store_release(TAIL) in _release
    if load_relaxed(ctl, HEAD) - tail >= ctl[CAPACITY] and load_relaxed(ctl, READ) > tail:
        return load_relaxed(ctl, READER)
    return 0


class SPSCRing(ByteRing):
    """A ring of byte messages for exactly one producer and one consumer.

    >>> ring = SPSCRing.create(capacity=1024, slot_size=4096)
    >>> ring.put(b"hello")
    >>> bytes(ring.get()); ring.release()
    b'hello'
    """

    KIND = "spsc"
    SLOT_WORDS_PER_SLOT = 1
    RESERVE_BLOCKS_PUT = True
    kernels = Kernels.of(globals())

    def __init__(self, segment):
        super().__init__(segment)
        self._refill = fast_entry(_refill, self._ctl, 0, 0)
        self._read_ahead = max(1, min(256, self.capacity // 4))
        # DELIVERED is written with a plain store from Python (half a numpy store's cost):
        # only this consumer writes it, and only a later consumer process reads it, after
        # this one has died or handed over (no payload is ordered by it)
        self._words = memoryview(self._ctl)
        self._cache_off = 0  # byte offset of the first message of the run read ahead
        self._cache_pos = 0  # its position (count of messages before it)
        self._cache_lens: list[int] = []  # lengths of the run's messages
        self._cache_fast: list[int] = []  # those of all but its last (get_bytes' common case)
        self._cache_next = 0  # index in the run of the next message to hand out

    def get_bytes(self, timeout: float | None = None) -> bytes:
        """The next message as a copy. A message returned is never delivered again,
        even if this process dies before its slot is freed.

        Takes every message available (a run of consecutive slots, up to a quarter
        of the ring) in one call into compiled code and hands them out one per call,
        counting each in DELIVERED; the run's slots are freed as its last message is
        handed out (or when this handle gets views, releases or closes, which hand
        back the rest first). With views held, the copy's slot is freed with them.
        A message copied out by ``get_into`` is never delivered again either."""
        i = self._cache_next
        try:  # every message of the run but its last: past them the index fails, at no cost before
            n = self._cache_fast[i]
        except IndexError:
            return self._end_of_run(timeout)
        self._cache_next = j = i + 1
        off = self._cache_off + i * self._stride
        data = self._mm[off : off + n]
        self._words[DELIVERED] = self._cache_pos + j  # after the copy: a death before it re-delivers
        return data

    def _end_of_run(self, timeout: float | None) -> bytes:
        """``get_bytes`` past the fast part of the run: its last message, whose hand-out
        frees the run, or the first of a new run."""
        lens = self._cache_lens
        if not lens:
            if self._held:
                return super().get_bytes(timeout)
            r = self._refill(self._ctl, self._read_ahead, pids.pid)
            if r < 0:
                r = self._retry(r, self._refill_once, True, timeout, "get_bytes", None)
            k = r & 0xFFFFFFFF
            slot = r >> 32
            first = self._slot_words + slot
            self._cache_lens = lens = self._ctl[first : first + k].tolist()
            self._cache_fast = lens[:-1]
            self._cache_off = self._slots_abs + slot * self._stride
            self._cache_pos = int(self._ctl[READ]) - k
            self._cache_next = 0
            if k > 1:
                return self.get_bytes(timeout)
        i = self._cache_next
        off = self._cache_off + i * self._stride
        data = self._mm[off : off + lens[i]]
        self._cache_lens = self._cache_fast = []
        self._release(self._ctl, 0, 0)  # TAIL passes the whole run
        return data

    def _copied_while_held(self) -> None:
        # its slot is freed with the views before it; until then DELIVERED says it left
        self._words[DELIVERED] = int(self._ctl[READ])

    def _producers_wait_for_me(self) -> bool:
        # one consumer: every slot holds a message this handle was handed out
        return sum(k for _, k in self._held) >= self.capacity

    def _release_except(self, keep: list[tuple[int, int]]) -> None:
        """Free every held slot but the runs in ``keep`` (the newest taken)."""
        self._drop_cache()
        _release_keep(self._ctl, sum(k for _, k in keep))
        self._held[:] = keep

    def _refill_once(self) -> int:
        return self._refill(self._ctl, self._read_ahead, pids.pid)

    def _drop_cache(self) -> None:
        lens, i = self._cache_lens, self._cache_next
        if lens:
            _untake(self._ctl, len(lens) - i, sum(lens[i:]))
            self._cache_lens = self._cache_fast = []
            if not self._held:
                self._release(self._ctl, 0, 0)

    def _lengths(self, slot: int, k: int) -> np.ndarray:
        base = self._slot_words
        return self._ctl[base + slot : base + slot + k]
