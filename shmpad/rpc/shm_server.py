"""The shared-memory RPC server: the transport under ``CourierNode`` on one host.

A server is reached through one MPMC *request ring*, which can be created before the
server starts (the launcher does), so a call made early simply waits in it. Every
request names the ring its reply goes to (``codec`` has the formats): for a blocking
call an SPSC ring (its name ends in ``.SYNC_TAG``) taken from the client's pool for the
duration of the call, one writer at a time; for futures the client's one MPMC ring.

The server runs handlers concurrently on up to ``threads`` threads, leader /
followers style: one thread at a time, the leader, waits on the request ring and runs
the handlers of what it takes itself, so a call crosses no thread boundary on the
server. A wake-up takes every request waiting in the ring at once, into a backlog
the leader works through: with calls in flight they come in runs, and one wait
serves the whole run. When a handler runs for longer than a tick, a monitor makes
another thread the leader; it starts with the rest of the backlog, so a handler
that blocks (say, until a later call of the same run opens a gate) holds up no
other call. A call of a batched method (``batching``) is handed to its batcher and
answered when its batch has run, so the calls waiting for a batch hold no thread.

Every answered call is counted, with its service time and its latency from the
caller's send, in the ring's call statistics (``stats``) when it has them.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from typing import Any

from shmpad.errors import Closed, SegmentError, Timeout, WouldBlock
from shmpad.ringbuf.mpmc import MPMCRing
from shmpad.ringbuf.spsc import SPSCRing
from shmpad.rpc.batching import BatchedHandler
from shmpad.rpc.calls import POLL_S, public_methods
from shmpad.rpc.codec import decode, encode_reply, failure, unpicklable_result
from shmpad.rpc.stats import CallStats

__all__ = ["RpcServer", "create_request_ring", "REQUEST_CAPACITY", "SLOT_SIZE", "SYNC_TAG"]

REQUEST_CAPACITY = 64
SLOT_SIZE = 64 * 1024
# How long a server keeps trying to hand a reply to a client that does not drain.
REPLY_PUT_TIMEOUT_S = 10.0
# A handler running this long makes the server hand its ring to another thread.
_TICK_S = 0.005
# After this many ticks with no handler running, the server's monitor sleeps
# until a handler starts.
_IDLE_TICKS = 200
SYNC_TAG = "s"
"""the last part of the name of a reply ring that a blocking call waits on (an SPSC ring)"""


def create_request_ring(capacity: int = REQUEST_CAPACITY, slot_size: int = SLOT_SIZE) -> MPMCRing:
    """A new request ring; its name is the address servers serve and clients call."""
    return MPMCRing.create(capacity, slot_size)


class RpcServer:
    """Serves ``obj``'s public methods (and ``__call__``) on a request ring.

    ``address`` names an existing request ring (see ``create_request_ring``); without
    it the server creates one, owned by this process, with its call statistics.
    ``threads`` bounds how many handlers run at once.

    Like ``TcpRpcServer``, it serves from construction (on threads of its own) until
    ``stop()`` or ``close()``; ``wait()`` blocks until it has stopped.
    """

    def __init__(self, obj: Any, address: str | None = None, threads: int = 16):
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an int, got {type(threads).__name__}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if address is None:
            self._ring = create_request_ring()
            self._stats: CallStats | None = CallStats.create(self._ring.name)
        else:
            self._ring = MPMCRing.attach(address)
            self._stats = CallStats.attach(address)
        self.address = self._ring.name
        self._lookup = public_methods(obj)
        self._max_threads = threads
        self._stop = threading.Event()
        self._replies: dict[str, MPMCRing | SPSCRing] = {}
        self._replies_lock = threading.Lock()
        # Requests taken from the ring and not yet started, oldest first: whichever
        # thread leads takes the next one (deque's append and popleft are atomic).
        self._backlog: deque[bytes] = deque()
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
        self._serving = threading.Thread(target=self._serve, name="shmpad-rpc-server", daemon=True)
        self._serving.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped and every handler that was running has
        returned; False if ``timeout`` (seconds) passed first."""
        self._serving.join(timeout)
        return not self._serving.is_alive()

    def _serve(self) -> None:
        """Serve until ``stop()`` or until the request ring is closed."""
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
            # taken from the ring, so nobody else can answer them: a caller gets its
            # reply rather than waiting out its deadline
            while self._backlog:
                self._handle(self._backlog.popleft())

    def stop(self) -> None:
        """Stop taking requests (within ``POLL_S``); handlers running finish, and so do
        the calls already taken from the ring."""
        self._stop.set()
        self._monitor_wake.release()

    def close(self) -> None:
        """Stop and close the request ring for every process: waiting servers return and
        clients' calls raise ``Closed``."""
        self.stop()
        self._ring.close()
        if self._stats is not None:
            self._stats.close()
        with self._replies_lock:
            self._replies.clear()

    def __enter__(self) -> RpcServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.wait()

    def _work(self, me: int) -> None:
        ring = self._ring
        backlog = self._backlog
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
            if not backlog:
                try:
                    backlog.append(ring.get_bytes(timeout=POLL_S))
                except Timeout:
                    continue
                except Closed:
                    stop.set()
                    break
                _take_waiting(ring, backlog)
            try:
                data = backlog.popleft()
            except IndexError:
                continue  # a thread that led a moment ago took it
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
        taken_ns = time.monotonic_ns()
        try:
            call_id, reply_to, method, args, kwargs, sent_ns = decode(data)
        except BaseException:
            traceback.print_exc()  # undecodable request: nobody to tell
            return
        try:
            fn = self._lookup(method)
            if isinstance(fn, BatchedHandler):
                # answered when its batch has run; this thread goes back to the ring
                fn.submit(args, kwargs).add_done_callback(
                    lambda f: self._reply(reply_to, _outcome(call_id, f), taken_ns, sent_ns)
                )
                return
            reply = (call_id, True, fn(*args, **kwargs))
        except BaseException as e:
            reply = (call_id, False, failure(e))
        self._reply(reply_to, reply, taken_ns, sent_ns)

    def _reply(self, reply_to: str, reply: tuple, taken_ns: int, sent_ns: int) -> None:
        ring = self._replies.get(reply_to) or self._reply_ring(reply_to)
        payload = None
        if ring is not None:
            call_id, ok, value = reply
            try:
                payload = encode_reply(call_id, ok, value, ring.slot_size)
            except Exception as e:
                payload = encode_reply(call_id, False, unpicklable_result(e), ring.slot_size)
        stats = self._stats
        if stats is not None:
            stats.record(taken_ns, sent_ns)  # before the put: a caller that has its reply finds its call counted
        if ring is None:
            return  # the caller is gone
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
            ring = (SPSCRing if name.endswith("." + SYNC_TAG) else MPMCRing).attach(name)
        except SegmentError:
            return None
        with self._replies_lock:
            if len(self._replies) >= 4096:  # clients come and go: forget the oldest
                self._replies.pop(next(iter(self._replies)))
            self._replies[name] = ring
        return ring


def _take_waiting(ring: MPMCRing, backlog: deque[bytes]) -> None:
    """Move every request waiting in ``ring`` to ``backlog`` (at most a ring's worth:
    requests that keep coming wait for the next round)."""
    for _ in range(ring.capacity):
        try:
            backlog.append(ring.get_bytes_nowait())
        except (WouldBlock, Closed):
            return


def _outcome(call_id: int, fut: Any) -> tuple:
    """The reply for a settled future of a batched call."""
    e = fut.exception()
    return (call_id, True, fut.result()) if e is None else (call_id, False, failure(e))
