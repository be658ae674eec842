"""Checks and conversions of the arguments of the rings' Python calls, and the
compiled entry points those calls use."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import typeof

from shmpad._checks import check_int as _check_int
from shmpad._checks import deadline
from shmpad.errors import Timeout, WouldBlock

__all__ = ["check_timeout", "check_int", "as_u8", "rows_u8", "fast_entry", "nowait"]


def check_timeout(timeout: Any) -> float | None:
    """The monotonic deadline of ``timeout`` seconds (None: no deadline)."""
    return deadline(timeout)


def check_int(name: str, value: Any, low: int, high: int) -> int:
    return _check_int(name, value, low, high)


def as_u8(data: Any) -> np.ndarray:
    """A 1-D uint8 view of any C-contiguous bytes-like object (no copy)."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return data.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        raise TypeError(
            f"a message must be bytes-like (bytes, bytearray, memoryview, numpy array), got {type(data).__name__}"
        ) from None


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


def nowait(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, timeout=0, **kwargs)``, raising ``WouldBlock`` where it would raise
    ``Timeout``: the ``X_nowait`` twin of a blocking ``X`` (trio's rule: ``X_nowait``
    raises ``WouldBlock``, ``X(timeout=...)`` raises ``Timeout``)."""
    try:
        return call(*args, timeout=0, **kwargs)
    except Timeout as e:
        raise WouldBlock(str(e)) from None
