"""Same-host RPC over shared-memory rings: the transport under ``CourierNode``.

A server is reached through one MPMC *request ring*, which can be created before
the server starts (the launcher does), so a call made early simply waits in it.
Every request is one message::

    pickle((call_id, reply_ring_name, method, args, kwargs))

and names the ring its reply goes to: for a blocking call an SPSC ring taken from
the client's pool for the duration of the call (one call in flight per ring, so
one writer at a time); for futures the client's one MPMC ring, read by the
threads waiting on them (and a background reader). A reply is a header
``(call_id, ok)`` then ``pickle(value)``, where ``value`` is the result, or
``(exception, remote traceback)``.
A reply whose ``call_id`` is not the awaited one (the late reply of a call that
timed out) is dropped, and a ring that saw a timeout is never reused.

A message larger than a slot travels in a one-off segment that the receiver
unlinks; the slot carries a ``_Spill`` naming it.

How a call and its outcome are pickled, reported and raised again (``dumps``,
``failure``, ``unpack_reply``) and the clients' surface (``MethodCalls``,
``FutureMethods``) are shared with the TCP transport, ``shmpad.rpc.tcp_client``.

The server runs handlers concurrently on up to ``threads`` threads, leader /
followers style: one thread at a time waits on the request ring; when it takes a
request it hands the wait to the next thread and runs the handler itself, so a
call crosses no thread boundary on the server.
"""

from __future__ import annotations

import datetime
import itertools
import os
import pickle
import struct
import threading
import time
import traceback
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED
from concurrent.futures import wait as wait_futures
from typing import Any, Callable

import cloudpickle

from shmpad.errors import Closed, SegmentError, ShmpadError, Timeout, WouldBlock
from shmpad.ringbuf.mpmc import MPMCRing
from shmpad.ringbuf.segment import Segment
from shmpad.ringbuf.spsc import SPSCRing

__all__ = ["RpcServer", "RpcClient", "RemoteTraceback", "RemoteError", "create_request_ring"]

REQUEST_CAPACITY = 64
SLOT_SIZE = 64 * 1024
REPLY_CAPACITY = 4
FUTURES_CAPACITY = 256
# How often a blocked wait looks up from its ring: to notice stop, a closed
# server, or a deadline.
POLL_S = 0.1
# How long a thread reading replies for futures keeps its turn before it looks
# whether another should read.
_PUMP_TURN_S = 0.002
# How long a client without call_timeout waits for a server's request ring to exist.
CONNECT_TIMEOUT_S = 60.0
# How long a server keeps trying to hand a reply to a client that does not drain.
REPLY_PUT_TIMEOUT_S = 10.0
# After its server closed the request ring, how long a caller still waits for
# the reply of a request the server had already taken.
CLOSED_GRACE_S = 1.0
# A handler running this long makes the server hand its ring to another thread.
_TICK_S = 0.005
# After this many ticks with no handler running, the server's monitor sleeps
# until a handler starts.
_IDLE_TICKS = 200
_SPILL_KIND = "rpcspill"


