"""What every subject of ``python -m bench.rpc`` follows, and the call they all make.

Every subject follows one contract (``bench/rpc/benchmark.py`` runs it):

- ``Subject(plan)`` runs in the parent before any fork and builds the shared parts;
- ``prepare_server()`` runs in the server process before the start barrier (a socket
  binds there, so the client finds it when it starts);
- ``serve()`` runs in the server process after the barrier and returns once the
  server was asked to end (by the client's goodbye or the parent's ``stop()``);
- ``connect()`` runs in the client process after the barrier and returns a
  ``Caller``: ``call(payload) -> reply`` for one call at a time, ``submit(payload)``
  and ``next_reply()`` for calls in flight, ``close()`` for the goodbye;
- ``stop()`` runs in the parent once the client process has exited: it asks the
  server to end if the goodbye does not;
- ``close()`` runs in the parent once both children have exited (or been killed).

The call is the same everywhere: ``echo(payload)`` with a 64-byte ``bytes`` payload,
which the server passes to ``Echo.echo`` and sends back. Payloads differ in their
first 8 bytes (the call number, mod ``len(payloads())``), so a reply that belongs to
another call, or a torn one, is caught.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from bench.common import subject

__all__ = [
    "DISTINCT_PAYLOADS",
    "PAYLOAD_BYTES",
    "SERVER_THREADS",
    "Caller",
    "Echo",
    "FutureWindow",
    "Plan",
    "Subject",
    "payloads",
]

PAYLOAD_BYTES = 64
DISTINCT_PAYLOADS = 1024
SERVER_THREADS = 16
"""handler threads of the servers that have a pool (shmpad, portal), as CourierNode's 16"""


@dataclass(frozen=True)
class Plan:
    """What one measurement asks of a subject."""

    depth: int
    """calls in flight: 1 is the sync mode (one caller thread, one call at a time)"""
    seconds: float
    """length of the timed phase"""
    warmup_seconds: float
    """untimed calls before it, counted from the first reply (which may compile kernels)"""
    calls: int = 0
    """when > 0, time exactly this many calls instead of ``seconds`` (for tests)"""

    @property
    def mode(self) -> str:
        return "sync" if self.depth == 1 else f"in-flight-{self.depth}"


def payloads() -> list[bytes]:
    """The call arguments, used in turn: 64 bytes each, the call number first."""
    filler = bytes((7 * j + 1) % 251 for j in range(PAYLOAD_BYTES - 8))
    return [i.to_bytes(8, "little") + filler for i in range(DISTINCT_PAYLOADS)]


class Echo:
    """The served object: the same one-line method for every subject."""

    def echo(self, data: bytes) -> bytes:
        return data


class Caller:
    """The client side of one connection (see the module docstring)."""

    def call(self, payload: bytes) -> bytes:
        raise NotImplementedError

    def submit(self, payload: bytes) -> None:
        raise NotImplementedError

    def next_reply(self) -> bytes:
        """Block until some submitted call's reply arrives; return it."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class Subject(subject.Subject):
    """Base of every measured RPC path; see the module docstring for the contract."""

    family: ClassVar[str]  # "shmpad", "peer" or "floor"
    how: ClassVar[str]  # what a call is, in both modes
    plan: Plan

    def prepare_server(self) -> None:
        pass

    def serve(self) -> None:
        raise NotImplementedError

    def connect(self) -> Caller:
        raise NotImplementedError

    def stop(self) -> None:
        pass


class FutureWindow(Caller):
    """In-flight calls through an RPC client's futures, awaited oldest first; the goodbye
    closes the client."""

    def __init__(self, client, call_async: Callable[[bytes], object]):
        self._client = client
        self._call_async = call_async
        self._window: collections.deque = collections.deque()

    def submit(self, payload: bytes) -> None:
        self._window.append(self._call_async(payload))

    def next_reply(self) -> bytes:
        return self._window.popleft().result()

    def close(self) -> None:
        self._client.close()
