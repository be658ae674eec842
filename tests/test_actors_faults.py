"""Workers that raise, die by SIGKILL mid-step, hang, or lose their parent: reported
with what they left, replaced or the pool stopped, nothing hangs, nothing leaks."""

from __future__ import annotations

import os
import signal
import textwrap

import helpers
import helpers.actor_envs  # noqa: F401  (registers the misbehaving environments)
import numpy as np
import pytest

from actors import EnvConfig, EnvPool, EnvWorkerError


def _drive(pool: EnvPool, batches: int) -> list:
    seen = []
    for n in range(batches):
        b = pool.recv(timeout=60)
        seen.append((b.half, b.done.copy()))
        pool.send(np.full(pool.half_size, (n // 2) % 2))  # left, right, ...: CartPole's pole stays up
    return seen


def test_env_that_raises_stops_the_pool_with_its_traceback(shm_leak_check):
    pool = EnvPool(EnvConfig("shmpadtest/Raising-v0", gym_kwargs={"at_step": 3}), 2, 2)
    pids = pool.worker_pids
    with pytest.raises(EnvWorkerError) as info:
        _drive(pool, 20)
    message = str(info.value)
    assert message.startswith("env worker ")
    assert "exited with code 1:" in message
    assert "ZeroDivisionError: division by zero" in message
    assert "in _explode" in message  # the environment's own frame
    assert "('shmpadtest/Raising-v0', seed 0, worker generation 0) raised in step()" in message
    assert pool.closed
    assert not any(helpers.pid_alive(p) for p in pids)


def _stalling(tmp_path) -> tuple[EnvConfig, str]:
    marker = str(tmp_path / "inside-step")
    return EnvConfig("shmpadtest/Stalling-v0", gym_kwargs={"marker": marker, "at_step": 2}), marker


def _pid_in(marker: str) -> int:
    assert helpers.wait_until(lambda: os.path.exists(marker), 60), "no worker reached the stalling step"
    with open(marker) as f:
        return int(f.read())


def test_sigkill_mid_step_is_reported_and_the_pool_stops(tmp_path, shm_leak_check):
    config, marker = _stalling(tmp_path)
    pool = EnvPool(config, 2, 2)
    try:
        _drive(pool, 2)  # every environment has now taken one step; the next batch stalls
        b = pool.recv(timeout=60)
        pool.send(np.zeros(pool.half_size, np.int64))  # the workers now step half 0 again: one stalls
        victim = _pid_in(marker)  # inside env.step, the half's slots half written
        assert victim in pool.worker_pids
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(
            EnvWorkerError,
            match=r"env worker \d \(pid \d+, environments \[.*\] of 'shmpadtest/Stalling-v0'\) was killed by signal 9 \(SIGKILL\)",
        ):
            _drive(pool, 4)
        assert b.half == 0 and pool.closed
    finally:
        pool.close()


def test_sigkill_mid_step_with_restarts_goes_on(tmp_path, shm_leak_check):
    config, marker = _stalling(tmp_path)
    with EnvPool(config, 2, 2, restarts=1) as pool:
        _drive(pool, 3)  # the second step of half 0 is now under way, and stalled in one worker
        victim = _pid_in(marker)
        w = pool.worker_pids.index(victim)
        os.kill(victim, signal.SIGKILL)
        seen = _drive(pool, 8)
        stats = pool.statistics()
        assert stats.restarts == 1
        assert "was killed by signal 9 (SIGKILL)" in stats.failures[0]
        assert victim not in pool.worker_pids and not helpers.pid_alive(victim)
        # The replacement answered with reset observations: done is set for exactly the
        # dead worker's environment of the half it had in hand.
        half0 = [done for half, done in seen if half == 0]
        assert half0[0].tolist() == [int(i == w) for i in range(2)]
        assert all(d.sum() == 0 for d in half0[1:])


def test_hung_worker_is_killed_with_its_stack(tmp_path, shm_leak_check):
    config, marker = _stalling(tmp_path)
    pool = EnvPool(config, 1, 2, hang_timeout=1.0)
    try:
        with pytest.raises(EnvWorkerError) as info:
            _drive(pool, 10)
        message = str(info.value)
        assert "made no progress for 1 s and was killed; its stack:" in message
        assert "helpers/actor_envs.py" in message and "in step" in message  # where it hung
        assert pool.closed
    finally:
        pool.close()


def test_workers_die_with_their_parent(shm_leak_check):
    code = textwrap.dedent(
        """
        import sys, time
        from actors import EnvPool
        pool = EnvPool("CartPole-v1", 2, 2)
        pool.recv(timeout=30)
        print(*pool.worker_pids, pool._slots.name, flush=True)
        time.sleep(600)
        """
    )
    proc = helpers.spawn_python(code)
    try:
        *pids, segment = helpers.read_line(proc, timeout=60).split()
        pids = [int(p) for p in pids]
        for p in pids:
            helpers.track_pid(p)
        os.kill(proc.pid, signal.SIGKILL)  # only the parent: the workers must follow on their own
        proc.wait(timeout=30)
        assert helpers.wait_until(lambda: not any(helpers.pid_alive(p) for p in pids), 60)
        assert helpers.wait_until(lambda: not helpers.shm_exists(segment), 60)  # the janitor's work
    finally:
        helpers.kill_and_reap(proc)
