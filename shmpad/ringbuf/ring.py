"""The Python face of the byte rings: blocking, timeouts, views, batches, statistics.

A ring kind (``spsc.py``, ``mpmc.py``) supplies numba kernels with one calling
convention; this module turns them into ``put``/``get`` and friends. The fast
path of every call is one compiled kernel call: on success nothing else runs.
Kernels take the control words (``ctl``, the data area as int64) and the pid of
the calling process, and return a result >= 0 or a code from ``control.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np
from numba import njit

from shmpad._checks import check_int
from shmpad._checks import deadline as _deadline
from shmpad.errors import Closed, SegmentError, Timeout, WouldBlock
from shmpad.ringbuf.batch import MessageBatch
from shmpad.ringbuf.blocking import Blocking, nowait
from shmpad.ringbuf.control import (
    BYTES_GOT,
    BYTES_PUT,
    CAPACITY,
    CLOSED,
    CLOSED_CODE,
    CONTROL_WORDS,
    DEAD_CLAIMS,
    EV_NOT_EMPTY,
    EV_NOT_FULL,
    GETS,
    HEAD,
    PUTS,
    RESERVATION_OPEN,
    SLOT_SIZE,
    SLOT_WORDS,
    SLOTS,
    STRIDE,
    TAIL,
    WAITS_EMPTY,
    WAITS_FULL,
    Kernels,
)
from shmpad.shm import pids
from shmpad.shm.atomics import load_acquire, store_release
from shmpad.shm.compiled import fast_entry
from shmpad.shm.segment import CACHE_LINE, PAGE, Segment, round_up
from shmpad.shm.wait import notify_always

__all__ = ["ByteRing", "RingStatistics"]

MAX_SLOT_SIZE = (1 << 32) - 1
_NOWAIT: Any = object()  # put's timeout from put_nowait: fail at once, without counting a wait
MAX_CAPACITY = (1 << 31) - 1


@dataclass(frozen=True)
class RingStatistics:
    """Counters of a ring since it was created, summed over every process that used it,
    and who waits on whom now.

    ``producers_waiting`` counts the producers asleep until a slot is freed, and
    ``next_slot_held_by`` is the pid of the consumer that holds the message in the slot
    the next put needs (taken as a view, or read ahead, and not yet released), else 0.
    Both non-zero: that consumer stalls the producers, even when every other message has
    been read (a ring with no unread message and a blocked ``put``). Both are set by the
    ring (``init=False``), so the counters above keep their constructor."""

    capacity: int
    size: int
    puts: int
    gets: int
    bytes_put: int
    bytes_got: int
    waits_full: int
    waits_empty: int
    dead_claims_skipped: int
    closed: bool
    producers_waiting: int = field(default=0, init=False)
    next_slot_held_by: int = field(default=0, init=False)


def with_holder(stats: RingStatistics, producers_waiting: int, next_slot_held_by: int) -> RingStatistics:
    """``stats``, just made, with who waits on whom filled in."""
    # a frozen dataclass's init=False fields are set as its own __post_init__ would
    object.__setattr__(stats, "producers_waiting", producers_waiting)
    object.__setattr__(stats, "next_slot_held_by", next_slot_held_by)
    return stats


def as_u8(data: Any) -> np.ndarray:
    """A 1-D uint8 view of any C-contiguous bytes-like object (no copy): a message as the kernels take it."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return data.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        raise TypeError(
            f"a message must be bytes-like (bytes, bytearray, memoryview, numpy array), got {type(data).__name__}"
        ) from None


def rows_u8(messages: np.ndarray) -> np.ndarray:
    """The rows of a 2-D array of messages as ``[k, row bytes]`` uint8."""
    rows = np.ascontiguousarray(messages)
    return rows.view(np.uint8).reshape(rows.shape[0], -1)


