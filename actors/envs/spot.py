"""``shmpad/Spot-v0``: the smallest pixel task that a policy can only solve by looking.

Each step shows a 36x36 grayscale frame (``[1, 36, 36]`` uint8) with one bright 6x6 spot,
drawn at random in the left or the right half; action 0 says "left", 1 says "right"; a
right answer earns 1. An episode is 20 steps, so random play scores 10 and a policy that
reads the frame scores 20. It exists so that a test can show, in under a minute on two
cores, that pixels reach a convolutional torso and V-trace learns from them, which
CartPole's vector observations never exercise. Registered with gymnasium on import.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["ENV_ID", "SpotEnv"]

ENV_ID = "shmpad/Spot-v0"
SIZE, SPOT, STEPS = 36, 6, 20


class SpotEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (1, SIZE, SIZE), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self._t = 0
        self._side = 0
        self._frame = np.zeros((1, SIZE, SIZE), np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action: Any):
        reward = float(int(action) == self._side)
        self._t += 1
        return self._draw(), reward, False, self._t >= STEPS, {}

    def _draw(self) -> np.ndarray:
        rng = self.np_random
        self._side = int(rng.integers(2))
        y = int(rng.integers(0, SIZE - SPOT))
        x = int(rng.integers(0, SIZE // 2 - SPOT)) + self._side * SIZE // 2
        self._frame[...] = 0
        self._frame[0, y : y + SPOT, x : x + SPOT] = 255
        return self._frame.copy()


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=SpotEnv)
