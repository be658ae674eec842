"""The learner's framework cost, for ``bench.impala.throughput``.

``bare``: ``Learner.update`` on one ready batch, over and over: the same model, loss,
backward, clipping and optimiser step, compiled and in bf16 as the job's plan says, but
no ring, no staging and no publishing (the batch is built once as time-major
``[T+1, B, ...]`` tensors on the learner's device). ``ring``: ``Learner.step()`` fed from a
``TypedRing`` that a forked producer keeps full with copies of one prepared unroll,
publishing to a ``WeightStore`` as the job's flags say (every update, or every
``--publish-seconds``; CartPole's defaults publish every 10 ms), as in the real program. Each
runs ``LEARNER_SECONDS`` s in a process tree of its own (``bench.common.harness.in_own_tree``).

``python -m bench.impala.learner_cost``: where one update's time goes, against the cores' peak.

    python -m bench.impala.learner_cost                       # the default job's update (Pong, APPO)
    python -m bench.impala.learner_cost --arm "" --arm "--bf16 off" --arm "--isa avx2 --bf16 off"
    python -m bench.impala.learner_cost --common "--batch-size 16 --epochs 1" --updates 3 --rounds 5

Each arm (bench.impala's flags after ``--common``; ``--isa avx2`` runs it on AVX2's kernels
only, ``ISAS``; ``--thp on`` with torch's large tensors on transparent huge pages) is measured in a process of its own, in ``--rounds`` interleaved rounds: the
cores' peak (``peak_gflops``: a 2048 x 2048 matrix product in fp32 and in bf16 on the
plan's learner threads), the floating-point operations of an update (``FlopCounterMode``:
the matrix products and convolutions, forward and backward), then ``--updates`` updates
of one ready batch after one to warm up (compiling), each phase timed (``Phases``). The
table gives each arm's medians: seconds per update, frames/s that makes, GFLOP/s and its
share of the fp32 and bf16 peaks, and each phase's seconds and GFLOP/s; ratios are medians of
per-round ratios to the first arm. The ring, staging and publishing are not in it
(``bench.impala.throughput``'s ``ring`` against ``bare`` measures them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import shmpad as lp
from actors.trajectory import trajectory_spec
from bench.common.evidence import REPORT_PREFIX, add_save_option, cpu_flags, cpu_model, saving
from bench.impala import train
from learners.learner import Learner
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore

__all__ = ["LEARNER_SECONDS", "LEARNER_SUBJECTS", "Phases", "main", "measure", "peak_gflops"]

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


def _ready_batch(job: train.Job, spec) -> dict[str, torch.Tensor]:
    """A time-major batch ``[T+1, B, ...]`` of ``B`` copies of the prepared unroll, on the job's device."""
    unroll = _prepared_unroll(job, spec)
    return {
        k: torch.from_numpy(np.stack([v] * job.learner.batch_size, axis=1)).to(job.device) for k, v in unroll.items()
    }


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
        batch = _ready_batch(job, spec)
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


# -- python -m bench.impala.learner_cost: where an update's time goes ------------------------

PEAK_SIZE = 2048
"""the square matrices whose product measures the cores' peak"""
PEAK_SECONDS = 2.0
"""counted seconds of each peak measurement (after two warm-up products)"""
PHASES = ("targets", "forward", "backward", "optimizer", "other")
"""an update's phases (``Phases``); IMPALA's update has no targets"""
ISAS = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
"""``--isa``: the environment each measurement's process starts with. ``avx2`` keeps torch's
own kernels and oneDNN's (the convolutions) to AVX2 on a CPU that has more, so that an
AVX2-only machine's code paths can be measured on this one (not its clock or its caches)"""


