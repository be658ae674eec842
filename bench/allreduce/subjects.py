"""The subjects ``python -m bench.allreduce`` measures side by side (``bench/allreduce/benchmark.py``
runs them): shmpad's ring and gloo, and the gradient accumulator over each. Each is built
in the parent from the plan (the benchmark's ``Args``) and used in every forked worker, as
``Group`` says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.common.harness import MeasurementFailed
from bench.common.subject import Subject

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


class Gloo(Group):
    name = "gloo"
    family = "peer"
    how = "torch.distributed.all_reduce(tensor) (gloo backend, TCPStore) on torch.from_numpy(array)"

    def listen(self, rank: int, peers: int) -> str:
        import torch.distributed as dist

        super().listen(rank, peers)
        if rank == 0:  # the store's server runs in rank 0, on a free port
            self._store = dist.TCPStore(
                "127.0.0.1", 0, peers, is_master=True, timeout=_timedelta(SETUP_S), wait_for_workers=False
            )
            return str(self._store.port)
        return ""

    def join(self, addresses: list[str]) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if self.rank != 0:
            self._store = dist.TCPStore(
                "127.0.0.1", int(addresses[0]), self.peers, is_master=False, timeout=_timedelta(SETUP_S)
            )
        dist.init_process_group(
            "gloo", store=self._store, rank=self.rank, world_size=self.peers, timeout=_timedelta(SETUP_S)
        )
        self._tensors: dict[int, object] = {}

    def allreduce(self, array: np.ndarray) -> None:
        import torch
        import torch.distributed as dist

        key = array.ctypes.data
        tensor = self._tensors.get(key)
        if tensor is None:
            tensor = self._tensors[key] = torch.from_numpy(array)
        dist.all_reduce(tensor)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


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


def _timedelta(seconds: float):
    import datetime

    return datetime.timedelta(seconds=seconds)


SUBJECTS: list[type[Group]] = [Gloo, Shmpad, AccumulatedGloo, AccumulatedShmpad]


def missing(subject: type[Group]) -> str | None:
    """Why ``subject`` cannot run here, or None."""
    try:
        if subject.name in ("gloo", "acc-gloo"):
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_gloo_available():
                return "this torch has no gloo backend"
        else:
            import shmpad.net.mesh  # noqa: F401
    except Exception as e:
        return f"does not import: {e!r}"
    return None
