"""``python -m bench.learn``: frames and wall-clock to a score, over several seeds.

    python -m bench.learn                                        # Pong to +18 and +20, 3 seeds, 10M frames each
    python -m bench.learn --seeds 3 --parallel 3 -- --device cuda --algo appo
    python -m bench.learn --env CartPole-v1 --targets 475 --frames 1_000_000

Each seed is its own ``python -m bench.impala --seed S --total-frames FRAMES`` (the flags after
``--`` go to every run), into ``OUT/seed-S``. While it runs, its ``episodes.csv`` is read as it
grows: a target is reached at the first episode whose mean true return over the last
``--window`` episodes (100, as Atari results are reported) is at least the target; the frames
are the learner's at that episode and the seconds are the wall-clock since the run was started
(start-up and compiling included, as a user waits for them). Once every target is reached the
run is stopped as Ctrl+C stops it (``--keep-going`` lets it run to its frame budget).

``--parallel N`` runs N seeds at once, each on its own share of this process's CPUs (the job's
plan sizes itself from the CPUs it may use): frames to a score do not depend on the machine's
speed, so seeds can share a box; their seconds then do, and only a run alone on the machine
gives the wall-clock a user would see.

``--resume`` continues every seed's run in ``OUT`` from its checkpoint (``bench.impala
--resume``; give the same flags, and a larger ``--frames`` once a run has used its budget), so
a long curve can be run in stretches. A seed's seconds go on from those the last stretch's
``summary.json`` gave it, and the targets it had reached keep their frames and seconds (without
that summary, its seconds go on from the run's ``log.csv``, and a target reached before the
resume counts at them); the wall-clock between two stretches is not counted. ``--seconds`` bounds each stretch.

``OUT`` gets ``summary.json`` (every seed's frames and seconds per target, the medians and the
worst, the machine, each run's plan line and its start-up: seconds from the command to the
first learner update, as the job prints them), ``summary.md`` (the same as a table) and
``curves.png`` (each seed's mean return against frames, with the targets), beside each
run's own folder and its output, ``seed-S.log``. Stopped by Ctrl+C or SIGTERM, it stops its
runs as Ctrl+C stops a job (each keeps a checkpoint) and still writes them, the seeds it
stopped marked ``"interrupted": true`` with their frames and targets so far.

``python -m bench.learn.games --games ALE/Breakout-v5,ALE/Pong-v5`` runs this game by game, each
past its target to 40M frames, and writes one table of them all (``games.md``, ``games.json``):
each game's protocol, its score at 10M and 40M frames, its frames and minutes to its target, and
the published runs it compares with (``bench/learn/targets.py``, each with its source);
``--table-only`` makes that table again from kept run folders without running anything.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from bench.common.evidence import cpu_model
from bench.common.jobs import exit_on_sigterm, start_job
from bench.impala import rundir, train
from bench.impala.compare import STOP_GRACE_S, _await_session_end
from bench.impala.progress import last_seconds, startup_seconds

__all__ = ["Progress", "main", "parse_args", "summarize"]

POLL_S = 1.0
"""how often a run's episodes.csv is read"""


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    job = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.learn",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        usage="python -m bench.learn [options] [-- bench.impala flags]",
    )
    parser.add_argument("--env", default="ALE/Pong-v5", help="the environment [ALE/Pong-v5]")
    parser.add_argument(
        "--targets", default="18,20", help="mean returns to reach, comma-separated, in increasing order [18,20]"
    )
    parser.add_argument("--frames", type=int, default=10_000_000, help="each run's frame budget [10_000_000]")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 [3]")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed [0]")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once, each on its share of the CPUs [1]")
    parser.add_argument("--window", type=int, default=100, help="episodes in the mean return [100]")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop a run after this many seconds (0: never) [0]")
    parser.add_argument("--keep-going", action="store_true", help="run to the frame budget after the last target")
    parser.add_argument("--out", default="", help="folder for the runs and the summary [runs/learn-<env>-<time>]")
    parser.add_argument("--resume", action="store_true", help="continue each seed's run in --out from its checkpoint")
    args = parser.parse_args(own)
    args.argv = argv  # for the summary's command line (bench.learn.games calls main with its own)
    try:
        args.targets = [float(t) for t in args.targets.split(",")]
    except ValueError:
        parser.error(f"--targets must be numbers separated by commas, got {args.targets!r}")
    if args.targets != sorted(args.targets):
        parser.error(f"--targets must be in increasing order, got {args.targets}")
    for name, least in (("frames", 1), ("seeds", 1), ("parallel", 1), ("window", 1), ("first_seed", 0)):
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if not args.seconds >= 0:
        parser.error(f"--seconds must be >= 0 (0: no limit), got {args.seconds}")
    if args.parallel > len(os.sched_getaffinity(0)):
        parser.error(f"--parallel {args.parallel}: this process may run on {len(os.sched_getaffinity(0))} CPUs only")
    taken = [w for w in job if w.split("=")[0] in ("--seed", "--total-frames", "--out", "--env", "--resume")]
    if taken:
        parser.error(f"{', '.join(taken)}: bench.learn sets it for every run (use its own options)")
    if args.resume:
        if not args.out:
            parser.error("--resume needs --out: the folder of the runs to continue")
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            folder = os.path.join(args.out, f"seed-{seed}")
            if not os.path.exists(os.path.join(folder, rundir.CHECKPOINT)):
                parser.error(f"--resume: {folder} holds no checkpoint to continue")
    elif args.out and os.path.exists(args.out) and os.listdir(args.out):
        parser.error(f"--out {args.out}: the folder is not empty (--resume continues its runs)")
    try:
        train.parse_args([*_job_flags(args, job, 0), "--out", os.devnull])
    except SystemExit:
        parser.error(f"bench.impala refused the flags {shlex.join(job)!r} (its message is above)")
    except train.UsageError as e:
        parser.error(str(e))
    if not args.out:
        args.out = rundir.default_out(args.env).replace(rundir.RUNS + os.sep, rundir.RUNS + os.sep + "learn-", 1)
    return args, job


