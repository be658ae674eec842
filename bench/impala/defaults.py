"""Every default of ``python -m bench.impala`` that depends on the environment or the
algorithm, in one table, and the rule that reads it:

1. ``--env``, ``--algo`` and ``--protocol`` are read first; the algorithm not given is the
   env family's (``FAMILY_ALGO``).
2. Every row of ``ROWS`` whose family and algorithm match (``*``: any) applies, top to
   bottom, a later row over an earlier one; on Atari the protocol's preset comes last.
3. The result becomes the parser's defaults, so ``--help`` shows what will run, and the
   command line wins over all of it. ``Args``' own values (``bench/impala/options.py``) are
   what this gives the default command, Pong with APPO (a test checks it).

The two algorithm rows name every setting that differs between the algorithms, so what an
algorithm runs never depends on the other's values. The machine plan (``plan.py``) sizes
the machine only: actors, workers, threads, compiling, precision, pinning.
"""

from __future__ import annotations

from typing import Any

from actors.envs.protocol import PROTOCOLS

__all__ = ["FAMILY_ALGO", "ROWS", "algo_for", "defaults_for", "switched_on"]

IMPALA = dict(
    # IMPALA's Atari settings as moolib runs them (Espeholt et al. 2018; moolib's examples/atari)
    algo="impala",
    unroll_length=20,
    batch_size=32,
    learning_rate=6e-4,
    entropy_cost=6e-4,
    baseline_cost=0.5,
    grad_norm_clip=40.0,
    vtrace_lambda=1.0,
    init="torch",
    normalize_input=False,
    # APPO's own settings, unused by IMPALA's one step per batch
    epochs=1,
    minibatches=1,
    clip=0.1,
    value_clip=0.0,
    kl_target=0.0,
)

PPO = dict(
    IMPALA,
    # PPO's Atari settings (Schulman et al. 2017, table 5; OpenAI baselines' ppo2 atari()): learning rate
    # 2.5e-4, entropy 0.01, GAE lambda 0.95 (here V-trace's lambda), gradient norm 0.5; the rest IMPALA's
    algo="appo",
    learning_rate=2.5e-4,
    entropy_cost=0.01,
    grad_norm_clip=0.5,
    vtrace_lambda=0.95,
    epochs=4,
    minibatches=2,
)

RL_GAMES_ATARI = dict(
    # rl_games' PPO on Pong (the EnvPool demo notebook, docs/results/pong-reference): 64 environments x 128
    # steps, 4 epochs of 4 minibatches, learning rate 3e-4 adapted to a KL of 0.01 per step, clip 0.2, no
    # value clipping, GAE lambda 0.95 (here V-trace's), critic weight 2, gradient norm 1, PPO's orthogonal
    # weights and standardised pixels. Without --normalize-input the same run did not learn (-20.4 at 1.93M
    # frames: the KL stayed low and the adaptive rate sat at its cap), docs/results/pong-rl-games-cpu. With
    # it, +18 at a median of 3.41M frames over 3 seeds, against -20.7 at 4M for IMPALA's settings. Every
    # APPO Pong run kept had 4 epochs; fewer are not measured per frame.
    unroll_length=128,
    batch_size=64,
    epochs=4,
    minibatches=4,
    learning_rate=3e-4,
    kl_target=0.01,
    entropy_cost=0.01,
    clip=0.2,
    value_clip=0.0,
    vtrace_lambda=0.95,
    grad_norm_clip=1.0,
    baseline_cost=2.0,
    init="orthogonal",
    normalize_input=True,
)

CLASSIC_CONTROL = dict(
    # The settings tests/test_bench_impala.py's CartPole run learns with (its actors use 16 envs per worker).
    model="mlp",
    total_frames=750_000,
    learning_rate=0.003,
    discount=0.98,
    entropy_cost=0.01,
    batch_size=16,
    # The MLP's update is short, so publishing after every one costs the learner fed from the ring
    # a share of its rate; publishing every 10 ms keeps the policy lag low all the same.
    # `python -m bench.impala.throughput --env CartPole-v1 --publish-seconds 0` against
    # `--publish-seconds 0.01` (its learner subjects, bench.impala.learner_cost) measures the rate;
    # no kept figure yet, see docs/benchmarks.md.
    publish_seconds=0.01,
)

ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("*", "impala", IMPALA),
    ("*", "appo", PPO),
    ("classic_control", "*", CLASSIC_CONTROL),
    ("atari", "appo", RL_GAMES_ATARI),
]
"""(env family, algorithm, values): the rows of the rule above, in its order"""

FAMILY_ALGO = {"atari": "appo", "classic_control": "impala", "other": "impala"}
"""each env family's algorithm, on one host and in a group (--peers). APPO with rl_games' settings
learns Pong per frame where IMPALA's did not (``RL_GAMES_ATARI``); in a group every minibatch step
is one reduction of the group's gradients (``learners.appo``). 2 hosts given --batch-size 32 each
(the group's batch one host's) learned Pong per frame as one host did (docs/results/pong-hosts-appo);
with the default batch per host, a group of N steps on N times one host's batch, not measured per frame."""


def algo_for(family: str, algo: str | None) -> str:
    """The algorithm a job runs: ``algo`` where given, else the family's."""
    return algo or FAMILY_ALGO.get(family, "impala")


def defaults_for(family: str, algo: str, protocol: str = "envpool") -> dict[str, Any]:
    """The defaults of a job in ``family`` running ``algo`` (on Atari, under ``protocol``):
    ``ROWS`` applied in order, then the protocol's preset."""
    values: dict[str, Any] = {}
    for row_family, row_algo, row in ROWS:
        if row_family in ("*", family) and row_algo in ("*", algo):
            values.update(row)
    if family == "atari" and protocol in PROTOCOLS:
        values.update(PROTOCOLS[protocol].fields(), protocol=protocol)
    return values


def switched_on() -> set[str]:
    """The options some row or preset turns on: each gets a ``--no-`` form to turn it off."""
    presets = [p.fields() for p in PROTOCOLS.values()]
    return {name for values in [*(r for _, _, r in ROWS), *presets] for name, v in values.items() if v is True}
