"""APPO or IMPALA (V-trace) on Atari with shmpad: the project's main job.

    python -m bench.impala                                  # a short Pong run: 200K frames, a smoke test
    python -m bench.impala --env ALE/Breakout-v5 --total-frames 50_000_000 --model deep
    python -m bench.impala --env CartPole-v1                # any gymnasium id; classic control gets its own defaults
    python -m bench.impala --resume --out runs/ale-pong-v5-20250101-120000   # continue that run

The program, in shmpad's Launchpad API:

    actor/i  (one process each)  an EnvPool of forked env workers (observations written
                                  straight into shared slots) + batched inference of the
                                  policy; finished unrolls [T+1] go into the trajectory ring
    trajectories                  a RingNode of typed [T+1, ...] slots (shared memory)
    weights                       a WeightStoreNode: the learner publishes, actors pull
    learner                       get_batch(B) -> [T+1, B] zero-copy tensors, V-trace,
                                  one optimiser step, publish; logs, CSV, PNG, checkpoints

Read top to bottom: ``resolve``, the options (``Args`` and ``parse_args``, in
``bench/impala/options.py``) turned once into the ``Job`` every node gets (the env config,
the learner config, the plan for this machine, the run folder); the actor node; the learner
node; the program; ``main``.

Every ``--log-interval`` seconds the learner prints one line: frames, frames/s, learner
steps/s, the mean true return of the last 100 episodes, how full the trajectory ring is
and the share of time the learner waited for data. ``--out`` (default: a new
``runs/<env>-<date>-<time>``) gets ``config.json``, ``log.csv``, ``curve.png`` and
``checkpoint.pt``; a run never writes into another run's folder. What a longer run should
add is printed after the smoke test (``usage.advice``); ``--device cuda`` puts inference and
the learner on a GPU.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable

import torch

import shmpad as lp
from actors import BatchedInference, EnvPool, RolloutWriter, trajectory_spec
from actors.envs.protocol import PROTOCOLS
from bench.impala import rundir
from bench.impala.job import Job, PeerGroup, resolve
from bench.impala.options import Args, UsageError, parse_args
from bench.impala.plan import Plan, pinned_cpus
from bench.impala.progress import (
    RunLog,
    actor_counters,
    actor_totals,
    last_seconds,
    plot,
    progress,
    progress_line,
    seconds_since_start,
    startup_line,
)
from bench.impala.tensorboard import TensorBoardLog
from bench.impala.usage import advice, summary
from learners import Learner, ModelConfig
from shmpad import Closed, Timeout
from shmpad.net.auth import load_token

__all__ = ["Args", "Job", "PeerGroup", "UsageError", "main", "parse_args", "resolve"]


# -- what every node builds ------------------------------------------------------------


def build_model(job: Job, obs_shape, num_actions: int):
    """The job's network, seeded alike in every process."""
    torch.manual_seed(job.seed)
    return job.model.build(obs_shape, num_actions)


def core_state_shapes(model) -> list[tuple[int, ...]]:
    """One environment's shape of each core state tensor: [layers, hidden] for an LSTM, none without."""
    return [(s.shape[0], *s.shape[2:]) for s in model.initial_state(1)]  # from [layers, 1, hidden]


def act(model, obs):
    return model(obs[None]).policy_logits[0]  # [B, A]


def actor_policy(job: Job):
    """How an actor runs its network: ``act``; None (``actors.BatchedInference`` steps it with its
    core state, last action and reward) for an LSTM or ``--last-action-reward``."""
    return None if job.model.use_lstm or job.model.last_action_reward else act


def actor_bf16(job: Job) -> bool:
    """Whether the actors infer under bf16 autocast: where the plan runs the learner in bf16
    on the CPU (inference took 4.2-4.3 ms per batch of 16 Pong frames instead of 7.0-8.5,
    docs/results/cpu-bf16; the heads stay fp32, see ``learners.models``). Not on a GPU,
    where it was not measured."""
    return job.plan.bf16 and job.device == "cpu"


# -- the actor node ----------------------------------------------------------------------


ACTOR_STATS_S = 0.5
"""how often an actor reports its counters"""


def use_cudnn_autotuner(job: Job) -> None:
    """On a GPU, let cuDNN time its convolution algorithms once per shape and keep the fastest:
    the actors' batches and the learner's unrolls never change shape (moolib does the same)."""
    if job.device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True


