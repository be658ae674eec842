"""The learner's framework cost, for ``bench.impala.throughput``.

``bare``: ``Learner.update`` on one ready batch, over and over: the same model, loss,
backward, clipping and optimiser step, compiled and in bf16 as the job's plan says, but
no ring, no staging and no publishing (the batch is built once as time-major
``[T+1, B, ...]`` tensors on the learner's device). ``ring``: ``Learner.step()`` fed from a
``TypedRing`` that a forked producer keeps full with copies of one prepared unroll,
publishing to a ``WeightStore`` as the job's flags say (every update, or every
``--publish-seconds``; CartPole's defaults publish every 10 ms), as in the real program. Each
runs ``LEARNER_SECONDS`` s in a process tree of its own (``bench.common.harness.in_own_tree``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np
import torch

import shmpad as lp
from actors.trajectory import trajectory_spec
from bench.impala import train
from learners.learner import Learner
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore

__all__ = ["LEARNER_SECONDS", "LEARNER_SUBJECTS"]

LEARNER_SECONDS = 4.0
"""counted seconds of each learner measurement (after WARMUP_UPDATES)"""
WARMUP_UPDATES = 2


def _prepared_unroll(job: train.Job, spec) -> dict[str, np.ndarray]:
    """One plausible unroll of every trajectory field ([T+1, ...]), seeded."""
    rng = np.random.default_rng(job.seed)
    out = {}
    for name, (dtype, shape) in trajectory_spec(spec, job.unroll_length).items():
        dtype = np.dtype(dtype)
        if name == "action":
            a = rng.integers(0, spec.num_actions, shape)
        elif name in ("done", "episode_end"):
            a = rng.random(shape) < 0.05
        elif dtype.kind == "f":
            a = rng.standard_normal(shape)
        else:
            a = rng.integers(0, 256 if dtype == np.uint8 else 100, shape)
        out[name] = a.astype(dtype)
    return out


def _updates_per_s(step: Callable[[], None]) -> tuple[float, float]:
    for _ in range(WARMUP_UPDATES):
        step()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < LEARNER_SECONDS:
        step()
        n += 1
    elapsed = time.perf_counter() - start
    return n / elapsed, elapsed


def _bare_loop(job: train.Job, spec) -> dict:
    torch.set_num_threads(job.plan.learner_threads)
    ring = TypedRing.create(trajectory_spec(spec, job.unroll_length), job.learner.batch_size)  # for its spec only
    try:
        model = train.build_model(job, spec.obs_shape, spec.num_actions)
        learner = Learner(model, ring, dataclasses.replace(job.learner, frames_per_step=1), None, job.device)
        unroll = _prepared_unroll(job, spec)
        batch = {
            k: torch.from_numpy(np.stack([v] * job.learner.batch_size, axis=1)) for k, v in unroll.items()
        }  # [T+1, B]
        batch = {k: v.to(learner.device) for k, v in batch.items()}
        rate, _ = _updates_per_s(lambda: learner.update(batch))
        return {"updates_per_s": rate, "wait_share": 0.0}
    finally:
        ring.close()


def _ring_learner(job: train.Job, spec) -> dict:
    torch.set_num_threads(job.plan.learner_threads)
    traj = trajectory_spec(spec, job.unroll_length)
    ring = TypedRing.create(traj, job.queue_slots, multi=True)
    model = train.build_model(job, spec.obs_shape, spec.num_actions)
    weights = WeightStore.create(model)
    producer = _fork_producer(ring.name, _prepared_unroll(job, spec))
    try:
        learner = Learner(model, ring, dataclasses.replace(job.learner, frames_per_step=1), weights, job.device)
        rate, _ = _updates_per_s(lambda: learner.step(timeout=60.0))
        s = learner.statistics()
        return {"updates_per_s": rate, "wait_share": s.wait_seconds / max(s.wait_seconds + s.update_seconds, 1e-9)}
    finally:
        ring.close()  # wakes the producer with Closed
        os.waitpid(producer, 0)
        weights.close()


def _fork_producer(ring_name: str, unroll: dict[str, np.ndarray]) -> int:
    """A process that keeps the ring full with copies of ``unroll`` until it is closed."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        ring = TypedRing.attach(ring_name)
        while os.getppid() == parent:
            try:
                slot = ring.reserve(timeout=1.0)
            except lp.Timeout:
                continue
            for name, value in unroll.items():
                slot[name][...] = value
            ring.commit()
    except lp.Closed:
        pass
    finally:
        os._exit(0)


LEARNER_SUBJECTS = {"bare": _bare_loop, "ring": _ring_learner}
