"""Messages of portal's sockets: what one may hold, and the queue that sends them.

A message is one or more buffers (``bytes``, ``bytearray``, C-contiguous
``memoryview``) that arrive joined, as one ``memoryview``. On the wire it is one
``BYTES`` frame of ``shmpad.net.wire`` on an authenticated connection (the frame's
header carries the length, the buffers follow from where they lie, unjoined).

A send only queues the message (``Outbox``): a thread of the connection writes it, so a
peer that reads slowly holds up neither the sender nor the other connections. At most
``max_send_queue`` messages wait; one more is portal's ``RuntimeError``.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

from shmpad._checks import type_name
from shmpad.net.wire import Connection, Kind

__all__ = ["check_message", "Outbox"]


def check_message(parts: tuple, max_size: int) -> tuple:
    """``parts`` as buffers to send, after checking them; their total size must be 1 to
    ``max_size`` bytes."""
    if not parts:
        raise ValueError("a message needs at least one buffer")
    views = []
    for part in parts:
        if not isinstance(part, (bytes, bytearray, memoryview)):
            raise TypeError(f"a message is made of bytes, bytearray or memoryview, got {type_name(part)}")
        if isinstance(part, memoryview):
            if not part.c_contiguous:
                raise ValueError("a memoryview in a message must be C-contiguous")
            part = part.cast("B")
        views.append(part)
    size = sum(len(v) for v in views)
    if not 1 <= size <= max_size:
        raise ValueError(f"a message holds 1 to {max_size} bytes (max_msg_size), got {size}")
    return tuple(views)


class Outbox:
    """The messages waiting to go out on one connection, and the thread that sends them
    in order. ``on_error(e)`` is called (on that thread) if the connection breaks."""

    def __init__(self, conn: Connection, limit: int, name: str, on_error: Callable[[BaseException], Any]):
        self.conn = conn
        self.limit = limit
        self.queue: collections.deque[tuple] = collections.deque()
        self.cond = threading.Condition()
        self.closing = False
        self.sending = False
        self.on_error = on_error
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def __len__(self) -> int:
        return len(self.queue) + self.sending

    def put(self, parts: tuple) -> None:
        with self.cond:
            if self.closing:
                raise ConnectionError(f"the connection to {self.conn.peer} is closed")
            if len(self.queue) >= self.limit:
                raise RuntimeError("Too many outgoing messages enqueued")
            self.queue.append(parts)
            self.cond.notify()

    def clear(self) -> int:
        """Drop the messages not yet sent; how many."""
        with self.cond:
            count = len(self.queue)
            self.queue.clear()
            return count

    def close(self, flush: bool, timeout: float | None = None) -> None:
        """Stop the thread, after it sent what waits if ``flush`` (within ``timeout`` s)."""
        with self.cond:
            if not flush:
                self.queue.clear()
            self.closing = True
            self.cond.notify()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closing:
                    self.cond.wait()
                if not self.queue:
                    return
                parts = self.queue.popleft()
                self.sending = True
            try:
                self.conn.send(Kind.BYTES, *parts)
            except (ConnectionError, OSError) as e:
                with self.cond:
                    self.queue.clear()
                    self.closing = True
                    self.sending = False
                self.on_error(e)
                return
            with self.cond:
                self.sending = False
