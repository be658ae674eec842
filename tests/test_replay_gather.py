"""A replay sample gathers its rows after releasing the table's lock (so that samplers
copy side by side) and then checks them: a row whose item an insert evicted while it
was being copied is drawn again under the lock, the draws stay counted once, and no
sampler ever sees a torn item."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import Forked

from shmpad import replay as rp
from shmpad.replay import hot_path, index, lock

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("shm_leak_check")]

SPEC = {"obs": (np.int64, (8,)), "id": (np.int64, ())}


def item(i: int) -> dict:
    return {"obs": np.full(8, i, np.int64), "id": i}


class Batch:
    """The arrays ``Table.sample`` hands the compiled paths, for a batch of ``b``."""

    def __init__(self, table: rp.Table, b: int):
        self.slots = np.empty(b, np.int64)
        self.keys = np.empty(b, np.int64)
        self.probs = np.empty(b, np.float64)
        self.prios = np.empty(b, np.float64)
        self.times = np.empty(b, np.int64)
        self.out = {f: np.empty((b, *s), d) for f, d, s in table.fields}
        self.dst = tuple(a.reshape(-1).view(np.uint8) for a in self.out.values())
        self.table = table

    def choose_and_gather(self, uniforms: np.ndarray) -> None:
        """What ``sample_and_gather`` does up to its check: choose under the lock, gather after."""
        t = self.table
        t._lock()
        index.sample(t._index, t.sampler.code, uniforms, 0, self.slots, self.keys, self.probs, self.prios, self.times)
        lock.release(t._ctl)
        hot_path._gather(t._rows, t._row_bytes, self.dst, self.slots)

    def redraw(self, uniforms: np.ndarray) -> int:
        t = self.table
        rest = (t._rows, t._row_bytes, self.dst, self.slots, self.keys, self.probs, self.prios, self.times)
        return hot_path.redraw(t._index, t.sampler.code, uniforms, 0, lock.SPINS, False, *rest)


@pytest.fixture
def table():
    t = rp.Table("t", SPEC, 4, rp.Uniform(), rp.Fifo(), rp.MinSize(1), seed=0)
    yield t
    t.close()


def test_a_row_evicted_while_it_was_copied_is_drawn_again_and_counted_once(table):
    for i in range(4):
        table.insert(item(i))
    batch = Batch(table, 8)
    batch.choose_and_gather(np.arange(8) / 8)  # two draws of each of the 4 items
    assert sorted(batch.out["id"].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
    table.insert(item(4))  # the Fifo remover evicts item 0, and item 4 takes its slot

    was_0 = batch.out["id"] == 0
    assert hot_path._mark_torn(table._index, batch.slots, batch.keys) == 2
    assert np.array_equal(batch.slots < 0, was_0)  # exactly the rows of the evicted item
    assert batch.redraw(np.array([0.99] * 8)) == 4

    assert (batch.slots >= 0).all()
    assert np.array_equal(batch.out["obs"], np.repeat(batch.out["id"][:, None], 8, axis=1))
    assert set(batch.out["id"][was_0].tolist()) <= {1, 2, 3, 4} and 0 not in batch.out["id"]
    assert sorted(batch.out["id"][~was_0].tolist()) == [1, 1, 2, 2, 3, 3]  # untouched rows stay
    assert table.info().samples == 8  # the torn draws are not counted, their redraws are
    assert batch.keys.tolist() == [table._index[3][s] for s in batch.slots]


def test_a_batch_whose_only_item_is_being_rewritten_is_handed_back_uncounted():
    t = rp.Table("t", SPEC, 1, rp.Uniform(), rp.Fifo(), rp.MinSize(1), seed=0)
    try:
        t.insert(item(7))
        batch = Batch(t, 3)
        batch.choose_and_gather(np.zeros(3))
        t._lock()  # an insert that evicted the only item and is still copying its own
        slot = index.reserve(t._index, t._limits, t.remover.code, 0.5, os.getpid(), 0)
        lock.release(t._ctl)
        assert slot >= 0
        t._data["obs"][slot] = 9
        t._data["id"][slot] = 9
        assert hot_path._mark_torn(t._index, batch.slots, batch.keys) == 3
        assert batch.redraw(np.zeros(3)) == 0
        assert t.info().samples == 0 and t.info().size == 0

        assert hot_path.publish(t._index, slot, 1.0, 1.0, 0, os.getpid(), lock.SPINS, False) > 0
        assert t.sample(2, timeout=5).data["id"].tolist() == [9, 9]
        assert t.info().samples == 2
    finally:
        t.close()


# -- samplers and evicting inserters in separate processes ---------------------------------------

BIG = {"obs": (np.uint8, (64 * 1024,)), "id": (np.int64, ())}


def _insert_big(table, producer: int, n: int) -> int:
    for i in range(n):
        v = producer * 100_000 + i
        table.insert({"obs": np.full(64 * 1024, v % 251, np.uint8), "id": v}, timeout=60)
    return n


def _sample_big(table, n_batches: int) -> list[str]:
    torn = []
    for _ in range(n_batches):
        s = table.sample(8, timeout=60)
        for row, ident, key in zip(s.data["obs"], s.data["id"], s.keys):
            if not (row == ident % 251).all():
                torn.append(f"id {ident} (key {key}) with bytes {sorted(set(row.tolist()))}")
    return torn


def test_samplers_beside_evicting_inserters_never_see_a_torn_item():
    """A table of 4 items of 64 KiB that two inserters keep evicting (Fifo) while two
    samplers copy outside the lock: every row sampled is one item's bytes, whole."""
    t = rp.Table("big", BIG, 4, rp.Uniform(), rp.Fifo(), rp.MinSize(1), seed=0)
    procs = []
    try:
        t.insert({"obs": np.zeros(64 * 1024, np.uint8), "id": 0})
        procs += [Forked(_insert_big, t, p, 3000, name=f"inserter-{p}") for p in (1, 2)]
        samplers = [Forked(_sample_big, t, 1000, name=f"sampler-{s}") for s in range(2)]
        procs += samplers
        assert [s.result(90) for s in samplers] == [[], []]
        assert [p.result(90) for p in procs[:2]] == [3000, 3000]
        info = t.info()
        assert info.samples == 2 * 1000 * 8 and info.inserts == 6001 and info.pending_inserts == 0
    finally:
        for p in procs:
            p.kill()
        t.close()
