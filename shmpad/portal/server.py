"""``Server``: portal's RPC server on shmpad's transports (``transport`` says which).

Each bound method has a pool (its own with ``bind(..., workers=N)``, else the server's,
of ``workers``): at most that many of its calls run at once, as on portal's thread
pools, and each method holds at most its workers plus one calls, later ones queueing in
the server. A pool here is a count of places, not threads (``_Places``): a call that
finds a place runs at once on the thread of the transport that took it in (a hand-off
to a pool thread costs more than a small call itself), and a call that had to wait runs
on the thread that frees a place. The transports have a thread for every place of
every method, and hand their ring to another thread when a handler blocks, so a method
whose handler blocks (a replay ``sample`` waiting for data) holds up only its own pool.
A method with a ``postfn`` returns ``(result, info)``: the result is replied at once,
then ``postfn(info)`` runs, one at a time, in the order the calls arrived, and the call
counts against its method until its ``postfn`` has run.

A method with ``batch=N`` (``BatchServer``) waits for exactly N calls, stacks their
arguments leaf by leaf on a new leading axis (each call's leaves copied into the batch's
arrays as it arrives), makes one call with the stacked tree, and replies to call i with
row i of every leaf of the result.

The transports (``shmpad.rpc``) see every method as one that settles a future
(``_Deferred``), so no transport thread waits for a batch or a pool: a reply is sent
from whichever thread settles the call. With ``errors=True`` (portal's default) a
method that raises fails its callers' calls with ``RuntimeError`` and then ends the
server's process (exit code 1, reported as ``Error in 'name' ...`` and in the error
file), as an unhandled error ends a portal server; with ``errors=False`` the server
prints it and goes on.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from concurrent.futures import Future as CallFuture
from typing import Any, Callable

import numpy as np

from shmpad._checks import check_int, check_timeout, type_name
from shmpad.portal import options, packing, runtime, transport
from shmpad.rpc import RpcServer, TcpRpcServer
from shmpad.rpc.batching import BatchedHandler
from shmpad.rpc.tcp_server import caller

__all__ = ["Server"]

PING = "shmpad_portal_ping"
"""a method every server answers: a client's connect() calls it over TCP"""
_ERROR_GRACE_S = 0.2
"""with errors=True, how long a failed call's reply has to leave before its server's process ends"""
CLOSE_WAIT_S = 5.0
"""how long close() waits by default for the calls it took to be answered"""
TRANSPORT_THREADS = 16
"""threads each transport may use to take calls in, beyond one for every place of every method"""


class _Places:
    """At most ``size`` jobs at once, on the threads that bring them; the others queue
    and run on the thread that frees a place."""

    def __init__(self, size: int):
        self.free = size
        self.queue: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self.closed = False

    def run(self, fn: Callable, arg: Any) -> None:
        with self.lock:
            if self.free <= 0 or self.closed:
                self.queue.append((fn, arg))
                return
            self.free -= 1
        while True:
            fn(arg)
            with self.lock:
                if not self.queue or self.closed:
                    self.free += 1
                    return
                fn, arg = self.queue.popleft()

    def close(self) -> list:
        """Run nothing more; the jobs that were waiting."""
        with self.lock:
            self.closed = True
            waiting, self.queue = list(self.queue), collections.deque()
        return waiting


class _Method:
    def __init__(
        self, name: str, workfn: Callable, postfn: Callable | None, pool: _Places, workers: int, batch: int, addr: bool
    ):
        self.name = name
        self.addr = addr
        self.workfn = workfn
        self.postfn = postfn
        self.pool = pool
        self.capacity = self.available = workers + 1  # running plus one waiting in the pool, as portal's
        self.batch = batch
        self.queue: collections.deque = collections.deque()  # jobs waiting for a place
        self.filling: _Batch | None = None  # the batch taking calls


class _Batch:
    """A batch being filled: its callers' futures, the stacked leaves, and how many
    callers have copied their row in (it runs when all have)."""

    def __init__(self, size: int, structure: Any, leaves: list[np.ndarray]):
        self.futures: list[CallFuture] = []
        self.structure = structure
        self.buffers = [np.empty((size, *x.shape), x.dtype) for x in leaves]
        self.copied = 0

    def fits(self, structure: Any, leaves: list[np.ndarray]) -> bool:
        return structure == self.structure and all(b.shape[1:] == x.shape for b, x in zip(self.buffers, leaves))


class _Job:
    __slots__ = ("method", "args", "futures", "done", "failed", "info")

    def __init__(self, method: _Method, args: Any, futures: list):
        self.method = method
        self.args = args
        self.futures = futures
        self.done = False
        self.failed = False
        self.info: Any = None


