"""Classic IMPALA actors: each process steps its own environments with its own CPU
copy of the policy, pulls newer weights from a ``WeightStore`` before every unroll,
and writes its unrolls into a multi-producer trajectory ring.

``LocalPolicyActors`` forks and supervises such processes (same reports, restarts
and clean stop as ``EnvPool``); ``run_actor`` is the loop one of them runs, usable
on its own in a process of a program.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Callable

import numpy as np
import torch

from actors.envs.config import EnvConfig
from actors.envs.spec import seed_sequence
from actors.inference import sample_actions
from actors.rollout import RolloutWriter
from actors.trajectory import LAST_ACTION, POLICY_VERSION
from shmpad.errors import Closed, EnvWorkerError, Timeout
from shmpad.launch.process import Child, Restarts, spawn
from shmpad.ringbuf import TypedRing
from shmpad.shm import janitor
from shmpad.weights import WeightStore

__all__ = ["LocalPolicyActors", "run_actor"]

log = logging.getLogger("shmpad.actors")


def run_actor(
    config: EnvConfig,
    make_model: Callable[[], torch.nn.Module],
    weights: WeightStore,
    ring: TypedRing,
    num_envs: int,
    seed: int,
    first_env: int = 0,
    generation: int = 0,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Step ``num_envs`` environments (global indices from ``first_env``) with a local
    policy until ``should_stop()`` or the ring or store is closed."""
    torch.set_num_threads(1)
    model = make_model().eval()
    envs = [config.make(seed_sequence(seed, first_env + i, generation)) for i in range(num_envs)]
    rows = {f: np.zeros((num_envs, *shape[1:]), dtype) for f, (dtype, shape) in ring.spec.items()}
    writer = RolloutWriter(ring, 1, num_envs, timeout=1.0)
    generator = torch.Generator().manual_seed(int(seed_sequence(seed, first_env, generation).generate_state(1)[0]))
    totals = np.zeros((num_envs, 2))
    for i, env in enumerate(envs):
        env.reset(rows["obs"][i])
    version = 0
    while version == 0:  # the learner publishes the first weights
        if should_stop():
            return
        try:
            version = weights.wait_for_version(0, timeout=1.0)
        except Timeout:
            continue
    version = weights.pull(model)
    clip = config.reward_clip
    try:
        while not should_stop():
            if writer.row(0) == 1:  # a new unroll starts: act with the newest weights
                version = weights.pull(model, newer_than=version)
            rows[LAST_ACTION][:] = rows["action"]  # the action that led to this row's observation
            with torch.inference_mode():
                logits = model(torch.from_numpy(rows["obs"]))[0]
                rows["action"][:] = sample_actions(logits, generator).numpy()
                rows["logits"][:] = logits.numpy()
            rows[POLICY_VERSION] = version
            _add(writer, rows, should_stop)
            for i, env in enumerate(envs):
                r, done, over = env.step(rows["action"][i], rows["obs"][i])
                totals[i] += (r, 1)
                rows["reward"][i] = r if clip is None else min(max(r, -clip), clip)
                rows["done"][i] = done or over
                rows["episode_return"][i], rows["episode_step"][i] = totals[i]
                rows["episode_end"][i] = over
                if over:
                    env.reset(rows["obs"][i])
                    totals[i] = 0
    except Closed:
        return
    finally:
        for env in envs:
            env.close()


def _add(writer: RolloutWriter, rows: dict, should_stop: Callable[[], bool]) -> None:
    """``writer.add``, then keep flushing while the learner lags (ring full), unless stopped."""
    try:
        writer.add(0, rows)
        return
    except Timeout:
        pass
    while not should_stop():
        try:
            writer.flush(0)
            return
        except Timeout:
            continue
    raise Closed("stopped while the trajectory ring was full")


class LocalPolicyActors:
    """``num_actors`` forked processes, each running ``run_actor`` on ``envs_per_actor``
    environments. ``check()`` reports (or, within ``restarts``, replaces) dead actors."""

    def __init__(
        self,
        env: str | EnvConfig,
        make_model: Callable[[], torch.nn.Module],
        weights: WeightStore,
        ring: TypedRing,
        num_actors: int,
        envs_per_actor: int,
        seed: int = 0,
        restarts: int = 0,
    ):
        self.config = EnvConfig(env) if isinstance(env, str) else env
        if not ring.multi:
            raise ValueError(
                "the trajectory ring of several actors must be multi-producer: TypedRing.create(..., multi=True)"
            )
        self.config.spec()  # a bad id or broken environment fails here, before any fork
        self._args = (make_model, weights, ring, envs_per_actor, seed)
        self._restarts = Restarts(restarts)
        self._parent = os.getpid()
        self._stopping = False
        self.failures: list[str] = []
        janitor.start()
        self._actors = [self._fork(a, 0) for a in range(num_actors)]

    def _fork(self, a: int, generation: int) -> Child:
        make_model, weights, ring, n, seed = self._args
        parent = self._parent

        def target() -> None:
            run_actor(
                self.config, make_model, weights, ring, n, seed, a * n, generation, lambda: os.getppid() != parent
            )

        return spawn(target, a, generation)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._actors]

    def check(self) -> None:
        """Look for dead actors: restart them while the budget lasts, else stop all and raise."""
        for a, proc in enumerate(self._actors):
            if proc.poll() and not self._stopping:
                message = f"actor {a} (pid {proc.pid}) {proc.describe()}" + (
                    f":\n{proc.report()}" if proc.report() else " and left no report"
                )
                self.failures.append(message)
                proc.close()
                if self._restarts.take():
                    log.warning("%s\nrestarting it", message)
                    self._actors[a] = self._fork(a, proc.generation + 1)
                    continue
                self.close()
                raise EnvWorkerError(message, worker=a, report=proc.report())

    def close(self, grace: float = 5.0) -> None:
        """Stop every actor (SIGTERM, SIGKILL after ``grace`` s) and reap them. Idempotent."""
        self._stopping = True
        for proc in self._actors:
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self._actors:
            if not proc.wait(max(0.0, deadline - time.monotonic())):
                proc.kill()
            proc.close()

    def __enter__(self) -> "LocalPolicyActors":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
