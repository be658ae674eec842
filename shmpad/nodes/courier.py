"""``CourierNode``: an object whose public methods other nodes call.

On one box the calls travel through shared-memory rings (``shmpad.rpc.shm_server``): the
launcher creates the node's request ring before anything starts, so a call made
before the server is up waits in the ring until it is served.

A node given ``courier_kwargs={"listen": "HOST:PORT"}`` also serves the same object
over authenticated TCP (``shmpad.rpc.tcp_server``), for clients on other hosts. The
launcher reserves the port before anything starts (a bound socket, not listening:
connections are refused, and clients retry, until the node listens there), so the
address is known to every handle from the start. Nothing listens unless asked to,
and the host defaults to loopback.

Choosing the transport. A handle knows the node's ring, the identity of its host
and its TCP address if it has one; ``dereference()`` gives a shared-memory client
on that host (while the ring exists) and a TCP client elsewhere.
``SHMPAD_TRANSPORT=shm|tcp`` in the dereferencing process forces one (default
``auto``). A handle pickles to just that (no token), so another program, on another
host, can unpickle and dereference it; ``CourierHandle.from_address`` makes one
from a TCP address.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shmpad import context
from shmpad.net.auth import load_token
from shmpad.net.wire import join_address, parse_address
from shmpad.nodes.base import Handle, not_launched
from shmpad.nodes.python import PyClassNode
from shmpad.ringbuf import MPMCRing
from shmpad.rpc.calls import check_call_timeout
from shmpad.rpc.shm_client import RpcClient
from shmpad.rpc.shm_server import RpcServer, create_request_ring
from shmpad.rpc.stats import CallStats
from shmpad.rpc.tcp_client import TcpRpcClient
from shmpad.rpc.tcp_server import TcpRpcServer, reserve

__all__ = [
    "CourierNode",
    "CourierHandle",
    "CourierClient",
    "CourierServer",
    "Endpoint",
    "TRANSPORT_ENV",
    "host_identity",
]

CourierClient = RpcClient

TRANSPORT_ENV = "SHMPAD_TRANSPORT"
_TRANSPORTS = ("auto", "shm", "tcp")
_SERVER_JOIN_S = 5.0
_SHM_DIR = "/dev/shm"


def host_identity() -> str:
    """This host as handles tell it apart: its name and the id of its current boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


@dataclass(frozen=True)
class Endpoint:
    """Where a courier node's server is reached: all a handle carries to another process."""

    name: str
    ring: str | None = None  # the shared-memory request ring
    host: str | None = None  # host_identity() of the host the ring is on
    tcp: str | None = None  # "HOST:PORT" it listens on, if it does
    token_file: str | None = None  # where its clients read the token, if not $SHMPAD_TOKEN


def _choose_transport(ep: Endpoint) -> str:
    """``"shm"`` or ``"tcp"``: what a client of ``ep`` made in this process uses."""
    wanted = os.environ.get(TRANSPORT_ENV) or "auto"
    if wanted not in _TRANSPORTS:
        raise ValueError(f"${TRANSPORT_ENV} must be one of {list(_TRANSPORTS)}, got {wanted!r}")
    listen_hint = "give it courier_kwargs={'listen': 'HOST:PORT'}"
    if wanted == "shm":
        if ep.ring is None:
            raise ValueError(
                f"${TRANSPORT_ENV}=shm, but {ep.name} has no shared-memory ring (its handle was made from a TCP address)"
            )
        return "shm"
    same_host = wanted == "auto" and ep.ring is not None and ep.host == host_identity()
    if same_host and (ep.tcp is None or os.path.exists(os.path.join(_SHM_DIR, ep.ring.lstrip("/")))):
        return "shm"  # (a ring gone with its program: TCP if the node listens, else wait for it as before)
    if ep.tcp is None:
        if wanted == "tcp":
            raise ValueError(f"${TRANSPORT_ENV}=tcp, but {ep.name} does not listen on TCP; {listen_hint}")
        raise RuntimeError(f"{ep.name} is on another host and does not listen on TCP; {listen_hint}")
    return "tcp"


