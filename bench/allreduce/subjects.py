"""shmpad's subjects in ``python -m bench.allreduce``: its ring allreduce (``Mesh().ring``), and its
gradient accumulator over each backend it has (its ring and gloo). Each is a ``Group``
(``bench/allreduce/contract.py``).
"""

from __future__ import annotations

import numpy as np

from bench.allreduce.contract import SETUP_S, TOKEN, Group
from bench.common.harness import MeasurementFailed

__all__ = ["AccumulatedGloo", "AccumulatedShmpad", "Shmpad"]


class Shmpad(Group):
    name = "shmpad"
    family = "shmpad"
    how = "Mesh().ring(key, addresses, rank).allreduce(array) on a float32 numpy array"

    def listen(self, rank: int, peers: int) -> str:
        from shmpad.net.mesh import Mesh

        super().listen(rank, peers)
        self._mesh = Mesh(token=TOKEN)
        return self._mesh.address

    def join(self, addresses: list[str]) -> None:
        from shmpad.net.allreduce import CHUNK_BYTES

        chunk = self.plan.chunk_kib << 10 or CHUNK_BYTES
        self._ring = self._mesh.ring("bench", addresses, self.rank, timeout=SETUP_S, chunk_bytes=chunk)

    def allreduce(self, array: np.ndarray) -> None:
        self._ring.allreduce(array)

    def close(self) -> None:
        if hasattr(self, "_mesh"):
            self._mesh.close()


class Accumulated(Group):
    """``shmpad.net.Accumulator(backend=...)`` end to end: the gradient (a view of the
    array) copied out, reduced, averaged and copied back; a broker in rank 0."""

    family = "accumulator"
    averages = True
    backend: str

    def listen(self, rank: int, peers: int) -> str:
        from shmpad.net.broker import Broker

        super().listen(rank, peers)
        if rank == 0:
            self._broker = Broker(port=0, token=TOKEN, settle_s=0.05, heartbeat_s=1.0, timeout_s=SETUP_S)
            return self._broker.address
        return ""

    def join(self, addresses: list[str]) -> None:
        import torch

        torch.set_num_threads(1)
        self._broker_address = addresses[0]
        self._acc = None

    def resize(self, array: np.ndarray) -> None:
        import torch

        from shmpad.net.accumulator import Accumulator

        if self._acc is not None:
            self._acc.close()
        self._param = torch.nn.Parameter(torch.zeros(len(array)))
        self._acc = Accumulator(
            torch.nn.ParameterList([self._param]),
            broker=self._broker_address,
            group=f"{self.backend}-{len(array)}",  # a fresh group per size
            name=f"rank{self.rank}",
            token=TOKEN,
            min_size=self.peers,
            op_timeout=SETUP_S,
            check_every=0,
            backend=self.backend,
        )
        if not self._acc.ready(timeout=SETUP_S):
            raise MeasurementFailed(f"{self.name}: the group of {self.peers} did not form within {SETUP_S} s")

    def allreduce(self, array: np.ndarray) -> None:
        import torch

        self._param.grad = torch.from_numpy(array)  # the mean is copied back into it
        if not self._acc.reduce_gradients(1):
            raise MeasurementFailed(f"{self.name}: a reduction was abandoned (the group changed)")

    def close(self) -> None:
        if getattr(self, "_acc", None) is not None:
            self._acc.close()
        if hasattr(self, "_broker"):
            self._broker.close()


class AccumulatedShmpad(Accumulated):
    name = "acc-shmpad"
    backend = "shmpad"
    how = "Accumulator(backend='shmpad').reduce_gradients(): grad -> flat, ring allreduce, mean -> grad"


class AccumulatedGloo(Accumulated):
    name = "acc-gloo"
    backend = "gloo"
    how = "Accumulator(backend='gloo').reduce_gradients(): grad -> flat -> group buffer, gloo allreduce, commit on the ring, mean -> grad"
