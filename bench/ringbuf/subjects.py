"""bench.ringbuf's shmpad subjects: the SPSC and MPMC rings read every way they can be
(single calls, into a buffer, batches, zero-copy views), beside the peers of
``bench/ringbuf/peers.py``. The rings are imported lazily so that the peers run without them.
"""

from __future__ import annotations

from time import perf_counter
from typing import ClassVar

import numpy as np

from bench.ringbuf.contract import END, Plan, Subject, Tally, idler, receive_until_ends, send_for


def ring_class(kind: str):
    if kind == "spsc":
        from shmpad.ringbuf.spsc import SPSCRing

        return SPSCRing
    from shmpad.ringbuf.mpmc import MPMCRing

    return MPMCRing


_warmed: set[str] = set()


def warm_up(kind: str) -> None:
    """Compile every kernel the subjects call, once, in the parent: forked children
    inherit the machine code instead of each loading it again."""
    from shmpad.errors import Timeout

    if kind in _warmed:
        return

    def timing_out(call) -> None:
        # Twice: a first call can spend its whole timeout compiling what leads up
        # to the wait, and then never reaches the wait.
        for _ in range(2):
            try:
                call()
            except Timeout:
                pass

    ring = ring_class(kind).create(capacity=4, slot_size=64)
    try:
        ring.put(bytes(64))
        ring.put_many(np.zeros((2, 64), np.uint8))
        ring.put_nowait(END)
        timing_out(lambda: ring.put(bytes(64), timeout=0.05))
        timing_out(lambda: ring.put_many(np.zeros((1, 64), np.uint8), timeout=0.05))
        ring.get_bytes()
        ring.get_bytes_nowait()
        view = ring.get()
        view = ring.get_nowait()
        del view
        ring.release()
        ring.put(bytes(64))
        batch = ring.get_many(4)
        del batch
        ring.release()
        timing_out(lambda: ring.get(timeout=0.05))
        timing_out(lambda: ring.get_many(4, timeout=0.05))
        ring.put(bytes(64))
        ring.get_into(np.empty(64, np.uint8))
        timing_out(lambda: ring.get_into(np.empty(64, np.uint8), timeout=0.05))
    finally:
        ring.close()
    _warmed.add(kind)


class ShmpadSubject(Subject):
    """shmpad rings: one MPMC ring shared by all producers, or one SPSC ring per
    producer which the consumer then polls in turn with the non-blocking calls,
    idling as the ceiling does when every ring is empty."""

    family = "shmpad"
    kind: ClassVar[str]

    def __init__(self, plan: Plan):
        super().__init__(plan)
        warm_up(self.kind)
        cls = ring_class(self.kind)
        if self.kind == "spsc":
            self._rings = [
                cls.create(capacity=plan.capacity_per_producer, slot_size=plan.size) for _ in range(plan.producers)
            ]
        else:
            self._rings = [cls.create(capacity=plan.capacity, slot_size=plan.size)]

    def _ring(self, index: int):
        return self._rings[index % len(self._rings)]

    def produce(self, index: int) -> int:
        ring = self._ring(index)
        sent = send_for(ring.put, self.plan.message(), self.plan)
        ring.put(END)
        return sent

    def consume(self) -> Tally:
        if len(self._rings) == 1:
            return self._consume_one(self._rings[0])
        return self._poll()

    def _consume_one(self, ring) -> Tally:
        raise NotImplementedError

    def _take_nowait(self, ring) -> tuple[int, bool]:
        """Receive what one poll of ``ring`` gives: (payload messages, end seen)."""
        raise NotImplementedError

    def _intact(self) -> bool:
        raise NotImplementedError

    def _poll(self) -> Tally:
        from shmpad.errors import Timeout, WouldBlock

        take, idle = self._take_nowait, idler()
        live = list(self._rings)
        received = first = 0
        t_first = 0.0
        while live:
            moved = False
            for ring in tuple(live):
                try:
                    n, end = take(ring)
                except (WouldBlock, Timeout):
                    continue
                received += n
                moved = True
                if end:
                    live.remove(ring)
            if not moved:
                idle()
            elif not t_first:
                t_first = perf_counter()
                first = received
        t_last = perf_counter()
        return Tally(received, received - first, t_first, t_last, received > 0 and self._intact())

    def statistics(self) -> list:
        return [ring.statistics() for ring in self._rings]

    def close(self) -> None:
        for ring in self._rings:
            ring.close()


class _ShmpadSingle(ShmpadSubject):
    reads = "get_bytes() -> bytes (one copy out, slot freed at once); producers put(bytes)"

    def _consume_one(self, ring) -> Tally:
        return receive_until_ends(ring.get_bytes, self.plan)

    def _take_nowait(self, ring) -> tuple[int, bool]:
        msg = ring.get_bytes_nowait()
        if len(msg) != self.plan.size:
            return 0, True
        self._last = msg
        return 1, False

    def _intact(self) -> bool:
        return self._last == self.plan.message()


