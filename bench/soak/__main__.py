"""A soak: the default job for hours, its whole process tree sampled as it runs, to show
that nothing grows once it has warmed up.

    python -m bench.soak --hours 2                       # python -m bench.impala for 2 hours
    python -m bench.soak --hours 0.1 --sample-seconds 10 --csv soak.csv
    python -m bench.soak --job "python -m bench.impala --env CartPole-v1 --total-frames 10_000_000_000"

Method. The job (``--job``, by default ``python -m bench.impala`` with a
``--total-frames`` too large to reach) runs in a session of its own. Every
``--sample-seconds`` the soak reads, from /proc, what the job's whole process tree holds
(``bench/soak/tree.py``: processes, RSS and PSS, open files, threads, its /dev/shm files
and their bytes) and appends a row to the CSV. After ``--hours`` (or when the job ends
by itself) it stops the job (SIGINT, SIGKILL to the session 60 s later), then prints
each column's growth per hour after the warm-up: the least-squares slope over the
samples taken after ``--warmup-minutes``, also as a share of those samples' mean. It
last says what of the job outlived it (processes of its session, shmpad segments of its
processes). Growth under 1% per hour in RSS and /dev/shm and none in threads or files
is the target (issue 31).
"""

from __future__ import annotations

import csv
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields

from bench.common.cli import parser_for
from bench.common.jobs import exit_on_sigterm, start_job
from bench.soak.tree import Sample, Tree

DEFAULT_JOB = f"{sys.executable} -m bench.impala --total-frames 1000000000000"
STOP_GRACE_S = 150.0
LEFTOVER_WAIT_S = 10.0  # after the job's first process ended, for the rest of its tree to follow


@dataclass
class Args:
    hours: float = 2.0
    """how long to run the job"""
    sample_seconds: float = 60.0
    """seconds between samples"""
    warmup_minutes: float = 10.0
    """samples taken before this are left out of the growth figures"""
    csv: str = "soak.csv"
    """where to write the samples (one row each)"""
    job: str = DEFAULT_JOB
    """the command to soak (split like a shell would, run without one)"""
    leftover_seconds: float = LEFTOVER_WAIT_S
    """after the job's first process ended, how long the rest of its tree may take to follow before it counts as left over"""


def growth(times_h: list[float], values: list[float]) -> tuple[float, float]:
    """``(slope per hour, slope as a share of the mean per hour)`` of the least-squares line."""
    n = len(values)
    if n < 2:
        return 0.0, 0.0
    mt, mv = sum(times_h) / n, sum(values) / n
    var = sum((t - mt) ** 2 for t in times_h)
    slope = 0.0 if var == 0 else sum((t - mt) * (v - mv) for t, v in zip(times_h, values)) / var
    return slope, (slope / mv if mv else 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = parser_for(Args, "python -m bench.soak", __doc__.split("\n")[0])
    args = Args(**vars(parser.parse_args(argv)))
    if not args.hours > 0 or not args.sample_seconds > 0 or args.warmup_minutes < 0 or args.leftover_seconds < 0:
        parser.error(
            f"--hours and --sample-seconds must be positive and --warmup-minutes and --leftover-seconds >= 0, got "
            f"{args.hours}, {args.sample_seconds}, {args.warmup_minutes} and {args.leftover_seconds}"
        )
    command = shlex.split(args.job)
    if not command:
        parser.error("--job must name a command")
    columns = ["t_s", *(f.name for f in fields(Sample))]
    print(
        f"soak: {args.job!r} for {args.hours:g} h, a sample every {args.sample_seconds:g} s into {args.csv}", flush=True
    )
    job = start_job(command, stdout=subprocess.DEVNULL, stderr=None)  # SIGINT at its default: the stop reaches it
    tree = Tree(job.pid)
    start = time.monotonic()
    end = start + args.hours * 3600
    rows: list[dict] = []
    try:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            while True:
                row = {"t_s": round(time.monotonic() - start, 3), **asdict(tree.sample())}
                rows.append(row)
                writer.writerow(row)
                f.flush()
                next_at = start + len(rows) * args.sample_seconds
                if next_at > end or job.poll() is not None:
                    break
                try:
                    job.wait(max(0.0, next_at - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
    finally:
        ended_by_itself = job.poll() is not None
        _stop(job)
    if ended_by_itself:
        print(f"soak: the job ended by itself after {time.monotonic() - start:.0f} s with code {job.returncode}")
    report(rows, args.warmup_minutes * 60)
    deadline = time.monotonic() + args.leftover_seconds
    while tree.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = tree.pids()
    for pid in left:  # counted: now they go
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    segments = [n for n in os.listdir("/dev/shm") if _made_by(n, tree.seen)] if os.path.isdir("/dev/shm") else []
    print(f"soak: left after the job: {len(left)} processes, {len(segments)} shmpad segments of its processes")
    return 0 if not left and not segments else 1


def report(rows: list[dict], warmup_s: float) -> None:
    after = [r for r in rows if r["t_s"] >= warmup_s]
    if len(after) < 2:
        print(f"soak: {len(after)} samples after the {warmup_s:g} s warm-up: too few for a growth figure")
        return
    times_h = [r["t_s"] / 3600 for r in after]
    print(f"soak: growth per hour over {len(after)} samples from {after[0]['t_s']:.0f} s to {after[-1]['t_s']:.0f} s")
    for name in (f.name for f in fields(Sample)):
        values = [float(r[name]) for r in after]
        slope, share = growth(times_h, values)
        print(f"  {name:11} first {values[0]:14.0f} last {values[-1]:14.0f}  {slope:+14.1f}/h  {share:+8.2%}/h")


def _made_by(name: str, pids: set[int]) -> bool:
    parts = name.split(".")
    return name.startswith("shmpad.") and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in pids


def _stop(job: subprocess.Popen) -> None:
    """SIGINT the job's first process (as Ctrl-C would), SIGKILL it after ``STOP_GRACE_S``."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, None)):
        if job.poll() is not None:
            return
        job.send_signal(sig)
        try:
            job.wait(wait)
        except subprocess.TimeoutExpired:
            continue


if __name__ == "__main__":
    exit_on_sigterm()  # a kill unwinds through main's finally, which stops the job
    sys.exit(main())
