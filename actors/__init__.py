"""Actors: Atari and gymnasium environments, the forked workers that step them into
shared memory, the trajectory schema, batched inference and the rollout writer.

``BatchedInference`` and ``LocalPolicyActors`` need torch and load it when first
touched; the rest of the package does not import it.
"""

from typing import Any

# Environments
from actors.envs.spec import Env
from actors.envs.config import EnvConfig
from actors.envs.spec import EnvSpec
from actors.envs.spec import seed_sequence
from actors.envs.resize import AreaResize

# The environment pool
from shmpad.errors import EnvWorkerError
from actors.pool.pool import EnvPool
from actors.pool.pool import HalfBatch
from actors.pool.pool import PoolStatistics

# Trajectories
from actors.rollout import RolloutWriter
from actors.trajectory import STEP_FIELDS
from actors.trajectory import core_state_fields
from actors.trajectory import frames_per_step
from actors.trajectory import trajectory_spec
from actors.trajectory import unroll_length

__all__ = [
    "STEP_FIELDS",
    "AreaResize",
    "BatchedInference",
    "Env",
    "EnvConfig",
    "EnvPool",
    "EnvSpec",
    "EnvWorkerError",
    "HalfBatch",
    "LocalPolicyActors",
    "PoolStatistics",
    "RolloutWriter",
    "core_state_fields",
    "frames_per_step",
    "seed_sequence",
    "trajectory_spec",
    "unroll_length",
]


def __getattr__(name: str) -> Any:
    if name == "BatchedInference":
        from actors.inference import BatchedInference

        return BatchedInference
    if name == "LocalPolicyActors":
        from actors.local import LocalPolicyActors

        return LocalPolicyActors
    raise AttributeError(f"module 'actors' has no attribute {name!r}")