class _ShmpadBatch(ShmpadSubject):
    reads = "get_many(batch): rows copied into a private [batch, size] numpy array, release(); producers put_many([batch, size] array)"

    def produce(self, index: int) -> int:
        ring = self._ring(index)
        put_many = ring.put_many
        rows = np.tile(self.plan.payload(), (self.plan.batch, 1))  # [batch, size]
        calls = 0
        stop = perf_counter() + self.plan.seconds
        while perf_counter() < stop:
            put_many(rows)
            calls += 1
        ring.put(END)
        return calls * self.plan.batch

    def _consume_one(self, ring) -> Tally:
        size, n_max = self.plan.size, self.plan.batch
        get_many, release, count_nonzero = ring.get_many, ring.release, np.count_nonzero
        self._dst = dst = np.empty((n_max, size), np.uint8)  # [batch, size]
        self._filled = 0
        ends = received = 0
        first = -1
        t_first = 0.0
        while ends < self.plan.producers:
            batch = get_many(n_max)
            lengths = batch.lengths
            k = len(lengths)
            e = count_nonzero(lengths != size)
            if e:
                k = self._copy_payload_rows(batch)
                ends += e
            else:
                dst[:k] = batch.rows[:, :size]
                self._filled = k
            release()
            received += k
            if first < 0:
                t_first = perf_counter()
                first = received
        t_last = perf_counter()
        return Tally(received, received - max(first, 0), t_first, t_last, received > 0 and self._intact())

    def _copy_payload_rows(self, batch) -> int:
        """The rare batch holding end markers: copy only its payload rows."""
        keep = batch.lengths == self.plan.size
        k = int(keep.sum())
        if k:
            self._dst[:k] = batch.rows[keep, : self.plan.size]
            self._filled = k
        return k

    def _take_nowait(self, ring) -> tuple[int, bool]:
        if not hasattr(self, "_dst"):
            self._dst = np.empty((self.plan.batch, self.plan.size), np.uint8)  # [batch, size]
            self._filled = 0
        batch = ring.get_many(self.plan.batch, timeout=0)
        size = self.plan.size
        if batch.lengths[-1] != size:  # one producer per SPSC ring: the end comes last
            k = self._copy_payload_rows(batch)
            ring.release()
            return k, True
        k = len(batch)
        self._dst[:k] = batch.rows[:, :size]
        self._filled = k
        ring.release()
        return k, False

    def _intact(self) -> bool:
        return self._filled > 0 and bool((self._dst[: self._filled] == self.plan.payload()).all())


class _ShmpadZeroCopy(ShmpadSubject):
    reads = "get() -> read-only view into the slot; reads its first and last byte, release(); producers put(bytes)"

    def _consume_one(self, ring) -> Tally:
        size = self.plan.size
        get, release = ring.get, ring.release
        ends = received = 0
        edges = None
        view = get()
        t_first = perf_counter()
        if len(view) == size:
            edges = view[0], view[-1]
            received = 1
        else:
            ends = 1
        release()
        first = received
        while ends < self.plan.producers:
            view = get()
            if len(view) == size:
                edges = view[0], view[-1]
                received += 1
            else:
                ends += 1
            release()
        t_last = perf_counter()
        self._edges = edges
        return Tally(received, received - first, t_first, t_last, received > 0 and self._intact())

    def _take_nowait(self, ring) -> tuple[int, bool]:
        view = ring.get_nowait()
        if len(view) != self.plan.size:
            ring.release()
            return 0, True
        self._edges = view[0], view[-1]
        ring.release()
        return 1, False

    def _intact(self) -> bool:
        payload = self.plan.payload()
        return self._edges == (payload[0], payload[-1])


class _ShmpadInto(ShmpadSubject):
    reads = "get_into(buffer): one copy into a private numpy buffer, slot freed in the same call; producers put(bytes)"

    def _consume_one(self, ring) -> Tally:
        self._dst = dst = np.empty(self.plan.size, np.uint8)
        size = self.plan.size
        get_into = ring.get_into
        ends = received = 0
        n = get_into(dst)
        t_first = perf_counter()
        if n == size:
            received = 1
        else:
            ends = 1
        first = received
        while ends < self.plan.producers:
            if get_into(dst) == size:
                received += 1
            else:
                ends += 1
        t_last = perf_counter()
        return Tally(received, received - first, t_first, t_last, received > 0 and self._intact())

    def _take_nowait(self, ring) -> tuple[int, bool]:
        if not hasattr(self, "_dst"):
            self._dst = np.empty(self.plan.size, np.uint8)
        if ring.get_into(self._dst, timeout=0) != self.plan.size:
            return 0, True
        return 1, False

    def _intact(self) -> bool:
        # The end marker was copied into the same buffer after the last payload:
        # compare what it did not overwrite.
        return bool((self._dst[len(END) :] == self.plan.payload()[len(END) :]).all())


def _shmpad_subject(base: type[ShmpadSubject], kind: str, suffix: str) -> type[ShmpadSubject]:
    name = f"shmpad-{kind}{suffix}"
    return type(name, (base,), {"name": name, "kind": kind, "__doc__": base.__doc__})


SHMPAD = [
    _shmpad_subject(base, kind, suffix)
    for kind in ("spsc", "mpmc")
    for base, suffix in (
        (_ShmpadSingle, ""),
        (_ShmpadInto, "-into"),
        (_ShmpadBatch, "-batch"),
        (_ShmpadZeroCopy, "-zc"),
    )
]


def copies(subject: type[Subject]) -> bool:
    """The consumer copies every payload out (the zero-copy subjects only look)."""
    return not subject.name.endswith("-zc")


def single_calls(subject: type[Subject]) -> bool:
    return copies(subject) and not subject.name.endswith("-batch")


def missing_ring(subject: type[Subject]) -> str | None:
    """Why ``subject`` cannot run here: its ring module does not import (missing, or broken mid-edit)."""
    if not issubclass(subject, ShmpadSubject):
        return None
    try:
        ring_class(subject.kind)
    except Exception as e:
        return f"its ring does not import: {e!r}"
    return None
