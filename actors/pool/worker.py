"""The loop an environment worker process runs (see ``actors.pool.slots`` for the protocol).

The worker serves its part of each half in turn: it waits until the pool has sent
the half's actions (``ACT[w, h]`` reaches the worker's own count), steps those
environments writing every result into their slots, and publishes ``OBS[w, h]``,
waking the pool only if that completed the half (the pool sleeps until the whole
half is there, not once per worker).
An environment whose true episode ended is reset at once; its slot then holds the
first observation of the next episode, with the ended episode's statistics.

The first batch a worker produces for a half is a *reset step*: it resets the
environments of the half instead of stepping them (ignoring any actions), so that
a worker restarted after a crash answers the batch its predecessor left unanswered
and the pool goes on. Its ``done`` is 1 after a restart (the episodes were cut) and
0 at the start of the pool.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from actors.envs.config import EnvConfig
from actors.envs.spec import seed_sequence
from actors.pool.slots import PoolSlots
from actors.pool.sync import count_short, load, publish_part, spins_for, store_stats, wait_all

__all__ = ["WorkerArgs", "run_worker"]

_SLICE_NS = 100_000_000  # a waiting worker looks at STOP and its parent this often


@dataclass(frozen=True)
class WorkerArgs:
    index: int
    generation: int
    config: EnvConfig
    seed: int
    spins: int
    parent_pid: int


def run_worker(slots: PoolSlots, args: WorkerArgs) -> None:
    """Step this worker's environments until the pool stops or the parent dies."""
    geo = slots.geometry
    w, words, f = args.index, slots.words, slots.fields
    halves = [list(geo.envs_of(w, h)) for h in range(geo.halves)]
    envs = {}
    for e in (e for half in halves for e in half):
        try:
            envs[e] = args.config.make(seed_sequence(args.seed, e, args.generation))
        except Exception as exc:
            raise RuntimeError(f"environment {e} ({args.config.env_id!r}) could not be made") from exc
    obs_views = {e: f["obs"][e] for e in envs}
    totals = {e: [0.0, 0] for e in envs}  # unclipped return, steps of the current episode
    clip = args.config.reward_clip
    count = [int(load(words, slots.obs_count[h][w])) for h in range(geo.halves)]
    reset_next = [True] * geo.halves
    own_act = [slots.act[h][w : w + 1] for h in range(geo.halves)]
    steps = env_ns = wait_ns = last_wait_ns = 0
    while True:
        for h in range(geo.halves):
            t0 = time.perf_counter_ns()
            if count_short(words, own_act[h], count[h]) != 0:
                spins = spins_for(args.spins, last_wait_ns)
                while wait_all(words, own_act[h], count[h], slots.worker_ev[w], spins, _SLICE_NS) != 0:
                    spins = 0  # woken by a slice: this wait is long
                    if load(words, slots.stop_word) != 0 or os.getppid() != args.parent_pid:
                        for env in envs.values():
                            env.close()
                        return
                last_wait_ns = time.perf_counter_ns() - t0
            t1 = time.perf_counter_ns()
            for e in halves[h]:
                tot = totals[e]
                if reset_next[h]:
                    _call(envs[e].reset, e, args, "reset", obs_views[e])
                    r, done, over = 0.0, args.generation > 0, False
                    tot[0] = tot[1] = 0
                else:
                    r, done, over = _call(envs[e].step, e, args, "step", f["action"][e], obs_views[e])
                    tot[0] += r
                    tot[1] += 1
                f["reward"][e] = r if clip is None else min(max(r, -clip), clip)
                f["done"][e] = done or over
                f["episode_return"][e] = tot[0]
                f["episode_step"][e] = tot[1]
                f["episode_end"][e] = over
                if over:
                    _call(envs[e].reset, e, args, "reset", obs_views[e])
                    tot[0] = tot[1] = 0
            reset_next[h] = False
            count[h] += 1
            t2 = time.perf_counter_ns()
            steps += len(halves[h])
            env_ns += t2 - t1
            wait_ns += t1 - t0
            store_stats(words, slots.stats_word[w], steps, env_ns, wait_ns)
            publish_part(words, slots.obs_count[h][w], count[h], slots.obs_count[h], slots.half_ev[h])


def _call(fn, e: int, args: WorkerArgs, what: str, *a):
    try:
        return fn(*a)
    except Exception as exc:
        raise RuntimeError(
            f"environment {e} ({args.config.env_id!r}, seed {args.seed}, worker generation {args.generation}) "
            f"raised in {what}()"
        ) from exc
