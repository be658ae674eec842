"""How bench.impala fills the machine: from the cores this process may run on (its
affinity, not the machine's count) and the device, how many actors, env workers,
environments per worker and learner threads to run, whether the learner runs compiled and
in bf16, and whether it is pinned. The plan sizes the machine only; the algorithm's settings
are ``bench/impala/defaults.py``'s. Every option the user gave wins; the job prints the plan
as one line before it starts.

The rules, and the measurements behind them (this repository's 2-core CPU machine,
torch 2.13; ``bench.impala.learner_cost``, run by ``python -m bench.impala.throughput``,
measures the learner's side). A figure is stated only where its output is kept under
``docs/results/``; for the other rules the command that would measure them is named
(docs/benchmarks.md lists what has no kept figure yet):

- CPU: the learner is the bottleneck by far (a Nature-CNN update of T=20, B=32 took
  480-590 ms in the IMPALA Pong job, docs/results/cpu-pinning; the env workers step far more
  frames than it consumes, which ``python -m bench.envpool`` measures), yet it gets only
  half the cores as torch threads (an MLP's tiny update one): the actors keep running
  beside it, and a torch thread that loses its core stalls the others at every barrier.
  ``python -m bench.impala.compare --common "--compile on" --arm "--learner-threads 1"
  --arm "--learner-threads 2" --rounds 3`` measures the 1-thread learner against a
  2-thread one on 2 cores; no kept figure yet. The actors get one actor with one worker
  per core, which sleep whenever the trajectory ring is full. ``torch.compile`` pays for
  convolutional models, once its compiling is behind it (``python -m
  bench.impala.compare --arm "--compile on" --arm "--compile off" --rounds 3`` measures
  it; no kept figure yet); not for the MLP, whose update is overhead, nor for the LSTM
  core's step loop.
- CPU, an MLP (CartPole): the actors are the bottleneck, not their env workers but each
  actor's own loop (its Python and its small network), so there is one actor per core
  up to 2 (more would only lengthen the policy lag once the learner is busy most of the
  time), each with 2 workers of 32 environments (bigger batches spread the loop's cost),
  and nothing is pinned (the learner is idle most of the time, and its core should not
  be kept from the actors). ``python -m bench.impala.compare --common "--env
  CartPole-v1" --arm "" --arm "--num-actors 1 --num-workers 2 --envs-per-worker 16 --pin
  on" --rounds 3`` measures this plan against the Nature CNN's flags (frames/s, the env
  workers' busy share, the learner's waiting, the policy lag and each run's return); no
  kept figure yet. Larger batches (``--envs-per-worker 64``) raise the policy lag, and a
  lag that grows too far can make a CartPole run collapse: check the returns, not only
  the frames/s, before changing the plan.
- CPU, bf16: where the CPU computes bf16 natively (AVX512-BF16 or AMX), the learner of
  a convolutional model runs under bf16 autocast: on this machine's AMD EPYC (Zen 4,
  avx512_bf16) a compiled 1-thread Nature-CNN update ran 1.81-2.08x as many updates/s as
  in fp32, and the IMPALA Pong job 1.23x the frames/s (docs/results/cpu-bf16). Elsewhere
  bf16 is emulated and slower, so it stays off.
- CPU, APPO (Atari's default): its learner takes each batch 4 epochs x 4 minibatches, so
  it is the bound by far and the actors, with their ring full, sleep most of each update
  (on 2 cores: the env workers busy 21% and the learner never waiting, in the runs below).
  So the learner gets every core as a torch thread and nothing is pinned: the OS gives
  the actors' core back to the learner while they sleep. On the 2-core machine (AMD
  EPYC, AVX512-BF16) the default Pong job ran 1.34x the frames/s of the pinned 1-thread
  learner, the median of 2 interleaved rounds (2,974 and 3,248 against 2,329 and 2,327:
  ``python -m bench.impala.compare --common "--total-frames 1_000_000_000" --arm ""
  --arm "--learner-threads 2 --pin off" --rounds 2 --seconds 150``, run before this rule,
  whose first arm was then the default; docs/results/cpu-two-cores). Measured on 2 cores
  only; on more, ``--arm "--learner-threads N --pin on"`` against the default measures it.
- CPU, pinning (``--pin on``): the learner runs on its own cores (the first
  ``learner_threads``) and the actors with their env workers on the others, so that
  neither preempts the other (``PythonProcess(cpus=...)``): the IMPALA Pong job ran
  1.22x faster pinned with the learner in fp32 (median of 4 interleaved rounds; its
  learner took 480-490 ms per update instead of 550-590), and 1.03x with it in bf16
  (3 rounds; the actor's core is then as much the limit as the learner):
  docs/results/cpu-pinning.
- CUDA: the GPU does the learner's arithmetic, so the cores go to the environments:
  one actor (its batched GPU inference) per 8 cores, the rest as env workers, 16
  environments each, the learner's host side on one thread. bf16 autocast. On one H100
  with 16 cores (docs/results/h100-topology, ``bench.impala.compare``, two calls) the
  plan's 2 actors x 6 workers ran the IMPALA Pong job at 63.4K and 65.1K frames/s. One
  actor serving all 12 workers ran it 0.90x and 0.92x as fast, its workers waiting on its
  one loop. With the IMPALA ResNet one actor tied (0.995x) and 4 actors x 3 workers ran
  0.91x.
- CUDA, APPO (Atari's default, rl_games' recipe): the algorithm stays the table's, as on
  the CPU where it learned (64 unrolls of 128 steps per update, 4 epochs x 4 minibatches:
  2,048 frames per optimiser step). The plan's 192 environments on 16 cores are 3 batches:
  more environments do not add steps per frame, they only split a round of unrolls into
  3 updates. What the GPU must keep up with, counted by
  ``docs/results/pong-gpu-default/flops.py`` (the Nature CNN: 18.7 MFLOP a sample forward,
  49.5 forward and backward; 1.79 TFLOP an update): at 60K frames/s, 1.83 updates/s (546 ms
  each), 29 minibatch steps/s (34 ms each), 3.3 TFLOP/s, 5% of an H200's plain fp32 rate
  (67 TFLOP/s by NVIDIA's datasheet) and under 0.5% of its bf16 tensor rate. So the
  learner runs eager: compiling would buy back launch overhead the learner has room for
  with start-up, which a 90 s run cannot spare (how long it takes on a GPU is not
  measured). It runs in bf16 autocast, the precision the CPU runs that learned ran in
  (their 1-core plan: bf16 on AVX512-BF16), with the heads, the loss and the weights in
  fp32. Every actor's environments finish their unrolls at the same step,
  so a round of 192 unrolls reaches the ring at once; a ring of one batch would stall the
  actors until the learner had taken the round's first two batches (about an update and
  two staging copies, every 1.6 s at 60K frames/s). ``queue_slots`` gives the ring one
  slot per environment on a GPU (3 batches) instead: the round waits in the ring, and
  while the learner keeps up (3 updates within a round's 1.6 s) the round's batches are
  learned 0, 1 and 2 updates after the weights that acted most of their steps (an
  unroll's first steps, acted while the learner took the previous round, up to 3 more):
  a mean lag expected between 1 and 2 updates, against the CPU runs' 2. Not yet run on a
  GPU: docs/results/pong-gpu-default holds the prepared run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from actors import EnvConfig
from bench.common.evidence import cpu_flags

__all__ = [
    "Plan",
    "QUEUE_BATCHES",
    "cpu_has_bf16",
    "env_family",
    "make_plan",
    "pinned_cpus",
    "queue_slots",
    "usable_cores",
]

AUTO = "auto"
PIN_BY_DEFAULT = True
"""whether ``--pin auto`` pins a convolutional model's IMPALA job on a CPU (not APPO's: the docstring's APPO rule): yes, 1.22x frames/s on 2 cores with an fp32 learner, 1.03x with bf16 (docs/results/cpu-pinning)"""
ENVS_PER_WORKER = 16
MLP_MAX_ACTORS = 2
"""an MLP's actors on a CPU, one per core up to this: once the learner rarely waits for data, more
actors add policy lag (unrolls waiting for the ring), not frames. ``python -m bench.impala.compare
--common "--env CartPole-v1" --arm "" --arm "--num-actors 3" --rounds 3`` measures it (the learner's
waiting and the lag); no kept figure yet, see docs/benchmarks.md"""
MLP_ENVS_PER_WORKER = 32
"""an MLP's actors on a CPU: bigger batches spread each actor's loop over more environments.
``python -m bench.impala.compare --common "--env CartPole-v1" --arm "" --arm "--envs-per-worker 16"
--rounds 3`` measures it against 16; no kept figure yet, see docs/benchmarks.md"""


