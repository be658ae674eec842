"""Frames to a score for a group of hosts: ``python docs/results/pong-hosts-appo/frames.py RUN [TARGET ...]``.

RUN is a ``python -m bench.hosts --out RUN`` folder: ``h0/log.csv``, ``h1/log.csv`` ... (each
host's ``bench.impala`` progress log: its own frames, seconds since its start, the mean return of
its last 100 games). The group's frames at a moment are the sum of every host's frames then
(each host's log interpolated linearly in seconds; the hosts started within a second of each
other). For each target it prints the first row of any host at which

- ``each``: every host's mean return (at that moment, the latest row of each) is at least the target;
- ``mean``: the mean of the hosts' mean returns is at least the target;

with the group's frames and the seconds then.
"""

from __future__ import annotations

import csv
import pathlib
import sys


def read(path: pathlib.Path) -> list[tuple[float, int, float | None]]:
    """(seconds, frames, mean_return or None) per row."""
    with path.open() as f:
        return [
            (float(r["seconds"]), int(float(r["frames"])), float(r["mean_return"]) if r["mean_return"] else None)
            for r in csv.DictReader(f)
        ]


def frames_at(rows: list[tuple[float, int, float | None]], t: float) -> float:
    """A host's frames at ``t`` seconds, linear between its rows (its last row's after them)."""
    before = (0.0, 0)
    for s, n, _ in rows:
        if s >= t:
            return before[1] + (n - before[1]) * (t - before[0]) / max(s - before[0], 1e-9)
        before = (s, n)
    return float(before[1])


def latest(rows: list[tuple[float, int, float | None]], t: float) -> float | None:
    """A host's mean return in its latest row at or before ``t``."""
    value = None
    for s, _, r in rows:
        if s > t:
            break
        value = r
    return value


def main(argv: list[str]) -> None:
    run = pathlib.Path(argv[0])
    targets = [float(x) for x in argv[1:]] or [18.0, 20.0]
    hosts = sorted(run.glob("h*/log.csv"))
    logs = [read(p) for p in hosts]
    times = sorted({s for rows in logs for s, _, _ in rows})
    print(f"{run}: {len(logs)} hosts ({', '.join(str(p.parent.name) for p in hosts)})")
    for rows, p in zip(logs, hosts):
        print(
            f"  {p.parent.name}: {len(rows)} rows, last at {rows[-1][0]:.0f} s, {rows[-1][1]:,} frames, mean return {rows[-1][2]}"
        )
    for target in targets:
        for rule in ("each", "mean"):
            hit = None
            for t in times:
                values = [latest(rows, t) for rows in logs]
                if any(v is None for v in values):
                    continue
                score = min(values) if rule == "each" else sum(values) / len(values)
                if score >= target:
                    hit = (t, sum(frames_at(rows, t) for rows in logs), values)
                    break
            if hit is None:
                print(f"{target:+.0f} ({rule}): not reached")
            else:
                t, frames, values = hit
                shown = ", ".join(f"{v:.2f}" for v in values)
                print(f"{target:+.0f} ({rule}): {frames:,.0f} group frames at {t:.0f} s (hosts' mean returns {shown})")


if __name__ == "__main__":
    main(sys.argv[1:])
