"""``Client``: portal's RPC client on shmpad's transports.

``client.method(*args)`` sends a call and returns a ``Future``. At most ``maxinflight``
calls are in flight: the next call waits (reading replies) until one is answered. A
call's error arrives as ``RuntimeError`` with the server's message; an error that no
``result()`` raised before its future was collected is raised by the next call.

A background thread keeps the link (``link``). With ``autoconn=True`` (portal's
default) it connects at once and again whenever the link breaks, and the calls in
flight are sent again on the new link; a call made while there is no link waits for
one. With ``autoconn=False`` it connects only when ``connect()`` asks, and when the link
breaks the calls in flight fail with ``Disconnected``, as does every call until
``connect()`` succeeds again: the caller decides when to reconnect, as DreamerV3's
environments do.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import weakref
from typing import Any, Callable

from shmpad._checks import check_int, check_timeout
from shmpad.errors import AuthError
from shmpad.portal import options, packing, runtime, transport
from shmpad.portal.client_socket import Disconnected
from shmpad.portal.futures import Future
from shmpad.portal.link import WrongProtocol, from_server, open_link

__all__ = ["Client", "Disconnected"]

_TICK_S = 0.2
"""how often the link keeper looks up from a wait (to notice close())"""


class Client:
    def __init__(self, addr: int | str, name: str = "Client", maxinflight: int = 16, **kwargs: Any):
        self.maxinflight = check_int("maxinflight", maxinflight, minimum=1)
        self.options = options.client_options(kwargs, "Client")
        options.refuse_keepalive(self.options)
        self.autoconn = self.options.autoconn
        self.connect_wait = self.options.connect_wait
        self.logging = self.options.logging
        self.host, self.port = transport.parse_address(addr, self.options.ipv6)
        self.name = name
        self.reqnum = itertools.count()
        self.futures: dict[int, Future] = {}
        self.errors: collections.deque[BaseException] = collections.deque()
        self.cond = threading.Condition()
        self._sending = threading.Lock()  # a call and a resend of the calls in flight go out one at a time, in order
        self.sendrate = [0, time.time()]
        self.recvrate = [0, time.time()]
        self.waitmean = [0, 0.0]
        self._link: Any = None
        self._fatal: BaseException | None = None
        self._want = threading.Event()
        self._connected = threading.Event()
        self._closing = threading.Event()
        self._keeper = threading.Thread(target=self._keep, name=f"{name}Link", daemon=True)
        self._keeper.start()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def transport(self) -> str | None:
        """``"shm"`` or ``"tcp"`` while connected, else None."""
        link = self._link
        return None if link is None else link.transport

    def __getattr__(self, name: str) -> Callable[..., Future]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*data: Any) -> Future:
            return self.call(name, *data)

        call.__name__ = name
        self.__dict__[name] = call  # later lookups skip __getattr__
        return call

    def stats(self) -> dict:
        now = time.time()
        stats = {
            "inflight": len(self.futures),
            "numsend": self.sendrate[0],
            "numrecv": self.recvrate[0],
            "sendrate": self.sendrate[0] / max(now - self.sendrate[1], 1e-9),
            "recvrate": self.recvrate[0] / max(now - self.recvrate[1], 1e-9),
            "waitmean": self.waitmean[0] and self.waitmean[1] / self.waitmean[0],
        }
        self.sendrate = [0, now]
        self.recvrate = [0, now]
        self.waitmean = [0, 0.0]
        return stats

    def connect(self, timeout: float | None = None) -> bool:
        """Wait until connected (asking for it when ``autoconn`` is off); False if
        ``timeout`` s passed first."""
        timeout = check_timeout(timeout)
        if not self.autoconn:
            self._want.set()
        return self._connected.wait(timeout)

    def call(self, method: str, *data: Any) -> Future:
        reqnum = next(self.reqnum)
        start = time.monotonic()
        while len(self.futures) >= self.maxinflight:
            oldest = next(iter(self.futures.values()), None)
            if oldest is not None:
                oldest.wait(_TICK_S)  # reads replies meanwhile
            if not self.autoconn and not self._connected.is_set():
                raise Disconnected(f"client {self.name!r} is not connected to {self.host}:{self.port}")
        self.waitmean[1] += time.monotonic() - start
        self.waitmean[0] += 1
        self.sendrate[0] += 1
        if self.errors:  # the error of a future nobody looked at
            raise self.errors.popleft()
        if self._fatal is not None:
            raise self._fatal
        data = packing.check(list(data))
        fut = Future()
        fut.method, fut.data, fut.reqnum = method, data, reqnum
        while True:
            if self._link is None:
                if not self.autoconn:
                    fut.rai[0] = True
                    raise Disconnected(f"client {self.name!r} is not connected to {self.host}:{self.port}")
                self._connected.wait(_TICK_S)
                if self._closing.is_set():
                    raise Disconnected(f"client {self.name!r} is closed")
                if self._fatal is not None:
                    raise self._fatal
                continue
            with self._sending:
                link = self._link  # the link the calls in flight were sent on (again), if still up
                if link is None:
                    continue
                with self.cond:
                    self.futures[reqnum] = fut
                self._send(fut, link)
            return fut

    def close(self, timeout: float | None = None) -> None:
        self._closing.set()
        self._want.set()
        with self.cond:
            pending, self.futures = list(self.futures.values()), {}
        for fut in pending:
            self._seterr(fut, Disconnected(f"client {self.name!r} was closed"))
        if self._keeper is not threading.current_thread():
            self._keeper.join(timeout)

    def __repr__(self) -> str:
        return f"Client(name={self.name!r}, addr='{self.host}:{self.port}', connected={self.connected})"

    # -- the link ------------------------------------------------------------------------

    def _send(self, fut: Future, link: Any) -> None:
        try:
            inner = link.call(fut.method, fut.data)
        except Exception as e:
            if from_server(e):
                raise
            return  # the link is going: the keeper sends it again or fails it
        fut.inner = inner
        inner.add_done_callback(lambda f: self._done(fut, f))

    def _done(self, fut: Future, inner: Any) -> None:
        if inner is not fut.inner or fut.don:
            return  # a call sent again since; or settled by a disconnect
        e = inner.exception()
        if e is not None and not from_server(e):
            return  # the transport's failure: the keeper sees the link broken
        fut.inner = None  # no cycle through the transport's future: a dropped future is collected at once
        with self.cond:
            if self.futures.pop(fut.reqnum, None) is None:
                return
            self.cond.notify_all()
        self.recvrate[0] += 1
        if e is None:
            fut.set_result(packing.normalize(inner.result()))
        else:
            error = e if type(e) is RuntimeError else RuntimeError(str(e))
            # where it was raised here is of no use (the server's traceback is its cause), and
            # those frames lead back to the waiter's, which holds the future: drop them
            error.__traceback__ = None
            self._seterr(fut, error)

    def _seterr(self, fut: Future, e: BaseException) -> None:
        if fut.don:
            return
        fut.set_error(e)
        raised, errors = fut.rai, self.errors
        weakref.finalize(fut, lambda: None if raised[0] else errors.append(e))

    def _keep(self) -> None:
        while not self._closing.is_set():
            link = self._link
            if link is not None:
                if link.wait_broken(_TICK_S):
                    self._lost(link)
                continue
            if not self.autoconn and not self._want.wait(_TICK_S):
                continue
            if self._closing.is_set():
                break
            host, port = self.host, self.port
            resolver = runtime.current().resolver
            if resolver is not None:
                host, port = resolver((host, port))
            try:
                link = open_link(host, int(port), self.name, _TICK_S, self.options.handshake, self.options.max_msg_size)
            except AuthError as e:
                self._fatal = e
                self._log(f"Cannot connect: {e}")
                self._closing.wait(1.0)
                continue
            except WrongProtocol as e:
                self._log(f"Cannot connect to {host}:{port}: {e}")
                link = None
            if link is None:
                self._closing.wait(self.connect_wait)
                continue
            self._log(f"Connected to {host}:{port} ({link.transport})")
            # every call not answered goes out again, oldest first, before any new call:
            # no more than were in flight, so at most maxinflight
            with self._sending:
                with self.cond:
                    resend = [f for f in self.futures.values() if not f.don]
                for fut in resend:
                    self._send(fut, link)
                self._link = link
            self._want.clear()
            self._connected.set()
        link, self._link = self._link, None
        self._connected.clear()
        if link is not None:
            link.close()

    def _lost(self, link: Any) -> None:
        self._log(f"Connection to server lost ({self.host}:{self.port})")
        with self.cond:
            inners = [f.inner for f in self.futures.values() if f.inner is not None]
        link.drain(inners)  # the replies that came before the end count: those calls ran
        with self.cond:
            self._link = None
            self._connected.clear()
            pending = list(self.futures.values())
            if not self.autoconn:
                self.futures = {}
            for fut in pending:
                fut.inner = None  # a late answer on the old link settles nothing
            self.cond.notify_all()
        link.close()
        if not self.autoconn:
            for fut in pending:
                self._seterr(fut, Disconnected(f"lost the connection to {self.host}:{self.port} ({self.name})"))

    def _log(self, message: str) -> None:
        if self.logging:
            runtime.current().print(self.name, message, color=self.options.logging_color)
