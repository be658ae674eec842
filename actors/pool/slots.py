"""The environment pool's shared segment: control lines and one slot per environment.

Environments are numbered globally ``0..B-1`` with ``B = num_workers * envs_per_worker``.
They form ``halves`` equal halves (1 or 2) of ``B / halves`` consecutive environments,
and inside a half worker ``w`` steps the ``k = envs_per_worker / halves`` consecutive
environments ``h * B / halves + w * k + j``. So the slots of a half are one contiguous
``[B / halves, ...]`` block of every field: inference reads them without a copy.

Data area of an ``"envpool"`` segment (byte offsets from its start; 64-byte lines;
``W`` = num_workers, ``H`` = halves)::

    line            written by        contents
    0               the pool          STOP: 1 asks every worker to exit
    1 + h           workers           event (seq, sleepers) the consumer sleeps on for half h
    L(w) + 0        the pool          event (seq, sleepers) worker w sleeps on
    L(w) + 1        worker w          statistics: steps, env ns, wait ns (relaxed)
    L(w) + 2 + h    the pool          ACT[w, h]: action batches sent to worker w for half h
    L(w) + 2 + H + h  worker w        OBS[w, h]: observation batches worker w finished for half h

    with L(w) = 1 + H + w * (2 + 2 * H), then the fields, each a C-contiguous
    [B, *shape] array at a 64-byte aligned offset recorded in the metadata (shmpad.shm.arrays):

    obs             [B, *obs_shape]     obs_dtype   the latest observation (the first of the
                                                    next episode after an episode ended)
    action          [B, *action_shape]  action_dtype  the next action, written by the pool
    reward          [B]  float32        the learner's reward for the last step (clipped if asked)
    done            [B]  uint8          1 when the last step ended the learner's episode
    episode_return  [B]  float32        unclipped return of the episode so far (of the ended
                                                    episode when episode_end is 1)
    episode_step    [B]  int32          agent steps of the episode so far (likewise)
    episode_end     [B]  uint8          1 when the last step ended the true episode

Protocol for half ``h`` of worker ``w``: the worker owns the half's slots while
``OBS == ACT`` and the pool while ``OBS == ACT + 1``. The worker writes every slot
of the half, then publishes ``OBS += 1``; the pool reads them, writes the actions,
then publishes ``ACT += 1``. Both counters only grow, each has one writer at a time
(a restarted worker takes over the dead one's counters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from actors.envs.spec import EnvSpec
from actors.trajectory import STEP_FIELDS, step_fields
from shmpad.shm.arrays import field_entries, map_fields
from shmpad.shm.segment import CACHE_LINE, Segment

__all__ = ["PoolSlots", "KIND", "FIELDS"]

KIND = "envpool"
_LINE_WORDS = CACHE_LINE // 8
_STOP_LINE = 0


FIELDS = STEP_FIELDS


@dataclass(frozen=True)
class _Geometry:
    num_workers: int
    envs_per_worker: int
    halves: int

    @property
    def num_envs(self) -> int:
        return self.num_workers * self.envs_per_worker

    @property
    def half_size(self) -> int:
        return self.num_envs // self.halves

    @property
    def per_worker_half(self) -> int:
        return self.envs_per_worker // self.halves

    def worker_line(self, w: int) -> int:
        return 1 + self.halves + w * (2 + 2 * self.halves)

    @property
    def control_lines(self) -> int:
        return self.worker_line(self.num_workers)

    def envs_of(self, w: int, h: int) -> range:
        start = h * self.half_size + w * self.per_worker_half
        return range(start, start + self.per_worker_half)


class PoolSlots:
    """The pool's segment mapped in this process: field arrays and control word indices.

    Word indices (into ``words``) are precomputed as int64 arrays for the kernels in
    ``actors.pool.sync``: ``act[h]`` / ``obs_count[h]`` hold the W counters of half ``h``,
    ``worker_ev`` the W worker events, ``half_ev[h]`` the consumer's event of half h.
    """

    @classmethod
    def create(cls, spec: EnvSpec, num_workers: int, envs_per_worker: int, halves: int) -> "PoolSlots":
        geo = _Geometry(num_workers, envs_per_worker, halves)
        entries, end = field_entries(step_fields(spec), geo.num_envs, start=geo.control_lines * CACHE_LINE)
        meta = {"num_workers": num_workers, "envs_per_worker": envs_per_worker, "halves": halves, "fields": entries}
        return cls(Segment.create(KIND, meta, end))

    @classmethod
    def attach(cls, name: str) -> "PoolSlots":
        return cls(Segment.attach(name, KIND))

    def __init__(self, seg: Segment):
        self.segment = seg
        meta = seg.meta
        self.geometry = geo = _Geometry(meta["num_workers"], meta["envs_per_worker"], meta["halves"])
        self.words = seg.words
        self.fields = map_fields(seg.data, meta["fields"], geo.num_envs, f"pool segment {seg.name!r}")
        base = seg.data_offset // 8  # word index of the data area
        line = lambda n: base + n * _LINE_WORDS  # noqa: E731
        h_range, w_range = range(geo.halves), range(geo.num_workers)
        self.stop_word = line(_STOP_LINE)
        self.half_ev = [line(1 + h) for h in h_range]
        self.worker_ev = np.array([line(geo.worker_line(w)) for w in w_range], np.int64)
        self.stats_word = [line(geo.worker_line(w) + 1) for w in w_range]
        self.act = [np.array([line(geo.worker_line(w) + 2 + h) for w in w_range], np.int64) for h in h_range]
        self.obs_count = [
            np.array([line(geo.worker_line(w) + 2 + geo.halves + h) for w in w_range], np.int64) for h in h_range
        ]

    def half(self, h: int) -> dict[str, np.ndarray]:
        """Views of every field over the slots of half ``h`` ([B / halves, ...])."""
        n = self.geometry.half_size
        return {name: a[h * n : (h + 1) * n] for name, a in self.fields.items()}

    @property
    def name(self) -> str:
        return self.segment.name

    def close(self) -> None:
        self.fields = {}
        self.words = None
        self.segment.close()

    def __reduce__(self) -> Any:
        return (PoolSlots.attach, (self.segment.name,))
