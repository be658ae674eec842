"""Cross-host RPC: the TCP client, and courier nodes reached over TCP.

``TcpRpcClient`` calls a ``TcpRpcServer`` (``shmpad.rpc.tcp_server``, which documents
the messages) with the surface of the shared-memory ``RpcClient``. A ``CourierNode``
with ``courier_kwargs={"listen": ...}`` serves over TCP too, and its handles
dereference to a ``TcpRpcClient`` on other hosts.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout  # not the builtin TimeoutError before Python 3.11
from dataclasses import dataclass, field
from typing import Any

from shmpad.errors import AuthError, Closed, Timeout
from shmpad.net.auth import connect, load_token
from shmpad.net.wire import (
    MAX_FRAME,
    Connection,
    Kind,
    join_address,
    parse_address,
)
from shmpad.rpc import calls
from shmpad.rpc.calls import FutureMethods, MethodCalls, check_call_timeout, settle, timeout_error
from shmpad.rpc.codec import encode_message, load_message, message_size, split_message, unpack_reply
from shmpad.rpc.tcp_server import set_keepalive

__all__ = ["TcpRpcClient"]

log = logging.getLogger("shmpad.net")


# ---------------------------------------------------------------- client


@dataclass(eq=False)
class _Link:
    """One connection of a client, the thread reading its replies, and its calls in
    flight. Once ``dead`` (set under ``lock`` by the reader as it ends) no call joins."""

    conn: Connection
    pending: dict[int, tuple[Future, float | None, str]] = field(default_factory=dict)
    reader: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    dead: bool = False
    error: str | None = None


class TcpRpcClient(MethodCalls):
    """Calls a ``TcpRpcServer``'s methods: ``client.m(...)`` blocks,
    ``client.futures.m(...)`` returns a ``concurrent.futures.Future``. Safe to share
    between threads; calls share one connection.

    ``call_timeout`` (seconds, None: no limit) bounds every call (``shmpad.Timeout``).
    A server that is not listening yet is retried until it is (within ``call_timeout``,
    or else ``connect_timeout``). If the connection breaks, the calls in flight fail
    with ``ConnectionError`` and the next call connects again. The token comes from
    ``token``, else ``token_file``, else ``$SHMPAD_TOKEN``; a pickled client carries
    no token and loads it again where it is unpickled.
    """

    transport = "tcp"

    def __init__(
        self,
        address: str | tuple[str, int],
        token: bytes | str | None = None,
        call_timeout: float | None = None,
        name: str | None = None,
        *,
        token_file: str | os.PathLike | None = None,
        connect_timeout: float = calls.CONNECT_TIMEOUT_S,
        max_frame: int = MAX_FRAME,
    ):
        host, port = parse_address(address)
        self.address = join_address(host, port)
        self.call_timeout = check_call_timeout(call_timeout)
        self.connect_timeout = connect_timeout
        self._name = name or self.address
        self._token = load_token(token, token_file)
        self._token_file = token_file
        self._max_frame = max_frame
        self._ids = itertools.count()
        self.futures = FutureMethods(self)
        self._reset()

    def _reset(self) -> None:
        # in a forked child: the parent's connection and reader are not ours (closing
        # the connection would shut it down for the parent too): drop them
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._connecting = threading.Lock()
        self._link: _Link | None = None
        self._closed = False

    def __reduce__(self):
        return (_client, (self.address, self.call_timeout, self._name, self._token_file, self.connect_timeout))

    def __repr__(self) -> str:
        return f"TcpRpcClient({self._name!r})"

    # -- calls -------------------------------------------------------------------------

    def call(self, method: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Call ``method(*args, **kwargs)`` on the server and wait for its result."""
        fut, link, call_id, deadline = self._submit(method, args, kwargs)
        try:
            return fut.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            if fut.done():
                return fut.result()  # it ended meanwhile, or raised a TimeoutError of its own
            link.pending.pop(call_id, None)
            raise timeout_error(method, self._name, self.call_timeout) from None

    def call_future(self, method: str, args: tuple = (), kwargs: dict | None = None) -> Future:
        """Like ``call``, but returns a Future of the result once the call is sent."""
        try:
            return self._submit(method, args, kwargs)[0]
        except BaseException as e:
            fut: Future = Future()
            fut.set_exception(e)
            return fut

    def close(self) -> None:
        """Close the connection; calls in flight fail with ``Closed``. Idempotent."""
        if self._pid != os.getpid():
            return self._reset()
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            link.conn.close()
            if link.reader is not threading.current_thread():
                link.reader.join()

    def __enter__(self) -> TcpRpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _submit(self, method: str, args: tuple, kwargs: dict | None) -> tuple[Future, _Link, int, float | None]:
        if self._pid != os.getpid():
            self._reset()
        if self._closed:
            raise Closed(f"client of {self._name!r} is closed: cannot call {method!r}")
        deadline = None if self.call_timeout is None else time.monotonic() + self.call_timeout
        payload = encode_message((method, args, kwargs or {}))
        size = message_size(payload)
        if size > self._max_frame:
            raise ValueError(
                f"the arguments of {method!r} are {size} bytes; one call carries at most {self._max_frame}"
            )
        call_id = next(self._ids)
        fut: Future = Future()
        while True:
            link = self._link or self._connect(deadline, method)
            with link.lock:
                if not link.dead:
                    link.pending[call_id] = (fut, deadline, method)
                    break
            # that connection broke before the call was sent: it is safe to make anew
        try:
            link.conn.send(Kind.PICKLE, *payload, tag=call_id)
        except ConnectionError as e:
            link.error = str(e)
            link.conn.close()  # the reader fails every call of the link, this one too
        return fut, link, call_id, deadline

    def _connect(self, deadline: float | None, method: str) -> _Link:
        with self._connecting:
            if self._link is not None:
                return self._link
            conn = self._dial(deadline, method)
            set_keepalive(conn.sock)
            link = _Link(conn)
            link.reader = threading.Thread(target=self._read, args=(link,), name="shmpad-tcp-rpc-replies", daemon=True)
            with self._lock:
                if self._closed:  # closed while we dialled
                    conn.close()
                    raise Closed(f"client of {self._name!r} was closed: cannot call {method!r}")
                self._link = link
            link.reader.start()
            return link

    def _dial(self, deadline: float | None, method: str) -> Connection:
        """Connect, retrying while the server refuses (it is not listening yet)."""
        give_up = deadline if deadline is not None else time.monotonic() + self.connect_timeout
        delay = 0.005
        while True:
            left = give_up - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                return connect(self.address, self._token, timeout=min(left, 10.0), max_frame=self._max_frame)
            except AuthError:
                raise
            except (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError, TimeoutError) as e:
                if time.monotonic() + delay >= give_up:
                    if deadline is not None:
                        raise timeout_error(method, self._name, self.call_timeout) from None
                    raise Timeout(
                        f"no courier server at {self.address} ({self._name!r}) accepted a connection within "
                        f"{self.connect_timeout:g} s (calling {method!r}; last: {type(e).__name__}); is its program running?"
                    ) from None
            except OSError as e:
                raise ConnectionError(f"cannot reach {self._name!r} at {self.address}: {e}") from None
            time.sleep(delay)
            delay = min(delay * 2, calls.POLL_S)

    def _read(self, link: _Link) -> None:
        """Complete the futures of ``link``'s replies until the connection ends; then
        fail those still pending."""
        conn, pending = link.conn, link.pending
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        reason = None
        expire_at = time.monotonic() + calls.POLL_S
        try:
            while not conn.closed:
                ready = poller.poll(calls.POLL_S * 1000)
                if time.monotonic() >= expire_at:  # also while replies keep coming
                    self._expire(pending)
                    expire_at = time.monotonic() + calls.POLL_S
                if not ready:
                    continue
                frame = conn.recv()
                if frame.kind != Kind.PICKLE:
                    reason = (
                        f"the server sent a frame of kind {frame.kind}; an RPC connection carries only PICKLE frames"
                    )
                    break
                parts = split_message(frame.payload)
                entry = pending.pop(frame.tag, None)
                if entry is None:
                    continue  # its caller stopped waiting (timeout, cancel)
                try:
                    value = unpack_reply(frame.flags & 1, parts, load_message)
                except BaseException as e:
                    settle(entry[0], Future.set_exception, e)
                else:
                    settle(entry[0], Future.set_result, value)
        except (ConnectionError, OSError, ValueError) as e:  # FrameError is a ConnectionError
            reason = str(e)
        finally:
            reason = link.error or reason or "the connection was closed"
            if not self._closed:
                level = logging.WARNING if pending else logging.INFO
                log.log(
                    level,
                    "RPC connection to %s (%s) ended with %d call(s) in flight: %s",
                    self.address,
                    self._name,
                    len(pending),
                    reason,
                )
            conn.close()
            with self._lock:
                if self._link is link:
                    self._link = None
            with link.lock:
                link.dead = True
            for call_id in list(pending):
                entry = pending.pop(call_id, None)
                if entry is not None:
                    settle(entry[0], Future.set_exception, self._broken(entry[2], reason))

    def _broken(self, method: str, reason: str) -> BaseException:
        if self._closed:
            return Closed(f"client of {self._name!r} closed before {method!r} answered")
        return ConnectionError(
            f"connection to {self._name!r} at {self.address} broke before {method!r} answered: {reason}"
        )

    def _expire(self, pending: dict) -> None:
        now = time.monotonic()
        for call_id, (fut, deadline, method) in list(pending.items()):
            if deadline is not None and now >= deadline and pending.pop(call_id, None) is not None:
                settle(fut, Future.set_exception, timeout_error(method, self._name, self.call_timeout))


def _client(
    address: str, call_timeout: float | None, name: str, token_file: Any, connect_timeout: float
) -> TcpRpcClient:
    return TcpRpcClient(address, None, call_timeout, name, token_file=token_file, connect_timeout=connect_timeout)