class _Reply(CallFuture):
    """The future of a call a server took: it counts as unanswered (``Server._unreplied``)
    until the transport's callback, which sends the reply, has run, so that ``close()``
    waits for the replies, not only for the handlers. (A handler that runs at once, on
    the transport's thread, settles the future before the transport adds its callback.)"""

    def __init__(self, server: Server):
        super().__init__()
        self._server = server

    def add_done_callback(self, fn: Callable) -> None:
        def reply(fut: CallFuture) -> None:
            try:
                fn(fut)
            finally:
                self._server._replied()

        super().add_done_callback(reply)


def _failed(e: BaseException) -> CallFuture:
    fut: CallFuture = CallFuture()
    fut.set_exception(e)
    return fut


class _Deferred(BatchedHandler):
    """What the transports call for one bound method: ``submit`` returns a future the
    server settles later. A ``BatchedHandler`` because that is the kind of method the
    transports answer from a future's callback instead of a thread of theirs."""

    def __init__(self, submit: Callable[[tuple], CallFuture], name: str):
        self._submit = submit
        self.__name__ = name

    def submit(self, args: tuple, kwargs: dict) -> CallFuture:
        if kwargs:
            fut: CallFuture = CallFuture()
            fut.set_exception(TypeError(f"portal calls take positional arguments only, got keywords {list(kwargs)}"))
            return fut
        return self._submit(args)

    def __call__(self, *args: Any) -> Any:
        return self._submit(args).result()


class _Surface:
    """The object the transports serve: one attribute per bound method."""

    def __init__(self, server: Server):
        self._server = server

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Deferred(lambda args: self._server._unknown(name), name)

    def shmpad_portal_ping(self) -> dict:
        return {"pid": os.getpid(), "handshake": self._server.options.handshake}


