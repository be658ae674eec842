"""The TCP RPC server, and the format its messages travel in (``shmpad.rpc.tcp_client`` has the client).

The same calls as the shared-memory transport (``shm_server``), with the same codec
(``codec``, which also documents the message layout) and client surface (``calls``), over ``shmpad.net.wire`` connections: every
connection passes the shared-token handshake before a byte of it is decoded, and
only then are its ``PICKLE`` frames unpickled. One frame per message::

    request   PICKLE  tag = call id  flags = 0
              payload = pickle((method, args, kwargs))
    reply     PICKLE  tag = call id  flags = 1 if the call returned, 0 if it raised
              payload = pickle(result) or pickle((exception, remote traceback))

The pickles travel with their large buffers out of band (``codec``'s TCP messages).

A client has one connection to its server with any number of calls in flight;
replies come back in any order, matched by call id. A frame of another kind, or a
payload whose layout does not add up, closes that connection with a logged reason;
frames are bounded by the connection's ``max_frame`` (``wire.MAX_FRAME``), so one
call's arguments or result are too.

The server runs calls on up to ``threads`` threads at once, over all its
connections (a batched method's calls wait for their batch holding none of them) (a call may wait for another call to the same server). It reads at most
``2 x threads`` requests of one connection ahead of their replies; past that the
client's sends wait in TCP, so a client pipelining large calls holds at most that many
in the server's memory. That bound cannot deadlock a call that waits for another call
(a nested call over the same connection, say): with more than ``threads`` requests
read, some are queued behind busy threads, and a request not yet read would be queued
behind them, so it could not have run any sooner. A node that must
be reachable before it starts has its port reserved early (``reserve``):
connections are refused, and clients retry, until the server listens.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from shmpad.errors import FrameError, RemoteError
from shmpad.net.auth import Listener
from shmpad.net.wire import MAX_FRAME, Connection, Kind, join_address, parse_address
from shmpad.rpc.batching import BatchedHandler
from shmpad.rpc.calls import POLL_S, public_methods
from shmpad.rpc.codec import encode_message, failure, load_message, message_size, split_message, unpicklable_result

__all__ = ["TcpRpcServer", "caller", "reserve"]

log = logging.getLogger("shmpad.net")

# A peer that vanishes without closing (its host died, a cable was pulled) is noticed
# by keepalive probes after ~KEEPALIVE_IDLE_S + 3 x KEEPALIVE_INTERVAL_S, and data it
# never acknowledges fails the connection after USER_TIMEOUT_S.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
USER_TIMEOUT_S = 30
_WILDCARDS = ("0.0.0.0", "::", "")
_calling = threading.local()


def caller() -> Connection | None:
    """On a thread running a call (or submitting one to a batched method): the
    connection the call came in on, else None."""
    return getattr(_calling, "conn", None)


# ---------------------------------------------------------------- connections


def set_keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_S * 1000)


# ---------------------------------------------------------------- server


class _Workers:
    """Runs jobs on up to ``limit`` daemon threads, started when every one is busy
    (a daemon: a handler that never returns must not hold the interpreter at exit)."""

    def __init__(self, limit: int, name: str):
        self._limit = limit
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a job, minus jobs queued for them
        self._lock = threading.Lock()

    def submit(self, fn: Callable, *args: Any) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._limit:
                t = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        self._jobs.put((fn, args))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args = job
            try:
                fn(*args)
            except Exception:
                log.exception("RPC handler thread failed")
            with self._lock:
                self._idle += 1

    def close(self, timeout: float) -> None:
        """End every thread once the jobs queued before have run (waiting up to ``timeout``)."""
        with self._lock:
            threads, self._limit = list(self._threads), 0
        for _ in threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


class TcpRpcServer:
    """Serves ``obj``'s public methods (and ``__call__``) to clients that hold ``token``.

    Listens on ``address`` (``"HOST:PORT"``; loopback unless told otherwise, port 0
    picks a free one: ``self.address`` tells which) from construction until ``close()``,
    like the shared-memory ``RpcServer``.
    ``threads`` bounds how many calls run at once, over all connections.
    """

    transport = "tcp"

    def __init__(
        self,
        obj: Any,
        address: str | tuple[str, int] = "127.0.0.1:0",
        token: bytes | str | None = None,
        threads: int = 16,
        max_frame: int = MAX_FRAME,
    ):
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an int, got {type(threads).__name__}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        host, port = parse_address(address)
        self._lookup = public_methods(obj)
        self._workers = _Workers(threads, "shmpad-tcp-rpc-handler")
        self._read_ahead = 2 * threads  # more than threads: see the module docstring
        self._listener = Listener(self._serve, host, port, token, max_frame, name="shmpad-tcp-rpc")
        self.address = self._listener.address

    def __repr__(self) -> str:
        return f"TcpRpcServer({self.address!r})"

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening and drop every connection (their pending calls fail); waits up
        to ``timeout`` for running handlers to return. Idempotent."""
        self._listener.close()
        self._workers.close(timeout)

    def __enter__(self) -> TcpRpcServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self, conn: Connection) -> None:
        """Read one authenticated connection's requests; each runs on a worker thread."""
        set_keepalive(conn.sock)
        unanswered = threading.BoundedSemaphore(self._read_ahead)  # released as each reply is sent
        while not conn.closed:
            while not unanswered.acquire(timeout=POLL_S):
                if conn.closed:  # closed while every slot waits on a handler: this thread ends now
                    return
            frame = conn.recv()
            if frame.kind != Kind.PICKLE:
                conn.refuse(f"frame of kind {frame.kind}: an RPC connection carries only PICKLE frames")
                return
            try:
                parts = split_message(frame.payload)
            except FrameError as e:
                conn.refuse(str(e))
                return
            self._workers.submit(self._answer, conn, frame.tag, parts, unanswered)

    def _answer(self, conn: Connection, call_id: int, parts: tuple, unanswered: threading.BoundedSemaphore) -> None:
        _calling.conn = conn
        try:
            method, args, kwargs = load_message(parts)
            fn = self._lookup(method)
            if isinstance(fn, BatchedHandler):
                # answered when its batch has run; this thread takes the next request
                fut = fn.submit(args, kwargs)
                fut.add_done_callback(lambda f: self._answer_batched(conn, call_id, f, unanswered))
                return
            ok, value = True, fn(*args, **kwargs)
        except BaseException as e:
            ok, value = False, failure(e)
        try:
            self._reply(conn, call_id, ok, value)
        finally:
            unanswered.release()  # pairs with the acquire in _serve before this request was read

    def _answer_batched(self, conn: Connection, call_id: int, fut: Any, unanswered: threading.BoundedSemaphore) -> None:
        e = fut.exception()
        ok, value = (True, fut.result()) if e is None else (False, failure(e))
        try:
            self._reply(conn, call_id, ok, value)
        finally:
            unanswered.release()  # pairs with the acquire in _serve before this request was read

    def _reply(self, conn: Connection, call_id: int, ok: bool, value: Any) -> None:
        try:
            payload = encode_message(value)
        except Exception as e:
            ok, payload = False, encode_message(unpicklable_result(e))
        if message_size(payload) > conn.max_frame:
            err = RemoteError(
                f"the result is {message_size(payload)} bytes; one reply carries at most {conn.max_frame}"
            )
            ok, payload = False, encode_message((err, ""))
        try:
            conn.send(Kind.PICKLE, *payload, tag=call_id, flags=int(ok))
        except ConnectionError:
            pass  # the caller is gone: it learnt that from its side


# ---------------------------------------------------------------- reserving a port


def reserve(listen: str | int) -> tuple[socket.socket, str, str]:
    """Hold a port for a server that another process starts later.

    ``listen`` is ``"HOST:PORT"``, ``"PORT"`` or a port number (host 127.0.0.1; port 0
    picks a free one). Returns a socket bound to it, not listening (connections are
    refused until the server listens there too: both sockets set SO_REUSEADDR), the
    address to listen on and the address to advertise to clients (the host name for a
    wildcard host)."""
    host, port = parse_address(listen, default_host="127.0.0.1")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
    port = sock.getsockname()[1]
    shown = socket.gethostname() if host in _WILDCARDS else host
    return sock, join_address(host, port), join_address(shown, port)
