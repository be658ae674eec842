"""EnvPool correctness against a single-process reference, layouts, bad input, idleness."""

from __future__ import annotations

import os

import helpers
import numpy as np
import pytest

from actors import EnvConfig, EnvPool, seed_sequence
from actors.pool.worker import _SLICE_NS
from shmpad.errors import Closed

SYS_FUTEX = 202


class ReferencePool:
    """What a pool's slots must hold, computed in this process: environment ``i`` made
    from ``seed_sequence(seed, i)``; the first batch is the reset observation."""

    def __init__(self, config: EnvConfig, num_envs: int, seed: int):
        self.envs = [config.make(seed_sequence(seed, i)) for i in range(num_envs)]
        spec = self.envs[0].spec
        self.obs = np.zeros((num_envs, *spec.obs_shape), spec.obs_dtype)
        self.reward = np.zeros(num_envs, np.float32)
        self.done = np.zeros(num_envs, np.uint8)
        self.ret = np.zeros(num_envs, np.float32)
        self.len = np.zeros(num_envs, np.int32)
        self.end = np.zeros(num_envs, np.uint8)
        self.clip = config.reward_clip
        self._ret = [0.0] * num_envs
        self._len = [0] * num_envs
        for i, env in enumerate(self.envs):
            env.reset(self.obs[i])

    def step(self, envs: range, actions: np.ndarray) -> None:
        for i, a in zip(envs, actions):
            r, done, over = self.envs[i].step(a, self.obs[i])
            self._ret[i] += r
            self._len[i] += 1
            self.reward[i] = r if self.clip is None else np.clip(r, -self.clip, self.clip)
            self.done[i], self.ret[i], self.len[i], self.end[i] = done or over, self._ret[i], self._len[i], over
            if over:
                self.envs[i].reset(self.obs[i])
                self._ret[i], self._len[i] = 0.0, 0


def _check_batch(batch, ref: ReferencePool) -> None:
    e = slice(batch.envs.start, batch.envs.stop)
    np.testing.assert_array_equal(batch.obs, ref.obs[e])
    np.testing.assert_array_equal(batch.reward, ref.reward[e])
    np.testing.assert_array_equal(batch.done, ref.done[e])
    np.testing.assert_array_equal(batch.episode_return, ref.ret[e])
    np.testing.assert_array_equal(batch.episode_step, ref.len[e])
    np.testing.assert_array_equal(batch.episode_end, ref.end[e])


@pytest.mark.parametrize(
    "workers, per_worker, halves",
    [(2, 4, 2), (1, 8, 2), (4, 2, 1), (3, 2, 2)],
)
def test_every_step_matches_a_single_process_run(workers, per_worker, halves, shm_leak_check):
    config = EnvConfig("CartPole-v1", reward_clip=0.5)
    seed, batches = 3, 240
    ref = ReferencePool(config, workers * per_worker, seed)
    rng = np.random.default_rng(0)  # actions depend only on the environment index and step
    actions = rng.integers(0, 2, (batches, workers * per_worker))
    ends = 0
    with EnvPool(config, workers, per_worker, halves=halves, seed=seed) as pool:
        for n in range(batches):
            batch = pool.recv(timeout=30)
            assert batch.half == n % halves
            if n >= halves:
                ref.step(batch.envs, actions[n - halves, batch.envs.start : batch.envs.stop])
            _check_batch(batch, ref)
            ends += int(batch.episode_end.sum())
            pool.send(actions[n, batch.envs.start : batch.envs.stop])
        stats = pool.statistics()
    assert ends > 0  # episodes ended and the environments were reset on their own
    assert stats.batches == batches and stats.restarts == 0
    assert (ref.ret[ref.end == 1] >= ref.len[ref.end == 1] * 1.0 - 1e-6).all()  # unclipped return of CartPole


