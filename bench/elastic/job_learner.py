"""A learner of ``python -m bench.elastic --restart job``: the Pong job's learner
(``bench.impala``) in a new interpreter, as a user's supervisor starts a member of a group
again (``python -m bench.impala --peers ...``), fed synthetic batches.

    python -m bench.elastic.job_learner NAME PARENT_PID LIFETIME [JOB FLAGS ...]

What is the job's own, called as ``bench.impala.train.run_learner`` calls it:

- the interpreter and its imports (``bench.impala.train``: torch, shmpad, actors, learners);
- the settings: ``bench.impala.options.parse_args`` of the job's flags with the group's
  ``--peers``, ``--group``, ``--min-peers``, ``--backend`` and ``--learner-threads``, and
  ``--algo impala`` unless the job's flags name one (a group runs APPO by default, 16
  reductions per batch of 128-step unrolls; IMPALA's one step per batch of 20-step unrolls
  gives an arm many group steps: ``--job "--algo appo"`` measures APPO's); ``resolve``
  and the machine plan (compiling and bf16 as the plan says for this machine);
- the environment's spec (``EnvConfig.spec``: one Pong environment built, reset and
  stepped, as the job's main process does before it launches), the model (``build_model``:
  the Nature CNN by default), the ``Learner`` (its optimiser, schedule, staging and loss,
  ``torch.compile``d lazily: at its first loss), the warm-up before the join
  (``train.warm_up``: a first update, compiling the loss, then undone), ``join_group`` with
  the job's arguments, and every update through ``Learner.step``;
- how it resumes: it joins the group and receives the group's state (weights, optimiser,
  schedule, version) in the state sync of its first ring, as any joiner does. It loads no
  checkpoint: a job started with ``--resume`` would load its own last one before joining,
  and the group's sync then replaces it (the group's version is the higher).

What is synthetic: the batches. The trajectory ring is ``SyntheticRing``, which hands
``Learner.step`` the same prepared batch every time (``bench.impala.learner_cost``'s
seeded unroll, ``B`` times; the staging copy out of it is the job's); there are no
actors, no weight store (nothing is published), no progress log and no checkpoints. A
restarted job also starts its actors and waits for their first batch before it joins; that
wait is not here.

It writes one JSON line per event on the pipe that was its stdout (the job's own prints
go to stderr); ``t`` is ``time.monotonic()``, and every event also carries ``cpu``, the CPU
seconds this process has used so far (``time.process_time()``: every thread's, not the
compiler's worker processes')::

    {"e": "up", "t", "pid", "argv"}     the interpreter (started with argv) is up, the job imported
    {"e": "built", "t", "p"}            settings, environment spec, model (p parameters), Learner
    {"e": "compiled", "t", "s"}         its first loss and gradients (the warm-up's; compiling included) took s seconds
    {"e": "joined", "t"}                join_group returned: it has asked the broker to join
    {"e": "synced", "t"}                its first ring formed: the group's state is loaded
    {"e": "step", ...}, {"e": "abandoned", ...}   as ``bench.elastic.learner``'s, one step per update

It trains until stdin reads end-of-file, then leaves the group and exits 0; it dies with
``PARENT_PID`` and at the latest after ``LIFETIME`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import torch

from actors.trajectory import trajectory_spec
from bench.impala import train
from bench.impala.learner_cost import _prepared_unroll
from bench.impala.options import parse_args
from learners import Learner
from shmpad.errors import Timeout
from shmpad.launch.process import die_with_parent
from shmpad.net.auth import TOKEN_ENV
from shmpad.net.model_state import digest

GROUP = "elastic"
SET_BY_THE_BENCHMARK = ("peers", "group", "min_peers", "backend", "resume", "token_file", "peer_host")
"""the job's options the benchmark gives every learner (``group_argv``), which ``--job`` may not"""


class SyntheticRing:
    """What ``Learner`` reads of the job's trajectory ring: its spec, and batches of
    ``[B, T+1, ...]`` tensors (the same prepared ones every time), with nothing to release."""

    def __init__(self, spec: dict, batch: dict[str, torch.Tensor]) -> None:
        self.spec = spec
        self.batch = batch

    def get_batch(self, batch_size: int, timeout: float | None = None, torch: bool = False) -> dict:
        return self.batch

    def release(self) -> None:
        pass


def group_argv(flags: list[str], broker: str, peers: int, backend: str, threads: int) -> list[str]:
    """The job's command line for a learner of the group at ``broker``: ``flags`` (``--job``)
    and the group's options; ``--learner-threads`` is ``threads`` and ``--algo`` is impala
    (one step, one reduction, per batch) unless ``flags`` gives them."""
    # the benchmark's defaults first: a flag of ``flags`` (even abbreviated) comes later and wins
    defaults = ["--learner-threads", str(threads), "--algo", "impala"]
    return [*defaults, *flags, "--peers", broker, "--group", GROUP, "--min-peers", str(peers), "--backend", backend]


def check_flags(flags: list[str]) -> None:
    """``ValueError`` naming a flag of ``SET_BY_THE_BENCHMARK`` in ``flags``."""
    for f in flags:
        name = f.split("=", 1)[0]
        if name.startswith("--") and name[2:].replace("-", "_") in SET_BY_THE_BENCHMARK:
            given = " ".join(flags)
            raise ValueError(f"--job takes the job's own flags; the benchmark sets {name} itself, got --job {given!r}")


