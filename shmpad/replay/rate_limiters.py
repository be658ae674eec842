"""Reverb's rate limiters: when inserts and samples must wait for each other.

A rate limiter counts the inserts and samples of its table and keeps
``diff = inserts * samples_per_insert - samples`` within ``[min_diff, max_diff]``::

    an insert may go ahead   while size < min_size_to_sample (filling up), or if the
                             diff after it is <= max_diff
    a sample may go ahead    if size >= min_size_to_sample and the diff after it is
                             >= min_diff (a batch of B counts as B samples)

A call that may not go ahead waits (up to its timeout) for the other side. The
three kinds Reverb users write:

    MinSize(n)                   sample only once n items are in; never limit inserts
    SampleToInsertRatio(spi, min_size_to_sample, error_buffer)
                                 on average spi samples per insert, give or take
                                 error_buffer: diff within spi * min_size +- error_buffer
    Queue(size)                  a queue: at most `size` items not yet sampled, and a
                                 sample only of an item not sampled (use with Fifo and
                                 max_times_sampled=1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shmpad._checks import type_name

__all__ = ["RateLimiter", "MinSize", "SampleToInsertRatio", "Queue", "from_dict"]


def _number(name: str, value: object, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type_name(value)}")
    value = float(value)
    if math.isnan(value) or (not allow_inf and math.isinf(value)):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


@dataclass(frozen=True)
class RateLimiter:
    """The general form; the subclasses are the usual settings of it."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float

    def __post_init__(self) -> None:
        spi = _number("samples_per_insert", self.samples_per_insert)
        if spi <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got {spi}")
        n = self.min_size_to_sample
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"min_size_to_sample must be an int, got {type_name(n)}")
        if n < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {n}")
        lo = _number("min_diff", self.min_diff, allow_inf=True)
        hi = _number("max_diff", self.max_diff, allow_inf=True)
        if lo > hi:
            raise ValueError(f"min_diff must be <= max_diff, got {lo} > {hi}")

    def params(self) -> tuple[float, float, float, float]:
        return (
            float(self.samples_per_insert),
            float(self.min_size_to_sample),
            float(self.min_diff),
            float(self.max_diff),
        )

    def to_dict(self) -> dict:
        return {
            "samples_per_insert": self.params()[0],
            "min_size_to_sample": self.min_size_to_sample,
            "min_diff": self.params()[2],
            "max_diff": self.params()[3],
        }


def from_dict(d: dict) -> RateLimiter:
    """The rate limiter ``RateLimiter.to_dict`` described (a table's metadata, a checkpoint)."""
    return RateLimiter(d["samples_per_insert"], d["min_size_to_sample"], d["min_diff"], d["max_diff"])


def MinSize(min_size_to_sample: int) -> RateLimiter:  # noqa: N802 - Reverb's name
    """Sampling waits until the table holds ``min_size_to_sample`` items; inserts never wait."""
    return RateLimiter(1.0, min_size_to_sample, -math.inf, math.inf)


def SampleToInsertRatio(samples_per_insert: float, min_size_to_sample: int, error_buffer: float) -> RateLimiter:  # noqa: N802
    """About ``samples_per_insert`` samples per insert, with ``error_buffer`` of slack
    either way once ``min_size_to_sample`` items are in."""
    spi = _number("samples_per_insert", samples_per_insert)
    buffer = _number("error_buffer", error_buffer)
    if buffer < 0:
        raise ValueError(f"error_buffer must be >= 0, got {buffer}")
    if isinstance(min_size_to_sample, bool) or not isinstance(min_size_to_sample, int):
        raise TypeError(f"min_size_to_sample must be an int, got {type_name(min_size_to_sample)}")
    offset = spi * min_size_to_sample
    return RateLimiter(spi, min_size_to_sample, offset - buffer, offset + buffer)


def Queue(size: int) -> RateLimiter:  # noqa: N802 - Reverb's name
    """At most ``size`` items waiting to be sampled; a sample waits for an unsampled item."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, got {type_name(size)}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return RateLimiter(1.0, 1, 0.0, float(size))
