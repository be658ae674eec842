"""shmpad.replay.Table: each sampler's distribution against its definition (chi-square,
fixed seeds), exact prioritized probabilities, removers, max_times_sampled, the rate
limiters against a model, bad input, checkpoints, and items written by many processes
arriving whole."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from helpers import Forked, wait_until
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shmpad import Timeout
from shmpad import replay as rp
from shmpad.errors import Closed
from shmpad.replay import index, lock

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("shm_leak_check")]

SPEC = {"obs": (np.float32, (3,)), "id": (np.int64, ())}
# the 0.999 quantiles of chi-square with df degrees of freedom: a right sampler fails
# 1 time in 1000 seeds, and the seeds are fixed
CHI2_999 = {4: 18.467, 7: 24.322, 9: 27.877}


def item(i: int) -> dict:
    return {"obs": np.full(3, i, np.float32), "id": i}


@pytest.fixture
def make_table():
    tables = []

    def make(max_size=16, sampler=None, remover=None, rate_limiter=None, max_times_sampled=0, seed=0, spec=SPEC):
        t = rp.Table("t", spec, max_size, sampler, remover, rate_limiter, max_times_sampled, seed=seed)
        tables.append(t)
        return t

    yield make
    for t in tables:
        t.close()


def chi2(counts: np.ndarray, expected_p: np.ndarray) -> float:
    n = counts.sum()
    return float(((counts - n * expected_p) ** 2 / (n * expected_p)).sum())


def sampled_ids(table, n_batches: int, batch: int = 1000) -> np.ndarray:
    return np.concatenate([table.sample(batch).data["id"] for _ in range(n_batches)])


# -- samplers --------------------------------------------------------------------------------


def test_uniform_sampling_is_uniform(make_table):
    t = make_table(sampler=rp.Uniform())
    for i in range(10):
        t.insert(item(i), priority=i + 1.0)  # priorities must not matter
    ids = sampled_ids(t, 20)
    assert chi2(np.bincount(ids, minlength=10), np.full(10, 0.1)) < CHI2_999[9]
    assert np.all(t.sample(5).probabilities == 0.1)


def _seeded_draws(seed: int) -> list[int]:
    with rp.Table("t", SPEC, 16, seed=seed) as t:
        for i in range(10):
            t.insert(item(i))
        return t.sample(50).data["id"].tolist()


def test_a_seeded_table_draws_the_same_samples_in_every_process_that_creates_it(make_table):
    """The statistical tests here rely on it: their seeds fix the draws, whatever the pid."""
    child = Forked(_seeded_draws, 3)
    try:
        assert child.result(60) == _seeded_draws(3)  # made in another process (another pid)
    finally:
        child.kill()
    a = make_table(seed=3)
    for i in range(10):
        a.insert(item(i))
    attached = rp.Table.attach(a.segment, seed=3)
    try:  # an attached handle draws its own stream
        assert attached.sample(50).data["id"].tolist() != a.sample(50).data["id"].tolist()
    finally:
        attached.close()


def _named_draws(segment: str, seed: int, stream: str) -> list[int]:
    attached = rp.Table.attach(segment, seed=seed, stream=stream)
    try:
        return attached.sample(50).data["id"].tolist()
    finally:
        attached.close()


def test_a_handle_attached_with_a_stream_name_draws_the_same_samples_in_any_process(make_table):
    """What a ReplayNode's client relies on to sample the same in every run: the node's
    name, not its pid, keys its draws."""
    a = make_table(seed=3)
    for i in range(10):
        a.insert(item(i))
    child = Forked(_named_draws, a.segment, 3, "learner/0")
    try:
        in_child = child.result(60)
    finally:
        child.kill()
    assert in_child == _named_draws(a.segment, 3, "learner/0")
    assert in_child != _named_draws(a.segment, 3, "learner/1")  # another name, another stream
    assert in_child != _named_draws(a.segment, 4, "learner/0")  # another seed, another stream
    assert in_child != _seeded_draws(3)  # not the creator's stream either
    with pytest.raises(TypeError, match="stream must be a str"):
        rp.Table.attach(a.segment, seed=3, stream=7)


def _exit_holding_the_lock(segment: str) -> None:
    t = rp.Table.attach(segment)
    assert lock.acquire(t._ctl) is False  # and the process exits without releasing it


def _insert_through_another_handle(table, i: int) -> None:
    """Insert without drawing from ``table``'s own stream (an insert draws for the remover)."""
    other = rp.Table.attach(table.segment)
    try:
        other.insert(item(i))
    finally:
        other.close()


