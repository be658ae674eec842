"""What bench.impala's learner reports: the start-up line, the progress line (with the role
that bounds the run, in words), the CSV log's columns and rows, and the learning curve.
"""

from __future__ import annotations

import csv
import math
import os
import re
from typing import Any

import shmpad as lp
from bench.impala import rundir

__all__ = [
    "ACTOR_COUNTERS",
    "CSV_COLUMNS",
    "actor_counters",
    "actor_totals",
    "EPISODE_COLUMNS",
    "RunLog",
    "bound",
    "csv_header",
    "last_seconds",
    "plot",
    "progress",
    "progress_line",
    "score_range",
    "seconds_since_start",
    "startup_line",
    "startup_seconds",
]

CSV_COLUMNS = [
    "frames",
    "seconds",
    "fps",
    "mean_return",
    "episodes",
    "learner_steps",
    "steps_per_s",
    "queue_fill",
    "wait_fraction",
    "learning_rate",
    "loss",
    "group_size",
    "policy_lag",
    "env_busy",
    "inference_ms",
    "inference_share",
    "learner_ms",
    "entropy",
    "clip_fraction",
    "approx_kl",
]
EPISODE_COLUMNS = ["frames", "return", "steps"]
"""episodes.csv: every finished episode's true return and length in agent steps (frame skip not
counted), at the learner's frame count"""

SCORE_RANGES = {"Pong": (-21, 21), "Boxing": (-100, 100), "Tennis": (-24, 24), "CartPole": (0, 500)}
"""games whose score range is known: the curve's y axis spans it, so noise looks like noise"""


ACTOR_COUNTERS = ("frames", "env_s", "wait_s", "batches", "inf_wait_s", "inf_s", "rollout_s")
"""what every actor node publishes (``lp.publish_counter``), running totals: frames stepped, its env
workers' seconds stepping and waiting for actions, inference batches, and the actor loop's seconds
waiting for a half, in the network, and writing rollouts"""


STARTUP = "start-up: {:.1f} s from the command to the first learner update"
"""the line the learner prints once, after its first update: the seconds a user waits before the
job learns (imports, numba's kernels, forking, compiling, the first batch of unrolls and its update)"""
_STARTUP = re.compile(r"start-up: ([0-9.]+) s from the command to the first learner update")


def startup_line(seconds: float) -> str:
    return STARTUP.format(seconds)


def startup_seconds(text: str) -> float | None:
    """The seconds of the last start-up line in ``text`` (a run's output; a resumed run's holds one
    per stretch), or None where it has none."""
    found = _STARTUP.findall(text)
    return float(found[-1]) if found else None


def seconds_since_start() -> float:
    """How long ago this process started, from its start time in ``/proc/self/stat`` (clock ticks
    since boot, against ``/proc/uptime``), so that what ran before the first line of Python
    (the interpreter, the imports) counts; 0.0 where /proc does not say."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return 0.0


def actor_counters(pool: Any, inference: Any) -> dict[str, float]:
    """An actor's and its pool's running totals (``ACTOR_COUNTERS``), from an ``actors.EnvPool``
    and its ``actors.BatchedInference``."""
    p, s = pool.statistics(), inference.statistics()
    return {
        "frames": p.frames,
        "env_s": sum(p.worker_env_seconds),
        "wait_s": sum(p.worker_wait_seconds),
        "batches": s.batches,
        "inf_wait_s": s.wait_seconds,
        "inf_s": s.inference_seconds,
        "rollout_s": s.rollout_seconds,
    }


def actor_totals() -> dict[str, dict[str, float]]:
    """Every actor node's counters (``ACTOR_COUNTERS``), by node: ``{"actor/0": {...}, ...}``."""
    return {node: v for node, v in lp.counters().items() if node.startswith("actor/")}


