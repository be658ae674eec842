"""The trajectory schema, written once: what one environment step holds, what one
unroll of ``T`` steps holds, and how many environment frames one step is.

A *step* is what an env worker writes for one environment (``STEP_FIELDS``): the
observation, the reward and ``done`` that came with it, the action taken from it,
and the episode statistics. The env pool's shared slots hold one step per
environment (``step_fields``), the pool hands them out as a ``HalfBatch``, and the
inference adds the behaviour policy's ``logits``.

An *unroll* (``trajectory_spec``) is ``T+1`` such rows, ``[T+1, ...]`` per field, plus
for a recurrent policy the core state at the start of the unroll, one field per state
tensor (``core_state_0``, ``core_state_1``...), without a time axis. Row ``T`` of one
unroll is row 0 of the next (the learner bootstraps from it), as in torchbeast and
moolib. The learner takes ``B`` unrolls as ``[T+1, B, ...]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from actors.envs.config import EnvConfig
from actors.envs.spec import EnvSpec
from shmpad._checks import check_int

__all__ = [
    "CORE_STATE_PREFIX",
    "LAST_ACTION",
    "POLICY_VERSION",
    "STEP_FIELDS",
    "core_state_fields",
    "frames_per_step",
    "step_fields",
    "trajectory_spec",
    "unroll_length",
]

STEP_FIELDS = ("obs", "action", "reward", "done", "episode_return", "episode_step", "episode_end")
"""the fields of one environment step, in slot order"""

LAST_ACTION = "last_action"
"""the action taken before the row's observation (of the ended episode after a reset,
as torchbeast and moolib feed it; 0 before an environment's first action)"""

POLICY_VERSION = "policy_version"
"""the weight-store version of the policy that chose each row's action: the learner
turns it into the policy lag (how many updates behind the learner the actors acted)"""

CORE_STATE_PREFIX = "core_state_"
"""fields named ``core_state_<i>`` hold the ``i``-th core state tensor at the start of the unroll"""


def step_fields(spec: EnvSpec) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """``(name, dtype, shape)`` of every field of one step of ``spec``'s environments."""
    return [
        ("obs", np.dtype(spec.obs_dtype), tuple(spec.obs_shape)),  # [C, H, W] on Atari
        ("action", np.dtype(spec.action_dtype), tuple(spec.action_shape)),
        ("reward", np.dtype(np.float32), ()),  # clipped if the config asks
        ("done", np.dtype(np.uint8), ()),
        ("episode_return", np.dtype(np.float32), ()),  # unclipped
        ("episode_step", np.dtype(np.int32), ()),
        ("episode_end", np.dtype(np.uint8), ()),
    ]


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
    n = check_int("unroll_length", unroll_length, minimum=1) + 1
    if num_logits is None:
        if not spec.discrete:
            raise ValueError(f"num_logits is needed for the continuous actions of {spec.env_id!r}")
        num_logits = spec.num_actions
    num_logits = check_int("num_logits", num_logits, minimum=1)
    fields: dict[str, tuple[Any, tuple[int, ...]]] = {}
    for name, dtype, shape in step_fields(spec):
        fields[name] = (dtype.type, (n, *shape))  # [T+1, ...]
        if name == "done":
            fields["logits"] = (np.float32, (n, num_logits))  # [T+1, A], the behaviour policy's
            fields[POLICY_VERSION] = (np.int64, (n,))  # [T+1], the weight-store version that acted
        if name == "action":
            fields[LAST_ACTION] = (dtype.type, (n, *shape))  # [T+1, ...], the action before the row's observation
    for i, shape in enumerate(core_state_shapes or ()):
        shape = tuple(shape)
        if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
            raise ValueError(f"core_state_shapes must be shapes of ints >= 1, got {shape!r} for state {i}")
        fields[f"{CORE_STATE_PREFIX}{i}"] = (np.float32, tuple(int(d) for d in shape))
    return fields


def unroll_length(spec: Mapping[str, tuple[Any, tuple[int, ...]]]) -> int:
    """``T`` of a trajectory spec (its ``obs`` field is ``[T+1, ...]``)."""
    if "obs" not in spec:
        raise ValueError(f"a trajectory spec has an 'obs' field of shape [T+1, ...]; got fields {sorted(spec)}")
    return spec["obs"][1][0] - 1


def core_state_fields(spec: Mapping[str, Any]) -> list[str]:
    """The core state fields of a trajectory spec, in state order (empty for a feed-forward policy)."""
    return sorted((f for f in spec if f.startswith(CORE_STATE_PREFIX)), key=lambda f: int(f[len(CORE_STATE_PREFIX) :]))


def frames_per_step(config: EnvConfig) -> int:
    """Environment frames one agent step is: the frame skip on Atari, 1 elsewhere."""
    return config.frame_skip if config.is_atari else 1
