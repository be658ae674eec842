"""shmpad.replay.Writer: items of the last T steps, in order, with every window from a
slow reference; episodes never mixed; bad steps refused whole; bad tables and
arguments named in the errors; the replay node's client hands out writers."""

from __future__ import annotations

import numpy as np
import pytest

from shmpad import replay as rp
from shmpad.nodes.replay import ReplayClient

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("shm_leak_check")]

T = 3
SPEC = {"obs": (np.float32, (T, 2)), "action": (np.int64, (T,)), "reward": (np.float32, (T,))}


def step(k: int) -> dict:
    return {"obs": np.array([k, -k], np.float32), "action": k, "reward": np.float32(k / 2)}


def window(steps: list[int]) -> dict:
    """The item of ``steps``, built the slow way: one step per row."""
    return {f: np.stack([np.asarray(step(k)[f], dtype) for k in steps]) for f, (dtype, _) in SPEC.items()}


@pytest.fixture
def queue_table():
    """A table that samples its items once each, oldest first."""
    t = rp.Table("traj", SPEC, 64, sampler=rp.Fifo(), max_times_sampled=1, rate_limiter=rp.Queue(64))
    yield t
    t.close()


def sampled_items(table: rp.Table) -> list[dict]:
    n = len(table)
    batch = table.sample(n, timeout=0)
    return [{f: batch.data[f][i] for f in SPEC} for i in range(n)]


def assert_items(got: list[dict], windows: list[list[int]]) -> None:
    assert len(got) == len(windows)
    for item, steps in zip(got, windows):
        want = window(steps)
        for f in SPEC:
            np.testing.assert_array_equal(item[f], want[f], err_msg=f"field {f!r} of the item of steps {steps}")


def test_every_item_is_the_last_t_steps_in_order(queue_table):
    w = queue_table.writer()
    assert w.sequence_length == T
    for k in range(10):
        w.append(step(k))
        if k >= T - 1:
            w.create_item(priority=1.0)
    assert_items(sampled_items(queue_table), [list(range(k - T + 1, k + 1)) for k in range(T - 1, 10)])


def test_items_of_disjoint_windows_and_num_timesteps(queue_table):
    w = queue_table.writer()
    for k in range(9):
        w.append(step(k))
        if (k + 1) % T == 0:
            w.create_item(num_timesteps=T)
    assert_items(sampled_items(queue_table), [[0, 1, 2], [3, 4, 5], [6, 7, 8]])


def test_an_item_never_spans_episodes(queue_table):
    w = queue_table.writer()
    for k in range(4):
        w.append(step(k))
    w.end_episode()
    assert w.episode_steps == 0
    for k in range(100, 102):
        w.append(step(k))
    with pytest.raises(ValueError, match="an item needs 3 steps, 2 appended since the episode began"):
        w.create_item()
    w.append(step(102))
    w.create_item()
    assert_items(sampled_items(queue_table), [[100, 101, 102]])


def test_a_bad_step_is_refused_whole_and_leaves_the_history_as_it_was(queue_table):
    w = queue_table.writer()
    w.append(step(0))
    w.append(step(1))
    bad_shape = {**step(9), "obs": np.zeros(3, np.float32)}
    with pytest.raises(ValueError, match=r"a step's field 'obs' must have shape \(2,\), got \(3,\)"):
        w.append(bad_shape)
    bad_type = {**step(9), "action": np.float64(9.5)}
    with pytest.raises(TypeError, match="field 'action' is int64, got float64"):
        w.append(bad_type)
    with pytest.raises(ValueError, match=r"missing \['reward'\], unknown \['rew'\]"):
        w.append({"obs": step(9)["obs"], "action": 9, "rew": 1.0})
    with pytest.raises(TypeError, match="a step must be a dict of field -> array, got list"):
        w.append([1, 2])
    assert w.episode_steps == 2
    w.append(step(2))
    w.create_item()
    assert_items(sampled_items(queue_table), [[0, 1, 2]])


def test_create_item_checks_its_arguments(queue_table):
    w = queue_table.writer()
    for k in range(T):
        w.append(step(k))
    with pytest.raises(ValueError, match="holds trajectories of 3 steps, got num_timesteps=2"):
        w.create_item(num_timesteps=2)
    with pytest.raises(TypeError, match="num_timesteps must be an int"):
        w.create_item(num_timesteps=2.0)
    with pytest.raises(ValueError, match="priority must be a finite number >= 0, got nan"):
        w.create_item(priority=float("nan"))
    assert len(queue_table) == 0


@pytest.mark.parametrize(
    "spec, sizes",
    [
        ({"obs": (np.float32, (3, 2)), "done": (np.bool_, ())}, "'obs': 3, 'done': None"),
        ({"obs": (np.float32, (3, 2)), "action": (np.int64, (4,))}, "'obs': 3, 'action': 4"),
    ],
)
def test_a_table_that_does_not_hold_trajectories_has_no_writer(spec, sizes):
    with rp.Table("flat", spec, 4) as t:
        with pytest.raises(ValueError, match=f"every field to be a trajectory .* got leading sizes {{{sizes}}}"):
            t.writer()


def test_the_replay_clients_writer_writes_into_the_named_table(queue_table):
    client = ReplayClient({"traj": queue_table.segment}, None)
    try:
        w = client.writer()
        assert w.table.name == "traj"
        for k in range(T):
            w.append(step(k))
        w.create_item()
        assert_items(sampled_items(queue_table), [[0, 1, 2]])
        with pytest.raises(ValueError, match="unknown replay table 'nope'"):
            client.writer("nope")
    finally:
        client.close()
