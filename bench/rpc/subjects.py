"""shmpad's subject in ``python -m bench.rpc``: ``RpcServer`` / ``RpcClient`` over the shared-memory
transport, following ``bench/rpc/contract.py``. shmpad.rpc is imported lazily so that the peers run without it.
"""

from __future__ import annotations

from bench.rpc.contract import SERVER_THREADS, Caller, Echo, FutureWindow, Plan, Subject

__all__ = ["SHMPAD", "Shmpad"]


class _ShmpadCaller(FutureWindow):
    def __init__(self, client):
        # What ``client.echo`` and ``client.futures.echo`` give, looked up once (as for every subject).
        super().__init__(client, client.futures.echo)
        self.call = client.echo


class Shmpad(Subject):
    name = "shmpad"
    family = "shmpad"
    how = (
        f"RpcServer(obj, threads={SERVER_THREADS}) / RpcClient, client.echo(payload); "
        "in flight: client.futures.echo(payload), awaited oldest first"
    )

    def __init__(self, plan: Plan):
        super().__init__(plan)
        from shmpad.rpc.shm_server import create_request_ring

        self._ring = create_request_ring()  # made before the fork: the client may call before the server serves
        self.address = self._ring.name
        self._closed = False

    def serve(self) -> None:
        from shmpad.rpc import RpcServer

        RpcServer(Echo(), self.address, threads=SERVER_THREADS).wait()

    def connect(self) -> Caller:
        from shmpad.rpc import RpcClient

        return _ShmpadCaller(RpcClient(self.address, call_timeout=None))

    def stop(self) -> None:
        # Closing the request ring in the parent ends the child's server.
        if not self._closed:
            self._closed = True
            self._ring.close()

    def close(self) -> None:
        self.stop()


SHMPAD: list[type[Subject]] = [Shmpad]
