"""What ``statistics()`` of a ring returns."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RingStatistics"]


@dataclass(frozen=True)
class RingStatistics:
    """Counters of a ring since it was created, summed over every process that used it,
    and who waits on whom now.

    ``producers_waiting`` counts the producers asleep until a slot is freed, and
    ``next_slot_held_by`` is the pid of the consumer that holds the message in the slot
    the next put needs (taken as a view, or read ahead, and not yet released), else 0.
    Both non-zero: that consumer stalls the producers, even when every other message has
    been read (a ring with no unread message and a blocked ``put``). Both are set by the
    ring (``init=False``), so the counters above keep their constructor."""

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
    producers_waiting: int = field(default=0, init=False)
    next_slot_held_by: int = field(default=0, init=False)


def with_holder(stats: RingStatistics, producers_waiting: int, next_slot_held_by: int) -> RingStatistics:
    """``stats``, just made, with who waits on whom filled in."""
    # a frozen dataclass's init=False fields are set as its own __post_init__ would
    object.__setattr__(stats, "producers_waiting", producers_waiting)
    object.__setattr__(stats, "next_slot_held_by", next_slot_held_by)
    return stats
