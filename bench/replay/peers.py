"""What ``python -m bench.replay`` measures shmpad's tables against (``bench/replay/contract.py``):
TorchRL's ``ReplayBuffer`` on a shared ``LazyMemmapStorage``, and the ceiling.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.replay.contract import BATCH, CAPACITY, KINDS, make_item
from shmpad.shm.segment import Segment

__all__ = ["CeilingSubject", "TorchRLSubject"]


class TorchRLSubject:
    name = "torchrl"

    def __init__(self, kind: str, prioritized: bool):
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyMemmapStorage, ReplayBuffer

        if prioritized:
            from torchrl.data.replay_buffers.samplers import PrioritizedSampler

            sampler = PrioritizedSampler(CAPACITY[kind], alpha=0.6, beta=0.4)  # needs torchrl's C++ extension
        else:
            from torchrl.data.replay_buffers.samplers import RandomSampler

            sampler = RandomSampler()
        torch.set_num_threads(1)
        self.rb = ReplayBuffer(storage=LazyMemmapStorage(CAPACITY[kind]), sampler=sampler, shared=True)
        item = make_item(KINDS[kind])
        self.td = TensorDict({f: torch.from_numpy(np.asarray(a)) for f, a in item.items()}, batch_size=[])
        self.rb.add(self.td)  # makes the memmap files before the fork, so that every process shares them

    def insert(self, item: dict) -> None:
        self.rb.add(self.td)

    def sample(self) -> Any:
        return self.rb.sample(BATCH)

    def close(self) -> None:
        pass


class CeilingSubject:
    """The same bytes copied into and gathered out of shared memory, with no index."""

    name = "ceiling"

    def __init__(self, kind: str, prioritized: bool):
        spec = KINDS[kind]
        self.cap = CAPACITY[kind]
        self.seg = Segment.create(
            "bench", {}, sum(self.cap * np.dtype(d).itemsize * int(np.prod(s)) for d, s in spec.values())
        )
        self.fields = {}
        at = 0
        for f, (d, s) in spec.items():
            n = self.cap * int(np.prod(s))
            self.fields[f] = np.frombuffer(self.seg.data, dtype=d, count=n, offset=at).reshape((self.cap, *s))
            at += n * np.dtype(d).itemsize
        self.i = 0
        self.rng = np.random.default_rng()

    def insert(self, item: dict) -> None:
        slot = self.i % self.cap
        self.i += 1
        for f, a in item.items():
            self.fields[f][slot] = a

    def sample(self) -> Any:
        idx = self.rng.integers(0, self.cap, BATCH)
        return {f: np.take(a, idx, axis=0) for f, a in self.fields.items()}

    def close(self) -> None:
        self.seg.close()
