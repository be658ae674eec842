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
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import shmpad as lp
from actors import BatchedInference, EnvConfig, EnvPool, RolloutWriter, frames_per_step, trajectory_spec
from bench.impala import rundir
from bench.impala.options import Args, UsageError, parse_args
from bench.impala.plan import QUEUE_BATCHES, Plan, make_plan, pinned_cpus
from bench.impala.progress import RunLog, actor_counters, actor_totals, last_seconds, plot, progress, progress_line
from bench.impala.tensorboard import TensorBoardLog
from bench.impala.usage import advice, summary
from learners import Learner, LearnerConfig, make_model
from shmpad import Closed, Timeout
from shmpad.net.auth import load_token

__all__ = ["Args", "UsageError", "parse_args", "resolve", "Job", "main"]


# -- Args resolved once: what the nodes need ---------------------------------------------


@dataclass(frozen=True)
class PeerGroup:
    """--peers: the broker group this host's learner trains with."""

    broker: str
    """--peers: HOST:PORT of the broker, or env://"""
    name: str
    """--group"""
    host: str
    """--peer-host: where this learner listens for the others"""
    token_file: str
    """--token-file ("": $SHMPAD_TOKEN)"""
    virtual_batch_size: int
    """--virtual-batch-size"""
    min_size: int
    """--min-peers"""
    backend: str
    """--backend: what moves the gradients"""


@dataclass(frozen=True)
class Job:
    """``Args`` resolved once (``resolve``), before launch: the values the nodes need,
    pickled into every node and never changed there."""

    env: EnvConfig
    """the environment every actor steps"""
    learner: LearnerConfig
    """the loss, the optimiser, the learning-rate schedule and how often weights are published"""
    plan: Plan
    """actors x env workers x environments, learner threads, compiled, bf16, pinned"""
    out: str
    """the run folder: config.json, log.csv, episodes.csv, curve.png, checkpoint.pt"""
    model: str
    """the network: shallow, deep or mlp"""
    init: str
    """its initial weights: torch or orthogonal"""
    use_lstm: bool
    """an LSTM core after the torso"""
    last_action_reward: bool
    """the core and heads also see the previous action and the clipped reward"""
    normalize_input: bool
    """the torso standardises its inputs by running statistics"""
    normalize_value: bool
    """the baseline predicts standardised values"""
    seed: int
    """seeds every environment and the networks"""
    device: str
    """where inference and the learner run"""
    cuda_graph: bool
    """the actors replay their forward pass from a CUDA graph"""
    unroll_length: int
    """T: steps per unroll"""
    queue_slots: int
    """trajectory ring slots (--queue-slots, or 4 batches for IMPALA and 1 for APPO)"""
    total_frames: int
    """the learner stops after this many environment frames"""
    log_interval: float
    """seconds between progress lines"""
    checkpoint_minutes: float
    """minutes between checkpoints"""
    resume: bool
    """continue the run in ``out`` from its checkpoint"""
    tensorboard: bool
    """also write TensorBoard scalars into ``out``/tensorboard"""
    group: PeerGroup | None
    """the group this learner averages gradients with; None without --peers"""
    lockstep: bool
    """the one actor waits for the learner's update of each batch it wrote (``wait_for_learner``)"""


def resolve(args: Args, plan: Plan | None = None) -> Job:
    """What the nodes need from ``args``; ``plan`` defaults to ``make_plan(args)`` for this machine."""
    plan = make_plan(args) if plan is None else plan
    env = EnvConfig(
        args.env,
        full_action_space=args.full_action_space,
        sticky_actions=args.sticky_actions,
        noop_max=args.noop_max,
        terminal_on_life_loss=args.episodic_life,
        reward_clip=None,  # the learner clips; episode returns stay true either way
    )
    learner = LearnerConfig(
        batch_size=args.batch_size,
        discount=args.discount,
        reward_clip=args.reward_clip or None,
        baseline_cost=args.baseline_cost,
        entropy_cost=args.entropy_cost,
        grad_norm_clip=args.grad_norm_clip or None,
        optimizer=args.optimizer,
        learning_rate=args.learning_rate,
        adam_eps=args.adam_eps,
        reduction=args.reduction,
        algo=args.algo,
        epochs=plan.epochs,
        minibatches=args.minibatches if args.algo == "appo" else 1,
        shuffle=args.shuffle,
        clip=args.clip,
        value_clip=args.value_clip or None,
        vtrace_lambda=args.vtrace_lambda,
        kl_target=args.kl_target,
        total_frames=args.lr_decay_frames or args.total_frames,
        frames_per_step=frames_per_step(env),
        publish_every=args.publish_every,
        publish_seconds=args.publish_seconds,
        compile=plan.compile,
        bf16=plan.bf16,
    )
    group = None
    if args.peers:
        group = PeerGroup(
            args.peers,
            args.group,
            args.peer_host,
            args.token_file,
            args.virtual_batch_size,
            args.min_peers,
            args.backend,
        )
    return Job(
        env=env,
        learner=learner,
        plan=plan,
        out=args.out,
        model=args.model,
        init=args.init,
        use_lstm=args.use_lstm,
        last_action_reward=args.last_action_reward,
        normalize_input=args.normalize_input,
        normalize_value=args.normalize_value,
        seed=args.seed,
        device=args.device,
        cuda_graph=args.cuda_graph == "on",
        unroll_length=args.unroll_length,
        queue_slots=args.queue_slots or QUEUE_BATCHES[args.algo] * args.batch_size,
        total_frames=args.total_frames,
        log_interval=args.log_interval,
        checkpoint_minutes=args.checkpoint_minutes,
        resume=args.resume,
        tensorboard=args.tensorboard,
        group=group,
        lockstep=args.lockstep,
    )


