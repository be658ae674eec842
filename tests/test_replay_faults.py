"""A replay table survives the death of the processes using it: an inserter SIGKILLed
mid-copy leaves no visible or torn item and holds nobody back for long; a process
SIGKILLed holding the index lock (even halfway through an update) is replaced by the
next caller, which rebuilds the index."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers import FORK, Forked, wait_until

from shmpad import replay as rp
from shmpad.replay import index, lock

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("shm_leak_check")]

SPEC = {"obs": (np.uint8, (4, 84, 84)), "id": (np.int64, ())}
# A hang guard on the calls a dead process could hold back (recovery takes ~10 ms): a call
# that returns instead of raising Timeout shows the recovery happened; lock_recoveries counts it.
BOUND_S = 60.0


def item(i: int) -> dict:
    return {"obs": np.full((4, 84, 84), i % 251, np.uint8), "id": i}


def _die_mid_insert(table, ready) -> None:
    """Reserve a slot and write half an item into it, as insert does, then hang."""
    table._lock()
    slot = index.reserve(table._index, table._limits, table.remover.code, 0.5, os.getpid(), 0)
    lock.release(table._ctl)
    assert slot >= 0
    table._data["obs"][slot, :2] = 77
    table._data["id"][slot] = 77
    ready.set()
    time.sleep(600)


def _die_holding_the_lock(table, ready, corrupt: bool) -> None:
    table._lock()
    if corrupt:  # as if killed halfway through rewriting the trees and the order
        ctl, *_, count_t, sum_t, min_t, max_t = table._index
        sum_t[:] = 0.0
        count_t[1] = 1e9
        ctl[index.HEAD] = -1
    ready.set()
    time.sleep(600)


def killed_while(fn, table, *args) -> None:
    ready = FORK.Event()
    child = Forked(fn, table, ready, *args)
    try:
        assert ready.wait(60), "the child did not get to the point where it is killed"
    finally:
        child.kill()


@pytest.mark.parametrize(
    "limiter, max_size",
    [(rp.Queue(2), 2), (rp.MinSize(1), 1)],
    ids=["its-reservation-holds-the-rate-limiter", "it-holds-the-only-slot"],
)
def test_an_inserter_killed_mid_copy_leaves_no_item_and_holds_no_one_back(limiter, max_size):
    with rp.Table("t", SPEC, max_size, rp.Fifo(), rp.Fifo(), limiter, max_times_sampled=1) as t:
        if max_size == 2:
            t.insert(item(1))
        killed_while(_die_mid_insert, t)
        assert t.info().pending_inserts == 1  # not noticed yet: nobody needed the slot
        before = t.info().size
        t.insert(item(2), timeout=BOUND_S)
        info = t.info()
        assert info.pending_inserts == 0 and info.size == before + 1 and info.lock_recoveries == 1
        ids = t.sample(info.size, timeout=0).data["id"]
        assert 77 not in ids and list(ids) == ([1, 2] if max_size == 2 else [2])


@pytest.mark.parametrize("corrupt", [False, True], ids=["between-updates", "halfway-through-an-update"])
def test_a_process_killed_holding_the_lock_is_replaced_and_the_index_rebuilt(corrupt):
    with rp.Table("t", SPEC, 8, rp.Prioritized(1.0), rp.Fifo(), rp.MinSize(1)) as t:
        prios = [1.0, 2.0, 3.0, 4.0]
        for i, p in enumerate(prios):
            t.insert(item(i), priority=p)
        killed_while(_die_holding_the_lock, t, corrupt)
        s = t.sample(32, timeout=BOUND_S)
        assert t.info().lock_recoveries == 1
        np.testing.assert_allclose(s.probabilities, (s.data["id"] + 1.0) / 10.0, rtol=1e-12, atol=0)
        t.insert(item(4), priority=5.0)
        assert t.info().size == 5


def test_a_sampler_killed_while_it_waits_does_not_wedge_the_table():
    with rp.Table("t", SPEC, 8, rp.Uniform(), rp.Fifo(), rp.MinSize(2)) as t:
        t.insert(item(0))
        waiting = Forked(t.sample, 1, 60)
        try:  # killed while asleep on the table's change event, counted as a sleeper there
            assert wait_until(lambda: t._ctl[index.EV_CHANGED + 1] == 1, 60)
        finally:
            waiting.kill()
        t.insert(item(1))
        assert sorted(t.sample(16, timeout=BOUND_S).data["id"].tolist())[-1] == 1
