"""shmpad's subject in ``python -m bench.replay``: a ``shmpad.replay.Table`` (``bench/replay/contract.py``)."""

from __future__ import annotations

from typing import Any

from bench.replay.contract import BATCH, CAPACITY, KINDS, make_item
from shmpad import replay

__all__ = ["ShmpadSubject"]


class ShmpadSubject:
    name = "shmpad"

    def __init__(self, kind: str, prioritized: bool):
        sampler = replay.Prioritized(0.6) if prioritized else replay.Uniform()
        self.table = replay.Table("bench", KINDS[kind], CAPACITY[kind], sampler, replay.Fifo(), replay.MinSize(1))
        self.table.insert(make_item(KINDS[kind]))  # compiles (or loads) the kernels before the fork
        self.table.sample(BATCH)

    def insert(self, item: dict) -> None:
        self.table.insert(item, priority=1.5)

    def sample(self) -> Any:
        return self.table.sample(BATCH).data

    def close(self) -> None:
        self.table.close()
