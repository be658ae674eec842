"""Collective operations over a ring of TCP connections: allreduce, broadcast.

A ``PeerRing`` (made by ``Mesh.ring``, see ``shmpad/net/mesh.py``) holds two
connections: one to the next member, on which it only sends, and one from the
previous member, on which it only receives. The caller's thread receives and sums;
a sender thread per ring takes frames from a queue and writes them, so that sending
chunk k+1 overlaps receiving and summing chunk k.

Allreduce is ring reduce-scatter then allgather. The flat array is split into
``size`` segments (sizes differ by at most one element), each segment into chunks of
``chunk_bytes``. Member r sends its own segment r; on receiving chunk c of segment
(r-1-s) % size it adds it to its own chunk in place and queues the sum for the next
member. After size-1 such steps member r holds the total of segment (r+1) % size,
computed once in ring order; the allgather passes the totals round, received straight
into the array. Every member ends with the bits the owner of a segment computed, so
every member that completes an operation holds bit-identical results.

Frames of one operation, on every connection, in order (all ``Kind.BYTES``)::

    tag = seq << 32 | index     seq: the ring's operation count, index: frame in it
    index 0        descriptor: op u8 | reduce op u8 | root u16 | dtype 8s | count u64
    index 1...     chunk payloads, in the order both sides compute from the descriptor

Each member sends its descriptor and first chunks before it checks its predecessor's
descriptor. A frame with another tag, length or descriptor than expected abandons the
ring: data of two operations is never mixed. Any failure (a neighbour's EOF or reset,
a timeout, ``close()`` from another thread) closes both connections, which the
neighbours see at once, so the failure travels round the ring and every blocked
member raises ``Abandoned``. The sockets block in the kernel with ``SO_RCVTIMEO`` /
``SO_SNDTIMEO`` as the per-operation timeout, rather than in Python's timeout mode,
which polls before every call.
"""

from __future__ import annotations

import queue
import socket
import struct
import threading
from collections.abc import Callable

import numpy as np

from shmpad.errors import Abandoned
from shmpad.net.wire import Connection, Kind

__all__ = ["CHUNK_BYTES", "REDUCE_DTYPES", "PeerRing"]

# gloo's segment size too. ``python -m bench.allreduce`` with this changed measures other sizes
# against it; no kept figure yet, see docs/benchmarks.md.
CHUNK_BYTES = 1 << 20
REDUCE_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))
REDUCE_OPS = ("sum", "mean")

_ALLREDUCE, _BROADCAST = 1, 2
_OP_NAMES = {_ALLREDUCE: "allreduce", _BROADCAST: "broadcast"}
_DESCRIPTOR = struct.Struct("<BBH8sQ")
_LENGTH = np.dtype("<u8")
_TIMEVAL = struct.Struct("@ll")


