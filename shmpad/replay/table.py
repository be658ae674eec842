"""``Table``: a replay table in shared memory (Reverb's vocabulary), which every process
that holds it inserts into and samples from directly, with no server in between.

Layout of the data area of a ``replay`` segment (``meta`` holds the spec, ``max_size``,
the selectors, the rate limiter and every offset below)::

    bytes            contents
    ctl              CTL_WORDS int64 control words (index.py): the lock and its event,
                     the change event, size and the rate limiter's counters
    state .. free    7 int64/float64 arrays of max_size: state, owner, key, times, prio,
                     prev, nxt, free (index.py says what each holds)
    inflight         2 x MAX_INFLIGHT int64: (slot, pid) of the slots being written
    trees            4 float64 arrays of 2P: count, sum, min, max (P: power of two >= max_size)
    field f          [max_size, *shape_f] of dtype_f, 64-byte aligned, in spec order

An insert takes the lock to reserve a slot (evicting the remover's choice from a full
table), copies the item into it without the lock (nobody can see a WRITING slot), and
takes the lock again to publish it. A sample takes the lock to choose its items and count
the draws, and gathers their rows into fresh arrays after releasing it, so that samplers
copy side by side; it then checks, seqlock-style, that no insert evicted an item while it
was copied (its slot is still READY with the same key), and draws any such row again
under the lock (``hot_path.redraw``). With ``max_times_sampled`` a sample may free the
slots it draws, so it gathers under the lock. So a reader sees whole items only: an inserter
killed mid-copy leaves a WRITING slot that is never shown and is freed once its death
is noticed (when a slot or an insert is waited for); a process killed holding the lock
is replaced by the next waiter, which rebuilds the index (``lock.py``).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from shmpad._checks import check_int, deadline, type_name
from shmpad.errors import Closed, Timeout
from shmpad.replay import checkpoint as checkpoints
from shmpad.replay import hot_path, index, lock
from shmpad.replay.checkpoint import CONFIG_KEYS, Snapshot
from shmpad.replay.rate_limiters import MinSize, RateLimiter
from shmpad.replay.rate_limiters import from_dict as rate_limiter_from_dict
from shmpad.replay.selectors import Fifo, Selector, Uniform, check_selector, from_dict
from shmpad.replay.writer import Writer
from shmpad.shm.arrays import Spec, array_at, as_array, fields_of, to_torch
from shmpad.shm.pids import current_pid, pid_alive
from shmpad.shm.segment import Segment
from shmpad.shm.wait import finish_wait, notify, notify_always, prepare_wait, sleep

__all__ = ["Table", "TableInfo", "SampleBatch"]

KIND = "replay"
MAX_SIZE = 1 << 40
# A wait for the rate limiter or for a slot looks up this often: for a closed table, a
# dead inserter whose reservation holds the others back, and the deadline.
_POLL_NS = 10_000_000


@dataclass(frozen=True)
class SampleBatch:
    """A sampled batch: ``data[f]`` is ``[B, *shape_f]``; per row, the item's key, the
    probability that it was chosen, its priority, how often it has now been sampled,
    and the table's size when the batch was taken."""

    data: dict[str, Any]
    keys: np.ndarray
    probabilities: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    table_size: int


@dataclass(frozen=True)
class TableInfo:
    name: str
    max_size: int
    size: int
    inserts: int
    samples: int
    deletes: int
    pending_inserts: int
    sampler: Selector
    remover: Selector
    rate_limiter: RateLimiter
    max_times_sampled: int
    lock_recoveries: int


def _exponent(sampler: Selector, remover: Selector) -> float:
    exps = {s.exponent for s in (sampler, remover) if type(s).__name__ == "Prioritized"}
    if len(exps) > 1:
        raise ValueError(f"a Prioritized sampler and remover must share priority_exponent, got {sorted(exps)}")
    return exps.pop() if exps else 1.0


def _stream_key(stream: str) -> int:
    """A named stream as an int for ``np.random.default_rng`` (Python's ``hash`` of a
    str differs between processes)."""
    return int.from_bytes(hashlib.blake2b(stream.encode(), digest_size=8).digest(), "little")


