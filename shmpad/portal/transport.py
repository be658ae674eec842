"""Where a portal address leads: shared memory on this host, shmpad's authenticated TCP
to any other.

A server on port P serves two ways at once (``SHMPAD_TRANSPORT=shm|tcp`` keeps one):

- **on this host**, a shared-memory RPC server (``shmpad.rpc.RpcServer``) whose request
  ring is found through a *doorbell*: the abstract Unix socket ``\\0shmpad-portal-P``. A
  client connects to it, the server checks that the peer runs as the same user
  (``SO_PEERCRED``) and answers one line of JSON (the ring's name, its pid), and the
  client keeps the connection open as its link: the kernel closes it when the server
  closes or dies however it dies (SIGKILL included), so the client learns of it at once,
  with no polling and no file left behind. Abstract sockets vanish with their owner, and
  binding one is the host-wide claim on P that a second server on P fails.
- **from other hosts**, a ``shmpad.rpc.TcpRpcServer`` on ``HOST:P``: every connection
  authenticates with the shared token before a byte of it is decoded, frames are bounded,
  and nothing unauthenticated is unpickled. HOST is 127.0.0.1 (``::1`` with ``ipv6``)
  unless ``setup(host=...)`` or the server's ``host=`` says otherwise, so a server is
  reachable from other hosts only when asked.

The token is ``$SHMPAD_TOKEN``. Where it is unset, the first ``Process.start`` (or
server) sets a random one in the environment, which the processes it forks inherit: a
program on one host needs nothing. Across hosts every host must set the same token.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import select
import socket
import struct
import threading
import time
from typing import Any

from shmpad._checks import type_name

__all__ = [
    "TRANSPORT_ENV",
    "forced",
    "ensure_token",
    "server_port",
    "parse_address",
    "is_local",
    "free_port",
    "Doorbell",
    "ring_door",
]

TRANSPORT_ENV = "SHMPAD_TRANSPORT"
TOKEN_ENV = "SHMPAD_TOKEN"
_HELLO_LIMIT = 4096


def forced() -> str | None:
    """The transport ``$SHMPAD_TRANSPORT`` forces: ``"shm"``, ``"tcp"`` or None (both)."""
    value = os.environ.get(TRANSPORT_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in ("shm", "tcp"):
        raise ValueError(f"${TRANSPORT_ENV} must be 'shm', 'tcp' or unset, got {value!r}")
    return value


def ensure_token() -> None:
    """Give this program a TCP token if it has none (see the module docstring)."""
    if not os.environ.get(TOKEN_ENV, "").strip():
        os.environ[TOKEN_ENV] = secrets.token_hex(16)


def server_port(port: Any) -> int:
    """A server's ``port``: an int, or a str whose part after its last ``:`` is the port
    (``"P"``, ``":P"``, ``"HOST:P"``, ``"[::1]:P"``...). As on portal, any host in the
    string is not read: a server binds the ``host`` option (see ``Server``)."""
    if isinstance(port, bool) or not isinstance(port, (int, str)):
        raise TypeError(f"port must be an int or a 'host:port' str, got {type_name(port)}")
    if isinstance(port, str):
        if "://" in port:
            raise ValueError(f"port must be 'host:port' without a scheme, got {port!r}")
        number = port.rpartition(":")[2]
        try:
            port = int(number)
        except ValueError:
            raise ValueError(f"port must end in a port number, got {number!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return port


def parse_address(addr: Any, ipv6: bool = False) -> tuple[str, int]:
    """A client's ``addr``: ``"HOST:P"`` (``"[V6]:P"``), ``"P"``, ``":P"`` or an int;
    HOST defaults to loopback."""
    if isinstance(addr, bool) or not isinstance(addr, (int, str)):
        raise TypeError(f"addr must be an int or a 'host:port' str, got {type_name(addr)}")
    host = ""
    if isinstance(addr, str):
        if "://" in addr:
            raise ValueError(f"addr must be 'host:port' without a scheme, got {addr!r}")
        host, _, number = addr.rpartition(":")
        host = host.strip("[]")
        try:
            addr = int(number)
        except ValueError:
            raise ValueError(f"addr must end in a port number, got {number!r}") from None
    if not 0 < addr < 65536:
        raise ValueError(f"port must be in 1..65535, got {addr}")
    return host or ("::1" if ipv6 else "127.0.0.1"), addr


_local: set[str] | None = None


def is_local(host: str) -> bool:
    """Whether ``host`` names this host (loopback, its names, its addresses)."""
    global _local
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    if _local is None:
        names = {"localhost", "", socket.gethostname(), socket.getfqdn()}
        try:
            names.update(socket.gethostbyname_ex(socket.gethostname())[2])
        except OSError:
            pass
        _local = names
    return host in _local


def free_port() -> int:
    """A TCP port free on this host now (another process may take it before it is used,
    as with portal's)."""
    from shmpad.portal import runtime  # the server options say which family and host

    kw = runtime.current().serverkw
    ipv6 = kw.get("ipv6", False)
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((kw.get("host") or ("::" if ipv6 else "0.0.0.0"), 0))
        return sock.getsockname()[1]


def _door(port: int) -> bytes:
    return f"\0shmpad-portal-{port}".encode()


class Doorbell:
    """The server side of the doorbell on ``port`` (module docstring): answers every
    connection of this user with ``hello`` and holds it open until ``close()``."""

    def __init__(self, port: int, hello: dict):
        self._hello = json.dumps(hello).encode() + b"\n"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(_door(port))
        except OSError as e:
            self._sock.close()
            raise OSError(e.errno, f"port {port} is in use on this host by another portal server") from None
        self._sock.listen(128)
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="portal-doorbell", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid != os.getuid():
                conn.close()  # another user: it learns nothing, not even the ring's name
                continue
            try:
                conn.sendall(self._hello)
            except OSError:
                conn.close()
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.append(conn)

    def close(self) -> None:
        """Stop answering and close every link: each client sees its server gone."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        if self._thread is not threading.current_thread():
            self._thread.join()


def ring_door(port: int, timeout: float) -> tuple[socket.socket, dict] | None:
    """Connect to the doorbell of ``port`` on this host: the open link and the server's
    hello, or None if no server answered within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(_door(port))
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                raise TimeoutError
            chunk = sock.recv(_HELLO_LIMIT)
            if not chunk or len(data) + len(chunk) > _HELLO_LIMIT:
                raise ConnectionError
            data += chunk
        return sock, json.loads(data)
    except (OSError, ValueError):
        sock.close()
        return None
