"""Each game's target score and the published runs it comes from, for ``python -m bench.learn.games``.

A target belongs to a game under one protocol (``actors/envs/protocol.py``): a figure published
under the envpool protocol says nothing about a run under the sticky one, so a run under another
protocol gets no target from here (give one with ``--target``) and its table names these
references as not comparable. Every figure below is as the file and commit named beside it
state it; a figure not stated there (the frames of rl_games' Breakout run) is ``None``, never
read off a picture.

What "envpool" means for a reference: EnvPool's Atari defaults (no sticky actions, the minimal
action set, up to 30 no-ops, frame skip 4, 84x84 grayscale, 4 frames stacked) with
``episodic_life`` and ``reward_clip``, as shmpad's ``envpool`` preset; ``ENVPOOL_DIFFERS`` says
where every EnvPool reference differs from shmpad all the same, and each reference's
``differs`` what else its setting changed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["ENVPOOL_DIFFERS", "TARGETS", "Reference", "Target", "references_for", "score_text", "target_for"]

ENVPOOL_DIFFERS = (
    "EnvPool presses FIRE at every reset in a game whose action set has it (since its first release, "
    "sail-sg/envpool envpool/atari/atari_env.h; from v0.7.0 as the option use_fire_reset, on by default), "
    "and with episodic life it resets after each lost life, no-ops and FIRE included; shmpad presses no "
    "FIRE and plays the no-ops at the start of a game only"
)
"""where every EnvPool reference's setting differs from shmpad's envpool protocol"""


def score_text(score: float) -> str:
    """A score as its source writes it: ``17,246.27``, ``400``, ``-20.1``."""
    return f"{score:,.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Reference:
    """One published run's figure for a game."""

    name: str
    """who ran what: the project and its script or configuration"""
    score: float
    """the score it reports (for a claim such as "400+", the number)"""
    spread: float | None
    """its +- (the standard deviation over its seeds), where stated"""
    frames: int | None
    """emulator frames (frame skip counted) at which it reports the score; None: not stated"""
    minutes: float | None
    """wall-clock minutes it took to those frames (or to the score); None: not stated"""
    seeds: int | None
    """seeds behind the figure; None: not stated"""
    protocol: str
    """the preset of ``actors/envs/protocol.py`` its setting is (see ``differs``)"""
    differs: str
    """where its setting differs from that preset beyond the module's two common differences"""
    measure: str
    """how its score is computed, and its hardware where stated"""
    source: str
    """the file(s) and commit(s) the figures are read from"""

    def describe(self) -> str:
        """``name: 430.09 +- 8.12 at 40M frames, 42.35 min, 3 seeds`` (what its source does not state says so)."""
        score = score_text(self.score) + (f" +- {score_text(self.spread)}" if self.spread is not None else "")
        frames = f" at {self.frames / 1e6:.4g}M frames" if self.frames is not None else " (frames not stated)"
        minutes = f"{self.minutes:.4g} min" if self.minutes is not None else "minutes not stated"
        seeds = f"{self.seeds} seed{'s' if self.seeds != 1 else ''}" if self.seeds is not None else "seeds not stated"
        return f"{self.name}: {score}{frames}, {minutes}, {seeds}"

    def fields(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    """A game's target score under one protocol, why that number, and its references."""

    score: float
    why: str
    references: tuple[Reference, ...]


_CLEANRL_SOURCE = (
    "vwxyzjn/cleanrl docs/benchmark/ppo_atari_envpool_xla_jax.md (scores) and "
    "docs/benchmark/ppo_atari_envpool_xla_jax_runtimes.md (minutes) at 35896b1fefa9898b904f7e09bcbe6e168e15d2a9 "
    "(unchanged at fe8d8a03c41a7ef5b523e2e354bd01c363e786bb); the 57-game command in benchmark/ppo.sh "
    "(--num-seeds 3); cleanrl/ppo_atari_envpool_xla_jax.py (total_timesteps 10,000,000 agent steps, "
    "envpool.make(..., episodic_life=True, reward_clip=True))"
)


def _cleanrl(score: float, spread: float, minutes: float) -> Reference:
    return Reference(
        name="CleanRL PPO (ppo_atari_envpool_xla_jax.py)",
        score=score,
        spread=spread,
        frames=40_000_000,
        minutes=minutes,
        seeds=3,
        protocol="envpool",
        differs=(
            "EnvPool 0.6.4 (cleanrl's poetry.lock at 42d21bd2, the commit that added the script) ends an "
            "episode at 108,000 agent steps (432,000 frames), shmpad at 108,000 frames"
        ),
        measure=(
            "per seed, the mean of the last 100 logged values of charts/avg_episodic_return (each the mean "
            "of the 8 environments' latest whole-game returns, logged every 1,024 agent steps), as "
            "openrlbenchmark/openrlbenchmark's openrlbenchmark/rlops.py computes it "
            "(metric_last_n_average_window 100, at d67da557945475e465866071765048d8ffe1aa4a); +- the standard "
            "deviation over the seeds; minutes per run to 40M frames, one GPU per run (benchmark/ppo.sh's slurm "
            "settings), the GPU's model not named there"
        ),
        source=_CLEANRL_SOURCE,
    )


_RL_GAMES_BREAKOUT = Reference(
    name="rl_games PPO (rl_games/configs/atari/ppo_breakout_envpool.yaml)",
    score=400,
    spread=None,
    frames=None,
    minutes=15,
    seeds=None,
    protocol="envpool",
    differs=(
        "rewards not clipped: its configuration sets episodic_life but not reward_clip, which EnvPool leaves "
        "off (rl_games' poetry.lock of the next day, adac4da3, pins EnvPool 0.6.1.post1: episodes end at "
        "108,000 agent steps, 432,000 frames); gamma 0.999"
    ),
    measure=(
        'stated as "Breakout-v3 15 minutes training time to achieve 400+ score" beside a picture of '
        "scores/mean, rl_games' mean whole-game score of its last 100 games; docs/ENVPOOL.md at "
        "262cf20258360ce50c4b73694210bbdc8b0d58ad says it was an RTX 3090 with rl_games <= 1.6.5; the frames "
        "at 400 are not stated (the configuration's budget: 1,500 epochs of 64 x 128 agent steps, 49.2M frames)"
    ),
    source=(
        "Denys88/rl_games docs/ATARI_ENVPOOL.md and rl_games/configs/atari/ppo_breakout_envpool.yaml at "
        "106cea3670f6e0c8abd9231bfa1d220350c9f5d2"
    ),
)

_RL_GAMES_PONG = Reference(
    name="rl_games PPO in EnvPool's demo notebook",
    score=18.07,
    spread=None,
    frames=4_259_840,
    minutes=None,
    seeds=1,
    protocol="envpool",
    differs="Pong has no lives, so episodic life changes nothing; rewards clipped by rl_games' reward shaper",
    measure=(
        "rl_games' mean return of its last 100 games, first at or above 18 at the end of epoch 130 (at most "
        "one epoch, 32,768 frames, late), one RTX 2080 Ti; the curve and how it was read: "
        "docs/results/pong-reference"
    ),
    source="sail-sg/envpool demo/envpool_demo_pong.ipynb at 9cbcd267d6ae04eef1865e061b6a2bc356c36d0b (its log)",
)


TARGETS: dict[tuple[str, str], Target] = {
    ("ALE/Pong-v5", "envpool"): Target(
        18,
        "the mean rl_games' run in EnvPool's demo first reached, at 4.26M frames",
        (_RL_GAMES_PONG, _cleanrl(20.39, 0.24, 36.7657)),
    ),
    ("ALE/Breakout-v5", "envpool"): Target(
        400,
        "rl_games' claim, 400+ in about 15 minutes; CleanRL's score at 40M frames is above it",
        (_cleanrl(430.09, 8.12, 42.3547), _RL_GAMES_BREAKOUT),
    ),
    ("ALE/SpaceInvaders-v5", "envpool"): Target(
        1188.82, "CleanRL's score at 40M frames", (_cleanrl(1188.82, 80.52, 39.4931),)
    ),
    ("ALE/Seaquest-v5", "envpool"): Target(
        1240.30, "CleanRL's score at 40M frames", (_cleanrl(1240.30, 419.36, 38.3639),)
    ),
    ("ALE/BeamRider-v5", "envpool"): Target(
        2478.44, "CleanRL's score at 40M frames", (_cleanrl(2478.44, 336.55, 42.0778),)
    ),
    ("ALE/Qbert-v5", "envpool"): Target(
        17246.27, "CleanRL's score at 40M frames", (_cleanrl(17246.27, 605.40, 40.1475),)
    ),
}
"""(game, protocol) -> its target and references"""


def target_for(game: str, protocol: str | None) -> Target | None:
    """The game's target under ``protocol`` (None: none in ``TARGETS``)."""
    return TARGETS.get((game, protocol)) if protocol is not None else None


def references_for(game: str) -> list[Reference]:
    """Every reference for ``game``, under any protocol, each once."""
    seen: list[Reference] = []
    for (name, _), target in TARGETS.items():
        seen += [r for r in target.references if name == game and r not in seen]
    return seen
