"""Atari preprocessing semantics against a plain reference on the ALE, and the
gymnasium path's checks."""

from __future__ import annotations

import helpers.actor_envs  # noqa: F401  (registers the misbehaving environments)
import numpy as np
import pytest
from test_actors_resize import dense_area_resize

from actors.envs.config import EnvConfig
from actors.envs.spec import seed_sequence


class ReferenceAtari:
    """IMPALA/moolib preprocessing written out frame by frame on a raw ALE, seeded the
    way ``AtariEnv`` documents (ALE seed, then no-op generator, from the sequence)."""

    def __init__(
        self, game: str, seeds: np.random.SeedSequence, noop_max: int = 30, stack: int = 4, sticky: float = 0.0
    ):
        from ale_py import Action, ALEInterface, roms

        ale_seed, noop_seed = seeds.spawn(2)
        self.rng = np.random.default_rng(noop_seed)
        self.ale = ALEInterface()
        self.ale.setInt("random_seed", int(ale_seed.generate_state(1)[0] & 0x7FFFFFFF))
        self.ale.setFloat("repeat_action_probability", sticky)
        self.ale.setInt("frame_skip", 1)
        self.ale.loadROM(roms.get_rom_path(game))
        self.actions = self.ale.getMinimalActionSet()
        self.noop, self.noop_max, self.stack = Action.NOOP, noop_max, stack

    def reset(self) -> np.ndarray:
        self.ale.reset_game()
        if self.noop_max:
            for _ in range(int(self.rng.integers(1, self.noop_max + 1))):
                self.ale.act(self.noop)
        frame = dense_area_resize(self.ale.getScreenGrayscale(), 84, 84)
        self.frames = [frame] * self.stack
        return np.stack(self.frames)

    def step(self, a: int) -> tuple[np.ndarray, float]:
        screens, reward = [], 0.0
        for _ in range(4):
            reward += self.ale.act(self.actions[a])
            screens.append(self.ale.getScreenGrayscale())
        frame = dense_area_resize(np.maximum(screens[-1], screens[-2]), 84, 84)
        self.frames = self.frames[1:] + [frame]
        return np.stack(self.frames), reward


@pytest.mark.parametrize("sticky", [0.0, 0.25])
def test_pong_matches_the_reference_frame_by_frame(sticky):
    seeds = seed_sequence(5, 2)
    env = EnvConfig("ALE/Pong-v5", sticky_actions=sticky).make(seeds)
    ref = ReferenceAtari("pong", seed_sequence(5, 2), sticky=sticky)
    obs = np.zeros((4, 84, 84), np.uint8)
    env.reset(obs)
    assert np.array_equal(obs, ref.reset())
    assert env.ale.getEpisodeFrameNumber() == ref.ale.getEpisodeFrameNumber()
    rng = np.random.default_rng(0)
    rewards = 0.0
    for _ in range(120):  # past the serve, so frames differ from step to step
        a = int(rng.integers(6))
        reward, done, over = env.step(a, obs)
        expected, expected_reward = ref.step(a)
        assert (reward, done, over) == (expected_reward, False, False)
        assert np.array_equal(obs, expected)
        rewards += reward
    assert obs.std() > 0


def test_noop_starts_vary_within_bounds_and_frame_skip_is_four():
    frames = set()
    obs = np.zeros((4, 84, 84), np.uint8)
    for i in range(12):
        env = EnvConfig("ALE/Pong-v5").make(seed_sequence(0, i))
        env.reset(obs)
        n = env.ale.getEpisodeFrameNumber()
        assert 1 <= n <= 30
        frames.add(n)
        env.step(0, obs)
        assert env.ale.getEpisodeFrameNumber() == n + 4
    assert len(frames) > 3
    env = EnvConfig("ALE/Pong-v5", noop_max=0).make(seed_sequence(0, 0))
    env.reset(obs)
    assert env.ale.getEpisodeFrameNumber() == 0
    assert all(np.array_equal(obs[0], obs[k]) for k in range(4))  # the first frame fills the stack