class CourierHandle(Handle):
    """A courier node's handle; ``dereference()`` gives a client of its server
    (``RpcClient`` over shared memory on the node's host, ``TcpRpcClient`` elsewhere)."""

    def __init__(self, node: CourierNode | None = None, endpoint: Endpoint | None = None, **client_kwargs: Any):
        if (node is None) == (endpoint is None):
            raise TypeError("CourierHandle takes a node or an endpoint (not both)")
        self._node = node
        self._endpoint = endpoint
        self._client_kwargs = _client_options(client_kwargs)

    @classmethod
    def from_address(
        cls, address: str, *, name: str | None = None, token_file: str | os.PathLike | None = None
    ) -> CourierHandle:
        """A handle of the courier server listening at ``address``
        (``"tcp://HOST:PORT"`` or ``"HOST:PORT"``), say one another host launched. Its
        clients read the token from ``token_file``, else ``$SHMPAD_TOKEN``."""
        if not isinstance(address, str):
            raise TypeError(f"address must be a str like 'tcp://HOST:PORT', got {type(address).__name__}")
        scheme, sep, rest = address.partition("://")
        if sep and scheme != "tcp":
            raise ValueError(f"address {address!r}: only tcp:// addresses are allowed")
        rest = rest if sep else address
        host, port = parse_address(rest)
        tcp = join_address(host, port)
        token_file = None if token_file is None else os.fspath(token_file)
        return cls(endpoint=Endpoint(name or f"courier server at {tcp}", tcp=tcp, token_file=token_file))

    def set_client_kwargs(self, **client_kwargs: Any) -> None:
        """Keyword arguments of the clients this handle makes (``call_timeout=``)."""
        self._client_kwargs = _client_options(client_kwargs)

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint if self._node is None else self._node.endpoint

    @property
    def address(self) -> str:
        """The node's shared-memory request ring."""
        ring = self.endpoint.ring
        if ring is None:
            raise AttributeError(
                f"{self.endpoint.name} has no shared-memory ring; its TCP address is {self.tcp_address!r}"
            )
        return ring

    @property
    def tcp_address(self) -> str | None:
        """``"HOST:PORT"`` where the node listens on TCP, or None."""
        return self.endpoint.tcp

    def dereference(self) -> Any:
        ep = self.endpoint
        if _choose_transport(ep) == "shm":
            return RpcClient(ep.ring, name=ep.name, **self._client_kwargs)
        return TcpRpcClient(ep.tcp, name=ep.name, token_file=ep.token_file, **self._client_kwargs)

    def release(self, dereferenced: Any) -> None:
        dereferenced.close()

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self._node is not None and not self._node.allocated:
            return super().__reduce_ex__(protocol)  # not launched yet: the node goes along
        return (_handle, (self.endpoint, self._client_kwargs))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"'CourierHandle' object has no attribute {name!r}: call methods on a client, that is on the "
            "handle's dereference() (a node gets its handle arguments dereferenced for it)"
        )


def _client_options(client_kwargs: dict) -> dict:
    """Checked client options, ``call_timeout`` in seconds (it may come as a ``timedelta``)."""
    unknown = set(client_kwargs) - {"call_timeout"}
    if unknown:
        raise TypeError(f"unknown client option(s) {sorted(unknown)}: allowed: ['call_timeout']")
    if "call_timeout" in client_kwargs:
        return {"call_timeout": check_call_timeout(client_kwargs["call_timeout"])}
    return {}


def _handle(endpoint: Endpoint, client_kwargs: dict) -> CourierHandle:
    return CourierHandle(endpoint=endpoint, **client_kwargs)


