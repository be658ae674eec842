"""A client's connection to one server, on the transport its address leads to
(``transport``): calls go out as futures, and ``wait_broken`` says when the
connection is gone (the server closed or died, or the network broke it).

On shared memory the link is the doorbell connection the server holds open: the kernel
ends it when the server's process ends, however it ends. Over TCP it is the
authenticated connection of a ``shmpad.rpc.TcpRpcClient``; it counts as broken once a
call on it fails for a reason other than the server's reply.
"""

from __future__ import annotations

import select
import socket
import threading
from concurrent.futures import Future as CallFuture
from typing import Any

from shmpad.errors import AuthError, Timeout
from shmpad.net.wire import MAX_FRAME
from shmpad.portal import transport
from shmpad.rpc import RpcClient, TcpRpcClient
from shmpad.rpc.codec import RemoteTraceback

__all__ = ["open_link", "from_server", "WrongProtocol"]

PING = "shmpad_portal_ping"  # the method every server answers (server.PING)
_TCP_CONNECT_S = 2.0
"""how long a TCP link may take to connect and authenticate (the shared-memory doorbell answers at once)"""
_DRAIN_S = 0.05
"""how long a broken shared-memory link is read for replies that arrived before its end"""


def from_server(e: BaseException) -> bool:
    """Whether ``e`` is the server's answer to a call (raised by the method or by the
    server), not a failure of the transport."""
    return isinstance(e.__cause__, RemoteTraceback)


class ShmLink:
    transport = "shm"

    def __init__(self, sock: socket.socket, hello: dict, name: str):
        self.sock = sock
        self.pid = int(hello["pid"])
        self.rpc = RpcClient(hello["address"], name=name)

    def call(self, method: str, args: list) -> CallFuture:
        return self.rpc.call_future(method, tuple(args))

    def wait_broken(self, timeout: float) -> bool:
        if not select.select([self.sock], [], [], timeout)[0]:
            return False
        try:
            return not self.sock.recv(1)  # the server never writes after its hello: EOF
        except OSError:
            return True

    def drain(self, pending: list) -> None:
        """Settle the calls of ``pending`` (transport futures) whose replies are in the
        reply ring already: a server puts its last replies there before it closes the
        link, so they are there when a client sees it closed."""
        waiting = [f for f in pending if not f.done()]
        if waiting:
            try:
                waiting[0].exception(_DRAIN_S)  # reads every reply in the ring, not only this one
            except Exception:
                pass  # not answered (a timeout), or the client closed: the caller sends it again

    def close(self) -> None:
        self.sock.close()
        self.rpc.close()


class TcpLink:
    transport = "tcp"

    def __init__(self, rpc: TcpRpcClient):
        self.rpc = rpc
        self._broken = threading.Event()

    def call(self, method: str, args: list) -> CallFuture:
        fut = self.rpc.call_future(method, tuple(args))
        fut.add_done_callback(self._check)
        return fut

    def _check(self, fut: CallFuture) -> None:
        e = fut.exception()
        if e is not None and not from_server(e):
            self._broken.set()

    def wait_broken(self, timeout: float) -> bool:
        return self._broken.wait(timeout)

    def drain(self, pending: list) -> None:
        """Nothing to do: one connection's replies are read in order, so those sent before
        the server closed it were read before its end was seen."""

    def close(self) -> None:
        self.rpc.close()


class WrongProtocol(ConnectionError):
    """The server at the address speaks another protocol (its ``handshake`` differs)."""


def open_link(host: str, port: int, name: str, timeout: float, handshake: str, max_frame: int = MAX_FRAME) -> Any:
    """A link to the server at ``host:port``, or None if none answered within ``timeout``
    s; ``WrongProtocol`` if one answered with another ``handshake``.

    On this host the doorbell answers; a server that serves no shared memory (one with a
    method bound with ``addr=True``) says so there and the link is TCP, to the address
    it names."""
    only = transport.forced()
    if only == "shm" or (only is None and transport.is_local(host)):
        answer = transport.ring_door(port, timeout)
        if answer is None:
            return None
        sock, hello = answer
        if hello.get("handshake") != handshake:
            sock.close()
            raise WrongProtocol(f"expected handshake {handshake!r}, the server has {hello.get('handshake')!r}")
        if hello.get("address") is not None:
            return ShmLink(sock, hello, name=name)
        sock.close()
        address = hello["tcp"]
    else:
        address = _join(host, port)
    rpc = TcpRpcClient(address, name=name, connect_timeout=max(timeout, _TCP_CONNECT_S), max_frame=max_frame)
    try:
        hello = rpc.call(PING)
    except AuthError as e:
        rpc.close()
        if isinstance(e.__context__, TimeoutError):
            return None  # a handshake too slow (a loaded host) is not a wrong token: try again
        raise
    except (Timeout, ConnectionError, OSError):
        rpc.close()
        return None
    if hello.get("handshake") != handshake:
        rpc.close()
        raise WrongProtocol(f"expected handshake {handshake!r}, the server has {hello.get('handshake')!r}")
    return TcpLink(rpc)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
