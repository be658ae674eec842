"""What every subject of ``python -m bench.allreduce`` is (``Group``): built in the parent from the
plan (the benchmark's ``Args``) and used in every forked worker, as ``Group`` says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.common.subject import Subject

__all__ = ["SETUP_S", "TOKEN", "Group"]

TOKEN = "bench-allreduce"
# Forming a group may take this long.
SETUP_S = 60.0


class Group(Subject):
    """One allreduce implementation. In a worker: ``listen()`` returns what the others need
    to reach this rank, ``join(everyone's)`` forms the group, ``allreduce(array)`` sums
    in place, ``close()`` leaves."""

    how: str
    averages = False  # True: the result is the mean over the peers, not the sum

    def __init__(self, plan: Any):  # the benchmark's Args; a subject reads its chunk_kib
        super().__init__(plan)
        self.rank = self.peers = 0

    def listen(self, rank: int, peers: int) -> str:
        self.rank, self.peers = rank, peers
        return ""

    def join(self, addresses: list[str]) -> None:
        raise NotImplementedError

    def resize(self, array: np.ndarray) -> None:
        """Untimed, before the repetitions of each size, ``array`` being the one they use."""

    def allreduce(self, array: np.ndarray) -> None:
        raise NotImplementedError
