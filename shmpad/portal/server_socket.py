"""``ServerSocket``: portal's message socket, server side, on shmpad's authenticated TCP.

``ServerSocket(port)`` listens on ``HOST:port`` (HOST: the ``host`` option, else
127.0.0.1, ``::1`` with ``ipv6``; a ``port`` string is read for its port only, as
portal does). Every connection first passes shmpad's shared-token handshake
(``shmpad.net.auth``; the token is ``$SHMPAD_TOKEN``, set for the program when unset),
then names its protocol (the ``handshake`` word, one control frame): a connection of
another protocol, or of a peer without the token, is closed before a message of it is
read. Then each message is one frame (``messages``).

``recv(timeout=None)`` gives ``(addr, data)``: the client's address as the socket sees
it (``connections`` lists them) and the message as a ``memoryview``; ``send(addr,
*buffers)`` queues a message to that client (to a client gone since, it is dropped
with a log line). At most ``max_recv_queue`` messages wait to be received: one more
is an error the next ``recv``/``send`` raises, as on portal. ``shutdown()`` stops
reading and accepting (what was queued stays); ``close()`` sends what is queued, then
closes every connection.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from shmpad.errors import FrameError
from shmpad.net.auth import SERVER_HANDSHAKE_TIMEOUT_S, Listener
from shmpad.net.wire import Connection, Kind
from shmpad.portal import options, runtime, transport
from shmpad.portal.messages import Outbox, check_message
from shmpad.rpc.tcp_server import set_keepalive

__all__ = ["ServerSocket"]

_CLOSE_FLUSH_S = 10.0
"""how long close() waits for each connection's queued messages to leave"""


class ServerSocket:
    def __init__(self, port: int | str, name: str = "Server", **kwargs: Any):
        self.port = transport.server_port(port)
        self.name = name
        self.options = options.server_options(kwargs, "ServerSocket")
        self.handshake = self.options.handshake
        host = self.options.host or ("::1" if self.options.ipv6 else "127.0.0.1")
        if self.options.ipv6 and host == "localhost":
            host = "::1"
        self.addr = (host, self.port)
        self.conns: dict[tuple, Outbox] = {}
        self.recvq: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.running = True
        self._lock = threading.Lock()
        self._reading = threading.Event()
        self._reading.set()
        transport.ensure_token()
        self._log(f"Binding to {host}:{self.port}")
        self._listener = Listener(
            self._serve, host, self.port, max_frame=self.options.max_msg_size, name=f"{name}Listener"
        )
        self._log(f"Listening at {host}:{self.port}")

    @property
    def connections(self) -> tuple:
        with self._lock:
            return tuple(self.conns)

    def recv(self, timeout: float | None = None) -> tuple[tuple, memoryview]:
        self._check()
        try:
            return self.recvq.get(block=timeout != 0, timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message within {timeout} s") from None

    def send(self, addr: tuple, *data: Any) -> None:
        self._check()
        parts = check_message(data, self.options.max_msg_size)
        with self._lock:
            outbox = self.conns.get(addr)
            if outbox is not None and sum(len(o) for o in self.conns.values()) >= self.options.max_send_queue:
                raise RuntimeError("Too many outgoing messages enqueued")
        if outbox is None:
            self._log("Dropping message to disconnected client")
            return
        try:
            outbox.put(parts)
        except ConnectionError:
            self._log("Dropping message to disconnected client")

    def shutdown(self) -> None:
        """Stop reading messages and taking connections; sends still go out."""
        self._reading.clear()

    def close(self, timeout: float | None = None) -> None:
        if not self.running:
            return
        self.running = False
        self._reading.clear()
        with self._lock:
            outboxes = list(self.conns.values())
        for outbox in outboxes:
            outbox.close(flush=True, timeout=_CLOSE_FLUSH_S if timeout is None else timeout)
        self._listener.close()

    def __repr__(self) -> str:
        return f"ServerSocket(name={self.name!r}, port={self.port}, connections={len(self.conns)})"

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        if not self.running:
            raise RuntimeError(f"server socket {self.name!r} is closed")

    def _serve(self, conn: Connection) -> None:
        """A connection that passed the token handshake, on a thread of its own."""
        addr = conn.sock.getpeername()
        conn.settimeout(SERVER_HANDSHAKE_TIMEOUT_S)
        try:
            word = conn.recv_json().get("handshake")
        except (ConnectionError, OSError) as e:
            self._log(f"Closed connection to {addr[0]}:{addr[1]} ({type(e).__name__}: {e})")
            return
        if word != self.handshake:
            self._log(f"Closed connection to {addr[0]}:{addr[1]} (expected handshake {self.handshake!r} got {word!r})")
            return
        conn.settimeout(None)
        set_keepalive(conn.sock)
        outbox = Outbox(conn, self.options.max_send_queue, f"{self.name}Send", lambda e: conn.close())
        with self._lock:
            if not self.running or not self._reading.is_set():
                outbox.close(flush=False)
                return
            self.conns[addr] = outbox
        self._log(f"Accepted connection from {addr[0]}:{addr[1]}")
        error: BaseException | None = None
        try:
            while self.running:
                if not self._reading.is_set():
                    if self._reading.wait(0.2) or not self.running:
                        continue
                frame = conn.recv()
                if frame.kind != Kind.BYTES:
                    raise FrameError(f"a portal socket carries only message frames, got a frame of kind {frame.kind}")
                if self.recvq.qsize() >= self.options.max_recv_queue:
                    self.error = RuntimeError("Too many incoming messages enqueued")
                    return
                self.recvq.put((addr, memoryview(frame.payload)))
        except (ConnectionError, OSError) as e:
            error = e
        finally:
            with self._lock:
                self.conns.pop(addr, None)
            if self.running:
                dropped = outbox.clear()
                outbox.close(flush=False)
                detail = f"{type(error).__name__}: {error}" if error else "closed"
                self._log(f"Closed connection to {addr[0]}:{addr[1]} ({detail})")
                if dropped:
                    self._log(f"Dropping {dropped} messages to disconnected client")

    def _log(self, message: str) -> None:
        if self.options.logging:
            runtime.current().print(self.name, message, color=self.options.logging_color)
