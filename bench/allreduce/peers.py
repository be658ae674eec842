"""The peer of ``python -m bench.allreduce``: gloo's allreduce through ``torch.distributed``, a
``Group`` (``bench/allreduce/contract.py``).
"""

from __future__ import annotations

import numpy as np

from bench.allreduce.contract import SETUP_S, Group

__all__ = ["Gloo"]


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


def _timedelta(seconds: float):
    import datetime

    return datetime.timedelta(seconds=seconds)
