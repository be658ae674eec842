"""Play a bench.impala run's checkpoint in fresh environments and say how well it plays.

    python -m bench.evaluate docs/results/pong-h200                 # 10 episodes, sampled and greedy
    python -m bench.evaluate runs/ale-pong-v5-20250101-120000 --episodes 30 --gif pong.gif

The run's folder gives the environment and the model (``config.json``) and the weights
(``checkpoint.pt``; a file holding only ``{"model": state_dict}`` works too). Episodes
run in lockstep, one batched forward per step, with the *sampled* policy (what the
actors play) and the *greedy* one (the most likely action). Returns are the game's
true, unclipped score. One line per policy gives mean, median, min and max, and the
same figures are appended to ``eval.csv`` in the folder. ``--gif`` (needs imageio:
``pip install imageio`` or ``.[gif]``) writes the first greedy episode as an animation.
Environments are seeded from ``--seed`` on a seed stream no training run uses.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from actors import EnvConfig
from actors.envs.protocol import protocol_of
from actors.envs.spec import seed_sequence
from actors.inference import sample_actions
from bench.impala import rundir
from learners import ModelConfig

__all__ = ["EvalResult", "load_run", "play", "main"]

EVAL_SEED_STREAM = 7_777_777
"""seeds evaluation environments on their own stream: never the episodes a run trained on"""
CSV_COLUMNS = ["time", "frames", "policy", "episodes", "mean", "median", "min", "max", "seed"]
GIF_FRAMES = 1500
"""at most this many frames of the episode go into the GIF (every second agent step)"""


@dataclass(frozen=True)
class EvalResult:
    policy: str
    returns: list[float]

    def figures(self) -> dict[str, float]:
        r = self.returns
        return {"mean": statistics.fmean(r), "median": statistics.median(r), "min": min(r), "max": max(r)}


def load_run(folder: str) -> tuple[dict[str, Any], EnvConfig, torch.nn.Module, int | None]:
    """The run's settings, its environment config, its model with the checkpoint's weights,
    and the frames the checkpoint had trained on (``None`` if it does not say)."""
    config_path = os.path.join(folder, rundir.CONFIG)
    checkpoint = os.path.join(folder, rundir.CHECKPOINT)
    for path in (config_path, checkpoint):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{folder} is not a bench.impala run with a checkpoint: {path} is missing")
    with open(config_path) as f:
        config = json.load(f)
    protocol = protocol_of(config)
    env = EnvConfig(  # whole games: a lost life ends no episode here, whatever the training did
        config["env"],
        full_action_space=protocol.full_action_space,
        sticky_actions=protocol.sticky_actions,
        noop_max=protocol.noop_max,
        reward_clip=None,
    )
    spec = env.spec()
    model = ModelConfig.from_record(config).build(spec.obs_shape, spec.num_actions)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    return config, env, model.eval(), state.get("frames")


def play(
    env_config: EnvConfig,
    model: torch.nn.Module,
    episodes: int,
    greedy: bool,
    seed: int = 0,
    max_steps: int = 27_000,
    frames: list[np.ndarray] | None = None,
) -> list[float]:
    """True returns of ``episodes`` episodes, played in lockstep. An episode still running
    after ``max_steps`` agent steps counts with the score it has (ALE v5 stops a game at
    108K frames = 27K steps). With ``frames``, episode 0's screens are appended to it."""
    spec = env_config.spec()
    envs = [env_config.make(seed_sequence(seed + EVAL_SEED_STREAM, i)) for i in range(episodes)]
    obs = np.zeros((episodes, *spec.obs_shape), spec.obs_dtype)
    for env, o in zip(envs, obs):
        env.reset(o)
    returns = np.zeros(episodes)
    running = np.ones(episodes, bool)
    core = model.initial_state(episodes) if getattr(model, "use_lstm", False) else ()
    first = torch.ones(1, episodes, dtype=torch.bool)  # [1, B]: every core state starts zeroed
    # what a model with last_action_reward also sees: the previous action and the reward it earned
    inputs = {"last_action": torch.zeros(1, episodes, dtype=torch.long), "reward": torch.zeros(1, episodes)}
    if not getattr(model, "last_action_reward", False):
        inputs = {}
    generator = torch.Generator().manual_seed(seed)
    try:
        for step in range(max_steps):
            with torch.inference_mode():
                out = model(torch.from_numpy(obs)[None], first, core, **inputs)
                logits = out.policy_logits[0]  # [B, A]
                core = out.core_state
            actions = logits.argmax(-1) if greedy else sample_actions(logits, generator)
            first = torch.zeros_like(first)
            for i in np.flatnonzero(running):
                reward, _, game_over = envs[i].step(int(actions[i]), obs[i])
                if inputs:
                    inputs["last_action"][0, i] = int(actions[i])
                    inputs["reward"][0, i] = reward
                returns[i] += reward
                if game_over:
                    running[i] = False
            if frames is not None and running[0] and step % 2 == 0:
                frames.append(_screen(envs[0], obs[0]))
                if len(frames) >= GIF_FRAMES:
                    frames = None
            if not running.any():
                break
    finally:
        for env in envs:
            env.close()
    return returns.tolist()


