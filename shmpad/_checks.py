"""One wording of the argument checks every layer uses.

A wrong type raises ``TypeError``, a bad value ``ValueError``; both name the argument,
the value seen and what is allowed (``timeout must be a finite number of seconds >= 0
or None, got nan``). ``bool`` is never accepted as a number, and numpy's scalar types
are accepted wherever Python's are.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

__all__ = ["check_int", "check_number", "check_threshold", "check_timeout", "deadline", "type_name"]


def type_name(value: Any) -> str:
    return type(value).__name__


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` if it is an integer (Python's or numpy's, not bool) in
    ``[minimum, maximum]`` (None: unbounded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type_name(value)}")
    value = int(value)
    if minimum is not None and maximum is not None and not minimum <= value <= maximum:
        raise ValueError(f"{name} must be between {minimum} and {maximum}, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_number(name: str, value: Any, low: float, high: float | None = None) -> float:
    """``value`` as a ``float`` if it is a real number (not bool) in ``[low, high]``
    (``high=None``: no upper bound). NaN is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type_name(value)}")
    value = float(value)
    if high is None and not value >= low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_threshold(name: str, value: Any) -> float | None:
    """A clipping threshold: ``None`` (no clipping) or a number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number or None, got {type_name(value)}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0 or None, got {value}")
    return float(value)


def check_timeout(value: Any, name: str = "timeout") -> float | None:
    """A timeout in seconds: ``None`` (wait as long as it takes) or a finite number >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or None, got {type_name(value)}")
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number of seconds >= 0 or None, got {value}")
    return float(value)


def deadline(timeout: Any, name: str = "timeout") -> float | None:
    """The ``time.monotonic()`` deadline of a checked ``timeout`` (None: no deadline)."""
    seconds = check_timeout(timeout, name)
    return None if seconds is None else time.monotonic() + seconds
