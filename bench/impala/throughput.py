"""``python -m bench.impala.throughput``: where bench.impala's time goes. It takes
bench.impala's flags (feed-forward models only) and measures instead of training.

    python -m bench.impala.throughput                     # Pong, 3 rounds of each measurement
    python -m bench.impala.throughput --total-frames 200000 --num-workers 4

Two measurements, each in ``--rounds`` interleaved rounds (3; the order alternates each
round, because machine speed drifts); tables show medians, ratios are medians of
per-round ratios. Only ratios within one run count.

1. Learner framework cost. ``bare``: a plain torch loop on one ready batch (the same
   model, ``impala_loss``, backward, gradient clipping and optimiser step; the batch is
   built once as time-major ``[T+1, B, ...]`` tensors). ``ring``: ``Learner.step()``
   fed from a ``TypedRing`` that a forked producer keeps full with copies of one
   prepared unroll, publishing to a ``WeightStore`` as the job's flags say (every
   update, or every ``--publish-seconds``), as in the real program. Each runs
   ``LEARNER_SECONDS`` s in its own forked process with ``--learner-threads`` torch
   threads. Target: ring >= 0.90 x bare.
2. Whole pipeline. bench.impala's own ``build_program`` launched (``test_mp``) for
   ``--total-frames`` frames with a temporary ``--out``, next to bench.envpool's ``ceiling``
   subject (raw stepping with the same preprocessing, one process per env worker, the
   same number of environments) counted for as long as the pipeline's window. Every
   actor of the program runs ``watched_actor``: ``train.run_actor``, whose statistics
   and its pool's (``PoolStatistics``) also go to the launcher through a small byte
   ring; the learner's come from its ``log.csv``. Everything is
   counted over the second half of each run (the first half starts processes and
   fills the trajectory ring). Target: env workers >= 80% busy (env seconds /
   (env + wait seconds)) when the learner is not the bottleneck.

Not given, ``--total-frames`` is ``QUICK_FRAMES`` here (``DEFAULTS``): Pong
with the Nature CNN is the job the benchmark exists for, and 40K frames is enough for
a steady second half at this machine's few thousand frames/s. The ceiling is
bench.envpool's Atari subject: for other environments it is reported as n/a.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import shmpad as lp
from bench.common.evidence import SAVE_HELP, add_save_option, saving
from bench.common.harness import in_own_tree
from bench.impala import rundir, train, usage
from bench.impala.learner_cost import LEARNER_SECONDS, LEARNER_SUBJECTS
from shmpad.shm import janitor

__all__ = ["run", "main"]

ROUNDS = 3
QUICK_FRAMES = 40_000
DEFAULTS = {"total_frames": QUICK_FRAMES}
"""this benchmark's own defaults, where bench.impala's would train: a short run (before the env family's)"""
LEARNER_TARGET = 0.90
BUSY_TARGET = 0.80
LEARNER_BOUND_WAIT = 0.10
"""a learner that waited for data less than this share of its time is the bottleneck"""


def run(args: train.Args, rounds: int = ROUNDS) -> dict:
    """Measure ``args`` (as ``train.parse_args(..., defaults=DEFAULTS)`` gives them) in
    ``rounds`` interleaved rounds, print the report, and return it as a dict (also printed
    as the last line)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    job = train.resolve(args)
    plan = job.plan
    janitor.start()
    spec = job.env.spec()  # compiles the preprocessing before any fork
    print(
        f"# bench.impala.throughput {time.strftime('%Y-%m-%d %H:%M')} {platform.node()} cpus={os.cpu_count()} "
        f"env={args.env} model={args.model} T={args.unroll_length} B={args.batch_size} actors={plan.num_actors} "
        f"workers={plan.num_workers}x{plan.envs_per_worker} envs learner_threads={plan.learner_threads} "
        f"frames={args.total_frames:,} rounds={rounds}",
        flush=True,
    )
    bare, ring, per_round = [], [], []
    for r in range(rounds):
        order = ("bare", "ring") if r % 2 == 0 else ("ring", "bare")
        got = {
            name: in_own_tree(lambda name=name: LEARNER_SUBJECTS[name](job, spec), LEARNER_SECONDS + 300)
            for name in order
        }
        bare.append(got["bare"])
        ring.append(got["ring"])
        per_round.append(got["ring"]["updates_per_s"] / got["bare"]["updates_per_s"])
        print(
            f"  round {r + 1}: bare loop {got['bare']['updates_per_s']:.2f} updates/s; "
            f"Learner.step() from the ring {got['ring']['updates_per_s']:.2f} updates/s "
            f"(waiting {got['ring']['wait_share']:.1%})",
            flush=True,
        )
    learner = {
        "bare_updates_per_s": _median(bare, "updates_per_s"),
        "ring_updates_per_s": _median(ring, "updates_per_s"),
        "ring_wait_share": _median(ring, "wait_share"),
        "ratio": round(statistics.median(per_round), 3),
        "seconds": LEARNER_SECONDS,
    }
    pipelines, ceilings, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            p = _pipeline(job)
            c = _ceiling(job, p["seconds"])
        else:
            c = _ceiling(job, pipelines[-1]["seconds"])
            p = _pipeline(job)
        pipelines.append(p)
        ceilings.append(c)
        if c is not None and c > 0:
            ratios.append(p["frames_per_s"] / c)
        print(
            f"  round {r + 1}: pipeline {p['frames_per_s']:,.0f} frames/s over {p['seconds']:.1f} s; "
            f"ceiling {'n/a' if c is None else format(c, ',.0f') + ' frames/s'}; learner waiting {p['learner_wait_share']:.0%}, "
            f"workers busy {p['worker_busy']:.0%}",
            flush=True,
        )
    pipeline = {k: _median(pipelines, k) for k in pipelines[0] if k != "learner_bound"}
    known = [c for c in ceilings if c is not None]
    pipeline["ceiling_frames_per_s"] = round(statistics.median(known)) if known else None
    pipeline["ratio_to_ceiling"] = round(statistics.median(ratios), 3) if ratios else None
    pipeline["bottleneck"] = "learner" if pipeline["learner_wait_share"] < LEARNER_BOUND_WAIT else "actors"
    report = {"env": args.env, "model": args.model, "rounds": rounds, "learner": learner, "pipeline": pipeline}
    report["targets"] = _targets(learner, pipeline)
    _print(job, report)
    print("report: " + json.dumps(report), flush=True)
    return report


def _median(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 4)


# -- 2. the whole pipeline: bench.impala's program next to the actor ceiling ----------------


def send_actor_stats(stats: Any, counters: dict[str, float]) -> None:
    """One JSON message of an actor's counters into the ``stats`` ring (dropped if nobody reads)."""
    message = {"pid": os.getpid(), "t": time.monotonic(), **counters}
    try:
        stats.put_nowait(json.dumps(message).encode())
    except lp.WouldBlock:
        pass


def watched_actor(job: train.Job, index: int, trajectories, weights, stats) -> None:
    """``train.run_actor``, each of whose reports also goes into the ``stats`` ring, stamped
    with its process and time."""

    def report(counters: dict[str, float]) -> None:
        train.publish_counters(counters)
        send_actor_stats(stats, counters)

    train.run_actor(job, index, trajectories, weights, report)


def _pipeline(job: train.Job) -> dict:
    messages: list[dict] = []

    def drain(results) -> None:
        while True:
            try:
                messages.append(json.loads(results.get_bytes_nowait()))
            except (lp.WouldBlock, lp.Closed):
                return

    with (
        tempfile.TemporaryDirectory(prefix="impala-throughput-") as out,
        _quiet(os.path.join(out, "program.log")) as log_path,
    ):
        run_job = dataclasses.replace(job, out=out, log_interval=1.0, resume=False)
        try:
            program = lp.Program("impala")
            stats = program.add_node(lp.RingNode(256, slot_size=1024), "actor_stats")
            train.build_program(run_job, actor=watched_actor, actor_args=(stats,), program=program)
            manager = lp.launch(program, launch_type="test_mp", local_resources=train.local_resources(job.plan))
            results = stats.dereference()  # the program's actors send their statistics here
            while not manager.wait_for_stop(0.2):
                drain(results)
            drain(results)  # what was sent before the stop (the ring closes a second after it)
            manager.wait()
        except BaseException:
            sys.stderr.write(_tail(log_path))
            raise
        with open(os.path.join(out, rundir.LOG)) as f:
            rows = list(csv.DictReader(f))
    return _summarise(messages, rows)


@contextlib.contextmanager
def _quiet(path: str):
    """The program's progress lines go to ``path``, not into the report."""
    sys.stdout.flush()
    saved = os.dup(1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.close(fd)
    try:
        yield path
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _tail(path: str, n: int = 3000) -> str:
    with contextlib.suppress(OSError), open(path) as f:
        return f.read()[-n:]
    return ""


def _summarise(messages: list[dict], rows: list[dict]) -> dict:
    """The second half of the run: actors from their messages, the learner from its CSV."""
    if not messages or not rows:
        raise RuntimeError(
            f"the pipeline reported too little: {len(messages)} actor messages, {len(rows)} learner rows"
        )
    rows = [{"seconds": 0.0, "learner_steps": 0, "frames": 0}, *rows]  # a short run may log one row only
    mid = (min(m["t"] for m in messages) + max(m["t"] for m in messages)) / 2
    fps, seconds, env_s, wait_s, inf = (
        0.0,
        [],
        0.0,
        0.0,
        {"batches": 0, "inf_wait_s": 0.0, "inf_s": 0.0, "rollout_s": 0.0},
    )
    for pid in {m["pid"] for m in messages}:
        mine = sorted((m for m in messages if m["pid"] == pid), key=lambda m: m["t"])
        a = next((m for m in mine if m["t"] >= mid), mine[0])
        b = mine[-1]
        if b["t"] <= a["t"]:
            a = mine[0]
        if b["t"] <= a["t"]:
            continue  # one message: no interval to count
        dt = b["t"] - a["t"]
        fps += (b["frames"] - a["frames"]) / dt
        seconds.append(dt)
        env_s += b["env_s"] - a["env_s"]
        wait_s += b["wait_s"] - a["wait_s"]
        for k in inf:
            inf[k] += b[k] - a[k]
    if not seconds:
        raise RuntimeError("the pipeline ran too briefly: no actor sent two statistics messages (raise --total-frames)")
    loop = max(inf["inf_wait_s"] + inf["inf_s"] + inf["rollout_s"], 1e-9)
    last = float(rows[-1]["seconds"])
    dts, waits, steps, frames = [], [], 0, 0
    for prev, row in itertools.pairwise(rows):
        if float(row["seconds"]) < last / 2:
            continue
        dt = float(row["seconds"]) - float(prev["seconds"])
        dts.append(dt)
        waits.append(float(row["wait_fraction"]) * dt)
        steps += int(row["learner_steps"]) - int(prev["learner_steps"])
        frames += int(row["frames"]) - int(prev["frames"])
    span = max(sum(dts), 1e-9)
    wait = sum(waits) / span
    return {
        "frames_per_s": round(fps),
        "seconds": round(statistics.median(seconds), 2),
        "learner_frames_per_s": round(frames / span),
        "learner_updates_per_s": round(steps / span, 3),
        "learner_wait_share": round(wait, 3),
        "learner_ms_per_update": round(1e3 * (span - sum(waits)) / max(steps, 1), 1),
        "inference_ms_per_batch": round(1e3 * inf["inf_s"] / max(inf["batches"], 1), 2),
        "actor_inference_share": round(inf["inf_s"] / loop, 3),
        "actor_wait_share": round(inf["inf_wait_s"] / loop, 3),
        "actor_rollout_share": round(inf["rollout_s"] / loop, 3),
        "worker_busy": round(env_s / max(env_s + wait_s, 1e-9), 3),
    }


def _ceiling(job: train.Job, seconds: float) -> float | None:
    """bench.envpool's ceiling for the program's env workers and environments, or None off Atari."""
    from bench.envpool import benchmark as bench_actors

    if not job.env.is_atari:
        return None
    cores = job.plan.num_actors * job.plan.num_workers
    ceiling_args = bench_actors.Args(
        env=job.env.env_id,
        cores=cores,
        num_envs=cores * job.plan.envs_per_worker,
        seconds=max(seconds, 1.0),
        warmup=1.0,
    )
    rate, why = bench_actors.measure("ceiling", ceiling_args)
    if rate is None:
        raise RuntimeError(f"the actor ceiling failed: {why}")
    return rate


# -- the report ----------------------------------------------------------------------------


def _targets(learner: dict, pipeline: dict) -> dict:
    out = {"learner_ratio": "PASS" if learner["ratio"] >= LEARNER_TARGET else "FAIL"}
    if pipeline["bottleneck"] == "learner":
        out["worker_busy"] = "N/A"
    else:
        out["worker_busy"] = "PASS" if pipeline["worker_busy"] >= BUSY_TARGET else "FAIL"
    return out


def _print(job: train.Job, report: dict) -> None:
    lr, p, t = report["learner"], report["pipeline"], report["targets"]
    frames_per_update = job.learner.batch_size * job.unroll_length * job.learner.frames_per_step
    ceiling = (
        "n/a (bench.envpool's ceiling is Atari only)"
        if p["ceiling_frames_per_s"] is None
        else f"{p['ceiling_frames_per_s']:>10,} frames/s"
    )
    ratio = "n/a" if p["ratio_to_ceiling"] is None else f"{p['ratio_to_ceiling']:.2f}"
    print(
        f"\n1. Learner framework cost (medians of {report['rounds']} rounds of {LEARNER_SECONDS:g} s, {job.plan.learner_threads} torch threads)"
    )
    print(
        f"   bare torch loop on a ready batch      {lr['bare_updates_per_s']:8.2f} updates/s  ({1e3 / lr['bare_updates_per_s']:.1f} ms/update)"
    )
    print(
        f"   Learner.step() from a TypedRing       {lr['ring_updates_per_s']:8.2f} updates/s  "
        f"({1e3 / lr['ring_updates_per_s']:.1f} ms/update, waiting {lr['ring_wait_share']:.1%}; {usage.publishing(job.learner)} to a WeightStore)"
    )
    print(f"   ratio                                 {lr['ratio']:8.3f}")
    print(
        f"\n2. Whole pipeline (bench.impala's program, {job.total_frames:,} frames a run; second half of each run counted)"
    )
    print(
        f"   pipeline                {p['frames_per_s']:>10,.0f} env frames/s   (learner consumed {p['learner_frames_per_s']:,.0f} frames/s)"
    )
    print(
        f"   actor ceiling           {ceiling}   ({job.plan.num_actors * job.plan.num_workers} processes, same environments, {p['seconds']:.1f} s)"
    )
    print(f"   ratio                   {ratio}")
    print("   where the time goes:")
    print(
        f"     learner      waiting for batches {p['learner_wait_share']:.0%}; {p['learner_ms_per_update']:.1f} ms/update, "
        f"{p['learner_updates_per_s']:.2f} updates/s ({frames_per_update:,} frames each)"
    )
    print(
        f"     inference    {p['inference_ms_per_batch']:.1f} ms/batch; of the actor loop: network {p['actor_inference_share']:.0%}, "
        f"waiting for env workers {p['actor_wait_share']:.0%}, writing unrolls {p['actor_rollout_share']:.0%} "
        "(includes waiting for free trajectory slots)"
    )
    print(f"     env workers busy {p['worker_busy']:.0%} (env seconds / (env + wait seconds))")
    if p["bottleneck"] == "learner":
        print(
            f"   bottleneck: the learner (it waited for data {p['learner_wait_share']:.0%} of the time, under {LEARNER_BOUND_WAIT:.0%})"
        )
    else:
        side = (
            "the env workers"
            if p["worker_busy"] >= BUSY_TARGET
            else "the actor process (inference, unrolls) or the shared cores"
        )
        print(f"   bottleneck: the actors, {side} (the learner waited {p['learner_wait_share']:.0%} of the time)")
    print()
    print(
        f"{t['learner_ratio']} learner from the ring at {lr['ratio']:.2f} x the bare torch loop (target >= {LEARNER_TARGET:.2f})"
    )
    if t["worker_busy"] == "N/A":
        print(
            f"N/A env workers {p['worker_busy']:.0%} busy: the target (>= {BUSY_TARGET:.0%}) applies when the learner is not the bottleneck"
        )
    else:
        print(
            f"{t['worker_busy']} env workers {p['worker_busy']:.0%} busy with the learner not the bottleneck (target >= {BUSY_TARGET:.0%})"
        )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--rounds", type=int, default=ROUNDS)
    add_save_option(own)  # read where the program starts (``saving``), so that the copy has every line
    mine, rest = own.parse_known_args(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(rest):
        print(
            "bench.impala.throughput's own options:\n"
            f"  --rounds N  interleaved rounds of each measurement [{ROUNDS}]\n"
            f"  --save DIR  {SAVE_HELP}\n"
        )
    args = train.parse_args(rest, prog="python -m bench.impala.throughput", defaults=DEFAULTS)
    if mine.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {mine.rounds}")
    if args.use_lstm:
        raise SystemExit("bench.impala.throughput measures feed-forward models only; drop --use-lstm")
    report = run(args, mine.rounds)
    return 1 if "FAIL" in report["targets"].values() else 0  # a missed target, as in every benchmark


if __name__ == "__main__":
    with saving(sys.argv[1:], "bench.impala.throughput"):
        sys.exit(main())