def build_model(job: Job, obs_shape, num_actions: int):
    torch.manual_seed(job.seed)
    return make_model(
        job.model,
        obs_shape,
        num_actions,
        use_lstm=job.use_lstm,
        last_action_reward=job.last_action_reward,
        init=job.init,
        normalize_input=job.normalize_input,
        normalize_value=job.normalize_value,
    )


def core_state_shapes(model) -> list[tuple[int, ...]]:
    """One environment's shape of each core state tensor: [layers, hidden] for an LSTM, none without."""
    return [(s.shape[0], *s.shape[2:]) for s in model.initial_state(1)]  # from [layers, 1, hidden]


def act(model, obs):
    return model(obs[None]).policy_logits[0]  # [B, A]


def actor_policy(job: Job):
    """How an actor runs its network: ``act``; None (``actors.BatchedInference`` steps it with its
    core state, last action and reward) for an LSTM or ``--last-action-reward``."""
    return None if job.use_lstm or job.last_action_reward else act


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


def run_actor(
    job: Job, index: int, trajectories, weights, report: Callable[[dict[str, float]], None] = publish_counters
) -> None:
    """Step the env pool with batched inference, unrolls into ``trajectories``; every
    ``ACTOR_STATS_S`` the counters (``actor_counters``) go to ``report``."""
    torch.set_num_threads(1)
    use_cudnn_autotuner(job)
    plan = job.plan
    pool = EnvPool(job.env, plan.num_workers, plan.envs_per_worker, seed=job.seed + 1_000_003 * index)
    try:
        model = build_model(job, pool.spec.obs_shape, pool.spec.num_actions)
        writer = RolloutWriter(trajectories, groups=pool.halves, group_size=pool.half_size)
        inference = BatchedInference(
            pool,
            model,
            job.device,
            writer,
            weights,
            seed=job.seed + index,
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


def run_learner(job: Job, obs_shape, num_actions: int, trajectories, weights) -> None:
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
    if group is not None:
        token = load_token(token_file=group.token_file or None)
        learner.join_group(
            group.broker,
            group.name,
            host=group.host,
            token=token,
            virtual_batch_size=group.virtual_batch_size,
            min_size=group.min_size,
            backend=group.backend,
        )
        lp.register_stop_handler(learner.accumulator.close)  # a reduction in flight must not outlast the stop
        print(f"joining group {group.name!r} at {group.broker} as {learner.accumulator.name}", flush=True)
    stop = lp.stop_event()
    with RunLog(job.out, job.resume) as log:
        board = TensorBoardLog(os.path.join(job.out, "tensorboard")) if job.tensorboard else None
        start = time.monotonic()
        last = {"t": start, "frames": learner.frames, "steps": learner.steps, "wait": 0.0}
        last_checkpoint = start
        while learner.frames < job.total_frames and not stop.is_set():
            try:
                learner.step(timeout=1.0)
            except Timeout:
                pass
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
) -> lp.Program:
    """The job's program (its nodes added to ``program`` where one is given). Each actor node
    runs ``actor(job, index, trajectories, weights, *actor_args)``: ``run_actor``, or a
    benchmark's wrapper of it that watches the actors (``bench.impala.throughput``)."""
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
        lp.PyNode(run_learner, job, spec.obs_shape, spec.num_actions, trajectories, weights),
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
    "model",
    "use_lstm",
    "last_action_reward",
    "full_action_space",
    "sticky_actions",
    "noop_max",
    "episodic_life",
    "normalize_input",
    "normalize_value",
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
        built = [f"--env {args.env}", f"--model {args.model}"]
        built += [
            f"--{k.replace('_', '-')}"
            for k in ("use_lstm", "last_action_reward", "normalize_input")
            if getattr(args, k)
        ]
        frames = rundir.check_checkpoint(job.out, model, " ".join(built))
    rundir.write_config(job.out, config)
    return frames


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
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
        program = build_program(job)
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