@njit(nogil=True, cache=True)
def _close(ctl):
    store_release(ctl, CLOSED, 1)  # pairs with load_acquire(CLOSED) in the kernels' drain checks
    notify_always(ctl, EV_NOT_EMPTY)
    notify_always(ctl, EV_NOT_FULL)


@njit(nogil=True, cache=True)
def _load(ctl, idx):
    return load_acquire(ctl, idx)


class ByteRing(Blocking):
    """Shared behaviour of the byte-message rings; use ``SPSCRing`` or ``MPMCRing``."""

    KIND: ClassVar[str]
    kernels: ClassVar[Kernels]
    SLOT_WORDS_PER_SLOT: ClassVar[int]
    RELEASES_IN_ORDER: ClassVar[bool] = True
    # True where reserve() only finds the next slot (SPSC) rather than claiming it: a
    # put before commit() would then write the reserved slot.
    RESERVE_BLOCKS_PUT: ClassVar[bool] = False

    @classmethod
    def create(cls, capacity: int, slot_size: int, name: str | None = None):
        """A new ring of ``capacity`` slots, each holding a message of up to ``slot_size`` bytes."""
        capacity = check_int("capacity", capacity, 1, MAX_CAPACITY)
        slot_size = check_int("slot_size", slot_size, 1, MAX_SLOT_SIZE)
        return cls(cls.create_segment(capacity, slot_size, name, {}, 0))

    @classmethod
    def create_segment(
        cls, capacity: int, slot_size: int, name: str | None, extra_meta: dict, extra_bytes: int
    ) -> Segment:
        """The segment of a ring; ``extra_bytes`` more, page-aligned at ``meta["extra"]``,
        hold a payload laid out by the caller (typed rings, which hand the segment to ``cls``)."""
        stride = round_up(slot_size, CACHE_LINE)
        slot_words = CONTROL_WORDS
        slots = round_up(8 * (slot_words + capacity * cls.SLOT_WORDS_PER_SLOT), PAGE)
        extra = round_up(slots + capacity * stride, PAGE)
        meta = {"capacity": capacity, "slot_size": slot_size, **extra_meta}
        if extra_bytes:
            meta["extra"] = extra
        try:
            seg = Segment.create(cls.KIND, meta, extra + extra_bytes, name=name)
        except SegmentError as e:
            what = f"{capacity} slots of {slot_size} bytes" + (
                f" and {extra_bytes} bytes of typed slots" if extra_bytes else ""
            )
            raise SegmentError(f"a ring of capacity={capacity} ({what}): {e}") from None
        ctl = seg.data.view(np.int64)
        ctl[CAPACITY] = capacity
        ctl[SLOT_SIZE] = slot_size
        ctl[STRIDE] = stride
        ctl[SLOT_WORDS] = slot_words
        ctl[SLOTS] = slots
        return seg

    @classmethod
    def attach(cls, name: str):
        """Attach to a ring another process created, by name."""
        seg = Segment.attach(name, cls.KIND)
        if "spec" in seg.meta:
            raise SegmentError(f"segment {seg.name!r} holds a typed ring: attach it with TypedRing.attach")
        return cls(seg)

    def __init__(self, segment: Segment):
        self._seg = segment
        ctl = segment.data.view(np.int64)
        self._ctl = ctl
        self.capacity = int(ctl[CAPACITY])
        self.slot_size = int(ctl[SLOT_SIZE])
        if self.capacity != segment.meta.get("capacity") or self.slot_size != segment.meta.get("slot_size"):
            raise ValueError(f"ring {segment.name!r} is damaged: control block and metadata disagree")
        self._stride = int(ctl[STRIDE])
        self._slot_words = int(ctl[SLOT_WORDS])
        slots = int(ctl[SLOTS])
        self._slots_abs = segment.data_offset + slots
        self._mm = segment._mmap
        self._rw = memoryview(segment._mmap)
        self._ro = self._rw.toreadonly()
        rows = segment.data[slots : slots + self.capacity * self._stride].reshape(self.capacity, self._stride)
        rows.flags.writeable = False
        self._rows = rows
        self._held: list[tuple[int, int]] = []
        self._reserved = -1
        self._reserved_n = 0
        self._into_out: Any = None  # the last buffer get_into checked, and its byte view
        self._into_buf: np.ndarray | None = None
        k = self.kernels
        self._put = self._put_bytes = fast_entry(k.put, ctl, b"", 0)
        self._put_array = self._put_any = k.put
        self._peek = fast_entry(k.peek, ctl, 0)
        self._release = fast_entry(k.release, ctl, 0, 0)
        self._take_into = fast_entry(k.take_into, ctl, np.empty(1, np.uint8), 0)

    @property
    def name(self) -> str:
        """The segment's name: ``attach(name)`` in another process reaches this ring."""
        return self._seg.name

    def __reduce__(self):
        return (type(self).attach, (self._seg.name,))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, capacity={self.capacity}, slot_size={self.slot_size})"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- producing -------------------------------------------------------------------

    def put(self, data: Any, timeout: float | None = None) -> None:
        """Copy ``data`` (bytes-like, up to ``slot_size`` bytes) into the ring, waiting
        up to ``timeout`` seconds for a free slot (None: as long as it takes)."""
        if type(data) is bytes:
            r = self._put(self._ctl, data, pids.pid)
        else:
            data = as_u8(data)
            r = self._put_any(self._ctl, data, pids.pid)
        if r != 0:
            self._put_waiting(r, data, timeout)

    def _put_waiting(self, r: int, data: Any, timeout: Any) -> None:
        # put's slow path, a function of its own: the closure would cost every put its cells
        if timeout is _NOWAIT:
            self._raise_for(r, data)
            raise WouldBlock(f"ring is full ({self.capacity} messages)")
        put = self.kernels.put
        self._retry(r, lambda: put(self._ctl, data, pids.pid), False, timeout, "put", data)

    def put_nowait(self, data: Any) -> None:
        """``put`` that raises ``WouldBlock`` instead of waiting when the ring is full."""
        self.put(data, _NOWAIT)

    def put_many(self, messages: Sequence[Any] | np.ndarray, timeout: float | None = None) -> None:
        """Put every message, in order, waiting for space as needed.

        ``messages`` is a sequence of bytes-like objects or, fastest, a 2-D
        C-contiguous uint8 array whose rows are the messages. On ``Timeout`` or
        ``Closed`` the exception says how many were put (a prefix)."""
        if self._reserved >= 0 and self.RESERVE_BLOCKS_PUT:
            self._raise_for(RESERVATION_OPEN, None, "put_many")
        if isinstance(messages, np.ndarray) and messages.ndim == 2:
            rows = messages if messages.dtype == np.uint8 and messages.flags.c_contiguous else rows_u8(messages)
            if rows.shape[1] > self.slot_size:
                raise ValueError(f"slot holds at most {self.slot_size} bytes, got messages of {rows.shape[1]}")
            total = rows.shape[0]
            put_rows = self.kernels.put_rows
            step = lambda: put_rows(self._ctl, rows, done, pids.pid)  # noqa: E731
        else:
            parts = [m if type(m) is bytes else as_u8(m) for m in messages]
            lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
            if len(parts) and lengths.max() > self.slot_size:
                j = int(lengths.argmax())
                raise ValueError(f"slot holds at most {self.slot_size} bytes, got {lengths[j]} (message {j})")
            offsets = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
            total = len(parts)
            put_packed = self.kernels.put_packed
            step = lambda: put_packed(self._ctl, buf, offsets, done, pids.pid)  # noqa: E731
        deadline = _deadline(timeout)
        done = 0
        counter = WAITS_FULL
        while done < total:
            k = step()
            if k == CLOSED_CODE:
                raise Closed(f"ring is closed; put_many put {done} of {total} messages")
            done += k
            if done < total and k == 0:
                try:
                    self._wait(False, counter, deadline, timeout, "put_many")
                except Timeout:
                    raise Timeout(f"put_many timed out after {timeout} s with {done} of {total} messages put") from None
                counter = -1

    def put_many_nowait(self, messages: Sequence[Any] | np.ndarray) -> None:
        """``put_many`` that raises ``WouldBlock`` (saying how many were put) instead of
        waiting for space."""
        nowait(self.put_many, messages)

    def reserve_nowait(self, n: int) -> memoryview:
        """``reserve`` that raises ``WouldBlock`` instead of waiting when the ring is full."""
        return nowait(self.reserve, n)

    def reserve(self, n: int, timeout: float | None = None) -> memoryview:
        """A writable view of a free slot for ``n`` bytes, written in place; ``commit()``
        publishes it. One reservation at a time per ring handle."""
        if self._reserved >= 0:
            raise RuntimeError("reserve() called again before commit() of the previous reservation")
        n = check_int("n", n, 0, self.slot_size)
        self._reserved = self.claim_slot(n, timeout)
        self._reserved_n = n
        if self.RESERVE_BLOCKS_PUT:
            self._put = self._put_any = _reservation_open
        off = self._slots_abs + self._reserved * self._stride
        return self._rw[off : off + n]

    def claim_slot(self, n: int, timeout: float | None, what: str = "reserve") -> int:
        """The index of a free slot claimed for writing ``n`` bytes; publish it with
        ``commit_slot``."""
        reserve = self.kernels.reserve
        r = reserve(self._ctl, n, pids.pid)
        if r < 0:
            r = self._retry(r, lambda: reserve(self._ctl, n, pids.pid), False, timeout, what, None)
        return r

    def commit(self, n: int | None = None) -> None:
        """Publish the reserved slot with its first ``n`` bytes (default: all reserved)."""
        if self._reserved < 0:
            raise RuntimeError("commit() without a reserve()")
        n = self._reserved_n if n is None else check_int("n", n, 0, self._reserved_n)
        slot, self._reserved = self._reserved, -1
        self._put, self._put_any = self._put_bytes, self._put_array
        self.kernels.commit(self._ctl, slot, n)

    # -- consuming -------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> memoryview:
        """The next message as a read-only view into the ring, valid until ``release()``."""
        return self._get_view(timeout, "get")

    def _get_view(self, timeout: float | None, what: str) -> memoryview:
        self._drop_cache()
        r = self._peek(self._ctl, pids.pid)
        if r < 0:
            r = self._retry(r, self._peek_once, True, timeout, what, None)
        slot = r >> 32
        self._held.append((slot, 1))
        off = self._slots_abs + slot * self._stride
        return self._ro[off : off + (r & 0xFFFFFFFF)]

    def get_nowait(self) -> memoryview:
        """``get`` that raises ``WouldBlock`` instead of waiting when the ring is empty."""
        self._drop_cache()
        r = self._peek(self._ctl, pids.pid)
        if r < 0:
            self._raise_empty(r)
        slot = r >> 32
        self._held.append((slot, 1))
        off = self._slots_abs + slot * self._stride
        return self._ro[off : off + (r & 0xFFFFFFFF)]

    def get_bytes(self, timeout: float | None = None) -> bytes:
        """The next message as a copy. A message returned is never delivered again, even
        if this process dies at once (a view taken with ``get`` and not released may be:
        see the ring kinds). Its slot is free again at once, or, where views taken
        before it are held and the ring frees in order (SPSC), with them."""
        self._drop_cache()
        r = self._peek(self._ctl, pids.pid)
        if r < 0:
            r = self._retry(r, self._peek_once, True, timeout, "get_bytes", None)
        return self._copy_out(r)

    def get_bytes_nowait(self) -> bytes:
        """``get_bytes`` that raises ``WouldBlock`` instead of waiting."""
        self._drop_cache()
        r = self._peek(self._ctl, pids.pid)
        if r < 0:
            self._raise_empty(r)
        return self._copy_out(r)

    def get_into(self, out: Any, timeout: float | None = None) -> int:
        """Copy the next message into ``out`` (a writable bytes-like object of at
        least ``slot_size`` bytes) and free its slot, in one call into compiled code;
        returns the message's length. No allocation: the fast copying read."""
        buf = self._into_buf if out is self._into_out else self._into(out)
        self._drop_cache()
        if self._held and self.RELEASES_IN_ORDER:
            view = self._get_view(timeout, "get_into")
            n = len(view)
            buf[:n] = np.frombuffer(view, dtype=np.uint8)
            self._copied_while_held()
            return n
        r = self._take_into(self._ctl, buf, pids.pid)
        if r < 0:
            r = self._take_into_waiting(r, buf, timeout)
        return r

    def _take_into_waiting(self, r: int, buf: np.ndarray, timeout: float | None) -> int:
        # get_into's slow path, a function of its own: the closure would cost every call its cells
        take_into = self.kernels.take_into
        return self._retry(r, lambda: take_into(self._ctl, buf, pids.pid), True, timeout, "get_into", None)

    def _into(self, out: Any) -> np.ndarray:
        """``out`` checked and viewed as bytes, kept for the next call with the same ``out``."""
        self._into_buf = buf = self._into_buffer(out)
        self._into_out = out
        return buf

    def _into_buffer(self, out: Any) -> np.ndarray:
        if isinstance(out, np.ndarray) and not out.flags.c_contiguous:
            raise TypeError("out must be a writable, contiguous bytes-like object, got a non-contiguous ndarray")
        try:
            buf = out if isinstance(out, np.ndarray) else np.frombuffer(out, dtype=np.uint8)
            buf = buf.reshape(-1).view(np.uint8)
        except (TypeError, ValueError, AttributeError):
            raise TypeError(f"out must be a writable, contiguous bytes-like object, got {type(out).__name__}") from None
        if not buf.flags.writeable:
            raise TypeError(f"out must be writable, got a read-only {type(out).__name__}")
        if len(buf) < self.slot_size:
            raise ValueError(
                f"out holds {len(buf)} bytes; get_into needs room for a whole slot ({self.slot_size} bytes)"
            )
        return buf

    def _peek_once(self) -> int:
        return self._peek(self._ctl, pids.pid)

    def _copy_out(self, r: int) -> bytes:
        slot = r >> 32
        off = self._slots_abs + slot * self._stride
        data = self._mm[off : off + (r & 0xFFFFFFFF)]
        if self._held and self.RELEASES_IN_ORDER:
            self._held.append((slot, 1))  # freed with the views taken before it
            self._copied_while_held()
        else:
            self._release(self._ctl, slot, 1)
        return data

    def get_into_nowait(self, out: Any) -> int:
        """``get_into`` that raises ``WouldBlock`` instead of waiting when the ring is empty."""
        return nowait(self.get_into, out)

    def get_many(self, max_n: int, timeout: float | None = None) -> MessageBatch:
        """Between 1 and ``max_n`` messages from consecutive slots, without a copy,
        waiting up to ``timeout`` for the first. Valid until ``release()``."""
        slot, k = self.take_run(max_n, timeout, True)
        return MessageBatch(self._rows[slot : slot + k], self._lengths(slot, k))

    def get_many_nowait(self, max_n: int) -> MessageBatch:
        """``get_many`` that raises ``WouldBlock`` instead of waiting when the ring is empty."""
        slot, k = self.take_run(max_n, None, False)
        return MessageBatch(self._rows[slot : slot + k], self._lengths(slot, k))

    def take_run(self, max_n: int, timeout: float | None, wait: bool, what: str = "get_many") -> tuple[int, int]:
        """Take up to ``max_n`` messages in consecutive slots, held until ``release()``:
        (first slot, count)."""
        max_n = check_int("max_n", max_n, 1, MAX_CAPACITY)
        self._drop_cache()
        peek_many = self.kernels.peek_many
        r = peek_many(self._ctl, max_n, pids.pid)
        if r < 0:
            if not wait:
                self._raise_empty(r)
            r = self._retry(r, lambda: peek_many(self._ctl, max_n, pids.pid), True, timeout, what, None)
        slot, k = r >> 32, r & 0xFFFFFFFF
        self._held.append((slot, k))
        return slot, k

    def _drop_cache(self) -> None:
        """Kinds that read ahead for ``get_bytes`` put back what they have not handed out."""

    def _copied_while_held(self) -> None:
        """A copy was handed out whose slot stays held with earlier views (rings that free
        in order): kinds that resume a new consumer from the held slots note that it left."""

    def release(self) -> None:
        """Free the slots of every view handed out by ``get``/``get_many`` so far."""
        self._drop_cache()
        held = self._held
        if not held:
            return
        if self.RELEASES_IN_ORDER:
            self._release(self._ctl, 0, 0)
        else:
            for slot, k in held:
                self._release(self._ctl, slot, k)
        held.clear()

    # -- shared ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the ring for every process, from any handle (a producer's close ends the
        stream): puts raise ``Closed``, gets drain what is
        left and then raise ``Closed``, and every waiter wakes. The creating handle's
        close also removes the segment's name. Idempotent."""
        self._drop_cache()
        _close(self._ctl)
        if self._seg.owned:
            self._seg.unlink()

    @property
    def closed(self) -> bool:
        return bool(_load(self._ctl, CLOSED))

    def statistics(self) -> RingStatistics:
        c = self._ctl
        puts, gets, bytes_put, bytes_got = self._traffic()
        stats = RingStatistics(
            capacity=self.capacity,
            size=max(0, int(_load(c, HEAD)) - int(_load(c, TAIL))),
            puts=puts,
            gets=gets,
            bytes_put=bytes_put,
            bytes_got=bytes_got,
            waits_full=int(_load(c, WAITS_FULL)),
            waits_empty=int(_load(c, WAITS_EMPTY)),
            dead_claims_skipped=int(_load(c, DEAD_CLAIMS)),
            closed=bool(_load(c, CLOSED)),
        )
        waiting = int(_load(c, EV_NOT_FULL + 1))  # the event's sleepers (wait.py)
        return with_holder(stats, waiting, int(self.kernels.holder(c)))

    def _traffic(self) -> tuple[int, int, int, int]:
        """(puts, gets, bytes_put, bytes_got) since the ring was created."""
        c = self._ctl
        return int(_load(c, PUTS)), int(_load(c, GETS)), int(_load(c, BYTES_PUT)), int(_load(c, BYTES_GOT))

    # -- slots, for a structure that keeps its payload beside the ring's (TypedRing) -----

    @property
    def segment(self) -> Segment:
        """The ring's segment; a typed ring's arrays sit in its extra area."""
        return self._seg

    def commit_slot(self, slot: int, n: int) -> None:
        """Publish ``slot``, claimed by ``claim_slot``, as a message of ``n`` bytes."""
        self.kernels.commit(self._ctl, slot, n)

    def release_runs(self, runs: list[tuple[int, int]]) -> None:
        """Free the slots of ``runs`` (slot, count) only, now; every other held slot stays
        held (MPMC rings, which release out of order)."""
        self._release_runs(runs)

    def release_all_but(self, keep: list[tuple[int, int]]) -> None:
        """Free every held slot but the runs in ``keep`` (slot, count)."""
        self._release_except(keep)

    def _lengths(self, slot: int, k: int) -> np.ndarray:
        raise NotImplementedError

    def _release_except(self, keep: list[tuple[int, int]]) -> None:
        raise NotImplementedError

    def _release_runs(self, runs: list[tuple[int, int]]) -> None:
        raise NotImplementedError


def _reservation_open(ctl, data, pid) -> int:
    """Stands in for the put kernel while an SPSC reservation is open."""
    return RESERVATION_OPEN
