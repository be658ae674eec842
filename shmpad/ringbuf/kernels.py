"""What a ring kind (``spsc.py``, ``mpmc.py``) gives ``ring.ByteRing``: its compiled operations.

Kernels take the control words (``ctl``, the data area as int64) and the pid of the
calling process, and return a result >= 0 or a code from ``layout.py``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

__all__ = ["Kernels"]


class Kernels(NamedTuple):
    """The compiled operations a ring kind provides (see each kind's module)."""

    put: Callable
    put_rows: Callable
    put_packed: Callable
    reserve: Callable
    commit: Callable
    peek: Callable
    peek_many: Callable
    take_into: Callable
    release: Callable
    watch_write: Callable
    watch_read: Callable
    holder: Callable

    @classmethod
    def of(cls, namespace: dict[str, Any]) -> Kernels:
        """A kind's kernels: the functions ``_put``, ``_put_rows``... its module defines."""
        return cls(**{field: namespace["_" + field] for field in cls._fields})
