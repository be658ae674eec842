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

For a recurrent policy the slot also holds the core state at the start of the
unroll, one field per state tensor (``core_state_0``, ``core_state_1``...: an
LSTM's ``h`` and ``c``, each ``[layers, hidden]``): the state the policy took as
input at row 0's step, before it was zeroed for ``done[0]`` (the learner's model
zeroes it again from ``done``). These fields have no time axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from actors.envs.env import EnvSpec
from shmpad.ringbuf import TypedRing

__all__ = ["CORE_STATE_PREFIX", "RolloutWriter", "core_state_fields", "trajectory_spec"]

CORE_STATE_PREFIX = "core_state_"
"""fields named ``core_state_<i>`` hold the ``i``-th core state tensor at the start of the unroll"""


def core_state_fields(spec: dict[str, Any]) -> list[str]:
    """The core state fields of a trajectory spec, in state order (empty for a feed-forward policy)."""
    return sorted((f for f in spec if f.startswith(CORE_STATE_PREFIX)), key=lambda f: int(f[len(CORE_STATE_PREFIX) :]))


def trajectory_spec(
    spec: EnvSpec,
    unroll_length: int,
    num_logits: int | None = None,
    core_state_shapes: Sequence[Sequence[int]] | None = None,
) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """The ``TypedRing`` spec of one unroll of ``unroll_length`` steps of ``spec``'s
    environments; ``num_logits`` defaults to the number of discrete actions.
    ``core_state_shapes`` (one environment's shape of each core state tensor, e.g.
    ``[(layers, hidden), (layers, hidden)]`` for an LSTM) adds the float32 fields
    ``core_state_<i>`` holding the state at the start of the unroll."""
    if isinstance(unroll_length, bool) or not isinstance(unroll_length, (int, np.integer)) or unroll_length < 1:
        raise ValueError(f"unroll_length must be an int >= 1, got {unroll_length!r}")
    if num_logits is None:
        if not spec.discrete:
            raise ValueError(f"num_logits is needed for the continuous actions of {spec.env_id!r}")
        num_logits = spec.num_actions
    n = int(unroll_length) + 1
    fields = {
        "obs": (spec.obs_dtype, (n, *spec.obs_shape)),
        "action": (spec.action_dtype, (n, *spec.action_shape)),
        "reward": (np.float32, (n,)),
        "done": (np.uint8, (n,)),
        "logits": (np.float32, (n, int(num_logits))),
        "episode_return": (np.float32, (n,)),
        "episode_step": (np.int32, (n,)),
        "episode_end": (np.uint8, (n,)),
    }
    for i, shape in enumerate(core_state_shapes or ()):
        shape = tuple(shape)
        if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
            raise ValueError(f"core_state_shapes must be shapes of ints >= 1, got {shape!r} for state {i}")
        fields[f"{CORE_STATE_PREFIX}{i}"] = (np.float32, tuple(int(d) for d in shape))
    return fields


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
        self.unroll_length = next(iter(ring.spec.values()))[1][0] - 1
        self.timeout = timeout
        state = core_state_fields(ring.spec)
        self._staging = [
            {f: np.zeros((group_size, *shape), dtype) for f, (dtype, shape) in ring.spec.items() if f not in state}
            for _ in range(groups)
        ]
        # the core state at the start of the staged unrolls, and at the start of the next ones
        self._initial = [{f: np.zeros((group_size, *ring.spec[f][1]), ring.spec[f][0]) for f in state} for _ in range(groups)]
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