QUEUE_BATCHES = {"impala": 4, "appo": 1}
"""Batches the trajectory ring holds per algorithm, unless --queue-slots says otherwise.
IMPALA's 4 let the actors run ahead of a learner that steps once per batch. APPO's learner
frees a batch's slots before its update, so the actors fill the next batch during it; a longer
ring would only feed a learner-bound APPO's 16 steps per batch staler unrolls. The Pong runs of
docs/results/pong-rl-games-cpu had one batch: a policy lag of 2 updates in their log.csv.
On a GPU, where the learner is not the bound, APPO's ring holds a round of unrolls instead
(``queue_slots``)."""


def env_family(env_id: str) -> str:
    """'atari', 'classic_control' (gymnasium's CartPole, Acrobot, MountainCar...) or 'other'."""
    import gymnasium

    config = EnvConfig(env_id)  # registers the Atari ids; an unknown id raises ValueError here
    if config.is_atari:
        return "atari"
    return "classic_control" if "classic_control" in str(gymnasium.spec(env_id).entry_point) else "other"


def usable_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; a container's cpuset counts)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 natively (AMX or AVX512-BF16, from the flags of
    ``/proc/cpuinfo``, or of the text given); elsewhere bf16 is emulated and slower than fp32."""
    flags = cpu_flags(cpuinfo)
    return "amx_bf16" in flags or "avx512_bf16" in flags


@dataclass(frozen=True)
class Plan:
    cores: int
    device: str
    num_actors: int
    num_workers: int
    envs_per_worker: int
    learner_threads: int
    compile: bool
    bf16: bool
    pin: bool


def make_plan(args: Any, cores: int | None = None, cpu_bf16: bool | None = None) -> Plan:
    """The plan for ``args`` (bench.impala's ``Args``): its non-zero counts and its
    ``on``/``off`` switches are kept, ``0`` and ``auto`` are chosen here. ``cores`` and
    ``cpu_bf16`` default to this machine's."""
    cores = usable_cores() if cores is None else cores
    cpu_bf16 = cpu_has_bf16() if cpu_bf16 is None else cpu_bf16
    cuda = args.device.startswith("cuda")
    conv = args.model in ("shallow", "deep")
    if cuda:
        actors = max(1, cores // 8)
        workers = max(1, (cores - 1 - actors) // actors)
        threads = 1
    elif conv:
        actors = max(1, cores // 8)
        workers = max(1, cores // (2 * actors)) if cores > 2 else max(1, cores)
        threads = max(1, cores // 2)
    else:
        actors, workers, threads = min(cores, MLP_MAX_ACTORS), 2, 1
    actors = args.num_actors or actors
    workers = args.num_workers or workers
    envs = args.envs_per_worker or (ENVS_PER_WORKER if conv or cuda else MLP_ENVS_PER_WORKER)
    appo = getattr(args, "algo", "impala") == "appo"
    appo_cpu = appo and conv and not cuda
    if appo_cpu and cores >= 2:
        threads = cores  # its actors sleep most of each update (the docstring's APPO rule)
    if appo and not args.envs_per_worker:
        # at least one batch of environments, as PPO steps: no unroll of a batch continues another's game
        envs = max(envs, -(-args.batch_size // (actors * workers)))
    threads = args.learner_threads or threads
    compile_ = _switch(args.compile, "compile", conv and not args.use_lstm and not cuda)
    bf16 = _switch(args.bf16, "bf16", conv and (cuda or cpu_bf16))
    pin = _switch(
        getattr(args, "pin", "off"), "pin", PIN_BY_DEFAULT and conv and not cuda and not appo_cpu and cores >= 2
    )
    if pin and not args.learner_threads and cores >= 2:
        threads = min(threads, cores - 1)  # pinned, the learner has the cores the actors leave (pinned_cpus)
    return Plan(cores, "cuda" if cuda else "cpu", actors, workers, envs, threads, compile_, bf16, pin)


def queue_slots(algo: str, batch_size: int, plan: Plan) -> int:
    """The trajectory ring's slots when --queue-slots is not given: ``QUEUE_BATCHES`` batches;
    for APPO on a GPU, at least one slot per environment of the plan, in whole batches, so that
    a round of unrolls (every environment finishes one at the same step) never blocks the
    actors while the learner, which keeps up there, takes the round batch by batch."""
    slots = QUEUE_BATCHES[algo] * batch_size
    if algo == "appo" and plan.device == "cuda":
        envs = plan.num_actors * plan.num_workers * plan.envs_per_worker
        slots = max(slots, batch_size * -(-envs // batch_size))
    return slots


def pinned_cpus(plan: Plan) -> tuple[list[int], list[int]] | None:
    """(the learner's CPUs, the actors') where ``plan`` pins: the first ``learner_threads``
    of this process's CPUs, at least one and leaving one; None when it does not or on one core."""
    cpus = sorted(os.sched_getaffinity(0))
    if not plan.pin or len(cpus) < 2:
        return None
    n = min(max(1, plan.learner_threads), len(cpus) - 1)
    return cpus[:n], cpus[n:]


def _switch(value: str, name: str, default: bool) -> bool:
    if value == AUTO:
        return default
    if value in ("on", "off"):
        return value == "on"
    raise ValueError(f"--{name} must be auto, on or off, got {value!r}")