def _actor_deltas(actors: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> dict[str, float]:
    """The counters' growth since ``before``, summed over actors; an actor restarted
    meanwhile (its totals began again) counts from zero."""
    out = dict.fromkeys(ACTOR_COUNTERS, 0.0)
    for node, values in actors.items():
        old = before.get(node, {})
        for k in ACTOR_COUNTERS:
            v, o = values.get(k, 0.0), old.get(k, 0.0)
            out[k] += v - o if v >= o else v
    return out


def _term(loss: dict, name: str, sign: float = 1.0) -> float | str:
    value = loss.get(name)
    return "" if value is None or math.isnan(value) else round(sign * value, 5)


def _share(part: float, whole: float, digits: int = 3) -> Any:
    return round(part / whole, digits) if whole > 0 else ""


def progress(learner: Any, trajectories, last: dict, now: float, seconds: float, actors: dict | None = None) -> dict:
    """One row of the log from the learner's statistics and, where given, the actors'
    counters (``actor_totals()``): the interval since ``last``, which it then updates."""
    s = learner.statistics()
    dt = max(now - last["t"], 1e-9)
    ring = trajectories.statistics()
    d = _actor_deltas(actors or {}, last.get("actors", {}))
    steps = s.steps - last["steps"]
    waited = s.wait_seconds - last["wait"]
    row = {
        "frames": s.frames,
        "seconds": round(seconds, 2),
        "fps": round((s.frames - last["frames"]) / dt, 1),
        "mean_return": "" if math.isnan(s.mean_return) else round(s.mean_return, 3),
        "episodes": s.episodes,
        "learner_steps": s.steps,
        "steps_per_s": round((s.steps - last["steps"]) / dt, 3),
        "queue_fill": round(ring.size / ring.capacity, 3),
        "wait_fraction": round(waited / dt, 3),
        "learning_rate": f"{s.learning_rate:.3g}",
        "loss": round(s.last_loss.get("total", float("nan")), 4),
        "group_size": learner.accumulator.size if learner.accumulator is not None else 1,
        "policy_lag": _interval_lag(s, last),
        "env_busy": _share(d["env_s"], d["env_s"] + d["wait_s"]),
        "inference_ms": round(1e3 * d["inf_s"] / d["batches"], 2) if d["batches"] else "",
        "inference_share": _share(d["inf_s"], d["inf_wait_s"] + d["inf_s"] + d["rollout_s"]),
        "learner_ms": round(1e3 * max(dt - waited, 0.0) / steps, 1) if steps else "",
        # the last update's: the policy's entropy (per step with --reduction mean, summed with sum),
        # and APPO's share of clipped ratios and KL estimate to the proximal policy, over its steps
        "entropy": _term(s.last_loss, "entropy", -1),
        "clip_fraction": _term(s.last_loss, "clip_fraction"),
        "approx_kl": _term(s.last_loss, "approx_kl"),
    }
    last.update(
        actors=actors or {},
        t=now,
        frames=s.frames,
        steps=s.steps,
        wait=s.wait_seconds,
        lag_sum=s.policy_lag_sum,
        lag_batches=s.policy_lag_batches,
    )
    return row


def _interval_lag(s: Any, last: dict) -> Any:
    batches = s.policy_lag_batches - last.get("lag_batches", 0)
    return round((s.policy_lag_sum - last.get("lag_sum", 0.0)) / batches, 2) if batches else ""


def progress_line(row: dict) -> str:
    ret = "-" if row["mean_return"] == "" else f"{row['mean_return']:.2f}"
    lag = "" if row.get("policy_lag", "") == "" else f"  lag {row['policy_lag']:.1f} upd"
    return (
        f"frames {row['frames']:>10,}  fps {row['fps']:>8,.0f}  learner steps/s {row['steps_per_s']:6.2f}  "
        f"return(100) {ret:>7}  episodes {row['episodes']:>6}  {bound(row['queue_fill'], row['wait_fraction'])}"
        + lag
        + _breakdown(row)
        + (f"  group {row['group_size']}" if row["group_size"] != 1 else "")
    )


def _breakdown(row: dict) -> str:
    """Where the time goes: env workers busy, the actors' network time, the learner's update."""
    parts = []
    if row.get("env_busy", "") != "":
        parts.append(f"env workers busy {row['env_busy']:.0%}")
    if row.get("inference_ms", "") != "":
        share = "" if row.get("inference_share", "") == "" else f" ({row['inference_share']:.0%} of the actor loop)"
        parts.append(f"inference {row['inference_ms']:.1f} ms/batch{share}")
    if row.get("learner_ms", "") != "":
        parts.append(f"learner {row['learner_ms']:.0f} ms/update")
    return ("  | " + ", ".join(parts)) if parts else ""


def bound(queue_fill: float, wait_fraction: float) -> str:
    """Which role limits the run, in words: a learner that waits for unrolls has too few
    actors behind it; a full trajectory ring means the actors wait for the learner."""
    if wait_fraction >= 0.2:
        role = "actor-bound"
    elif queue_fill >= 0.5:
        role = "learner-bound"
    else:
        role = "balanced"
    return f"{role}: queue {queue_fill:4.0%} full, learner waits {wait_fraction:4.0%}"


class RunLog:
    """A run's ``log.csv`` (a progress row per ``--log-interval``) and ``episodes.csv``
    (frames, true return and length of each finished episode), both flushed after every row.
    A resumed run appends to them, each keeping the columns it was started with."""

    def __init__(self, out: str, resume: bool) -> None:
        self.path = os.path.join(out, rundir.LOG)
        self.episodes_path = os.path.join(out, rundir.EPISODES)
        new = not (resume and os.path.exists(self.path))
        mode = "w" if new else "a"
        self._log_file = open(self.path, mode, newline="")
        self._episodes_file = open(self.episodes_path, mode, newline="")
        self._log = csv.DictWriter(self._log_file, CSV_COLUMNS if new else csv_header(self.path), extrasaction="ignore")
        self._episodes = csv.writer(self._episodes_file)
        self._episode_fields = len(EPISODE_COLUMNS if new else csv_header(self.episodes_path, EPISODE_COLUMNS))
        if new:
            self._log.writeheader()
            self._episodes.writerow(EPISODE_COLUMNS)

    def episodes(self, frames: int, episodes: list[tuple[float, int]]) -> None:
        """Finished episodes, each (true return, agent steps), at the learner's ``frames``."""
        self._episodes.writerows((frames, *episode)[: self._episode_fields] for episode in episodes)

    def row(self, row: dict) -> None:
        self._log.writerow(row)
        self._log_file.flush()
        self._episodes_file.flush()

    def close(self) -> None:
        self._log_file.close()
        self._episodes_file.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def csv_header(path: str, default: list[str] = CSV_COLUMNS) -> list[str]:
    """The columns of an existing CSV file (a log written by an older version keeps its own)."""
    with open(path, newline="") as f:
        return next(csv.reader(f), default)


def last_seconds(log_path: str) -> float:
    try:
        with open(log_path) as f:
            rows = list(csv.DictReader(f))
        return float(rows[-1]["seconds"]) if rows else 0.0
    except (OSError, KeyError, ValueError):
        return 0.0


def score_range(env_id: str) -> tuple[float, float] | None:
    for game, span in SCORE_RANGES.items():
        if game in env_id:
            return span
    return None


def plot(log_path: str, png_path: str, title: str, episodes_path: str | None = None) -> None:
    """The learning curve: every episode's return faintly (from ``episodes_path``), the
    mean of the last 100 as a line, and below it how many episodes each point stands on.
    The y axis spans the game's score range where it is known (Pong: -21..21), else at
    least 10% of the returns' own scale, so that the noise of a few episodes never looks
    like learning; the x axis starts at frame 0, so frames before the first finished
    episode show as the gap they are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    scored = [r for r in rows if r["mean_return"] != ""]
    episodes: list[tuple[int, float]] = []
    if episodes_path and os.path.exists(episodes_path):
        with open(episodes_path) as f:
            episodes = [(int(r["frames"]), float(r["return"])) for r in csv.DictReader(f)]
    fig, (ax, ax_n) = plt.subplots(2, 1, figsize=(7, 5), dpi=100, sharex=True, gridspec_kw={"height_ratios": [4, 1]})
    if episodes:
        ax.scatter(
            [e[0] for e in episodes], [e[1] for e in episodes], s=3, alpha=0.15, color="gray", lw=0, label="one episode"
        )
    xs = [int(r["frames"]) for r in scored]
    ax.plot(xs, [float(r["mean_return"]) for r in scored], color="C0", label="mean of the last 100 episodes")
    values = [e[1] for e in episodes] or [float(r["mean_return"]) for r in scored]
    span = score_range(title)
    if span is not None:
        pad = 0.03 * (span[1] - span[0])
        ax.set_ylim(span[0] - pad, span[1] + pad)
    elif values:
        lo, hi = min(values), max(values)
        half = max(hi - lo, 0.1 * max(abs(lo), abs(hi)), 1.0) / 2
        mid = (lo + hi) / 2
        ax.set_ylim(mid - 1.1 * half, mid + 1.1 * half)
    last_frames = int(rows[-1]["frames"]) if rows else 1
    ax.set_xlim(0, max(last_frames, 1))
    ax.set_ylabel("true return")
    ax.set_title(f"IMPALA on {title}")
    ax.grid(True, alpha=0.3)
    if scored or episodes:
        ax.legend(loc="upper left", fontsize=8)
    ax_n.plot(xs, [min(100, int(r["episodes"])) for r in scored], color="C1")
    ax_n.set_ylim(0, 105)
    ax_n.set_ylabel("episodes\nin mean", fontsize=8)
    ax_n.set_xlabel("environment frames")
    ax_n.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)


# -- the program -------------------------------------------------------------------------
