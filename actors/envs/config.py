"""``EnvConfig``: an environment id and its preprocessing options, checked where they
are given; ``make`` builds the Atari (``atari.py``) or gymnasium (``gym.py``) adapter,
which know only the interface in ``spec.py`` and take the options they use as values
(so that they never import this module, which imports them).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from actors.envs.spec import Env, EnvSpec

__all__ = ["EnvConfig", "ATARI_ENTRY_POINT"]

ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"


@dataclass(frozen=True)
class EnvConfig:
    """An environment id and the preprocessing options; ``make`` builds one ``Env``.

    Atari ids (those gymnasium registers to ale-py, e.g. ``"ALE/Pong-v5"``) get the
    IMPALA/moolib preprocessing, ignoring the id's own frame skip and sticky actions:
    frame skip ``frame_skip`` with the max over the last two frames, 1..``noop_max``
    no-ops after each reset, grayscale ``screen_size`` x ``screen_size`` by area
    averaging, a stack of ``frame_stack`` frames, sticky actions with probability
    ``sticky_actions`` (``protocol.py`` names the settings a result depends on). Any other
    gymnasium id is stepped as it is, with ``gym_kwargs`` passed to ``gymnasium.make``.
    """

    env_id: str
    full_action_space: bool = False
    """Atari: all 18 actions instead of the game's minimal set."""
    terminal_on_life_loss: bool = False
    """Atari: ``done`` on every lost life (the game goes on; episode statistics still count whole games)."""
    noop_max: int = 30
    """Atari: at most this many no-op frames after a reset (at least one when > 0)."""
    frame_skip: int = 4
    """Atari: emulator frames per agent step."""
    frame_stack: int = 4
    """Atari: frames per observation."""
    screen_size: int = 84
    """Atari: the side of the square grayscale observation."""
    max_episode_frames: int = 108_000
    """Atari: emulator frames after which an episode is truncated (ALE v5's default)."""
    reward_clip: float | None = None
    """Clip the learner's reward to [-reward_clip, reward_clip]; episode returns stay unclipped."""
    gym_kwargs: dict[str, Any] = field(default_factory=dict)
    """Other ids: keyword arguments for ``gymnasium.make``."""
    sticky_actions: float = 0.0
    """Atari: the probability that an emulator frame repeats the previous action (ALE's repeat_action_probability)."""

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str):
            raise TypeError(f"env_id must be a str, got {type(self.env_id).__name__}")
        for name, low in (
            ("noop_max", 0),
            ("frame_skip", 1),
            ("frame_stack", 1),
            ("screen_size", 1),
            ("max_episode_frames", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if not (isinstance(self.sticky_actions, (int, float)) and 0 <= self.sticky_actions < 1):
            raise ValueError(f"sticky_actions must be a probability in [0, 1), got {self.sticky_actions!r}")
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise ValueError(f"reward_clip must be None or > 0, got {self.reward_clip}")
        if not isinstance(self.gym_kwargs, dict):
            raise TypeError(f"gym_kwargs must be a dict, got {type(self.gym_kwargs).__name__}")
        self._registry_spec()  # an unknown id fails here, in the caller, not in a worker

    def _registry_spec(self) -> Any:
        import gymnasium as gym

        _register_atari()
        import actors.envs.spot  # noqa: F401 - registers shmpad/Spot-v0

        try:
            return gym.spec(self.env_id)
        except gym.error.Error:
            pass
        close = difflib.get_close_matches(self.env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"unknown environment id {self.env_id!r}{hint} (any id registered with gymnasium works; "
            "gymnasium.pprint_registry() lists them)"
        )

    @property
    def is_atari(self) -> bool:
        return self._registry_spec().entry_point == ATARI_ENTRY_POINT

    def make(self, seeds: np.random.SeedSequence) -> Env:
        """A new environment seeded from ``seeds`` (see ``seed_sequence``)."""
        spec = self._registry_spec()
        if spec.entry_point == ATARI_ENTRY_POINT:
            from actors.envs.atari import AtariEnv

            return AtariEnv(
                self.env_id,
                spec.kwargs,
                seeds,
                full_action_space=self.full_action_space,
                sticky_actions=self.sticky_actions,
                terminal_on_life_loss=self.terminal_on_life_loss,
                noop_max=self.noop_max,
                frame_skip=self.frame_skip,
                frame_stack=self.frame_stack,
                screen_size=self.screen_size,
                max_episode_frames=self.max_episode_frames,
            )
        from actors.envs.gym import GymEnv

        return GymEnv(self.env_id, self.gym_kwargs, seeds)

    def spec(self) -> EnvSpec:
        """The ``EnvSpec`` of the environments ``make`` builds. Builds one, resets it and
        takes a step, which also compiles the preprocessing kernels in this process
        (workers forked afterwards inherit them)."""
        env = self.make(np.random.SeedSequence(0))
        try:
            spec = env.spec
            obs = np.zeros(spec.obs_shape, spec.obs_dtype)
            env.reset(obs)
            env.step(np.zeros(spec.action_shape, spec.action_dtype) if not spec.discrete else 0, obs)
            return spec
        finally:
            env.close()


def _register_atari() -> None:
    import gymnasium as gym

    if "ALE/Pong-v5" not in gym.registry:
        import ale_py

        gym.register_envs(ale_py)
