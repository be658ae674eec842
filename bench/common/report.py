"""How the benchmarks print their numbers: rates, ratios and target verdicts.

A target is what shmpad aims for on a machine like the one measured (``shmpad >= 1.5x
gloo``); a benchmark prints PASS or FAIL for each and exits with status 1 when one was
missed or a measurement failed, so a script can tell. ``--quick`` is the same in every
benchmark: one short round of every measurement, to see that it runs (its numbers are
noisy, and its verdicts mean little).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

__all__ = ["at_least", "exit_status", "finish", "fmt_rate", "fmt_ratio", "fmt_seconds", "print_failures", "verdict"]


def fmt_rate(x: float | None) -> str:
    """A rate per second, to 3 or 4 digits: ``2.53M``, ``812.4K``, ``97``; ``failed`` for None."""
    if x is None:
        return "failed"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}K"
    return f"{x:.0f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def print_failures(failures: list[str], file) -> None:
    """The measurements that failed, one per line, under a count (nothing when none did)."""
    if failures:
        print(f"\n{len(failures)} measurement(s) failed:", file=file)
        for f in failures:
            print(f"  {f}", file=file)


def fmt_seconds(x: float) -> str:
    """A duration for a summary line: ``0.4 s``, ``12 s``."""
    return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"


def exit_status(target_lines: list[str], failures: list[str], file) -> int:
    """1 when a target line says FAIL or a measurement failed (saying how many), else 0."""
    missed = sum(1 for line in target_lines if line.lstrip().startswith("FAIL"))
    if missed:
        print(f"\n{missed} target(s) missed: exit status 1", file=file)
    return 1 if missed or failures else 0


def verdict(passed: bool | None) -> str:
    """PASS or FAIL for a target, ``n/a `` (as wide) when nothing was measured."""
    return "n/a " if passed is None else ("PASS" if passed else "FAIL")


def finish(
    targets: str, verdicts: Iterable[str], failures: list[str], started: float, out, notes: Iterable[str] = ()
) -> int:
    """A benchmark's last words: its notes, its targets with a verdict line each, the
    measurements that failed, the time it took; returns its exit status (1 when a
    target was missed or a measurement failed)."""
    print(file=out)
    for note in notes:
        print(f"Note: {note}", file=out)
    print(f"Targets: {targets}", file=out)
    verdicts = list(verdicts)
    for line in verdicts:
        print(line, file=out)
    print_failures(failures, file=out)
    print(f"\ntotal {fmt_seconds(time.monotonic() - started)}", file=sys.stderr)
    return exit_status(verdicts, failures, out)


def at_least(value: float | None, bar: float, strictly: bool = False) -> bool | None:
    """A target's outcome: ``value`` at least ``bar`` (above it, ``strictly``); None when
    nothing was measured."""
    if value is None:
        return None
    return value > bar if strictly else value >= bar
