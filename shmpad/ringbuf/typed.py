"""Typed rings: every slot holds one fixed-shape array per field of a spec.

A spec is ``{name: (dtype, shape)}``. The payload is laid out field by field
(struct of arrays), after the slots of the control ring, in the segment's extra
area (``meta["extra"]``)::

    field f:  byte  extra + offset_f,  a C-contiguous array [capacity, *shape_f]
              (offset_f 64-byte aligned; offsets in field order, recorded in meta:
              ``shmpad.shm.arrays.field_entries``, mapped back by ``map_fields``)

so that slots ``i..i+B`` of a field are one contiguous ``[B, *shape]`` array:
``get_batch`` returns such views without a copy whenever the slots it took are
consecutive, and gathers into a per-handle buffer only when they wrap.

The order and ownership of slots is the control ring's (``SPSCRing`` or
``MPMCRing``, by ``multi``): only slot indices move through its words, and the
writer fills the slot's arrays in place.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from shmpad._checks import deadline as _deadline
from shmpad.errors import SegmentError, Timeout, WouldBlock
from shmpad.ringbuf.blocking import nowait
from shmpad.ringbuf.mpmc import MPMCRing
from shmpad.ringbuf.ring import MAX_CAPACITY, ByteRing, RingStatistics
from shmpad.ringbuf.spsc import SPSCRing
from shmpad.shm.arrays import Spec, as_array, field_entries, fields_of, map_fields, to_torch
from shmpad.shm.segment import Segment

__all__ = ["TypedRing", "Spec"]


class TypedRing:
    """A ring whose slots are dicts of fixed-shape arrays, written and read in place.

    >>> ring = TypedRing.create({"obs": (np.uint8, (4, 84, 84)), "reward": (np.float32, ())}, capacity=64)
    >>> slot = ring.reserve(); slot["obs"][:] = frame; slot["reward"][...] = 1.0; ring.commit()
    >>> item = ring.get(); ...; ring.release()
    >>> batch = ring.get_batch(32)   # {"obs": [32, 4, 84, 84], "reward": [32]}
    """

    @classmethod
    def create(cls, spec: Spec, capacity: int, multi: bool = True, name: str | None = None) -> "TypedRing":
        """A ring of ``capacity`` slots shaped by ``spec``. ``multi=True`` (the default, as
        for ``RingNode``) allows any number of producers and consumers (MPMC);
        ``multi=False`` is the faster ring for exactly one of each (SPSC)."""
        fields = fields_of(spec)
        ring_cls = MPMCRing if multi else SPSCRing
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be between 1 and {MAX_CAPACITY}, got {capacity}")
        entries, end = field_entries(fields, int(capacity))
        seg = ring_cls.create_segment(int(capacity), 1, name, {"spec": entries}, max(end, 1))
        return cls(ring_cls(seg))

    @classmethod
    def attach(cls, name: str) -> "TypedRing":
        """Attach to a typed ring another process created, by name."""
        for ring_cls in (SPSCRing, MPMCRing):
            try:
                seg = Segment.attach(name, ring_cls.KIND)
            except SegmentError as e:
                if "not a" in str(e) and "holds a" in str(e):
                    continue
                raise
            if "spec" not in seg.meta:
                raise SegmentError(f"segment {seg.name!r} holds a byte ring, not a typed ring")
            return cls(ring_cls(seg))
        raise SegmentError(f"segment {name!r} holds neither an SPSC nor an MPMC ring")

    def __init__(self, ring: ByteRing):
        self._ring = ring
        seg = ring.segment
        self.capacity = ring.capacity
        self.multi = isinstance(ring, MPMCRing)
        self.spec: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
            fname: (np.dtype(dstr), tuple(shape)) for fname, dstr, shape, _ in seg.meta["spec"]
        }
        self._fields = map_fields(
            seg.data, seg.meta["spec"], self.capacity, f"typed ring {seg.name!r}", seg.meta["extra"]
        )
        self._readonly = {f: a.view() for f, a in self._fields.items()}
        for a in self._readonly.values():
            a.flags.writeable = False
        self.item_bytes = sum(a.nbytes // self.capacity for a in self._fields.values())
        self._reserved = -1
        self._carry: list[tuple[int, int]] = []  # runs taken by a get_batch that timed out
        # MPMC: items a waiting get_batch copied out of their slots (rows [at, n) of each array)
        self._staged: dict[str, np.ndarray] = {}
        self._staged_at = self._staged_n = 0

    @property
    def name(self) -> str:
        return self._ring.name

    def __reduce__(self):
        return (TypedRing.attach, (self._ring.name,))

    def __repr__(self) -> str:
        kind = "MPMC" if self.multi else "SPSC"
        fields = ", ".join(f"{n}: {d}{list(s)}" for n, (d, s) in self.spec.items())
        return f"TypedRing({self.name!r}, {kind}, capacity={self.capacity}, {{{fields}}})"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- producing -------------------------------------------------------------------

    def reserve(self, timeout: float | None = None) -> dict[str, np.ndarray]:
        """The arrays of a free slot, to fill in place; ``commit()`` publishes them."""
        if self._reserved >= 0:
            raise RuntimeError("reserve() called again before commit() of the previous reservation")
        slot = self._ring.claim_slot(0, timeout, "reserve")
        self._reserved = slot
        return {f: a[slot, ...] for f, a in self._fields.items()}

    def commit(self) -> None:
        """Publish the reserved slot."""
        if self._reserved < 0:
            raise RuntimeError("commit() without a reserve()")
        slot, self._reserved = self._reserved, -1
        self._ring.commit_slot(slot, self.item_bytes)

    def reserve_nowait(self) -> dict[str, np.ndarray]:
        """``reserve`` that raises ``WouldBlock`` instead of waiting when the ring is full."""
        return nowait(self.reserve)

    def put_nowait(self, item: Mapping[str, Any]) -> None:
        """``put`` that raises ``WouldBlock`` instead of waiting when the ring is full."""
        nowait(self.put, item)

    def put(self, item: Mapping[str, Any], timeout: float | None = None) -> None:
        """Copy ``item`` (a value for every field, of the field's shape) into a slot."""
        self._check_item(item)
        if self._reserved >= 0:
            raise RuntimeError("put() called between reserve() and commit()")
        self._reserved = self._ring.claim_slot(0, timeout, "put")
        slot = {f: a[self._reserved, ...] for f, a in self._fields.items()}
        try:
            for f, dst in slot.items():
                np.copyto(dst, as_array(item[f]), casting="same_kind")
        except BaseException:
            # The slot is claimed: publish it rather than leak it; the check above
            # makes this unreachable for well-formed items.
            self.commit()
            raise
        self.commit()

    def _check_item(self, item: Mapping[str, Any]) -> None:
        if not isinstance(item, Mapping):
            raise TypeError(f"item must be a dict of field -> array, got {type(item).__name__}")
        missing = [f for f in self.spec if f not in item]
        extra = [f for f in item if f not in self.spec]
        if missing or extra:
            raise ValueError(f"item fields must be {sorted(self.spec)}; missing {missing}, unknown {extra}")
        for f, (dtype, shape) in self.spec.items():
            value = as_array(item[f])
            if value.shape != shape:
                raise ValueError(f"field {f!r} has shape {value.shape}, expected {shape}")
            if not np.can_cast(value.dtype, dtype, casting="same_kind"):
                raise TypeError(f"field {f!r} has dtype {value.dtype}, expected {dtype} (or one of the same kind)")

    # -- consuming -------------------------------------------------------------------

    def get(self, timeout: float | None = None, torch: bool = False) -> dict[str, Any]:
        """The next item as read-only views of its slot (torch tensors with
        ``torch=True``, sharing the memory), valid until ``release()``."""
        if self._staged_n > self._staged_at:
            return self._unstage_one(torch)
        slot = self._carried() if self._carry else self._ring.take_run(1, timeout, True, "get")[0]
        return self._views(slot, 1, torch, single=True)

    def get_nowait(self, torch: bool = False) -> dict[str, Any]:
        """``get`` that raises ``WouldBlock`` instead of waiting."""
        if self._staged_n > self._staged_at:
            return self._unstage_one(torch)
        slot = self._carried() if self._carry else self._ring.take_run(1, None, False, "get")[0]
        return self._views(slot, 1, torch, single=True)

    def _unstage_one(self, torch: bool) -> dict[str, Any]:
        """The oldest item a waiting ``get_batch`` copied out, handed out now."""
        at = self._staged_at
        self._staged_at += 1
        out = {f: a[at, ...] for f, a in self._staged.items()}
        return to_torch(out) if torch else out

    def _stage(self, runs: list[tuple[int, int]], batch_size: int) -> None:
        """Copy the items of ``runs`` into private memory and free their slots now.

        A batch that waits for more items must not hold the slots it has: with other
        consumers draining the ring, the producers would come round to a held slot and
        wait for this consumer, which waits for them (the ring empty, no one moving)."""
        n = sum(k for _, k in runs)
        left = self._staged_n - self._staged_at
        fresh = {}
        for f, a in self._fields.items():
            buf = np.empty((max(batch_size, left + n), *a.shape[1:]), a.dtype)  # a new one: handed-out rows stay valid
            if left:
                buf[:left] = self._staged[f][self._staged_at : self._staged_n]
            at = left
            for slot, k in runs:
                buf[at : at + k] = a[slot : slot + k]
                at += k
            fresh[f] = buf
        self._staged, self._staged_at, self._staged_n = fresh, 0, left + n
        self._ring.release_runs(runs)

    def _carried(self) -> int:
        """The oldest item kept by a timed-out ``get_batch``, handed out now."""
        slot, k = self._carry[0]
        if k == 1:
            del self._carry[0]
        else:
            self._carry[0] = (slot + 1, k - 1)
        return slot

    def get_batch_nowait(self, batch_size: int, torch: bool = False) -> dict[str, Any]:
        """``get_batch`` that raises ``WouldBlock`` instead of waiting for ``batch_size`` items
        (the items it took are kept for the next call, as after a ``Timeout``)."""
        return nowait(self.get_batch, batch_size, torch=torch)

    def get_batch(self, batch_size: int, timeout: float | None = None, torch: bool = False) -> dict[str, Any]:
        """Exactly ``batch_size`` items as ``[B, ...]`` arrays, valid until ``release()``.

        Views into the ring when the items sit in consecutive slots (always, for a
        single consumer whose capacity is a multiple of ``batch_size``); otherwise a
        copy. On ``Timeout`` the items already taken are kept and come first from the
        next ``get``/``get_batch``, so nothing is lost. On an MPMC ring a batch that has
        to wait first copies the items it took out of their slots and frees them, so
        that it never holds slots the producers need while other consumers drain the
        ring (the batch is then a copy)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
        if not 1 <= batch_size <= self.capacity:
            raise ValueError(f"batch_size must be between 1 and the capacity {self.capacity}, got {batch_size}")
        deadline = _deadline(timeout)
        runs, self._carry = _split(self._carry, batch_size)
        staged = min(self._staged_n - self._staged_at, batch_size)
        got = staged + sum(k for _, k in runs)
        while got < batch_size:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if self.multi and runs:
                    try:
                        slot, k = self._ring.take_run(batch_size - got, None, False, "get_batch")
                    except WouldBlock:  # about to wait: let go of the slots taken so far
                        self._stage(runs, batch_size)
                        runs, staged = [], self._staged_n - self._staged_at
                        slot, k = self._ring.take_run(batch_size - got, remaining, True, "get_batch")
                else:
                    slot, k = self._ring.take_run(batch_size - got, remaining, True, "get_batch")
            except Timeout:
                self._carry = runs
                raise Timeout(
                    f"get_batch timed out after {timeout} s with {got} of {batch_size} items (kept for the next call)"
                ) from None
            except BaseException:
                self._carry = runs
                raise
            if runs and runs[-1][0] + runs[-1][1] == slot:
                runs[-1] = (runs[-1][0], runs[-1][1] + k)
            else:
                runs.append((slot, k))
            got += k
        if not staged and len(runs) == 1:
            return self._views(runs[0][0], batch_size, torch, single=False)
        return self._gather(runs, batch_size, torch, staged)

    def release(self) -> None:
        """Free the slots of every item handed out by ``get``/``get_batch`` so far
        (items kept by a timed-out ``get_batch`` stay held)."""
        if self._carry:
            self._ring.release_all_but(self._carry)
        else:
            self._ring.release()

    def _views(self, slot: int, k: int, torch: bool, single: bool) -> dict[str, Any]:
        fields = self._fields if torch else self._readonly
        if single:
            out = {f: a[slot, ...] for f, a in fields.items()}
        else:
            out = {f: a[slot : slot + k] for f, a in fields.items()}
        return to_torch(out) if torch else out

    def _gather(self, runs: list[tuple[int, int]], batch_size: int, torch: bool, staged: int = 0) -> dict[str, Any]:
        """A copy of ``staged`` staged items, then the items of ``runs``, as one batch."""
        out = {}
        first = self._staged_at
        self._staged_at += staged
        for f, a in self._fields.items():
            buf = np.empty((batch_size, *a.shape[1:]), a.dtype)  # [B, ...]; a new one: earlier batches stay valid
            if staged:
                buf[:staged] = self._staged[f][first : first + staged]
            at = staged
            for slot, k in runs:
                buf[at : at + k] = a[slot : slot + k]
                at += k
            out[f] = buf
        return to_torch(out) if torch else out

    # -- shared ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the ring for every process, from any handle (see ``SPSCRing.close``)."""
        self._ring.close()

    @property
    def closed(self) -> bool:
        return self._ring.closed

    def statistics(self) -> RingStatistics:
        return self._ring.statistics()


def _split(runs: list[tuple[int, int]], n: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The first ``n`` items of ``runs`` (slot, count), and the rest."""
    head, tail = [], []
    for slot, k in runs:
        if n >= k:
            head.append((slot, k))
            n -= k
        elif n > 0:
            head.append((slot, n))
            tail.append((slot + n, k - n))
            n = 0
        else:
            tail.append((slot, k))
    return head, tail
