"""What bench.impala's learner reports: the progress line (with the role that bounds
the run, in words), the CSV log's columns and rows, and the learning curve.
"""

from __future__ import annotations

import csv
import math
from typing import Any

__all__ = ["CSV_COLUMNS", "bound", "last_seconds", "plot", "progress", "progress_line"]

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
]


def progress(learner: Any, trajectories, last: dict, now: float, seconds: float) -> dict:
    s = learner.statistics()
    dt = max(now - last["t"], 1e-9)
    ring = trajectories.statistics()
    row = {
        "frames": s.frames,
        "seconds": round(seconds, 2),
        "fps": round((s.frames - last["frames"]) / dt, 1),
        "mean_return": "" if math.isnan(s.mean_return) else round(s.mean_return, 3),
        "episodes": s.episodes,
        "learner_steps": s.steps,
        "steps_per_s": round((s.steps - last["steps"]) / dt, 3),
        "queue_fill": round(ring.size / ring.capacity, 3),
        "wait_fraction": round((s.wait_seconds - last["wait"]) / dt, 3),
        "learning_rate": f"{s.learning_rate:.3g}",
        "loss": round(s.last_loss.get("total", float("nan")), 4),
        "group_size": learner.accumulator.size if learner.accumulator is not None else 1,
    }
    last.update(t=now, frames=s.frames, steps=s.steps, wait=s.wait_seconds)
    return row


def progress_line(row: dict) -> str:
    ret = "-" if row["mean_return"] == "" else f"{row['mean_return']:.2f}"
    return (
        f"frames {row['frames']:>10,}  fps {row['fps']:>8,.0f}  learner steps/s {row['steps_per_s']:6.2f}  "
        f"return(100) {ret:>7}  episodes {row['episodes']:>6}  {bound(row['queue_fill'], row['wait_fraction'])}"
        + (f"  group {row['group_size']}" if row["group_size"] != 1 else "")
    )


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


def last_seconds(log_path: str) -> float:
    try:
        with open(log_path) as f:
            rows = list(csv.DictReader(f))
        return float(rows[-1]["seconds"]) if rows else 0.0
    except (OSError, KeyError, ValueError):
        return 0.0


def plot(log_path: str, png_path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log_path) as f:
        rows = [r for r in csv.DictReader(f) if r["mean_return"] != ""]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([int(r["frames"]) for r in rows], [float(r["mean_return"]) for r in rows])
    ax.set_xlabel("environment frames")
    ax.set_ylabel("mean return (last 100 episodes)")
    ax.set_title(f"IMPALA on {title}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)


# -- the program -------------------------------------------------------------------------