def _same_tables(make_table, rate_limiter=None, items=10):
    a, b = (make_table(rate_limiter=rate_limiter, seed=5) for _ in range(2))
    for t in (a, b):
        for i in range(items):
            t.insert(item(i))
    return a, b


def test_a_seeded_sample_draws_the_same_after_taking_the_lock_from_a_dead_holder(make_table):
    """A sample that meets a busy lock keeps its draws: the table's samples do not depend
    on who held the lock when (as a lock-step run's learner needs)."""
    a, b = _same_tables(make_table)
    child = Forked(_exit_holding_the_lock, a.segment)
    try:
        child.result(60)
    finally:
        child.kill()
    assert a._ctl[index.LOCK] == child.pid  # the sample meets a busy lock, for sure
    assert a.sample(50).data["id"].tolist() == b.sample(50).data["id"].tolist()
    assert a.info().lock_recoveries == 1


def test_a_seeded_sample_draws_the_same_after_waiting_for_the_rate_limiter(make_table):
    a, b = _same_tables(make_table, rp.MinSize(3), items=2)
    _insert_through_another_handle(b, 2)
    result = []
    sampler = threading.Thread(target=lambda: result.append(a.sample(50, timeout=60).data["id"].tolist()))
    sampler.start()
    try:  # the sample sleeps on the table's change event, held back by MinSize(3)
        assert wait_until(lambda: a._ctl[index.EV_CHANGED + 1] == 1, 60)
        _insert_through_another_handle(a, 2)
    finally:
        sampler.join(60)
    assert result == [b.sample(50).data["id"].tolist()]


@pytest.mark.parametrize("exponent", [1.0, 0.6, 0.0])
def test_prioritized_sampling_follows_priorities_to_the_exponent(make_table, exponent):
    t = make_table(sampler=rp.Prioritized(exponent), seed=1)
    prios = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 3.0, 0.25, 6.0])
    for i, p in enumerate(prios):
        t.insert(item(i), priority=p)
    expected = prios**exponent / (prios**exponent).sum()
    s = t.sample(64)
    np.testing.assert_allclose(s.probabilities, expected[s.data["id"]], rtol=1e-12, atol=0)
    np.testing.assert_array_equal(s.priorities, prios[s.data["id"]])
    ids = sampled_ids(t, 20)
    assert chi2(np.bincount(ids, minlength=8), expected) < CHI2_999[7]
    if exponent == 1.0:  # and not uniform: the test tells the two apart
        assert chi2(np.bincount(ids, minlength=8), np.full(8, 1 / 8)) > 1000


def test_prioritized_probabilities_follow_updated_priorities(make_table):
    t = make_table(sampler=rp.Prioritized(0.8))
    keys = [t.insert(item(i), priority=1.0) for i in range(5)]
    assert t.update_priorities(keys[:2], [9.0, 0.0]) == 2
    prios = np.array([9.0, 0.0, 1.0, 1.0, 1.0])
    expected = prios**0.8 / (prios**0.8).sum()
    s = t.sample(500)
    assert 1 not in s.data["id"]  # priority 0: never sampled
    np.testing.assert_allclose(s.probabilities, expected[s.data["id"]], rtol=1e-12, atol=0)


def test_prioritized_with_every_priority_zero_samples_uniformly(make_table):
    t = make_table(sampler=rp.Prioritized(1.0))
    for i in range(5):
        t.insert(item(i), priority=0.0)
    ids = sampled_ids(t, 10)
    assert chi2(np.bincount(ids, minlength=5), np.full(5, 0.2)) < CHI2_999[4]


