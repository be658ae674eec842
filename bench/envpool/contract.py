"""What every subject of ``python -m bench.envpool`` is: a function ``run(args)`` (``args``: the
benchmark's ``Args``) that runs in a forked child, steps ``args.num_envs`` environments of
``args.env`` on ``args.cores`` cores with random actions (``RandomActions``) and returns
(frames per second, details) for the ``args.seconds`` counted after ``args.warmup``
(``timed``). A subject whose library is missing raises ``ImportError`` and is skipped.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["RandomActions", "timed"]


class RandomActions:
    """Uniform random actions for batches of ``batch`` environments, drawn ``block``
    batches at a time; ``next()`` is the next batch's row (a view, valid until the next call)."""

    def __init__(self, num_actions: int, batch: int, seed: int, block: int = 256):
        self._rng = np.random.default_rng(seed)
        self._shape = (block, batch)
        self._num_actions = num_actions
        self._block = self._rng.integers(0, num_actions, self._shape)
        self._row = 0

    def next(self) -> np.ndarray:
        if self._row == self._shape[0]:
            self._block = self._rng.integers(0, self._num_actions, self._shape)
            self._row = 0
        self._row += 1
        return self._block[self._row - 1]


def timed(step, warmup: float, seconds: float) -> tuple[float, float]:
    """Call ``step()`` (returns frames) for warmup + seconds; (frames, elapsed) of the counted part."""
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step()
    frames, start = 0, time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        frames += step()
    return frames, time.perf_counter() - start