class PeerRing:
    """This member's place in a ring: ``rank`` of ``size``, named by ``key``.

    Operations run one at a time, in the same order on every member, and block until
    this member's part is done. A failure raises ``Abandoned`` and leaves the ring
    unusable, and the arrays of the failed operation partly reduced; make a new ring
    for the new member list."""

    def __init__(
        self,
        key: str,
        rank: int,
        size: int,
        send_conn: Connection | None,
        recv_conn: Connection | None,
        timeout: float | None = 30.0,
        chunk_bytes: int = CHUNK_BYTES,
        on_close: Callable[[], None] | None = None,
    ):
        if size > 1 and (send_conn is None or recv_conn is None):
            raise ValueError(f"a ring of {size} members needs both connections")
        if chunk_bytes < 4096 or chunk_bytes % 64:
            raise ValueError(f"chunk_bytes must be a multiple of 64 and at least 4096, got {chunk_bytes}")
        _check_timeout(timeout)
        self.key = key
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes
        self._send_conn = send_conn
        self._recv_conn = recv_conn
        self._on_close = on_close
        self._seq = 0
        self._busy = threading.Lock()  # held by the one operation running
        self._lock = threading.Lock()  # guards _reason and _op_done
        self._reason: str | None = None
        self._op_done: threading.Event | None = None
        self._op_timeout: float | None = -1.0  # what the sockets are set to; -1: not yet
        self._scratch = np.empty(chunk_bytes, np.uint8)  # where chunks to reduce arrive
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        if size > 1:
            for conn in (send_conn, recv_conn):
                conn.settimeout(None)
            self._sender = threading.Thread(target=self._send_loop, name=f"shmpad-ring-{key}-{rank}", daemon=True)
            self._sender.start()

    def __repr__(self) -> str:
        state = f", abandoned: {self._reason}" if self._reason else ""
        return f"PeerRing({self.key!r}, rank={self.rank}, size={self.size}{state})"

    @property
    def closed(self) -> bool:
        """True once the ring was closed or abandoned."""
        return self._reason is not None

    # -------------------------------------------------------------- operations

    def allreduce(self, array: np.ndarray, op: str = "sum", timeout: float | None = None) -> None:
        """Replace ``array`` (contiguous float32/float64/int32/int64, the same dtype and
        size on every member) by the elementwise sum, or mean, over the ring, in place.

        ``timeout`` (default: the ring's) bounds how long a neighbour may stay silent."""
        flat = _flat(array, "allreduce")
        if flat.dtype not in REDUCE_DTYPES:
            allowed = ", ".join(str(d) for d in REDUCE_DTYPES)
            raise TypeError(f"allreduce sums {allowed} arrays in place, got {array.dtype}")
        if op not in REDUCE_OPS:
            raise ValueError(f"op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
        if op == "mean" and flat.dtype.kind == "i":
            raise TypeError(f"the mean of {flat.dtype} arrays cannot be stored in place; use op='sum' and divide")
        self._run(_ALLREDUCE, REDUCE_OPS.index(op), 0, flat, timeout, self._reduce_scatter_allgather)

    def broadcast(self, array: np.ndarray, root: int, timeout: float | None = None) -> None:
        """Copy ``root``'s ``array`` into every member's (contiguous, the same dtype and
        size everywhere), in place, pipelined along the ring."""
        flat = _flat(array, "broadcast")
        self._check_root(root)
        self._run(_BROADCAST, 0, root, flat, timeout, self._broadcast)

    def broadcast_bytes(self, data: bytes | None, root: int, timeout: float | None = None) -> bytes:
        """``root``'s ``data`` on every member: root passes its bytes, the others None.
        Two operations: the length, then the bytes."""
        self._check_root(root)
        if (self.rank == root) != (data is not None):
            raise ValueError(
                f"broadcast_bytes from root {root}: the root passes bytes, the others None; "
                f"rank {self.rank} passed {type(data).__name__}"
            )
        length = np.array([len(data) if data is not None else 0], _LENGTH)
        self.broadcast(length, root, timeout)
        buf = np.frombuffer(bytearray(data), np.uint8) if data is not None else np.empty(int(length[0]), np.uint8)
        self.broadcast(buf, root, timeout)
        return buf.tobytes()

    # -------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Abandon the ring: an operation blocked in another thread raises ``Abandoned``,
        and so, promptly, do the neighbours'. Idempotent."""
        self._abandon("the ring was closed")
        if self._sender is not None and self._sender is not threading.current_thread():
            self._sender.join(timeout=10)

    def __enter__(self) -> PeerRing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------- one operation

    def _run(self, kind: int, reduce_op: int, root: int, flat: np.ndarray, timeout: float | None, body) -> None:
        """Run ``body(flat, descriptor, reduce_op, root)`` as operation ``self._seq``:
        one at a time, its frames tagged, its last frame sent before it returns, any
        failure turned into ``Abandoned``."""
        timeout = self.timeout if timeout is None else timeout
        _check_timeout(timeout)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"ring {self.key!r}: another operation is running; operations run one at a time")
        try:
            if self.size == 1:
                if self._reason is not None:
                    raise self._abandoned()
                return
            done = threading.Event()
            with self._lock:
                if self._reason is not None:
                    raise self._abandoned()
                self._op_done = done  # from here on, a failure sets it
            descriptor = _DESCRIPTOR.pack(kind, reduce_op, root, flat.dtype.str.encode(), len(flat))
            try:
                self._set_timeout(timeout)
                self._queue.put((self._tag(0), descriptor))
                body(flat, descriptor, reduce_op, root)
                self._queue.put(done)
            except (ConnectionError, OSError) as e:
                raise self._abandoned(self._explain(e, "receiving from", (self.rank - 1) % self.size)) from None
            except BaseException as e:
                self._abandon(f"{_OP_NAMES[kind]} {self._seq} raised {type(e).__name__} on rank {self.rank}")
                raise
            if not done.wait(None if timeout is None else timeout + 5) and self._reason is None:
                self._abandon(f"sending to rank {(self.rank + 1) % self.size} took over {timeout} s")
            if self._reason is not None:
                raise self._abandoned()
        finally:
            self._seq += 1
            self._busy.release()

    def _check_descriptor(self, mine: bytes) -> None:
        """Receive the predecessor's descriptor of this operation; it must equal ours."""
        theirs = bytearray(len(mine))
        self._recv(memoryview(theirs), 0, "a descriptor")
        if theirs != mine:
            raise _Mismatch(
                f"rank {(self.rank - 1) % self.size} started {_describe(theirs)} where rank {self.rank} started {_describe(mine)}"
            )

    def _reduce_scatter_allgather(self, flat: np.ndarray, descriptor: bytes, reduce_op: int, root: int) -> None:
        n, rank = self.size, self.rank
        mean = REDUCE_OPS[reduce_op] == "mean"
        chunks = _chunks(len(flat), n, max(1, self.chunk_bytes // flat.itemsize))
        item = flat.itemsize
        data = memoryview(flat.view(np.uint8))
        scratch = self._scratch.view(flat.dtype)
        scratch_bytes = memoryview(self._scratch)
        put, tag, recv = self._queue.put, self._tag, self._recv
        sent = received = 1
        for a, b in chunks[rank]:
            put((tag(sent), data[a * item : b * item]))
            sent += 1
        self._check_descriptor(descriptor)
        # Reduce-scatter: add the partial sums of segment rank-1-step to ours and pass them on.
        for step in range(n - 1):
            last = step == n - 2
            for a, b in chunks[(rank - 1 - step) % n]:
                k = b - a
                recv(scratch_bytes[: k * item], received, "a chunk to reduce")
                received += 1
                part = flat[a:b]
                np.add(part, scratch[:k], out=part)
                if last and mean:
                    np.divide(part, n, out=part)
                put((tag(sent), data[a * item : b * item]))
                sent += 1
        # Allgather: the totals arrive in place; pass on all but the last segment.
        for step in range(n - 1):
            forward = step < n - 2
            for a, b in chunks[(rank - step) % n]:
                view = data[a * item : b * item]
                recv(view, received, "a reduced chunk")
                received += 1
                if forward:
                    put((tag(sent), view))
                    sent += 1

    def _broadcast(self, flat: np.ndarray, descriptor: bytes, reduce_op: int, root: int) -> None:
        data = memoryview(flat.view(np.uint8))
        step = self.chunk_bytes
        forward = (self.rank + 1) % self.size != root
        if self.rank == root:
            for i, start in enumerate(range(0, len(data), step), start=1):
                self._queue.put((self._tag(i), data[start : start + step]))
        self._check_descriptor(descriptor)
        if self.rank != root:
            for i, start in enumerate(range(0, len(data), step), start=1):
                view = data[start : start + step]
                self._recv(view, i, "a broadcast chunk")
                if forward:
                    self._queue.put((self._tag(i), view))

    # -------------------------------------------------------------- frames and failure

    def _tag(self, index: int) -> int:
        return self._seq << 32 | index

    def _recv(self, view: memoryview, index: int, what: str) -> None:
        """Receive frame ``index`` of this operation straight into ``view``."""
        conn = self._recv_conn
        kind, _flags, tag, length = conn.recv_header()
        if tag != self._seq << 32 | index or length != view.nbytes or kind != Kind.BYTES:
            raise _Mismatch(
                f"rank {(self.rank - 1) % self.size} sent operation {tag >> 32} frame {tag & 0xFFFFFFFF} "
                f"({length} bytes, kind {kind}) where {what} was due: operation {self._seq} frame {index} "
                f"({view.nbytes} bytes, kind {int(Kind.BYTES)})"
            )
        conn.recv_into(view, what=what)

    def _send_loop(self) -> None:
        conn = self._send_conn
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            tag, payload = item
            try:
                conn.send(Kind.BYTES, payload, tag=tag)
            except Exception as e:  # noqa: BLE001 - whatever stops the sender abandons the ring
                self._abandon(self._explain(e, "sending to", (self.rank + 1) % self.size))
                return

    def _set_timeout(self, timeout: float | None) -> None:
        """Make a blocked receive or send fail after ``timeout`` seconds without progress."""
        if timeout == self._op_timeout:
            return
        seconds = 0.0 if timeout is None else timeout  # 0: no timeout
        value = _TIMEVAL.pack(int(seconds), int(seconds % 1 * 1e6))
        self._recv_conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self._send_conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._op_timeout = timeout

    def _explain(self, error: BaseException, doing: str, rank: int) -> str:
        """Why an operation failed, in words: a timeout (the socket's EAGAIN) or ``error``."""
        if isinstance(error, BlockingIOError) or isinstance(error.__context__, BlockingIOError):
            return f"{doing} rank {rank} made no progress for {self._op_timeout} s"
        if isinstance(error, _Mismatch):
            return str(error)
        return f"{doing} rank {rank} failed: {error}"

    def _abandon(self, reason: str) -> None:
        """Record the first failure, close both connections, stop the sender, wake the caller."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            done = self._op_done
        for conn in (self._send_conn, self._recv_conn):
            if conn is not None:
                conn.close()
        self._queue.put(None)
        if done is not None:
            done.set()
        if self._on_close is not None:
            self._on_close()

    def _abandoned(self, cause: str | None = None) -> Abandoned:
        """The exception an operation raises once the ring failed (``cause`` failing it,
        unless something else did first)."""
        if cause is not None:
            self._abandon(cause)
        return Abandoned(f"ring {self.key!r} (rank {self.rank} of {self.size}) was abandoned: {self._reason}")

    def _check_root(self, root: int) -> None:
        if not isinstance(root, int):
            raise TypeError(f"root must be a rank (an int), got {type(root).__name__}")
        if not 0 <= root < self.size:
            raise ValueError(f"root must be a rank in 0..{self.size - 1}, got {root!r}")


class _Mismatch(ConnectionError):
    """A neighbour sent a frame this operation did not expect."""


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None (no limit), got {timeout!r}")


def _describe(descriptor: bytes | bytearray) -> str:
    kind, reduce_op, root, dtype, count = _DESCRIPTOR.unpack(bytes(descriptor))
    what = _OP_NAMES.get(kind, f"operation kind {kind}")
    detail = f"op={REDUCE_OPS[reduce_op]!r}" if kind == _ALLREDUCE and reduce_op < len(REDUCE_OPS) else f"root={root}"
    dtype_name = dtype.rstrip(b"\0").decode(errors="replace")
    return f"{what}({dtype_name} x {count}, {detail})"


def _flat(array: np.ndarray, what: str) -> np.ndarray:
    """A 1-D view of ``array``'s memory (which it must hold contiguously and may write)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} works on a numpy array in place, got {type(array).__name__}")
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        raise ValueError(
            f"{what} needs a contiguous array, got one with strides {array.strides}; use np.ascontiguousarray"
        )
    if not array.flags.writeable:
        raise ValueError(f"{what} writes into the array, but it is read-only")
    if not array.dtype.isnative:
        raise ValueError(f"{what} needs native byte order, got {array.dtype.str}")
    return array.reshape(-1, order="A")


def _chunks(count: int, parts: int, chunk: int) -> list[list[tuple[int, int]]]:
    """Element ranges ``(start, stop)`` of every segment's chunks: ``parts`` segments
    whose sizes differ by at most one, each cut into pieces of at most ``chunk``."""
    bounds = [count * i // parts for i in range(parts + 1)]
    return [[(a, min(a + chunk, bounds[i + 1])) for a in range(bounds[i], bounds[i + 1], chunk)] for i in range(parts)]
