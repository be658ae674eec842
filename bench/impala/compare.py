"""``python -m bench.impala.compare``: the main job under several sets of flags, side by side.

    python -m bench.impala.compare --arm "--pin on" --arm "--pin off" --rounds 3
    python -m bench.impala.compare --common "--device cuda --model deep --last-action-reward" \\
        --arm "--num-actors 4 --num-workers 3" --arm "--num-actors 1 --num-workers 12" --seconds 100

Each round runs every arm once, each as its own ``python -m bench.impala`` with ``--common``
and then the arm's flags, in an order that rotates from round to round (a shared machine's
speed drifts, so only what ran in the same rounds compares). A run ends at its
``--total-frames`` or, with ``--seconds``, at the first of the two: it is then stopped as
Ctrl+C stops it. Its seconds count from its first log row, so that start-up (importing,
compiling, forking) under a loaded machine does not eat the time it is measured in; a run
that logs no row within ``STARTUP_S`` is stopped and reported. From each run's ``log.csv``: the median frames/s of its rows after the first
third (start-up, compiling and filling the ring come first), the medians over the same rows
of how long the learner waited for data, how busy the env workers were, the actors'
inference ms per batch and the policy lag, and the last row's mean return (a faster plan
must still learn). The table gives each arm's medians over the rounds and the median of its
per-round ratios to the first arm; the last line is the report as JSON, with each run's
breakdown.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common.evidence import add_save_option, saving
from bench.common.jobs import exit_on_sigterm, start_job
from bench.impala import rundir, train

__all__ = ["main", "steady", "parse_args"]

STOP_GRACE_S = 150.0
"""how long a run stopped with SIGINT may take to write its checkpoint and exit (more than the
job's own notice to its nodes, ``bench.impala.train.STOP_NOTICE_S``)"""
STARTUP_S = 600.0
"""how long a run with ``--seconds`` may take to write its first log row"""
SESSION_END_S = 15.0
"""how long the nodes of a killed run may take to see their parent gone and exit"""
STEADY_COLUMNS = ("wait_fraction", "env_busy", "inference_ms", "policy_lag")
FIXED = ("--out", "--resume")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.impala.compare",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="FLAGS",
        help="one arm's bench.impala flags, quoted (give 2 or more; one flag alone as --arm=--use-lstm)",
    )
    parser.add_argument(
        "--common", default="", metavar="FLAGS", help="bench.impala flags every arm runs with, before its own"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every arm once [3]")
    parser.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="stop a run this many seconds after its first log row (0: at its --total-frames) [0]",
    )
    parser.add_argument("--log-interval", type=float, default=2.0, help="seconds between the runs' log rows [2]")
    parser.add_argument(
        "--keep", default="", metavar="DIR", help="keep every run's folder under DIR (default: a temporary folder)"
    )
    add_save_option(parser)  # read where the program starts (``saving``), so that the copy has every line
    args = parser.parse_args(argv)
    if len(args.arm) < 2:
        parser.error(f"give at least 2 --arm to compare, got {len(args.arm)}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if not args.seconds >= 0:
        parser.error(f"--seconds must be >= 0 (0: each run goes to its --total-frames), got {args.seconds}")
    if not args.log_interval > 0:
        parser.error(f"--log-interval must be > 0, got {args.log_interval}")
    if args.keep and os.path.exists(args.keep) and os.listdir(args.keep):
        parser.error(f"--keep {args.keep}: the folder is not empty (each comparison keeps its runs in a new one)")
    for flags in (args.common, *args.arm):
        try:
            words = shlex.split(flags)
        except ValueError as e:
            parser.error(f"{flags!r}: {e}")
        taken = [w for w in words if w.split("=")[0] in FIXED]
        if taken:
            parser.error(f"{flags!r}: {', '.join(taken)} is set by the comparison for every run")
        with tempfile.TemporaryDirectory() as scratch:
            try:
                train.parse_args([*shlex.split(args.common), *words, "--out", scratch])
            except SystemExit:
                parser.error(f"bench.impala refused the flags {args.common + ' ' + flags!r} (its message is above)")
            except train.UsageError as e:
                parser.error(f"{args.common + ' ' + flags!r}: {e}")
    return args


def steady(rows: list[dict]) -> dict:
    """A run's figures from its log rows: the medians of frames/s and of the breakdown
    (``STEADY_COLUMNS``) over the rows after the first third, and the last row's mean return.
    A column that no kept row fills is ``None``."""
    if not rows:
        raise ValueError("the run wrote no log row")
    kept = rows[len(rows) // 3 :]
    out = {"frames_per_s": round(statistics.median(float(r["fps"]) for r in kept)), "rows": len(kept)}
    for name in STEADY_COLUMNS:
        values = [float(r[name]) for r in kept if r.get(name) not in ("", None)]
        out[name] = round(statistics.median(values), 4) if values else None
    value = rows[-1].get("mean_return", "")
    out["mean_return"] = float(value) if value not in ("", None) else None
    return out


def run_one(flags: list[str], out: str, seconds: float) -> dict:
    """One ``python -m bench.impala`` run into ``out``: its figures (``steady``) and its ``pid``,
    which led a session of its own that is gone when this returns (Linux: the session's
    members are found in /proc)."""
    cmd = [sys.executable, "-m", "bench.impala", *flags, "--out", out]
    with open(os.path.join(os.path.dirname(out), os.path.basename(out) + ".log"), "w") as log:
        proc = start_job(cmd, stdout=log)  # SIGINT at its default: the stop below reaches it
        stopped = started = False
        try:
            try:
                if seconds:
                    _await_first_row(proc, os.path.join(out, rundir.LOG), STARTUP_S)
                started = True
                proc.wait(seconds or None)
            except subprocess.TimeoutExpired:
                stopped = True
                os.killpg(proc.pid, signal.SIGINT)  # as Ctrl+C: the job stops and writes its files
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(STOP_GRACE_S)  # else killed below; the rows it logged still count
        finally:
            if proc.poll() is None:  # did not stop in time, or this process is being interrupted
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                _await_session_end(proc.pid)
    if not started:
        raise RuntimeError(f"{shlex.join(cmd)} logged no row within {STARTUP_S:g} s of its start; see {log.name}")
    if proc.returncode != 0 and not stopped:
        with open(log.name) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{shlex.join(cmd)} exited with {proc.returncode}:\n{tail}")
    if not os.path.exists(os.path.join(out, rundir.LOG)):
        raise RuntimeError(f"{shlex.join(cmd)} wrote no log.csv before it stopped; see {log.name}")
    with open(os.path.join(out, rundir.LOG)) as f:
        return {**steady(list(csv.DictReader(f))), "pid": proc.pid}


def _await_first_row(proc: subprocess.Popen, log_csv: str, timeout: float) -> None:
    """Wait until ``log_csv`` holds a row after its header, or ``proc`` has ended; raise
    ``subprocess.TimeoutExpired`` after ``timeout`` s (the caller then stops the run)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        with contextlib.suppress(FileNotFoundError), open(log_csv, "rb") as f:
            if f.read().count(b"\n") >= 2:  # the header and a row
                return
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(0.1)


def _session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # it ended meanwhile
            if int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
                found.append(int(entry))
    return found


def _await_session_end(sid: int, timeout: float = SESSION_END_S) -> None:
    """After its leader was killed: the job's nodes see their parent gone and exit, and its
    janitor removes their shared memory once they have; what is left after ``timeout`` s
    is killed."""
    deadline = time.monotonic() + timeout
    while (left := _session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    arms = [["--log-interval", str(args.log_interval), *shlex.split(args.common), *shlex.split(a)] for a in args.arm]
    print(
        f"# bench.impala.compare {time.strftime('%Y-%m-%d %H:%M')} {platform.node()} cpus={os.cpu_count()} "
        f"rounds={args.rounds} seconds={args.seconds:g} common={args.common!r}",
        flush=True,
    )
    results: list[list[dict]] = [[] for _ in arms]
    with contextlib.ExitStack() as stack:
        root = args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="impala-compare-"))
        os.makedirs(root, exist_ok=True)
        for r in range(args.rounds):
            for k in range(len(arms)):
                i = (k + r) % len(arms)
                got = run_one(arms[i], os.path.join(root, f"arm{i}-round{r + 1}"), args.seconds)
                results[i].append(got)
                print(f"  round {r + 1}: arm {i} ({_name(args.arm[i])}): {_describe(got)}", flush=True)
    report = _report(args, results)
    _print(args, report)
    print("report: " + json.dumps(report), flush=True)
    return 0


def _describe(got: dict) -> str:
    parts = [f"{got['frames_per_s']:,} frames/s"]
    for name, fmt in (
        ("wait_fraction", "learner waits {:.0%}"),
        ("env_busy", "env workers busy {:.0%}"),
        ("inference_ms", "inference {:.3g} ms/batch"),
        ("policy_lag", "lag {:.3g} updates"),
        ("mean_return", "mean return {:g}"),
    ):
        if got[name] is not None:
            parts.append(fmt.format(got[name]))
    return ", ".join(parts)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None  # the JSON line stays standard JSON


def _name(flags: str) -> str:
    return flags or "(--common only)"


def _report(args: argparse.Namespace, results: list[list[dict]]) -> dict:
    arms = []
    for i, runs in enumerate(results):
        ratios = [run["frames_per_s"] / first["frames_per_s"] for run, first in zip(runs, results[0], strict=True)]
        arms.append(
            {
                "flags": args.arm[i],
                "frames_per_s": round(statistics.median(r["frames_per_s"] for r in runs)),
                "per_round": [r["frames_per_s"] for r in runs],
                "ratio_to_first": round(statistics.median(ratios), 3),
                "mean_return_per_round": [_finite(r["mean_return"]) for r in runs],
                "breakdown_per_round": [{k: _finite(r[k]) for k in STEADY_COLUMNS} for r in runs],
            }
        )
    return {"common": args.common, "rounds": args.rounds, "seconds": args.seconds, "arms": arms}


def _print(args: argparse.Namespace, report: dict) -> None:
    width = max(len(_name(a["flags"])) for a in report["arms"])
    print(f"\narm  {'flags'.ljust(width)}  frames/s (median)  / arm 0 (median of rounds)  per round")
    for i, a in enumerate(report["arms"]):
        rounds = ", ".join(f"{x:,}" for x in a["per_round"])
        print(
            f"{i:<4} {_name(a['flags']).ljust(width)}  {a['frames_per_s']:>17,}  {a['ratio_to_first']:>26.2f}  {rounds}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    exit_on_sigterm()  # a kill unwinds through run_one's finally, which stops the run
    with saving(sys.argv[1:], "bench.impala.compare"):
        sys.exit(main())