def _screen(env: Any, obs: np.ndarray) -> np.ndarray:
    ale = getattr(env, "ale", None)
    if ale is not None:
        return ale.getScreenRGB()  # [210, 160, 3] uint8
    if obs.ndim == 3 and obs.dtype == np.uint8:
        return obs[-1]  # the newest frame of the stack
    raise ValueError(f"--gif needs a pixel environment; {env.spec.env_id!r} has observations of shape {obs.shape}")


def write_gif(frames: list[np.ndarray], path: str) -> None:
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise SystemExit("--gif needs imageio: pip install imageio (or pip install -e '.[gif]')") from None
    imageio.mimsave(path, frames, duration=1 / 30, loop=0)


def append_csv(path: str, rows: list[dict[str, Any]]) -> None:
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, CSV_COLUMNS)
        if new:
            w.writeheader()
        w.writerows(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.evaluate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", help="a bench.impala run folder (config.json and checkpoint.pt)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes per policy [10]")
    parser.add_argument("--policy", choices=("both", "sampled", "greedy"), default="both", help="[both]")
    parser.add_argument("--seed", type=int, default=0, help="seeds the environments and the sampling [0]")
    parser.add_argument("--max-steps", type=int, default=27_000, help="agent steps after which an episode is cut")
    parser.add_argument("--gif", default="", help="write the first greedy (else sampled) episode to this GIF")
    parser.add_argument("--csv", default="", help="where to append the figures [RUN/eval.csv]")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    if args.max_steps < 1:
        parser.error(f"--max-steps must be >= 1, got {args.max_steps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    try:
        config, env, model, frames_trained = load_run(args.run)
    except (FileNotFoundError, KeyError, ValueError, RuntimeError) as e:
        print(f"python -m bench.evaluate: error: {e}", file=sys.stderr)
        return 2
    policies = ["sampled", "greedy"] if args.policy == "both" else [args.policy]
    gif_policy = policies[-1]
    trained = f"{frames_trained:,} frames" if frames_trained is not None else "frames unknown"
    print(f"evaluating {args.run} ({config['env']}, model {config['model']}, {trained})", flush=True)
    if env.is_atari:
        print(protocol_of(config).describe(), flush=True)
    rows = []
    for policy in policies:
        screens: list[np.ndarray] | None = [] if args.gif and policy == gif_policy else None
        t0 = time.monotonic()
        returns = play(env, model, args.episodes, policy == "greedy", args.seed, args.max_steps, screens)
        f = EvalResult(policy, returns).figures()
        print(
            f"{policy:>8}: {args.episodes} episodes, return mean {f['mean']:.2f}  median {f['median']:.2f}  "
            f"min {f['min']:.2f}  max {f['max']:.2f}  ({time.monotonic() - t0:.0f} s)",
            flush=True,
        )
        rows.append(
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "frames": frames_trained if frames_trained is not None else "",
                "policy": policy,
                "episodes": args.episodes,
                **{k: round(v, 3) for k, v in f.items()},
                "seed": args.seed,
            }
        )
        if screens:
            write_gif(screens, args.gif)
            print(f"wrote {args.gif} ({len(screens)} frames of the first {policy} episode)", flush=True)
    csv_path = args.csv or os.path.join(args.run, "eval.csv")
    append_csv(csv_path, rows)
    print(f"appended to {csv_path}", flush=True)
    return 0