def _job_flags(args: argparse.Namespace, job: list[str], seed: int) -> list[str]:
    return ["--env", args.env, "--seed", str(seed), "--total-frames", str(args.frames), *job]


@dataclass
class Progress:
    """A run's episodes as its episodes.csv grows, and when each target was first reached."""

    targets: list[float]
    window: int
    returns: collections.deque = field(init=False)
    curve: list[tuple[int, float]] = field(default_factory=list)
    """(frames, mean return over the window) at each episode once the window is full"""
    reached: dict[float, tuple[int, float]] = field(default_factory=dict)
    """target -> (frames, seconds) at the first episode whose windowed mean reached it"""
    frames: int = 0
    _offset: int = 0

    def __post_init__(self) -> None:
        self.returns = collections.deque(maxlen=self.window)

    def read(self, path: str, seconds: float) -> None:
        """Take the episodes written to ``path`` since the last call (whole lines only)."""
        try:
            with open(path, newline="") as f:  # untranslated: the offset counts the file's own bytes ("\r\n")
                f.seek(self._offset)
                text = f.read()
        except FileNotFoundError:
            return
        end = text.rfind("\n") + 1
        self._offset += len(text[:end].encode())
        for line in text[:end].splitlines():
            self.add(line, seconds)

    def add(self, line: str, seconds: float) -> None:
        parts = line.split(",")
        try:
            frames, ret = int(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            return  # the header
        self.frames = frames
        self.returns.append(ret)
        if len(self.returns) < self.window:
            return
        mean = sum(self.returns) / len(self.returns)
        self.curve.append((frames, mean))
        for target in self.targets:
            if mean >= target and target not in self.reached:
                self.reached[target] = (frames, round(seconds, 1))

    @property
    def done(self) -> bool:
        return len(self.reached) == len(self.targets)


def _last_stretch(out: str, seed: int) -> dict | None:
    """The seed's result in ``out``'s ``summary.json`` (the last stretch's), if there is one."""
    try:
        with open(os.path.join(out, "summary.json")) as f:
            runs = json.load(f)["runs"]
    except (OSError, ValueError, KeyError):
        return None
    return next((r for r in runs if r.get("seed") == seed), None)


def _cpu_groups(parallel: int) -> list[list[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    size = len(cpus) // parallel
    return [cpus[i * size : (i + 1) * size] for i in range(parallel)]


class Run:
    """One seed's ``python -m bench.impala``, in a session of its own, on ``cpus``."""

    def __init__(self, args: argparse.Namespace, job: list[str], seed: int, cpus: list[int]):
        self.seed = seed
        self.cpus = cpus
        self.folder = os.path.join(args.out, f"seed-{seed}")
        self.log_path = os.path.join(args.out, f"seed-{seed}.log")
        self.cmd = [sys.executable, "-m", "bench.impala", *_job_flags(args, job, seed), "--out", self.folder]
        self.progress = Progress(args.targets, args.window)
        self.stopped_at: float | None = None
        self.before = 0.0
        """a resumed run's seconds before this stretch"""
        if args.resume:
            self.cmd.append("--resume")
            last = _last_stretch(args.out, seed)
            self.before = last["seconds"] if last else last_seconds(os.path.join(self.folder, rundir.LOG))
            self.progress.read(os.path.join(self.folder, rundir.EPISODES), self.before)
            for target in args.targets:  # as the last stretch measured them
                if last and _key(target) in last["reached"]:
                    was = last["reached"][_key(target)]
                    self.progress.reached[target] = (was["frames"], was["seconds"])
        self._log = open(self.log_path, "a" if args.resume else "w")
        self.start = time.monotonic()
        self.proc = start_job(self.cmd, stdout=self._log, cpus=cpus)  # SIGINT at its default: stop() reaches it

    def poll(self, keep_going: bool, seconds: float) -> bool:
        """Read its progress; stop it when done (or past ``seconds``). True once it has exited."""
        elapsed = time.monotonic() - self.start
        self.progress.read(os.path.join(self.folder, rundir.EPISODES), self.before + elapsed)
        if self.stopped_at is None and ((self.progress.done and not keep_going) or (seconds and elapsed >= seconds)):
            self.stop()
        if (
            self.stopped_at is not None
            and self.proc.poll() is None
            and time.monotonic() - self.stopped_at > STOP_GRACE_S
        ):
            self.kill()
        return self.proc.poll() is not None

    def stop(self) -> None:
        """As Ctrl+C: the job saves its checkpoint and exits."""
        self.stopped_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self) -> dict:
        """After it exited: its nodes gone, its last episodes read, its result."""
        _await_session_end(self.proc.pid)
        self._log.close()
        self.progress.read(os.path.join(self.folder, rundir.EPISODES), self.before + time.monotonic() - self.start)
        with open(self.log_path) as f:
            text = f.read()
        head = text[:4000].splitlines()
        if self.proc.returncode not in (0, 130) and self.stopped_at is None:
            tail = open(self.log_path).read()[-3000:]
            raise RuntimeError(f"{shlex.join(self.cmd)} exited with {self.proc.returncode}:\n{tail}")
        return {
            "seed": self.seed,
            "pid": self.proc.pid,
            "cpus": len(self.cpus),
            "frames": self.progress.frames,
            "seconds": round(self.before + time.monotonic() - self.start, 1),
            "reached": {_key(t): {"frames": f, "seconds": s} for t, (f, s) in self.progress.reached.items()},
            "plan": [line for line in head if line.startswith(("IMPALA", "APPO", "plan"))][:2],
            "startup_seconds": startup_seconds(text),  # the job's own count, this stretch's; None before an update
            "curve": self.progress.curve[:: max(1, len(self.progress.curve) // 400)],
        }


def _key(target: float) -> str:
    return f"{target:g}"


def summarize(targets: list[float], results: list[dict]) -> dict:
    """Per target: the seeds' frames and seconds, their medians and the worst (``None`` where a
    seed did not reach it: the median counts it as never, above every reached one)."""
    out = {}
    for target in targets:
        per = [r["reached"].get(_key(target)) for r in results]
        row = {"reached": sum(p is not None for p in per), "seeds": len(per)}
        for unit in ("frames", "seconds"):
            values = [p[unit] if p is not None else math.inf for p in per]
            median, worst = statistics.median(values), max(values)
            row[f"{unit}_per_seed"] = [None if math.isinf(v) else v for v in values]
            row[f"median_{unit}"] = None if math.isinf(median) else median
            row[f"worst_{unit}"] = None if math.isinf(worst) else worst
        out[_key(target)] = row
    return out


def machine() -> dict:
    info = {"host": platform.node(), "cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()}
    info["cpu"] = cpu_model() or ""
    with contextlib.suppress(OSError):
        info["load"] = open("/proc/loadavg").read().split()[:3]
    import torch

    info["torch"] = torch.__version__
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _table(args: argparse.Namespace, job: list[str], summary: dict, results: list[dict]) -> str:
    lines = [
        f"# bench.learn: {args.env}, {len(results)} seed(s), {args.frames:,}-frame budget",
        "",
        f"Command: `{shlex.join(['python', '-m', 'bench.learn', *args.argv])}`",
        f"Job flags: `{shlex.join(job)}`",
        "",
        "| target | seeds reached | frames per seed | median frames | worst | seconds per seed | median s | worst s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def fmt(v, unit):
        if v is None:
            return "not reached"
        if unit == "frames":
            return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v:,}"
        return f"{v:,.0f}"

    for target, row in summary.items():
        lines.append(
            f"| {target} | {row['reached']}/{row['seeds']} | "
            + ", ".join(fmt(v, "frames") for v in row["frames_per_seed"])
            + f" | {fmt(row['median_frames'], 'frames')} | {fmt(row['worst_frames'], 'frames')} | "
            + ", ".join(fmt(v, "s") for v in row["seconds_per_seed"])
            + f" | {fmt(row['median_seconds'], 's')} | {fmt(row['worst_seconds'], 's')} |"
        )
    for r in results:
        stopped = ", interrupted" if r.get("interrupted") else ""
        lines.append(
            f"\nseed {r['seed']} ({r['cpus']} cpus, {r['frames']:,} frames{stopped}): " + " / ".join(r["plan"])
        )
    return "\n".join(lines) + "\n"


def plot(path: str, targets: list[float], results: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r["curve"]:
            frames, means = zip(*r["curve"])
            ax.plot([f / 1e6 for f in frames], means, label=f"seed {r['seed']}")
    for t in targets:
        ax.axhline(t, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("frames (millions, frame skip counted)")
    ax.set_ylabel("mean return (last 100 episodes)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args, job = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    print(
        f"# bench.learn {time.strftime('%Y-%m-%d %H:%M')} {info} {args.env} targets={args.targets} "
        f"seeds={args.seeds} parallel={args.parallel} job={shlex.join(job)!r} out={args.out}",
        flush=True,
    )
    seeds = collections.deque(range(args.first_seed, args.first_seed + args.seeds))
    free = _cpu_groups(args.parallel)
    running: list[Run] = []
    results: list[dict] = []
    try:
        while seeds or running:
            while seeds and free:
                running.append(Run(args, job, seeds.popleft(), free.pop(0)))
            time.sleep(POLL_S)
            for run in [r for r in running if r.poll(args.keep_going, args.seconds)]:
                running.remove(run)
                free.append(run.cpus)
                result = run.finish()
                results.append(result)
                reached = ", ".join(
                    f"{t}: {v['frames']:,} frames, {v['seconds']:,} s" for t, v in result["reached"].items()
                )
                print(f"seed {run.seed}: {result['frames']:,} frames; reached {reached or 'no target'}", flush=True)
    finally:  # interrupted (Ctrl+C, SIGTERM): the runs left stop as Ctrl+C stops them, keeping a checkpoint
        for run in running:
            if run.stopped_at is None:
                run.stop()
        for run in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(max(0.0, STOP_GRACE_S - (time.monotonic() - run.stopped_at)))
            run.kill()
            _await_session_end(run.proc.pid)
        for run in running:  # an interrupted seed's frames and targets so far, marked as such
            results.append({**run.finish(), "interrupted": True})
        _report(args, job, info, results)
    return 0


def _report(args: argparse.Namespace, job: list[str], info: dict, results: list[dict]) -> None:
    """summary.json, summary.md and curves.png in ``args.out``; the table and a summary line printed."""
    results.sort(key=lambda r: r["seed"])
    summary = summarize(args.targets, results)
    report = {
        "env": args.env,
        "frames_budget": args.frames,
        "job": job,
        "machine": info,
        "summary": summary,
        "runs": results,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = _table(args, job, summary, results)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table)
    plot(os.path.join(args.out, "curves.png"), args.targets, results, f"{args.env}: {shlex.join(job)}")
    print(table, flush=True)
    print("summary: " + json.dumps({"env": args.env, "summary": summary}), flush=True)


if __name__ == "__main__":
    exit_on_sigterm()  # a kill unwinds through main's finally, which stops the runs
    sys.exit(main())