def test_actions_written_in_place_and_torch_actions():
    import torch

    with EnvPool("CartPole-v1", 1, 2) as pool:
        batch = pool.recv(timeout=30)
        batch.action[:] = 1
        pool.send()
        pool.recv(timeout=30)
        pool.send(torch.zeros(1, dtype=torch.int64))
        assert pool.recv(timeout=30).half == 0


def test_bad_actions_are_refused_with_the_value():
    with EnvPool("CartPole-v1", 2, 2, halves=2) as pool:
        pool.recv(timeout=30)
        with pytest.raises(ValueError, match=r"action 2 for environment 1 is out of range: Discrete\(2\) allows 0..1"):
            pool.send(np.array([0, 2]))
        with pytest.raises(ValueError, match=r"action -1 for environment 0 is out of range"):
            pool.send([-1, 0])
        with pytest.raises(
            ValueError, match=r"actions must have shape \(2,\) \(one per environment of the half\), got \(3,\)"
        ):
            pool.send([0, 1, 0])
        with pytest.raises(
            TypeError, match=r"actions must be integers for Discrete\(2\) allows 0..1, got dtype float64"
        ):
            pool.send([0.0, 1.0])
        with pytest.raises(RuntimeError, match=r"recv\(\) called again before send\(\) answered the previous batch"):
            pool.recv()
        pool.send([1, 1])
        with pytest.raises(RuntimeError, match=r"send\(\) without a recv\(\)"):
            pool.send([1, 1])
    with pytest.raises(Closed, match="the pool is closed"):
        pool.recv()


def test_bad_pool_arguments():
    with pytest.raises(ValueError, match="halves must be 1 or 2, got 3"):
        EnvPool("CartPole-v1", 1, 3, halves=3)
    with pytest.raises(ValueError, match=r"envs_per_worker must be a multiple of halves \(2\), got 3"):
        EnvPool("CartPole-v1", 1, 3)
    with pytest.raises(TypeError, match="num_workers must be an int, got float"):
        EnvPool("CartPole-v1", 1.0, 2)
    with pytest.raises(ValueError, match=r"unknown environment id 'CartPol-v1'; did you mean 'CartPole-v1'"):
        EnvPool("CartPol-v1", 1, 2)
    with pytest.raises(TypeError, match="env must be a gymnasium id \\(str\\) or an EnvConfig, got int"):
        EnvPool(5, 1, 2)


def test_same_seed_same_run_other_seed_other_run():
    def run(seed: int) -> np.ndarray:
        with EnvPool("CartPole-v1", 2, 2, seed=seed) as pool:
            out = []
            for _ in range(20):
                b = pool.recv(timeout=30)
                out.append(b.obs.copy())
                pool.send(np.ones(2, np.int64))
            return np.stack(out)

    first = run(1)
    assert np.array_equal(first, run(1))
    assert not np.array_equal(first, run(2))


def test_idle_workers_sleep_in_the_kernel(shm_leak_check):
    with EnvPool("CartPole-v1", 2, 2) as pool:
        pool.recv(timeout=30)  # the pool now holds half 0: both workers finish half 1 and wait
        pids = pool.worker_pids
        assert helpers.wait_until(lambda: all(helpers.current_syscall(p) == SYS_FUTEX for p in pids), 60)
        # A worker woken by its wait slice only looks at STOP and its parent, then sleeps again:
        # asleep in the kernel, woken no more often than its slice allows.
        helpers.assert_idle(pids, slice_s=_SLICE_NS / 1e9)
        assert helpers.wait_until(lambda: all(helpers.current_syscall(p) == SYS_FUTEX for p in pids), 60)


def test_close_ends_the_workers(shm_leak_check):
    pool = EnvPool("CartPole-v1", 3, 2)
    pids = pool.worker_pids
    pool.recv(timeout=30)
    pool.close()
    assert not any(helpers.pid_alive(p) for p in pids)
    pool.close()  # idempotent
    assert pool.closed and os.getpid() not in pids
