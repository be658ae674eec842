"""``EnvPool``: forked environment workers stepping into shared slots, double-buffered.

    pool = EnvPool("ALE/Pong-v5", num_workers=8, envs_per_worker=16)
    while training:
        batch = pool.recv()              # the next half: views of its slots, no copy
        batch.action[:] = policy(batch.obs)
        pool.send()                      # the workers of that half step while the
                                         # other half's batch is in inference
    pool.close()

``recv`` and ``send`` alternate, and the halves come in turn. Only the process that
made the pool may call them: it is the workers' parent, and it supervises them
while it waits. A worker that dies (an exception in an environment, a signal) or
makes no progress for ``hang_timeout`` seconds is reported with what it left (the
environment's traceback, the signal, or its stack) and either replaced (while the
``restarts`` budget lasts; its environments start new episodes) or the pool closes
and ``recv`` raises ``EnvWorkerError``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from actors.envs.config import EnvConfig
from actors.envs.spec import EnvSpec
from actors.pool.slots import PoolSlots
from actors.pool.sync import (
    copy_actions,
    count_short,
    load,
    load_stats,
    publish_all,
    spins_for,
    store,
    wait_all,
    wake,
    warm_up,
)
from actors.pool.worker import WorkerArgs, run_worker
from actors.trajectory import STEP_FIELDS, frames_per_step
from shmpad.errors import Closed, EnvWorkerError, Timeout
from shmpad.launch.process import Child, Restarts, spawn
from shmpad.shm import janitor

__all__ = ["EnvPool", "HalfBatch", "PoolStatistics"]

log = logging.getLogger("shmpad.actors")

_SLICE_NS = 50_000_000  # the pool looks at its workers' health this often while it waits


@dataclass(frozen=True)
class HalfBatch:
    """One half of the pool's environments after a step: views of their slots, valid
    until the ``send`` that answers them. ``envs`` are their global indices."""

    half: int
    envs: range
    obs: np.ndarray  # [B / halves, *obs_shape]
    reward: np.ndarray  # [B / halves] float32, clipped if the config asks
    done: np.ndarray  # [B / halves] uint8
    episode_return: np.ndarray  # [B / halves] float32, unclipped
    episode_step: np.ndarray  # [B / halves] int32
    episode_end: np.ndarray  # [B / halves] uint8
    action: np.ndarray  # [B / halves, *action_shape], written by the caller (or by send)


@dataclass(frozen=True)
class PoolStatistics:
    """Counters since the pool started. Worker times are per worker, in seconds."""

    batches: int
    env_steps: int
    frames: int
    worker_env_seconds: tuple[float, ...]
    worker_wait_seconds: tuple[float, ...]
    recv_wait_seconds: float
    restarts: int
    failures: tuple[str, ...]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


class EnvPool:
    """``num_workers`` forked processes each stepping ``envs_per_worker`` environments.

    ``env`` is a gymnasium id or an ``EnvConfig``. ``halves`` is 2 (double-buffered)
    or 1. Environment ``i`` is seeded from ``(seed, i)``, so the same seed gives the
    same episodes for any number of workers. ``restarts`` is how many failed workers
    the pool may replace before it gives up; ``spins`` how long a waiter spins before
    it sleeps (when its previous wait was short, see ``actors.pool.sync``).
    """

    def __init__(
        self,
        env: str | EnvConfig,
        num_workers: int,
        envs_per_worker: int,
        halves: int = 2,
        seed: int = 0,
        restarts: int = 0,
        hang_timeout: float = 60.0,
        spins: int = 200,
    ):
        self.config = EnvConfig(env) if isinstance(env, str) else env
        if not isinstance(self.config, EnvConfig):
            raise TypeError(f"env must be a gymnasium id (str) or an EnvConfig, got {type(env).__name__}")
        self.num_workers = _positive_int("num_workers", num_workers)
        self.envs_per_worker = _positive_int("envs_per_worker", envs_per_worker)
        if halves not in (1, 2):
            raise ValueError(f"halves must be 1 or 2, got {halves!r}")
        if self.envs_per_worker % halves:
            raise ValueError(f"envs_per_worker must be a multiple of halves ({halves}), got {envs_per_worker}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if not hang_timeout > 0:
            raise ValueError(f"hang_timeout must be > 0 seconds, got {hang_timeout!r}")
        self.halves = halves
        self.seed = int(seed)
        self._restarts = Restarts(restarts)
        self.hang_timeout = float(hang_timeout)
        if isinstance(spins, bool) or not isinstance(spins, (int, np.integer)) or spins < 0:
            raise ValueError(f"spins must be a non-negative int, got {spins!r}")
        self.spins = int(spins)
        self.spec: EnvSpec = self.config.spec()
        self.num_envs = self.num_workers * self.envs_per_worker
        self.half_size = self.num_envs // halves

        warm_up()
        janitor.start()  # before the first fork: the janitor then outlives every worker
        self._slots = PoolSlots.create(self.spec, self.num_workers, self.envs_per_worker, halves)
        self._sent = [0] * halves
        self._next_half = 0
        self._holding: HalfBatch | None = None
        self._closed = False
        self._batches = 0
        self._recv_wait_ns = 0
        self._last_wait_ns = 0
        self._failures: list[str] = []
        self._progress = [(-1, time.monotonic())] * self.num_workers  # (steps seen, when it changed)
        self._batch_views = [self._make_batch(h) for h in range(halves)]
        self._workers: list[Child] = []
        try:
            for w in range(self.num_workers):
                self._workers.append(self._fork(w, 0))
        except BaseException:
            self.close()
            raise

    # -- the hot path --------------------------------------------------------------

    def recv(self, timeout: float | None = None) -> HalfBatch:
        """The next half's observations, rewards and flags (views), once its workers
        have all stepped it; raises ``Timeout`` after ``timeout`` s, ``EnvWorkerError``
        when a worker failed and may not be replaced, ``Closed`` after ``close``."""
        if self._closed:
            raise Closed("the pool is closed")
        if self._holding is not None:
            raise RuntimeError("recv() called again before send() answered the previous batch")
        h = self._next_half
        slots, target = self._slots, self._sent[h] + 1
        if count_short(slots.words, slots.obs_count[h], target) != 0:
            t0 = time.perf_counter_ns()
            deadline = None if timeout is None else time.monotonic() + timeout
            spins = spins_for(self.spins, self._last_wait_ns)
            while wait_all(slots.words, slots.obs_count[h], target, slots.half_ev[h], spins, _SLICE_NS) != 0:
                spins = 0  # woken by a slice: this wait is long
                self._supervise(h, target)
                if deadline is not None and time.monotonic() >= deadline:
                    late = [w for w in range(self.num_workers) if load(slots.words, slots.obs_count[h][w]) < target]
                    raise Timeout(f"recv timed out after {timeout} s: workers {late} have not stepped half {h}")
            self._last_wait_ns = time.perf_counter_ns() - t0
            self._recv_wait_ns += self._last_wait_ns
        self._batches += 1
        self._holding = self._batch_views[h]
        return self._holding

    def send(self, actions: Any = None) -> None:
        """Answer the batch ``recv`` returned: copy ``actions`` ([B / halves, *action_shape];
        numpy, torch or a sequence) into its action slots, or, without ``actions``, use
        what the caller wrote into ``batch.action``; then let its workers step."""
        if self._closed:
            raise Closed("the pool is closed")
        batch = self._holding
        if batch is None:
            raise RuntimeError("send() without a recv(): there is no batch to answer")
        if actions is None:
            actions = batch.action  # written in place by the caller: checked, copied onto itself
        elif type(actions).__module__.startswith("torch"):
            actions = actions.detach().cpu().numpy()
        if (
            self.spec.discrete
            and type(actions) is np.ndarray
            and actions.dtype == batch.action.dtype
            and actions.shape == batch.action.shape
            and actions.flags.c_contiguous
        ):
            # The common case in one compiled call: the numpy checks cost more than the copy.
            bad = copy_actions(actions, batch.action, self.spec.num_actions)
            if bad >= 0:
                raise ValueError(self._out_of_range(actions, bad, batch))
        elif actions is batch.action:
            self._check_actions(actions, batch)
        else:
            np.copyto(batch.action, self._check_actions(actions, batch), casting="unsafe")
        h = batch.half
        self._sent[h] += 1
        self._holding = None
        self._next_half = (h + 1) % self.halves
        slots = self._slots
        publish_all(slots.words, slots.act[h], self._sent[h], slots.worker_ev)

    def _check_actions(self, actions: Any, batch: HalfBatch) -> np.ndarray:
        spec = self.spec
        a = np.asarray(actions)
        want = (self.half_size, *spec.action_shape)
        if a.shape != want:
            raise ValueError(f"actions must have shape {want} (one per environment of the half), got {a.shape}")
        if spec.discrete:
            if a.dtype.kind not in "iu":
                raise TypeError(f"actions must be integers for {spec.describe_actions()}, got dtype {a.dtype}")
            bad = np.flatnonzero((a < 0) | (a >= spec.num_actions))
        else:
            if a.dtype.kind not in "fiu":
                raise TypeError(f"actions must be numbers for {spec.describe_actions()}, got dtype {a.dtype}")
            flat = a.reshape(len(a), -1)
            bad = np.flatnonzero(
                ~np.all(np.isfinite(flat) & (flat >= spec.action_low) & (flat <= spec.action_high), axis=1)
            )
        if len(bad):
            raise ValueError(self._out_of_range(a, int(bad[0]), batch))
        return a

    def _out_of_range(self, a: np.ndarray, i: int, batch: HalfBatch) -> str:
        return (
            f"action {a[i].tolist()!r} for environment {batch.envs[i]} is out of range: {self.spec.describe_actions()}"
        )

    # -- supervision -----------------------------------------------------------------

    def _supervise(self, h: int, target: int) -> None:
        """Between sleeps of a ``recv``: find dead or hung workers and replace them or fail."""
        words = self._slots.words
        now = time.monotonic()
        for w, proc in enumerate(self._workers):
            if proc.poll():
                self._failed(w, proc.describe(), proc.report())
                continue
            steps = load_stats(words, self._slots.stats_word[w])[0]
            seen, since = self._progress[w]
            if steps != seen:
                self._progress[w] = (steps, now)
            elif now - since > self.hang_timeout and load(words, self._slots.obs_count[h][w]) < target:
                proc.dump_stack()
                proc.kill()
                self._failed(
                    w, f"made no progress for {self.hang_timeout:g} s and was killed; its stack", proc.report()
                )

    def _failed(self, w: int, how: str, report: str) -> None:
        proc = self._workers[w]
        envs = [e for h in range(self.halves) for e in self._slots.geometry.envs_of(w, h)]
        message = f"env worker {w} (pid {proc.pid}, environments {envs} of {self.config.env_id!r}) {how}" + (
            f":\n{report}" if report else " and left no report"
        )
        self._failures.append(message)
        proc.close()
        if self._restarts.take():
            log.warning("%s\nrestarting it (%d restarts left)", message, self._restarts.left)
            self._progress[w] = (-1, time.monotonic())
            self._workers[w] = self._fork(w, proc.generation + 1)
            return
        self.close()
        raise EnvWorkerError(message, worker=w, report=report)

    def _fork(self, w: int, generation: int) -> Child:
        args = WorkerArgs(w, generation, self.config, self.seed, self.spins, os.getpid())
        slots = self._slots
        return spawn(lambda: run_worker(slots, args), w, generation)

    # -- the rest --------------------------------------------------------------------

    def _make_batch(self, h: int) -> HalfBatch:
        v = self._slots.half(h)
        envs = range(h * self.half_size, (h + 1) * self.half_size)
        return HalfBatch(h, envs, **{f: v[f] for f in STEP_FIELDS})

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the current workers (for monitoring and tests)."""
        return [p.pid for p in self._workers]

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> PoolStatistics:
        env_s, wait_s, steps = [], [], 0
        if not self._closed:
            for w in range(self.num_workers):
                n, env_ns, wait_ns = load_stats(self._slots.words, self._slots.stats_word[w])
                steps += n
                env_s.append(env_ns / 1e9)
                wait_s.append(wait_ns / 1e9)
        frames = steps * frames_per_step(self.config)
        return PoolStatistics(
            self._batches,
            steps,
            frames,
            tuple(env_s),
            tuple(wait_s),
            self._recv_wait_ns / 1e9,
            self._restarts.used,
            tuple(self._failures),
        )

    def close(self, grace: float = 5.0) -> None:
        """Stop the workers (SIGKILL after ``grace`` s), reap them and free the segment. Idempotent."""
        if self._closed:
            return
        self._closed = True
        slots = self._slots
        store(slots.words, slots.stop_word, 1)  # pairs with load(stop_word) in run_worker
        wake(slots.words, slots.worker_ev)
        deadline = time.monotonic() + grace
        for proc in self._workers:
            if not proc.wait(max(0.0, deadline - time.monotonic())):
                proc.kill()
            proc.close()
        self._holding = None
        self._batch_views = []
        slots.close()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.num_workers} workers x {self.envs_per_worker} envs"
        return f"EnvPool({self.config.env_id!r}, {state}, halves={self.halves})"
