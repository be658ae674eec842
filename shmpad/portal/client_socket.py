"""``ClientSocket``: portal's message socket, client side (``server_socket`` has the
server and the wire), and ``Disconnected``.

A thread of the socket keeps the connection: with ``autoconn=True`` (portal's default)
it connects at once and again whenever the connection breaks (every ``connect_wait`` s
until a server answers, through ``setup(resolver=...)`` when one is set); with
``autoconn=False`` only when ``connect()`` asks. The same thread reads messages into a
queue for ``recv``; ``send`` queues a message for the socket's sender thread.

When the connection breaks, the messages not yet sent are dropped, as on portal (a
message a server took may still be lost with it: resending belongs to the layer that
sees replies, ``Client``); messages already received stay for ``recv``. Without a
connection, ``send`` and ``recv`` raise ``Disconnected`` when ``autoconn`` is off and
otherwise wait for one (``TimeoutError`` after ``timeout`` s). ``close()`` sends what
is queued while connected, then closes.

The ``keepalive_*`` options set TCP keepalive on the connection: a server whose host
vanished without closing is noticed after ``keepalive_after + keepalive_every x
keepalive_fails`` s.
"""

from __future__ import annotations

import math
import queue
import socket
import threading
import time
from typing import Any, Callable

from shmpad.errors import AuthError, FrameError
from shmpad.net import auth
from shmpad.net.wire import Connection, Kind
from shmpad.portal import options, runtime, transport
from shmpad.portal.messages import Outbox, check_message

__all__ = ["ClientSocket", "Disconnected"]

_TICK_S = 0.2
"""how often a waiting recv looks at the connection, and the keeper at close()"""


class Disconnected(Exception):
    """The client has no connection to its server (``autoconn=False``)."""


