"""The RPC transports shmpad's same-host calls are measured against (``multiprocessing.Pipe``,
pyzmq over ipc://, portal), and the floor; each follows ``bench/rpc/contract.py``.

The peers are bare transports: a message is the payload itself, with no method name
and no serialisation around it. They are the optimistic side of every ratio; shmpad
and portal are whole RPC stacks (method names, futures, remote errors). A client
looks its call function up once (``client.echo``), as a hot loop would.
"""

from __future__ import annotations

import collections
import shutil
import socket
import tempfile

import numpy as np
from numba import njit

from bench.common.harness import FORK
from bench.rpc.contract import SERVER_THREADS, Caller, Echo, FutureWindow, Plan, Subject
from shmpad.shm.atomics import cpu_pause, load_acquire, load_relaxed, store_release
from shmpad.shm.segment import Segment

__all__ = ["FLOOR", "PEERS", "Floor", "MpPipe", "Portal", "ZmqIpc", "warm_up_floor"]


# ---------------------------------------------------------------------------------------
# multiprocessing.Pipe


class _PipeCaller(Caller):
    def __init__(self, conn):
        self.submit = conn.send_bytes
        self.next_reply = conn.recv_bytes
        self._conn = conn

    def call(self, payload: bytes) -> bytes:
        self._conn.send_bytes(payload)
        return self._conn.recv_bytes()

    def close(self) -> None:
        self._conn.send_bytes(b"")


class MpPipe(Subject):
    name = "mp-pipe"
    family = "peer"
    how = (
        "duplex Pipe, send_bytes/recv_bytes ping-pong; in flight: the client sends N, "
        "then one per reply, replies matched by the call number in the payload"
    )

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self._server_end, self._client_end = FORK.Pipe(duplex=True)

    def serve(self) -> None:
        conn, echo = self._server_end, Echo().echo
        recv, send = conn.recv_bytes, conn.send_bytes
        while True:
            msg = recv()
            if not msg:
                return
            send(echo(msg))

    def connect(self) -> Caller:
        return _PipeCaller(self._client_end)

    def close(self) -> None:
        self._server_end.close()
        self._client_end.close()


# ---------------------------------------------------------------------------------------
# pyzmq over ipc://


class _ZmqCaller(Caller):
    def __init__(self, context, sock):
        self.submit = sock.send
        self.next_reply = sock.recv
        self._context, self._sock = context, sock

    def call(self, payload: bytes) -> bytes:
        self._sock.send(payload)
        return self._sock.recv()

    def close(self) -> None:
        # The goodbye: an empty request, which the server does not answer.
        self._sock.send(b"")
        self._sock.close(linger=5000)
        self._context.term()


class ZmqIpc(Subject):
    name = "zmq-ipc"
    family = "peer"
    how = "REQ/REP send/recv; in flight: DEALER/ROUTER, replies matched by the call number in the payload"

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self._dir = tempfile.mkdtemp(prefix="bench-rpc-")
        self.address = f"ipc://{self._dir}/rpc"
        import zmq  # noqa: F401  (imported once here, not in every child)

    def prepare_server(self) -> None:
        import zmq

        self._context = zmq.Context()
        self._sock = self._context.socket(zmq.REP if self.plan.depth == 1 else zmq.ROUTER)
        self._sock.linger = 0
        self._sock.bind(self.address)

    def serve(self) -> None:
        sock, echo = self._sock, Echo().echo
        try:
            if self.plan.depth == 1:
                recv, send = sock.recv, sock.send
                while True:
                    msg = recv()
                    if not msg:
                        return
                    send(echo(msg))
            else:
                recv, send = sock.recv_multipart, sock.send_multipart
                while True:
                    peer, msg = recv()
                    if not msg:
                        return
                    send([peer, echo(msg)])
        finally:
            sock.close()
            self._context.term()

    def connect(self) -> Caller:
        import zmq

        context = zmq.Context()
        sock = context.socket(zmq.REQ if self.plan.depth == 1 else zmq.DEALER)
        sock.connect(self.address)
        return _ZmqCaller(context, sock)

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# portal (danijar/portal): Server/Client over localhost TCP


class _PortalCaller(FutureWindow):
    def call(self, payload: bytes) -> bytes:
        return self._call_async(payload).result()