@pytest.mark.parametrize(
    "sampler, expected",
    [(rp.Fifo(), 0), (rp.Lifo(), 4), (rp.MinHeap(), 3), (rp.MaxHeap(), 2)],
)
def test_deterministic_samplers_pick_their_item(make_table, sampler, expected):
    t = make_table(sampler=sampler)
    for i, p in enumerate([5.0, 4.0, 9.0, 0.5, 2.0]):
        t.insert(item(i), priority=p)
    s = t.sample(3)
    assert list(s.data["id"]) == [expected] * 3
    assert list(s.probabilities) == [1.0] * 3
    assert list(s.times_sampled) == [1, 2, 3]


def test_fifo_with_max_times_sampled_one_is_a_queue(make_table):
    t = make_table(sampler=rp.Fifo(), max_times_sampled=1, rate_limiter=rp.Queue(8), max_size=8)
    for i in range(6):
        t.insert(item(i))
    assert list(t.sample(4).data["id"]) == [0, 1, 2, 3]
    assert len(t) == 2 and t.info().deletes == 4
    assert list(t.sample(2).data["id"]) == [4, 5]
    with pytest.raises(Timeout, match="sample of 1 timed out: the rate limiter holds samples back"):
        t.sample(1, timeout=0)


def test_max_times_sampled_deletes_an_item_after_its_last_sample(make_table):
    t = make_table(sampler=rp.Lifo(), max_times_sampled=3)
    t.insert(item(0))
    t.insert(item(1))
    s = t.sample(4)
    assert list(s.data["id"]) == [1, 1, 1, 0]
    assert len(t) == 1


# -- removers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "remover, evicted",
    [(rp.Fifo(), [0, 1]), (rp.Lifo(), [3, 4]), (rp.MinHeap(), [3, 1]), (rp.MaxHeap(), [2, 4])],
)
def test_a_full_table_evicts_what_the_remover_picks(make_table, remover, evicted, tmp_path):
    t = make_table(max_size=4, sampler=rp.Fifo(), remover=remover)
    prios = [5.0, 1.0, 9.0, 0.5, 7.0, 3.0]
    for i, p in enumerate(prios):
        t.insert(item(i), priority=p)
    assert len(t) == 4 and t.info().deletes == 2
    present = set(_all_ids(t, tmp_path))
    assert set(range(6)) - present == set(evicted)


def _all_ids(t, tmp_path) -> list[int]:
    """The ids of every item, oldest first (read through a checkpoint: no sampling)."""
    with np.load(t.checkpoint(tmp_path / "ids.npz")) as z:
        return list(z["field:id"])


# -- rate limiters -------------------------------------------------------------------------------


def test_min_size_holds_samples_back_until_it_is_reached(make_table):
    t = make_table(rate_limiter=rp.MinSize(3))
    t.insert(item(0))
    t.insert(item(1))
    with pytest.raises(Timeout, match="rate limiter holds samples back"):
        t.sample(1, timeout=0.01)
    t.insert(item(2))
    assert t.sample(10).data["id"].shape == (10,)


def test_queue_holds_inserts_back_when_full(make_table):
    t = make_table(sampler=rp.Fifo(), max_times_sampled=1, rate_limiter=rp.Queue(3), max_size=3)
    for i in range(3):
        t.insert(item(i))
    with pytest.raises(Timeout, match="insert timed out: the rate limiter holds inserts back"):
        t.insert(item(3), timeout=0)
    assert list(t.sample(1).data["id"]) == [0]
    t.insert(item(3), timeout=0)


