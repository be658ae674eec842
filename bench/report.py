"""How the benchmarks print their numbers: rates, ratios and target verdicts."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

__all__ = ["finish", "fmt_rate", "fmt_ratio", "print_failures", "verdict"]


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


def verdict(passed: bool | None) -> str:
    """PASS or FAIL for a target, ``n/a `` (as wide) when nothing was measured."""
    return "n/a " if passed is None else ("PASS" if passed else "FAIL")


def finish(
    targets: str, verdicts: Iterable[str], failures: list[str], started: float, out, notes: Iterable[str] = ()
) -> int:
    """A benchmark's last words: its notes, its targets with a verdict line each, the
    measurements that failed, the time it took; returns its exit status (1 when a
    measurement failed)."""
    print(file=out)
    for note in notes:
        print(f"Note: {note}", file=out)
    print(f"Targets: {targets}", file=out)
    for line in verdicts:
        print(line, file=out)
    print_failures(failures, file=out)
    print(f"\ntotal {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 1 if failures else 0
