"""``Writer``: builds a trajectory table's items step by step, as Reverb's ``Writer``
(``append`` a step, ``create_item`` of the last steps), for a table whose every field
is a trajectory ``[T, *step_shape]`` with one ``T``.

The writer keeps the episode's last ``T`` steps in a history of ``2T`` rows per field
and writes step ``k`` twice, at rows ``k mod T`` and ``k mod T + T``: the last ``T``
steps are then always the contiguous rows ``[k' mod T, k' mod T + T)`` (``k'``: steps
appended), so ``create_item`` hands the table views, never a gathered copy::

    T = 3, after steps s0..s4:   rows 0..5 = s3 s4 s2 s3 s4 s2    5 mod 3 = 2: rows 2..4 = s2 s3 s4

An item never spans episodes: after ``end_episode`` the next item needs ``T`` new steps.
A step is checked whole before any of it is written, so a bad step leaves the history
as it was.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np

from shmpad._checks import check_int, type_name
from shmpad.shm.arrays import Field, as_array

__all__ = ["Writer"]


class Table(Protocol):
    """What a writer uses of the replay table it writes to (``shmpad.replay.Table``, which
    makes writers and so is imported by this module's users, never by this module)."""

    name: str
    fields: list[Field]

    def insert(self, item: Mapping[str, Any], priority: float = 1.0, timeout: float | None = None) -> int: ...


class Writer:
    """Appends steps of one episode and inserts items of its last ``T`` steps into
    ``table`` (see the module docstring); ``table.writer()`` makes one. One writer per
    episode stream: it is not shared between threads."""

    def __init__(self, table: Table):
        lengths = {f: shape[0] if shape else None for f, _, shape in table.fields}
        if None in lengths.values() or len(set(lengths.values())) != 1:
            raise ValueError(
                f"replay table {table.name!r}: a writer needs every field to be a trajectory [T, ...] with one T, "
                f"got leading sizes {lengths} (None: a scalar field)"
            )
        self.table = table
        self.sequence_length = next(iter(lengths.values()))
        """T: the steps in one item"""
        n = self.sequence_length
        self._history = {f: np.zeros((2 * n, *shape[1:]), dtype) for f, dtype, shape in table.fields}  # [2T, ...]
        self._steps = 0

    def __repr__(self) -> str:
        return f"Writer(table={self.table.name!r}, sequence_length={self.sequence_length}, steps={self._steps})"

    @property
    def episode_steps(self) -> int:
        """Steps appended since the episode began."""
        return self._steps

    def append(self, step: Mapping[str, Any]) -> None:
        """Add the next step of the episode: ``{field: array of the field's step shape}``."""
        name, fields = self.table.name, self.table.fields
        if not isinstance(step, Mapping):
            raise TypeError(f"a step must be a dict of field -> array, got {type_name(step)}")
        if len(step) != len(fields) or any(f not in step for f, _, _ in fields):
            missing = sorted(set(self._history) - set(step))
            extra = sorted(set(step) - set(self._history))
            raise ValueError(
                f"replay table {name!r}: step fields must be {sorted(self._history)}; missing {missing}, unknown {extra}"
            )
        values = []
        for f, dtype, shape in fields:
            a = as_array(step[f])
            if a.shape != shape[1:]:
                raise ValueError(
                    f"replay table {name!r}: a step's field {f!r} must have shape {shape[1:]}, got {a.shape}"
                )
            if a.dtype != dtype and not np.can_cast(a.dtype, dtype, casting="same_kind"):
                raise TypeError(f"replay table {name!r}: field {f!r} is {dtype}, got {a.dtype}")
            values.append(a)
        n = self.sequence_length
        row = self._steps % n
        for (f, _, _), a in zip(fields, values):
            history = self._history[f]
            history[row] = a
            history[row + n] = a
        self._steps += 1

    def create_item(self, priority: float = 1.0, num_timesteps: int | None = None, timeout: float | None = None) -> int:
        """Insert the episode's last ``T`` steps as one item with ``priority``; its key.
        ``num_timesteps`` (Reverb's argument), if given, must be ``T``; ``timeout`` as
        ``Table.insert``."""
        n = self.sequence_length
        if num_timesteps is not None and check_int("num_timesteps", num_timesteps, 1) != n:
            raise ValueError(
                f"replay table {self.table.name!r} holds trajectories of {n} steps, got num_timesteps={num_timesteps}"
            )
        if self._steps < n:
            raise ValueError(
                f"replay table {self.table.name!r}: an item needs {n} steps, "
                f"{self._steps} appended since the episode began"
            )
        first = self._steps % n
        return self.table.insert({f: h[first : first + n] for f, h in self._history.items()}, priority, timeout)

    def end_episode(self) -> None:
        """End the episode: the next item is made of steps appended after this."""
        self._steps = 0
