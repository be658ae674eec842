"""Unrolls of T steps per environment, assembled into ``[T+1, ...]`` trajectory slots.

Row ``t`` of an unroll is what the agent saw and did at step ``t``: the observation,
the reward and ``done`` that came with it (for the previous action), the action
taken from it with the behaviour policy's logits, and the episode statistics of
the slot. Row ``T`` of one unroll is row ``0`` of the next (the learner bootstraps
from it), as in torchbeast and moolib.

Environments of one group (a half of a pool, or an actor's environments) step in
lockstep, so their unrolls complete together; their rows are staged in process
memory ([envs, T+1, ...], each environment's unroll contiguous) and each finished
unroll is copied once into a slot of the trajectory ring. The learner takes them
with ``ring.get_batch(B)`` as ``[B, T+1, ...]`` arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actors.env import EnvSpec
from shmpad.ringbuf import TypedRing

__all__ = ["trajectory_spec", "RolloutWriter"]


def trajectory_spec(spec: EnvSpec, unroll_length: int, num_logits: int | None = None) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """The ``TypedRing`` spec of one unroll of ``unroll_length`` steps of ``spec``'s
    environments; ``num_logits`` defaults to the number of discrete actions."""
    if isinstance(unroll_length, bool) or not isinstance(unroll_length, (int, np.integer)) or unroll_length < 1:
        raise ValueError(f"unroll_length must be an int >= 1, got {unroll_length!r}")
    if num_logits is None:
        if not spec.discrete:
            raise ValueError(f"num_logits is needed for the continuous actions of {spec.env_id!r}")
        num_logits = spec.num_actions
    n = int(unroll_length) + 1
    return {
        "obs": (spec.obs_dtype, (n, *spec.obs_shape)),
        "action": (spec.action_dtype, (n, *spec.action_shape)),
        "reward": (np.float32, (n,)),
        "done": (np.uint8, (n,)),
        "logits": (np.float32, (n, int(num_logits))),
        "episode_return": (np.float32, (n,)),
        "episode_step": (np.int32, (n,)),
        "episode_end": (np.uint8, (n,)),
    }


class RolloutWriter:
    """Writes unrolls of ``groups`` groups of ``group_size`` environments into ``ring``.

    Call ``add(group, rows)`` once per step of a group, with ``rows`` a dict of
    ``[group_size, ...]`` arrays for every field of the ring's spec; every
    ``unroll_length`` calls the group's unrolls go into the ring (one slot per
    environment, in environment order). Returns how many unrolls that call wrote.
    ``timeout`` bounds each wait for a free slot; on ``Timeout`` call ``flush``."""

    def __init__(self, ring: TypedRing, groups: int, group_size: int, timeout: float | None = None):
        self.ring = ring
        self.unroll_length = next(iter(ring.spec.values()))[1][0] - 1
        self.timeout = timeout
        self._staging = [
            {f: np.zeros((group_size, *shape), dtype) for f, (dtype, shape) in ring.spec.items()} for _ in range(groups)
        ]
        self._t = [0] * groups
        self._pending: list[int | None] = [None] * groups  # next environment to write, while flushing
        self.unrolls = 0

    def add(self, group: int, rows: dict[str, Any]) -> int:
        if self._pending[group] is not None:
            raise RuntimeError(f"group {group} has unrolls not yet in the ring: call flush({group}) until it returns")
        stage, t = self._staging[group], self._t[group]
        missing = [f for f in stage if f not in rows]
        if missing:
            raise ValueError(f"rows must hold every trajectory field {sorted(stage)}; missing {missing}")
        for f, buf in stage.items():
            buf[:, t] = rows[f]  # [group_size, T+1, ...] <- [group_size, ...]
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
        stage = self._staging[group]
        n = len(stage["obs"])
        for i in range(start, n):
            slot = self.ring.reserve(self.timeout)
            for f, buf in stage.items():
                slot[f][...] = buf[i]
            self.ring.commit()
            self._pending[group] = i + 1
        for buf in stage.values():
            buf[:, 0] = buf[:, self.unroll_length]  # the last row starts the next unroll
        self._t[group] = 1
        self._pending[group] = None
        self.unrolls += n - start
        return n - start

    def row(self, group: int) -> int:
        """The row the group's next ``add`` fills (1 right after an unroll was written)."""
        return self._t[group]
