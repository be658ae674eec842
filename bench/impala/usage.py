"""bench.impala's command line as the user meets it: how ``--help`` groups the options,
their choices and examples, and the lines the job prints before and after a run (what it
runs, what to try next). The job itself, CleanRL style, is ``bench/impala/train.py``; this
module takes its settings as they are (any object with the ``Args`` fields, and the
``Plan``) and imports nothing of it. The defaults per env family and algorithm are
``bench/impala/defaults.py``'s.
"""

from __future__ import annotations

import os
from typing import Any

from actors.envs.protocol import PROTOCOLS, protocol_of
from bench.impala import rundir
from bench.impala.defaults import CLASSIC_CONTROL
from bench.impala.plan import Plan, env_family, pinned_cpus, usable_cores

__all__ = ["CHOICES", "EXAMPLES", "HELP_GROUPS", "advice", "publishing", "summary"]

HELP_GROUPS = {
    "environment": ["env", "seed"],
    "Atari protocol (actors/envs/protocol.py)": [
        "protocol",
        "sticky_actions",
        "full_action_space",
        "noop_max",
        "episodic_life",
        "reward_clip",
    ],
    "model": ["model", "init", "use_lstm", "last_action_reward", "normalize_input", "normalize_value"],
    "learning": [
        "total_frames",
        "unroll_length",
        "batch_size",
        "optimizer",
        "adam_eps",
        "learning_rate",
        "lr_decay_frames",
        "entropy_cost",
        "baseline_cost",
        "discount",
        "grad_norm_clip",
        "reduction",
        "algo",
        "epochs",
        "minibatches",
        "shuffle",
        "clip",
        "value_clip",
        "kl_target",
        "vtrace_lambda",
    ],
    "speed (0 and auto: chosen from the cores and the device, printed as the plan)": [
        "device",
        "learner_threads",
        "compile",
        "bf16",
        "cuda_graph",
        "pin",
        "publish_every",
        "publish_seconds",
    ],
    "actors": ["num_actors", "num_workers", "envs_per_worker", "queue_slots", "lockstep"],
    "several hosts (python -m shmpad.net.broker on one of them)": [
        "peers",
        "group",
        "peer_host",
        "token_file",
        "min_peers",
        "virtual_batch_size",
        "backend",
        "member_seed",
    ],
    "output": ["out", "resume", "log_interval", "checkpoint_minutes", "tensorboard", "launch_type"],
}
CHOICES = {
    "protocol": tuple(PROTOCOLS),
    "model": ("shallow", "deep", "mlp"),
    "init": ("torch", "orthogonal"),
    "optimizer": ("adam", "rmsprop"),
    "algo": ("impala", "appo"),
    "shuffle": ("unrolls", "steps"),
    "reduction": ("mean", "sum"),
    "device": ("cpu", "cuda"),
    "compile": ("auto", "on", "off"),
    "backend": ("shmpad", "gloo", "nccl", "auto"),
    "bf16": ("auto", "on", "off"),
    "pin": ("auto", "on", "off"),
    "cuda_graph": ("on", "off"),
    "launch_type": ("local_mp", "local_mt", "test_mp", "test_mt"),
}
EXAMPLES = """examples:
  python -m bench.impala                                   a 200K-frame Pong smoke test
  python -m bench.impala --env CartPole-v1                 CartPole with its own defaults (750K frames, mlp)
  python -m bench.impala --env ALE/Breakout-v5 --model deep --full-action-space --total-frames 50_000_000
  python -m bench.impala --algo impala --model deep --last-action-reward --full-action-space --lr-decay-frames 200_000_000 --total-frames 50_000_000
                                                           moolib's Atari configuration
  python -m bench.impala --resume --out runs/ale-pong-v5-20250101-120000 --total-frames 1_000_000
"""


EXAMPLES += """
The defaults shown are those of the job that --env, --algo and --protocol name: python -m
bench.impala --env CartPole-v1 --help shows CartPole's. The table
and its rule: bench/impala/defaults.py.
"""


def summary(args: Any, plan: Plan) -> str:
    core = ("+lstm" if args.use_lstm else "") + ("+last action and reward" if args.last_action_reward else "")
    algo = (
        "IMPALA"
        if args.algo == "impala"
        else f"APPO ({args.epochs} epochs x {args.minibatches} minibatches of {args.shuffle})"
    )
    protocol = f"\n{protocol_of(args).describe()}" if env_family(args.env) == "atari" else ""
    return (
        f"{algo} on {args.env}: model {args.model}{core}, {args.total_frames:,} frames, "
        f"out {args.out} (every setting: {os.path.join(args.out, rundir.CONFIG)}){protocol}\n"
        f"plan for {usable_cores()} core(s), {args.device}: {plan.num_actors} actor(s) x {plan.num_workers} env "
        f"workers x {plan.envs_per_worker} envs, learner {plan.learner_threads} thread(s), "
        f"{'compiled' if plan.compile else 'eager'}, {'bf16' if plan.bf16 else 'fp32'}, "
        + publishing(args)
        + _pinning(plan)
    )


def publishing(args: Any) -> str:
    """How often the job publishes its weights, in words (for the lines it prints)."""
    if args.publish_seconds > 0:
        return f"weights published every {args.publish_seconds:g} s"
    if getattr(args, "lockstep", False):
        return "in lock step: the actor waits for every update"
    return f"weights published every {args.publish_every} update(s)"


def _pinning(plan: Plan) -> str:
    cpus = pinned_cpus(plan)
    if cpus is None:
        return ""
    return f", learner on cpu {_cpu_list(cpus[0])}, actors on cpu {_cpu_list(cpus[1])}"


def _cpu_list(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if len(cpus) <= 4 else f"{cpus[0]}..{cpus[-1]} ({len(cpus)} cpus)"


def advice(args: Any) -> str | None:
    """What to try after a run that ended at its target, for the env family trained."""
    family = env_family(args.env)
    if family == "atari" and args.total_frames < 10_000_000:
        smoke = f"That was a smoke test ({args.total_frames:,} frames), not training: "
        if args.algo == "appo":
            return smoke + (
                "with these settings Pong reached +18 at a median of 3.4M frames (docs/results/pong-rl-games-cpu). "
                "For a run: --total-frames 10_000_000 (python -m bench.learn runs it to +18 and +20 over seeds), "
                "and --device cuda if there is a GPU."
            )
        return smoke + (
            "Atari games need 10M-50M frames. For a full run: --total-frames 50_000_000 --model deep "
            "--last-action-reward --full-action-space, --num-actors/--num-workers to fill the machine's cores, "
            "and --device cuda if there is a GPU."
        )
    target = CLASSIC_CONTROL["total_frames"] if family == "classic_control" else None
    if target is not None and args.total_frames < target:
        return f"A short run: {args.env} usually needs about {target:,} frames with these settings (the default)."
    return None
