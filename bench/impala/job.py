"""``Args`` resolved once into the ``Job`` every node gets: the environment, the model and
the learner as their configs (``actors.EnvConfig``, ``learners.ModelConfig``,
``learners.LearnerConfig``, each owning its rules), the machine plan, the run folder and the
group of hosts. ``configs`` is also how the command line checks its options
(``options.parse_args``), so each rule is written once, in its config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from actors import EnvConfig, frames_per_step
from bench.impala.plan import Plan, make_plan, queue_slots
from learners import LearnerConfig, ModelConfig

__all__ = ["Job", "PeerGroup", "configs", "member_stream", "resolve"]


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
    model: ModelConfig
    """the network the actors and the learner build"""
    learner: LearnerConfig
    """the loss, the optimiser, the learning-rate schedule and how often weights are published"""
    plan: Plan
    """actors x env workers x environments, learner threads, compiled, bf16, pinned"""
    out: str
    """the run folder: config.json, log.csv, episodes.csv, curve.png, checkpoint.pt"""
    seed: int
    """seeds the networks (``build_model``), and the environments where ``actor_seed`` says"""
    actor_seed: int
    """seeds the environments and the actors' action sampling: ``seed`` on one host; with
    --peers, ``seed`` and --member-seed together (``member_stream``), so that members differ"""
    device: str
    """where inference and the learner run"""
    cuda_graph: bool
    """the actors replay their forward pass from a CUDA graph"""
    unroll_length: int
    """T: steps per unroll"""
    queue_slots: int
    """trajectory ring slots (--queue-slots, or ``bench.impala.plan.queue_slots``: 4 batches for IMPALA, 1 for APPO on a CPU, one slot per environment for APPO on a GPU)"""
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


def configs(args: Any, plan: Plan | None = None) -> tuple[EnvConfig, ModelConfig, LearnerConfig]:
    """The environment, model and learner configs of ``args`` (bench.impala's ``Args``), each
    checked: a ``ValueError`` (or ``TypeError``) names the config field out of its range.
    ``plan`` gives the learner's compiling and precision (off without one)."""
    env = EnvConfig(
        args.env,
        full_action_space=args.full_action_space,
        sticky_actions=args.sticky_actions,
        noop_max=args.noop_max,
        terminal_on_life_loss=args.episodic_life,
        reward_clip=None,  # the learner clips; episode returns stay true either way
    )
    model = ModelConfig(
        args.model, args.init, args.use_lstm, args.last_action_reward, args.normalize_input, args.normalize_value
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
        epochs=args.epochs,
        minibatches=args.minibatches,
        shuffle=args.shuffle,
        clip=args.clip,
        value_clip=args.value_clip or None,
        vtrace_lambda=args.vtrace_lambda,
        kl_target=args.kl_target,
        lr_decay_frames=args.lr_decay_frames or args.total_frames,
        frames_per_step=frames_per_step(env),
        publish_every=args.publish_every,
        publish_seconds=args.publish_seconds,
        compile=plan.compile if plan is not None else False,
        bf16=plan.bf16 if plan is not None else False,
    )
    learner.check(use_lstm=model.use_lstm, normalize_value=model.normalize_value, unroll_length=args.unroll_length)
    if args.peers:
        learner.check_group(virtual_batch_size=args.virtual_batch_size)
    return env, model, learner


def resolve(args: Any, plan: Plan | None = None) -> Job:
    """What the nodes need from ``args``; ``plan`` defaults to ``make_plan(args)`` for this machine."""
    plan = make_plan(args) if plan is None else plan
    env, model, learner = configs(args, plan)
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
        model=model,
        learner=learner,
        plan=plan,
        out=args.out,
        seed=args.seed,
        actor_seed=member_stream(args.seed, args.member_seed) if args.peers else args.seed,
        device=args.device,
        cuda_graph=args.cuda_graph == "on",
        unroll_length=args.unroll_length,
        queue_slots=args.queue_slots or queue_slots(args.algo, args.batch_size, plan),
        total_frames=args.total_frames,
        log_interval=args.log_interval,
        checkpoint_minutes=args.checkpoint_minutes,
        resume=args.resume,
        tensorboard=args.tensorboard,
        group=group,
        lockstep=args.lockstep,
    )


def member_stream(seed: int, member_seed: int) -> int:
    """The actors' seed of a group's member: ``seed`` and ``member_seed`` mixed by numpy's
    ``SeedSequence`` (a 32-bit value), so that members with different ``member_seed``s play
    different games and one ``member_seed`` repeats a member's seeds."""
    return int(np.random.SeedSequence([seed, member_seed]).generate_state(1)[0])