class CourierNode(PyClassNode):
    """Serves every public method (and ``__call__``) of ``constructor(*args, **kwargs)``.

    ``courier_client_kwargs``: options of the clients its handles make (``call_timeout``,
    seconds or a ``timedelta``). ``courier_kwargs``: ``thread_pool_size`` (16) calls run at once on each transport;
    ``listen`` (``"HOST:PORT"``, or a port on 127.0.0.1; port 0 picks a free one;
    ``"0.0.0.0:PORT"`` to be reached from other hosts) serves over TCP too, with the
    token from ``token_file`` or ``$SHMPAD_TOKEN`` (read at launch). If the object has
    ``run()``, the server stops when ``run()`` returns; otherwise it serves until the
    program stops. An object with ``set_courier_server(server)`` gets the ``CourierServer``
    instead and starts and stops it itself.
    """

    def __init__(
        self,
        constructor: Callable[..., Any],
        *args: Any,
        courier_kwargs: dict | None = None,
        courier_client_kwargs: dict | None = None,
        **kwargs: Any,
    ):
        super().__init__(constructor, *args, **kwargs)
        self._client_kwargs = _client_options(dict(courier_client_kwargs or {}))
        options = dict(courier_kwargs or {})
        threads = options.pop("thread_pool_size", 16)
        listen = options.pop("listen", None)
        token_file = options.pop("token_file", None)
        if options:
            raise TypeError(
                f"unknown courier_kwargs {sorted(options)}: allowed: ['thread_pool_size'], "
                "and 'listen' and 'token_file' to serve over TCP too"
            )
        if listen is not None and (isinstance(listen, bool) or not isinstance(listen, (str, int))):
            raise TypeError(
                f"courier_kwargs['listen'] must be 'HOST:PORT' or a port number, got {type(listen).__name__}"
            )
        if token_file is not None:
            if listen is None:
                raise ValueError("courier_kwargs['token_file'] is for TCP; give courier_kwargs['listen'] too")
            token_file = os.fspath(token_file)
        self._threads = threads
        self._listen = listen
        self._token_file = token_file
        self._ring = None
        self._stats: CallStats | None = None  # the server's call statistics, made with its ring
        self._endpoint: Endpoint | None = None
        self._reservation: socket.socket | None = None  # holds the port until the program ends
        self._bind_address: str | None = None
        self._token: bytes | None = None
        self.display_name = f"courier node {type(self).__name__}({getattr(constructor, '__qualname__', constructor)})"

    def create_handle(self) -> CourierHandle:
        return self._track_handle(CourierHandle(self, **self._client_kwargs))

    def configure(self, *args: Any, **kwargs: Any) -> None:
        """Replace the constructor's arguments (handy for nodes that refer to each other)."""
        self._set_constructor_args(args, kwargs)

    @property
    def allocated(self) -> bool:
        return self._endpoint is not None

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            raise not_launched(self.display_name, "address")
        return self._endpoint

    @property
    def address(self) -> str:
        return self.endpoint.ring

    def allocate(self) -> None:
        if self._ring is not None:
            return
        tcp = None
        if self._listen is not None:
            self._token = load_token(token_file=self._token_file)  # no token: fail before anything runs
            self._reservation, self._bind_address, tcp = reserve(self._listen)
        try:
            self._ring = create_request_ring()
            self._stats = CallStats.create(self._ring.name)
        except BaseException:
            self.free()
            raise
        self._endpoint = Endpoint(self.display_name, self._ring.name, host_identity(), tcp, self._token_file)

    def on_stop(self) -> None:
        if self._ring is not None:
            # close for every process but keep the name: a client that attaches late
            # gets Closed instead of waiting for a server that will not come
            MPMCRing.attach(self._ring.name).close()

    def _registry_entry(self) -> tuple[str, dict[str, str]] | None:
        if self._ring is None:
            return None
        return ("rpc", {"segment": self._ring.name, "stats": None if self._stats is None else self._stats.name})

    def free(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self._stats is not None:
            self._stats.close()
            self._stats = None
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None

    def _run_instance(self) -> None:
        instance, made = self._construct()
        with made:
            self._serve(instance)

    def _serve(self, instance: Any) -> None:
        server = CourierServer(instance, self.address, self._threads, self._bind_address, self._token)
        runs = self._should_run and hasattr(instance, "run")
        if hasattr(instance, "set_courier_server"):
            # Launchpad's pattern: the instance owns the server and starts and stops it
            # itself (in run()); calls made before Start() wait in the request ring
            instance.set_courier_server(server)
            try:
                if runs:
                    instance.run()
                elif server.has_started:
                    self._wait_for_stop(server)
            finally:
                server.close()  # what the instance left running does not outlive the node
            return
        server.Start()
        try:
            if runs:
                instance.run()
            else:
                self._wait_for_stop(server)
        finally:
            server.close()

    @staticmethod
    def _wait_for_stop(server: CourierServer) -> None:
        ctx = context.current_or_none()
        if ctx is not None:
            ctx.stopper.event.wait()
        else:
            server.Join()  # outside a launched program: serve until the request ring is closed


class CourierServer:
    """A courier node's server, with the surface of Launchpad's ``courier.Server`` that an
    object given it by ``set_courier_server`` uses: ``Start``, ``Stop``, ``Join``,
    ``has_started``. No call is served before ``Start()`` or after ``Stop()``; calls
    made before ``Start()`` wait in the node's request ring."""

    def __init__(self, instance: Any, ring: str, threads: int, bind_address: str | None, token: bytes | None):
        self._instance = instance
        self._ring = ring
        self._threads = threads
        self._bind_address = bind_address
        self._token = token
        self._shm: RpcServer | None = None
        self._tcp: TcpRpcServer | None = None

    @property
    def has_started(self) -> bool:
        return self._shm is not None

    def Start(self) -> None:  # noqa: N802 - Launchpad's name
        if self._shm is not None:
            raise ValueError("Server already started")
        self._shm = RpcServer(self._instance, self._ring, threads=self._threads)  # serves from here on
        if self._bind_address is not None:
            self._tcp = TcpRpcServer(self._instance, self._bind_address, self._token, threads=self._threads)

    def Stop(self) -> None:  # noqa: N802 - Launchpad's name
        if self._shm is None:
            raise ValueError("Server not started yet")
        self._shm.stop()
        if self._tcp is not None:
            self._tcp.close()

    def Join(self) -> None:  # noqa: N802 - Launchpad's name
        """Wait until the server has stopped and its running calls have returned."""
        if self._shm is None:
            raise ValueError("Server not started")
        self._shm.wait()

    def close(self) -> None:
        """Stop the server if it runs and wait (a bounded time) for it to end."""
        if self._shm is None:
            return
        self.Stop()
        self._shm.wait(_SERVER_JOIN_S)
