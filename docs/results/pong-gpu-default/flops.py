"""What the GPU learner must do to keep up with 16 cores of Pong, counted rather than timed: the
floating-point operations of one APPO update of the default job (``Learner.update`` on one batch of
the job's shape: V-trace's forward pass over the batch, then 4 epochs x 4 minibatches of forward,
backward, clipping and Adam), by torch's FlopCounterMode on the CPU, in fp32 and eager (the count
does not depend on the device or the precision), and the rates those counts ask for at a given
env frames/s. Run from the repository's root with its venv active:

    python docs/results/pong-gpu-default/flops.py [FRAMES_PER_S ...]   # default: 60000 74000

The batch is ``bench.impala.learner_cost``'s prepared unroll repeated over the batch (the count
depends on the shapes only). It runs one update of 64 x 128 steps on the CPU: about a minute of one
core."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from actors.trajectory import trajectory_spec
from bench.impala import train
from bench.impala.learner_cost import _prepared_unroll
from learners.learner import Learner
from shmpad.ringbuf import TypedRing


def count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def main(rates: list[float]) -> None:
    torch.set_num_threads(1)
    args = train.parse_args(["--compile", "off", "--bf16", "off", "--out", "/nonexistent/run"])
    job = train.resolve(args)
    spec = job.env.spec()
    t, b = job.unroll_length, job.learner.batch_size
    epochs, minibatches = job.learner.epochs, job.learner.minibatches
    ring = TypedRing.create(trajectory_spec(spec, t), b)  # for its spec only
    try:
        model = train.build_model(job, spec.obs_shape, spec.num_actions)
        learner = Learner(model, ring, dataclasses.replace(job.learner, frames_per_step=1), None, "cpu")
        unroll = _prepared_unroll(job, spec)
        batch = {k: torch.from_numpy(np.stack([v] * b, axis=1)) for k, v in unroll.items()}  # [T+1, B]
        obs = batch["obs"][:, :2]  # [T+1, 2, C, H, W]: 2 unrolls, for the per-sample counts
        done = batch["done"][:, :2].bool()
        samples = obs.shape[0] * obs.shape[1]
        with torch.no_grad():
            forward = count(lambda: model(obs, done)) / samples

        def forward_backward() -> None:
            out = model(obs, done)
            (out.policy_logits.sum() + out.baseline.sum()).backward()

        both = count(forward_backward) / samples
        update = count(lambda: learner.update(batch))
    finally:
        ring.close()
    frames = b * t * job.learner.frames_per_step
    steps = epochs * minibatches
    params = sum(p.numel() for p in model.parameters())
    print(f"# {torch.__version__}, {spec.obs_shape} observations, {spec.num_actions} actions, {params:,} parameters")
    print(f"the network, per sample: forward {forward / 1e6:.2f} MFLOP, forward + backward {both / 1e6:.2f} MFLOP")
    print(
        f"one update: T={t} x B={b} = {b * t:,} steps = {frames:,} frames; {epochs} epochs x {minibatches} "
        f"minibatches = {steps} optimiser steps ({frames // steps:,} frames each); {update / 1e12:.3f} TFLOP"
    )
    for rate in rates:
        updates = rate / frames
        print(
            f"at {rate:,.0f} env frames/s: {updates:.2f} updates/s, {updates * steps:.1f} minibatch steps/s "
            f"({1e3 / (updates * steps):.0f} ms each), {updates * update / 1e12:.2f} TFLOP/s, "
            f"{1e3 / updates:.0f} ms per update"
        )


if __name__ == "__main__":
    main([float(r) for r in sys.argv[1:]] or [60_000.0, 74_000.0])
