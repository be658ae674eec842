"""Misbehaving gymnasium environments for the actor tests, registered on import.

They wrap CartPole so that everything but the misbehaviour is ordinary; ``at_step``
counts the steps of one environment instance since it was made.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class RaisingCartPole(CartPoleEnv):
    """Raises ``ZeroDivisionError`` in step ``at_step`` (of environment ``which`` only)."""

    def __init__(self, at_step: int = 3, **kwargs):
        super().__init__(**kwargs)
        self._at, self._n = at_step, 0

    def step(self, action):
        self._n += 1
        if self._n == self._at:
            return self._explode()
        return super().step(action)

    def _explode(self):
        return 1 / 0


class WrongObsCartPole(CartPoleEnv):
    """Returns an observation of shape (3,) in step ``at_step``: its space says (4,)."""

    def __init__(self, at_step: int = 2, **kwargs):
        super().__init__(**kwargs)
        self._at, self._n = at_step, 0

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        self._n += 1
        if self._n == self._at:
            obs = np.zeros(3, np.float32)
        return obs, r, term, trunc, info


class StallingCartPole(CartPoleEnv):
    """In step ``at_step`` writes a file at ``marker`` (its pid) and sleeps ``seconds``:
    a test can act while a worker is known to be inside ``env.step``."""

    def __init__(self, marker: str = "", at_step: int = 2, seconds: float = 120.0, **kwargs):
        super().__init__(**kwargs)
        self._marker, self._at, self._seconds, self._n = marker, at_step, seconds, 0

    def step(self, action):
        self._n += 1
        if self._n == self._at and self._marker and self._first_to_stall():
            with open(self._marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(self._marker + ".tmp", self._marker)  # the marker appears with the pid in it
            time.sleep(self._seconds)
        return super().step(action)

    def _first_to_stall(self) -> bool:
        """True for exactly one environment, whichever process it is in."""
        try:
            os.close(os.open(self._marker + ".lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


for _name, _cls in [("Raising", RaisingCartPole), ("WrongObs", WrongObsCartPole), ("Stalling", StallingCartPole)]:
    if f"shmpadtest/{_name}-v0" not in gym.registry:
        gym.register(f"shmpadtest/{_name}-v0", entry_point=_cls, max_episode_steps=500)
