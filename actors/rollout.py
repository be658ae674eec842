"""Unrolls of T steps per environment, assembled into ``[T+1, ...]`` trajectory slots
(the schema is ``actors.trajectory``'s).

Environments of one group (a half of a pool, or an actor's environments) step in
lockstep, so their unrolls complete together; their rows are staged in process
memory ([envs, T+1, ...], each environment's unroll contiguous) and each finished
unroll is copied once into a slot of the trajectory ring. The learner takes them
with ``ring.get_batch(B)`` as ``[B, T+1, ...]`` arrays.

For a recurrent policy the slot's core state fields hold the state the policy took
as input at row 0's step, before it was zeroed for ``done[0]`` (the learner's model
zeroes it again from ``done``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actors.trajectory import core_state_fields, unroll_length
from shmpad.ringbuf import TypedRing

__all__ = ["RolloutWriter"]


class RolloutWriter:
    """Writes unrolls of ``groups`` groups of ``group_size`` environments into ``ring``.

    Call ``add(group, rows)`` once per step of a group, with ``rows`` a dict of
    ``[group_size, ...]`` arrays for every field of the ring's spec; every
    ``unroll_length`` calls the group's unrolls go into the ring (one slot per
    environment, in environment order). Returns how many unrolls that call wrote.
    ``timeout`` bounds each wait for a free slot; on ``Timeout`` call ``flush``.

    With core state fields, ``rows`` also holds, at every step, the core state the
    policy took as input for that step (``[group_size, ...]`` per field); it is kept
    at row 0 of an unroll and at row ``T`` (which starts the next one)."""

    def __init__(self, ring: TypedRing, groups: int, group_size: int, timeout: float | None = None):
        self.ring = ring
        self.unroll_length = unroll_length(ring.spec)
        self.timeout = timeout
        state = core_state_fields(ring.spec)
        self._staging = [
            {f: np.zeros((group_size, *shape), dtype) for f, (dtype, shape) in ring.spec.items() if f not in state}
            for _ in range(groups)
        ]
        # the core state at the start of the staged unrolls, and at the start of the next ones
        self._initial = [
            {f: np.zeros((group_size, *ring.spec[f][1]), ring.spec[f][0]) for f in state} for _ in range(groups)
        ]
        self._next_initial = [{f: np.zeros_like(b) for f, b in initial.items()} for initial in self._initial]
        self._t = [0] * groups
        self._pending: list[int | None] = [None] * groups  # next environment to write, while flushing
        self.unrolls = 0

    def add(self, group: int, rows: dict[str, Any]) -> int:
        if self._pending[group] is not None:
            raise RuntimeError(f"group {group} has unrolls not yet in the ring: call flush({group}) until it returns")
        stage, t = self._staging[group], self._t[group]
        missing = [f for f in self.ring.spec if f not in rows]
        if missing:
            raise ValueError(f"rows must hold every trajectory field {sorted(self.ring.spec)}; missing {missing}")
        for f, buf in stage.items():
            buf[:, t] = rows[f]  # [group_size, T+1, ...] <- [group_size, ...]
        if t == 0 or t == self.unroll_length:
            initial = self._initial[group] if t == 0 else self._next_initial[group]
            for f, buf in initial.items():
                buf[...] = rows[f]  # [group_size, ...]
        if t < self.unroll_length:
            self._t[group] = t + 1
            return 0
        self._pending[group] = 0
        return self.flush(group)

    def flush(self, group: int) -> int:
        """Write the group's finished unrolls that are not in the ring yet; returns how
        many it wrote. A ``Timeout`` (the ring stayed full) keeps the rest for the next call."""
        start = self._pending[group]
        if start is None:
            return 0
        stage, initial = self._staging[group], self._initial[group]
        n = len(stage["obs"])
        for i in range(start, n):
            slot = self.ring.reserve(self.timeout)
            for f, buf in stage.items():
                slot[f][...] = buf[i]
            for f, buf in initial.items():
                slot[f][...] = buf[i]
            self.ring.commit()
            self._pending[group] = i + 1
        for buf in stage.values():
            buf[:, 0] = buf[:, self.unroll_length]  # the last row starts the next unroll
        for f, buf in initial.items():
            buf[...] = self._next_initial[group][f]
        self._t[group] = 1
        self._pending[group] = None
        self.unrolls += n - start
        return n - start

    def row(self, group: int) -> int:
        """The row the group's next ``add`` fills (1 right after an unroll was written)."""
        return self._t[group]