class RemoteTraceback(Exception):
    """Set as ``__cause__`` of an exception re-raised from a server: its text is the
    traceback in the server process."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + self.tb


class RemoteError(ShmpadError):
    """A server raised an exception that could not be sent back as itself."""


class _Spill:
    """A message too large for a slot, left in segment ``name`` (``size`` bytes)."""

    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int):
        self.name = name
        self.size = size

    def __reduce__(self):
        return (_Spill, (self.name, self.size))


def dumps(obj: Any, buffers: list | None = None) -> bytes:
    """``obj`` pickled (protocol 5), by cloudpickle if pickle cannot. With ``buffers``,
    large contiguous buffers (numpy arrays) are appended to it instead of copied in."""
    callback = None if buffers is None else buffers.append
    try:
        return pickle.dumps(obj, protocol=5, buffer_callback=callback)
    except (pickle.PicklingError, AttributeError, TypeError):
        # lambdas, local classes: cloudpickle pickles them by value
        if buffers is not None:
            buffers.clear()
        return cloudpickle.dumps(obj, protocol=5, buffer_callback=callback)


def _encode(obj: Any, slot_size: int) -> bytes:
    data = dumps(obj)
    return data if len(data) <= slot_size else _spill(data)


# A reply is this header (call id, 1 if the call returned) then the pickled result or
# (exception, traceback): the call it answers is known before anything is unpickled,
# so a result that cannot be unpickled fails that call, not whoever reads it.
_REPLY = struct.Struct("<qB")


def _encode_reply(call_id: int, ok: bool, value: Any, slot_size: int) -> bytes:
    body = dumps(value)
    if _REPLY.size + len(body) > slot_size:
        body = _spill(body)
    return _REPLY.pack(call_id, ok) + body


def unpack_reply(ok: int, body: Any, decode: Callable[[Any], Any] | None = None) -> Any:
    """The result of a reply's body, or its exception raised (``decode`` unpickles the
    body; by default as this module's replies, spills included)."""
    try:
        value = (decode or _decode)(body)
    except Exception as e:
        raise RemoteError(f"the reply could not be unpickled here: {type(e).__name__}: {e}") from None
    if ok:
        return value
    exc, tb = value
    if not isinstance(exc, BaseException):
        exc = RemoteError(repr(exc))
    exc.__cause__ = RemoteTraceback(tb)
    raise exc


def _drop(body: bytes) -> None:
    """Consume an unwanted reply's body (a spilled one owns a segment)."""
    try:
        _decode(body)
    except Exception:
        pass


def _spill(data: bytes) -> bytes:
    """``data`` moved to a one-off segment; returns the slot message that names it."""
    seg = Segment.create(_SPILL_KIND, {}, len(data))
    seg.data[: len(data)] = memoryview(data).cast("B")
    name = seg.name
    seg.disown()  # the receiver unlinks it; the janitor does if nobody reads it
    seg.close()
    return pickle.dumps(_Spill(name, len(data)), protocol=5)


def _decode(data: bytes) -> Any:
    obj = pickle.loads(data)
    if type(obj) is _Spill:
        seg = Segment.attach(obj.name, _SPILL_KIND)
        try:
            raw = bytes(seg.data[: obj.size])
        finally:
            seg.unlink()
            seg.close()
        obj = pickle.loads(raw)
    return obj


def create_request_ring(capacity: int = REQUEST_CAPACITY, slot_size: int = SLOT_SIZE) -> MPMCRing:
    """A new request ring; its name is the address servers serve and clients call."""
    return MPMCRing.create(capacity, slot_size)


def public_methods(obj: Any) -> Callable[[str], Callable]:
    """A lookup from method name to bound method that admits only public names
    and ``__call__``; other names raise ``AttributeError``."""
    cache: dict[str, Callable] = {}
    cls = type(obj).__name__

    def lookup(name: str) -> Callable:
        fn = cache.get(name)
        if fn is not None:
            return fn
        if not isinstance(name, str) or (name.startswith("_") and name != "__call__"):
            raise AttributeError(f"{cls!r} object has no public method {name!r}: only names not starting with '_' and __call__ can be called")
        fn = getattr(obj, name, None)
        if fn is None or not callable(fn):
            raise AttributeError(f"{cls!r} object has no public method {name!r}")
        cache[name] = fn
        return fn

    return lookup


