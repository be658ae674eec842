"""The shared-memory RPC client: ``client.m(...)`` blocks, ``client.futures.m(...)``
returns a Future; calls go into the server's request ring (``shm_server``).

A blocking call takes an SPSC reply ring from the client's pool for its duration (one
call in flight per ring, so one writer at a time); futures share the client's one MPMC
ring, read by the threads waiting on them (and a background reader). A reply whose
``call_id`` is not the awaited one (the late reply of a call that timed out) is
dropped, and a ring that saw a timeout is never reused.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import traceback
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import wait as wait_futures
from typing import Any, Callable

from shmpad.errors import Closed, SegmentError, Timeout, WouldBlock
from shmpad.ringbuf.mpmc import MPMCRing
from shmpad.ringbuf.spsc import SPSCRing
from shmpad.rpc import calls
from shmpad.rpc.calls import FutureMethods, MethodCalls, check_call_timeout, settle, timeout_error
from shmpad.rpc.codec import REPLY, drop, encode, unpack_reply
from shmpad.rpc.future import PumpedFuture
from shmpad.rpc.shm_server import SLOT_SIZE, SYNC_TAG
from shmpad.shm.pids import current_pid

__all__ = ["RpcClient"]

REPLY_CAPACITY = 4
FUTURES_CAPACITY = 256
# How long a thread reading replies for futures keeps its turn before it looks
# whether another should read.
_PUMP_TURN_S = 0.002
# After its server closed the request ring, how long a caller still waits for
# the reply of a request the server had already taken.
CLOSED_GRACE_S = 1.0


class RpcClient(MethodCalls):
    """Calls a server's methods: ``client.m(...)`` blocks, ``client.futures.m(...)``
    returns a ``concurrent.futures.Future``. Safe to share between threads.

    ``call_timeout`` (seconds, None: no limit) bounds every call; a call that does
    not complete in time raises ``shmpad.Timeout``. If the server does not exist yet,
    a call waits for it (within the same limit).
    """

    transport = "shm"

    def __init__(self, address: str, call_timeout: float | None = None, name: str | None = None):
        if not isinstance(address, str):
            raise TypeError(f"address must be a str, got {type(address).__name__}")
        self.address = address
        self.call_timeout = check_call_timeout(call_timeout)
        self._name = name or address
        self._ids = itertools.count()
        self.futures = FutureMethods(self)
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._pid = current_pid()
        self._request: MPMCRing | None = None
        self._pool: list[SPSCRing] = []
        self._all_rings: list[Any] = []
        self._futures_ring: MPMCRing | None = None
        self._futures_name: str | None = None  # the ring's name, looked up once: a property
        self._pending: dict[int, tuple[Future, float | None, str]] = {}
        self._reader: threading.Thread | None = None
        self._closed = False
        self._closed_at: float | None = None
        self._pump_lock = threading.Lock()
        self._pump_cond = threading.Condition()
        self._pump_idle = False
        self._last_pump = 0.0

    def __reduce__(self):
        return (RpcClient, (self.address, self.call_timeout, self._name))

    def __repr__(self) -> str:
        return f"RpcClient({self._name!r})"

    # -- calls -------------------------------------------------------------------------

    def call(self, method: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Call ``method(*args, **kwargs)`` on the server and wait for its result."""
        if self._pid != current_pid():
            self._forked()
        deadline = None if self.call_timeout is None else time.monotonic() + self.call_timeout
        request = self._request or self._connect(deadline, method)
        try:
            ring = self._pool.pop()
        except IndexError:
            ring = self._new_ring(SPSCRing, REPLY_CAPACITY, SYNC_TAG)
        call_id = next(self._ids)
        try:
            self._send(request, (call_id, ring.name, method, args, kwargs or {}, time.monotonic_ns()), deadline, method)
        except BaseException:
            self._pool.append(ring)  # nothing was queued: the ring is clean
            raise
        closed_at = None
        while True:
            if deadline is None:
                wait = calls.POLL_S
            else:
                wait = min(calls.POLL_S, deadline - time.monotonic())
            try:
                if wait <= 0:
                    raise Timeout
                data = ring.get_bytes(timeout=wait)
            except Timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    self._discard(ring)
                    raise self._timeout_error(method) from None
                if request.closed:
                    closed_at = closed_at or time.monotonic()
                    if time.monotonic() - closed_at > CLOSED_GRACE_S:
                        self._discard(ring)
                        raise Closed(f"courier server {self._name!r} stopped before answering {method!r}") from None
                continue
            except Closed:
                raise Closed(f"client of {self._name!r} was closed during a call to {method!r}") from None
            cid, ok = REPLY.unpack_from(data)
            if cid == call_id:
                break
            drop(data[REPLY.size :])  # the late reply of an earlier call
        self._pool.append(ring)
        return unpack_reply(ok, data[REPLY.size :])

    def call_future(self, method: str, args: tuple = (), kwargs: dict | None = None) -> Future:
        """Like ``call``, but returns at once with a Future of the result."""
        if self._pid != current_pid():
            self._forked()
        fut = PumpedFuture(self)
        deadline = None if self.call_timeout is None else time.monotonic() + self.call_timeout
        request = self._request or self._connect(deadline, method)
        reply_to = self._futures_name or self._start_futures().name
        call_id = next(self._ids)
        self._pending[call_id] = (fut, deadline, method)
        if self._pump_idle:
            with self._pump_cond:
                self._pump_cond.notify()
        try:
            self._send(request, (call_id, reply_to, method, args, kwargs or {}, time.monotonic_ns()), deadline, method)
        except BaseException as e:
            self._pending.pop(call_id, None)
            fut.set_exception(e)
        return fut

    def close(self) -> None:
        """Free this client's reply rings; pending futures fail with ``Closed``. Idempotent."""
        if self._pid != current_pid():
            self._reset()
            return
        self._closed = True
        self._fail_pending(lambda method: Closed(f"client of {self._name!r} closed before {method!r} answered"))
        reader = self._reader
        if reader is not None:
            with self._pump_cond:
                self._pump_cond.notify_all()
            reader.join()
        for ring in self._all_rings:
            ring.close()
        self._all_rings.clear()
        self._pool.clear()
        self._fail_pending(lambda method: Closed(f"client of {self._name!r} closed before {method!r} answered"))

    def __enter__(self) -> "RpcClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _forked(self) -> None:
        """In a forked child, the parent's rings, locks and reader thread are not ours
        (a lock another parent thread held at the fork would stay held)."""
        self._reset()

    def _connect(self, deadline: float | None, method: str) -> MPMCRing:
        """Attach the request ring, waiting for it to exist (at most ``CONNECT_TIMEOUT_S``
        without a call_timeout: an address nobody will create must not hang the caller)."""
        delay = 0.001
        give_up = time.monotonic() + calls.CONNECT_TIMEOUT_S
        while True:
            try:
                ring = MPMCRing.attach(self.address)
                break
            except SegmentError:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise self._timeout_error(method) from None
                if deadline is None and now >= give_up:
                    raise Timeout(
                        f"no courier server at {self.address!r} appeared within {calls.CONNECT_TIMEOUT_S:g} s "
                        f"(calling {method!r}); is its program running?"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, calls.POLL_S)
        with self._lock:
            if self._request is None:
                self._request = ring
        return self._request

    def _new_ring(self, kind, capacity: int, tag: str):
        ring = kind.create(capacity, SLOT_SIZE, name=_ring_name(tag))
        with self._lock:
            self._all_rings.append(ring)
        return ring

    def _discard(self, ring) -> None:
        """A ring whose call timed out may still get that late reply: never reuse it."""
        with self._lock:
            if ring in self._all_rings:
                self._all_rings.remove(ring)
        ring.close()

    def _send(self, request: MPMCRing, msg: tuple, deadline: float | None, method: str) -> None:
        payload = encode(msg, request.slot_size)
        try:
            request.put_nowait(payload)
            return
        except WouldBlock:
            pass
        except Closed:
            raise Closed(f"courier server {self._name!r} is stopped: cannot call {method!r}") from None
        while True:
            wait = calls.POLL_S if deadline is None else min(calls.POLL_S, deadline - time.monotonic())
            if wait <= 0:
                raise self._timeout_error(method)
            try:
                request.put(payload, timeout=wait)
                return
            except Timeout:
                continue
            except Closed:
                raise Closed(f"courier server {self._name!r} is stopped: cannot call {method!r}") from None

    def _timeout_error(self, method: str) -> Timeout:
        return timeout_error(method, self._name, self.call_timeout)

    def _start_futures(self) -> MPMCRing:
        with self._lock:
            if self._futures_ring is None:
                ring = MPMCRing.create(FUTURES_CAPACITY, SLOT_SIZE, name=_ring_name("f"))
                self._all_rings.append(ring)
                self._reader = threading.Thread(
                    target=self._background_pump, args=(ring,), name="shmpad-rpc-futures", daemon=True
                )
                self._futures_ring = ring
                self._futures_name = ring.name
                self._reader.start()
        return self._futures_ring

    # Replies to futures are read by whichever thread waits: a caller blocked in
    # ``result()`` reads the futures ring itself (no thread hand-off on the way back),
    # completing other callers' futures as it goes; the background thread reads only
    # while futures are pending and no caller has read for a while (callbacks,
    # ``concurrent.futures.wait``), and checks deadlines.

    def _pump(self, fut: "PumpedFuture", timeout: float | None) -> None:
        """Read replies until ``fut`` is done or ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        lock = self._pump_lock
        while not fut._finished():
            self._last_pump = time.monotonic()
            if not lock.acquire(False):
                wait = _PUMP_TURN_S if deadline is None else min(_PUMP_TURN_S, deadline - self._last_pump)
                if wait <= 0:
                    return
                if not lock.acquire(timeout=wait):
                    wait_futures([fut], timeout=wait)  # another thread reads: it completes ours
                    continue
            try:
                while not fut._finished() and not self._closed:
                    if deadline is None:
                        self._read_replies(calls.POLL_S)
                    else:
                        wait = min(calls.POLL_S, deadline - time.monotonic())
                        if wait <= 0:
                            return
                        self._read_replies(wait)
            finally:
                lock.release()
                self._last_pump = time.monotonic()
            if self._closed:
                return

    def _read_replies(self, timeout: float) -> None:
        """Complete the futures of every reply waiting, waiting up to ``timeout`` for
        the first: with calls in flight replies come in runs, and a future completed
        here is one whose ``result()`` reads nothing."""
        ring = self._futures_ring
        try:
            data = ring.get_bytes(timeout=timeout)
        except Timeout:
            self._expire()
            request = self._request
            if self._pending and request is not None and request.closed:
                self._closed_at = self._closed_at or time.monotonic()
                if time.monotonic() - self._closed_at > CLOSED_GRACE_S:
                    self._fail_pending(
                        lambda m: Closed(f"courier server {self._name!r} stopped before answering {m!r}")
                    )
            return
        except Closed:
            return
        self._complete(data)
        for _ in range(FUTURES_CAPACITY):
            try:
                data = ring.get_bytes_nowait()
            except (WouldBlock, Closed):
                return
            self._complete(data)

    def _complete(self, data: bytes) -> None:
        """Complete the future that the reply ``data`` answers."""
        cid, ok = REPLY.unpack_from(data)
        entry = self._pending.pop(cid, None)
        if entry is None:
            drop(data[REPLY.size :])  # expired or cancelled already
            return
        fut = entry[0]
        try:
            value = unpack_reply(ok, data[REPLY.size :])
        except BaseException as e:
            settle(fut, PumpedFuture.set_exception, e)
            return
        try:
            fut.set_result(value)
        except InvalidStateError:
            pass  # the caller cancelled it: the reply has nobody to go to

    def _background_pump(self, ring: MPMCRing) -> None:
        cond = self._pump_cond
        while not self._closed:
            if not self._pending:
                with cond:
                    self._pump_idle = True
                    if not self._pending:
                        cond.wait(calls.POLL_S)
                    self._pump_idle = False
                continue
            self._expire()
            # a caller waiting in result() reads (and just read): leave it the ring
            if time.monotonic() - self._last_pump < _PUMP_TURN_S or not self._pump_lock.acquire(False):
                time.sleep(_PUMP_TURN_S)
                continue
            try:
                self._read_replies(_PUMP_TURN_S)
            except Exception:
                traceback.print_exc()  # keep serving the other futures
            finally:
                self._pump_lock.release()

    def _expire(self) -> None:
        now = time.monotonic()
        for call_id, (fut, deadline, method) in list(self._pending.items()):
            if deadline is not None and now >= deadline and self._pending.pop(call_id, None) is not None:
                settle(fut, PumpedFuture.set_exception, self._timeout_error(method))

    def _fail_pending(self, error: Callable[[str], BaseException]) -> None:
        for call_id in list(self._pending):
            entry = self._pending.pop(call_id, None)
            if entry is not None:
                settle(entry[0], PumpedFuture.set_exception, error(entry[2]))


_ring_ids = itertools.count()


def _ring_name(tag: str) -> str:
    # the tag after the last dot tells the server which kind of ring to attach
    return f"/shmpad.{os.getpid()}.r{next(_ring_ids)}.{os.urandom(3).hex()}.{tag}"
