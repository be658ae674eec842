"""A peer's endpoint for direct connections to the other peers, and ring formation.

Every peer of a group runs one ``Mesh``: an authenticated ``auth.Listener`` whose
address it announces (through the broker). ``mesh.ring(key, addresses, rank)`` joins
the ring of one group epoch: it connects to the next member and waits for the
previous one to connect. A connection names its ring in a first frame::

    connecting side -> listening side   CONTROL {"ring": key, "rank": r, "size": n}
    listening side  -> connecting side  CONTROL {"ok": true, "rank": r'}  or  {"refused": reason}

The reply comes once ``ring(key, ...)`` runs on the listening side: a neighbour
that calls ``ring()`` first waits (its connection is parked, for at most
``park_timeout`` seconds). A key this mesh has used before, a rank other than the
previous member's or a size other than ours is refused at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from shmpad.errors import Abandoned, AuthError, FrameError
from shmpad.net import auth, wire
from shmpad.net.allreduce import CHUNK_BYTES, PeerRing
from shmpad.net.wire import Connection

__all__ = ["Mesh"]

log = logging.getLogger("shmpad.net")

HELLO_TIMEOUT_S = 10.0  # a connected peer names its ring within this long
PARK_TIMEOUT_S = 60.0
MAX_PARKED = 64
RETRY_S = 0.05  # first pause between connection attempts; doubles up to 1 s


class _Incoming:
    """A connection that named a ring, held by the listener's thread for it until the
    ring (or the mesh) is done with it."""

    def __init__(self, conn: Connection, key: str, rank: int, size: int):
        self.conn = conn
        self.key = key
        self.rank = rank
        self.size = size
        self.claimed = False
        self.released = threading.Event()


class _Forming:
    """A ring whose ``ring()`` call waits for its previous member's connection."""

    def __init__(self, key: str, rank: int, size: int):
        self.key = key
        self.rank = rank
        self.size = size
        self.incoming: _Incoming | None = None
        self.arrived = threading.Event()
        self.out: Connection | None = None  # our connection to the next member, once made
        self.cancelled: str | None = None  # why the ring is no longer wanted (see Mesh.abandon)
        self.cancel = threading.Event()

    def offer(self, inc: _Incoming) -> str | None:
        """Take ``inc`` if it is the connection this ring waits for; else why not."""
        prev = (self.rank - 1) % self.size
        if inc.size != self.size:
            return f"ring {self.key!r} has {self.size} members here, the connection says {inc.size}"
        if inc.rank != prev:
            return f"ring {self.key!r} expects rank {prev} to connect to rank {self.rank}, got rank {inc.rank}"
        if self.incoming is not None:
            return f"rank {prev} is connected to ring {self.key!r} already"
        inc.claimed = True
        self.incoming = inc
        self.arrived.set()
        return None