def test_sticky_actions_change_what_an_action_does():
    """With sticky actions the ALE sometimes repeats the previous action, so the same
    actions from the same seeds lead elsewhere than without (the reference above shows
    the value reaches the ALE: frame by frame equal at 0.25)."""

    def play(sticky: float) -> np.ndarray:
        env = EnvConfig("ALE/Pong-v5", sticky_actions=sticky).make(seed_sequence(3, 0))
        obs = np.zeros(env.spec.obs_shape, np.uint8)
        env.reset(obs)
        rng = np.random.default_rng(0)
        for _ in range(200):
            env.step(int(rng.integers(env.spec.num_actions)), obs)
        return obs.copy()

    assert np.array_equal(play(0.0), play(0.0))
    assert not np.array_equal(play(0.0), play(0.5))


def test_life_loss_is_terminal_only_when_asked():
    def first_life_loss(config: EnvConfig) -> tuple[bool, bool, int]:
        env = config.make(seed_sequence(1, 0))
        obs = np.zeros(env.spec.obs_shape, np.uint8)
        env.reset(obs)
        lives = env.ale.lives()
        rng = np.random.default_rng(1)
        for _ in range(5000):
            _, done, over = env.step(int(rng.integers(env.spec.num_actions)), obs)
            if env.ale.lives() < lives:
                return done, over, env.ale.lives()
        raise AssertionError("no life lost in 5000 steps")

    assert first_life_loss(EnvConfig("ALE/Breakout-v5", terminal_on_life_loss=True))[:2] == (True, False)
    assert first_life_loss(EnvConfig("ALE/Breakout-v5"))[:2] == (False, False)


def test_action_sets_and_spec():
    assert EnvConfig("ALE/Pong-v5").spec().num_actions == 6
    spec = EnvConfig("ALE/Pong-v5", full_action_space=True, frame_stack=2, screen_size=42).spec()
    assert (spec.num_actions, spec.obs_shape, spec.obs_dtype) == (18, (2, 42, 42), np.uint8)
    cart = EnvConfig("CartPole-v1").spec()
    assert (cart.obs_shape, cart.obs_dtype, cart.num_actions) == ((4,), np.float32, 2)


def test_unknown_env_id_names_it_and_suggests():
    with pytest.raises(ValueError, match=r"unknown environment id 'ALE/Pongg-v5'; did you mean 'ALE/Pong-v5'"):
        EnvConfig("ALE/Pongg-v5")
    with pytest.raises(
        ValueError, match=r"unknown environment id 'NoSuchThing-v9' \(any id registered with gymnasium works"
    ):
        EnvConfig("NoSuchThing-v9")
    with pytest.raises(TypeError, match="env_id must be a str, got int"):
        EnvConfig(3)


def test_bad_options():
    with pytest.raises(ValueError, match="frame_skip must be >= 1, got 0"):
        EnvConfig("ALE/Pong-v5", frame_skip=0)
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=rf"sticky_actions must be a probability in \[0, 1\), got {bad}"):
            EnvConfig("ALE/Pong-v5", sticky_actions=bad)
    with pytest.raises(ValueError, match="reward_clip must be None or > 0, got -1"):
        EnvConfig("CartPole-v1", reward_clip=-1)
    with pytest.raises(ValueError, match=r"screen_size must be at most 160 \(the screen is 210x160\), got 200"):
        EnvConfig("ALE/Pong-v5", screen_size=200).spec()


def test_observation_not_matching_the_declared_space():
    env = EnvConfig("shmpadtest/WrongObs-v0", gym_kwargs={"at_step": 2}).make(seed_sequence(0, 0))
    obs = np.zeros(4, np.float32)
    env.reset(obs)
    env.step(0, obs)
    with pytest.raises(
        ValueError,
        match=r"environment 'shmpadtest/WrongObs-v0' returned an observation of shape \(3,\) and dtype float32, "
        r"but its observation space Box\(.*\) declares shape \(4,\) and dtype float32",
    ):
        env.step(0, obs)


def test_unsupported_spaces_are_refused():
    with pytest.raises(
        ValueError,
        match=r"environment 'Blackjack-v1' has observation space Tuple\(.*\); shmpad workers need a Box or Discrete",
    ):
        EnvConfig("Blackjack-v1").spec()
