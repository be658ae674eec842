"""Named arrays in a segment's data area: the spec that describes them, their placement
at cache-line offsets, and the one bounds check that maps them.

A spec is ``{name: (dtype, shape)}``; ``fields_of`` checks it once into a list of
``(name, dtype, shape)``. A structure holds ``count`` rows of every field (a ring's
slots, a table's items, the pool's environments), each field one C-contiguous
``[count, *shape]`` array, so that consecutive rows are one array view::

    start                        the first byte after the structure's control lines
    offset_f                     each field on its own cache lines, in spec order:
                                 offset_{f+1} = round_up(offset_f + count * bytes_f, CACHE_LINE)

``field_entries`` records ``[name, dtype string, shape, offset]`` per field, the form a
segment's metadata keeps; ``map_fields`` maps them back in any process, refusing a field
that would end past the data area (a damaged or truncated segment is a
``SegmentError``, never a read of someone else's memory).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from shmpad.errors import SegmentError
from shmpad.shm.segment import CACHE_LINE, round_up

__all__ = ["Spec", "Field", "fields_of", "place", "field_entries", "array_at", "map_fields", "as_array", "to_torch"]

Spec = Mapping[str, tuple[Any, tuple[int, ...]]]
Field = tuple[str, np.dtype, tuple[int, ...]]


def fields_of(spec: Spec) -> list[Field]:
    """The fields of ``spec`` as ``(name, dtype, shape)``, checked."""
    if not isinstance(spec, Mapping):
        raise TypeError(f"spec must be a dict of name -> (dtype, shape), got {type(spec).__name__}")
    if not spec:
        raise ValueError("spec must name at least one field, got an empty dict")
    fields = []
    for name, entry in spec.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"spec field names must be non-empty str, got {name!r}")
        try:
            dtype, shape = entry
        except (TypeError, ValueError):
            raise TypeError(f"spec[{name!r}] must be (dtype, shape), got {entry!r}") from None
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"spec[{name!r}] has an unknown dtype {dtype!r}") from None
        if dtype.hasobject or dtype.itemsize == 0:
            raise TypeError(f"spec[{name!r}] dtype must be a fixed-size numeric type, got {dtype}")
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if not all(isinstance(d, (int, np.integer)) for d in shape):
            raise TypeError(f"spec[{name!r}] shape must be ints, got {shape!r}")
        if not all(d >= 0 for d in shape):
            raise ValueError(f"spec[{name!r}] shape must be non-negative ints, got {shape!r}")
        fields.append((name, dtype, tuple(int(d) for d in shape)))
    return fields


def place(blocks: Iterable[tuple[str, int]], start: int = 0) -> tuple[dict[str, int], int]:
    """Byte offsets of named blocks of ``(name, nbytes)``, each from ``start`` on its own
    cache lines, and the offset where the next block would go (the bytes they need)."""
    offsets = {}
    at = start
    for name, nbytes in blocks:
        offsets[name] = at
        at = round_up(at + nbytes, CACHE_LINE)
    return offsets, at


def _nbytes(count: int, dtype: np.dtype, shape: tuple[int, ...]) -> int:
    return int(count) * dtype.itemsize * math.prod(shape)


def field_entries(fields: Iterable[Field], count: int, start: int = 0) -> tuple[list[list], int]:
    """The metadata entries ``[name, dtype string, shape, offset]`` placing ``count`` rows of
    every field from ``start``, and the offset after the last."""
    fields = list(fields)
    offsets, end = place(((name, _nbytes(count, dtype, shape)) for name, dtype, shape in fields), start)
    return [[name, dtype.str, list(shape), offsets[name]] for name, dtype, shape in fields], end


def array_at(data: Any, offset: int, dtype: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    """The ``[*shape]`` array of ``dtype`` at byte ``offset`` of ``data`` (a segment's data
    area), or a ``SegmentError`` naming ``what`` if it would end past it."""
    dtype = np.dtype(dtype)
    end = offset + _nbytes(1, dtype, shape)
    if offset < 0 or end > len(data):
        raise SegmentError(f"{what} is damaged: it ends at byte {end}, the data area has {len(data)} bytes")
    return np.ndarray(shape, dtype, buffer=data, offset=offset)


def map_fields(data: Any, entries: Iterable[list], count: int, what: str, base: int = 0) -> dict[str, np.ndarray]:
    """``{name: [count, *shape] array}`` of the metadata ``entries`` (``field_entries``),
    their offsets counted from byte ``base`` of ``data``; ``what`` names the structure."""
    return {
        name: array_at(data, base + offset, dstr, (count, *shape), f"{what}: field {name!r}")
        for name, dstr, shape, offset in entries
    }


def as_array(value: Any) -> np.ndarray:
    """``value`` as a numpy array: itself, a torch tensor's CPU copy or view, or ``np.asarray``."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def to_torch(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The arrays as torch tensors sharing their memory (torch is imported here, when asked)."""
    import torch

    return {f: torch.from_numpy(a) for f, a in arrays.items()}
