"""The transports shmpad's rings are measured against, and the copy ceiling.

Every subject follows one contract (``bench/ringbuf/benchmark.py`` runs it):

- ``Subject(plan)`` runs in the parent before any fork and builds the shared parts;
- ``produce(index)`` runs in each producer process after the start barrier: it sends
  ``plan.message()`` for ``plan.seconds``, then one end marker, and returns how many
  messages it sent;
- ``prepare_consumer()`` runs in the consumer process before the start barrier (a
  socket binds there, so producers find it when they start);
- ``consume()`` runs in the one consumer process after the start barrier: it receives
  until it has seen every producer's end marker and returns a ``Tally``;
- ``close()`` runs in the parent once every child has exited (or been killed).

Consumers *materialise* every message once: a transport that hands out ``bytes``
has made a private copy already, the others copy into a private numpy or torch
buffer. Each subject's ``reads`` says exactly what its consumer does.
"""

from __future__ import annotations

import mmap
import multiprocessing.connection
import shutil
import socket
import tempfile
from time import perf_counter
from typing import ClassVar

import numpy as np

from bench.common.harness import FORK
from bench.ringbuf.contract import END, Plan, Subject, Tally, idler, receive_until_ends, send_for

__all__ = ["PEERS", "Ceiling"]


class _Queue(Subject):
    """A peer with one queue (``self._queue``) that every producer puts into and the
    consumer gets from, ``put(bytes)`` / ``get() -> bytes``."""

    family = "peer"

    def produce(self, index: int) -> int:
        sent = send_for(self._queue.put, self.plan.message(), self.plan)
        self._queue.put(END)
        return sent

    def consume(self) -> Tally:
        return receive_until_ends(self._queue.get, self.plan)


class MpQueue(_Queue):
    name = "mp-queue"
    reads = "Queue.get() -> bytes (unpickled copy); producers Queue.put(bytes) (feeder thread pickles)"

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self._queue = FORK.Queue(maxsize=plan.capacity)

    def close(self) -> None:
        self._queue.close()
        self._queue.join_thread()


class MpPipe(Subject):
    name = "mp-pipe"
    family = "peer"
    reads = "Connection.recv_bytes() -> bytes; 4->1: one pipe per producer, connection.wait() on all"

    def __init__(self, plan: Plan):
        super().__init__(plan)
        # Writes above PIPE_BUF are not atomic, so producers cannot share a pipe.
        self._pipes = [FORK.Pipe(duplex=False) for _ in range(plan.producers)]

    def produce(self, index: int) -> int:
        writer = self._pipes[index][1]
        sent = send_for(writer.send_bytes, self.plan.message(), self.plan)
        writer.send_bytes(END)
        return sent

    def consume(self) -> Tally:
        readers = [r for r, _ in self._pipes]
        if len(readers) == 1:
            return receive_until_ends(readers[0].recv_bytes, self.plan)
        size = self.plan.size
        wait = multiprocessing.connection.wait
        received = first = 0
        t_first = 0.0
        last = None
        live = list(readers)
        while live:
            for r in wait(live):
                msg = r.recv_bytes()
                if len(msg) == size:
                    received += 1
                    last = msg
                else:
                    live.remove(r)
            if not t_first:
                t_first = perf_counter()
                first = received
        t_last = perf_counter()
        intact = last is not None and last == self.plan.message()
        return Tally(received, received - first, t_first, t_last, intact)

    def close(self) -> None:
        for r, w in self._pipes:
            r.close()
            w.close()


class FasterFifo(_Queue):
    name = "faster-fifo"
    reads = "Queue.get() -> bytes (unpickled copy); producers Queue.put(bytes)"

    def __init__(self, plan: Plan):
        super().__init__(plan)
        import faster_fifo

        # Pickling adds a few dozen bytes per message.
        max_bytes = max(1 << 20, plan.capacity * (plan.size + 128))
        self._queue = faster_fifo.Queue(max_size_bytes=max_bytes, maxsize=plan.capacity)

    def close(self) -> None:
        self._queue.close()


