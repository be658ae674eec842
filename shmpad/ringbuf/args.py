"""Checks and conversions of the arguments of the rings' Python calls, and the
compiled entry points those calls use."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import typeof

__all__ = ["check_timeout", "check_int", "as_u8", "rows_u8", "fast_entry"]


def check_timeout(timeout: float | None) -> float | None:
    """The monotonic deadline of ``timeout`` seconds (None: no deadline)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
    return time.monotonic() + timeout


def check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return int(value)


def as_u8(data: Any) -> np.ndarray:
    """A 1-D uint8 view of any C-contiguous bytes-like object (no copy)."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return data.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        raise TypeError(f"a message must be bytes-like (bytes, bytearray, memoryview, numpy array), got {type(data).__name__}") from None


def rows_u8(messages: np.ndarray) -> np.ndarray:
    rows = np.ascontiguousarray(messages)
    return rows.view(np.uint8).reshape(rows.shape[0], -1)


def fast_entry(dispatcher, *example_args):
    """The compiled entry point of ``dispatcher`` for arguments typed like ``example_args``.

    Calling the entry point skips numba's per-call type dispatch (about half of the
    ~250 ns a small call costs). Callers must pass exactly those types."""
    sig = tuple(typeof(a) for a in example_args)
    dispatcher.compile(sig)
    cres = dispatcher.overloads.get(sig)
    return getattr(cres, "entry_point", None) or dispatcher