class Portal(Subject):
    name = "portal"
    family = "peer"
    how = (
        f"portal.Server (workers={SERVER_THREADS}) / portal.Client over 127.0.0.1 TCP, "
        "client.echo(payload).result(); in flight: its futures, awaited oldest first"
    )

    def __init__(self, plan: Plan):
        super().__init__(plan)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._stop = FORK.Event()

    def prepare_server(self) -> None:
        import portal  # sets the spawn start method, so only ever in a child

        self._server = portal.Server(self.port, "bench", workers=SERVER_THREADS, host="127.0.0.1", logging=False)
        self._server.bind("echo", Echo().echo)
        self._server.start(block=False)

    def serve(self) -> None:
        self._stop.wait()
        self._server.close()

    def connect(self) -> Caller:
        import portal

        client = portal.Client(f"127.0.0.1:{self.port}", "bench", maxinflight=self.plan.depth, logging=False)
        client.connect(timeout=15)
        # What ``client.echo`` gives, looked up once (as for every subject).
        return _PortalCaller(client, client.echo)

    def stop(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------------------------------
# The floor: flags in shared memory, no payload, no RPC


# The floor segment's data area as int64 words: the stop word (set by the parent),
# then slot k's request word at _REQ + k * _LINE and its response word at
# _RESP + k * _LINE, each on its own 64-byte line with one writer (the client writes
# requests, the server responses).
_LINE = 8
_MAX_SLOTS = 64
_STOP = 0
_REQ = _STOP + _LINE
_RESP = _REQ + _MAX_SLOTS * _LINE
_FLOOR_WORDS = _RESP + _MAX_SLOTS * _LINE

# Spins before a compiled wait returns to the interpreter (~10-50 ms), which then
# checks its deadline and spins again.
_SPINS = 1 << 20


@njit(nogil=True, cache=True)
def _request(words, slot, seq):
    store_release(words, _REQ + slot * _LINE, seq)  # pairs with the load_acquire of requests in _answer


@njit(nogil=True, cache=True)
def _await(words, slot, seq, spins):
    word = _RESP + slot * _LINE
    for _ in range(spins):
        if load_acquire(words, word) == seq:  # pairs with the store_release of responses in _answer
            return True
        cpu_pause()
    return False


@njit(nogil=True, cache=True)
def _ping(words, slot, seq, spins):
    _request(words, slot, seq)
    return _await(words, slot, seq, spins)


@njit(nogil=True, cache=True)
def _answer(words, slots, spins):
    """Answer every new request on slots [0, slots) until ``spins`` scans found none;
    True once the stop word is set."""
    idle = 0
    while idle < spins:
        if load_relaxed(words, _STOP) != 0:  # the parent's plain store: it orders nothing, only ends the loop
            return True
        moved = False
        for k in range(slots):
            req = load_acquire(words, _REQ + k * _LINE)  # pairs with the store_release in _request
            if req != load_relaxed(words, _RESP + k * _LINE):  # our own word: only this loop writes it
                store_release(words, _RESP + k * _LINE, req)  # pairs with the load_acquire in _await
                moved = True
        if moved:
            idle = 0
        else:
            idle += 1
            cpu_pause()
    return False


def warm_up_floor() -> None:
    """Compile the floor's kernels in the parent, so forked children inherit them."""
    words = np.zeros(_FLOOR_WORDS, np.int64)
    _request(words, 0, 1)
    _answer(words, 1, 1)
    _ping(words, 0, 1, 1)
    _await(words, 0, 1, 1)


class _FloorCaller(Caller):
    """Echoes by bookkeeping: only the call number travels, as a flag."""

    def __init__(self, words, depth: int):
        self._words = words
        self._seq = [0] * depth  # last request per slot
        self._payload: list[bytes | None] = [None] * depth
        self._free = collections.deque(range(depth))
        self._busy: collections.deque = collections.deque()
        self._next_seq = 0

    def call(self, payload: bytes) -> bytes:
        self._next_seq += 1
        seq, words = self._next_seq, self._words
        if not _ping(words, 0, seq, _SPINS):
            while not _await(words, 0, seq, _SPINS):
                pass  # the child's alarm ends a wait that never ends
        return payload

    def submit(self, payload: bytes) -> None:
        slot = self._free.popleft()
        self._next_seq += 1
        self._seq[slot] = self._next_seq
        self._payload[slot] = payload
        _request(self._words, slot, self._next_seq)
        self._busy.append(slot)

    def next_reply(self) -> bytes:
        slot = self._busy.popleft()
        while not _await(self._words, slot, self._seq[slot], _SPINS):
            pass
        self._free.append(slot)
        return self._payload[slot]


class Floor(Subject):
    name = "floor"
    family = "floor"
    how = (
        "numba spin on int64 flags in a shared segment (store_release / load_acquire), no payload; "
        "in flight: one request/response word pair per call slot, the server scans them all"
    )

    def __init__(self, plan: Plan):
        super().__init__(plan)
        if plan.depth > _MAX_SLOTS:
            raise ValueError(f"the floor has at most {_MAX_SLOTS} call slots, got {plan.depth} calls in flight")
        self._segment = Segment.create("rpcfloor", {"slots": _MAX_SLOTS}, _FLOOR_WORDS * 8)
        self._words = self._segment.data.view(np.int64)  # [_FLOOR_WORDS]

    def serve(self) -> None:
        words, slots = self._words, self.plan.depth
        while not _answer(words, slots, _SPINS):
            pass

    def connect(self) -> Caller:
        return _FloorCaller(self._words, self.plan.depth)

    def stop(self) -> None:
        self._words[_STOP] = 1

    def close(self) -> None:
        self._words = None
        self._segment.close()


PEERS: list[type[Subject]] = [MpPipe, ZmqIpc, Portal]
FLOOR: list[type[Subject]] = [Floor]