class _Zmq(Subject):
    family = "peer"
    reads = "PULL recv() -> bytes; producers PUSH send(bytes), copy=False from 64 KiB (pyzmq's advice)"
    scheme: ClassVar[str]

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self._dir = None
        if self.scheme == "ipc":
            self._dir = tempfile.mkdtemp(prefix="bench-ringbuf-")
            self.address = f"ipc://{self._dir}/pull"
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        self._hwm = plan.capacity_per_producer
        # libzmq 4.3.5 over ipc drops what a PULL socket has queued from a PUSH peer
        # that disconnects, so producers stay connected until the consumer is done.
        self._drained = FORK.Event()
        import zmq  # noqa: F401  (imported once here, not in every child)

    def prepare_consumer(self) -> None:
        import zmq

        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        self._pull.rcvhwm = self._hwm
        self._pull.linger = 0
        self._pull.bind(self.address)

    def produce(self, index: int) -> int:
        import zmq

        # Connecting after the start barrier finds the consumer bound: a connect
        # that comes first is retried only after reconnect_ivl (100 ms).
        context = zmq.Context()
        sock = context.socket(zmq.PUSH)
        sock.sndhwm = self._hwm
        sock.linger = 10_000
        sock.connect(self.address)
        try:
            msg = self.plan.message()
            if self.plan.size >= zmq.COPY_THRESHOLD:
                sent = send_for(lambda m: sock.send(m, copy=False), msg, self.plan)
            else:
                sent = send_for(sock.send, msg, self.plan)
            sock.send(END)
            self._drained.wait(30)
            return sent
        finally:
            sock.close()
            context.term()

    def consume(self) -> Tally:
        try:
            return receive_until_ends(self._pull.recv, self.plan)
        finally:
            self._drained.set()
            self._pull.close()
            self._context.term()

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class ZmqIpc(_Zmq):
    name = "zmq-ipc"
    scheme = "ipc"


class ZmqTcp(_Zmq):
    name = "zmq-tcp"
    scheme = "tcp"


class Monobeast(Subject):
    """torchbeast's monobeast: shared pre-allocated tensors, only slot indices travel."""

    name = "monobeast"
    family = "peer"
    reads = "SimpleQueue.get() -> slot index, torch copy_ of the shared slot into a private tensor, index back (<= 1024 slots)"
    # Every index sits in a pipe at once; more than the 64 KiB pipe buffer holds
    # would block the parent filling the free queue.
    MAX_SLOTS = 1024

    def __init__(self, plan: Plan):
        super().__init__(plan)
        import torch

        slots = min(plan.capacity, self.MAX_SLOTS)
        self._buffers = torch.empty((slots, plan.size), dtype=torch.uint8).share_memory_()  # [slots, size]
        self._free = FORK.SimpleQueue()
        self._full = FORK.SimpleQueue()
        for i in range(slots):
            self._free.put(i)

    def produce(self, index: int) -> int:
        import torch

        torch.set_num_threads(1)
        src = torch.from_numpy(self.plan.payload())
        buffers, free_get, full_put = self._buffers, self._free.get, self._full.put

        def send(_):
            i = free_get()
            buffers[i].copy_(src)
            full_put(i)

        sent = send_for(send, None, self.plan)
        full_put(-1)
        return sent

    def consume(self) -> Tally:
        import torch

        torch.set_num_threads(1)
        buffers, full_get, free_put = self._buffers, self._full.get, self._free.put
        dst = torch.empty(self.plan.size, dtype=torch.uint8)
        received = first = ends = 0
        i = full_get()
        t_first = perf_counter()
        if i < 0:
            ends = 1
        else:
            dst.copy_(buffers[i])
            free_put(i)
            received = first = 1
        while ends < self.plan.producers:
            i = full_get()
            if i < 0:
                ends += 1
                continue
            dst.copy_(buffers[i])
            free_put(i)
            received += 1
        t_last = perf_counter()
        intact = received > 0 and bytes(dst.numpy()) == self.plan.message()
        return Tally(received, received - first, t_first, t_last, intact)

    def close(self) -> None:
        self._free.close()
        self._full.close()