class RpcServer:
    """Serves ``obj``'s public methods (and ``__call__``) on a request ring.

    ``address`` names an existing request ring (see ``create_request_ring``); without
    it the server creates one, owned by this process. ``threads`` bounds how many
    handlers run at once.
    """

    def __init__(self, obj: Any, address: str | None = None, threads: int = 16):
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an int, got {type(threads).__name__}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._ring = create_request_ring() if address is None else MPMCRing.attach(address)
        self.address = self._ring.name
        self._lookup = public_methods(obj)
        self._max_threads = threads
        self._stop = threading.Event()
        self._replies: dict[str, MPMCRing | SPSCRing] = {}
        self._replies_lock = threading.Lock()
        # Leadership: the thread whose number is in _leader waits on the ring and runs
        # what it takes inline; _busy[n] is when thread n started its handler (0: not
        # in one). The monitor hands the ring to another thread when the leader has
        # been in one handler for a tick.
        self._leader: int | None = None
        self._busy: dict[int, float] = {}
        self._workers: list[threading.Thread] = []
        self._parked = 0
        self._unpark = threading.Semaphore(0)
        self._count = threading.Lock()
        self._monitor_idle = False
        self._monitor_wake = threading.Semaphore(0)

    def serve(self) -> None:
        """Serve until ``stop()`` or until the request ring is closed; returns once
        every handler that was running has returned."""
        monitor = threading.Thread(target=self._monitor, name="shmpad-rpc-monitor", daemon=True)
        monitor.start()
        try:
            self._work(0)
        finally:
            self._stop.set()
            self._monitor_wake.release()
            monitor.join()
            for t in list(self._workers):
                t.join()

    def start(self) -> threading.Thread:
        """``serve()`` in a daemon thread."""
        t = threading.Thread(target=self.serve, name="shmpad-rpc-server", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        """Stop taking requests (within ``POLL_S``); handlers running finish."""
        self._stop.set()
        self._monitor_wake.release()

    def close(self) -> None:
        """Stop and close the request ring for every process: waiting servers return and
        clients' calls raise ``Closed``."""
        self.stop()
        self._ring.close()
        with self._replies_lock:
            self._replies.clear()

    def _work(self, me: int) -> None:
        ring = self._ring
        busy = self._busy
        stop = self._stop
        busy[me] = 0.0
        while not stop.is_set():
            leader = self._leader
            if leader != me:
                if leader is None:
                    self._leader = me
                else:
                    self._park()
                continue
            try:
                data = ring.get_bytes(timeout=POLL_S)
            except Timeout:
                continue
            except Closed:
                stop.set()
                break
            busy[me] = time.monotonic()
            if self._monitor_idle:
                self._monitor_wake.release()
            self._handle(data)
            busy[me] = 0.0
        with self._count:
            if self._parked:
                self._unpark.release(self._parked)

    def _park(self) -> None:
        with self._count:
            self._parked += 1
        self._unpark.acquire(timeout=POLL_S)
        with self._count:
            self._parked -= 1

    def _monitor(self) -> None:
        """Hands the ring to another thread when the leader is stuck in a handler;
        sleeps through idle stretches without waking."""
        idle_ticks = 0
        while not self._stop.is_set():
            if idle_ticks >= _IDLE_TICKS:
                self._monitor_idle = True
                # a handler that started before the flag was up did not wake us: look again
                leader = self._leader
                if not (leader is not None and self._busy.get(leader, 0.0)):
                    self._monitor_wake.acquire()
                self._monitor_idle = False
                idle_ticks = 0
                continue
            time.sleep(_TICK_S)
            leader = self._leader
            started = self._busy.get(leader, 0.0) if leader is not None else 0.0
            if not started:
                idle_ticks += 1
                continue
            idle_ticks = 0
            if time.monotonic() - started < _TICK_S:
                continue
            with self._count:
                parked = self._parked
                spawn = not parked and len(self._workers) + 1 < self._max_threads
                if spawn or parked:
                    self._leader = None  # the next thread to look takes the ring
                if parked:
                    self._unpark.release()
            if spawn:
                n = len(self._workers) + 1
                t = threading.Thread(target=self._work, args=(n,), name=f"shmpad-rpc-handler-{n}", daemon=True)
                self._workers.append(t)
                t.start()

    def _handle(self, data: bytes) -> None:
        try:
            call_id, reply_to, method, args, kwargs = _decode(data)
        except BaseException:
            traceback.print_exc()  # undecodable request: nobody to tell
            return
        try:
            reply = (call_id, True, self._lookup(method)(*args, **kwargs))
        except BaseException as e:
            reply = (call_id, False, failure(e))
        self._reply(reply_to, reply)

    def _reply(self, reply_to: str, reply: tuple) -> None:
        ring = self._reply_ring(reply_to)
        if ring is None:
            return  # the caller is gone
        call_id, ok, value = reply
        try:
            payload = _encode_reply(call_id, ok, value, ring.slot_size)
        except Exception as e:
            payload = _encode_reply(call_id, False, unpicklable_result(e), ring.slot_size)
        try:
            ring.put(payload, timeout=REPLY_PUT_TIMEOUT_S)
        except Closed:
            with self._replies_lock:  # the caller closed its client: forget its ring
                self._replies.pop(reply_to, None)
        except Timeout:
            pass  # the caller stopped draining: it no longer waits

    def _reply_ring(self, name: str) -> MPMCRing | SPSCRing | None:
        ring = self._replies.get(name)
        if ring is not None:
            return ring
        try:
            ring = (SPSCRing if name.endswith("." + _SYNC_TAG) else MPMCRing).attach(name)
        except SegmentError:
            return None
        with self._replies_lock:
            if len(self._replies) >= 4096:  # clients come and go: forget the oldest
                self._replies.pop(next(iter(self._replies)))
            self._replies[name] = ring
        return ring


_SYNC_TAG = "s"


def failure(exc: BaseException) -> tuple[BaseException, str]:
    """What the reply of a call that raised ``exc`` carries (call it in the ``except``
    block): ``exc`` and the traceback; a ``RemoteError`` in place of an exception that
    cannot be pickled or is not for the caller to re-raise."""
    if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt
        exc = RemoteError(f"the handler raised {type(exc).__name__}: {exc}")
    return _portable(exc), traceback.format_exc()


def unpicklable_result(exc: Exception) -> tuple[RemoteError, str]:
    """The failure a reply carries instead of a result that could not be pickled."""
    err = RemoteError(f"the server could not pickle the result of the call: {type(exc).__name__}: {exc}")
    return err, traceback.format_exc()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a ``RemoteError`` carrying its type and message."""
    try:
        pickle.loads(dumps(exc))
        return exc
    except Exception:
        return RemoteError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


class FutureMethods:
    """``client.futures``: attribute access gives a function returning a Future."""

    def __init__(self, client: "RpcClient"):
        self._client = client

    def __getattr__(self, method: str) -> Callable[..., Future]:
        if method.startswith("_") and method != "__call__":
            raise AttributeError(method)
        client = self._client

        def call(*args, **kwargs) -> Future:
            return client.call_future(method, args, kwargs)

        call.__name__ = method
        self.__dict__[method] = call
        return call

    def __call__(self, *args, **kwargs) -> Future:
        return self._client.call_future("__call__", args, kwargs)


class MethodCalls:
    """``client.m(...)`` for any public name ``m``, and ``client(...)``: each is
    ``self.call(name, args, kwargs)``. The surface the RPC clients share."""

    def __getattr__(self, method: str) -> Callable:
        if method.startswith("_") and method != "__call__":
            raise AttributeError(method)

        def call(*args, **kwargs):
            return self.call(method, args, kwargs)

        call.__name__ = method
        self.__dict__[method] = call  # later lookups skip __getattr__
        return call

    def __call__(self, *args, **kwargs):
        return self.call("__call__", args, kwargs)


def check_call_timeout(call_timeout: Any) -> float | None:
    """``call_timeout`` in seconds: None, a number > 0 or a ``datetime.timedelta`` > 0
    (what Launchpad's courier takes); ``TypeError``/``ValueError`` otherwise."""
    if call_timeout is None:
        return None
    if isinstance(call_timeout, datetime.timedelta):
        seconds = call_timeout.total_seconds()
    elif isinstance(call_timeout, bool) or not isinstance(call_timeout, (int, float)):
        raise TypeError(f"call_timeout must be a number of seconds, a timedelta or None, got {type(call_timeout).__name__}")
    else:
        seconds = float(call_timeout)
    if not seconds > 0:
        raise ValueError(f"call_timeout must be > 0 or None, got {call_timeout!r}")
    return seconds


def timeout_error(method: str, server: str, call_timeout: float | None) -> Timeout:
    # "Deadline Exceeded" is the text Launchpad's courier puts in this error, and users match on it
    return Timeout(f"Deadline Exceeded: call to {method!r} on {server!r} did not complete within call_timeout={call_timeout} s")


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
        self._pid = os.getpid()
        self._request: MPMCRing | None = None
        self._pool: list[SPSCRing] = []
        self._all_rings: list[Any] = []
        self._futures_ring: MPMCRing | None = None
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
        if self._pid != os.getpid():
            self._forked()
        deadline = None if self.call_timeout is None else time.monotonic() + self.call_timeout
        request = self._request or self._connect(deadline, method)
        try:
            ring = self._pool.pop()
        except IndexError:
            ring = self._new_ring(SPSCRing, REPLY_CAPACITY, _SYNC_TAG)
        call_id = next(self._ids)
        try:
            self._send(request, (call_id, ring.name, method, args, kwargs or {}), deadline, method)
        except BaseException:
            self._pool.append(ring)  # nothing was queued: the ring is clean
            raise
        closed_at = None
        while True:
            if deadline is None:
                wait = POLL_S
            else:
                wait = min(POLL_S, deadline - time.monotonic())
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
            cid, ok = _REPLY.unpack_from(data)
            if cid == call_id:
                break
            _drop(data[_REPLY.size :])  # the late reply of an earlier call
        self._pool.append(ring)
        return unpack_reply(ok, data[_REPLY.size :])

    def call_future(self, method: str, args: tuple = (), kwargs: dict | None = None) -> Future:
        """Like ``call``, but returns at once with a Future of the result."""
        if self._pid != os.getpid():
            self._forked()
        fut = _PumpedFuture(self)
        deadline = None if self.call_timeout is None else time.monotonic() + self.call_timeout
        request = self._request or self._connect(deadline, method)
        ring = self._futures_ring or self._start_futures()
        call_id = next(self._ids)
        self._pending[call_id] = (fut, deadline, method)
        if self._pump_idle:
            with self._pump_cond:
                self._pump_cond.notify()
        try:
            self._send(request, (call_id, ring.name, method, args, kwargs or {}), deadline, method)
        except BaseException as e:
            self._pending.pop(call_id, None)
            fut.set_exception(e)
        return fut

    def close(self) -> None:
        """Free this client's reply rings; pending futures fail with ``Closed``. Idempotent."""
        if self._pid != os.getpid():
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
        give_up = time.monotonic() + CONNECT_TIMEOUT_S
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
                        f"no courier server at {self.address!r} appeared within {CONNECT_TIMEOUT_S:g} s "
                        f"(calling {method!r}); is its program running?"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, POLL_S)
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
        payload = _encode(msg, request.slot_size)
        try:
            request.put_nowait(payload)
            return
        except WouldBlock:
            pass
        except Closed:
            raise Closed(f"courier server {self._name!r} is stopped: cannot call {method!r}") from None
        while True:
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
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
                self._reader = threading.Thread(target=self._background_pump, args=(ring,), name="shmpad-rpc-futures", daemon=True)
                self._futures_ring = ring
                self._reader.start()
        return self._futures_ring

    # Replies to futures are read by whichever thread waits: a caller blocked in
    # ``result()`` reads the futures ring itself (no thread hand-off on the way back),
    # completing other callers' futures as it goes; the background thread reads only
    # while futures are pending and no caller has read for a while (callbacks,
    # ``concurrent.futures.wait``), and checks deadlines.

    def _pump(self, fut: "_PumpedFuture", timeout: float | None) -> None:
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
                        self._read_one(POLL_S)
                    else:
                        wait = min(POLL_S, deadline - time.monotonic())
                        if wait <= 0:
                            return
                        self._read_one(wait)
            finally:
                lock.release()
                self._last_pump = time.monotonic()
            if self._closed:
                return

    def _read_one(self, timeout: float) -> None:
        """Complete the future of one reply, waiting up to ``timeout``."""
        try:
            data = self._futures_ring.get_bytes(timeout=timeout)
        except Timeout:
            self._expire()
            request = self._request
            if self._pending and request is not None and request.closed:
                self._closed_at = self._closed_at or time.monotonic()
                if time.monotonic() - self._closed_at > CLOSED_GRACE_S:
                    self._fail_pending(lambda m: Closed(f"courier server {self._name!r} stopped before answering {m!r}"))
            return
        except Closed:
            return
        cid, ok = _REPLY.unpack_from(data)
        entry = self._pending.pop(cid, None)
        if entry is None:
            _drop(data[_REPLY.size :])  # expired or cancelled already
            return
        fut = entry[0]
        try:
            value = unpack_reply(ok, data[_REPLY.size :])
        except BaseException as e:
            settle(fut, Future.set_exception, e)
        else:
            settle(fut, Future.set_result, value)

    def _background_pump(self, ring: MPMCRing) -> None:
        cond = self._pump_cond
        while not self._closed:
            if not self._pending:
                with cond:
                    self._pump_idle = True
                    if not self._pending:
                        cond.wait(POLL_S)
                    self._pump_idle = False
                continue
            self._expire()
            # a caller waiting in result() reads (and just read): leave it the ring
            if time.monotonic() - self._last_pump < _PUMP_TURN_S or not self._pump_lock.acquire(False):
                time.sleep(_PUMP_TURN_S)
                continue
            try:
                self._read_one(_PUMP_TURN_S)
            except Exception:
                traceback.print_exc()  # keep serving the other futures
            finally:
                self._pump_lock.release()

    def _expire(self) -> None:
        now = time.monotonic()
        for call_id, (fut, deadline, method) in list(self._pending.items()):
            if deadline is not None and now >= deadline and self._pending.pop(call_id, None) is not None:
                settle(fut, Future.set_exception, self._timeout_error(method))

    def _fail_pending(self, error: Callable[[str], BaseException]) -> None:
        for call_id in list(self._pending):
            entry = self._pending.pop(call_id, None)
            if entry is not None:
                settle(entry[0], Future.set_exception, error(entry[2]))


def settle(fut: Future, how: Callable[[Future, Any], None], value: Any) -> None:
    try:
        how(fut, value)
    except InvalidStateError:
        pass  # the caller cancelled it: the reply has nobody to go to


class _PumpedFuture(Future):
    """A Future whose ``result()``/``exception()`` read the client's replies
    themselves while they wait. It stays PENDING until answered, so ``cancel()``
    works until then (the call still runs; its reply is dropped)."""

    def __init__(self, client: "RpcClient"):
        super().__init__()
        self._client = client

    def _finished(self) -> bool:
        # a read of one attribute, without the condition's lock: a hint the callers
        # re-check through the Future API
        return self._state in _DONE_STATES

    def result(self, timeout: float | None = None) -> Any:
        if not self._finished():
            self._client._pump(self, timeout)
        return super().result(timeout=0)  # raises TimeoutError if still not done

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._finished():
            self._client._pump(self, timeout)
        return super().exception(timeout=0)


_DONE_STATES = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
_ring_ids = itertools.count()


def _ring_name(tag: str) -> str:
    # the tag after the last dot tells the server which kind of ring to attach
    return f"/shmpad.{os.getpid()}.r{next(_ring_ids)}.{os.urandom(3).hex()}.{tag}"
