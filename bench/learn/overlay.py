"""``python -m bench.learn.overlay``: several runs' learning curves against frames, in one picture.

    python -m bench.learn.overlay docs/results/pong-h200 docs/results/pong-appo-h200/pair-seed-1 \\
        --label "IMPALA" --label "APPO seed 1" --targets 18,20 --out overlay.png

Each run folder is one ``python -m bench.impala`` run's (its ``log.csv``: the learner's mean true
return over the last 100 episodes at each progress row, against frames with frame skip counted),
so runs of either algorithm, any machine and any speed compare per frame. ``--csv`` also writes the
curves' points, and the frames at which each run's logged mean first reached each target are
printed (a progress row is every few seconds, so these are at most one row late).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

__all__ = ["first_reached", "main", "read_curve"]


def read_curve(folder: str) -> list[tuple[int, float]]:
    """(frames, mean return) of a run's ``log.csv`` rows that have a mean return."""
    path = os.path.join(folder, "log.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{folder}: no log.csv (give the folder of a python -m bench.impala run)")
    with open(path) as f:
        return [(int(float(r["frames"])), float(r["mean_return"])) for r in csv.DictReader(f) if r["mean_return"]]


def first_reached(curve: list[tuple[int, float]], target: float) -> int | None:
    """The frames of the first point at or above ``target``; None if none is."""
    return next((frames for frames, mean in curve if mean >= target), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.learn.overlay",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument("runs", nargs="+", help="run folders (each with a log.csv)")
    parser.add_argument("--label", action="append", default=[], help="one label per run, in order [the folder]")
    parser.add_argument("--targets", default="18,20", help="returns drawn as lines, comma-separated [18,20]")
    parser.add_argument("--title", default="", help="the picture's title")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--csv", default="", help="also write the curves' points here")
    args = parser.parse_args(argv)
    if args.label and len(args.label) != len(args.runs):
        parser.error(f"give one --label per run: {len(args.runs)} runs, {len(args.label)} labels")
    try:
        targets = [float(t) for t in args.targets.split(",") if t]
    except ValueError:
        parser.error(f"--targets must be numbers separated by commas, got {args.targets!r}")
    labels = args.label or args.runs
    try:
        curves = [read_curve(run) for run in args.runs]
    except FileNotFoundError as e:
        parser.error(str(e))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, curve in zip(labels, curves):
        if curve:
            ax.plot([f / 1e6 for f, _ in curve], [m for _, m in curve], label=label, linewidth=1.2)
        reached = ", ".join(
            f"{t:g}: " + (f"{f:,}" if (f := first_reached(curve, t)) else "not reached") for t in targets
        )
        last = f"{curve[-1][0]:,} frames, {curve[-1][1]:g}" if curve else "no episode"
        print(f"{label}: last {last}; first reached {reached}")
    for t in targets:
        ax.axhline(t, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("frames (millions, frame skip counted)")
    ax.set_ylabel("mean return (last 100 episodes)")
    ax.set_title(args.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    plt.close(fig)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["run", "frames", "mean_return"])
            for label, curve in zip(labels, curves):
                w.writerows((label, frames, mean) for frames, mean in curve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
