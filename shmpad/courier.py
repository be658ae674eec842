"""``CourierNode``: an object whose public methods other nodes call.

On one box the calls travel through shared-memory rings (``shmpad.rpc``): the
launcher creates the node's request ring before anything starts, so a call made
before the server is up waits in the ring until it is served.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from shmpad import context
from shmpad.node import Handle
from shmpad.python_node import PyClassNode
from shmpad.ringbuf import MPMCRing
from shmpad.rpc import RpcClient, RpcServer, create_request_ring

__all__ = ["CourierNode", "CourierHandle", "CourierClient"]

CourierClient = RpcClient

_SERVER_JOIN_S = 5.0


class CourierHandle(Handle):
    """A courier node's handle; ``dereference()`` gives a client of its server."""

    def __init__(self, node: "CourierNode", **client_kwargs: Any):
        self._node = node
        self._client_kwargs = client_kwargs

    def set_client_kwargs(self, **client_kwargs: Any) -> None:
        """Keyword arguments of the clients this handle makes (``call_timeout=``)."""
        unknown = set(client_kwargs) - {"call_timeout"}
        if unknown:
            raise TypeError(f"unknown client option(s) {sorted(unknown)}: allowed: ['call_timeout']")
        self._client_kwargs = client_kwargs

    @property
    def address(self) -> str:
        return self._node.address

    def dereference(self) -> RpcClient:
        return RpcClient(self._node.address, name=self._node.display_name, **self._client_kwargs)

    def release(self, dereferenced: RpcClient) -> None:
        dereferenced.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"'CourierHandle' object has no attribute {name!r}: call methods on a client, that is on the "
            "handle's dereference() (a node gets its handle arguments dereferenced for it)"
        )


class CourierNode(PyClassNode):
    """Serves every public method (and ``__call__``) of ``constructor(*args, **kwargs)``.

    Up to ``courier_kwargs['thread_pool_size']`` (16) calls run at once. If the object
    has ``run()``, the server stops when ``run()`` returns; otherwise it serves until
    the program stops.
    """

    def __init__(self, constructor: Callable[..., Any], *args: Any, courier_kwargs: dict | None = None, **kwargs: Any):
        super().__init__(constructor, *args, **kwargs)
        courier_kwargs = dict(courier_kwargs or {})
        threads = courier_kwargs.pop("thread_pool_size", 16)
        if courier_kwargs:
            raise TypeError(f"unknown courier_kwargs {sorted(courier_kwargs)}: allowed: ['thread_pool_size']")
        self._threads = threads
        self._ring = None
        self._address: str | None = None
        self.display_name = f"courier node {type(self).__name__}({getattr(constructor, '__qualname__', constructor)})"

    def create_handle(self) -> CourierHandle:
        return CourierHandle(self)

    def configure(self, *args: Any, **kwargs: Any) -> None:
        """Replace the constructor's arguments (handy for nodes that refer to each other)."""
        from shmpad.node import collect_handles

        self._ctor_args = args
        self._ctor_kwargs = kwargs
        self._input_handles = collect_handles((args, kwargs))

    @property
    def address(self) -> str:
        if self._address is None:
            raise RuntimeError(
                f"{self.display_name} has no address yet: its handle can be dereferenced only once the program "
                "that holds the node is launched (shmpad.launch)"
            )
        return self._address

    def allocate(self) -> None:
        if self._ring is None:
            self._ring = create_request_ring()
            self._address = self._ring.name

    def on_stop(self) -> None:
        if self._ring is not None:
            # close for every process but keep the name: a client that attaches late
            # gets Closed instead of waiting for a server that will not come
            MPMCRing.attach(self._ring.name).close()

    def release(self) -> None:
        self.free()

    def free(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    def _run_instance(self) -> None:
        instance, made = self._construct()
        with made:
            self._serve(instance)

    def _serve(self, instance: Any) -> None:
        server = RpcServer(instance, self.address, threads=self._threads)
        serving = threading.Thread(target=server.serve, name="shmpad-courier", daemon=True)
        serving.start()
        try:
            if self._should_run and hasattr(instance, "run"):
                instance.run()
            else:
                ctx = context.current_or_none()
                if ctx is None:
                    serving.join()
                else:
                    ctx.stopper.event.wait()
        finally:
            server.stop()
            serving.join(_SERVER_JOIN_S)
