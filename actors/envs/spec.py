"""What an environment worker steps: the ``Env`` interface, its ``EnvSpec``, and the
seeds of its episodes (``EnvConfig`` in ``config.py`` builds environments).

Every environment, Atari or any other gymnasium id, is driven the same way so that
a worker can write its observation straight into a shared-memory slot:

    env.reset(obs_out)                           # the first observation, into obs_out
    reward, done, game_over = env.step(a, obs_out)

``reward`` is the game's own reward (summed over the frame skip), ``done`` ends the
learner's episode (game over, truncation, or a lost life when asked), ``game_over``
ends the true episode, after which the worker resets the environment. Episode
statistics and reward clipping are the worker's, so they look the same for every
environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["Env", "EnvSpec", "seed_sequence"]


@dataclass(frozen=True)
class EnvSpec:
    """Shapes and types of one environment's observation and action.

    ``num_actions`` is set for discrete actions (valid actions ``0..num_actions-1``,
    ``action_shape == ()``); ``action_low``/``action_high`` bound continuous ones."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_shape: tuple[int, ...] = ()
    action_dtype: np.dtype = np.dtype(np.int64)
    num_actions: int | None = None
    action_low: float | None = None
    action_high: float | None = None

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None

    def describe_actions(self) -> str:
        if self.discrete:
            return f"Discrete({self.num_actions}) allows 0..{self.num_actions - 1}"
        return f"Box{list(self.action_shape)} allows values in [{self.action_low}, {self.action_high}]"


class Env(Protocol):
    """One environment, writing its observations into arrays the caller owns."""

    spec: EnvSpec

    def reset(self, obs_out: np.ndarray) -> None:
        """Start a new episode and write its first observation into ``obs_out``."""

    def step(self, action: Any, obs_out: np.ndarray) -> tuple[float, bool, bool]:
        """Act, write the next observation; returns ``(reward, done, game_over)``."""

    def close(self) -> None:
        """Free what the environment holds."""


def seed_sequence(seed: int, index: int, generation: int = 0) -> np.random.SeedSequence:
    """The seeds of environment ``index`` of a pool seeded with ``seed``.

    They depend on the environment's global index, not on which worker steps it,
    so a run is reproducible for any split of the same environments into workers.
    ``generation`` counts restarts of the environment's worker: a restarted
    environment does not replay the episodes it played before its worker died."""
    return np.random.SeedSequence(seed, spawn_key=(index, generation))
