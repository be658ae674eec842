"""``python -m bench.learn.overlay``: several runs' learning curves against frames, in one picture.

    python -m bench.learn.overlay docs/results/pong-h200 docs/results/pong-appo-h200/pair-seed-1 \\
        --label "IMPALA" --label "APPO seed 1" --targets 18,20 --out overlay.png

Each run folder is one ``python -m bench.impala`` run's (its ``log.csv``: the learner's mean true
return over the last 100 episodes at each progress row, against frames with frame skip counted),
so runs of either algorithm, any machine and any speed compare per frame. A CSV file in place of
a folder is a reference's curve (columns ``frames,mean_return``, e.g. from
``python -m bench.learn.reference``), drawn dashed. ``--csv`` also writes the
curves' points, and the frames at which each run's logged mean first reached each target are
printed (a progress row is every few seconds, so these are at most one row late).

``--marks 1M,2M,5M`` also prints a Markdown table of each run's mean at each mark: its last progress
row at or before the mark, shown only if the run went on to the mark (a run stopped short of it
has no figure there, rather than its last one). ``--median`` adds the median over the runs, to
the table and to the first frames at each target (a run that never reached a target counts as
never, above every run that did), for seeds of one setting:

    python -m bench.learn.overlay runs/learn/seed-0 runs/learn/seed-1 runs/learn/seed-2 \
        --targets 0,10,18 --marks 2M,3M,4M,5M --median --out seeds.png
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys

from bench.impala import rundir

__all__ = ["at_mark", "first_reached", "main", "parse_frames", "read_curve"]

_SUFFIX = {"K": 1_000, "M": 1_000_000}


def read_curve(folder: str) -> list[tuple[int, float]]:
    """(frames, mean return) of a run's ``log.csv`` rows that have a mean return; or of a CSV
    file's rows, with those two columns (a reference's published points, ``bench.learn.reference``)."""
    path = folder if os.path.isfile(folder) else os.path.join(folder, rundir.LOG)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{folder}: no log.csv (give the folder of a python -m bench.impala run, or a CSV of frames,mean_return)"
        )
    with open(path) as f:
        return [(int(float(r["frames"])), float(r["mean_return"])) for r in csv.DictReader(f) if r["mean_return"]]


def first_reached(curve: list[tuple[int, float]], target: float) -> int | None:
    """The frames of the first point at or above ``target``; None if none is."""
    return next((frames for frames, mean in curve if mean >= target), None)


def at_mark(curve: list[tuple[int, float]], mark: int) -> float | None:
    """The mean of the last point at or before ``mark``, if the run has a point at or past it."""
    if not curve or curve[-1][0] < mark:
        return None
    before = [mean for frames, mean in curve if frames <= mark]
    return before[-1] if before else None


def parse_frames(text: str) -> int:
    """A frame count: ``2M``, ``500K``, ``5e6`` or ``1_000_000``."""
    scale = _SUFFIX.get(text[-1:].upper(), 1)
    value = float(text[:-1] if scale > 1 else text) * scale
    if not value > 0 or value != int(value):
        raise ValueError(text)
    return int(value)


def _median(values: list[float | None]) -> float | None:
    """The median, a ``None`` counting as never (above every number)."""
    median = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(median) else median


def _marks_table(labels: list[str], curves: list, marks: list[int], median: bool) -> str:
    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:+.1f}"

    names = [f"{m / 1e6:g}M" if m >= 1e6 else f"{m:,}" for m in marks]
    rows = [[at_mark(curve, m) for m in marks] for curve in curves]
    lines = ["| run | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(marks)]
    lines += [f"| {label} | " + " | ".join(map(cell, row)) + " |" for label, row in zip(labels, rows)]
    if median:  # a run without a figure at a mark leaves the median there undefined
        col = [None if None in c else statistics.median(c) for c in zip(*rows)]
        lines.append("| median | " + " | ".join(map(cell, col)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.learn.overlay",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument("runs", nargs="+", help="run folders (each with a log.csv), or CSVs of a reference's points")
    parser.add_argument("--label", action="append", default=[], help="one label per run, in order [the folder]")
    parser.add_argument("--targets", default="18,20", help="returns drawn as lines, comma-separated [18,20]")
    parser.add_argument("--title", default="", help="the picture's title")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--csv", default="", help="also write the curves' points here")
    parser.add_argument("--marks", default="", help="frames at which to tabulate each run's mean, e.g. 2M,5M")
    parser.add_argument("--median", action="store_true", help="add the median over the runs")
    args = parser.parse_args(argv)
    try:
        marks = [parse_frames(m) for m in args.marks.split(",") if m]
    except ValueError:
        parser.error(f"--marks must be frame counts (2M, 500K, 5e6) separated by commas, got {args.marks!r}")
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
    for run, label, curve in zip(args.runs, labels, curves):
        if curve:
            style = "--" if os.path.isfile(run) else "-"
            ax.plot([f / 1e6 for f, _ in curve], [m for _, m in curve], style, label=label, linewidth=1.2)
        reached = ", ".join(
            f"{t:g}: " + (f"{f:,}" if (f := first_reached(curve, t)) else "not reached") for t in targets
        )
        last = f"{curve[-1][0]:,} frames, {curve[-1][1]:g}" if curve else "no episode"
        print(f"{label}: last {last}; first reached {reached}")
    if args.median:
        firsts = ", ".join(
            f"{t:g}: "
            + ("not reached" if (m := _median([first_reached(c, t) for c in curves])) is None else f"{m:,.0f}")
            for t in targets
        )
        print(f"median of {len(curves)} runs: first reached {firsts}")
    if marks:
        print(_marks_table(labels, curves, marks, args.median))
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
