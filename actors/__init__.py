"""Actors: Atari and gymnasium environments, and forked workers that step them into shared memory."""

# Environments
from actors.envs.env import Env
from actors.envs.env import EnvConfig
from actors.envs.env import EnvSpec
from actors.envs.env import seed_sequence
from actors.envs.resize import AreaResize

# The environment pool
from shmpad.errors import EnvWorkerError
from actors.pool.pool import EnvPool
from actors.pool.pool import HalfBatch
from actors.pool.pool import PoolStatistics

__all__ = [
    "AreaResize",
    "Env",
    "EnvConfig",
    "EnvPool",
    "EnvSpec",
    "EnvWorkerError",
    "HalfBatch",
    "PoolStatistics",
    "seed_sequence",
]
