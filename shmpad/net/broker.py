"""The broker: group membership for peers on several hosts, nothing else.

``python -m shmpad.net.broker [--host 127.0.0.1] [--port 4431] [--token-file F]``

Peers register under a group name and send heartbeats; after any change to a group
(a join, a leave, a closed connection, a peer silent past the timeout) and a short
settle delay that coalesces changes coming together, every member of the group gets
the new ordered member list. No tensor goes through the broker: the list carries the
address of each peer's own listener, and the peers talk to each other directly.

Protocol (CONTROL frames over an authenticated ``wire.Connection``)::

    peer -> broker  {"op": "join", "group": G, "name": N, "address": "host:port"}   first frame
    broker -> peer  {"op": "welcome", "broker_id": B, "heartbeat_s": h, "timeout_s": t}
                    or {"op": "error", "message": ...} and the connection is closed
    peer -> broker  {"op": "ping"} every h seconds; {"op": "leave"} to go
    broker -> peer  {"op": "members", "group": G, "broker_id": B, "epoch": E,
                     "members": [{"name": ..., "address": ...}, ...]}    oldest join first

``broker_id`` is random per broker process and ``epoch`` increases per group, so
``(broker_id, epoch)`` names one list. A name that joins again while its old
connection is open replaces it (the old one gets an error with ``"replaced": true``
and is closed); the newcomer goes to the end of the list like any new join.

The broker decodes nothing but JSON, and frames of at most ``MAX_PEER_FRAME`` bytes:
a frame of another kind, a malformed join, an unknown op or a join to a group whose
list would no longer fit one control frame closes that connection with a log line.
A peer that sends nothing for ``timeout_s`` (not even its join) is dropped, and so
is one whose connection closes, at once.

How fast a hung peer goes. A peer that stops (SIGSTOP, a stuck device call, a dead
network path) sends no ping: the broker drops it ``timeout_s`` after its last one and
announces the list without it ``settle_s`` later, at most ``timeout_s + settle_s``
after it stopped. The command line's defaults (``HEARTBEAT_S``, ``TIMEOUT_S``,
``SETTLE_S``: pings every 0.1 s, dropped after 0.6 s of silence, 0.2 s to settle) put
that under a second, with six pings' room for a member that is merely slow (a
learner that holds the GIL in one long C call for longer than ``timeout_s`` is
dropped, and rejoins when it lets go: raise ``--timeout`` for such learners). The
``Broker`` class keeps its slower keyword defaults for code that builds one itself.
A dropped peer that wakes up finds its connection closed, joins again and is
announced like any newcomer; the accumulator then refuses what it computed before
it was brought level (``shmpad.net.accumulator``).
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import signal
import sys
import threading
import time

from shmpad.errors import AuthError, FrameError
from shmpad.net import auth, wire
from shmpad.net.group import show as _show
from shmpad.net.group import validate_join

__all__ = ["Broker", "DEFAULT_PORT", "HEARTBEAT_S", "SETTLE_S", "TIMEOUT_S"]

log = logging.getLogger("shmpad.net.broker")

DEFAULT_PORT = 4431
HEARTBEAT_S = 0.1
"""the command line's default seconds between a peer's pings"""
TIMEOUT_S = 0.6
"""the command line's default: a peer silent this long is dropped"""
SETTLE_S = 0.2
"""the command line's default seconds to gather changes before a new list goes out"""
MAX_PEER_FRAME = 16 << 10  # a join is the largest thing a peer sends
LIST_ROOM = wire.MAX_CONTROL - 4096  # a member list must fit one control frame, with room for its envelope


class _Session:
    """One joined peer: its connection, and a one-slot mailbox that a thread of its own
    sends from, so that a peer slow to read delays nobody else's list."""

    def __init__(self, conn: wire.Connection, group: str, name: str, address: str):
        self.conn = conn
        self.group = group
        self.name = name
        self.address = address
        self.pending: dict | None = None
        self.done = False
        self.cond = threading.Condition()
        self.sender = threading.Thread(target=self._send_loop, name=f"broker-send-{name}", daemon=True)

    def post(self, msg: dict) -> None:
        with self.cond:
            self.pending = msg  # only the newest list matters
            self.cond.notify()

    def end(self, farewell: dict | None = None) -> None:
        """Send ``farewell`` if given (best effort), close the connection, stop the sender."""
        if farewell is not None:
            try:
                self.conn.send_json(farewell)
            except ConnectionError:
                pass
        self.conn.close()
        with self.cond:
            self.done = True
            self.cond.notify()

    def _send_loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.done or self.pending is not None)
                if self.done:
                    return
                msg, self.pending = self.pending, None
            try:
                self.conn.send_json(msg)
            except ConnectionError:
                return  # the connection is closed; its reader notices and drops the peer