class RateLimiterModel(RuleBasedStateMachine):
    """A table's answers (go ahead or Timeout at once) against the rate limiter's
    definition, over any sequence of inserts and samples."""

    @rule(
        spi=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
        min_size=st.integers(1, 4),
        buffer=st.sampled_from([0.0, 1.0, 3.5, 8.0]),
    )
    def make(self, spi, min_size, buffer):
        if getattr(self, "table", None) is not None:
            return
        self.limiter = rp.SampleToInsertRatio(spi, min_size, buffer)
        self.table = rp.Table("m", SPEC, 6, rp.Uniform(), rp.Fifo(), self.limiter, seed=0)
        self.size = self.inserts = self.samples = 0

    def _diff(self, inserts, samples):
        return inserts * self.limiter.samples_per_insert - samples

    @rule()
    def insert(self):
        if getattr(self, "table", None) is None:
            return
        allowed = self.size + 1 <= self.limiter.min_size_to_sample or (
            self._diff(self.inserts + 1, self.samples) <= self.limiter.max_diff
        )
        try:
            self.table.insert(item(self.inserts), timeout=0)
            went = True
        except Timeout:
            went = False
        assert went == allowed
        if went:
            self.inserts += 1
            self.size = min(self.size + 1, 6)

    @rule(n=st.integers(1, 3))
    def sample(self, n):
        if getattr(self, "table", None) is None:
            return
        allowed = self.size >= self.limiter.min_size_to_sample and (
            self._diff(self.inserts, self.samples + n) >= self.limiter.min_diff
        )
        try:
            self.table.sample(n, timeout=0)
            went = True
        except Timeout:
            went = False
        assert went == allowed
        self.samples += n * went

    @invariant()
    def counters_agree(self):
        if getattr(self, "table", None) is not None:
            info = self.table.info()
            assert (info.size, info.inserts, info.samples) == (self.size, self.inserts, self.samples)

    def teardown(self):
        if getattr(self, "table", None) is not None:
            self.table.close()


TestRateLimiterModel = RateLimiterModel.TestCase
TestRateLimiterModel.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"spec": {}}, ValueError, "at least one field"),
        ({"spec": {"x": (np.float32,)}}, TypeError, r"spec\['x'\] must be \(dtype, shape\)"),
        ({"spec": {"x": (object, ())}}, TypeError, "fixed-size numeric type"),
        ({"max_size": 0}, ValueError, "max_size must be between 1 and"),
        ({"sampler": "uniform"}, TypeError, "sampler must be a selector"),
        ({"rate_limiter": 3}, TypeError, "rate_limiter must be MinSize"),
        ({"max_times_sampled": -1}, ValueError, "max_times_sampled must be >= 0, got -1"),
        (
            {"sampler": rp.Prioritized(0.5), "remover": rp.Prioritized(1.0)},
            ValueError,
            "must share priority_exponent",
        ),
    ],
)
def test_bad_tables_are_refused(kwargs, error, match, shm_leak_check):
    args = {"spec": SPEC, "max_size": 4, **kwargs}
    with pytest.raises(error, match=match):
        rp.Table("bad", **args)


def test_bad_selector_and_limiter_arguments_are_refused():
    with pytest.raises(ValueError, match="priority_exponent must be a finite number >= 0, got -1"):
        rp.Prioritized(-1)
    with pytest.raises(ValueError, match="error_buffer must be >= 0, got -2.0"):
        rp.SampleToInsertRatio(1.0, 10, -2)
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        rp.Queue(0)
    with pytest.raises(ValueError, match="min_size_to_sample must be >= 1, got 0"):
        rp.MinSize(0)


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ({"obs": np.zeros(3)}, ValueError, r"missing \['id'\], unknown \[\]"),
        ({"obs": np.zeros(4), "id": 1}, ValueError, r"field 'obs' must have shape \(3,\), got \(4,\)"),
        ({"obs": np.zeros(3), "id": 1.5}, TypeError, "field 'id' is int64, got float64"),
        ([1, 2], TypeError, "an item must be a dict"),
    ],
)
def test_bad_items_are_refused(make_table, bad, error, match):
    t = make_table()
    with pytest.raises(error, match=match):
        t.insert(bad)
    assert t.info().inserts == 0 and t.info().pending_inserts == 0


@pytest.mark.parametrize("priority", [-1.0, float("nan"), float("inf")])
def test_bad_priorities_are_refused(make_table, priority):
    t = make_table(sampler=rp.Prioritized(1.0))
    with pytest.raises(ValueError, match="priority must be a finite number >= 0"):
        t.insert(item(0), priority=priority)
    key = t.insert(item(0))
    with pytest.raises(ValueError, match=f"priorities must be finite numbers >= 0, got {priority}"):
        t.update_priorities([key], [priority])
    with pytest.raises(ValueError, match="same length"):
        t.update_priorities([key, key], [1.0])
    with pytest.raises(TypeError, match="keys must be integers"):
        t.update_priorities([1.5], [1.0])


