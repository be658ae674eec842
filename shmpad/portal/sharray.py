"""``SharedArray``: a numpy array in a shared-memory segment that travels by name.

Sent in a call, only its shape, dtype and segment name travel; the receiver maps the
same memory. The array that made it owns the segment and removes its name when it is
closed or garbage-collected (or its process ends); a receiver's copy only unmaps. The
segment is a shmpad segment, so the program's janitor removes it too if its owner was
SIGKILLed. (portal's own removes the name as soon as any copy is collected, in the
receiver too; here the maker's lifetime decides, so a copy in flight never loses it.)
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from shmpad._checks import check_int, type_name
from shmpad.shm.segment import Segment

__all__ = ["SharedArray"]

_KIND = "psharray"


class SharedArray:
    """``SharedArray(shape, dtype)`` makes a new zeroed array; ``SharedArray(shape,
    dtype, name)`` maps an existing one. ``.array`` (or ``result()``) is the numpy view."""

    def __init__(self, shape: Any, dtype: Any, name: str | None = None):
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shape = (shape,)
        if not isinstance(shape, (tuple, list)):
            raise TypeError(f"shape must be a tuple of ints, got {type_name(shape)}")
        shape = tuple(check_int("shape", n, minimum=0) for n in shape)
        dtype = np.dtype(dtype)
        if dtype.kind == "O":
            raise TypeError("dtype must be a numeric numpy dtype, got object")
        nbytes = math.prod(shape) * dtype.itemsize
        if name is None:
            self._segment = Segment.create(_KIND, {"shape": list(shape), "dtype": dtype.str}, nbytes)
        else:
            self._segment = Segment.attach(name, _KIND)
            if self._segment.meta.get("shape") != list(shape) or self._segment.meta.get("dtype") != dtype.str:
                seen = (self._segment.meta.get("shape"), self._segment.meta.get("dtype"))
                self._segment.close()
                raise ValueError(f"shared array {name!r} holds shape and dtype {seen}, not {(list(shape), dtype.str)}")
        self.arr = np.frombuffer(self._segment.data, dtype=dtype, count=math.prod(shape)).reshape(shape)
        weakref.finalize(self, self._segment.close)

    @property
    def name(self) -> str:
        return self._segment.name

    @property
    def array(self) -> np.ndarray:
        return self.arr

    def result(self) -> np.ndarray:
        return self.arr

    def close(self) -> None:
        """Unmap it (and remove its name, in the process that made it)."""
        self.arr = None
        self._segment.close()

    def __eq__(self, other: Any) -> Any:
        return self.arr == (other.arr if isinstance(other, SharedArray) else other)

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> tuple:
        return (self.arr.shape, self.arr.dtype.str, self.name)

    def __setstate__(self, state: tuple) -> None:
        self.__init__(*state)

    def __repr__(self) -> str:
        return f"SharedArray(shape={self.arr.shape}, dtype={self.arr.dtype}, name={self.name!r})"