class Mesh:
    """This peer's endpoint for peer-to-peer connections: an authenticated
    ``auth.Listener`` (loopback unless ``host`` says otherwise) that routes incoming
    connections to the ring that expects them."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: bytes | str | None = None,
        park_timeout: float = PARK_TIMEOUT_S,
    ):
        self._token = auth.load_token(token)
        self._park_timeout = park_timeout
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified as the listener lets go of a connection
        self._closed = False
        self._forming: dict[str, _Forming] = {}
        self._parked: list[_Incoming] = []
        self._used: set[str] = set()
        self._rings: set[PeerRing] = set()
        self._incoming: set[_Incoming] = set()
        self._listener = auth.Listener(self._serve, host, port, self._token, name="shmpad-mesh")

    @property
    def address(self) -> str:
        """``"host:port"`` the other peers connect to."""
        return self._listener.address

    @property
    def port(self) -> int:
        """The port it listens on (announce ``f"{reachable_host}:{port}"`` when bound to 0.0.0.0)."""
        return self._listener.port

    def __repr__(self) -> str:
        return f"Mesh({self.address}{', closed' if self._closed else ''})"

    def ring(
        self,
        key: str,
        addresses: Sequence[str],
        rank: int,
        timeout: float = 30.0,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> PeerRing:
        """Join the ring ``key`` (one per group epoch; a key is used once per mesh):
        ``addresses`` is every member's mesh address in rank order, ``rank`` ours.
        Connects to the next member and waits for the previous one. Raises ``Abandoned``
        if the ring is not formed within ``timeout`` seconds, which also bounds how long
        a neighbour may stay silent in each operation."""
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        if not key:
            raise ValueError(f"key must be a non-empty string, got {key!r}")
        addresses = list(addresses)
        size = len(addresses)
        if size < 1:
            raise ValueError("a ring needs at least one address (ours)")
        if not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {type(rank).__name__}")
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in 0..{size - 1} for {size} addresses, got {rank!r}")
        for address in addresses:
            wire.parse_address(address)
        forming = _Forming(key, rank, size)
        refused: list[tuple[_Incoming, str]] = []
        with self._lock:  # one critical section: a connection for key finds it forming, never merely used
            if self._closed:
                raise Abandoned(f"mesh {self.address} is closed")
            if key in self._used:
                raise ValueError(
                    f"ring key {key!r} was used before in this mesh; every ring needs a new key (e.g. its epoch)"
                )
            self._used.add(key)
            if size == 1:
                return PeerRing(key, 0, 1, None, None, timeout, chunk_bytes)
            self._forming[key] = forming
            for inc in [p for p in self._parked if p.key == key]:
                self._parked.remove(inc)
                reason = forming.offer(inc)
                if reason is not None:
                    refused.append((inc, reason))
        for inc, reason in refused:
            _refuse(inc.conn, reason)
            inc.released.set()
        deadline = time.monotonic() + timeout
        out: Connection | None = None
        try:
            out = self._connect(addresses[(rank + 1) % size], key, rank, size, deadline, forming)
            with self._lock:
                forming.out = out
            if forming.cancelled is None and not forming.arrived.wait(max(0.0, deadline - time.monotonic())):
                raise Abandoned(
                    f"ring {key!r}: rank {(rank - 1) % size} did not connect to rank {rank} within {timeout} s"
                )
            if forming.cancelled is not None:
                raise Abandoned(f"ring {key!r} was abandoned while it formed: {forming.cancelled}")
            inc = forming.incoming
            inc.conn.send_json({"ok": True, "rank": rank})
            self._await_welcome(out, key, rank, size, addresses, deadline, timeout)
        except BaseException as e:
            if out is not None:
                out.close()
            if forming.incoming is not None:
                forming.incoming.conn.close()
                forming.incoming.released.set()
            with self._lock:
                del self._forming[key]
            if isinstance(e, (ConnectionError, OSError)) and not isinstance(e, AuthError):
                raise Abandoned(f"ring {key!r} could not be formed: {e}") from None
            raise
        with self._lock:
            del self._forming[key]
            ring = PeerRing(
                key, rank, size, out, inc.conn, timeout, chunk_bytes, on_close=lambda: self._ring_closed(ring, inc)
            )
            self._rings.add(ring)
            closed = self._closed
        if closed:
            ring.close()
            raise Abandoned(f"mesh {self.address} was closed while ring {key!r} formed")
        return ring

    def abandon(self, key: str, reason: str = "its group changed") -> None:
        """Make a ``ring(key, ...)`` call that is still forming raise ``Abandoned``
        promptly (from any thread); nothing happens if that ring is not forming."""
        with self._lock:
            forming = self._forming.get(key)
            if forming is None:
                return
            forming.cancelled = reason
            out = forming.out
        forming.cancel.set()
        forming.arrived.set()
        if out is not None:
            out.close()  # wakes the wait for the next member's welcome

    def close(self) -> None:
        """Abandon every ring of this mesh, forming or formed, and stop listening. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            rings = list(self._rings)
            held = list(self._incoming)
            forming = list(self._forming)
        for key in forming:
            self.abandon(key, f"mesh {self.address} was closed")
        for ring in rings:
            ring.close()
        self._listener.close()
        for inc in held:
            inc.released.set()
        with self._lock:  # the listener's threads let go of their connections at once
            self._idle.wait_for(lambda: not self._incoming, timeout=5)

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------- internals

    def _connect(self, address: str, key: str, rank: int, size: int, deadline: float, forming: _Forming) -> Connection:
        """Connect to the next member (retrying while it cannot be reached) and name our ring."""
        pause = RETRY_S
        while True:
            if forming.cancelled is not None:
                raise Abandoned(f"ring {key!r} was abandoned while it formed: {forming.cancelled}")
            left = deadline - time.monotonic()
            try:
                conn = auth.connect(address, self._token, timeout=max(0.1, min(left, auth.HANDSHAKE_TIMEOUT_S)))
                break
            except AuthError:
                raise
            except OSError as e:
                if time.monotonic() + pause >= deadline:
                    raise Abandoned(f"ring {key!r}: cannot reach rank {(rank + 1) % size} at {address}: {e}") from None
                forming.cancel.wait(pause)  # a member that just started may not listen yet (abandon() wakes us)
                pause = min(1.0, pause * 2)
        conn.send_json({"ring": key, "rank": rank, "size": size})
        return conn

    @staticmethod
    def _await_welcome(
        conn: Connection, key: str, rank: int, size: int, addresses, deadline: float, timeout: float
    ) -> None:
        nxt = (rank + 1) % size
        conn.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            reply = conn.recv_json()
        except ConnectionError as e:
            if time.monotonic() >= deadline:
                raise Abandoned(
                    f"ring {key!r}: rank {nxt} at {addresses[nxt]} did not join within {timeout} s"
                ) from None
            raise Abandoned(f"ring {key!r}: rank {nxt} at {addresses[nxt]} did not welcome us: {e}") from None
        if "refused" in reply:
            raise Abandoned(f"ring {key!r}: rank {nxt} at {addresses[nxt]} refused us: {reply['refused']}")
        if reply.get("ok") is not True or reply.get("rank") != nxt:
            raise Abandoned(f"ring {key!r}: {addresses[nxt]} answered {reply!r}, expected rank {nxt}'s welcome")

    def _ring_closed(self, ring: PeerRing, inc: _Incoming) -> None:
        inc.released.set()
        with self._lock:
            self._rings.discard(ring)

    def _serve(self, conn: Connection) -> None:
        """The listener's thread for one authenticated connection: read which ring it
        joins, hand it over (or park it, or refuse it), then hold it until released."""
        conn.settimeout(HELLO_TIMEOUT_S)
        try:
            hello = conn.recv_json()
        except (ConnectionError, FrameError) as e:
            log.warning("mesh %s: dropped %s before it named a ring: %s", self.address, conn.peer, e)
            return
        key, rank, size = hello.get("ring"), hello.get("rank"), hello.get("size")
        if not (isinstance(key, str) and isinstance(rank, int) and isinstance(size, int) and 0 <= rank < size):
            _refuse(conn, f"the first frame must be {{'ring': str, 'rank': int, 'size': int}}, got {hello!r}")
            return
        conn.settimeout(None)
        inc = _Incoming(conn, key, rank, size)
        with self._lock:
            forming = self._forming.get(key)
            if self._closed:
                reason = f"mesh {self.address} is closed"
            elif forming is not None:
                reason = forming.offer(inc)
            elif key in self._used:
                reason = f"ring {key!r} was formed here already (or abandoned)"
            elif len(self._parked) >= MAX_PARKED:
                reason = f"{MAX_PARKED} connections wait here for rings not yet made"
            else:
                reason = None
                self._parked.append(inc)
            if reason is None:
                self._incoming.add(inc)
        if reason is not None:
            _refuse(conn, reason)
            return
        try:
            if not inc.released.wait(self._park_timeout):
                with self._lock:
                    expired = not inc.claimed and inc in self._parked
                    if expired:
                        self._parked.remove(inc)
                if expired:
                    _refuse(conn, f"no ring {key!r} was made here within {self._park_timeout} s")
                    return
            inc.released.wait()
        finally:
            with self._lock:
                self._incoming.discard(inc)
                self._idle.notify_all()


def _refuse(conn: Connection, reason: str) -> None:
    conn.refuse(f"mesh: {reason}", {"refused": reason})
