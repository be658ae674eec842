"""What ``statistics()`` of a ring returns."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RingStatistics"]


@dataclass(frozen=True)
class RingStatistics:
    """Counters of a ring since it was created, summed over every process that used it."""

    capacity: int
    size: int
    puts: int
    gets: int
    bytes_put: int
    bytes_got: int
    waits_full: int
    waits_empty: int
    dead_claims_skipped: int
    closed: bool