class Server:
    def __init__(self, port: int | str, name: str = "Server", workers: int = 1, errors: bool = True, **kwargs: Any):
        self.port = transport.server_port(port)
        self.name = name
        self.workers = check_int("workers", workers, minimum=1)
        if not isinstance(errors, bool):
            raise TypeError(f"errors must be a bool, got {type_name(errors)}")
        self.errors = errors
        self.options = options.server_options(kwargs, type(self).__name__)
        self.host = self.options.host or ("::1" if self.options.ipv6 else "127.0.0.1")
        self.methods: dict[str, _Method] = {}
        self.running = False
        self._lock = threading.Lock()
        self._pool = _Places(self.workers)
        self._pools = [self._pool]
        self._posts: collections.deque[_Job] = collections.deque()  # due for their postfn, in order
        self._posting = False  # a thread runs the postfns now
        self._post_running = 0  # postfns running now (0 or 1)
        self._closing = False  # close() began: calls that come now are not taken
        self._unreplied = 0  # calls taken whose reply the transport has not sent yet (_Reply)
        self._idle = threading.Condition(self._lock)  # notified when a call taken is done, while closing
        self._order: collections.deque[_Job] = collections.deque()  # jobs with a postfn, in arrival order
        self._stopped = threading.Event()
        self._metrics = {"send": 0, "recv": 0, "time": time.time()}
        self._surface = _Surface(self)
        self._rpc: RpcServer | None = None
        self._door: transport.Doorbell | None = None
        self._tcp: TcpRpcServer | None = None

    @property
    def connections(self) -> int:
        return 0 if self._door is None else len(self._door._conns)

    def bind(
        self, name: str, workfn: Callable, postfn: Callable | None = None, workers: int = 0, addr: bool = False
    ) -> None:
        """``workfn(*args)`` answers calls of ``name`` (``workfn(addr, *args)`` with
        ``addr=True``: the caller's ``(host, port)``, which only a TCP connection has, so a
        server with such a method serves every client over TCP)."""
        if not isinstance(addr, bool):
            raise TypeError(f"addr must be a bool, got {type_name(addr)}")
        if addr and transport.forced() == "shm":
            raise ValueError(
                f"addr=True (binding {name!r}) needs TCP, and ${transport.TRANSPORT_ENV}=shm serves shared memory only"
            )
        self._bind(name, workfn, postfn, workers, batch=0, addr=addr)

    def _bind(
        self, name: str, workfn: Callable, postfn: Callable | None, workers: int, batch: int, addr: bool = False
    ) -> None:
        if self.running:
            raise RuntimeError(f"server {self.name!r} is running: bind {name!r} before start()")
        if not isinstance(name, str) or not name or name.startswith("_") or name == PING:
            raise ValueError(f"a method name must be a str not starting with '_', got {name!r}")
        if name in self.methods:
            raise ValueError(f"method {name!r} is bound already")
        if not callable(workfn) or (postfn is not None and not callable(postfn)):
            raise TypeError(f"workfn and postfn must be callable, got {type_name(workfn)} and {type_name(postfn)}")
        workers = check_int("workers", workers, minimum=0)
        batch = check_int("batch", batch, minimum=0)
        if workers:
            pool = _Places(workers)
            self._pools.append(pool)
        else:
            pool = self._pool
        method = _Method(name, workfn, postfn, pool, workers or self.workers, batch, addr)
        self.methods[name] = method
        submit = self._submit_batched if batch else self._submit
        setattr(self._surface, name, _Deferred(lambda args: submit(method, args), name))

    def start(self, block: bool = True) -> None:
        if self.running:
            raise RuntimeError(f"server {self.name!r} was started already")
        self.running = True
        only = transport.forced()
        try:
            # a thread for every place of every method, so that handlers blocked in their
            # places never leave a call without a thread to take it in
            threads = TRANSPORT_THREADS + sum(m.capacity for m in self.methods.values())
            tcp_only = any(m.addr for m in self.methods.values())  # only TCP calls have a caller's address
            hello = {"pid": os.getpid(), "handshake": self.options.handshake, "address": None}
            if only != "tcp" and not tcp_only:
                self._rpc = RpcServer(self._surface, threads=threads)
                hello["address"] = self._rpc.address
            if only != "shm":
                transport.ensure_token()
                self._tcp = TcpRpcServer(
                    self._surface, _join(self.host, self.port), threads=threads, max_frame=self.options.max_msg_size
                )
                hello["tcp"] = self._tcp.address
            if only != "tcp":
                self._door = transport.Doorbell(self.port, hello)
        except BaseException:
            self._close_transports()
            self.running = False
            raise
        if block:
            self._stopped.wait()

    def close(self, timeout: float | None = None) -> None:
        """Take no more calls, answer the calls taken (their postfns run too) for at most
        ``timeout`` s (None: ``CLOSE_WAIT_S``), then close. A call that came too late, or
        was still running then, has no answer: its client sends it again to the next
        server at this port (``Client``)."""
        if not self.running:
            return
        timeout = CLOSE_WAIT_S if timeout is None else check_timeout(timeout)
        with self._lock:
            self._closing = True
            for method in self.methods.values():
                if method.filling is not None:
                    # a batch that cannot fill any more never runs: its calls go unanswered
                    self._unreplied -= len(method.filling.futures)
                    method.filling = None
        if self._rpc is not None:
            self._rpc.stop()  # the requests still in the ring stay there, unanswered
        deadline = time.monotonic() + timeout
        with self._idle:
            while (self._taken() or self._unreplied) and self._idle.wait(max(0.0, deadline - time.monotonic())):
                pass
        self.running = False
        self._close_transports()
        for pool in self._pools:
            pool.close()
        for method in self.methods.values():
            method.queue.clear()
            method.filling = None
        self._stopped.set()

    def _taken(self) -> int:
        """Under the lock: the calls taken and not done (running, waiting for a place or
        for their postfn)."""
        return sum(m.capacity - m.available + len(m.queue) for m in self.methods.values())

    def _close_transports(self) -> None:
        if self._door is not None:
            self._door.close()  # first: the clients learn now, not from a call that fails
        if self._rpc is not None:
            self._rpc.close()
            self._rpc.wait(5.0)
        if self._tcp is not None:
            self._tcp.close()

    def stats(self) -> dict:
        now = time.time()
        with self._lock:
            metrics, self._metrics = self._metrics, {"send": 0, "recv": 0, "time": now}
            requests = sum(len(m.queue) + len(m.filling.futures if m.filling else ()) for m in self.methods.values())
            jobs = sum(m.capacity - m.available for m in self.methods.values())
        duration = max(now - metrics["time"], 1e-9)
        stats = {
            "numsend": metrics["send"],
            "numrecv": metrics["recv"],
            "sendrate": metrics["send"] / duration,
            "recvrate": metrics["recv"] / duration,
            "requests": requests,
            "jobs": jobs,
        }
        if any(m.postfn for m in self.methods.values()):
            stats["post_iqueue"] = len(self._order)
            stats["post_oqueue"] = len(self._posts) + self._post_running
        return stats

    def __enter__(self) -> Server:
        self.start(block=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Server(name={self.name!r}, port={self.port}, running={self.running})"

    # -- calls ---------------------------------------------------------------------------

    def _unknown(self, name: str) -> CallFuture:
        return _failed(RuntimeError(f"Unknown method {name}"))

    def _accept(self) -> CallFuture | None:
        """Under the lock: the future of a call this server takes, or None once it closes."""
        if self._closing:
            return None
        self._metrics["recv"] += 1
        self._unreplied += 1
        return _Reply(self)

    def _replied(self) -> None:
        with self._lock:
            self._unreplied -= 1
            if self._closing:
                self._idle.notify_all()

    def _submit(self, method: _Method, args: tuple) -> CallFuture:
        try:
            args = packing.normalize(args)
            if method.addr:
                args = (_caller_address(), *args)
        except (TypeError, NotImplementedError) as e:
            return _failed(RuntimeError(f"Could not decode message: {e}"))
        with self._lock:
            fut = self._accept()
        if fut is None:
            return CallFuture()  # never answered: its client sends it again to the next server
        self._schedule(_Job(method, args, [fut]))
        return fut

    def _submit_batched(self, method: _Method, args: tuple) -> CallFuture:
        try:
            leaves, structure = packing.tree_flatten(packing.normalize(args))
            leaves = [np.asarray(x) for x in leaves]
            if any(x.dtype == object for x in leaves):
                raise TypeError("Only array arguments can be batched.")
        except (TypeError, ValueError, NotImplementedError) as e:
            return _failed(RuntimeError(str(e)))
        with self._lock:
            batch = method.filling
            if batch is not None and not batch.fits(structure, leaves):
                return _failed(
                    RuntimeError(
                        f"Argument structure {structure} does not match previous requests with structure "
                        f"{batch.structure} for batched server method {method.name}."
                    )
                )
            fut = self._accept()
            if fut is None:
                return CallFuture()  # never answered: its client sends it again to the next server
            if batch is None:
                batch = method.filling = _Batch(method.batch, structure, leaves)
            index = len(batch.futures)
            batch.futures.append(fut)
            if len(batch.futures) == method.batch:
                method.filling = None  # full: the next call starts the next batch
        for buffer, leaf in zip(batch.buffers, leaves):
            buffer[index] = leaf  # outside the lock: the calls of one batch copy in at once
        with self._lock:
            batch.copied += 1
            last = batch.copied == method.batch
        if last:
            self._schedule(_Job(method, packing.tree_unflatten(batch.buffers, batch.structure), batch.futures))
        return fut

    def _schedule(self, job: _Job) -> None:
        method = job.method
        with self._lock:
            if method.available <= 0:
                method.queue.append(job)
                return
            method.available -= 1
            if method.postfn:
                self._order.append(job)
        job.method.pool.run(self._work, job)

    def _work(self, job: _Job) -> None:
        method = job.method
        try:
            out = method.workfn(*job.args)
            if method.postfn:
                out, job.info = out
            if method.batch:
                out = packing.normalize(out)
                rows = [packing.tree_map(lambda x, i=i: x[i], out) for i in range(method.batch)]
            else:
                rows = [packing.check(out)]
        except Exception as e:
            self._failed(job, e)
            return
        for fut, row in zip(job.futures, rows):
            fut.set_result(row)  # replies now, from this thread
        with self._lock:
            self._metrics["send"] += len(rows)
        self._finished(job)

    def _failed(self, job: _Job, e: Exception) -> None:
        message = f"Error in server method: {e}"
        for fut in job.futures:
            fut.set_exception(RuntimeError(message))
        if self.errors:
            runtime.current().error(e, f"{self.name}/{job.method.name}")
            # the transport sends the error reply once this call returns to it: end the
            # process a moment later, as portal's server delivers the error, then raises
            threading.Timer(_ERROR_GRACE_S, runtime.current().shutdown, (1,)).start()
            return
        print(message, file=sys.stderr, flush=True)
        job.failed = True
        self._finished(job)

    def _finished(self, job: _Job) -> None:
        """Free the job's place, after its postfn (run in arrival order) if it has one."""
        if not job.method.postfn:
            self._release(job.method)
            return
        with self._lock:
            job.done = True
            while self._order and self._order[0].done:
                self._posts.append(self._order.popleft())
            if self._posting:
                return  # the thread running postfns runs these too, in order
            self._posting = True
        while True:
            with self._lock:
                if not self._posts or not self.running:
                    self._posting = False
                    return
                done = self._posts.popleft()
                self._post_running = 1
            self._postfn(done)

    def _postfn(self, job: _Job) -> None:
        if not job.failed:
            try:
                job.method.postfn(job.info)
            except Exception as e:
                ctx = runtime.current()
                ctx.error(e, f"{self.name}/{job.method.name}/postfn")
                ctx.shutdown(exitcode=1)
        with self._lock:
            self._post_running = 0
        self._release(job.method)

    def _release(self, method: _Method) -> None:
        with self._lock:
            method.available += 1
            if self._closing:
                self._idle.notify_all()
            if not method.queue:
                return
            job = method.queue.popleft()
            method.available -= 1
            if method.postfn:
                self._order.append(job)
        method.pool.run(self._work, job)


def _caller_address() -> tuple:
    """The address of the caller whose call this thread takes in (``tcp_server.caller``)."""
    conn = caller()
    if conn is None:
        raise TypeError("the caller's address is known for a call over TCP only")
    try:
        return conn.sock.getpeername()
    except OSError:
        return tuple(conn.peer.rsplit(":", 1))


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
