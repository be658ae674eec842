"""Atari with the preprocessing of IMPALA and moolib, on the ALE directly.

Per agent step: ``frame_skip`` emulator frames with the same action, rewards summed;
the observation is the pixel-wise max of the grayscale screens of the last two of
those frames, area-resized to ``screen_size`` squared and pushed onto a stack of
``frame_stack`` frames (oldest first). A reset starts a game and plays 1..``noop_max``
single no-op frames (a new game if those end one), then fills the whole stack with
the first frame. Each emulator frame repeats the previous action with probability
``sticky_actions`` (the ALE's own ``repeat_action_probability``). This is gymnasium's
``AtariPreprocessing`` + ``FrameStackObservation`` over ``ALE/*-v5`` with that
``repeat_action_probability``,
except that the screens go from the ALE into the stack without a Python-level copy.

With ``terminal_on_life_loss`` a lost life gives ``done`` but the game goes on, as
in DeepMind's episodic-life setting; ``game_over`` (and the worker's reset and
episode statistics) waits for the real end of the game.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actors.envs.resize import AreaResize
from actors.envs.spec import EnvSpec

__all__ = ["AtariEnv"]


class AtariEnv:
    """One Atari game, stepping into observation arrays the caller owns ([K, S, S] uint8).

    The options are ``EnvConfig``'s, which builds this (``EnvConfig.make``) and checks them;
    ``rom_kwargs`` are the game's entry in gymnasium's registry (``game``, ``mode``,
    ``difficulty``)."""

    def __init__(
        self,
        env_id: str,
        rom_kwargs: dict[str, Any],
        seeds: np.random.SeedSequence,
        *,
        full_action_space: bool,
        sticky_actions: float,
        terminal_on_life_loss: bool,
        noop_max: int,
        frame_skip: int,
        frame_stack: int,
        screen_size: int,
        max_episode_frames: int,
    ):
        from ale_py import Action, ALEInterface, LoggerMode, roms

        ALEInterface.setLoggerMode(LoggerMode.Error)
        self._noop_max = noop_max
        self._frame_skip = frame_skip
        self._terminal_on_life_loss = terminal_on_life_loss
        ale_seed, noop_seed = seeds.spawn(2)
        self._rng = np.random.default_rng(noop_seed)
        self._noop = Action.NOOP
        self.ale = ale = ALEInterface()
        ale.setInt("random_seed", int(ale_seed.generate_state(1)[0] & 0x7FFFFFFF))
        ale.setFloat("repeat_action_probability", float(sticky_actions))
        ale.setInt("frame_skip", 1)
        ale.setInt("max_num_frames_per_episode", int(max_episode_frames))
        ale.loadROM(roms.get_rom_path(rom_kwargs["game"]))
        if rom_kwargs.get("mode") is not None:
            ale.setMode(rom_kwargs["mode"])
        if rom_kwargs.get("difficulty") is not None:
            ale.setDifficulty(rom_kwargs["difficulty"])
        self._actions = list(ale.getLegalActionSet() if full_action_space else ale.getMinimalActionSet())
        h, w = ale.getScreenDims()
        size = screen_size
        if size > min(h, w):
            raise ValueError(f"screen_size must be at most {min(h, w)} (the screen is {h}x{w}), got {size}")
        self._resize = AreaResize((h, w), (size, size))
        self._screens = np.zeros((2, h, w), np.uint8)  # [newest, second newest] grayscale frames
        self._lives = 0
        self.spec = EnvSpec(
            env_id=env_id,
            obs_shape=(frame_stack, size, size),
            obs_dtype=np.dtype(np.uint8),
            num_actions=len(self._actions),
        )

    def reset(self, obs_out: np.ndarray) -> None:
        ale = self.ale
        ale.reset_game()
        if self._noop_max > 0:
            for _ in range(int(self._rng.integers(1, self._noop_max + 1))):
                ale.act(self._noop)
                if ale.game_over():
                    ale.reset_game()
        self._lives = ale.lives()
        ale.getScreenGrayscale(self._screens[0])
        self._resize.fill(obs_out, self._screens[0])

    def step(self, action: Any, obs_out: np.ndarray) -> tuple[float, bool, bool]:
        ale = self.ale
        a = self._actions[action]
        skip = self._frame_skip
        reward = 0.0
        over = False
        for t in range(skip):
            reward += ale.act(a)
            if ale.game_over():
                over = True
                break
            if t == skip - 2:
                ale.getScreenGrayscale(self._screens[1])
            elif t == skip - 1:
                ale.getScreenGrayscale(self._screens[0])
        if over:
            # The worker resets the game now; this frame is never observed.
            return reward, True, True
        self._resize.push_max(obs_out, self._screens[0], self._screens[1] if skip > 1 else self._screens[0])
        done = False
        if self._terminal_on_life_loss:
            lives = ale.lives()
            done = lives < self._lives
            self._lives = lives
        return reward, done, False

    def close(self) -> None:
        self.ale = None