class Ceiling(Subject):
    """The copy ceiling: numpy copies into and out of shared memory, a plain spin between.

    Each producer has its own region of ``capacity_per_producer`` slots and three
    counters, each on its own cache line: ``head`` (messages written, written by the
    producer), ``tail`` (messages copied out, written by the consumer) and ``done``.
    Each side caches the other's counter and reloads it only when the cache says
    full or empty. The counters are plain loads and stores: the interpreter keeps
    them in program order, and x86 keeps stores in order with stores and loads with
    loads, so a published ``head`` covers the bytes copied before it.

    A side with nothing to do spins, yielding now and then (see ``idler``).
    """

    name = "ceiling"
    family = "ceiling"
    reads = "numpy copy of the slot into a private buffer (producers: numpy copy into the slot)"

    _HEAD, _TAIL, _DONE = 0, 8, 16
    _WORDS_PER_PRODUCER = 24

    def __init__(self, plan: Plan):
        super().__init__(plan)
        p, cap, size = plan.producers, plan.capacity_per_producer, plan.size
        counter_bytes = 8 * self._WORDS_PER_PRODUCER * p
        data_offset = -(-counter_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
        # Anonymous mmap is MAP_SHARED: forked children see the parent's pages.
        self._mem = mmap.mmap(-1, data_offset + p * cap * size)
        self._words = memoryview(self._mem)[:counter_bytes].cast("q")
        self._slots = np.frombuffer(self._mem, np.uint8, count=p * cap * size, offset=data_offset).reshape(
            p, cap, size
        )  # [producer, slot, byte]
        self._cap = cap

    def produce(self, index: int) -> int:
        words, cap = self._words, self._cap
        head_i = self._WORDS_PER_PRODUCER * index + self._HEAD
        tail_i = self._WORDS_PER_PRODUCER * index + self._TAIL
        slots = list(self._slots[index])
        src = self.plan.payload()
        copyto, idle = np.copyto, idler()
        head = tail = 0
        chunk = self.plan.chunk
        stop = perf_counter() + self.plan.seconds
        while perf_counter() < stop:
            for _ in range(chunk):
                while head - tail >= cap:
                    tail = words[tail_i]
                    if head - tail >= cap:
                        idle()
                copyto(slots[head % cap], src)
                head += 1
                words[head_i] = head
        words[self._WORDS_PER_PRODUCER * index + self._DONE] = 1
        return head

    def consume(self) -> Tally:
        words, cap, w = self._words, self._cap, self._WORDS_PER_PRODUCER
        regions = [list(region) for region in self._slots]
        dst = np.empty(self.plan.size, np.uint8)
        copyto, idle = np.copyto, idler()
        tails = [0] * self.plan.producers
        live = list(range(self.plan.producers))
        first = 0
        t_first = 0.0
        while live:
            moved = False
            for p in tuple(live):
                base = w * p
                # done before head: once done is seen, the head read after it is final
                done = words[base + self._DONE]
                head, tail = words[base + self._HEAD], tails[p]
                if tail == head:
                    if done:
                        live.remove(p)
                    continue
                slots, tail_i = regions[p], base + self._TAIL
                while tail < head:
                    copyto(dst, slots[tail % cap])
                    tail += 1
                    words[tail_i] = tail
                tails[p] = tail
                moved = True
            if not moved:
                idle()
            elif not t_first:
                t_first = perf_counter()
                first = sum(tails)
        received = sum(tails)
        t_last = perf_counter()
        intact = received > 0 and dst.tobytes() == self.plan.message()
        return Tally(received, received - first, t_first, t_last, intact)

    def close(self) -> None:
        self._words.release()
        self._slots = None
        self._mem = None


PEERS: list[type[Subject]] = [MpQueue, MpPipe, FasterFifo, ZmqIpc, ZmqTcp, Monobeast, Ceiling]
