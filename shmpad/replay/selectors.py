"""Reverb's item selectors, used as a table's sampler (which item a sample returns) and
as its remover (which item an insert into a full table evicts).

    Uniform()                     every item equally likely; probability 1 / size
    Prioritized(priority_exponent) item i with probability p_i^a / sum_j p_j^a (all
                                  priorities 0: uniform, as Reverb)
    Fifo() / Lifo()               the oldest / newest item; probability 1
    MinHeap() / MaxHeap()         the item of lowest / highest priority (ties: any of
                                  them); probability 1
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shmpad._checks import type_name

__all__ = ["Selector", "Uniform", "Prioritized", "Fifo", "Lifo", "MinHeap", "MaxHeap", "from_dict"]

UNIFORM, PRIORITIZED, FIFO, LIFO, MIN_HEAP, MAX_HEAP = range(6)


@dataclass(frozen=True)
class Selector:
    """Base of the selectors; ``code`` is what the compiled kernels switch on."""

    code = -1

    def to_dict(self) -> dict:
        return {"kind": type(self).__name__}

    @property
    def exponent(self) -> float:
        return 1.0


@dataclass(frozen=True)
class Uniform(Selector):
    code = UNIFORM


@dataclass(frozen=True)
class Prioritized(Selector):
    priority_exponent: float

    code = PRIORITIZED

    def __post_init__(self) -> None:
        a = self.priority_exponent
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            raise TypeError(f"priority_exponent must be a number, got {type_name(a)}")
        if not (math.isfinite(a) and a >= 0):
            raise ValueError(f"priority_exponent must be a finite number >= 0, got {a}")

    def to_dict(self) -> dict:
        return {"kind": "Prioritized", "priority_exponent": float(self.priority_exponent)}

    @property
    def exponent(self) -> float:
        return float(self.priority_exponent)


@dataclass(frozen=True)
class Fifo(Selector):
    code = FIFO


@dataclass(frozen=True)
class Lifo(Selector):
    code = LIFO


@dataclass(frozen=True)
class MinHeap(Selector):
    code = MIN_HEAP


@dataclass(frozen=True)
class MaxHeap(Selector):
    code = MAX_HEAP


_BY_NAME = {c.__name__: c for c in (Uniform, Prioritized, Fifo, Lifo, MinHeap, MaxHeap)}


def from_dict(d: dict) -> Selector:
    d = dict(d)
    return _BY_NAME[d.pop("kind")](**d)


def check_selector(name: str, value: object) -> Selector:
    if not isinstance(value, Selector) or type(value) is Selector:
        raise TypeError(f"{name} must be a selector ({', '.join(_BY_NAME)} from shmpad.replay), got {type_name(value)}")
    return value