def peak_gflops(dtype: torch.dtype, seconds: float = PEAK_SECONDS) -> float:
    """GFLOP/s of a ``PEAK_SIZE`` square matrix product in ``dtype`` on this process's torch
    threads: the most the cores reach through torch, the yardstick of an update's rate."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(PEAK_SIZE, PEAK_SIZE, generator=gen).to(dtype)
    b = torch.randn(PEAK_SIZE, PEAK_SIZE, generator=gen).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        n += 1
    return 2 * PEAK_SIZE**3 * n / (time.perf_counter() - start) / 1e9


class Phases:
    """Seconds (and, with a ``FlopCounterMode``, floating-point operations) of each phase of
    ``learner``'s updates, by wrapping its methods: ``targets`` (APPO's targets: the forward pass
    without gradients over the batch, V-trace, the value statistics), ``forward`` (the model and the loss of a minibatch, or of
    IMPALA's batch), ``backward`` (zeroing and computing the gradients), ``optimizer``
    (clipping and the optimiser's step), ``other`` (the rest of ``Learner.update``: choosing
    minibatches, the statistics, the schedule, publishing)."""

    def __init__(self, learner: Learner, counter: Any = None):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.flops = dict.fromkeys(PHASES, 0)
        self.updates = 0
        self._counter = counter
        self._inner = 0.0  # seconds of the phases inside compute_loss (forward) while it runs
        if learner.appo is not None:
            learner.appo.targets = self._timed("targets", learner.appo.targets)
        eager = learner._loss_fn is learner._eager_loss  # (compute_loss tells the two apart by identity)
        learner._loss_fn = self._timed("forward", learner._loss_fn)
        # a failed compile falls back to the eager loss
        learner._eager_loss = learner._loss_fn if eager else self._timed("forward", learner._eager_loss)
        compute_loss = learner.compute_loss
        # (after a failed compile, compute_loss calls itself again: the inner call's backward is its own)
        learner.compute_loss = self._timed("backward", compute_loss, minus=("forward", "backward"))
        learner.optimizer_step = self._timed("optimizer", learner.optimizer_step)
        learner.update = self._timed("other", learner.update, minus=("targets", "forward", "backward", "optimizer"))

    def _total_flops(self) -> int:
        return 0 if self._counter is None else int(self._counter.get_total_flops())

    def _timed(self, phase: str, fn: Callable, minus: tuple[str, ...] = ()) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            before_s = {p: self.seconds[p] for p in minus}
            before_f = {p: self.flops[p] for p in minus}
            flops, start = self._total_flops(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                inner_s = sum(self.seconds[p] - before_s[p] for p in minus)
                inner_f = sum(self.flops[p] - before_f[p] for p in minus)
                self.seconds[phase] += time.perf_counter() - start - inner_s
                self.flops[phase] += self._total_flops() - flops - inner_f
                if phase == "other":
                    self.updates += 1

        return timed


def _update_flops(job: train.Job, spec, batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """Floating-point operations of each phase of one update, counted by torch's
    ``FlopCounterMode`` (matrix products and convolutions, forward and backward) on an eager
    learner in fp32 (the same operations as in bf16 or compiled)."""
    from torch.utils.flop_counter import FlopCounterMode

    ring = TypedRing.create(trajectory_spec(spec, job.unroll_length), job.learner.batch_size)  # for its spec only
    try:
        config = dataclasses.replace(job.learner, frames_per_step=1, compile=False, bf16=False)
        learner = Learner(train.build_model(job, spec.obs_shape, spec.num_actions), ring, config, None, job.device)
        with FlopCounterMode(display=False) as counter:
            phases = Phases(learner, counter)
            learner.update(batch)
        return phases.flops
    finally:
        ring.close()


def measure(job: train.Job, updates: int, count: bool = True) -> dict:
    """One measurement of ``job``'s learner (``Learner.update`` on one ready batch, as ``bare``
    runs it): the cores' peak in fp32 (and in bf16 where the arm runs in it), the operations of an update (with ``count``;
    they do not change between measurements of one arm), then ``updates`` updates after one
    to warm up, each phase's seconds."""
    torch.set_num_threads(job.plan.learner_threads)
    spec = job.env.spec()
    batch = _ready_batch(job, spec)
    # bf16's peak only where the arm runs in bf16 (where the CPU has no bf16 it is emulated:
    # one product took about 45 s under --isa avx2)
    peak = {"fp32": peak_gflops(torch.float32), "bf16": peak_gflops(torch.bfloat16) if job.learner.bf16 else None}
    flops = _update_flops(job, spec, batch) if count else None
    ring = TypedRing.create(trajectory_spec(spec, job.unroll_length), job.learner.batch_size)
    try:
        model = train.build_model(job, spec.obs_shape, spec.num_actions)
        learner = Learner(model, ring, dataclasses.replace(job.learner, frames_per_step=1), None, job.device)
        learner.update(batch)  # warm-up: compiling, allocating
        phases = Phases(learner)
        start = time.perf_counter()
        for _ in range(updates):
            learner.update(batch)
        elapsed = time.perf_counter() - start
    finally:
        ring.close()
    steps = job.learner.batch_size * job.unroll_length
    return {
        "peak_gflops": peak,
        "flops": flops,
        "seconds": {p: s / updates for p, s in phases.seconds.items()},
        "update_s": elapsed / updates,
        "steps_per_update": steps,
        "frames_per_update": steps * job.learner.frames_per_step,
        "compiled": bool(learner.compiled),
        "bf16": bool(job.learner.bf16),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


ROUNDS = 3
UPDATES = 2
MEASURE_TIMEOUT_S = 1800.0
"""how long one measurement (its process) may take: a Pong APPO update took 20-80 s on one core"""
TARGET_OF_PEAK = 0.6
"""issue 46's target: the APPO update at this share of the cores' fp32 peak"""


OWN_FLAGS = {"--isa": ISAS, "--thp": {"off": {}, "on": {"THP_MEM_ALLOC_ENABLE": "1"}}}
"""an arm's flags that set its process's environment (read when torch loads): ``--isa`` (``ISAS``)
and ``--thp on`` (torch's CPU allocator asks for transparent huge pages for large tensors)"""


def _split_own(flags: str) -> tuple[dict[str, str], list[str]]:
    """An arm's environment from its ``OWN_FLAGS`` (the first value of each: native, off) and its job flags."""
    words = shlex.split(flags)
    env: dict[str, str] = {}
    for flag, values in OWN_FLAGS.items():
        if flag in words:
            i = words.index(flag)
            if i + 1 >= len(words) or words[i + 1] not in values:
                got = words[i + 1 : i + 2] or "nothing"
                raise SystemExit(f"{flag} takes one of {sorted(values)}, got {got} in {flags!r}")
            env.update(values[words[i + 1]])
            del words[i : i + 2]
    return env, words


def _measure_in_process(own_env: dict[str, str], flags: list[str], updates: int, count: bool) -> dict:
    """``measure`` in a process of its own, started with ``own_env`` (``_split_own``) in its
    environment (read when torch loads, so it cannot be set in this one)."""
    env = dict(os.environ, **own_env)
    if "ATEN_CPU_CAPABILITY" in own_env and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # inductor's cache does not key its kernels by the ISA: one compiled for AVX-512 failed
        # ("tuple args required") when loaded under ATEN_CPU_CAPABILITY=avx2
        isa = own_env["ATEN_CPU_CAPABILITY"]
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor-{os.getuid()}-{isa}")
    own = ["--measure", "--updates", str(updates), *([] if count else ["--no-count"])]
    cmd = [sys.executable, "-m", "bench.impala.learner_cost", *own, "--", *flags]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=MEASURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {MEASURE_TIMEOUT_S:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(REPORT_PREFIX):
            return json.loads(line[len(REPORT_PREFIX) :])
    return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-600:]}"}