class _Group:
    def __init__(self) -> None:
        self.members: dict[str, _Session] = {}  # in join order
        self.epoch = 0  # kept while the group is empty, so a list's key is never reused
        self.announce_at: float | None = None


class Broker:
    """Serves membership on ``host:port`` until ``close()``. ``token`` defaults to
    ``$SHMPAD_TOKEN``; ``port=0`` picks a free port (``address`` tells which)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token: bytes | str | None = None,
        heartbeat_s: float = 1.0,
        timeout_s: float = 10.0,
        settle_s: float = 1.0,
    ):
        if not heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be positive, got {heartbeat_s}")
        if not timeout_s > heartbeat_s:
            raise ValueError(f"timeout_s must exceed heartbeat_s ({heartbeat_s}), got {timeout_s}")
        if not settle_s >= 0:
            raise ValueError(f"settle_s must be >= 0, got {settle_s}")
        self.broker_id = secrets.token_hex(8)
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.settle_s = settle_s
        self._groups: dict[str, _Group] = {}
        self._cond = threading.Condition()
        self._closing = False
        self._announcer = threading.Thread(target=self._announce_loop, name="broker-announce", daemon=True)
        self._announcer.start()
        try:
            self._listener = auth.Listener(
                self._serve, host, port, auth.load_token(token), max_frame=MAX_PEER_FRAME, name="broker"
            )
        except BaseException:
            self._stop()
            raise

    @property
    def address(self) -> str:
        return self._listener.address

    # ---------------------------------------------------------------- one peer

    def _serve(self, conn: wire.Connection) -> None:
        """Runs in the listener's thread for ``conn``: the join, then pings until the end.
        A peer that sends nothing for ``timeout_s`` (not even its join) is dropped."""
        conn.settimeout(self.timeout_s)
        try:
            group, name, address = validate_join(conn.recv_json())
        except (TypeError, ValueError) as e:
            _refuse(conn, str(e))
            return
        except FrameError:
            return  # wire logged why it closed the connection
        except ConnectionError as e:
            log.warning("refused %s before it joined: %s", conn.peer, e)
            conn.close()
            return
        session = _Session(conn, group, name, address)
        if not self._join(session):
            return
        reason = None
        try:
            while reason is None:
                op = conn.recv_json().get("op")
                if op == "leave":
                    reason = "left"
                elif op != "ping":
                    reason = f"it sent unknown op {_show(op)}"
                    log.warning("closing connection from %s: unknown op %s", conn.peer, _show(op))
        except ConnectionError as e:  # FrameError too; wire logged that one
            reason = str(e)
        finally:
            self._drop(session, reason or "the broker failed serving it")

    def _join(self, session: _Session) -> bool:
        """Add ``session`` to its group (replacing a session of the same name); False if refused."""
        with self._cond:
            if self._closing:
                session.conn.close()
                return False
            group = self._groups.setdefault(session.group, _Group())
            others = [s for s in group.members.values() if s.name != session.name]
            full = sum(map(_entry_bytes, others)) + _entry_bytes(session) > LIST_ROOM
            if not full:
                old = group.members.pop(session.name, None)
                group.members[session.name] = session
                self._changed(group)
        if full:
            _refuse(session.conn, f"group {session.group!r} is full: its member list would exceed {LIST_ROOM} bytes")
            return False
        welcome = {
            "op": "welcome",
            "broker_id": self.broker_id,
            "heartbeat_s": self.heartbeat_s,
            "timeout_s": self.timeout_s,
        }
        try:
            session.conn.send_json(welcome)
        except ConnectionError:
            pass  # the connection is closed: the reader sees it and drops the session
        session.sender.start()  # only now, so that no list can overtake the welcome
        if old is not None:
            log.info(
                "%r rejoined group %r from %s (address %r); closing its old connection from %s",
                session.name,
                session.group,
                session.conn.peer,
                session.address,
                old.conn.peer,
            )
            message = f"replaced: {session.name!r} joined group {session.group!r} again from {session.conn.peer}"
            old.end({"op": "error", "message": message, "replaced": True})
        else:
            log.info(
                "%r joined group %r from %s (address %r)",
                session.name,
                session.group,
                session.conn.peer,
                session.address,
            )
        return True

    def _drop(self, session: _Session, reason: str) -> None:
        session.end()
        with self._cond:
            group = self._groups.get(session.group)
            current = group is not None and group.members.get(session.name) is session
            if current:
                del group.members[session.name]
                if not self._closing:
                    self._changed(group)
        if current and not self._closing:
            if reason == "left":
                log.info("%r left group %r", session.name, session.group)
            else:
                log.info("dropped %r from group %r: %s", session.name, session.group, reason)

    # ---------------------------------------------------------------- announcements

    def _changed(self, group: _Group) -> None:
        """Schedule a new list for ``group`` (caller holds ``_cond``). The first change
        starts the settle delay and later ones ride along, so churn cannot postpone it."""
        if group.announce_at is None:
            group.announce_at = time.monotonic() + self.settle_s
            self._cond.notify()

    def _announce_loop(self) -> None:
        with self._cond:
            while not self._closing:
                now = time.monotonic()
                due = [
                    (name, g) for name, g in self._groups.items() if g.announce_at is not None and g.announce_at <= now
                ]
                for name, group in due:
                    group.announce_at = None
                    if group.members:  # nobody to tell otherwise
                        group.epoch += 1
                        self._announce(name, group)
                pending = [g.announce_at for g in self._groups.values() if g.announce_at is not None]
                self._cond.wait(min(pending) - now if pending else None)

    def _announce(self, name: str, group: _Group) -> None:
        members = [{"name": s.name, "address": s.address} for s in group.members.values()]
        msg = {"op": "members", "group": name, "broker_id": self.broker_id, "epoch": group.epoch, "members": members}
        log.info("group %r epoch %d: %s", name, group.epoch, ", ".join(m["name"] for m in members))
        for session in group.members.values():
            session.post(msg)

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Stop listening and close every connection; joins the broker's own threads."""
        sessions = self._stop()
        if sessions is None:
            return
        self._listener.close()
        for session in sessions:
            session.end()
            if session.sender.is_alive():
                session.sender.join(timeout=5)

    def _stop(self) -> list[_Session] | None:
        """Stop the announcer; from here on no session joins. Returns the sessions to end,
        or None if the broker was stopped already."""
        with self._cond:
            if self._closing:
                return None
            self._closing = True
            self._cond.notify_all()
            sessions = [s for g in self._groups.values() for s in g.members.values()]
        self._announcer.join(timeout=5)
        return sessions

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refuse(conn: wire.Connection, message: str) -> None:
    conn.refuse(message, {"op": "error", "message": message})