def _check_priority(priority: Any, what: str = "priority") -> float:
    if isinstance(priority, bool) or not isinstance(priority, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number, got {type_name(priority)}")
    p = float(priority)
    if not (math.isfinite(p) and p >= 0):
        raise ValueError(f"{what} must be a finite number >= 0, got {p}")
    return p


class Table:
    """A replay table of at most ``max_size`` items, each a dict of fixed-shape arrays
    (``spec``: ``{field: (dtype, shape)}``, as ``TypedRing``).

    ``sampler`` picks what ``sample`` returns and ``remover`` what an insert into a
    full table evicts (``shmpad.replay.selectors``); ``rate_limiter`` paces inserts
    against samples (``shmpad.replay.rate_limiters``); an item sampled
    ``max_times_sampled`` times is deleted (0: never). ``seed`` seeds this handle's
    choices: the creating process draws the same stream from it every run; a handle
    attached with a ``stream`` name draws the stream of ``seed`` and that name, the same
    every run (a ``ReplayNode``'s client names its node); every other handle (attached
    without one, or a forked copy) draws its process's own.

    The creating handle owns the segment: its ``close`` removes it. A table pickles
    to its segment's name; unpickled (in a node, say) it attaches.
    """

    def __init__(
        self,
        name: str,
        spec: Spec,
        max_size: int,
        sampler: Selector | None = None,
        remover: Selector | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int = 0,
        *,
        seed: int | None = None,
    ):
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        fields = fields_of(spec)
        max_size = check_int("max_size", max_size, 1, MAX_SIZE)
        sampler = check_selector("sampler", Uniform() if sampler is None else sampler)
        remover = check_selector("remover", Fifo() if remover is None else remover)
        rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        if not isinstance(rate_limiter, RateLimiter):
            raise TypeError(
                "rate_limiter must be MinSize(...), SampleToInsertRatio(...) or Queue(...) from "
                f"shmpad.replay, got {type_name(rate_limiter)}"
            )
        max_times_sampled = check_int("max_times_sampled", max_times_sampled, minimum=0)
        exponent = _exponent(sampler, remover)
        offsets = index.offsets(fields, max_size)
        meta = {
            "name": name,
            "spec": [[f, d.str, list(s)] for f, d, s in fields],
            "max_size": max_size,
            "sampler": sampler.to_dict(),
            "remover": remover.to_dict(),
            "rate_limiter": rate_limiter.to_dict(),
            "max_times_sampled": max_times_sampled,
            "offsets": offsets,
        }
        seg = Segment.create(KIND, meta, offsets["total"])
        self._setup(seg, seed)
        ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = self._index
        key[:] = -1
        inflight[:] = -1
        index.rebuild(self._index, exponent, np.empty(0, np.int64), max_times_sampled)
        ctl[index.NEXT_SEQ] = 1

    @classmethod
    def attach(cls, segment: str, seed: int | None = None, *, stream: str | None = None) -> Table:
        """A handle of the table in shared-memory segment ``segment``. With ``seed`` and a
        ``stream`` name its draws are the same every run; with ``seed`` alone, this
        process's own (see the class)."""
        if stream is not None and not isinstance(stream, str):
            raise TypeError(f"stream must be a str (a name for this handle's draws) or None, got {type_name(stream)}")
        self = cls.__new__(cls)
        self._setup(Segment.attach(segment, KIND), seed, stream)
        return self

    def _setup(self, seg: Segment, seed: int | None, stream: str | None = None) -> None:
        meta = seg.meta
        self._seg = seg
        self.name: str = meta["name"]
        self.max_size: int = meta["max_size"]
        self.fields = [(f, np.dtype(d), tuple(s)) for f, d, s in meta["spec"]]
        self.spec = {f: (d, s) for f, d, s in self.fields}
        self.sampler = from_dict(meta["sampler"])
        self.remover = from_dict(meta["remover"])
        self.rate_limiter = rate_limiter_from_dict(meta["rate_limiter"])
        self.max_times_sampled: int = meta["max_times_sampled"]
        self._exponent = _exponent(self.sampler, self.remover)
        self._limits = np.array(self.rate_limiter.params(), np.float64)
        off = meta["offsets"]
        data = seg.data
        n = self.max_size
        p2 = off["p2"]

        def arr(name: str, dtype: Any, count: int) -> np.ndarray:
            return array_at(data, off[name], dtype, (count,), f"replay table {seg.name!r}: array {name!r}")

        self._ctl = arr("ctl", np.int64, index.CTL_WORDS)
        self._index = (
            self._ctl,
            arr("state", np.int64, n),
            arr("owner", np.int64, n),
            arr("key", np.int64, n),
            arr("times", np.int64, n),
            arr("prio", np.float64, n),
            arr("prev", np.int64, n),
            arr("nxt", np.int64, n),
            arr("free", np.int64, n),
            arr("inflight", np.int64, 2 * index.MAX_INFLIGHT),
            arr("count_t", np.float64, 2 * p2),
            arr("sum_t", np.float64, 2 * p2),
            arr("min_t", np.float64, 2 * p2),
            arr("max_t", np.float64, 2 * p2),
        )
        self._data = {
            f: array_at(data, off["field:" + f], d, (n, *s), f"replay table {seg.name!r}: field {f!r}")
            for f, d, s in self.fields
        }
        self._rows = tuple(a.reshape(-1).view(np.uint8) for a in self._data.values())
        self._row_bytes = np.array([a[0].nbytes for a in self._data.values()], np.int64)
        self._seed = seed
        self._rng_pid = -1
        self._creator_pid = current_pid() if seg.owned else -1
        # a named stream holds in the process that attached; a forked copy draws its own
        self._stream = None if stream is None else (current_pid(), _stream_key(stream))
        self._rng_: np.random.Generator | None = None

    # -- pickling, closing ---------------------------------------------------------------

    @property
    def segment(self) -> str:
        return self._seg.name

    @property
    def seed(self) -> int | None:
        """The ``seed`` this handle was made or attached with."""
        return self._seed

    def __reduce__(self):
        return (Table.attach, (self._seg.name, self._seed))

    def __repr__(self) -> str:
        return f"Table({self.name!r}, max_size={self.max_size}, segment={self._seg.name!r})"

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def shutdown(self) -> None:
        """Close the table for every process: calls raise ``Closed`` (those waiting
        too); ``checkpoint`` still works. The segment stays until its owner closes."""
        if self._ctl is not None:
            self._ctl[index.CLOSED] = 1
            notify_always(self._ctl, index.EV_CHANGED)

    def close(self) -> None:
        """Unmap this handle; the owning handle also shuts the table down and removes
        the segment. Idempotent."""
        if self._seg.words is None:
            return
        if self._seg.owned:
            self.shutdown()
        self._index = ()
        self._data = {}
        self._rows = ()
        self._ctl = None
        self._seg.close()

    def _check_open(self) -> None:
        if self._ctl is None:
            raise Closed(f"replay table {self.name!r}: this handle is closed")
        if self._ctl[index.CLOSED]:
            raise Closed(f"replay table {self.name!r} is closed")

    def _rng(self) -> np.random.Generator:
        pid = current_pid()
        if self._rng_pid != pid:  # a forked copy must not repeat its parent's choices
            # the creating handle draws from the seed alone and a named one from seed and name (both
            # reproducible); every other, from seed and pid
            if pid == self._creator_pid:
                key = [self._seed]
            elif self._stream is not None and pid == self._stream[0]:
                key = [self._seed, 1, self._stream[1]]
            else:
                key = [self._seed, 0, pid]
            self._rng_ = np.random.default_rng(None if self._seed is None else key)
            self._rng_pid = pid
        return self._rng_

    # -- the lock ----------------------------------------------------------------------------

    def _lock(self) -> None:
        if lock.acquire(self._ctl):
            self._recover()

    def _recover(self) -> None:
        """After taking the lock from a dead holder: rebuild the index, dropping the
        slots of dead inserters."""
        index.rebuild(self._index, self._exponent, self._dead_writers(), self.max_times_sampled)
        self._ctl[index.RECOVERED] += 1

    def _dead_writers(self) -> np.ndarray:
        out = np.empty(2 * index.MAX_INFLIGHT, np.int64)
        n = index.writers(self._index, out)
        return np.array([out[2 * i] for i in range(n) if not pid_alive(int(out[2 * i + 1]))], np.int64)

    def _wait(self, seq: int, until: float | None, what: str) -> None:
        """Sleep until the table changes (a poll at most), or raise at the deadline."""
        now = time.monotonic()
        if until is not None and now >= until:
            raise Timeout(f"replay table {self.name!r}: {what}")
        left = _POLL_NS if until is None else min(_POLL_NS, int((until - now) * 1e9) + 1)
        sleep(self._ctl, index.EV_CHANGED, seq, left)

    # -- inserting -------------------------------------------------------------------------

    def _checked_item(self, item: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        """The item's fields as flat, writable uint8 arrays of the spec's dtypes."""
        if not isinstance(item, Mapping):
            raise TypeError(f"an item must be a dict of field -> array, got {type_name(item)}")
        if len(item) != len(self.fields) or any(f not in item for f, _, _ in self.fields):
            missing = sorted(set(self.spec) - set(item))
            extra = sorted(set(item) - set(self.spec))
            raise ValueError(
                f"replay table {self.name!r}: item fields must be {sorted(self.spec)}; missing {missing}, unknown {extra}"
            )
        out = []
        for f, dtype, shape in self.fields:
            a = as_array(item[f])
            if a.shape != shape:
                raise ValueError(f"replay table {self.name!r}: field {f!r} must have shape {shape}, got {a.shape}")
            if a.dtype != dtype:
                if not np.can_cast(a.dtype, dtype, casting="same_kind"):
                    raise TypeError(f"replay table {self.name!r}: field {f!r} is {dtype}, got {a.dtype}")
                a = a.astype(dtype)
            elif not (a.flags.c_contiguous and a.flags.writeable):
                a = a.copy()
            out.append(a.reshape(-1).view(np.uint8))
        return tuple(out)

    def insert(self, item: Mapping[str, Any], priority: float = 1.0, timeout: float | None = None) -> int:
        """Insert ``item`` with ``priority``; its key. Waits (up to ``timeout`` s) while
        the rate limiter holds inserts back; ``Timeout`` after that."""
        src = self._checked_item(item)
        priority = _check_priority(priority)
        self._check_open()
        t, pid = self._index, current_pid()
        mts = self.max_times_sampled
        args = (self._limits, self.remover.code, self._rng().random(), pid, mts, lock.SPINS)
        slot = hot_path.reserve_and_copy(t, *args, False, self._rows, self._row_bytes, src)
        if slot < 0:
            slot = self._reserve_slowly(args, src, deadline(timeout))
        key = hot_path.publish(t, slot, priority, self._exponent, mts, pid, lock.SPINS, False)
        if key == hot_path.BUSY:
            self._lock()
            key = hot_path.publish(t, slot, priority, self._exponent, mts, pid, lock.SPINS, True)
        return int(key)

    def writer(self) -> Writer:
        """A ``Writer`` that builds this table's items step by step: every field must be
        a trajectory ``[T, ...]`` with one ``T``, and an item is the last ``T`` steps."""
        self._check_open()
        return Writer(self)

    def _reserve_slowly(self, args: tuple, src: tuple, until: float | None) -> int:
        """Reserve and copy when the fast path could not: take the lock however long it
        takes (rebuilding after a dead holder), free the slots of dead inserters when no
        slot or the rate limiter is the trouble, wait for the table to change."""
        ctl, t = self._ctl, self._index
        while True:
            seq = prepare_wait(ctl, index.EV_CHANGED)
            try:
                self._lock()
                slot = hot_path.reserve_and_copy(t, *args, True, self._rows, self._row_bytes, src)
                if slot < 0 and len(self._dead_writers()):  # a dead inserter holds a reservation
                    self._lock()
                    self._recover()
                    slot = hot_path.reserve_and_copy(t, *args, True, self._rows, self._row_bytes, src)
                if slot >= 0:
                    return slot
                why = (
                    "the rate limiter holds inserts back"
                    if slot == index.RATE_LIMITED
                    else "every slot is being written"
                )
                self._wait(seq, until, f"insert timed out: {why}")
                self._check_open()
            finally:
                finish_wait(ctl, index.EV_CHANGED)

    # -- sampling ---------------------------------------------------------------------------

    def sample(self, batch_size: int, timeout: float | None = None, torch: bool = False) -> SampleBatch:
        """``batch_size`` items chosen by the sampler (with replacement: one item may
        come more than once). Waits (up to ``timeout`` s) while the rate limiter holds
        samples back; ``Timeout`` after that. ``torch=True``: ``data`` as tensors."""
        b = check_int("batch_size", batch_size, 1, 1 << 20)
        self._check_open()
        ctl, t, pid = self._ctl, self._index, current_pid()
        slots = np.empty(b, np.int64)
        keys = np.empty(b, np.int64)
        probs = np.empty(b, np.float64)
        prios = np.empty(b, np.float64)
        times = np.empty(b, np.int64)
        out = {f: np.empty((b, *s), d) for f, d, s in self.fields}
        dst = tuple(a.reshape(-1).view(np.uint8) for a in out.values())
        head = (self._limits, self.sampler.code)
        tail = (self.max_times_sampled, pid, lock.SPINS)
        rest = (self._rows, self._row_bytes, dst, slots, keys, probs, prios, times)
        # one draw of uniforms, kept through a busy lock and the rate limiter's waits, so that a
        # seeded handle's samples do not depend on what it met on the way (they are independent of
        # the table's state, so the choice stays exact); only torn rows draw again
        u = self._rng().random(b)
        size = hot_path.sample_and_gather(t, *head, u, *tail, False, *rest)
        until = None
        while size <= 0:
            if size == hot_path.TORN:  # items evicted while they were copied: draw those rows again
                again = self._rng().random(b)
                size = hot_path.redraw(t, self.sampler.code, again, pid, lock.SPINS, False, *rest)
                if size == hot_path.BUSY:
                    self._lock()
                    size = hot_path.redraw(t, self.sampler.code, again, pid, lock.SPINS, True, *rest)
                continue
            until = deadline(timeout) if until is None else until
            seq = prepare_wait(ctl, index.EV_CHANGED)
            try:
                self._lock()
                size = hot_path.sample_and_gather(t, *head, u, *tail, True, *rest)
                if size == 0:
                    self._wait(seq, until, f"sample of {b} timed out: the rate limiter holds samples back")
                    self._check_open()
            finally:
                finish_wait(ctl, index.EV_CHANGED)
        return SampleBatch(to_torch(out) if torch else out, keys, probs, prios, times, int(size))

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the items with ``keys``; keys of items no longer in the
        table are skipped (as Reverb). How many were updated."""
        keys = np.asarray(keys)
        if keys.dtype.kind not in "iu":
            raise TypeError(f"keys must be integers (the keys sample returned), got dtype {keys.dtype}")
        prios = np.asarray(priorities, dtype=np.float64)
        keys = keys.astype(np.int64).reshape(-1)
        prios = prios.reshape(-1)
        if keys.shape != prios.shape:
            raise ValueError(f"keys and priorities must have the same length, got {keys.size} and {prios.size}")
        bad = ~(np.isfinite(prios) & (prios >= 0))
        if bad.any():
            raise ValueError(f"priorities must be finite numbers >= 0, got {prios[bad][0]} (for key {keys[bad][0]})")
        self._check_open()
        self._lock()
        try:
            done = index.update_priorities(self._index, keys, prios, self._exponent)
        finally:
            lock.release(self._ctl)
        notify(self._ctl, index.EV_CHANGED)
        return int(done)

    def info(self) -> TableInfo:
        self._check_open()
        c = self._ctl
        return TableInfo(
            name=self.name,
            max_size=self.max_size,
            size=int(c[index.SIZE]),
            inserts=int(c[index.INSERTS]),
            samples=int(c[index.SAMPLES]),
            deletes=int(c[index.DELETES]),
            pending_inserts=int(c[index.PENDING]),
            sampler=self.sampler,
            remover=self.remover,
            rate_limiter=self.rate_limiter,
            max_times_sampled=self.max_times_sampled,
            lock_recoveries=int(c[index.RECOVERED]),
        )

    def __len__(self) -> int:
        self._check_open()
        return int(self._ctl[index.SIZE])

    # -- checkpoints (checkpoint.py) ---------------------------------------------------------

    def checkpoint(self, path: str | os.PathLike) -> str:
        """Write every item (data, key, priority, times sampled, in insertion order) and
        the counters to ``path`` (a ``.npz``; written whole, then renamed into place)."""
        if self._ctl is None:
            raise Closed(f"replay table {self.name!r}: this handle is closed")
        path = os.fspath(path)
        return checkpoints.write(self._snapshot(), path)

    def load(self, path: str | os.PathLike) -> None:
        """Fill this empty table from a checkpoint of a table with the same spec,
        max_size, selectors, rate limiter and max_times_sampled."""
        self._check_open()
        self._fill(checkpoints.read(path), path)

    @classmethod
    def restore(cls, path: str | os.PathLike, seed: int | None = None) -> Table:
        """A new table made from a checkpoint: the same configuration and items."""
        snapshot = checkpoints.read(path)
        c = snapshot.config
        table = cls(
            c["name"],
            {f: (d, tuple(s)) for f, d, s in c["spec"]},
            c["max_size"],
            from_dict(c["sampler"]),
            from_dict(c["remover"]),
            rate_limiter_from_dict(c["rate_limiter"]),
            c["max_times_sampled"],
            seed=seed,
        )
        try:
            table._fill(snapshot, path)
        except BaseException:
            table.close()
            raise
        return table

    def _config(self) -> dict:
        meta = self._seg.meta
        return {k: meta[k] for k in CONFIG_KEYS}

    def _snapshot(self) -> Snapshot:
        """Every ready item and the counters, taken under the lock (so whole items only)."""
        self._lock()
        try:
            t = self._index
            slots = index.ready_slots(t)
            snapshot = Snapshot(
                config=self._config(),
                keys=t[3][slots].copy(),
                times=t[4][slots].copy(),
                priorities=t[5][slots].copy(),
                counters=self._ctl[[index.INSERTS, index.SAMPLES, index.DELETES, index.NEXT_SEQ]].copy(),
                fields={f: a[slots] for f, a in self._data.items()},
            )
        finally:
            lock.release(self._ctl)
        return snapshot

    def _fill(self, snapshot: Snapshot, path: str | os.PathLike) -> None:
        """Fill this empty table with the items and counters of ``snapshot``, read from ``path``."""
        mine = self._config()
        differs = [k for k in mine if k != "name" and snapshot.config.get(k) != mine[k]]
        if differs:
            raise ValueError(
                f"checkpoint {os.fspath(path)!r} is of a different table: its {differs} differ from "
                f"table {self.name!r}'s"
            )
        self._lock()
        try:
            ctl, state, owner, key, tm, prio = self._index[:6]
            if ctl[index.SIZE] or ctl[index.PENDING] or ctl[index.INSERTS]:
                raise ValueError(f"replay table {self.name!r} must be empty to load a checkpoint")
            slots = snapshot.keys % self.max_size
            for f, a in self._data.items():
                a[slots] = snapshot.fields[f]
            key[slots] = snapshot.keys
            tm[slots] = snapshot.times
            prio[slots] = snapshot.priorities
            state[slots] = index.READY
            ctl[[index.INSERTS, index.SAMPLES, index.DELETES, index.NEXT_SEQ]] = snapshot.counters
            index.rebuild(self._index, self._exponent, np.empty(0, np.int64), self.max_times_sampled)
        finally:
            lock.release(self._ctl)
        notify(self._ctl, index.EV_CHANGED)