def test_keys_of_deleted_items_are_skipped(make_table):
    t = make_table(max_size=2)
    keys = [t.insert(item(i)) for i in range(3)]
    assert t.update_priorities(keys, [2.0, 2.0, 2.0]) == 2


def test_a_closed_table_refuses_calls(make_table):
    t = make_table()
    other = rp.Table.attach(t.segment)
    t.close()
    with pytest.raises(Closed, match="this handle is closed"):
        t.insert(item(0))
    with pytest.raises(Closed, match="is closed"):
        other.sample(1, timeout=0)
    other.close()


# -- checkpoints -----------------------------------------------------------------------------------


def test_checkpoint_and_restore_round_trip_exactly(make_table, tmp_path):
    # max_times_sampled above the 7 draws: no item may leave by being sampled, so 8 keys stay to update
    t = make_table(max_size=8, sampler=rp.Prioritized(0.7), remover=rp.Fifo(), max_times_sampled=8)
    for i in range(11):
        t.insert(item(i), priority=float(i % 4))
    t.sample(7)
    path = t.checkpoint(tmp_path / "t.npz")
    with rp.Table.restore(path) as r:
        a, b = t.info(), r.info()
        assert (a.size, a.inserts, a.samples, a.deletes) == (b.size, b.inserts, b.samples, b.deletes)
        again = r.checkpoint(tmp_path / "again.npz")
        with np.load(path) as x, np.load(again) as y:
            assert sorted(x.files) == sorted(y.files)
            for k in x.files:
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
        # the same keys, so priorities update the restored items
        keys = y_keys(again)
        assert r.update_priorities(keys, [1.0] * len(keys)) == len(keys) == 8
        assert r.insert(item(99)) > max(y_keys(again))


def y_keys(path) -> list[int]:
    with np.load(path) as z:
        return z["keys"].tolist()


def test_a_checkpoint_loads_only_into_an_empty_table_of_the_same_shape(make_table, tmp_path):
    t = make_table()
    t.insert(item(0))
    path = t.checkpoint(tmp_path / "t.npz")
    with pytest.raises(ValueError, match="must be empty to load a checkpoint"):
        t.load(path)
    other = make_table(max_size=32)
    with pytest.raises(ValueError, match=r"is of a different table: its \['max_size'\] differ"):
        other.load(path)


# -- many processes ----------------------------------------------------------------------------------


def _insert_many(table, producer: int, n: int) -> int:
    for i in range(n):
        v = producer * 100_000 + i
        table.insert({"obs": np.full(3, v, np.float32), "id": v}, priority=1.0 + i % 7, timeout=60)
    return n


def _sample_many(table, n_batches: int) -> list[str]:
    torn = []
    for _ in range(n_batches):
        s = table.sample(16, timeout=60)
        for row, ident in zip(s.data["obs"], s.data["id"]):
            if not np.all(row == np.float32(ident)):
                torn.append(f"id {ident} with obs {row}")
    return torn


def test_items_from_four_inserter_processes_arrive_whole(make_table):
    t = make_table(max_size=64, sampler=rp.Prioritized(1.0), rate_limiter=rp.SampleToInsertRatio(1.0, 16, 64.0))
    inserters = [Forked(_insert_many, t, p, 500, name=f"inserter-{p}") for p in range(4)]
    samplers = [Forked(_sample_many, t, 60, name=f"sampler-{s}") for s in range(2)]
    try:
        assert [p.result(90) for p in inserters] == [500] * 4
        assert [s.result(90) for s in samplers] == [[], []]
    finally:
        for p in inserters + samplers:
            p.kill()
    info = t.info()
    assert info.inserts == 2000 and info.samples == 2 * 60 * 16 and info.pending_inserts == 0
    assert info.size == 64 and info.deletes == 2000 - 64
    assert math.isclose(info.inserts - info.samples, 80)