def publish_counters(counters: dict[str, float]) -> None:
    """An actor's counters, for the learner's progress line and ``python -m shmpad.top``."""
    for name, value in counters.items():
        lp.publish_counter(name, value)


def actor_seeds(job: Job, index: int) -> tuple[int, int]:
    """Actor ``index``'s seeds: of its environments, and of its action sampling. They come from
    ``job.actor_seed``, so the members of a group (each its own --member-seed) play different games."""
    return job.actor_seed + 1_000_003 * index, job.actor_seed + index


def run_actor(
    job: Job, index: int, trajectories, weights, report: Callable[[dict[str, float]], None] = publish_counters
) -> None:
    """Step the env pool with batched inference, unrolls into ``trajectories``; every
    ``ACTOR_STATS_S`` the counters (``actor_counters``) go to ``report``."""
    torch.set_num_threads(1)
    use_cudnn_autotuner(job)
    plan = job.plan
    env_seed, sampling_seed = actor_seeds(job, index)
    pool = EnvPool(job.env, plan.num_workers, plan.envs_per_worker, seed=env_seed)
    try:
        model = build_model(job, pool.spec.obs_shape, pool.spec.num_actions)
        writer = RolloutWriter(trajectories, groups=pool.halves, group_size=pool.half_size)
        inference = BatchedInference(
            pool,
            model,
            job.device,
            writer,
            weights,
            seed=sampling_seed,
            policy=actor_policy(job),
            bf16=actor_bf16(job),
            graph=job.cuda_graph,
        )
        stop = lp.stop_event()
        next_report = time.monotonic()
        while not stop.is_set():
            if job.lockstep and not wait_for_learner(weights, 1 + writer.unrolls // job.learner.batch_size, stop):
                break
            try:
                inference.step(timeout=1.0)
            except Timeout:
                continue
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + ACTOR_STATS_S
                report(actor_counters(pool, inference))
    except Closed:
        pass  # the program stopped: the trajectory ring was closed under us
    finally:
        pool.close()


def wait_for_learner(weights, version: int, stop) -> bool:
    """--lockstep: block until ``weights`` holds ``version`` (the learner's first publish is
    version 1, and each update of a batch publishes the next), so that the actor's next
    step pulls exactly it; False if the program stopped first.

    The actor asks, before each step, for the version after every whole batch it has
    written (1 + unrolls // B). The learner cannot publish a later one, since it has no
    data for it; and every unroll counted is already in the ring, since the writer blocks
    until it is. So each step's weights, and with them the run, do not depend on timing."""
    while not stop.is_set():
        try:
            weights.wait_for_version(newer_than=version - 1, timeout=1.0)  # at once if it is out already
            return True
        except Timeout:
            pass
    return False


# -- the learner node --------------------------------------------------------------------


def run_learner(job: Job, obs_shape, num_actions: int, trajectories, weights, started: float | None = None) -> None:
    """Train until ``job.total_frames`` (or the stop); with ``started``, the ``time.monotonic()``
    of the command, print once how long it took to reach the first update (``startup_line``)."""
    torch.set_num_threads(job.plan.learner_threads)
    use_cudnn_autotuner(job)
    checkpoint = os.path.join(job.out, rundir.CHECKPOINT)
    learner = Learner(
        build_model(job, obs_shape, num_actions),
        trajectories,
        job.learner,
        weights,
        job.device,
    )
    seconds_before = 0.0
    if job.resume and os.path.exists(checkpoint):
        learner.load(checkpoint)
        seconds_before = last_seconds(os.path.join(job.out, rundir.LOG))
    group = job.group
    stop = lp.stop_event()
    if group is not None:
        warm_up(learner, stop)
    if group is not None and not stop.is_set():  # stopped while warming up: no join to leave at once
        join(learner, group)
        lp.register_stop_handler(learner.accumulator.close)  # a reduction in flight must not outlast the stop
        print(f"joining group {group.name!r} at {group.broker} as {learner.accumulator.name}", flush=True)
    with RunLog(job.out, job.resume) as log:
        board = TensorBoardLog(os.path.join(job.out, "tensorboard")) if job.tensorboard else None
        start = time.monotonic()
        # (a member's warm-up waited already: that is not the first row's)
        last = {"t": start, "frames": learner.frames, "steps": learner.steps, "wait": learner.statistics().wait_seconds}
        last_checkpoint = start
        frames_before = learner.frames
        while learner.frames < job.total_frames and not stop.is_set():
            try:
                learner.step(timeout=1.0)
            except Timeout:
                pass
            if started is not None and learner.frames > frames_before:
                if learner.device.type == "cuda":
                    torch.cuda.synchronize(learner.device)  # the update's kernels have run, not only been queued
                print(startup_line(time.monotonic() - started), flush=True)
                started = None
            log.episodes(learner.frames, learner.new_episodes)
            learner.new_episodes.clear()
            now = time.monotonic()
            if now - last["t"] >= job.log_interval or learner.frames >= job.total_frames:
                row = progress(learner, trajectories, last, now, seconds_before + now - start, actor_totals())
                log.row(row)
                print(progress_line(row), flush=True)
                report(row, learner, board)
            if now - last_checkpoint >= 60 * job.checkpoint_minutes:
                learner.save(checkpoint)
                last_checkpoint = now
        learner.save(checkpoint)
        if board is not None:
            board.close()
    if learner.accumulator is not None:
        learner.accumulator.close()
    plot(log.path, os.path.join(job.out, "curve.png"), job.env.env_id, log.episodes_path)
    if learner.frames >= job.total_frames:
        print(
            f"done: {learner.frames:,} frames; wrote {log.path}, {os.path.join(job.out, 'curve.png')}, {checkpoint}",
            flush=True,
        )
    else:
        print(f"stopped at {learner.frames:,} frames; saved {checkpoint}", flush=True)
    lp.stop()


def warm_up(learner: Learner, stop: threading.Event) -> None:
    """Before a group member joins: its first batch, its loss compiled, that update undone
    (``Learner.warm_up``), so that the group does not wait for its actors' start and its
    compiling. Returns when that is done or, within a second or one update, once the
    program stops."""
    t0 = time.monotonic()
    while not stop.is_set():
        if learner.warm_up(timeout=1.0):
            print(
                f"warmed up before joining: a first batch and update in {time.monotonic() - t0:.1f} s, undone",
                flush=True,
            )
            return


def join(learner: Learner, group: PeerGroup) -> None:
    """``learner.join_group`` with the job's ``--peers`` options (``group``) and token."""
    learner.join_group(
        group.broker,
        group.name,
        host=group.host,
        token=load_token(token_file=group.token_file or None),
        virtual_batch_size=group.virtual_batch_size,
        min_size=group.min_size,
        backend=group.backend,
    )


def report(row: dict, learner: Learner, board: TensorBoardLog | None) -> None:
    """The progress row beyond the CSV: counters for ``python -m shmpad.top`` and, with
    --tensorboard, scalars (every loss term too)."""
    for name in ("frames", "learner_steps", "mean_return", "policy_lag"):
        if row.get(name, "") != "":
            lp.publish_counter(name, float(row[name]))
    if board is not None:
        board.write({**row, **{f"loss_{k}": v for k, v in learner.statistics().last_loss.items()}})


def build_program(
    job: Job,
    actor: Callable[..., None] = run_actor,
    actor_args: tuple = (),
    program: lp.Program | None = None,
    started: float | None = None,
) -> lp.Program:
    """The job's program (its nodes added to ``program`` where one is given). Each actor node
    runs ``actor(job, index, trajectories, weights, *actor_args)``: ``run_actor``, or a
    benchmark's wrapper of it that watches the actors (``bench.impala.throughput``).
    ``started``: the command's ``time.monotonic()``, for the learner's start-up line."""
    spec = job.env.spec()  # also compiles the preprocessing kernels before the fork
    if not spec.discrete:
        raise SystemExit(f"bench.impala needs discrete actions; {job.env.env_id!r} has {spec.describe_actions()}")
    model = build_model(job, spec.obs_shape, spec.num_actions)
    traj = trajectory_spec(spec, job.unroll_length, core_state_shapes=core_state_shapes(model))
    program = lp.Program("impala") if program is None else program
    trajectories = program.add_node(lp.RingNode(job.queue_slots, spec=traj, multi=True), "trajectories")
    weights = program.add_node(lp.WeightStoreNode(model), "weights")
    with program.group("actor"):
        for i in range(job.plan.num_actors):
            program.add_node(lp.PyNode(actor, job, i, trajectories, weights, *actor_args))
    program.add_node(
        lp.PyNode(run_learner, job, spec.obs_shape, spec.num_actions, trajectories, weights, started),
        "learner",
    )
    return program


def local_resources(plan: Plan) -> dict[str, lp.PythonProcess]:
    """Where the plan pins: the learner's group on the first ``learner_threads`` of this
    process's cores, the actors' (their env workers inherit it) on the others."""
    cpus = pinned_cpus(plan)
    if cpus is None:
        return {}
    learner, actors = cpus
    return {"learner": lp.PythonProcess(cpus=learner), "actor": lp.PythonProcess(cpus=actors)}


STOP_NOTICE_S = 120.0
"""how long the nodes have to stop after Ctrl+C before they are killed: the learner ends its update
and writes its checkpoint. An APPO update of 64 x 128 Pong steps took 38-48 s on one shared core
(docs/results/pong-rl-games-cpu), longer than launch's default notice of 10 s; a second Ctrl+C kills at once."""

IDENTITY = (
    "env",
    "algo",  # an Atari run from before APPO became Atari's default resumes with --algo impala, not silently as APPO
    *(name for name in ModelConfig().record() if name != "init"),  # the weights loaded make the init moot
    *(name for name in PROTOCOLS["envpool"].fields() if name != "reward_clip"),
)
"""the settings a checkpoint depends on: --resume refuses a run that differs in one"""


def prepare_run(args: Args, job: Job) -> int | None:
    """Check ``--out`` (and with ``--resume`` its checkpoint) before anything is launched,
    then write ``config.json``. Returns the frames of the checkpoint resumed, if any."""
    config = rundir.run_config(dataclasses.asdict(args), job.plan)
    rundir.check(job.out, config, job.resume, IDENTITY)
    frames = None
    if job.resume:
        spec = job.env.spec()
        model = build_model(job, spec.obs_shape, spec.num_actions)
        frames = rundir.check_checkpoint(job.out, model, f"--env {args.env} {job.model.flags()}")
    rundir.write_config(job.out, config)
    return frames


HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"
"""torch's switch for transparent huge pages under its CPU allocator's large tensors, read once, at
its first allocation; an APPO job turns it on unless the environment sets it (``=0`` keeps it off).
On the 2-core CPU the default Pong job (APPO) ran 1.10x and 1.11x the frames/s with it in 2
interleaved rounds, its learner's update 1.10x; the IMPALA Pong job ran 0.84x and 0.99x (its learner
waiting more for the actors), so IMPALA's job leaves it as the environment has it
(docs/results/learner-cost-cpu)."""


def main(argv: list[str] | None = None) -> int:
    # from the command's own start, imports included; called with argv (from Python), from here
    started = time.monotonic() - (seconds_since_start() if argv is None else 0.0)
    try:
        args = parse_args(argv)  # allocates no tensor: the switch below is read at the first one
        if args.algo == "appo":
            os.environ.setdefault(HUGE_PAGES, "1")  # before the job's first tensor (a checkpoint's, when resuming)
        job = resolve(args)
        frames = prepare_run(args, job)
    except (UsageError, rundir.RunDirError) as e:
        print(f"python -m bench.impala: error: {e}", file=sys.stderr, flush=True)
        return 2
    if frames is not None and frames >= args.total_frames:
        print(
            f"{args.out} is already at {frames:,} frames (--total-frames {args.total_frames:,}): "
            "raise --total-frames to train on",
            flush=True,
        )
        return 0
    print(summary(args, job.plan), flush=True)
    if frames is not None:
        print(f"resuming {args.out} at {frames:,} frames", flush=True)
    try:
        program = build_program(job, started=started)
        manager = lp.launch(
            program,
            launch_type=args.launch_type,
            local_resources=local_resources(job.plan),
            top=args.top,
            termination_notice_secs=STOP_NOTICE_S,
        )
        manager.wait()
    finally:
        rundir.remove_temp_files(args.out)  # a learner killed mid-save (a second Ctrl+C) leaves one
    frames = rundir.checkpoint_frames(args.out)
    if frames is None or frames < args.total_frames:
        if frames is None:
            print("interrupted before the first checkpoint; nothing to resume", flush=True)
        else:
            print(f"interrupted at {frames:,} frames; continue with --resume --out {args.out}", flush=True)
        return 130
    tip = advice(args)
    if tip:
        print(tip, flush=True)
    return 0