def _summary(results: list[dict]) -> dict:
    """One arm's medians over its rounds: seconds per update and per phase, GFLOP/s, shares of the peaks."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return {"error": results[-1]["error"]}
    med = statistics.median
    flops = next(r["flops"] for r in ok if r["flops"])  # counted in an arm's first round
    total = sum(flops.values())
    update_s = med(r["update_s"] for r in ok)
    gflops = med(total / r["update_s"] / 1e9 for r in ok)
    return {
        "rounds": len(ok),
        "update_s": update_s,
        "frames_per_s": med(r["frames_per_update"] / r["update_s"] for r in ok),
        "gflop_per_update": total / 1e9,
        "gflops": gflops,
        "peak_fp32": med(r["peak_gflops"]["fp32"] for r in ok),
        "peak_bf16": med(r["peak_gflops"]["bf16"] for r in ok) if ok[0]["bf16"] else None,
        "of_fp32_peak": med(total / r["update_s"] / 1e9 / r["peak_gflops"]["fp32"] for r in ok),
        "of_bf16_peak": med(total / r["update_s"] / 1e9 / r["peak_gflops"]["bf16"] for r in ok)
        if ok[0]["bf16"]
        else None,
        "phase_s": {p: med(r["seconds"][p] for r in ok) for p in PHASES},
        "phase_gflops": {p: med(flops[p] / r["seconds"][p] / 1e9 for r in ok) if flops[p] else None for p in PHASES},
        "compiled": ok[0]["compiled"],
        "threads": ok[0]["threads"],
        "cpu_capability": ok[0]["cpu_capability"],
        "errors": [r["error"] for r in results if "error" in r],
    }


def _print(report: dict) -> None:
    print(f"\nlearner cost: {report['machine']}; {report['rounds']} interleaved round(s), medians")
    head = f"{'arm':<34} {'update s':>9} {'frames/s':>9} {'GFLOP/s':>8} {'fp32 pk':>8} {'of fp32':>8} {'of bf16':>8}"
    print(head)
    for name, arm in report["arms"].items():
        if "error" in arm:
            print(f"{name:<34} failed: {arm['error']}")
            continue
        print(
            f"{name:<34} {arm['update_s']:>9.2f} {arm['frames_per_s']:>9.0f} {arm['gflops']:>8.1f}"
            f" {arm['peak_fp32']:>8.1f} {arm['of_fp32_peak']:>8.2f}"
            + (f" {arm['of_bf16_peak']:>8.2f}" if arm["of_bf16_peak"] is not None else f" {'-':>8}")
        )
    print("\nper phase: seconds per update (GFLOP/s where it computes)")
    print(f"{'arm':<34} " + " ".join(f"{p:>15}" for p in PHASES))
    for name, arm in report["arms"].items():
        if "error" in arm:
            continue
        cells = []
        for p in PHASES:
            g = arm["phase_gflops"][p]
            cells.append(f"{arm['phase_s'][p]:>7.2f}" + (f" ({g:>5.1f})" if g else " " * 8))
        print(f"{name:<34} " + " ".join(f"{c:>15}" for c in cells))
    first = next(iter(report["arms"].values()))
    for name, ratio in report["speedup"].items():
        print(f"update speed-up of {name!r} over the first arm: {ratio:.2f}x" if ratio else f"{name}: n/a")
    if "error" not in first:
        print(
            f"target: the first arm's update at >= {TARGET_OF_PEAK} of the fp32 peak: {first['of_fp32_peak']:.2f} "
            f"({'PASS' if first['of_fp32_peak'] >= TARGET_OF_PEAK else 'FAIL'})"
        )
    print(REPORT_PREFIX + json.dumps(report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.impala.learner_cost",
        description="Where the learner's update spends its time, against the cores' peak.",
        epilog=__doc__[__doc__.index("    python -m bench.impala.learner_cost ") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=None,
        metavar="FLAGS",
        help="bench.impala flags of one arm (repeat); may hold --isa native|avx2 and --thp off|on",
    )
    parser.add_argument("--common", default="", metavar="FLAGS", help="bench.impala flags every arm starts with")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds [{ROUNDS}]")
    parser.add_argument(
        "--updates",
        type=int,
        default=UPDATES,
        help=f"counted updates per measurement, after one to warm up [{UPDATES}]",
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-count", action="store_true", help=argparse.SUPPRESS)
    add_save_option(parser)
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.rounds < 1 or args.updates < 1:
        raise SystemExit(f"--rounds and --updates must be >= 1, got {args.rounds} and {args.updates}")
    if args.measure:  # one measurement, in the process main() started
        flags = rest[1:] if rest[:1] == ["--"] else rest
        job = train.resolve(_job_args(flags))
        print(REPORT_PREFIX + json.dumps(measure(job, args.updates, count=not args.no_count)), flush=True)
        return 0
    if rest:
        raise SystemExit(f"unknown arguments {rest}: bench.impala flags go in --common or --arm")
    arms = args.arm or [""]
    parsed = [_split_own(f"{args.common} {arm}") for arm in arms]
    for _, flags in parsed:
        _job_args(flags)  # a bad flag fails here, before any run
    names = [arm.strip() or "(defaults)" for arm in arms]
    results: list[list[dict]] = [[] for _ in arms]
    for r in range(args.rounds):
        order = list(range(len(arms)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            got = _measure_in_process(*parsed[i], args.updates, count=not any("error" not in x for x in results[i]))
            results[i].append(got)
            print(
                f"round {r + 1}, {names[i]}: "
                + (got["error"] if "error" in got else f"{got['update_s']:.2f} s per update"),
                file=sys.stderr,
                flush=True,
            )
    summaries = {name: _summary(res) for name, res in zip(names, results)}
    speedup = {}
    for i, name in enumerate(names[1:], 1):
        ratios = [
            a["update_s"] / b["update_s"]
            for a, b in zip(results[0], results[i])
            if "error" not in a and "error" not in b
        ]
        speedup[name] = statistics.median(ratios) if ratios else None
    report = {
        "machine": f"{_cpu_name()}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__}",
        "rounds": args.rounds,
        "updates": args.updates,
        "common": args.common,
        "arms": summaries,
        "speedup": speedup,
        "runs": {name: res for name, res in zip(names, results)},
    }
    _print(report)
    return 1 if any("error" in s for s in summaries.values()) else 0


def _job_args(flags: list[str]) -> train.Args:
    """bench.impala's options from ``flags``, for a job this command can measure."""
    args = train.parse_args(flags, prog="python -m bench.impala.learner_cost")
    if args.use_lstm:
        raise SystemExit("bench.impala.learner_cost measures feed-forward models only; drop --use-lstm")
    if args.device != "cpu":
        raise SystemExit(
            f"bench.impala.learner_cost measures a learner on the CPU (its peak too), got --device {args.device}"
        )
    return args


def _cpu_name() -> str:
    """This CPU's model and the vector instructions that matter here (from ``/proc/cpuinfo``)."""
    flags = cpu_flags()
    kinds = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{cpu_model() or 'CPU'} ({' '.join(kinds) or 'no AVX2'})"


if __name__ == "__main__":
    with saving(sys.argv[1:], "bench.impala.learner_cost"):
        sys.exit(main())