class ClientSocket:
    def __init__(self, addr: int | str, name: str = "Client", start: bool = True, **kwargs: Any):
        self.name = name
        self.options = options.client_options(kwargs, "ClientSocket")
        self.addr = transport.parse_address(addr, self.options.ipv6)
        self.callbacks_recv: list[Callable[[memoryview], Any]] = []
        self.callbacks_conn: list[Callable[[], Any]] = []
        self.callbacks_disc: list[Callable[[], Any]] = []
        self.isconn = threading.Event()
        self.wantconn = threading.Event()
        self.recvq: queue.Queue = queue.Queue()
        self.running = True
        self._outbox: Outbox | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{name}Loop", daemon=True)
        if start:
            self._thread.start()

    def start(self) -> None:
        self._thread.start()

    @property
    def connected(self) -> bool:
        return self.isconn.is_set()

    def connect(self, timeout: float | None = None) -> bool:
        """Wait until connected (asking for it when ``autoconn`` is off); False if
        ``timeout`` s passed first."""
        if not self.options.autoconn:
            self.wantconn.set()
        return self.isconn.wait(timeout)

    def send(self, *data: Any, timeout: float | None = None) -> None:
        self._check()
        parts = check_message(data, self.options.max_msg_size)
        self.require_connection(timeout)
        with self._lock:
            outbox = self._outbox
        if outbox is None:
            self.require_connection(0)
            raise Disconnected(f"client socket {self.name!r} lost its connection")
        try:
            outbox.put(parts)
        except ConnectionError:
            raise Disconnected(f"client socket {self.name!r} lost its connection") from None

    def recv(self, timeout: float | None = None) -> memoryview:
        self._check()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if left == 0:
                    return self.recvq.get_nowait()
                return self.recvq.get(timeout=_TICK_S if left is None else min(left, _TICK_S))
            except queue.Empty:
                pass
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.require_connection(left)
            if left == 0:
                raise TimeoutError(f"no message within {timeout} s")

    def require_connection(self, timeout: float | None) -> None:
        """Return if connected; else raise ``Disconnected`` (``autoconn`` off) or wait up to
        ``timeout`` s for a connection (``TimeoutError``)."""
        if self.isconn.is_set():
            return
        if not self.options.autoconn:
            raise Disconnected(f"client socket {self.name!r} is not connected to {_show(self.addr)}")
        if timeout == 0 or not self.isconn.wait(timeout):
            raise TimeoutError(f"client socket {self.name!r} not connected to {_show(self.addr)} within {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        if not self.running:
            return
        self.running = False
        with self._lock:
            outbox = self._outbox
        if outbox is not None:
            outbox.close(flush=True, timeout=timeout)  # what was sent before close() goes out
        with self._lock:  # a connection made from now on is closed by the loop (_loop)
            self._closing.set()
            conn = self._conn
        self.wantconn.set()
        if conn is not None:
            conn.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __repr__(self) -> str:
        return f"ClientSocket(name={self.name!r}, addr={_show(self.addr)!r}, connected={self.connected})"

    def _check(self) -> None:
        if not self.running:
            raise RuntimeError(f"client socket {self.name!r} is closed")

    # -- the connection ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing.is_set():
            if not self.options.autoconn and not self.wantconn.wait(_TICK_S):
                continue
            conn = self._connect()
            if conn is None:
                break
            outbox = Outbox(conn, self.options.max_send_queue, f"{self.name}Send", lambda e, c=conn: c.close())
            with self._lock:
                if self._closing.is_set():  # close() came while this connection was made
                    outbox.close(flush=False)
                    conn.close()
                    break
                self._conn, self._outbox = conn, outbox
            self.isconn.set()
            if not self.options.autoconn:
                self.wantconn.clear()
            for fn in self.callbacks_conn:
                fn()
            try:
                while True:
                    frame = conn.recv()
                    if frame.kind != Kind.BYTES:
                        raise FrameError(f"a portal socket carries only messages, got a frame of kind {frame.kind}")
                    if self.recvq.qsize() >= self.options.max_recv_queue:
                        raise FrameError("Too many incoming messages enqueued")
                    msg = memoryview(frame.payload)
                    self.recvq.put(msg)
                    for fn in self.callbacks_recv:
                        fn(msg)
            except (ConnectionError, OSError) as e:
                if not self._closing.is_set():
                    self._log(f"Connection to server lost ({type(e).__name__}: {e})")
            with self._lock:
                self._conn, self._outbox = None, None
            self.isconn.clear()
            outbox.close(flush=False)
            conn.close()
            if not self._closing.is_set():
                for fn in self.callbacks_disc:
                    fn()

    def _connect(self) -> Connection | None:
        """An authenticated connection that named its protocol, or None once closed."""
        self._log(f"Connecting to {_show(self.addr)}")
        once = True
        while not self._closing.is_set():
            host, port = self.addr
            resolver = runtime.current().resolver
            if resolver is not None:
                host, port = resolver((host, port))
            error: BaseException | None = None
            try:
                conn = auth.connect((host, int(port)), timeout=10.0, max_frame=self.options.max_msg_size)
            except AuthError as e:
                self._log(f"Cannot connect: {e}")  # every time: a wrong token is not a server still starting
                error = e
            except (ConnectionError, OSError) as e:
                error = e
            else:
                try:
                    self._keepalive(conn.sock)
                    conn.send_json({"handshake": self.options.handshake})
                except (ConnectionError, OSError) as e:
                    conn.close()
                    error = e
                else:
                    self._log("Connection established")
                    return conn
            if once:
                self._log(f"Still trying to connect... ({error})")
                once = False
            self._closing.wait(self.options.connect_wait)
        return None

    def _keepalive(self, sock: socket.socket) -> None:
        after, every, fails = self.options.keepalive_after, self.options.keepalive_every, self.options.keepalive_fails
        if not (after and every and fails):
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, math.ceil(after)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, math.ceil(every)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, fails)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, math.ceil(1000 * (after + every * fails)))

    def _log(self, message: str) -> None:
        if self.options.logging:
            runtime.current().print(self.name, message, color=self.options.logging_color)


def _show(addr: tuple) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
