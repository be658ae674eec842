"""bench.impala's command line: how ``--help`` groups the options, their choices and
examples, the defaults per env family, and the lines the job prints before and after a
run (what it runs, what to try next). The job itself, CleanRL style, is
``bench/impala.py``; this module takes its settings as they are (any object with the
``Args`` fields) and imports nothing of it.
"""

from __future__ import annotations

import os
from typing import Any

from actors import EnvConfig
from bench import rundir
from bench.impala_plan import pinned_cpus, usable_cores

__all__ = ["CHOICES", "EXAMPLES", "FAMILY_DEFAULTS", "HELP_GROUPS", "advice", "env_family", "publishing", "summary"]

HELP_GROUPS = {
    "environment": ["env", "full_action_space", "seed"],
    "model": ["model", "use_lstm", "last_action_reward"],
    "learning": [
        "total_frames",
        "unroll_length",
        "batch_size",
        "optimizer",
        "learning_rate",
        "lr_decay_frames",
        "entropy_cost",
        "baseline_cost",
        "discount",
        "reward_clip",
        "grad_norm_clip",
        "reduction",
    ],
    "speed (0 and auto: chosen from the cores and the device, printed as the plan)": [
        "device",
        "learner_threads",
        "compile",
        "bf16",
        "pin",
        "publish_every",
        "publish_seconds",
    ],
    "actors": ["num_actors", "num_workers", "envs_per_worker", "queue_slots"],
    "several hosts (python -m shmpad.net.broker on one of them)": [
        "peers",
        "group",
        "peer_host",
        "token_file",
        "min_peers",
        "virtual_batch_size",
        "backend",
    ],
    "output": ["out", "resume", "log_interval", "checkpoint_minutes", "tensorboard", "launch_type"],
}
CHOICES = {
    "model": ("shallow", "deep", "mlp"),
    "optimizer": ("adam", "rmsprop"),
    "reduction": ("mean", "sum"),
    "device": ("cpu", "cuda"),
    "compile": ("auto", "on", "off"),
    "backend": ("shmpad", "gloo", "nccl", "auto"),
    "bf16": ("auto", "on", "off"),
    "pin": ("auto", "on", "off"),
    "launch_type": ("local_mp", "local_mt", "test_mp", "test_mt"),
}
EXAMPLES = """examples:
  python -m bench.impala                                   a 200K-frame Pong smoke test (2-3 minutes on 2 cores)
  python -m bench.impala --env CartPole-v1                 CartPole with its own defaults (750K frames, mlp)
  python -m bench.impala --env ALE/Breakout-v5 --model deep --full-action-space --total-frames 50_000_000
  python -m bench.impala --model deep --last-action-reward --full-action-space --lr-decay-frames 200_000_000 --total-frames 50_000_000
                                                           moolib's Atari configuration
  python -m bench.impala --resume --out runs/ale-pong-v5-20250101-120000 --total-frames 1_000_000
"""

FAMILY_DEFAULTS = {
    # tests/test_bench_impala.py's CartPole run: 7 runs scored 480-500 with these (the actors use 16 envs per worker)
    "classic_control": dict(
        model="mlp",
        total_frames=750_000,
        learning_rate=0.003,
        discount=0.98,
        entropy_cost=0.01,
        batch_size=16,
        # The MLP's update takes about 2 ms: publishing after every one cost the learner fed from the
        # ring 5% of its rate (0.835x -> 0.875x its bare loop: 8 interleaved rounds of
        # bench.impala_throughput's two learner subjects, bench.impala_learner_cost, run from a script
        # not kept). Every 10 ms, 5 runs of tests/test_bench_impala.py's CartPole job each way scored
        # 491-500 against 482-500, with a policy lag of 1.8 updates against 0.9-1.4.
        publish_seconds=0.01,
    ),
}
"""Defaults per env family where Args' own (IMPALA's Atari settings) do not fit; options
given on the command line win."""


def env_family(env_id: str) -> str:
    """'atari', 'classic_control' (gymnasium's CartPole, Acrobot, MountainCar...) or 'other'."""
    import gymnasium

    config = EnvConfig(env_id)  # registers the Atari ids; an unknown id raises ValueError here
    if config.is_atari:
        return "atari"
    return "classic_control" if "classic_control" in str(gymnasium.spec(env_id).entry_point) else "other"


def summary(args: Any) -> str:
    core = ("+lstm" if args.use_lstm else "") + ("+last action and reward" if args.last_action_reward else "")
    return (
        f"IMPALA on {args.env}: model {args.model}{core}, {args.total_frames:,} frames, "
        f"out {args.out} (every setting: {os.path.join(args.out, rundir.CONFIG)})\n"
        f"plan for {usable_cores()} core(s), {args.device}: {args.num_actors} actor(s) x {args.num_workers} env "
        f"workers x {args.envs_per_worker} envs, learner {args.learner_threads} thread(s), "
        f"{'compiled' if args.compile == 'on' else 'eager'}, {'bf16' if args.bf16 == 'on' else 'fp32'}, "
        + publishing(args)
        + _pinning(args)
    )


def publishing(args: Any) -> str:
    """How often the job publishes its weights, in words (for the lines it prints)."""
    if args.publish_seconds > 0:
        return f"weights published every {args.publish_seconds:g} s"
    return f"weights published every {args.publish_every} update(s)"


def _pinning(args: Any) -> str:
    cpus = pinned_cpus(args)
    if cpus is None:
        return ""
    return f", learner on cpu {_cpu_list(cpus[0])}, actors on cpu {_cpu_list(cpus[1])}"


def _cpu_list(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if len(cpus) <= 4 else f"{cpus[0]}..{cpus[-1]} ({len(cpus)} cpus)"


def advice(args: Any) -> str | None:
    """What to try after a run that ended at its target, for the env family trained."""
    family = env_family(args.env)
    if family == "atari" and args.total_frames < 10_000_000:
        return (
            f"That was a smoke test ({args.total_frames:,} frames), not training: Atari games need 10M-50M frames. "
            "For a full run: --total-frames 50_000_000 --model deep --last-action-reward --full-action-space, "
            "--num-actors/--num-workers "
            "to fill the machine's cores, and --device cuda if there is a GPU."
        )
    target = FAMILY_DEFAULTS.get(family, {}).get("total_frames")
    if target is not None and args.total_frames < target:
        return f"A short run: {args.env} usually needs about {target:,} frames with these settings (the default)."
    return None