def _entry_bytes(session: _Session) -> int:
    return len(json.dumps({"name": session.name, "address": session.address})) + 1


def main(argv: list[str] | None = None) -> int:
    """The command line: serve until SIGINT or SIGTERM, then close everything and exit 0."""
    parser = argparse.ArgumentParser(prog="python -m shmpad.net.broker", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: loopback only; 0.0.0.0 for every interface)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    parser.add_argument("--token-file", help="file holding the shared token (default: $SHMPAD_TOKEN)")
    parser.add_argument(
        "--heartbeat", type=float, default=HEARTBEAT_S, help=f"seconds between a peer's pings (default {HEARTBEAT_S})"
    )
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help=f"a peer silent this long is dropped (default {TIMEOUT_S})"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help=f"seconds to gather changes before sending a new list (default {SETTLE_S})",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    try:
        token = auth.load_token(token_file=args.token_file)
    except AuthError as e:
        parser.error(str(e))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Blocked before any thread starts, so every thread inherits the mask and sigwait gets them.
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        broker = Broker(args.host, args.port, token, args.heartbeat, args.timeout, args.settle)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    print(f"broker listening on {broker.address}", flush=True)
    received = signal.sigwait(stop_signals)
    log.info("stopping on %s", signal.Signals(received).name)
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
