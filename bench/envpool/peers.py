"""What ``python -m bench.envpool`` measures shmpad's pool against (``bench/envpool/contract.py``):
the ceiling (plain loops, one process per core), gymnasium's ``AsyncVectorEnv``, envpool and
ale-py's ``AtariVectorEnv``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from bench.envpool.contract import RandomActions, timed

__all__ = ["run_ale_vector", "run_ceiling", "run_envpool", "run_gym_async"]


def run_ceiling(args: Any) -> tuple[float, dict]:
    from actors import EnvConfig, seed_sequence
    from shmpad.launch.process import fork

    config = EnvConfig(args.env)
    config.spec()  # compile the kernels before forking
    per_core = args.num_envs // args.cores
    read_fd, write_fd = os.pipe()
    pids = []
    for core in range(args.cores):

        def measure_one_core(core: int = core) -> None:
            envs = [config.make(seed_sequence(0, core * per_core + i)) for i in range(per_core)]
            obs = np.zeros((per_core, *envs[0].spec.obs_shape), np.uint8)
            for i, env in enumerate(envs):
                env.reset(obs[i])
            random_actions = RandomActions(envs[0].spec.num_actions, per_core, core)

            def step() -> int:
                actions = random_actions.next()
                for i, env in enumerate(envs):
                    if env.step(actions[i], obs[i])[2]:
                        env.reset(obs[i])
                return per_core * config.frame_skip

            frames, elapsed = timed(step, args.warmup, args.seconds)
            os.write(write_fd, f"{frames / elapsed}\n".encode())

        pid = fork(measure_one_core, close_fds=(read_fd,), new_group=False)
        pids.append(pid)
    os.close(write_fd)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(read_fd) as f:
        rates = [float(x) for x in f.read().split()]
    if len(rates) != args.cores:
        raise RuntimeError(f"{args.cores - len(rates)} ceiling processes failed")
    return sum(rates), {}


def _gym_atari(env_id: str):
    """Our AtariEnv as a gymnasium env (for AsyncVectorEnv)."""
    import gymnasium as gym

    from actors import EnvConfig, seed_sequence

    class PreprocessedAtari(gym.Env):
        def __init__(self, index: int):
            self._env = EnvConfig(env_id).make(seed_sequence(0, index))
            spec = self._env.spec
            self.observation_space = gym.spaces.Box(0, 255, spec.obs_shape, np.uint8)
            self.action_space = gym.spaces.Discrete(spec.num_actions)
            self._obs = np.zeros(spec.obs_shape, np.uint8)

        def reset(self, *, seed=None, options=None):
            self._env.reset(self._obs)
            return self._obs, {}

        def step(self, action):
            reward, done, over = self._env.step(action, self._obs)
            return self._obs, reward, over, False, {}

    return PreprocessedAtari


def run_gym_async(args: Any) -> tuple[float, dict]:
    import gymnasium as gym

    cls = _gym_atari(args.env)
    venv = gym.vector.AsyncVectorEnv([lambda i=i: cls(i) for i in range(args.num_envs)], shared_memory=True)
    try:
        venv.reset(seed=0)
        random_actions = RandomActions(int(venv.single_action_space.n), args.num_envs, 0)

        def step() -> int:
            venv.step(random_actions.next())
            return args.num_envs * 4

        frames, elapsed = timed(step, args.warmup, args.seconds)
    finally:
        venv.close()
    return frames / elapsed, {"processes": args.num_envs}


def run_envpool(args: Any) -> tuple[float, dict]:
    import envpool  # noqa: F401 - raises ImportError when absent: the subject is skipped

    game = args.env.split("/")[-1].split("-")[0]
    env = envpool.make(
        f"{game}-v5",
        env_type="gymnasium",
        num_envs=args.num_envs,
        batch_size=args.num_envs // 2,
        num_threads=args.cores,
        repeat_action_probability=0.0,
        noop_max=30,
        episodic_life=False,
        reward_clip=False,
        img_height=84,
        img_width=84,
        stack_num=4,
        frame_skip=4,
    )
    env.async_reset()
    random_actions = RandomActions(int(env.action_space.n), args.num_envs // 2, 0)

    def step() -> int:
        _, _, _, _, info = env.recv()
        env.send(random_actions.next()[: len(info["env_id"])], info["env_id"])
        return len(info["env_id"]) * 4

    frames, elapsed = timed(step, args.warmup, args.seconds)
    return frames / elapsed, {}


def run_ale_vector(args: Any) -> tuple[float, dict]:
    import gymnasium as gym
    from ale_py.vector_env import AtariVectorEnv

    from actors.envs.config import EnvConfig

    game = gym.spec(args.env).kwargs["game"]
    EnvConfig(args.env)
    env = AtariVectorEnv(
        game,
        args.num_envs,
        batch_size=args.num_envs // 2,
        num_threads=args.cores,
        repeat_action_probability=0.0,
        noop_max=30,
        frameskip=4,
        stack_num=4,
        img_height=84,
        img_width=84,
        grayscale=True,
        maxpool=True,
        reward_clipping=False,
        use_fire_reset=False,
        episodic_life=False,
    )
    try:
        _, info = env.reset(seed=0)
        batch = len(info["env_id"])
        random_actions = RandomActions(int(env.single_action_space.n), batch, 0)

        def step() -> int:
            env.send(random_actions.next())
            env.recv()
            return batch * 4

        frames, elapsed = timed(step, args.warmup, args.seconds)
    finally:
        env.close()
    return frames / elapsed, {"threads": args.cores}
