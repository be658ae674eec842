"""Any gymnasium environment behind the ``Env`` interface (CartPole for fast tests).

The observation space must be a ``Box`` or ``Discrete`` and the action space a
``Discrete`` or ``Box``: those have fixed shapes, so their values fit fixed slots.
Every observation is checked against the declared space's shape and dtype before
it is written: an environment that breaks its own declaration is caught where it
happens, with its id and the values seen.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actors.envs.spec import EnvSpec

__all__ = ["GymEnv"]


class GymEnv:
    """A ``gymnasium.make(env_id)`` environment writing observations into caller arrays."""

    def __init__(self, env_id: str, gym_kwargs: dict[str, Any], seeds: np.random.SeedSequence):
        import gymnasium as gym
        from gymnasium import spaces

        self._env = env = gym.make(env_id, **gym_kwargs)
        self._seed: int | None = int(seeds.generate_state(1)[0] & 0x7FFFFFFF)
        obs_space, act_space = env.observation_space, env.action_space
        if isinstance(obs_space, spaces.Box):
            obs_shape, obs_dtype = tuple(obs_space.shape), np.dtype(obs_space.dtype)
        elif isinstance(obs_space, spaces.Discrete):
            obs_shape, obs_dtype = (), np.dtype(np.int64)
        else:
            env.close()
            raise ValueError(
                f"environment {env_id!r} has observation space {obs_space}; "
                "shmpad workers need a Box or Discrete observation space"
            )
        if isinstance(act_space, spaces.Discrete):
            if int(act_space.start) != 0:
                env.close()
                raise ValueError(
                    f"environment {env_id!r} has action space {act_space}; a Discrete action space must start at 0"
                )
            action = dict(num_actions=int(act_space.n))
        elif isinstance(act_space, spaces.Box):
            action = dict(
                action_shape=tuple(act_space.shape),
                action_dtype=np.dtype(act_space.dtype),
                action_low=float(np.min(act_space.low)),
                action_high=float(np.max(act_space.high)),
            )
        else:
            env.close()
            raise ValueError(
                f"environment {env_id!r} has action space {act_space}; "
                "shmpad workers need a Discrete or Box action space"
            )
        self._obs_space = obs_space
        self.spec = EnvSpec(env_id=env_id, obs_shape=obs_shape, obs_dtype=obs_dtype, **action)

    def reset(self, obs_out: np.ndarray) -> None:
        obs, _ = self._env.reset(seed=self._seed)
        self._seed = None  # later resets continue the environment's own generator
        self._write(obs, obs_out)

    def step(self, action: Any, obs_out: np.ndarray) -> tuple[float, bool, bool]:
        if self.spec.discrete:
            action = int(action)
        obs, reward, terminated, truncated, _ = self._env.step(action)
        self._write(obs, obs_out)
        over = bool(terminated or truncated)
        return float(reward), over, over

    def _write(self, obs: Any, obs_out: np.ndarray) -> None:
        spec = self.spec
        arr = np.asarray(obs)
        if arr.shape != spec.obs_shape or not np.can_cast(arr.dtype, spec.obs_dtype, casting="same_kind"):
            raise ValueError(
                f"environment {spec.env_id!r} returned an observation of shape {arr.shape} and dtype {arr.dtype}, "
                f"but its observation space {self._obs_space} declares shape {spec.obs_shape} and dtype {spec.obs_dtype}"
            )
        obs_out[...] = arr

    def close(self) -> None:
        self._env.close()
