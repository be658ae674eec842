"""Actors: Atari and gymnasium environments, and forked workers that step them into shared memory."""

# Environments
from actors.env import Env
from actors.env import EnvConfig
from actors.env import EnvSpec
from actors.env import seed_sequence
from actors.resize import AreaResize

# The environment pool
from actors.errors import EnvWorkerError
from actors.pool import EnvPool
from actors.pool import HalfBatch
from actors.pool import PoolStatistics

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