def settings(argv: list[str], token: str | None = None, prog: str = "python -m bench.elastic.job_learner") -> train.Job:
    """The job the learner runs (``bench.impala``'s parsing and checks: a bad flag exits
    with the job parser's message). ``token``: the group's, for the parser's check that
    ``--peers`` has one, where ``$SHMPAD_TOKEN`` does not give it (it is restored after)."""
    if token is None:
        return train.resolve(parse_args(argv, prog=prog))
    before = os.environ.get(TOKEN_ENV)
    os.environ[TOKEN_ENV] = token
    try:
        return train.resolve(parse_args(argv, prog=prog))
    finally:
        if before is None:
            del os.environ[TOKEN_ENV]
        else:
            os.environ[TOKEN_ENV] = before


def describe(job: train.Job) -> str:
    """One line on the job's learner, for the benchmark's headline."""
    spec = job.env.spec()
    params = sum(p.numel() for p in train.build_model(job, spec.obs_shape, spec.num_actions).parameters())
    learner = job.learner
    how = [f"{learner.algo.upper()} update", f"T={job.unroll_length} B={learner.batch_size}"]
    if learner.algo == "appo":
        how.append(f"{learner.epochs}x{learner.minibatches} minibatch steps per update")
    how += ["torch.compile" if learner.compile else "eager", "bf16" if learner.bf16 else "fp32"]
    how.append(f"{job.plan.learner_threads} torch thread{'s' if job.plan.learner_threads > 1 else ''}")
    return f"{job.env.env_id} job's learner ({job.model.kind} model, {params:,} parameters; {', '.join(how)})"


def run(name: str, argv: list[str], events: int, control: int) -> None:
    """The learner of the job ``argv`` as member ``name``, until ``control`` reads end-of-file."""

    def emit(**fields: object) -> None:
        fields["cpu"] = round(time.process_time(), 3)  # this process's CPU seconds so far, every thread's
        os.write(events, (json.dumps(fields, separators=(",", ":")) + "\n").encode())  # one write per line

    # argv: the command line this interpreter was started with (a forked process would carry its parent's)
    emit(e="up", t=time.monotonic(), pid=os.getpid(), argv=sys.orig_argv)
    stop = threading.Event()
    threading.Thread(target=_until_eof, args=(control, stop), daemon=True).start()
    job = settings(argv)
    group = job.group
    torch.set_num_threads(job.plan.learner_threads)  # as run_learner
    train.use_cudnn_autotuner(job)
    spec = job.env.spec()
    model = train.build_model(job, spec.obs_shape, spec.num_actions)
    learner = Learner(model, _synthetic_ring(job, spec, model), job.learner, None, job.device)
    _time_first_loss(learner, emit)
    emit(e="built", t=time.monotonic(), p=sum(p.numel() for p in model.parameters()))
    train.warm_up(learner, stop)  # as run_learner: a first update, undone, before the join
    train.join(learner, group)  # as run_learner
    acc = learner.accumulator
    emit(e="joined", t=time.monotonic())
    synced = False
    try:
        while not stop.is_set():
            if not acc.ready(timeout=1.0):  # Learner.step's own ready() then returns at once
                continue
            if not synced:
                synced = True
                emit(e="synced", t=time.monotonic())
            steps, abandoned, ring = learner.steps, acc.abandoned, acc.ring_key
            try:
                learner.step(timeout=1.0)
            except Timeout:
                continue
            if learner.steps != steps:
                emit(e="step", t=time.monotonic(), v=acc.version, n=acc.size, d=digest(model), r=acc.refused, g=ring)
            elif acc.abandoned != abandoned:
                emit(e="abandoned", t=time.monotonic(), v=acc.version, g=ring)
    finally:
        acc.close()


def _synthetic_ring(job: train.Job, spec, model) -> SyntheticRing:
    """The job's trajectory spec, and one batch of it: the seeded unroll ``B`` times."""
    traj = trajectory_spec(spec, job.unroll_length, core_state_shapes=train.core_state_shapes(model))
    unroll = _prepared_unroll(job, spec)
    for name, (dtype, shape) in traj.items():
        unroll.setdefault(name, np.zeros(shape, dtype))  # an LSTM's core state: zeros
    b = job.learner.batch_size
    return SyntheticRing(traj, {k: torch.from_numpy(np.stack([v] * b)) for k, v in unroll.items()})  # [B, T+1, ...]


def _time_first_loss(learner: Learner, emit) -> None:
    """Emit ``compiled`` once the learner's first loss and gradients are done (the first call
    compiles them where the plan compiles)."""
    real = learner.compute_loss

    def first(*inputs):
        t0 = time.monotonic()
        result = real(*inputs)
        learner.compute_loss = real
        emit(e="compiled", t=time.monotonic(), s=round(time.monotonic() - t0, 3))
        return result

    learner.compute_loss = first


def _until_eof(fd: int, stop: threading.Event) -> None:
    while os.read(fd, 4096):
        pass
    stop.set()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.elastic.job_learner")
    parser.add_argument("name")
    parser.add_argument("parent", type=int, help="the benchmark's pid: this process dies with it")
    parser.add_argument("lifetime", type=float, help="seconds after which it exits in any case")
    parser.add_argument("job", nargs=argparse.REMAINDER, help="the job's flags (bench.impala's)")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    signal.alarm(max(1, int(args.lifetime)))
    events = os.dup(1)
    os.dup2(2, 1)  # the job's prints go to stderr: stdout is the events' pipe
    run(args.name, args.job, events, 0)


if __name__ == "__main__":
    main()
